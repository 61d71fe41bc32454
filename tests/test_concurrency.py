"""Real processes racing to append to one store, on local disk and on S3."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import txstore

from .conftest import Backend
from .invariants import Ack, violations
from .workers import spawn

pytestmark = pytest.mark.s3  # S3's conditional writes are what the race is about


def test_racing_processes_all_land_exactly_once(shared_backend: Backend) -> None:
    # Through moto each append is a dozen HTTP requests: fewer there, where
    # test_txn_race.py also races 4x25 appends started in lockstep.
    writers, appends = 4, (10 if shared_backend.name == "s3" else 25)
    txstore.create(shared_backend.uri, **shared_backend.kwargs())
    options = json.dumps(shared_backend.storage_options or {})
    procs = [
        spawn("append-many", shared_backend.uri, options, str(w), str(appends))
        for w in range(writers)
    ]
    acknowledged: dict[str, int] = {}
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        for line in out.splitlines():
            record = json.loads(line)
            acknowledged[record["tag"]] = record["version"]
    assert len(acknowledged) == writers * appends

    store = txstore.open(shared_backend.uri, **shared_backend.kwargs())
    assert store.version == writers * appends  # contiguous: 1..100, no gaps, no extras
    # each version its parent plus one whole append, each at the version it reported
    history, found = violations(store, [Ack(tag, v) for tag, v in acknowledged.items()])
    assert found == []
    tags = Counter(s["tag"] for s in history.samples)
    assert tags == {tag: 3 for tag in acknowledged}  # each append present exactly once
    log = store.log()
    assert sorted(c.message for c in log if c.operation == "append") == sorted(acknowledged)
