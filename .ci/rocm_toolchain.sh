#!/usr/bin/env bash
# The current ROCm toolchain (Debian sid: hipcc 7.x, clang 21, HIP 6.4) in a sid root filesystem outside the
# clone, for the AMD build checks (tests/test_build_rocm.py). Sid packages never touch the host system.
#
#   rocm_toolchain.sh ensure            build the root, or reuse the cached one whose package versions are
#                                       what sid offers now; prints the root's path (progress on stderr)
#   rocm_toolchain.sh exec -- CMD...    run CMD inside the root (absolute paths of the root's tools, e.g.
#                                       /usr/bin/hipcc), in the caller's directory, with the clone and /tmp
#                                       visible at the same paths; needs ROCM_SD_SID_ROOT or a built root
#   rocm_toolchain.sh versions          the root's package versions (also in <root>/../versions.txt)
#
# Cache: $ROCM_SD_TOOLCHAIN_CACHE (default /var/cache/rocm_sd-ci)/sid-rocm/<key>/root, key = the versions of
# the toolchain packages; `current` points at the newest. `ensure` asks sid (apt-get update inside the cached
# root, a few seconds) whether the versions moved and builds a new root only then; offline, it reuses the
# cached root. ROCM_SD_TOOLCHAIN_OFFLINE=1 skips the question.
#
# Mounts (/proc, the clone, /tmp, $ROCM_SD_SID_BINDS) exist only for one `exec`, in a private mount namespace
# (unshare -m), and a trap unmounts them on every exit: nothing stays mounted that an `rm -rf` of an old root
# could follow into a source tree.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
CACHE="${ROCM_SD_TOOLCHAIN_CACHE:-/var/cache/rocm_sd-ci}/sid-rocm"
MIRROR="${ROCM_SD_SID_MIRROR:-http://deb.debian.org/debian}"
# The toolchain (hipcc pulls clang-21, lld-21, llvm-21, rocm-device-libs-21), the HIP runtime and headers, and
# what CMake needs to configure and link _C (pybind11, the Python headers).
PACKAGES=(hipcc libamdhip64-dev rocminfo python3-dev pybind11-dev cmake ninja-build)
# Whose versions name a root.
KEY_PACKAGES=(hipcc clang-21 rocm-device-libs-21 libamdhip64-dev)

log() { echo "rocm_toolchain: $*" >&2; }

key_from_versions() {  # "pkg=version" lines on stdin -> "hipcc7.0.2-clang21.1.8-hip6.4.3-<hash of the full versions>"
  local versions
  versions="$(sort -u)"
  local short
  short="$(printf '%s\n' "$versions" | sed -E 's/^([^=]+)=([0-9]+:)?([0-9.]+).*/\1 \3/' |
           awk '$1=="hipcc"{h=$2} $1=="clang-21"{c=$2} $1=="libamdhip64-dev"{r=$2} END{print "hipcc" h "-clang" c "-hip" r}')"
  echo "$short-$(printf '%s\n' "$versions" | sha256sum | cut -c1-8)"
}

key_of() {  # <root>: the key of what is installed there
  chroot "$1" dpkg-query -W -f '${Package}=${Version}\n' "${KEY_PACKAGES[@]}" | key_from_versions
}

candidate_key() {  # <root>: the key sid offers now (apt-get update inside the root), or "" when offline
  local root="$1" p
  chroot "$root" apt-get update -qq >/dev/null 2>&1 || return 0
  for p in "${KEY_PACKAGES[@]}"; do
    echo "$p=$(chroot "$root" apt-cache policy "$p" | awk '/Candidate:/{print $2}')"
  done | key_from_versions
}

remove_root() {  # never follows a mount into another file system (a bind-mounted clone)
  local dir="$1"
  if grep -qs " $dir/" /proc/self/mounts; then log "not removing $dir: something is mounted inside"; return 0; fi
  rm -rf --one-file-system "$dir"
}

build_root() {  # -> prints the new key dir
  local tmp="$CACHE/building.$$"
  remove_root "$tmp"
  mkdir -p "$tmp"
  log "building a sid root with ${PACKAGES[*]} (mmdebstrap, $MIRROR)"
  if ! command -v mmdebstrap >/dev/null; then  # the host's own (bookworm) mmdebstrap; nothing from sid
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null; }
  fi
  local include
  include="$(IFS=,; echo "${PACKAGES[*]}")"
  # Valid-Until off: the mirror's sid Release file may be past its date. Documentation is not unpacked.
  mmdebstrap --variant=apt --include="$include" \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    sid "$tmp/root" "$MIRROR" >"$tmp/mmdebstrap.log" 2>&1 || { tail -30 "$tmp/mmdebstrap.log" >&2; return 1; }
  local key
  key="$(key_of "$tmp/root")"
  chroot "$tmp/root" dpkg-query -W -f '${Package}=${Version}\n' "${KEY_PACKAGES[@]}" "${PACKAGES[@]}" |
    sort -u >"$tmp/versions.txt"
  date -u +%Y-%m-%dT%H:%M:%SZ >"$tmp/complete"
  if [ -e "$CACHE/$key/complete" ]; then
    remove_root "$tmp"
  else
    remove_root "$CACHE/$key"
    mv -T "$tmp" "$CACHE/$key"
  fi
  echo "$CACHE/$key"
}

ensure() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/lock"
  flock 9  # one builder at a time on this machine (other clones' CI)
  local dir=""
  if [ -e "$CACHE/current/complete" ]; then
    dir="$(readlink -f "$CACHE/current")"
    if [ -z "${ROCM_SD_TOOLCHAIN_OFFLINE:-}" ]; then
      local now
      now="$(candidate_key "$dir/root")"
      if [ -z "$now" ]; then
        log "sid not reachable: reusing $(basename "$dir")"
      elif [ "$now" != "$(basename "$dir")" ]; then
        log "sid moved ($(basename "$dir") -> $now)"
        if [ -e "$CACHE/$now/complete" ]; then dir="$CACHE/$now"; else dir=""; fi
      fi
    fi
  fi
  if [ -z "$dir" ]; then
    dir="$(build_root)"
  else
    log "reusing $dir"
    touch "$dir"
  fi
  ln -sfn "$(basename "$dir")" "$CACHE/current.tmp.$$" && mv -T "$CACHE/current.tmp.$$" "$CACHE/current"
  # Keep the two newest roots (the current one and its predecessor).
  local old
  for old in $(ls -1dt "$CACHE"/hipcc* 2>/dev/null | tail -n +3); do
    [ "$old" != "$dir" ] && { log "removing old root $old"; remove_root "$old"; }
  done
  echo "$dir/root"
}

root_or_die() {
  local root="${ROCM_SD_SID_ROOT:-}"
  [ -n "$root" ] || root="$CACHE/current/root"
  [ -x "$root/usr/bin/hipcc" ] || { log "no sid root at $root (run: $0 ensure)"; exit 2; }
  readlink -f "$root"
}

inner() {  # (inside `unshare -m`) <root> <cwd> <bind>... -- CMD...
  local root="$1" cwd="$2"
  shift 2
  local binds=()
  while [ "$1" != "--" ]; do binds+=("$1"); shift; done
  shift
  local mounted=()
  cleanup() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  }
  trap cleanup EXIT
  mount --make-rprivate / 2>/dev/null || true
  mount -t proc proc "$root/proc" && mounted+=("$root/proc")
  local b
  for b in "${binds[@]}"; do
    [ -d "$b" ] || continue
    mkdir -p "$root$b"
    mount --bind "$b" "$root$b" && mounted+=("$root$b")
  done
  # A clean environment inside (the host's PYTHONPATH / LD_LIBRARY_PATH mean nothing there), plus the
  # variables the build reads.
  local env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
             HIP_PLATFORM=amd TMPDIR=/tmp)
  local name
  for name in GPU_TARGETS ROCM_SD_GPU ROCM_SD_CK_ROOT CMAKE_BUILD_PARALLEL_LEVEL LD_BIND_NOW; do
    [ -n "${!name:-}" ] && env+=("$name=${!name}")
  done
  set +e
  chroot "$root" /usr/bin/env -i "${env[@]}" /bin/sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' sh "$cwd" "$@"
  local status=$?
  set -e
  exit "$status"
}

case "${1:-}" in
  ensure) ensure ;;
  versions) cat "$(dirname "$(root_or_die)")/versions.txt" ;;
  exec)
    shift
    [ "${1:-}" = "--" ] && shift
    root="$(root_or_die)"
    binds=("$REPO" /tmp)
    for b in ${ROCM_SD_SID_BINDS:-}; do binds+=("$b"); done
    exec unshare --mount --propagation private -- "$HERE/rocm_toolchain.sh" __inner "$root" "$PWD" "${binds[@]}" -- "$@"
    ;;
  __inner) shift; inner "$@" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
