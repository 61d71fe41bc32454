"""Adding and dropping fields as new versions, without rewriting chunks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import txstore
from txstore.errors import HistoryChangedError
from txstore.storage import Storage, open_storage
from txstore.torch import StreamingDataLoader, StreamingDataset

from .conftest import Backend
from .faults import FaultyStorage


def _store(backend: Backend, n: int = 600) -> txstore.Store:
    store = txstore.create(backend.uri, chunk_bytes=8192, block_bytes=1024, **backend.kwargs())
    store.append(
        {"id": i, "caption": f"photo {i}", "image": bytes([i % 256]) * 64} for i in range(n)
    )
    return store


class CountingStorage(FaultyStorage):
    """Counts the bytes read through it."""

    moved = 0

    def read(self, key: str) -> bytes:
        data = super().read(key)
        self.moved += len(data)
        return data

    def read_range(self, key: str, start: int, end: int) -> bytes:
        data = super().read_range(key, start, end)
        self.moved += len(data)
        return data


def _files(storage: Storage, prefix: str = "chunks/") -> dict[str, bytes]:
    return {f.key: storage.read(f.key) for f in storage.list(prefix)}


def _latent(sample: dict[str, Any]) -> dict[str, Any]:
    return {"latent_256": np.full((2, 2), sample["id"], dtype=np.float32)}


@pytest.mark.s3  # field files beside chunks on S3
def test_add_fields_without_rewriting_chunks(backend: Backend) -> None:
    store = _store(backend)
    raw = open_storage(backend.uri, backend.storage_options)
    before = _files(raw)
    commit = store.add_fields(_latent, ["latent_256"], message="VAE-256 latents")
    assert commit.version == 2 and commit.operation == "add_fields"
    assert commit.total_samples == 600
    after = _files(raw)
    assert {k: v for k, v in after.items() if k in before} == before  # untouched, byte for byte
    added = {k for k in after if k not in before}
    assert added and all(k.endswith(".fields") for k in added)
    snap = store.snapshot()
    for i in (0, 299, 599, -1):
        sample = snap[i]
        assert set(sample) == {"id", "caption", "image", "latent_256"}
        assert (sample["latent_256"] == sample["id"]).all()
    assert all((s["latent_256"] == s["id"]).all() for s in snap)
    assert "latent_256" not in store.snapshot(1)[0]  # older versions unchanged


def test_projection_reads_only_the_fields_asked_for(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "s"), compression=None, block_bytes=4096)
    store.append(
        {"a": bytes(1000), "b": bytes(1000), "c": bytes(1000), "d": bytes(1000), "id": i}
        for i in range(2000)
    )
    store.add_fields(lambda s: {"e": bytes(1000)}, ["e"])
    counter = CountingStorage(open_storage(str(tmp_path / "s")))
    snap = txstore.open(counter).snapshot()
    total = sum(c.size + sum(f.size for f in c.field_files) for c in snap.chunks())
    counter.moved = 0
    two = list(snap.select(["b", "e"]))
    assert [set(s) for s in two[:1]] == [{"b", "e"}] and len(two) == 2000
    assert 0.35 * total < counter.moved < 0.5 * total, (counter.moved, total)  # 2 of 5 fields
    counter.moved = 0
    assert set(snap.select(["e"])[1234]) == {"e"}
    assert counter.moved < 10_000  # one block of one field, not the chunk


def test_drop_fields(backend: Backend) -> None:
    store = _store(backend)
    store.add_fields(_latent, ["latent_256"])
    store.add_fields(lambda s: {"latent_512": s["id"] * 2}, ["latent_512"])
    store.drop_fields(["latent_256", "caption"], message="drop")
    snap = store.snapshot()
    assert set(snap[5]) == {"id", "image", "latent_512"}
    assert snap[5]["latent_512"] == 10
    assert set(store.snapshot(3)[5]) == {"id", "caption", "image", "latent_256", "latent_512"}
    # The latent_256 files are no longer named by the latest version (vacuum may reclaim).
    named = {f.path for c in snap.chunks() for f in c.field_files}
    assert all(f.columns == ("latent_512",) for c in snap.chunks() for f in c.field_files)
    assert named


def test_field_added_twice_and_samples_with_different_keys(backend: Backend) -> None:
    store = txstore.create(backend.uri, chunk_bytes=4096, block_bytes=512, **backend.kwargs())
    store.append(({"id": i, "text": "x"} if i % 3 else {"id": i}) for i in range(400))
    store.add_fields(lambda s: {"len": len(s.get("text", ""))} if s["id"] % 2 else {}, ["len"])
    with pytest.raises(txstore.FieldExistsError, match="replace=True"):
        store.add_fields(lambda s: {"len": 0}, ["len"])
    assert store.version == 2
    store.add_fields(lambda s: {"len": -s["id"]}, ["len"], replace=True)  # replaces the first
    snap = store.snapshot()
    for i, sample in enumerate(snap):
        assert sample["len"] == -i
        assert ("text" in sample) == bool(i % 3)
    first = store.snapshot(2)
    assert "len" not in first[0] and first[1]["len"] == 1 and first[3] == {"id": 3, "len": 0}
    assert first[6] == {"id": 6}  # even, no text: the function left the field out


def test_a_field_left_out_is_absent_in_blocks_of_one_sample(backend: Backend) -> None:
    """Blocks of one sample (large samples) build each sample's dict as their frames are
    decoded: a sample the function gave no value lacks the key, in copies and in views."""
    store = txstore.create(backend.uri, block_bytes=1, **backend.kwargs())
    store.append({"id": i, "jpeg": bytes([i]) * 300} for i in range(12))
    store.add_fields(lambda s: {"thumb": b"t%d" % s["id"]} if s["id"] % 3 else {}, ["thumb"])
    expected = [
        {"id": i, "jpeg": bytes([i]) * 300, **({"thumb": b"t%d" % i} if i % 3 else {})}
        for i in range(12)
    ]
    for snap in (store.snapshot(), store.snapshot().zero_copy()):
        for got in (list(snap), [snap[i] for i in range(12)]):
            assert [
                {k: bytes(v) if isinstance(v, memoryview) else v for k, v in s.items()} for s in got
            ] == expected


def test_batched_with_worker_processes(backend: Backend) -> None:
    store = _store(backend)

    def double(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"twice": s["id"] * 2} for s in batch]

    if backend.name == "memory":
        with pytest.raises(ValueError, match="one process"):
            store.add_fields(double, ["twice"], batched=True, num_workers=2)
        return
    store.add_fields(double, ["twice"], batched=True, num_workers=2)
    assert [s["twice"] for s in store.snapshot()] == [2 * i for i in range(600)]


def test_appends_during_add_fields_get_the_field(tmp_path: Path) -> None:
    store = _store(Backend("local", str(tmp_path / "s")))
    racer = txstore.open(str(tmp_path / "s"))
    appended = []

    def latent(sample: dict[str, Any]) -> dict[str, Any]:
        if not appended:  # another writer appends while the fields are being computed
            appended.append(racer.append({"id": 600 + i, "caption": "late"} for i in range(50)))
        return {"latent_256": sample["id"]}

    commit = store.add_fields(latent, ["latent_256"])
    assert appended[0].version == 2 and commit.version == 3
    snap = store.snapshot()
    assert len(snap) == 650
    assert [s["latent_256"] for s in snap] == list(range(650))


def test_other_changes_during_add_fields_conflict(tmp_path: Path) -> None:
    store = _store(Backend("local", str(tmp_path / "s")))
    racer = txstore.open(str(tmp_path / "s"))
    raced: list[Any] = []

    def latent(sample: dict[str, Any]) -> dict[str, Any]:
        if not raced:
            raced.append(racer.drop_fields(["caption"]))
        return {"latent_256": sample["id"]}

    with pytest.raises(HistoryChangedError, match="run add_fields again") as raised:
        store.add_fields(latent, ["latent_256"])
    assert (raised.value.version, raised.value.operation) == (2, "drop_fields")
    assert store.version == 2 and "latent_256" not in store.snapshot()[0]


def test_failing_function_commits_nothing(backend: Backend) -> None:
    store = _store(backend)

    def broken(sample: dict[str, Any]) -> dict[str, Any]:
        if sample["id"] == 400:
            raise RuntimeError("model crashed")
        return {"x": 1}

    with pytest.raises(RuntimeError, match="model crashed"):
        store.add_fields(broken, ["x"])
    with pytest.raises(txstore.EncodeError, match="not asked for"):
        store.add_fields(lambda s: {"y": 1}, ["x"])
    assert store.version == 1


def test_streaming_dataset_reads_added_fields(tmp_path: Path) -> None:
    store = _store(Backend("local", str(tmp_path / "s")))
    store.add_fields(_latent, ["latent_256"])
    ds = StreamingDataset(store.snapshot(), fields=["caption", "latent_256"], shuffle=True)
    batches = list(StreamingDataLoader(ds, batch_size=50, num_workers=2))
    ids = sorted(int(v) for b in batches for v in b["latent_256"][:, 0, 0])
    assert ids == list(range(600))
    assert set(batches[0]) == {"caption", "latent_256"}


def test_compaction_keeps_added_fields_aligned(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=8192, block_bytes=1024)
    for start in range(0, 300, 10):  # many small appends: many undersized chunks
        store.append({"id": i, "caption": f"c{i}"} for i in range(start, start + 10))
    store.add_fields(lambda s: {"latent": s["id"] * 3}, ["latent"])
    store.drop_fields(["caption"])
    before = len(store.snapshot().chunks())
    result = store.compact()
    snap = store.snapshot()
    assert len(snap.chunks()) < before, result
    assert [(s["id"], s["latent"]) for s in snap] == [(i, 3 * i) for i in range(300)]
    assert all(set(s) == {"id", "latent"} for s in snap)
    assert snap[123] == {"id": 123, "latent": 369}
