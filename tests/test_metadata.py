"""Commit cost follows the append, not the store's history."""

from __future__ import annotations

import math
import re
import uuid

import txstore
from txstore.storage import MemoryStorage
from txstore.store.segments import MAX_SEGMENT_CHUNKS

from .faults import FaultyStorage


def _append_calls(store_storage: MemoryStorage) -> list[tuple[str, str]]:
    spy = FaultyStorage(store_storage)
    txstore.open(spy).append([{"x": 1}])
    return spy.calls


def test_commit_reads_constant_metadata_as_history_grows() -> None:
    storage = MemoryStorage()
    store = txstore.create(storage)
    for i in range(1500):
        store.append([{"i": i}])
    manifest = store.snapshot().manifest
    chunks = 1500
    # A binary counter of segments: O(log chunks) of them, not one per commit or chunk.
    assert len(manifest.segments) <= math.log2(chunks) + chunks / MAX_SEGMENT_CHUNKS + 1
    calls = _append_calls(storage)
    manifests_read = {
        int(m) for op, key in calls if op == "read" for m in re.findall(r"index\.v(\d+)\.json", key)
    }
    assert manifests_read <= {1500, 1501}  # never walks back through history
    assert len(calls) < 40, calls
    assert sum(op == "list" for op, _ in calls) == 0


def test_manifest_bytes_do_not_grow_with_commits() -> None:
    storage = MemoryStorage()
    store = txstore.create(storage)
    sizes = {}
    for i in range(1, 1025):
        store.append([{"i": i}])
        if i in (16, 1024):
            sizes[i] = len(storage.read(f"versions/index.v{i}.json"))
    # 64x the commits costs no more than a few more segment references per manifest.
    assert sizes[1024] < sizes[16] * 3, sizes
    snap = store.snapshot()
    assert [s["i"] for s in snap] == list(range(1, 1025))
    assert snap[700]["i"] == 701


def test_decoded_metadata_is_not_tracked_by_the_cycle_collector() -> None:
    """A version's manifest, segments and chunk references are trees of values: none of them
    counts toward the collector's thresholds, whose full passes over a large heap would
    otherwise fall inside opens and reads."""
    import gc

    store = txstore.create(f"memory://{uuid.uuid4().hex}", chunk_bytes=4096)
    for v in range(3):
        store.append([{"i": i, "pad": b"x" * 100} for i in range(50 * v, 50 * v + 50)])
    snap = txstore.open(store.uri).snapshot()
    refs = snap.chunk_refs()
    assert len(refs) > 3
    found = [snap.manifest, *snap.manifest.segments, snap.manifest.config, *refs]
    assert [type(x).__name__ for x in found if gc.is_tracked(x)] == []
