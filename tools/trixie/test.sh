#!/usr/bin/env bash
# Builds and tests distopt against libtorch 2.x on a CPU machine: Debian
# trixie (libtorch 2.6, g++ 14, UCX 1.18, Boost 1.83) in a chroot made with
# debootstrap, with this checkout bind-mounted at /src. Root only (chroot,
# mount). The chroot is kept between runs; the build goes to build-trixie/.
#
#   tools/trixie/test.sh               # make the chroot if missing, build, ctest
#   tools/trixie/test.sh -R hybrid     # extra arguments go to ctest
#   DISTOPT_TRIXIE_ROOT=/path ...      # where the chroot lives (default /var/tmp/distopt-trixie)
#   DISTOPT_TRIXIE_BUILD_ONLY=1 ...    # build, no ctest
#   DISTOPT_BUILD_TARGETS="_distopt tcp" tools/trixie/test.sh -R python_backend
#                                      # build these targets only (tools/build.sh)
#   DISTOPT_TRIXIE_RUN="python3 tools/bench/compare_fsdp.py" tools/trixie/test.sh
#                                      # build, then run this command in /src, not ctest
#
# Needs network access to a Debian mirror (DISTOPT_TRIXIE_MIRROR, default
# deb.debian.org). tools/setup.sh runs inside, so the packages are the ones
# tools/test.sh installs on bookworm, in their trixie versions.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
ROOT=${DISTOPT_TRIXIE_ROOT:-/var/tmp/distopt-trixie}
MIRROR=${DISTOPT_TRIXIE_MIRROR:-http://deb.debian.org/debian}
[[ $(id -u) -eq 0 ]] || { echo "trixie: needs root (debootstrap, chroot, mount)" >&2; exit 2; }

if [[ ! -x $ROOT/usr/bin/apt-get ]]; then
  command -v debootstrap >/dev/null || apt-get install -y -q debootstrap
  echo "trixie: debootstrap into $ROOT"
  debootstrap --variant=minbase --include=ca-certificates trixie "$ROOT" "$MIRROR" >/dev/null
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"

mounted=()
bind() {  # bind <host path> <path in the chroot>
  mkdir -p "$ROOT$2"
  if ! mountpoint -q "$ROOT$2"; then
    mount --bind "$1" "$ROOT$2"
    mounted=("$ROOT$2" "${mounted[@]}")
  fi
}
cleanup() { for m in "${mounted[@]}"; do umount "$m" || true; done; }
trap cleanup EXIT
for d in /proc /sys /dev /dev/pts /dev/shm; do bind "$d" "$d"; done
bind "$SRC" /src

# ctest's arguments, quoted for the inner shell.
args=$(printf ' %q' "$@")
chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  DEBIAN_FRONTEND=noninteractive DISTOPT_BUILD_DIR=build-trixie \
  DISTOPT_TRIXIE_BUILD_ONLY="${DISTOPT_TRIXIE_BUILD_ONLY:-0}" \
  DISTOPT_BUILD_TARGETS="${DISTOPT_BUILD_TARGETS:-}" DISTOPT_TRIXIE_RUN="${DISTOPT_TRIXIE_RUN:-}" \
  /bin/bash -c "
  set -euo pipefail
  cd /src
  tools/setup.sh
  echo \"trixie: \$(c++ --version | head -1); libtorch \$(dpkg-query -W -f='\${Version}' libtorch-dev)\"
  tools/build.sh
  if [[ -n \$DISTOPT_TRIXIE_RUN ]]; then
    DISTOPT_BUILD_DIR=build-trixie /bin/bash -c \"\$DISTOPT_TRIXIE_RUN\"
  elif [[ \$DISTOPT_TRIXIE_BUILD_ONLY != 1 ]]; then
    cd build-trixie && ctest --output-on-failure --timeout 900 -j \${DISTOPT_TEST_JOBS:-2} $args
  fi"
