"""Snapshots as Hugging Face datasets: in memory, and streamed a chunk at a time (a shard per
chunk) through a real DataLoader with workers."""

from __future__ import annotations

import os
from importlib.util import find_spec

import numpy as np
import pytest

import txstore

# datasets is imported by the tests that use it, not at collection (its import takes a second)
pytestmark = pytest.mark.skipif(find_spec("datasets") is None, reason="datasets is not installed")
torch = pytest.importorskip("torch")

N = 120


def _sample(i: int) -> dict:
    return {
        "id": i,
        "text": f"caption {i}",
        "blob": bytes([i % 256]) * (100 * (i % 7)),
        "emb": np.arange(3, dtype=np.float32) + i,
    }


@pytest.fixture
def store(tmp_path):
    # small chunks: several shards
    st = txstore.create(str(tmp_path / "st"), chunk_bytes="4KiB", compression=None)
    st.append(_sample(i) for i in range(N))
    return st


def test_in_memory_dataset_has_every_sample(store):
    import datasets

    snap = store.snapshot()
    ds = snap.to_hf()
    assert isinstance(ds, datasets.Dataset)
    assert len(ds) == N
    for i in (0, 1, 57, N - 1):
        row = ds[i]
        assert row["id"] == i
        assert row["text"] == f"caption {i}"
        assert row["blob"] == bytes([i % 256]) * (100 * (i % 7))
        assert row["emb"] == pytest.approx([i, i + 1, i + 2])


def test_in_memory_dataset_of_some_fields(store):
    ds = store.snapshot().to_hf(["id", "text"])
    assert sorted(ds.column_names) == ["id", "text"]
    assert ds["id"] == list(range(N))


def test_streaming_dataset_reads_a_pinned_version_chunk_by_chunk(store):
    import datasets

    snap = store.snapshot()
    chunks = len(snap.chunk_refs())
    assert chunks > 4  # else the shards below prove nothing
    it = snap.to_hf(["id", "text"], streaming=True)
    assert isinstance(it, datasets.IterableDataset)
    assert it.num_shards == chunks
    store.append(_sample(i) for i in range(N, N + 10))  # after: not in the pinned view
    rows = list(it)
    assert [r["id"] for r in rows] == list(range(N))
    assert all(r["text"] == f"caption {r['id']}" for r in rows)
    assert all(set(r) == {"id", "text"} for r in rows)


def test_streaming_dataset_through_dataloader_workers_sees_each_sample_once(store):
    it = store.snapshot().to_hf(["id"], streaming=True)
    # spawn: the workers get the dataset handed over, not inherited (forkserver, the
    # default from Python 3.14, does the same)
    loader = torch.utils.data.DataLoader(
        it, batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    seen = [int(row["id"]) for row in loader]
    assert sorted(seen) == list(range(N))


def test_unknown_field_is_refused_when_asked(store):
    snap = store.snapshot()
    with pytest.raises(txstore.FieldNotFoundError, match="nope"):
        snap.to_hf(["id", "nope"], streaming=True)
    with pytest.raises(txstore.FieldNotFoundError, match="nope"):
        snap.to_hf(["nope"])


def test_chunk_tables_of_chosen_chunks(store):
    snap = store.snapshot()
    refs = snap.chunk_refs()
    starts = np.cumsum([0] + [c.num_samples for c in refs])
    tables = list(snap.chunk_tables(["id"], chunks=[2, 0]))
    assert tables[0].column("id").to_pylist() == list(range(starts[2], starts[3]))
    assert tables[1].column("id").to_pylist() == list(range(starts[0], starts[1]))
    for bad in (len(refs), -1, "0"):
        with pytest.raises(txstore.InputError, match="chunk"):
            list(snap.chunk_tables(chunks=[bad]))


def test_empty_store_gives_an_empty_dataset(tmp_path):
    st = txstore.create(str(tmp_path / ("empty-" + os.urandom(2).hex())))
    assert list(st.snapshot().to_hf(streaming=True)) == []
