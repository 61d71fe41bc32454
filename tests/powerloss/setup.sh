#!/usr/bin/env bash
# Sets up LazyFS for tests/test_powerloss.py: installs FUSE 3 and LazyFS's build dependencies
# (Debian packages) where they are missing and builds LazyFS from the copy vendored beside the
# repository (shared/vendor/lazyfs) into OUT_DIR (default .tox/lazyfs). Quick once built.
# Never fails the run: where LazyFS cannot be had, it says why in OUT_DIR/unavailable, and the
# power-loss tests skip with that reason. Usage: tests/powerloss/setup.sh [OUT_DIR]
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/.tox/lazyfs}
mkdir -p "$out"
exec 9>"$out/lock"
flock 9  # two runs at once: one builds, the other waits
rm -f "$out/unavailable"

give_up() {
  echo "$1" >"$out/unavailable"
  echo "power-loss tests will skip: $1"
  exit 0
}

# The vendored source: beside the repository (CI lays shared/ next to its clone), or beside a
# folder above it (a worktree).
src=""
dir=$repo
while [ "$dir" != / ]; do
  dir=$(dirname "$dir")
  if [ -x "$dir/shared/vendor/lazyfs/build-offline.sh" ]; then
    src=$dir/shared/vendor/lazyfs
    break
  fi
done
[ -n "$src" ] || give_up "no LazyFS source: shared/vendor/lazyfs is not beside $repo or a folder above it"
[ -e /dev/fuse ] || give_up "no /dev/fuse on this machine (FUSE is needed to mount LazyFS)"

stamp=$(cat "$src/build-offline.sh" "$src/offline-build.patch" | sha256sum | cut -c1-16)
binary=$out/lazyfs/build/lazyfs
if [ -x "$binary" ] && [ "$(cat "$out/ready" 2>/dev/null)" = "$stamp" ] && command -v fusermount3 >/dev/null; then
  exit 0
fi

packages="g++ cmake libfuse3-dev fuse3 libtoml11-dev libspdlog-dev"
# shellcheck disable=SC2086
if ! dpkg -s $packages >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || give_up "Debian packages missing ($packages) and not root to install them"
  command -v apt-get >/dev/null || give_up "Debian packages missing ($packages) and no apt-get"
  echo "installing $packages for the power-loss tests"
  timeout 900 apt-get update -qq >"$out/apt.log" 2>&1 \
    && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq $packages >>"$out/apt.log" 2>&1 \
    || give_up "apt-get install $packages failed: $(tail -n 3 "$out/apt.log" | tr '\n' ' ')"
fi

echo "building LazyFS from $src into $out"
rm -rf "$out/lazyfs" "$out/libs" "$out/build.log" "$out/ready"
timeout 1800 "$src/build-offline.sh" "$out" >"$out/build-offline.out" 2>&1 \
  || give_up "the LazyFS build failed: $(tail -n 5 "$out/build-offline.out" | tr '\n' ' ')"
[ -x "$binary" ] || give_up "the LazyFS build made no $binary"
echo "$stamp" >"$out/ready"
