#!/usr/bin/env bash
# check_symbols.sh: fail when a binary, library or plugin imports a libstdc++
# symbol of a family that PyTorch's libtorch exports.
#
# Why: PyTorch builds its wheels and libtorch archives with a gcc-toolset
# whose libstdc++ parts newer than the build system's own libstdc++ are
# linked statically into libtorch and EXPORTED (pytorch/pytorch issue 133437).
# A distopt binary or plugin that imports such a symbol binds to libtorch's
# copy when libtorch is loaded first, and that copy may crash: on a GPU
# machine std::filesystem::remove_all jumped to address 0. PyTorch
# itself stopped using <filesystem> on Linux for this reason (PR 134494).
# Use POSIX calls or Boost.Filesystem instead.
#
# Usage: tools/check_symbols.sh [--require-each] [--require FILE]... PATH...
#   PATH            an ELF file, or a directory searched recursively for ELF
#                   files (executables, shared libraries, plugins; object
#                   files, archives and CMakeFiles/ are skipped)
#   --require-each  each directory PATH must hold at least one ELF file (a
#                   build tree that looks empty fails instead of passing)
#   --require FILE  FILE must exist and be among the files checked
# Plugin authors: tools/check_symbols.sh path/to/libdistopt_myplugin.so
#
# Exit status: 0 clean; 1 a forbidden import (each printed as
# "FILE: imports SYMBOL"); 2 usage, an unreadable file or an empty tree.
# Needs nm (binutils).
set -euo pipefail

# The families, one extended regular expression each, matched against the
# demangled (nm -C) names of undefined dynamic symbols. Keep this the only
# list: the tests and the docs refer to it.
FAMILIES=(
  'std::filesystem::'                # <filesystem>
  'std::experimental::filesystem::'  # <experimental/filesystem>
  'std::pmr::'                       # <memory_resource>
  'std::(to|from)_chars\('           # floating-point <charconv> (integer forms are inline)
  'std::chrono::(tzdb|time_zone|get_tzdb|current_zone|locate_zone|reload_tzdb|remote_version|leap_second)'  # <chrono> time zones
)

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

require_each=0
required=()
paths=()
while [ $# -gt 0 ]; do
  case "$1" in
    --require-each) require_each=1 ;;
    --require)
      [ $# -ge 2 ] || usage
      required+=("$2")
      shift
      ;;
    -h | --help) usage ;;
    -*) echo "check_symbols.sh: unknown option $1" >&2; usage ;;
    *) paths+=("$1") ;;
  esac
  shift
done
[ ${#paths[@]} -gt 0 ] || usage
command -v nm >/dev/null || { echo "check_symbols.sh: nm (binutils) is not installed" >&2; exit 2; }

pattern=$(IFS='|'; echo "${FAMILIES[*]}")

is_elf() { [ "$(head -c 4 "$1" 2>/dev/null)" = $'\177ELF' ]; }

files=()
status=0
for p in "${paths[@]}"; do
  if [ -d "$p" ]; then
    n=0
    while IFS= read -r -d '' f; do
      if is_elf "$f"; then
        files+=("$f")
        n=$((n + 1))
      fi
    done < <(find "$p" -name CMakeFiles -prune -o -type f ! -name '*.o' ! -name '*.a' -print0 | sort -z)
    if [ "$require_each" = 1 ] && [ "$n" = 0 ]; then
      echo "check_symbols.sh: $p holds no ELF file (not built yet?)" >&2
      status=2
    fi
  elif [ -f "$p" ] && is_elf "$p"; then
    files+=("$p")
  else
    echo "check_symbols.sh: $p is neither a directory nor an ELF file" >&2
    status=2
  fi
done

for r in "${required[@]+"${required[@]}"}"; do
  found=0
  for f in "${files[@]+"${files[@]}"}"; do
    [ "$(realpath "$f")" = "$(realpath -m "$r")" ] && found=1 && break
  done
  if [ "$found" = 0 ]; then
    echo "check_symbols.sh: required file $r was not found among the files checked" >&2
    status=2
  fi
done

bad=0
for f in "${files[@]+"${files[@]}"}"; do
  if ! syms=$(nm -D --undefined-only -C "$f" 2>&1); then
    echo "check_symbols.sh: nm failed on $f: $syms" >&2
    status=2
    continue
  fi
  while IFS= read -r sym; do
    [ -n "$sym" ] || continue
    echo "$f: imports $sym"
    bad=$((bad + 1))
  done < <(printf '%s\n' "$syms" | sed -n 's/^ *U //p' | grep -E -- "$pattern" || true)
done

echo "check_symbols.sh: ${#files[@]} ELF file(s) checked, $bad forbidden import(s)"
if [ "$bad" -gt 0 ]; then
  echo "check_symbols.sh: these symbols would bind to PyTorch's libtorch copies (see the top of $0);" \
    "use POSIX calls or Boost.Filesystem instead" >&2
  exit 1
fi
exit "$status"
