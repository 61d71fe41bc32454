"""A pass over the whole history (verify, the exact vacuum) holds what it needs per segment
and chunk, and each version's commit fields: not every manifest at once."""

from __future__ import annotations

import tracemalloc
import uuid

import pytest

import txstore
from txstore.store import maintenance

VERSIONS = 2_000
CHUNKS_PER_VERSION = 10


def _long_history() -> txstore.Store:
    """Versions whose every manifest names more segments (the real commit path, as
    bench_scale.py builds its histories)."""
    store = txstore.create(f"memory://{uuid.uuid4().hex}")
    store.append([{"i": 0}])
    (chunk,) = store.snapshot(1).chunk_refs()
    manifest = store.snapshot().manifest
    for _ in range(VERSIONS):
        manifest = store._ctx.append_chunks((chunk,) * CHUNKS_PER_VERSION, start=manifest).manifest
    return store


def _peak_mib(run: object) -> float:
    tracemalloc.start()
    try:
        assert callable(run)
        run()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_verify_and_vacuum_do_not_hold_every_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maintenance, "_MANIFEST_BATCH", 64, raising=False)
    store = _long_history()
    manifest_bytes = len(store.storage.read(f"versions/index.v{store.version}.json"))
    assert manifest_bytes > 2_000  # each names tens of segments
    # Every manifest decoded at once would take several times their bytes on disk, over
    # 2,000 versions: far above these bounds.
    whole = VERSIONS * manifest_bytes / 2**20
    report = txstore.open(store.uri).verify(quick=True)
    assert report.ok and report.versions == VERSIONS + 2
    assert _peak_mib(lambda: txstore.open(store.uri).verify(quick=True)) < whole / 2
    assert _peak_mib(lambda: txstore.open(store.uri).vacuum(grace=0)) < whole / 3
