#!/usr/bin/env bash
# Installs the Debian packages distopt needs (idempotent: only what is
# missing), so tools/quickstart.sh and tools/test.sh work on a fresh machine.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libdlpack-dev
  libboost-dev libboost-filesystem-dev libboost-program-options-dev
  libyaml-cpp-dev doctest-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libucx-dev zlib1g-dev
  libopenblas0-pthread   # libtorch trains ~10x slower on Debian's reference BLAS
  dataset-fashion-mnist
  python3-torch          # tests: consolidated checkpoints must load with torch.load
)
# Extra packages for the benchmark comparisons (PyTorch gloo / DDP): opt-in.
if [[ "${DISTOPT_SETUP_BENCH:-0}" == 1 ]]; then
  PACKAGES+=(python3-numpy)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# OpenBLAS must be the BLAS libtorch loads (it installs itself as the
# preferred alternative; say so if someone pinned the reference BLAS).
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
case "$blas" in
  *openblas*) ;;
  *) echo "setup: warning: libblas.so.3 -> ${blas:-?} is not OpenBLAS; training will be ~10x slower" \
       "(update-alternatives --config libblas.so.3-x86_64-linux-gnu)" >&2 ;;
esac
