#!/usr/bin/env bash
# Run ON THE GPU MACHINE (see DEVELOPERS.md): builds distopt against the
# machine's PyTorch libtorch 2.x (with CUDA) and the Debian packages that
# tools/gpu/fetch_deps.sh put into .gpu-deps/, then runs the tests.
#
#   tools/gpu/build_and_test.sh build            # unpack, configure, build
#   tools/gpu/build_and_test.sh test [ctest ...] # ctest in build-gpu (default: all)
#   tools/gpu/build_and_test.sh all              # both
#
# DISTOPT_GPU_TARGETS="distopt tcp grad_accum_test" builds only those targets
# (a short device call: one test and what it loads).
#
# The packages are unpacked with `dpkg -x` into /tmp/distopt-deps (never
# into /); the Fashion-MNIST data is linked to the path the examples use when
# that path is free. Results (logs) go to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=${1:-all}
shift || true
PREFIX=${DISTOPT_DEPS_PREFIX:-/tmp/distopt-deps}
BUILD=${DISTOPT_BUILD_DIR:-build-gpu}
ARCH_LIB=$PREFIX/usr/lib/x86_64-linux-gnu
LOG_DIR=${OUT:-/tmp}

unpack() {
  [[ -d .gpu-deps ]] || { echo "gpu: .gpu-deps/ missing: run tools/gpu/fetch_deps.sh first and carry it" >&2; exit 2; }
  if [[ ! -e $PREFIX/.unpacked ]]; then
    mkdir -p "$PREFIX"
    for f in .gpu-deps/*.deb; do dpkg -x "$f" "$PREFIX"; done
    touch "$PREFIX/.unpacked"
  fi
  local data=/usr/share/datasets/fashion-mnist
  if [[ ! -e $data && -d $PREFIX$data ]]; then
    mkdir -p "$(dirname $data)" && ln -s "$PREFIX$data" "$data"
  fi
}

configure_and_build() {
  local torch_prefix
  [[ -x /usr/local/cuda/bin/nvcc ]] && export PATH=/usr/local/cuda/bin:$PATH
  torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  echo "gpu: torch $(python3 -c 'import torch;print(torch.__version__, torch.version.cuda)') at $torch_prefix"
  nvidia-smi -L || true
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$PREFIX/usr" \
    -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DDLPACK_INCLUDE_DIR="$PREFIX/usr/include" 2>&1 | tee "$LOG_DIR/gpu-configure.log"
  # -k 0: build every target that can be built, so that one broken file
  # still leaves the CLI, the plugins and the other tests to run.
  local targets=()
  [[ -n ${DISTOPT_GPU_TARGETS:-} ]] && read -ra targets <<<"--target $DISTOPT_GPU_TARGETS"
  cmake --build "$BUILD" -j "$(nproc)" "${targets[@]}" -- -k 0 2>&1 | tee "$LOG_DIR/gpu-build.log" | grep -E "error|warning: |FAILED|^\[[0-9]+/[0-9]+\] Linking" | tail -60
  test "${PIPESTATUS[0]}" -eq 0
}

run_tests() {
  export LD_LIBRARY_PATH="$ARCH_LIB:${LD_LIBRARY_PATH:-}"
  (cd "$BUILD" && ctest -j "$(nproc)" --output-on-failure --timeout 600 "$@" 2>&1 | tee "$LOG_DIR/gpu-ctest.log" | tail -80)
}

case $STAGE in
  build) unpack; configure_and_build ;;
  test) unpack; run_tests "$@" ;;
  all) unpack; configure_and_build; run_tests "$@" ;;
  *) echo "usage: $0 build|test|all [ctest args]" >&2; exit 2 ;;
esac
