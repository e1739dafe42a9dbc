#!/usr/bin/env bash
# Install what is missing, build, and run every test with ctest.
# Extra arguments go to ctest (e.g. -R comm, -L fast). Two tests at a time
# (DISTOPT_TEST_JOBS): the multi-rank tests mostly wait on each other, and
# none asserts a time, so this halves the wall time on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
cd "${DISTOPT_BUILD_DIR:-build}"
jobs="${DISTOPT_TEST_JOBS:-2}"
ctest --output-on-failure --timeout 900 -j "$jobs" "$@"

# The accuracy floors once more on another OpenBLAS kernel set (a
# floor that held on one CPU's kernels failed on another's), unless the
# caller chose tests or the kernels, or DISTOPT_TEST_SECOND_KERNELS=0.
# Haswell kernels need AVX2 and FMA: on a CPU without them the pass is skipped.
if [[ $# -eq 0 && -z "${OPENBLAS_CORETYPE:-}" && "${DISTOPT_TEST_SECOND_KERNELS:-1}" != 0 ]]; then
  if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    echo "test.sh: accuracy tests again with OPENBLAS_CORETYPE=Haswell"
    OPENBLAS_CORETYPE=Haswell ctest --output-on-failure --timeout 900 -j "$jobs" -L accuracy
  else
    echo "test.sh: this CPU lacks AVX2/FMA: no second pass with Haswell kernels"
  fi
fi
