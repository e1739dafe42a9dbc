#!/usr/bin/env bash
# Usage: check_layers.sh SOURCE_DIR
# Holds core's layering (share/doc/distopt/DESIGN.md, "Core's layers")
# against core/src and core/include/distopt, and prints the include edges
# between the layers:
#  1. every source of core/src sits in a layer folder (no file at the top,
#     no folder that is not a layer);
#  2. a file includes files of its own layer or of the layers it may
#     include (the table below: a partial order, siblings unseen) only.
#     A public header (distopt/NAME.hpp) belongs to the layer that defines
#     what it declares (the table below); the C ABI (distopt/*.h) and the
#     SDK (distopt/sdk/) sit below every layer;
#  3. the public headers include each other by the same rules;
#  4. a class's (or struct's) member functions are defined in the files of
#     the layer its header belongs to (DistributedOptimizer in optim/,
#     Runtime in runtime/), not wherever a caller needed them.
set -euo pipefail
src=$(cd "$1" && pwd)
core="$src/core"
fail=0
err() { echo "FAIL: $*"; fail=1; }

# The layers, lowest first, and the layers each may include besides its own
# (a partial order, as the SDK's: machine/ and store/ are siblings that do
# not see each other, nor config/ the store).
layers=(base machine store registry communicator config state optim runtime elastic)
declare -A may=(
  [base]=""
  [machine]="base"
  [store]="base"
  [registry]="base store"
  [communicator]="base machine store registry"
  [config]="base registry communicator"
  [state]="base communicator config"
  [optim]="base machine registry communicator config state"
  [runtime]="base machine store registry communicator config state optim"
  [elastic]="base store communicator config state optim runtime"
)
declare -A rank=()
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done
# The table is a partial order: a layer may include lower layers only.
for l in "${layers[@]}"; do
  for m in ${may[$l]}; do
    [[ -n "${rank[$m]+x}" && ${rank[$m]} -lt ${rank[$l]} ]] ||
      { echo "FAIL: the table of $0: $l may include $m, which is no layer below it"; exit 1; }
  done
done
# Public headers -> the layer defining what they declare. "api": declarations
# only (no definition in core/src), below every layer.
declare -A public=(
  [error]=api [buckets]=api
  [host_services]=base
  [blas]=machine [process]=machine [slurm]=machine [threads]=machine [watchdog]=machine
  [store]=store [elastic_membership]=store
  [registry]=registry [host_api]=registry [component_options]=registry
  [device_rule]=communicator [host_communicator]=communicator
  [buffers]=config [config]=config [key_schema]=config [lr_schedule]=config [precision]=config
  [checkpoint]=state [checkpoint_steps]=state
  [distributed_optimizer]=optim [sharded_unit]=optim
  [runtime]=runtime
  [elastic]=elastic
)

includes() {
  sed -n 's|^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*|\1|p' "$1"
}

# The layer of an included path, or "" for one below every layer; "?" unknown.
layer_of() {
  local inc=$1
  case "$inc" in
    distopt/sdk/* | distopt/*.h) echo "" ;;
    distopt/*.hpp)
      local name=${inc#distopt/}
      name=${name%.hpp}
      if [[ -z "${public[$name]+x}" ]]; then
        echo "?"
      elif [[ "${public[$name]}" == api ]]; then
        echo ""
      else echo "${public[$name]}"; fi
      ;;
    */*) local l=${inc%%/*}; [[ -n "${rank[$l]+x}" ]] && echo "$l" || echo "?" ;;
    *) echo "?" ;;
  esac
}

declare -A edges=()
check_file() {  # FILE-RELATIVE-PATH LAYER FILE
  local rel=$1 layer=$2 file=$3 inc to
  while read -r inc; do
    [[ -z "$inc" ]] && continue
    to=$(layer_of "$inc")
    if [[ "$to" == "?" ]]; then
      err "$rel includes \"$inc\": no layer of core (${layers[*]}) and no public header in the table of $0"
      continue
    fi
    [[ -z "$to" || "$to" == "$layer" ]] && continue
    if [[ " ${may[$layer]} " != *" $to "* ]]; then
      if ((${rank[$to]} > ${rank[$layer]})); then
        err "$rel (layer $layer) includes \"$inc\" (layer $to): it runs up"
      else
        err "$rel (layer $layer) includes \"$inc\" (layer $to): $layer may include ${may[$layer]:-no other layer} only"
      fi
    fi
    edges["$layer -> $to"]=$((${edges["$layer -> $to"]:-0} + 1))
  done < <(includes "$file")
}

while IFS= read -r f; do
  rel=${f#"$src"/}
  sub=${f#"$core/src/"}
  if [[ "$sub" != */* ]]; then
    err "$rel: a file at the top of core/src (every file goes in a layer folder: ${layers[*]})"
    continue
  fi
  layer=${sub%%/*}
  if [[ -z "${rank[$layer]+x}" ]]; then
    err "$rel: core/src/$layer/ is no layer (${layers[*]})"
    continue
  fi
  check_file "$rel" "$layer" "$f"
done < <(find "$core/src" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) | sort)

for f in "$core"/include/distopt/*.hpp; do
  name=$(basename "$f" .hpp)
  rel=${f#"$src"/}
  if [[ -z "${public[$name]+x}" ]]; then
    err "$rel: a public header missing from the table of $0 (say which layer defines it)"
    continue
  fi
  layer=${public[$name]}
  [[ "$layer" == api ]] && layer=${layers[0]}
  check_file "$rel" "$layer" "$f"
done
for name in "${!public[@]}"; do
  [[ -f "$core/include/distopt/$name.hpp" ]] || err "the table names distopt/$name.hpp, which does not exist"
done

# 4. Classes are defined in their own layer's files.
defined_in() {  # CLASS: the .cpp files of core/src defining a member of CLASS
  grep -rlE "^([A-Za-z_].*[ *&:])?$1::~?[A-Za-z_][A-Za-z0-9_]*\(" "$core/src" --include='*.cpp' || true
}
class_home() {  # HEADER LAYER
  local h=$1 layer=$2 cls f at
  while read -r cls; do
    [[ -z "$cls" ]] && continue
    while read -r f; do
      [[ -z "$f" ]] && continue
      at=${f#"$core/src/"}
      at=${at%%/*}
      [[ "$at" == "$layer" ]] ||
        err "${f#"$src"/} defines members of $cls (${h#"$src"/}, layer $layer): they belong in core/src/$layer/"
    done < <(defined_in "$cls")
  done < <(sed -nE 's/^(class|struct) ([A-Z][A-Za-z0-9_]*)( final)? *[:{].*/\2/p' "$h")
}
for f in "$core"/include/distopt/*.hpp; do
  name=$(basename "$f" .hpp)
  [[ -n "${public[$name]+x}" && "${public[$name]}" != api ]] && class_home "$f" "${public[$name]}"
done
for f in "$core"/src/*/*.hpp; do
  layer=${f#"$core/src/"}
  layer=${layer%%/*}
  [[ -n "${rank[$layer]+x}" ]] && class_home "$f" "$layer"
done

echo "core include edges between layers (file includes, counted):"
for e in "${!edges[@]}"; do echo "  $e: ${edges[$e]}"; done | sort
if ((fail)); then exit 1; fi
echo "PASS"
