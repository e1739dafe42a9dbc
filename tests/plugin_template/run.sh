#!/usr/bin/env bash
# Usage: run.sh BUILD_DIR SOURCE_DIR [TEMPLATE_DIR [--flat-sdk-includes]]
# Installs distopt into a temporary prefix, builds the plugin template
# (TEMPLATE_DIR, share/distopt/plugin-template by default) against it with
# find_package(distopt), drops the .so into a plugin directory, and checks
# that `distopt plugins` lists it and `distopt train` trains with it.
# With the template as the flat SDK shipped it (ABI 1.4, before the SDK's
# layers; tests/plugin_template/flat_sdk_template) this is the promise that a
# plugin written against an older 1.x SDK builds, loads and trains unchanged;
# --flat-sdk-includes also compiles one file that includes every SDK header by
# its flat path (distopt/sdk/NAME.hpp).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
template=$(cd "${3:-$src/share/distopt/plugin-template}" && pwd)
flat_sdk_includes=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== install into $work/prefix"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -f "$work/prefix/lib/cmake/distopt/distoptConfig.cmake"
test -x "$work/prefix/bin/distopt"
# The installed CLI and plugins start from the prefix alone: every library
# they link resolves (libtorch from a PyTorch wheel lives on no loader path).
for f in "$work/prefix/bin/distopt" $(find "$work/prefix" -name '*.so' -type f); do
  missing=$(ldd "$f" 2>/dev/null | grep 'not found' || true)
  [[ -z $missing ]] || { echo "FAIL: installed $f does not find: $missing" >&2; exit 1; }
done

echo "== the install ships the plugins of plugins/ only (no test plugin)"
for f in "$work/prefix/lib/distopt/plugins"/*.so; do
  n=$(basename "$f" .so)
  n=${n#libdistopt_}
  [[ -f "$src/plugins/$n/CMakeLists.txt" ]] ||
    { echo "FAIL: the install ships $f, which is no plugin of $src/plugins" >&2; exit 1; }
done

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
# Where the project's own build found its dependencies (a PyTorch venv's
# libtorch, unpacked Debian packages on the GPU machine): the template's
# find_package(distopt) looks for the same ones.
cache_var() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -1; }
prefix_path="$work/prefix"
parent_prefix=$(cache_var CMAKE_PREFIX_PATH)
[[ -n $parent_prefix ]] && prefix_path="$prefix_path;$parent_prefix"
for v in Torch_DIR DLPACK_INCLUDE_DIR; do
  val=$(cache_var $v)
  [[ -n $val && $val != *NOTFOUND ]] && gen+=("-D$v=$val")
done

if [[ "$flat_sdk_includes" == --flat-sdk-includes ]]; then
  echo "== every header of the flat SDK compiles by its flat path against the install"
  names="bucket_params comm fault_point flat_range flat_shards fnv1a host host_buffer
    inner_reducer job_view local_state optimizer_factory optimizer_schema optimizer_state
    options p2p_collectives p2p_communicator p2p_transport plugin reduce_kernels request
    sdk serial_worker shm_collectives shm_segment socket_io state_io store_split tensor
    tensor_state traffic whole_params"
  mkdir -p "$work/includes"
  for n in $names; do
    test -f "$work/prefix/include/distopt/sdk/$n.hpp" ||
      { echo "FAIL: the install lacks include/distopt/sdk/$n.hpp (a path of the flat SDK)" >&2; exit 1; }
    echo "#include \"distopt/sdk/$n.hpp\""
  done >"$work/includes/all.cpp"
  cat >"$work/includes/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(flat_sdk_includes LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(distopt REQUIRED)
distopt_add_plugin(flat_sdk_includes TORCH SOURCES all.cpp)
CMAKE
  cmake -S "$work/includes" -B "$work/includes/build" "${gen[@]}" \
    -DCMAKE_PREFIX_PATH="$prefix_path" >"$work/includes.log" 2>&1 &&
    cmake --build "$work/includes/build" >>"$work/includes.log" 2>&1 ||
    { cat "$work/includes.log"; echo "FAIL: the flat SDK's include paths do not compile"; exit 1; }
  # The compiler tells the author to move on (sdk/compat/ warns on each path).
  grep -q "distopt/sdk/comm.hpp is deprecated: include distopt/sdk/sdk.hpp" "$work/includes.log" ||
    { cat "$work/includes.log"; echo "FAIL: no deprecation warning for the flat SDK's paths"; exit 1; }
fi

if [[ -z "$flat_sdk_includes" ]]; then
  # The README's one-liner, distopt_add_plugin(NAME SOURCES ...) without the
  # TORCH keyword, against the build tree's package (no install).
  echo "== build the template against the build tree (-Ddistopt_DIR=$build), no TORCH keyword"
  cp -r "$template" "$work/from_build"
  sed -i 's/distopt_add_plugin(template TORCH SOURCES/distopt_add_plugin(template SOURCES/' \
    "$work/from_build/CMakeLists.txt"
  grep -q 'distopt_add_plugin(template SOURCES' "$work/from_build/CMakeLists.txt" ||
    { echo "FAIL: the template's distopt_add_plugin line changed; update this test" >&2; exit 1; }
  { cmake -S "$work/from_build" -B "$work/from_build/build" "${gen[@]}" -Ddistopt_DIR="$build" \
      -DCMAKE_BUILD_TYPE=Release && cmake --build "$work/from_build/build"; } \
    >"$work/from_build.log" 2>&1 ||
    { cat "$work/from_build.log"; echo "FAIL: the template does not build against the build tree"; exit 1; }
  mkdir -p "$work/from_build/plugins"
  cp "$work/from_build/build/libdistopt_template.so" "$work/from_build/plugins/"
  listed=$("$build/bin/distopt" plugins --plugin-path "$work/from_build/plugins")
  echo "$listed" | grep -qE "reducer +template_mean" ||
    { echo "$listed"; echo "FAIL: the build-tree plugin is not listed by the build's distopt plugins"; exit 1; }
fi

echo "== build the template ($template) against the installed SDK"
cp -r "$template" "$work/template"
cmake -S "$work/template" -B "$work/template/build" "${gen[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix_path" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/template/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

mkdir -p "$work/plugins"
cp "$work/template/build/libdistopt_template.so" "$work/plugins/"

echo "== the installed check_symbols.sh: no symbol PyTorch's libtorch exports (DESIGN.md)"
"$work/prefix/share/distopt/check_symbols.sh" --require-each "$work/plugins" "$work/prefix/bin" \
  "$work/prefix/lib"

echo "== distopt plugins lists it"
export DISTOPT_PLUGIN_PATH="$work/prefix/lib/distopt/plugins"
out=$("$work/prefix/bin/distopt" plugins --plugin-path "$work/plugins")
echo "$out"
echo "$out" | grep -E "algorithm +template_sgd" >/dev/null ||
  { echo "FAIL: template_sgd not listed by distopt plugins"; exit 1; }
echo "$out" | grep -E "reducer +template_mean" >/dev/null ||
  { echo "FAIL: template_mean not listed by distopt plugins"; exit 1; }
# ABI 1.2: the SDK found the template's traits and check_job.
echo "$out" | grep -A1 -E "^reducer template_mean" | grep -q "reduces to the exact mean" ||
  { echo "FAIL: template_mean's exact-mean trait is not listed"; exit 1; }
echo "$out" | grep -A1 -E "^algorithm template_sgd" | grep -q "checks the whole job" ||
  { echo "FAIL: template_sgd's check_job is not listed"; exit 1; }

echo "== distopt train selects it"
cat >"$work/job.yaml" <<YAML
plugins: {paths: [$work/plugins]}
world: {size: 2, timeout_s: 60}
communicator: {name: tcp}
reducer: {name: template_mean}
algorithm: {name: template_sgd}
optimizer: {name: sgd, lr: 0.1}
train: {model: mlp, epochs: 1, batch_size: 64, seed: 0, max_steps: 30, log_every: 10}
YAML
out=$("$work/prefix/bin/distopt" train "$work/job.yaml" 2>&1) || { echo "$out"; echo "FAIL: train exited non-zero"; exit 1; }
echo "$out"
echo "$out" | grep -qi "template_sgd" || { echo "FAIL: train output does not name the algorithm"; exit 1; }
acc=$(echo "$out" | grep -oiE "test accuracy[^0-9]*[0-9.]+" | tail -1 | grep -oE "[0-9.]+$")
echo "test accuracy: $acc"
# 30 steps of SGD on Fashion-MNIST reach well above chance (10%).
awk -v a="$acc" 'BEGIN { exit !(a > 40) }' || { echo "FAIL: accuracy $acc% is not above 40%"; exit 1; }

echo "== the learning rate is optimizer.lr (said once): lr 0 leaves the model at chance"
sed -i 's/lr: 0.1}/lr: 0.0}/' "$work/job.yaml"
out=$("$work/prefix/bin/distopt" train "$work/job.yaml" 2>&1) || { echo "$out"; echo "FAIL: train (lr 0) exited non-zero"; exit 1; }
acc0=$(echo "$out" | grep -oiE "test accuracy[^0-9]*[0-9.]+" | tail -1 | grep -oE "[0-9.]+$")
echo "test accuracy at lr 0: $acc0"
awk -v a="$acc0" 'BEGIN { exit !(a < 25) }' || { echo "FAIL: lr 0 trained to $acc0%"; exit 1; }

echo "== template_sgd refuses another optimizer at check time (ABI 1.2 check_job), at its line"
sed -i 's/name: sgd, lr: 0.0/name: adam, lr: 0.001/' "$work/job.yaml"
# Line 6, column 19: the `adam` of `optimizer: {name: adam, ...}`.
where="$work/job.yaml:6:19: optimizer.name: algorithm 'template_sgd' refuses this job: template_sgd applies plain SGD: optimizer.name must be sgd, got adam"
if out=$("$work/prefix/bin/distopt" check "$work/job.yaml" 2>&1); then
  echo "$out"; echo "FAIL: distopt check accepted template_sgd with adam"; exit 1
fi
echo "$out" | grep -qF "$where" || { echo "$out"; echo "FAIL: no file:line:column error from check"; exit 1; }
if out=$("$work/prefix/bin/distopt" train "$work/job.yaml" 2>&1); then
  echo "$out"; echo "FAIL: template_sgd accepted adam"; exit 1
fi
echo "$out" | grep -qF "$where" || { echo "$out"; echo "FAIL: train did not refuse before starting"; exit 1; }
echo "PASS"
