"""Adding and dropping fields as new versions, without rewriting chunks."""

from __future__ import annotations

import itertools
import logging
import re
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


def test_a_projection_of_most_of_a_file_reads_it_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fields that are most of a chunk's bytes (images beside their ids) are read as the
    whole file, checked by its digest, not a range and a checksum per frame; a small field
    alone is still read as its frames. Snapshot and StreamingDataset alike."""
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=300_000, compression=None)
    store.append({"id": i, "label": i % 7, "jpeg": bytes([i % 256]) * 5000} for i in range(200))
    snap = store.snapshot()
    chunks = {c.path for c in snap.chunk_refs()}
    assert len(chunks) > 1
    caplog.set_level(logging.DEBUG, logger="txstore")

    def reads() -> tuple[set[str], set[str]]:
        """The chunk files read whole, and those read in ranges of frames, since last asked."""
        whole, frames = set(), set()
        for record in caplog.records:
            found = re.fullmatch(r"reading \S+?/(chunks/\S+) bytes .*, (whole file|frames of .*)\)",
                                 record.getMessage())  # fmt: skip
            if found:
                (whole if found.group(2) == "whole file" else frames).add(found.group(1))
        caplog.clear()
        return whole, frames

    images = [s["jpeg"] for s in snap.select(["jpeg", "label"])]
    assert images == [bytes([i % 256]) * 5000 for i in range(200)]
    assert reads() == (chunks, set())
    assert [s["id"] for s in snap.select(["id"])] == list(range(200))
    assert reads() == (set(), chunks)
    loaded = [s["jpeg"] for s in StreamingDataset(snap, fields=["jpeg"], shuffle=False)]
    assert loaded == images
    assert reads()[1] == set()  # none read as frames
    ids = [s["id"] for s in StreamingDataset(snap, fields=["id"], shuffle=False)]
    assert ids == list(range(200))
    assert reads() == (set(), chunks)  # nor mapped whole (and so read ahead) meanwhile


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


# -- incremental fields, inputs and batches ---------------------------------------------------


def _field_files(store: txstore.Store) -> dict[str, set[str]]:
    """Chunk path -> the paths of its field files, in the latest version."""
    return {c.path: {f.path for f in c.field_files} for c in store.snapshot().chunks()}


def _recording(calls: list[int]) -> Any:
    def latent(sample: dict[str, Any]) -> dict[str, Any]:
        calls.append(sample["id"])
        return {"latent_256": sample["id"] * 10}

    return latent


def test_missing_only_computes_the_appended_samples_alone(backend: Backend) -> None:
    store = _store(backend)  # ids 0..599
    store.add_fields(lambda s: {"latent_256": s["id"] * 10}, ["latent_256"])
    before = _field_files(store)
    store.append({"id": i, "caption": f"photo {i}", "image": b"new"} for i in range(600, 650))
    version = store.version
    calls: list[int] = []
    commit = store.add_fields(_recording(calls), ["latent_256"], missing_only=True)
    assert sorted(calls) == list(range(600, 650))  # fn called for exactly those 50
    assert commit.version == version + 1 == store.version  # one commit
    assert [s["latent_256"] for s in store.snapshot()] == [10 * i for i in range(650)]
    after = _field_files(store)
    assert all(after[path] == files for path, files in before.items())  # old ones untouched
    # Nothing lacks it now: another run calls fn for no sample.
    again: list[int] = []
    store.add_fields(_recording(again), ["latent_256"], missing_only=True)
    assert again == []


def test_missing_only_after_a_rollback(tmp_path: Path) -> None:
    store = _store(Backend("local", str(tmp_path / "s")))
    store.add_fields(lambda s: {"latent_256": s["id"] * 10}, ["latent_256"])  # v2
    store.append({"id": i, "caption": "late"} for i in range(600, 650))  # v3: 50 without
    store.add_fields(lambda s: {"latent_256": -1}, ["latent_256"], missing_only=True)  # v4
    assert store.snapshot()[620]["latent_256"] == -1
    store.rollback(3)  # v5: the 50 lack it again
    assert "latent_256" not in store.snapshot()[620]
    calls: list[int] = []
    store.add_fields(_recording(calls), ["latent_256"], missing_only=True)
    assert sorted(calls) == list(range(600, 650))
    assert [s["latent_256"] for s in store.snapshot()] == [10 * i for i in range(650)]


@pytest.mark.parametrize("form", ["sample", "dict", "arrow"])
def test_missing_only_after_compaction_keeps_what_samples_have(tmp_path: Path, form: str) -> None:
    if form == "arrow":
        pytest.importorskip("pyarrow")
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=8192, block_bytes=1024)
    for start in range(0, 300, 10):  # many small appends: many undersized chunks
        store.append({"id": i, "caption": f"c{i}"} for i in range(start, start + 10))
    store.add_fields(lambda s: {"latent": s["id"] * 3}, ["latent"])
    for start in range(300, 330, 10):
        store.append({"id": i, "caption": f"c{i}"} for i in range(start, start + 10))
    store.compact()
    snap = store.snapshot()
    assert snap.manifest.operation == "compact"
    starts = [0]
    for chunk in snap.chunks():
        starts.append(starts[-1] + chunk.num_samples)
    # A compacted chunk holds samples with the field and samples without it.
    assert any(a < 300 < b for a, b in itertools.pairwise(starts)), starts
    calls: list[int] = []

    def latent(sample: dict[str, Any]) -> dict[str, Any]:
        calls.append(sample["id"])
        return {"latent": sample["id"] * 3}

    def latents(batch: dict[str, list[Any]]) -> dict[str, Any]:
        assert len(batch["id"]) <= 7 and set(batch) == {"id"}
        calls.extend(batch["id"])
        return {"latent": [i * 3 for i in batch["id"]]}

    def arrow_latents(batch: Any) -> Any:
        import pyarrow as pa

        assert batch.num_rows <= 7 and batch.schema.names == ["id"]
        ids = batch.column("id").to_pylist()
        calls.extend(ids)
        return pa.record_batch([pa.array([i * 3 for i in ids])], names=["latent"])

    if form == "sample":
        store.add_fields(latent, ["latent"], missing_only=True)
    elif form == "dict":
        store.add_fields(latents, ["latent"], missing_only=True, inputs=["id"], batch_size=7)
    else:
        store.add_fields(
            arrow_latents,
            ["latent"],
            missing_only=True,
            inputs=["id"],
            batch_size=7,
            batch_format="arrow",
        )
    assert sorted(calls) == list(range(300, 330))
    snap = store.snapshot()
    assert [(s["id"], s["latent"], s["caption"]) for s in snap] == [
        (i, 3 * i, f"c{i}") for i in range(330)
    ]
    assert snap.select(["latent"])[299] == {"latent": 897}


def test_missing_only_fills_the_holes_a_function_left(backend: Backend) -> None:
    store = _store(backend)
    store.add_fields(lambda s: {} if s["id"] % 7 == 0 else {"x": s["id"]}, ["x"])
    calls: list[int] = []

    def x(sample: dict[str, Any]) -> dict[str, Any]:
        calls.append(sample["id"])
        return {"x": -sample["id"]}

    store.add_fields(x, ["x"], missing_only=True)
    holes = [i for i in range(600) if i % 7 == 0]
    assert sorted(calls) == holes
    assert [s["x"] for s in store.snapshot()] == [-i if i % 7 == 0 else i for i in range(600)]


def test_inputs_gives_fn_only_those_fields_and_reads_only_their_bytes(tmp_path: Path) -> None:
    uri = str(tmp_path / "s")
    store = txstore.create(uri, compression=None, block_bytes=4096)
    payload = bytes(range(7, 247)) * 4  # 960 bytes, found in the chunk files as they are
    store.append({"id": i, "image": payload} for i in range(1000))
    counter = CountingStorage(open_storage(uri))
    counted = txstore.open(counter)
    total = sum(c.size for c in counted.snapshot().chunks())
    seen: list[set[str]] = []

    def double(sample: dict[str, Any]) -> dict[str, Any]:
        seen.append(set(sample))
        return {"double": sample["id"] * 2}

    counter.moved = 0
    counted.add_fields(double, ["double"], inputs=["id"])
    assert seen == [{"id"}] * 1000
    assert counter.moved < 0.05 * total, (counter.moved, total)  # ids and footers, no images
    assert [s["double"] for s in txstore.open(uri).snapshot()] == [2 * i for i in range(1000)]
    # Damage every image: a reader of the image bytes fails, one of "id" alone does not.
    raw = open_storage(uri)
    for key, data in _files(raw).items():
        if key.endswith(".fields"):
            continue
        assert payload in data
        raw.write(key, data.replace(payload, bytes(len(payload))))
    damaged = txstore.open(uri)
    damaged.add_fields(lambda s: {"triple": s["id"] * 3}, ["triple"], inputs=["id"])
    assert [s["triple"] for s in damaged.snapshot().select(["triple"])] == [
        3 * i for i in range(1000)
    ]
    with pytest.raises(txstore.CorruptError):
        damaged.add_fields(lambda s: {"size": len(s["image"])}, ["size"])
    with pytest.raises(txstore.FieldNotFoundError, match="'idd'"):
        damaged.add_fields(lambda s: {"y": 1}, ["y"], inputs=["idd"])


def test_batch_size_hands_fn_a_dict_of_lists(backend: Backend) -> None:
    store = _store(backend)
    sizes: list[int] = []

    def latents(batch: dict[str, list[Any]]) -> dict[str, Any]:
        assert set(batch) == {"id"}
        sizes.append(len(batch["id"]))
        ids = np.asarray(batch["id"], dtype=np.float32)
        # One array for the batch, as a model gives it: a row per sample.
        return {"latent": np.stack([ids, ids + 0.5], axis=1), "tag": [f"t{i}" for i in batch["id"]]}

    store.add_fields(latents, ["latent", "tag"], inputs=["id"], batch_size=64)
    chunk_sizes = [c.num_samples for c in store.snapshot().chunks()]
    assert len(chunk_sizes) > 1
    # Batches of 64 within each chunk, the last of a chunk shorter.
    expected = [min(64, n - k) for n in chunk_sizes for k in range(0, n, 64)]
    assert sizes == expected
    for i, sample in enumerate(store.snapshot()):
        assert sample["tag"] == f"t{i}"
        assert sample["latent"].tolist() == [float(i), i + 0.5]
    assert store.verify(deep=True).ok  # the field files' frames, offset tables included


def test_batch_size_refuses_a_batch_of_the_wrong_shape(backend: Backend) -> None:
    store = _store(backend)
    with pytest.raises(txstore.EncodeError, match=r"'x' has 3 values for 10 samples"):
        store.add_fields(lambda b: {"x": [1, 2, 3]}, ["x"], batch_size=10)
    with pytest.raises(txstore.EncodeError, match="dict of lists"):
        store.add_fields(lambda b: [1] * len(b["id"]), ["x"], batch_size=10)
    with pytest.raises(txstore.EncodeError, match="not asked for"):
        store.add_fields(lambda b: {"y": b["id"]}, ["x"], batch_size=10)
    with pytest.raises(ValueError, match="choose one"):
        store.add_fields(lambda b: b, ["x"], batch_size=10, batched=True)
    with pytest.raises(ValueError, match="batch_size"):
        store.add_fields(lambda b: b, ["x"], batch_size=0)
    assert store.version == 1


def test_arrow_batches_in_and_out(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    store = _store(Backend("local", str(tmp_path / "s")))
    kinds: list[str] = []

    def from_arrow(batch: Any) -> Any:
        kinds.append(type(batch).__name__)
        assert batch.schema.names == ["caption", "id"]
        ids = batch.column("id").to_numpy()
        return pa.record_batch(
            [pa.array(ids * 2), pa.array([c.upper() for c in batch.column("caption").to_pylist()])],
            names=["twice", "shout"],
        )

    store.add_fields(
        from_arrow,
        ["twice", "shout"],
        inputs=["id", "caption"],
        batch_size=100,
        batch_format="arrow",
    )
    assert set(kinds) == {"RecordBatch"}
    got = [(s["twice"], s["shout"]) for s in store.snapshot()]
    assert got == [(2 * i, f"PHOTO {i}") for i in range(600)]
    assert all(type(s["twice"]) is int for s in store.snapshot()[:5])


def test_batches_in_worker_processes_with_progress(tmp_path: Path) -> None:
    store = _store(Backend("local", str(tmp_path / "s")))
    store.append({"id": i, "caption": "late"} for i in range(600, 700))
    store.add_fields(
        lambda b: {"half": [i // 2 for i in b["id"]]}, ["half"], inputs=["id"], batch_size=50
    )
    store.append({"id": i, "caption": "later"} for i in range(700, 777))
    heard: list[tuple[str, int, int]] = []
    store.add_fields(
        lambda b: {"half": [i // 2 for i in b["id"]]},
        ["half"],
        inputs=["id"],
        batch_size=50,
        missing_only=True,
        num_workers=2,
        progress=txstore.Progress(enabled=False, callback=lambda *a: heard.append(a)),
    )
    assert heard and heard[-1] == ("computing fields", 77, 77)  # the 77 without it, no more
    assert [s["half"] for s in store.snapshot()] == [i // 2 for i in range(777)]


def test_an_existing_field_needs_replace(backend: Backend) -> None:
    store = _store(backend)
    with pytest.raises(txstore.FieldExistsError, match=r"'caption' \(600 samples\)"):
        store.add_fields(lambda s: {"caption": "x"}, ["caption"])
    assert store.version == 1 and store.snapshot()[3]["caption"] == "photo 3"
    store.add_fields(lambda s: {"caption": f"new {s['id']}"}, ["caption"], replace=True)
    assert [s["caption"] for s in store.snapshot()] == [f"new {i}" for i in range(600)]


def test_dropping_a_field_no_sample_has_commits_nothing(backend: Backend) -> None:
    store = _store(backend)
    with pytest.raises(txstore.FieldNotFoundError, match="'nope'"):
        store.drop_fields(["nope"])
    with pytest.raises(txstore.FieldNotFoundError, match="'nope'"):
        store.drop_fields(["caption", "nope"])
    assert store.version == 1 and len(store.log()) == 2
    store.drop_fields(["caption"])
    assert store.version == 2 and "caption" not in store.snapshot()[0]


def test_batches_that_return_different_fields(backend: Backend) -> None:
    store = _store(backend)
    calls: list[int] = []

    def some(batch: dict[str, list[Any]]) -> dict[str, Any]:
        calls.append(batch["id"][0])
        out: dict[str, Any] = {"a": [-i for i in batch["id"]]}
        if batch["id"][0] % 100:  # the first batch of each hundred gives no "b"
            out["b"] = [str(i) for i in batch["id"]]
        return out

    store.add_fields(some, ["a", "b"], inputs=["id"], batch_size=50)
    assert len(calls) == sum(-(-c.num_samples // 50) for c in store.snapshot().chunks())
    starts = set(calls)
    expected, mixed = [], 0
    for c_start, c in zip(
        itertools.accumulate((c.num_samples for c in store.snapshot().chunks()), initial=0),
        store.snapshot().chunks(),
        strict=False,
    ):
        mixed += len({(c_start + k) % 100 == 0 for k in range(0, c.num_samples, 50)}) > 1
        for k in range(0, c.num_samples, 50):
            first = c_start + k
            assert first in starts
            for i in range(first, min(first + 50, c_start + c.num_samples)):
                expected.append({"a": -i, **({"b": str(i)} if first % 100 else {})})
    assert list(store.snapshot().select(["a", "b"], missing="skip")) == [
        e for e in expected if "b" in e
    ]
    assert [{k: s[k] for k in ("a", "b") if k in s} for s in store.snapshot()] == expected
    assert mixed  # some chunk's batches gave both sets of fields
    assert store.verify(deep=True).ok
