#!/usr/bin/env bash
# Install what is missing, build, and run the main job: 2 ranks train an MLP on
# Fashion-MNIST with the allreduce algorithm over the tcp communicator.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# The CLI and the plugins only: the tests are tools/test.sh's (about 300 more
# targets, most of a cold build's time on 2 cores).
DISTOPT_BUILD_TARGETS="distopt distopt_plugins" tools/build.sh
export DISTOPT_PLUGIN_PATH="$PWD/${DISTOPT_BUILD_DIR:-build}/plugins${DISTOPT_PLUGIN_PATH:+:$DISTOPT_PLUGIN_PATH}"
exec "${DISTOPT_BUILD_DIR:-build}/bin/distopt" train share/distopt/examples/allreduce-sgd.yaml "$@"
