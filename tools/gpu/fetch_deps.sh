#!/usr/bin/env bash
# Run HERE (the Debian machine with a package registry): downloads the Debian
# packages that the GPU machine lacks into .gpu-deps/ (ignored by git) so that
# tools/gpu/build_and_test.sh can unpack them there with `dpkg -x` into a
# prefix. The GPU machine has PyTorch (libtorch 2.x with CUDA), CUDA, NCCL,
# CMake and ninja, but no Boost, yaml-cpp, doctest, spdlog, fmt, nlohmann-json,
# DLPack headers or the Fashion-MNIST data; it cannot reach a registry.
# Debian bookworm's glibc (2.36) is older than the GPU image's, so the
# libraries run there.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES=(
  libboost-dev libboost1.74-dev
  libboost-filesystem-dev libboost-filesystem1.74-dev libboost-filesystem1.74.0
  libboost-program-options-dev libboost-program-options1.74-dev libboost-program-options1.74.0
  libboost-system1.74-dev libboost-system1.74.0 libboost-atomic1.74-dev libboost-atomic1.74.0
  libyaml-cpp-dev libyaml-cpp0.7 doctest-dev
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 nlohmann-json3-dev
  libdlpack-dev zlib1g-dev
  dataset-fashion-mnist
)
mkdir -p .gpu-deps
cd .gpu-deps
# apt's sandbox user cannot write into a root-owned checkout; the download is
# read-only anyway.
apt-get download -o APT::Sandbox::User=root "${PACKAGES[@]}"
du -sh .
