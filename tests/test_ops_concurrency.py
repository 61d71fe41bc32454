"""Vacuum and compaction while another process appends, on local disk and on S3 (moto)."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from typing import Any

import pytest

import txstore

from .conftest import Backend
from .test_operations import make, reopen
from .workers import spawn

pytestmark = pytest.mark.s3  # vacuum lists and deletes; S3 lists are not directories

GRACE = 3.0  # seconds; far longer than one small append takes here


def _appender(backend: Backend, name: str, count: int) -> subprocess.Popen[str]:
    options = json.dumps(backend.storage_options or {})
    proc = spawn("append-loop", backend.uri, options, name, str(count))
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline()) == {"started": True}, proc.stderr.read()
    return proc


def _acks(proc: subprocess.Popen[str]) -> dict[str, int]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    records = [json.loads(line) for line in out.splitlines()]
    assert not [r for r in records if "conflict" in r]  # appends never conflict with these
    return {r["tag"]: r["version"] for r in records}


def _identity(sample: dict[str, Any]) -> tuple[Any, ...]:
    return (sample.get("b"), sample.get("tag"), sample["i"])


def _check_appends(store: txstore.Store, acks: dict[str, int]) -> None:
    """Each acknowledged batch is in the latest version once, at the end of its own version."""
    final = [_identity(s) for s in store.snapshot()]
    counts = Counter(tag for _, tag, _ in final if tag is not None)
    assert counts == {tag: 4 for tag in acks}
    for tag, version in acks.items():
        snap = store.snapshot(version)
        assert [_identity(s) for s in snap[len(snap) - 4 :]] == [(None, tag, i) for i in range(4)]


def test_vacuum_while_another_process_appends(shared_backend: Backend) -> None:
    store = make(shared_backend, appends=6)
    store.tag("pinned", 2)
    store.rollback(3)  # version 7: batches 3-5 are garbage once 4-6 expire
    garbage = {c.path for c in store.snapshot(6).chunks()} - {
        c.path for c in store.snapshot(7).chunks()
    }
    assert len(garbage) == 3
    assert store.expire(keep_last=1).expired == [0, 1, 3, 4, 5, 6]
    time.sleep(GRACE + 1.5)  # every file so far is older than the grace period

    proc = _appender(shared_backend, "w", 8)
    deleted: set[str] = set()
    runs = 0
    while proc.poll() is None or runs == 0:
        report = reopen(shared_backend).vacuum(grace=GRACE)
        deleted |= {f.key for f in report.files}
        runs += 1
    acks = _acks(proc)
    deleted |= {f.key for f in reopen(shared_backend).vacuum(grace=GRACE).files}

    assert garbage <= deleted
    fresh = reopen(shared_backend)
    report = fresh.verify(deep=True)
    assert report.ok, report.problems
    _check_appends(fresh, acks)
    assert len(list(fresh.snapshot("pinned"))) == 20
    assert fresh.version == 7 + len(acks)


def test_compact_while_another_process_appends(shared_backend: Backend) -> None:
    store = make(shared_backend, appends=12)
    before = [_identity(s) for s in store.snapshot()]
    proc = _appender(shared_backend, "c", 10)
    result = store.compact(message="while appending")
    acks = _acks(proc)

    assert result.commit is not None
    assert result.chunks_after < result.chunks_before == 12
    fresh = reopen(shared_backend)
    compacted = fresh.snapshot(result.commit.version)
    parent = fresh.snapshot(result.commit.version - 1)
    assert [_identity(s) for s in compacted] == [_identity(s) for s in parent]
    final = [_identity(s) for s in fresh.snapshot()]
    assert final[: len(before)] == before
    _check_appends(fresh, acks)
    assert fresh.verify(deep=True).ok
