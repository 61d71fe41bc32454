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


def _png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (3, 2), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


def test_a_dataset_appends_its_rows_in_its_order_as_arrow_stores_them(tmp_path):
    """``store.append(ds)`` takes a Hugging Face dataset's rows as ``ds[i]`` orders them,
    after ``shuffle`` and ``select`` (``ds.data.table`` is all of the table beneath, in its
    first order), a table at a time: an ``Image`` column as its ``{bytes, path}`` struct
    (iterating the dataset decodes it into PIL images, which no store can encode)."""
    import datasets

    png = _png()
    features = datasets.Features({"id": datasets.Value("int64"), "image": datasets.Image()})
    rows = {"id": list(range(50)), "image": [{"bytes": png, "path": None}] * 50}
    ds = datasets.Dataset.from_dict(rows, features=features)
    picked = ds.shuffle(seed=3).select(range(7))
    assert picked.data.table.num_rows == 50  # the table beneath: not what to append
    st = txstore.create(str(tmp_path / "st"))
    st.append(picked)
    snap = st.snapshot()
    assert [s["id"] for s in snap] == list(picked["id"])
    assert len(snap) == 7 and sorted(set(picked["id"])) != list(range(7))
    assert all(s["image"] == {"bytes": png, "path": None} for s in snap)
    # A streamed dataset too, and an empty selection appends nothing.
    st.append(ds.to_iterable_dataset().take(5))
    assert [s["id"] for s in st.snapshot()][7:] == [0, 1, 2, 3, 4]
    before = len(st.snapshot())
    st.append(ds.select([]))
    assert len(st.snapshot()) == before
    # A DatasetDict (a dict of splits) is refused, naming a split, the store unchanged.
    version = st.version
    with pytest.raises(txstore.EncodeError, match=r"DatasetDict.*'train'.*samples\['train'\]"):
        st.append(datasets.DatasetDict({"train": ds}))
    assert st.version == version


def test_a_dataset_of_large_rows_is_appended_a_few_megabytes_at_a_time(tmp_path):
    """After a shuffle each table of rows is a gather (a copy): of large rows only as many
    as make about APPEND_BYTES go at once (16,384 rows of 1 MiB would be 16 GiB)."""
    import datasets

    from txstore.format import hf

    rows = 300
    blob = b"\x07" * (1 << 20)
    ds = datasets.Dataset.from_dict({"id": list(range(rows)), "blob": [blob] * rows})
    shuffled = ds.shuffle(seed=1)
    per_table = hf.rows_per_table(shuffled)
    assert 32 <= per_table <= hf.APPEND_BYTES >> 20
    sizes = [t.num_rows for t in hf.arrow_tables(shuffled)]
    assert max(sizes) == per_table and sum(sizes) == rows
    assert hf.rows_per_table(datasets.Dataset.from_dict({"id": list(range(10))})) == hf.APPEND_ROWS
    assert hf.rows_per_table(ds.to_iterable_dataset()) == hf.STREAMED_ROWS
    st = txstore.create(str(tmp_path / "st"))
    st.append(shuffled)
    assert [s["id"] for s in st.snapshot()] == list(shuffled["id"])


def test_a_store_read_as_the_interpreter_exits_leaves_no_error_behind(tmp_path):
    """A chunk's kept map still alive as the interpreter exits (here after a dataset was
    appended) is closed then without an error: the storage module's globals are gone by
    that time."""
    import subprocess
    import sys

    script = (
        "import datasets, txstore\n"
        "ds = datasets.Dataset.from_dict({'id': list(range(10))})\n"
        f"store = txstore.create({str(tmp_path / 's')!r})\n"
        "store.append(ds)\n"
        "snap = store.snapshot()\n"
        "assert snap[3] == {'id': 3}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
