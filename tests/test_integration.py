"""The pieces together: leases from snapshots and datasets, Store.transaction and
Store.add_fields, and staged commits that meet a rollback."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import txstore
from txstore.torch import StreamingDataLoader, StreamingDataset


def _store(path: Path) -> txstore.Store:
    store = txstore.create(str(path), chunk_bytes=2048)
    for v in range(4):
        store.append({"v": v, "i": i, "pad": bytes(200)} for i in range(20))
    return store


def test_a_leased_snapshot_survives_expire_and_vacuum(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    pinned = store.snapshot(2)
    with pinned.lease(ttl="1h"):
        store.expire(keep_last=1)
        assert 2 not in store.expired_versions() and 1 in store.expired_versions()
        later = txstore.Store(store.storage, clock=lambda: time.time() + 30 * 86400)
        later.vacuum(grace=0)
        assert [s["v"] for s in pinned] == [0] * 20 + [1] * 20  # every chunk still there
    with pytest.raises(txstore.VersionExpiredError):
        store.snapshot(1)


def test_streaming_dataset_holds_a_lease_for_its_run(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    ds = StreamingDataset(store.snapshot(3), lease_ttl="1h")
    assert [lease.version for lease in store.leases() if lease.active] == [3]
    store.expire(keep_last=1)
    assert 3 not in store.expired_versions()
    ids = [int(i) for b in StreamingDataLoader(ds, batch_size=10, num_workers=2) for i in b["i"]]
    assert len(ids) == 60
    assert [lease.version for lease in store.leases() if lease.active] == [3]  # workers left it
    ds.release_lease()
    assert not [lease for lease in store.leases() if lease.active]


def test_store_transaction_and_add_fields(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    with store.transaction(message="staged") as txn:
        txn.write({"v": 9, "i": i} for i in range(5))
        txn.write({"v": 9, "i": i} for i in range(5, 10))
    assert txn.result is not None and txn.result.num_samples == 10
    commit = store.add_fields(lambda s: {"key": f"{s['v']}-{s['i']}"}, ["key"])
    assert commit.operation == "add_fields"
    assert store.snapshot()[-1]["key"] == "9-9"
    dropped = store.drop_fields(["pad"])
    assert "pad" not in store.snapshot(dropped.version)[0]


def test_a_staged_commit_never_lands_on_a_rollback(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    txn = store.transaction()
    part = txn.write({"v": 99, "i": i} for i in range(3))
    assert all(store.storage.exists(c.path) for c in part.chunks)
    store.rollback(1, message="undo the bad crawls")
    with pytest.raises(txstore.ConflictError, match="rolled back"):
        txn.commit()
    assert [s["v"] for s in store.snapshot()] == [0] * 20
    assert not any(store.storage.exists(c.path) for c in part.chunks)  # known unused: deleted
