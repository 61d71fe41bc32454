"""StreamingDataset and StreamingDataLoader through real DataLoaders with worker processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import txstore

torch = pytest.importorskip("torch")

from txstore.torch import (  # noqa: E402
    ResumeMismatchError,
    StreamingDataLoader,
    StreamingDataset,
)
from txstore.torch.dataset import _ChunkFetcher  # noqa: E402

from .conftest import Backend, make_backend  # noqa: E402
from .workers import REPO, spawn  # noqa: E402

N = 1000


def _store(uri: str, n: int = N, **kw: Any) -> txstore.Store:
    store = txstore.create(uri, chunk_bytes=4096, block_bytes=512, **kw)
    for start in range(0, n, 300):  # several commits, many chunks of uneven sizes
        store.append({"id": i, "pad": bytes(i % 40)} for i in range(start, min(n, start + 300)))
    return store


def _ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_sample_exactly_once(tmp_path: Path, workers: int, shuffle: bool) -> None:
    store = _store(str(tmp_path / "s"))
    ds = StreamingDataset(store.snapshot(), shuffle=shuffle, seed=3)
    ids = _ids(StreamingDataLoader(ds, batch_size=16, num_workers=workers))
    assert sorted(ids) == list(range(N))
    if not shuffle and workers <= 1:
        assert ids == list(range(N))  # the snapshot's order
    if shuffle:
        assert ids != list(range(N))


def test_shuffle_is_deterministic_and_changes_by_epoch(tmp_path: Path) -> None:
    store = _store(str(tmp_path / "s"))

    def epoch_ids(epoch: int, seed: int = 7) -> list[int]:
        ds = StreamingDataset(store.snapshot(), shuffle=True, seed=seed)
        ds.set_epoch(epoch)
        return _ids(StreamingDataLoader(ds, batch_size=10, num_workers=2))

    first = epoch_ids(0)
    assert epoch_ids(0) == first  # another run, same order
    assert epoch_ids(1) != first and sorted(epoch_ids(1)) == sorted(first)
    assert epoch_ids(0, seed=8) != first
    # Mixing across the snapshot: the first 100 samples come from all over it.
    assert max(first[:100]) - min(first[:100]) > N // 3


def test_order_is_the_same_in_another_process(tmp_path: Path) -> None:
    store = _store(str(tmp_path / "s"))
    ds = StreamingDataset(store.snapshot(), shuffle=True, seed=11)
    here = [int(s["id"]) for s in ds]
    code = (
        "import txstore, json; from txstore.torch import StreamingDataset as D;"
        f"d=D(txstore.open({str(tmp_path / 's')!r}).snapshot({store.version}),"
        "shuffle=True, seed=11); print(json.dumps([s['id'] for s in d]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert json.loads(out.stdout) == here


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_skips_and_repeats_nothing(
    tmp_path: Path, workers: int, shuffle: bool
) -> None:
    store = _store(str(tmp_path / "s"))
    ds = StreamingDataset(store.snapshot(), shuffle=shuffle, seed=5)
    ds.set_epoch(2)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers)
    full = _ids(StreamingDataLoader(ds, batch_size=8, num_workers=workers))
    seen: list[int] = []
    for k, batch in enumerate(loader):
        seen += [int(i) for i in batch["id"]]
        if k == 37:
            state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint would
            break
    ds2 = StreamingDataset(
        txstore.open(str(tmp_path / "s")).snapshot(store.version), shuffle=shuffle, seed=0
    )
    loader2 = StreamingDataLoader(ds2, batch_size=8, num_workers=workers)
    loader2.load_state_dict(state)
    rest = _ids(loader2)
    assert sorted(seen + rest) == list(range(N))
    assert len(seen) == 38 * 8
    assert Counter(seen + rest) == Counter(full)
    # The next epoch starts from the beginning again.
    assert sorted(_ids(loader2)) == list(range(N))


def test_resume_refuses_another_version(tmp_path: Path) -> None:
    store = _store(str(tmp_path / "s"))
    loader = StreamingDataLoader(StreamingDataset(store.snapshot(2)), batch_size=4)
    state = loader.state_dict()
    other = StreamingDataLoader(StreamingDataset(store.snapshot(3)), batch_size=4)
    with pytest.raises(ResumeMismatchError, match="version 2"):
        other.load_state_dict(state)
    other.load_state_dict(state, allow_other_version=True)
    unshuffled = StreamingDataLoader(StreamingDataset(store.snapshot(2), shuffle=True))
    with pytest.raises(ResumeMismatchError, match="shuffle"):
        unshuffled.load_state_dict(state)


def test_map_style_and_transform(tmp_path: Path) -> None:
    store = _store(str(tmp_path / "s"))
    ds = StreamingDataset(str(tmp_path / "s"), version=2, transform=lambda s: s["id"] * 2)
    assert len(ds) == 600 == len(store.snapshot(2))
    assert ds[0] == 0 and ds[599] == 1198 and ds[-1] == 1198
    assert sorted(ds) == [2 * i for i in range(600)]


def test_fields_projection(tmp_path: Path) -> None:
    _store(str(tmp_path / "s"))
    ds = StreamingDataset(str(tmp_path / "s"), fields=["id"])
    assert all(set(s) == {"id"} for s in ds)
    assert set(ds[5]) == {"id"}


def test_drop_last_and_padding_keep_ranks_equal(tmp_path: Path) -> None:
    _store(str(tmp_path / "s"), n=1001)
    for drop_last, per_rank in [(False, 334), (True, 333)]:
        counts, everything = [], []
        for rank in range(3):
            ds = StreamingDataset(str(tmp_path / "s"), shuffle=True, drop_last=drop_last)
            ds.set_distributed(rank, 3)
            ids = _ids(StreamingDataLoader(ds, batch_size=10, num_workers=2))
            counts.append(len(ids))
            everything += ids
            assert len(ds) == per_rank
        assert counts == [per_rank] * 3
        if drop_last:
            assert len(set(everything)) == len(everything) == 999
        else:
            assert set(everything) == set(range(1001))
            assert len(everything) == 1002  # one sample repeated to even out the ranks


DIST_SCRIPT = """
import json, sys, torch.distributed as dist, txstore
from txstore.torch import StreamingDataset, StreamingDataLoader
rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
ds = StreamingDataset(sys.argv[4], shuffle=True, seed=1)
ids = [int(i) for b in StreamingDataLoader(ds, batch_size=5, num_workers=2) for i in b["id"]]
gathered = [None] * world
dist.all_gather_object(gathered, ids)
if rank == 0:
    print(json.dumps(gathered))
dist.destroy_process_group()
"""


def test_two_process_torch_distributed(tmp_path: Path) -> None:
    _store(str(tmp_path / "s"))
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DIST_SCRIPT, str(r), "2", init, str(tmp_path / "s")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    ranks = json.loads(outs[0][0])
    assert len(ranks[0]) == len(ranks[1]) == N // 2
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == list(range(N))


@pytest.fixture
def on_s3(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A store on the moto server: the streaming cache is what remote stores need."""
    return make_backend("s3", tmp_path, request)


def test_snapshot_on_s3(on_s3: Backend, tmp_path: Path) -> None:
    store = txstore.create(on_s3.uri, chunk_bytes=4096, **on_s3.kwargs())
    store.append({"id": i, "pad": bytes(100)} for i in range(500))
    cache = tmp_path / "cache"
    ds = StreamingDataset(
        on_s3.uri,
        storage_options=on_s3.storage_options,
        shuffle=True,
        cache_dir=str(cache),
        max_cache_size=10**9,
    )
    assert sorted(_ids(StreamingDataLoader(ds, batch_size=10, num_workers=2))) == list(range(500))
    cached = {p.name for p in (cache / "chunks").iterdir()}
    assert len(cached) == len(store.snapshot().chunks())
    # A later version reuses every chunk it shares with the first from the cache.
    store.append({"id": i, "pad": bytes(100)} for i in range(500, 520))
    ds2 = StreamingDataset(
        on_s3.uri,
        storage_options=on_s3.storage_options,
        cache_dir=str(cache),
        max_cache_size=10**9,
    )
    assert sorted(_ids(StreamingDataLoader(ds2, batch_size=10))) == list(range(520))
    assert cached < {p.name for p in (cache / "chunks").iterdir()}


def test_cache_is_bounded(on_s3: Backend, tmp_path: Path) -> None:
    store = txstore.create(on_s3.uri, chunk_bytes=4096, **on_s3.kwargs())
    store.append({"id": i, "pad": bytes(100)} for i in range(2000))
    cache = tmp_path / "cache"
    ds = StreamingDataset(
        on_s3.uri,
        storage_options=on_s3.storage_options,
        cache_dir=str(cache),
        max_cache_size=20_000,
    )
    assert sorted(s["id"] for s in ds) == list(range(2000))
    assert sum(p.stat().st_size for p in (cache / "chunks").iterdir()) <= 20_000 + 2 * 4096 * 2


def test_reads_while_another_process_appends(tmp_path: Path) -> None:
    store = _store(str(tmp_path / "s"))
    pinned = store.snapshot()
    appender = spawn("append-many", str(tmp_path / "s"), "{}", "9", "40", stdout=subprocess.DEVNULL)
    try:
        for epoch in range(3):
            ds = StreamingDataset(pinned, shuffle=True)
            ds.set_epoch(epoch)
            assert sorted(_ids(StreamingDataLoader(ds, batch_size=32, num_workers=2))) == list(
                range(N)
            )
    finally:
        _, err = appender.communicate(timeout=300)
    assert appender.returncode == 0, err
    assert txstore.open(str(tmp_path / "s")).version == pinned.version + 40


def test_missing_chunk_raises_not_hangs(tmp_path: Path) -> None:
    store = _store(str(tmp_path / "s"))
    victim = store.snapshot().chunks()[3]
    os.unlink(tmp_path / "s" / victim.path)
    ds = StreamingDataset(store.snapshot())
    with pytest.raises(txstore.MissingDataError, match=rf"{victim.path}.*version 4"):
        _ids(StreamingDataLoader(ds, batch_size=8, num_workers=2, timeout=120))
    # The failed epoch's workers are stopped as it raises, not left to the garbage collector
    # (which would close their queues first, then wait out a timeout per worker).
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("position", [0, 2])
def test_a_damaged_chunk_raises_whether_read_first_or_ahead(tmp_path: Path, position: int) -> None:
    """The first chunk a worker reads is checked frame by frame as it is decoded (its first
    sample need not wait for the whole file); the chunks read ahead are checked whole
    against their digest, in the prefetch threads. A flipped byte is caught either way."""
    store = _store(str(tmp_path / "s"))
    victim = store.snapshot().chunks()[position]
    path = tmp_path / "s" / victim.path
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF  # inside the first frame
    path.write_bytes(bytes(data))
    how = "checksum mismatch" if position == 0 else "does not match its digest"
    with pytest.raises(txstore.ChecksumError) as caught:
        list(StreamingDataset(store.snapshot()))
    assert victim.path in str(caught.value) and how in str(caught.value)


def _record_fetches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the chunks a StreamingDataset submits for reading, in order (the
    submissions are observed and still made)."""
    submitted: list[str] = []
    submit = ThreadPoolExecutor.submit

    def record(pool: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if getattr(fn, "__name__", "") == "_fetch":
            submitted.append(args[0].path)
        return submit(pool, fn, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", record)
    return submitted


@pytest.mark.parametrize("shuffle", [False, True])
def test_chunks_are_read_ahead_only_once_the_first_sample_is_out(
    tmp_path: Path, shuffle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without shuffle, the first sample needs only the first chunk: reading others ahead
    before it is out slowed it on a cold disk. With shuffle, the first window needs all of
    its chunks at once. Either way, every sample comes once and every chunk is read."""
    store = _store(str(tmp_path / "s"))
    chunks = [c.path for c in store.snapshot().chunks()]
    submitted = _record_fetches(monkeypatch)
    seen_at_first: list[list[str]] = []

    def note_first(sample: dict[str, Any]) -> int:
        if not seen_at_first:
            seen_at_first.append(list(submitted))
        return int(sample["id"])

    ds = StreamingDataset(
        store.snapshot(), shuffle=shuffle, prefetch_chunks=3, transform=note_first
    )
    assert sorted(ds) == list(range(N))
    if shuffle:  # the first window's chunks, and those read ahead of its last
        assert len(seen_at_first[0]) > 1
    else:
        assert seen_at_first == [[chunks[0]]]
    assert set(submitted) == set(chunks)


def test_a_loader_reads_chunks_ahead_only_once_its_first_batch_is_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a StreamingDataLoader, the first batch needs only the first chunk: no other is
    read ahead before it is collated (and, in a worker, sent), so that their reads and checks
    do not delay it (on a cold disk they queued before the pages of the code that collates
    it). Then they are, and every sample comes once."""
    store = _store(str(tmp_path / "s"))
    chunks = [c.path for c in store.snapshot().chunks()]
    batch = 16
    assert store.snapshot().chunks()[0].num_samples > batch
    submitted = _record_fetches(monkeypatch)
    seen: list[list[str]] = []
    at_collate: list[list[str]] = []

    def note(sample: dict[str, Any]) -> dict[str, Any]:
        seen.append(list(submitted))
        return sample

    def collate(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        at_collate.append(list(submitted))
        return samples

    ds = StreamingDataset(store.snapshot(), prefetch_chunks=3, transform=note)
    loader = StreamingDataLoader(ds, batch_size=batch, collate_fn=collate)
    assert sorted(int(s["id"]) for b in loader for s in b) == list(range(N))
    assert seen[:batch] == [[chunks[0]]] * batch
    assert at_collate[0] == [chunks[0]]
    assert len(seen[batch]) > 1  # read ahead while the next batch is made
    assert set(submitted) == set(chunks)
    # A dataset read alone reads ahead after its first sample, as before.
    submitted.clear()
    seen.clear()
    assert sorted(int(s["id"]) for s in ds) == list(range(N))
    assert seen[0] == [chunks[0]] and len(seen[1]) > 1


@pytest.mark.parametrize("cached", [True, False])
def test_chunks_in_memory_are_checked_on_one_thread_and_chunks_on_disk_on_several(
    tmp_path: Path, cached: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking a chunk in the page cache is CPU work alone: one thread does it, beside the
    decoding thread. Chunks still on disk wait on reads, which run in parallel."""
    store = _store(str(tmp_path / "s"))
    chunks = store.snapshot().chunks()
    if not cached:
        os.sync()  # dirty pages stay cached whatever the advice: written back first
        for chunk in chunks:
            fd = os.open(tmp_path / "s" / chunk.path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    threads: dict[str, str] = {}
    found_cached: dict[str, bool] = {}
    fetch, probe = _ChunkFetcher._fetch, _ChunkFetcher._cached

    def record(self: _ChunkFetcher, chunk: Any, digest: bool, mapped: Any) -> Any:
        threads[chunk.path] = threading.current_thread().name.rsplit("_", 1)[0]
        return fetch(self, chunk, digest, mapped)

    def record_probe(self: _ChunkFetcher, chunk: Any) -> bool:
        found_cached[chunk.path] = probe(self, chunk)
        return found_cached[chunk.path]

    monkeypatch.setattr(_ChunkFetcher, "_fetch", record)
    monkeypatch.setattr(_ChunkFetcher, "_cached", record_probe)
    ds = StreamingDataset(store.snapshot(), prefetch_chunks=3)
    assert sorted(int(s["id"]) for s in ds) == list(range(N))
    assert threads[chunks[0].path] == "txstore-fetch"  # checked as it is decoded
    if cached:
        assert all(found_cached[c.path] for c in chunks[1:])
    # The page cache may keep or bring back an advised-away file (the kernel does not
    # promise to drop it): each chunk read ahead goes where the probe of its files said.
    for c in chunks[1:]:
        assert threads[c.path] == ("txstore-check" if found_cached[c.path] else "txstore-fetch")


def _tensors(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """A collate that makes tensors of every kind the transport must carry back unchanged."""
    ids = torch.tensor([s["id"] for s in batch])
    return {
        "id": ids,  # small: goes inline
        "half": ids.to(torch.bfloat16) / 3,  # no numpy dtype
        "scalar": ids.sum(),  # 0-d
        "empty": torch.zeros((len(batch), 0), dtype=torch.int16),
        "strided": ids.repeat(3, 1).t(),  # not contiguous
        "big": ids.double().repeat(5000, 1),  # above the inline limit: shared memory
        "nested": [ids.float(), (ids > 500, {"pad": [s["pad"] for s in batch]})],
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


@pytest.mark.parametrize("pin", [False, True])
def test_batches_from_workers_equal_those_made_in_process(tmp_path: Path, pin: bool) -> None:
    from txstore.torch.transport import INLINE_TENSOR_BYTES, BytesPool, InlineTensor, pack

    store = _store(str(tmp_path / "s"), n=300)
    snap = store.snapshot()
    ds = StreamingDataset(snap)
    # Without an accelerator torch ignores pin_memory=True (with a warning), and so must we.
    loader = StreamingDataLoader(
        ds, batch_size=32, collate_fn=_tensors, num_workers=2, pin_memory=pin
    )
    shipped = list(loader)
    assert sorted(int(i) for b in shipped for i in b["id"]) == list(range(300))
    for batch in shipped:
        # What the same collate makes in this process from the same samples.
        assert _same(batch, _tensors([snap[int(i)] for i in batch["id"]]))
    # The small tensors really travel inline, the big one does not.
    packed = pack(_tensors([{"id": i, "pad": b""} for i in range(32)]), BytesPool())
    assert type(packed["id"]) is InlineTensor and type(packed["half"]) is InlineTensor
    assert type(packed["nested"][1][0]) is InlineTensor
    assert type(packed["big"]) is torch.Tensor
    assert packed["big"].numel() * 8 > INLINE_TENSOR_BYTES


def test_large_bytes_lists_travel_through_shared_memory_and_come_back_whole(
    tmp_path: Path,
) -> None:
    from txstore.torch.transport import SHARED_BYTES_MIN, BytesPool, SharedBytes, pack

    store = txstore.create(str(tmp_path / "s"), chunk_bytes="1MiB")
    # Sizes that grow along the store, so that later batches outgrow the workers' buffers.
    blobs = [os.urandom(20_000 + 150 * i) for i in range(600)]
    store.append({"id": i, "jpeg": b} for i, b in enumerate(blobs))
    ds = StreamingDataset(store.snapshot())

    def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": [s["id"] for s in batch], "jpeg": [s["jpeg"] for s in batch]}

    for epoch in range(2):
        ds.set_epoch(epoch)
        seen: dict[int, bytes] = {}
        loader = StreamingDataLoader(ds, batch_size=64, num_workers=2, collate_fn=collate)
        for batch in loader:
            assert all(type(b) is bytes for b in batch["jpeg"])
            seen.update(zip(batch["id"], batch["jpeg"], strict=True))
        assert seen == dict(enumerate(blobs))
    # 32 x 100 KB goes through shared memory; a short list or a mixed one does not.
    pool = BytesPool()
    assert type(pack(blobs[-32:], pool)) is SharedBytes
    assert sum(map(len, blobs[-32:])) >= SHARED_BYTES_MIN
    assert type(pack(blobs[:2], pool)) is list
    assert type(pack([*blobs[:31], "not bytes"], pool)) is list


def test_a_workers_shared_buffers_are_reused_only_once_read() -> None:
    from txstore.torch.transport import MAX_POOL_SLOTS, BytesPool, Receiver

    pool, receiver = BytesPool(), Receiver()
    batches = [[os.urandom(40_000) for _ in range(30)] for _ in range(MAX_POOL_SLOTS + 3)]
    first = pool.place(batches[0], sum(map(len, batches[0])))
    assert first.buffer is not None  # a new buffer travels with its batch
    assert receiver.items(first) == batches[0]
    again = pool.place(batches[1], sum(map(len, batches[1])))
    # Read, so refilled: only its name travels, and the receiver finds the new content in it.
    assert again.buffer is None and again.key == first.key
    assert receiver.items(again) == batches[1]
    # Unread batches hold their buffers: the pool adds slots, then uses one-off buffers.
    unread = [pool.place(b, sum(map(len, b))) for b in batches[2:]]
    assert len({s.key for s in unread[:MAX_POOL_SLOTS]}) == MAX_POOL_SLOTS
    assert all(s.buffer is not None and s.key[1] == -1 for s in unread[MAX_POOL_SLOTS:])
    assert [receiver.items(s) for s in unread] == batches[2:]
    # A batch larger than a free buffer gets a new one in that slot, a generation later.
    big = [os.urandom(100_000) for _ in range(30)]
    grown = pool.place(big, sum(map(len, big)))
    assert grown.buffer is not None and grown.generation == 1
    assert receiver.items(grown) == big


def test_zero_copy_dataset_through_workers(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "s"), chunk_bytes="1MiB")
    blobs = [os.urandom(40_000 + i) for i in range(200)]
    store.append({"id": i, "jpeg": b} for i, b in enumerate(blobs))
    ds = StreamingDataset(str(tmp_path / "s"), zero_copy=True)
    assert type(ds[3]["jpeg"]) is memoryview and bytes(ds[3]["jpeg"]) == blobs[3]

    def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
        assert all(type(s["jpeg"]) is memoryview for s in batch)  # in the worker
        return {"id": [s["id"] for s in batch], "jpeg": [s["jpeg"] for s in batch]}

    seen: dict[int, bytes] = {}
    for batch in StreamingDataLoader(ds, batch_size=32, num_workers=2, collate_fn=collate):
        assert all(type(b) is bytes for b in batch["jpeg"])  # views cannot leave a worker
        seen.update(zip(batch["id"], batch["jpeg"], strict=True))
    assert seen == dict(enumerate(blobs))
