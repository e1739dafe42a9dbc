#!/usr/bin/env bash
# Install what is missing, build, and run every test with ctest.
# Extra arguments go to ctest (e.g. -R comm, -L fast).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
cd "${DISTOPT_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 "$@"
