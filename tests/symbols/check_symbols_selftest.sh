#!/usr/bin/env bash
# Self-test of tools/check_symbols.sh and of the poison stand-in: a fixture
# compiled here (uses_filesystem.cpp, which imports std::filesystem) must be
# named by the checker with its symbol, and must abort in the poisoned
# remove_all when the stand-in is preloaded (so that the poisoned_* tests
# would catch a std::filesystem call; they are not vacuous).
# Usage: check_symbols_selftest.sh CHECKER CXX FIXTURE.cpp POISON.so
set -u
checker=$1 cxx=$2 fixture=$3 poison=$4
tmp=$(mktemp -d /tmp/distopt_symbols_selftest_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$cxx" -std=c++17 -O1 -o "$tmp/uses_filesystem" "$fixture" || fail "cannot compile the fixture"

# A toolchain that links libstdc++ statically (the GPU machine's /opt/gcc
# g++ 13 was seen doing so) leaves nothing to import: the hazard cannot arise
# for this fixture there, and the checker has nothing to find. Skip (77).
if ! nm -D -C --undefined-only "$tmp/uses_filesystem" 2>/dev/null | grep -q 'std::filesystem::'; then
  echo "SKIP: $cxx linked the fixture without importing std::filesystem from a shared" \
    "libstdc++ ($(nm -C "$tmp/uses_filesystem" 2>/dev/null | grep -m1 -o 'std::filesystem::remove_all[^ ]*' ||
      echo 'no remove_all symbol')); nothing for the checker to catch here"
  exit 77
fi

out=$("$checker" "$tmp/uses_filesystem" 2>&1); rc=$?
echo "$out"
[ "$rc" = 1 ] || fail "check_symbols.sh exited $rc on a binary importing std::filesystem (want 1)"
echo "$out" | grep -q "^$tmp/uses_filesystem: imports std::filesystem::remove_all(" ||
  fail "check_symbols.sh did not name the file and std::filesystem::remove_all"

out=$("$checker" "$poison" 2>&1); rc=$?
echo "$out"
[ "$rc" = 0 ] || fail "the poison stand-in itself imports a forbidden symbol (rc $rc)"

out=$("$checker" --require-each "$tmp/empty_dir_does_not_exist" 2>&1); rc=$?
[ "$rc" = 2 ] || fail "check_symbols.sh exited $rc on a missing tree (want 2)"
mkdir "$tmp/empty"
out=$("$checker" --require-each "$tmp/empty" 2>&1); rc=$?
[ "$rc" = 2 ] || fail "check_symbols.sh exited $rc on an empty tree (want 2)"

out=$(LD_PRELOAD="$poison" "$tmp/uses_filesystem" 2>&1); rc=$?
echo "$out"
[ "$rc" -ge 128 ] || fail "the fixture exited $rc under the poison stand-in (want a signal: abort)"
echo "$out" | grep -q "poisoned std::filesystem::" ||
  fail "the poison stand-in did not report the call"
echo "PASS"
