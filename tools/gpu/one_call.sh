#!/usr/bin/env bash
# Run ON THE GPU MACHINE as the whole of one device call (a session has 15
# minutes of device time and a call at most 10): build, then the smoke rows
# and ctest side by side, everything inside a deadline so that the logs
# always come back.
#
#   tools/gpu/one_call.sh      # with .gpu-deps/ carried (tools/gpu/fetch_deps.sh)
#
# Order: tools/gpu/build_and_test.sh build; then, at once,
#   - tools/gpu/smoke.sh without its ctest row (the GPU rows and benchmarks);
#   - ctest on DISTOPT_GPU_FIRST (default: the tests never yet rerun on a
#     GPU), then on the rest of `-LE accuracy` in what time is left.
# ctest runs on CPU cores beside the smoke's GPU rows; the benchmark rows
# compare variants within one run, so they stay comparable, but say so.
#
# Environment: DISTOPT_GPU_DEADLINE_S (default 570: seconds from the start
# to the last log), DISTOPT_GPU_FIRST (a ctest -R regex). Logs in $OUT (at
# most 8 files): one-call.log (the summary), gpu-build.log, smoke-table.txt,
# smoke-rows.log, smoke-bench.log, ctest-first.log, ctest-rest.log.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
DEADLINE=${DISTOPT_GPU_DEADLINE_S:-570}
FIRST=${DISTOPT_GPU_FIRST:-grad_accum|plugin_template|elastic_train|check_symbols|bench_step_device|decentralized|nccl}
OUT=${OUT:-$(mktemp -d /tmp/distopt-one-call-XXXXXX)}
export OUT
T0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
SUMMARY=$OUT/one-call.log
say() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$SUMMARY"; }

say "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
# The build leaves ~200 s for the rest at the least.
timeout -k 5 $(($(left) - 200)) tools/gpu/build_and_test.sh build >>"$SUMMARY" 2>&1
say "build: exit $?"
rm -f "$OUT/gpu-configure.log"  # its tail is in one-call.log; keeps $OUT at 8 files
if [[ ! -x build-gpu/bin/distopt ]]; then
  say "no build-gpu/bin/distopt: stopping"
  exit 1
fi

ARCH_LIB=${DISTOPT_DEPS_PREFIX:-/tmp/distopt-deps}/usr/lib/x86_64-linux-gnu
(
  export LD_LIBRARY_PATH="$ARCH_LIB:${LD_LIBRARY_PATH:-}"
  cd build-gpu || exit 2
  t=$(($(left) - 15))
  timeout -k 5 "$t" ctest -j 8 --timeout 240 --output-on-failure -R "$FIRST" >"$OUT/ctest-first.log" 2>&1
  echo "ctest first (-R '$FIRST', ${t} s box): exit $?" >>"$OUT/ctest-first.log"
  t=$(($(left) - 12))
  if ((t > 20)); then
    timeout -k 5 "$t" ctest -j 8 --timeout 120 --output-on-failure -LE accuracy -E "$FIRST" \
      >"$OUT/ctest-rest.log" 2>&1
    echo "ctest rest (-LE accuracy, ${t} s box): exit $?" >>"$OUT/ctest-rest.log"
  fi
) &
CTEST_PID=$!

DISTOPT_SMOKE_SKIP='^ctest$' DISTOPT_SMOKE_BUDGET_S=$(($(left) - 10)) tools/gpu/smoke.sh >>"$SUMMARY" 2>&1
say "smoke: exit $?"
wait "$CTEST_PID"
for f in ctest-first ctest-rest; do
  [[ -f $OUT/$f.log ]] && say "$f: $(grep -E 'tests passed|^ctest ' "$OUT/$f.log" | tr '\n' ' ')"
  [[ -f $OUT/$f.log ]] && grep -E '^\s*[0-9]+ - |\*\*\*' "$OUT/$f.log" | head -30 >>"$SUMMARY"
done
say "done"
