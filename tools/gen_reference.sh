#!/usr/bin/env bash
# Writes share/doc/distopt/REFERENCE.md from a build's `distopt config
# reference` and its plugins (default build/), or with --check compares the
# committed file with what the build generates: exit 1 with a diff when stale,
# 77 (skipped) when the build found other plugins than the committed file lists
# (e.g. no UCX here), so the difference is not staleness.
#   tools/gen_reference.sh [--check] [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
build=${1:-build}
doc=share/doc/distopt/REFERENCE.md
# Only the build's plugins: nothing from the environment or an installation.
gen() {
  env -u DISTOPT_PLUGIN_PATH "$build/bin/distopt" config reference --format markdown \
    --plugin-path "$build/plugins"
}
if [ "$check" = 0 ]; then
  gen >"$doc.tmp" && mv "$doc.tmp" "$doc"
  echo "wrote $doc"
  exit 0
fi
fresh=$(mktemp)
trap 'rm -f "$fresh"' EXIT
gen >"$fresh"
if cmp -s "$doc" "$fresh"; then
  echo "$doc is current"
  exit 0
fi
components() { grep -E '^#### `[a-z0-9_]+` \(plugin ' "$1" | sort; }
if [ "$(components "$doc")" != "$(components "$fresh")" ]; then
  echo "this build discovers other components than $doc lists; cannot check it here:"
  diff <(components "$doc") <(components "$fresh") || true
  exit 77
fi
diff -u "$doc" "$fresh" || true
echo "$doc is stale: regenerate it with tools/gen_reference.sh $build and commit it" >&2
exit 1
