#!/usr/bin/env bash
# `distopt train` under a per-process memory cap: the same ResNet-18 job
# (train.model_width 192: 1.0e8 parameters, Adam) at 4 local ranks with
# `zero` stage 3 and with `allreduce`, each rank's data segment limited by
# RLIMIT_DATA (prlimit --data, inherited by the ranks). Stage 3 keeps 1/4
# of the parameters, gradients and Adam state per rank and trains; a full
# replica with its gradients and Adam state (1.6 GB) does not fit.
#
#   tools/bench/train_memory_cap.sh [CAP_MIB]     # default 2000
#
# Environment: DISTOPT_BUILD_DIR (default build), DISTOPT_CAP_WIDTH (192),
# DISTOPT_CAP_STEPS (3). Prints, per algorithm, the exit code, the last
# step's loss and the first error line.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
CAP_MIB=${1:-2000}
CLI=${DISTOPT_BUILD_DIR:-build}/bin/distopt
[[ -x $CLI ]] || { echo "train_memory_cap: no $CLI (build first)" >&2; exit 2; }
command -v prlimit >/dev/null || { echo "train_memory_cap: needs prlimit (util-linux)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/distopt-memcap-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
BYTES=$((CAP_MIB * 1024 * 1024))
echo "# distopt train, resnet (model_width ${DISTOPT_CAP_WIDTH:-192}), Adam, 4 ranks, tcp;" \
  "RLIMIT_DATA ${CAP_MIB} MiB per process; $(git rev-parse --short HEAD 2>/dev/null), $(date -u +%F)"
rc_all=0
for alg in "{name: zero, options: {stage: 3}}" "{name: allreduce}"; do
  cat >"$WORK/job.yaml" <<EOF
world: {size: 4}
communicator: {name: tcp}
reducer: {name: mean}
algorithm: $alg
optimizer: {name: adam, lr: 0.0001}
train:
  model: resnet
  model_width: ${DISTOPT_CAP_WIDTH:-192}
  dataset: synthetic
  synthetic: {train_samples: 64, test_samples: 16}
  epochs: 1
  batch_size: 4
  max_steps: ${DISTOPT_CAP_STEPS:-3}
  threads: 1
  log_every: 1
EOF
  prlimit --data="$BYTES:$BYTES" "$CLI" train "$WORK/job.yaml" >"$WORK/log" 2>&1
  rc=$?
  last=$(grep -E 'epoch [0-9]+/[0-9]+ step' "$WORK/log" | tail -1 | sed 's/^\[rank 0\] //')
  err=$(grep -m1 -E "error|can't allocate|out of memory" "$WORK/log" | cut -c1-200)
  echo "algorithm $alg: exit $rc; last step: ${last:-none}"
  [[ -n $err ]] && echo "  first error: $err"
  [[ $alg == *stage* && $rc -ne 0 ]] && rc_all=1
done
exit $rc_all
