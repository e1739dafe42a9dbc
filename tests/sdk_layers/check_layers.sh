#!/usr/bin/env bash
# Usage: check_layers.sh SOURCE_DIR
# Holds the SDK's layering (share/doc/distopt/DESIGN.md, "The SDK's layers")
# against its headers, and prints the include edges between the layers:
#  1. every header sits in a layer folder (base, transport, collective, optim)
#     and opens with a comment saying what it holds;
#  2. a header includes SDK headers of its own layer or of the layers below
#     it only: transport and optim over base, collective over transport and
#     base (optim and collective do not see each other);
#  3. distopt/sdk/ itself holds sdk.hpp only; sdk/compat/distopt/sdk/ holds
#     the forwarding headers, one for each header of the flat SDK (ABI 1.4),
#     each naming a header that exists and warning that it is deprecated;
#  4. no file of the tree includes a forwarding header (they are for plugins
#     built outside it), except the frozen template of the flat SDK.
set -euo pipefail
src=$(cd "$1" && pwd)
sdk="$src/sdk/include/distopt/sdk"
fail=0
err() { echo "FAIL: $*"; fail=1; }

# The layers, lowest first, and what each may include.
layers=(base transport optim collective)
declare -A may=(
  [base]="base"
  [transport]="base transport"
  [optim]="base optim"
  [collective]="base transport collective"
)
# The headers of the flat SDK (ABI 1.4, and grad_clip of 1.5): their paths stay for 1.x.
flat_sdk="bucket_params comm fault_point flat_range flat_shards fnv1a host host_buffer
grad_clip inner_reducer job_view local_state optimizer_factory optimizer_schema optimizer_state
options p2p_collectives p2p_communicator p2p_transport plugin reduce_kernels request
serial_worker shm_collectives shm_segment socket_io state_io store_split tensor
tensor_state traffic whole_params"

# SDK includes of one file, one "layer/name.hpp" (or "name.hpp" for the top
# folder) a line.
sdk_includes() {
  sed -n 's|^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]distopt/sdk/\([^">]*\)[">].*|\1|p' "$1"
}

declare -A edges=()
for dir in "$sdk"/*/; do
  layer=$(basename "$dir")
  [[ -n "${may[$layer]+x}" ]] || err "sdk/include/distopt/sdk/$layer/ is no layer (${layers[*]})"
done
for layer in "${layers[@]}"; do
  [[ -d "$sdk/$layer" ]] || { err "layer folder sdk/include/distopt/sdk/$layer/ is missing"; continue; }
  for h in "$sdk/$layer"/*; do
    rel="sdk/include/distopt/sdk/$layer/$(basename "$h")"
    [[ "$h" == *.hpp ]] || { err "$rel: not a .hpp header"; continue; }
    head -1 "$h" | grep -q '^// ..' || err "$rel: the first line is not a comment saying what the header holds"
    while read -r inc; do
      [[ -z "$inc" ]] && continue
      to=${inc%%/*}
      if [[ "$inc" != */* ]]; then
        err "$rel includes distopt/sdk/$inc (the umbrella or a forwarding header, not a layer header)"
        continue
      fi
      [[ -f "$sdk/$inc" ]] || err "$rel includes distopt/sdk/$inc, which does not exist"
      [[ " ${may[$layer]:-} " == *" $to "* ]] ||
        err "$rel (layer $layer) includes distopt/sdk/$inc (layer $to): $layer may include ${may[$layer]:-nothing} only"
      [[ "$to" != "$layer" ]] && edges["$layer -> $to"]=$((${edges["$layer -> $to"]:-0} + 1))
    done < <(sdk_includes "$h")
  done
done

# The top folder: sdk.hpp only; the forwarding headers in compat/.
compat="$src/sdk/compat/distopt/sdk"
for h in "$sdk"/*.hpp; do
  [[ "$(basename "$h")" == sdk.hpp ]] && continue
  err "sdk/include/distopt/sdk/$(basename "$h"): a header in distopt/sdk/ itself (new headers go in a layer folder; the flat SDK's forwarding headers in sdk/compat/distopt/sdk/)"
done
fwd=()
for h in "$compat"/*; do
  name=$(basename "$h" .hpp)
  rel="sdk/compat/distopt/sdk/$(basename "$h")"
  target=$(sdk_includes "$h")
  if [[ "$target" != */"$name.hpp" ]] ||
    ! grep -q "^// Forwarding header: moved to distopt/sdk/$target; this path stays for 1.x.$" "$h" ||
    ! grep -q '^#pragma once$' "$h" ||
    ! grep -q "^#warning \"distopt/sdk/$name.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/$target" "$h"; then
    err "$rel: not a forwarding header (a comment 'moved to distopt/sdk/LAYER/$name.hpp; this path stays for 1.x.', #pragma once, the deprecation warning, one #include)"
    continue
  fi
  [[ -f "$sdk/$target" ]] || err "$rel forwards to distopt/sdk/$target, which does not exist"
  fwd+=("$name")
done
for name in $flat_sdk; do
  [[ -f "$compat/$name.hpp" ]] || err "sdk/compat/distopt/sdk/$name.hpp (a header of the flat SDK) is gone: it stays, forwarding, for 1.x"
done
[[ -f "$sdk/sdk.hpp" ]] || err "sdk/include/distopt/sdk/sdk.hpp (the plugin author's one include) is missing"

# No file of the tree includes a forwarding header.
if ((${#fwd[@]})); then
  pattern="#[[:space:]]*include[[:space:]]*[<\"]distopt/sdk/($(IFS='|'; echo "${fwd[*]}"))\.hpp[\">]"
  while IFS= read -r hit; do
    err "${hit#"$src"/} includes a forwarding header: include distopt/sdk/LAYER/NAME.hpp"
  done < <(grep -rnE "$pattern" "$src/core" "$src/plugins" "$src/sdk" "$src/tools" "$src/tests" \
    "$src/share" "$src/README.md" --exclude-dir=flat_sdk_template || true)
fi

echo "SDK include edges between layers (file includes, counted):"
for e in "${!edges[@]}"; do echo "  $e: ${edges[$e]}"; done | sort
if ((fail)); then exit 1; fi
echo "PASS"
