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
  libopenblas0-openmp    # libtorch trains ~10x slower on Debian's reference BLAS; the
                         # OpenMP build shares libtorch's libgomp pool (see below)
  dataset-fashion-mnist
  python3-torch          # tests: consolidated checkpoints must load with torch.load
  python3-matplotlib     # tools/plot_metrics.py (and its test)
  python3-dev pybind11-dev python3-pytest  # the Python package `distopt` and its tests
)
# Extra packages for the benchmark comparisons (PyTorch gloo / DDP): opt-in.
if [[ "${DISTOPT_SETUP_BENCH:-0}" == 1 ]]; then
  PACKAGES+=(python3-numpy)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# OpenBLAS must be the BLAS libtorch loads, and its OpenMP build: libtorch's
# intra-op pool is libgomp, and the pthread build (Debian's preferred
# alternative when both are installed) keeps a second pool that spins on the
# same cores, making 2 threads 2.4x slower than 1 (measured with
# tools/bench/scaling.py). libtorch loads libblas.so.3, liblapack.so.3 and
# libopenblas.so.0, so all three alternatives must name the same build. An
# alternative a user set by hand (manual mode) is left alone, with a warning.
ARCH_LIB=/usr/lib/x86_64-linux-gnu
for alt in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  name="$alt-x86_64-linux-gnu"
  want="$ARCH_LIB/openblas-openmp/$alt"
  [[ -e "$want" ]] || continue
  line=$(update-alternatives --query "$name" 2>/dev/null || true)
  status=$(sed -n 's/^Status: //p' <<<"$line")
  value=$(sed -n 's/^Value: //p' <<<"$line")
  if [[ "$value" == "$want" ]]; then continue; fi
  if [[ "$status" == manual ]]; then
    echo "setup: warning: $alt -> $value was chosen by hand; distopt expects $want" \
      "(libtorch's OpenMP pool and another BLAS pool oversubscribe the cores)" >&2
    continue
  fi
  echo "setup: selecting $want for $alt"
  # --set makes the choice manual, so a later package upgrade keeps it
  # (update-alternatives --auto NAME returns to Debian's choice).
  $SUDO update-alternatives --set "$name" "$want" >/dev/null
done
blas=$(readlink -f "$ARCH_LIB/libblas.so.3" 2>/dev/null || true)
case "$blas" in
  *openblas-openmp*) ;;
  *openblas*) echo "setup: warning: libblas.so.3 -> $blas is not OpenBLAS's OpenMP build;" \
       "several threads per rank will be slower than one" >&2 ;;
  *) echo "setup: warning: libblas.so.3 -> ${blas:-?} is not OpenBLAS; training will be ~10x slower" \
       "(update-alternatives --config libblas.so.3-x86_64-linux-gnu)" >&2 ;;
esac
