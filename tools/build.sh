#!/usr/bin/env bash
# Configures and builds distopt into ${DISTOPT_BUILD_DIR:-build} (Ninja, ccache).
# DISTOPT_BUILD_TARGETS: build only these targets (default: everything, tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${DISTOPT_BUILD_DIR:-build}
JOBS=${DISTOPT_JOBS:-$(nproc)}
# ccache: hit across clones of the repository (CI builds a fresh clone):
# paths relative to the checkout, and -g's working directory not hashed.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" "$@"
targets=()
for t in ${DISTOPT_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
