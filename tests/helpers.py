"""Shared checks for the race and crash tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import txstore

REPO = Path(__file__).resolve().parent.parent


def run_child(*args: str, timeout: float = 180) -> list[dict[str, Any]]:
    """Run tests/child.py in a fresh interpreter; its JSON lines, parsed."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.child", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode not in (0, -9):
        raise AssertionError(f"child failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def check_history(store: txstore.Store) -> list[list[dict[str, Any]]]:
    """Check every version is its parent plus one commit; return each version's samples.

    Reads every sample of the latest version (which checks every chunk's checksum) and every
    version's chunk list, which must extend its parent's: chunks are shared, never rewritten.
    """
    latest = store.version
    final = list(store.snapshot(latest))
    assert len(final) == store.snapshot(latest).manifest.num_samples
    contents = []
    previous: list[str] = []
    previous_samples = 0
    for version in range(latest + 1):
        snap = store.snapshot(version)
        paths = [c.path for c in snap.chunks()]
        assert sum(c.num_samples for c in snap.chunks()) == len(snap)
        if version:
            assert snap.manifest.parent == version - 1
            assert paths[: len(previous)] == previous, f"version {version} rewrote history"
            assert len(snap) - previous_samples == snap.manifest.added_samples
        contents.append(final[: len(snap)])
        previous, previous_samples = paths, len(snap)
    return contents
