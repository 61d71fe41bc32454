"""Ray Data: a datasink that commits once, and a datasource over a pinned snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import txstore

from .conftest import Backend, make_backend


@pytest.fixture(scope="module")
def ray() -> Iterator[Any]:
    """Ray, imported and started here rather than at collection (its import takes a second)."""
    module = pytest.importorskip("ray")
    module.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    module.data.DataContext.get_current().enable_progress_bars = False
    yield module
    module.shutdown()


def TxstoreDatasink(*args: Any, **kwargs: Any) -> Any:
    from txstore.interop.ray import TxstoreDatasink

    return TxstoreDatasink(*args, **kwargs)


def TxstoreDatasource(*args: Any, **kwargs: Any) -> Any:
    from txstore.interop.ray import TxstoreDatasource

    return TxstoreDatasource(*args, **kwargs)


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path, request)


def _rows(ray: Any, n: int) -> Any:
    return ray.data.range(n, override_num_blocks=4).map(
        lambda r: {
            "id": int(r["id"]),
            "emb": np.full(3, r["id"], dtype=np.float32),
            "raw": bytes([int(r["id"]) % 256]) * 10,
        }
    )


def test_datasink_commits_one_version(ray: Any, target: Backend) -> None:
    store = txstore.create(target.uri, chunk_bytes=4096, **target.kwargs())
    store.append([{"id": -1}])
    sink = TxstoreDatasink(target.uri, storage_options=target.storage_options, message="embeddings")
    _rows(ray, 2000).write_datasink(sink)
    assert sink.result is not None and sink.result.version == 2
    assert sink.result.num_samples == 2000
    snap = store.snapshot()
    assert sorted(s["id"] for s in snap) == list(range(-1, 2000))
    sample = next(s for s in snap if s["id"] == 7)
    assert isinstance(sample["id"], int) and sample["raw"] == b"\x07" * 10
    assert sample["emb"].dtype == np.float32 and (sample["emb"] == 7).all()
    assert store.log()[0].message == "embeddings"


def test_datasink_writes_full_chunks_from_small_blocks(ray: Any, tmp_path: Path) -> None:
    # 40 blocks of about 50 KB each: write tasks take two chunks' worth of them (400 KB), so
    # the store gets full chunks and a part-filled one a task (at most 6 tasks), not a
    # part-filled chunk a block.
    uri = str(tmp_path / "s")
    txstore.create(uri, chunk_bytes=200_000, compression=None)
    blob = bytes(1000)
    rows = ray.data.range(2000, override_num_blocks=40).map(
        lambda r: {"id": int(r["id"]), "b": blob}
    )
    rows.write_datasink(TxstoreDatasink(uri))
    snap = txstore.open(uri).snapshot()
    assert sorted(s["id"] for s in snap) == list(range(2000))
    chunks = [c.num_samples for c in snap.chunk_refs()]
    assert len(chunks) <= 2000 * 1010 // 200_000 + 2000 * 1010 // 400_000 + 1, chunks


def test_failed_job_commits_nothing(ray: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "s")
    txstore.create(uri)

    def explode(row: dict[str, Any]) -> dict[str, Any]:
        if row["id"] == 1500:
            raise ValueError("bad row")
        return {"id": int(row["id"])}

    sink = TxstoreDatasink(uri)
    with pytest.raises(Exception, match="bad row"):
        ray.data.range(2000, override_num_blocks=4).map(explode).write_datasink(sink)
    assert txstore.open(uri).version == 0


def test_datasource_reads_a_pinned_snapshot(ray: Any, target: Backend) -> None:
    n = 600  # a dozen chunks: several read tasks, each opening the store on its own
    store = txstore.create(target.uri, chunk_bytes=4096, **target.kwargs())
    store.append({"id": i, "text": f"t{i}", "blob": bytes(50)} for i in range(n))
    pinned = store.snapshot()
    assert len(pinned.chunks()) >= 8
    store.append({"id": i} for i in range(n, n + 100))  # later commits do not leak in
    rows = ray.data.read_datasource(TxstoreDatasource(pinned)).take_all()
    assert sorted(int(r["id"]) for r in rows) == list(range(n))
    if target.name != "local":
        return  # the rest is about Ray's side of the blocks, the same whatever the backend
    only = ray.data.read_datasource(TxstoreDatasource(pinned, fields=["text"])).take(5)
    assert all(set(r) == {"text"} for r in only)
    doubled = (
        ray.data.read_datasource(TxstoreDatasource(pinned))
        .map(lambda r: {"twice": int(r["id"]) * 2})
        .sum("twice")
    )
    assert doubled == 2 * sum(range(n))


def test_datasource_rows_equal_the_snapshots_samples(ray: Any, tmp_path: Path) -> None:
    """Every kind of value comes through Ray's block conversion as it went in."""
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=2048)
    samples = [
        {
            "id": i,
            "score": i / 8,
            "text": f"t{i}",
            "raw": bytes([i % 256]) * (i % 5),
            "img": (np.arange(6).reshape(2, 3) + i).astype(np.uint8),
            "ragged": np.arange(i % 4, dtype=np.int64),
            **({"label": f"l{i}"} if i % 3 else {}),  # only some samples have a label
        }
        for i in range(300)
    ]
    store.append(samples)
    rows = ray.data.read_datasource(TxstoreDatasource(store.snapshot())).take_all()
    assert len(rows) == len(samples)
    for row in sorted(rows, key=lambda r: int(r["id"])):
        want = samples[int(row["id"])]
        assert row["text"] == want["text"] and row["raw"] == want["raw"]
        assert float(row["score"]) == want["score"]
        assert np.array_equal(np.asarray(row["img"]), want["img"])
        assert np.array_equal(np.asarray(row["ragged"]), want["ragged"])
        assert row["label"] == want.get("label")


def test_arrow_blocks_both_ways(ray: Any, tmp_path: Path) -> None:
    """The sink appends Ray's Arrow blocks (tensor columns included) a column at a time; the
    source gives one Arrow block per chunk, of the fields asked for."""
    pa = pytest.importorskip("pyarrow")
    n = 900
    table = pa.table({"id": list(range(n)), "text": [f"t{i}" * 10 for i in range(n)]})
    emb = np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2)
    uri = str(tmp_path / "s")
    store = txstore.create(uri, chunk_bytes=4096)
    sink = TxstoreDatasink(uri)
    ray.data.from_arrow(table).write_datasink(sink)
    tensors = TxstoreDatasink(uri)
    ray.data.from_numpy(emb).write_datasink(tensors)  # a tensor column named "data"
    snap = store.snapshot()
    assert sorted(s["id"] for s in snap if "id" in s) == list(range(n))
    arrays = sorted((s["data"] for s in snap if "data" in s), key=lambda a: float(a.flat[0]))
    assert len(arrays) == n and all(a.dtype == np.float32 and a.shape == (2, 2) for a in arrays)
    assert np.array_equal(np.stack(arrays), emb)
    source = TxstoreDatasource(store.snapshot(1), fields=["text", "id"])
    blocks = [block for task in source.get_read_tasks(2) for block in task()]
    assert len(blocks) == len(store.snapshot(1).chunks()) > 2
    assert all(isinstance(b, pa.Table) and b.column_names == ["id", "text"] for b in blocks)
    rows = ray.data.read_datasource(source).take_all()
    want = [(i, f"t{i}" * 10) for i in range(n)]
    assert sorted((int(r["id"]), r["text"]) for r in rows) == want
