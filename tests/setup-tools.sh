#!/usr/bin/env bash
# Sets up both tools that the tests need and pip cannot install, at once: LazyFS for the
# power-loss tests (tests/powerloss/setup.sh) and Azurite for the Azure tests
# (tests/azurite/setup.sh). Each script takes a lock and is quick once its tool is ready, so
# tox's tools env can start them while py installs its packages, and py's own call then only
# waits for them. Never fails the run (neither script does). Usage: tests/setup-tools.sh TOXWORKDIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:?usage: tests/setup-tools.sh TOXWORKDIR}
# LazyFS goes where tests/lazyfs.py looks for it (the script's default, .tox/lazyfs).
bash "$here/powerloss/setup.sh" &
bash "$here/azurite/setup.sh" "$work/azurite" &
wait
