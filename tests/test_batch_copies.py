"""StreamingDataLoader's default collate: values read as views of the chunks, copied once into
the batch, and batches equal to those torch's own default_collate makes from the same samples,
through real DataLoader workers."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import txstore

torch = pytest.importorskip("torch")

from torch.utils.data import default_collate  # noqa: E402

from txstore.torch import StreamingDataLoader, StreamingDataset  # noqa: E402
from txstore.torch.collate import StackedArrays  # noqa: E402
from txstore.torch.transport import BytesPool, Receiver, SharedArray, pack, unpack  # noqa: E402

N = 300
BATCH = 32


def _sample(i: int) -> dict[str, Any]:
    """Sample ``i`` as appended: each value made from ``i`` alone."""
    rng = np.random.default_rng(i)
    return {
        "id": i,
        # 64 KiB each: a batch's column is over STACK_SHARED_MIN, so it leaves a worker
        # through the shared buffers.
        "img": rng.integers(0, 256, size=(128, 128, 4), dtype=np.uint8),
        "lat": rng.standard_normal((4, 8)).astype(np.float16),
        "mask": rng.integers(0, 2, size=(6,)).astype(bool),
        "score": np.float64(i) / 7,
        # Batches of 0.6 to 1.1 MiB: lists on either side of the shared buffers' threshold.
        "jpeg": rng.bytes(20_000 + 37 * i),
        "caption": f"sample {i}",
        "tags": [i, i + 1],
    }


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("batches") / "s")
    store = txstore.create(uri, chunk_bytes="1MiB")
    store.append(_sample(i) for i in range(N // 2))
    store.append(_sample(i) for i in range(N // 2, N))
    return uri


def _assert_same(got: Any, want: Any, where: str = "batch") -> None:
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(got, want), where
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same(g, w, f"{where}[{k}]")
    else:
        assert got == want, where


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_those_torchs_default_collate_makes_of_the_samples(
    store_uri: str, workers: int
) -> None:
    ds = StreamingDataset(store_uri, shuffle=True, seed=5)
    loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)
    kept: list[dict[str, Any]] = []
    for _ in range(3):  # epochs: the workers' shared buffers are refilled again and again
        kept += list(loader)
    seen: list[int] = []
    for batch in kept:  # checked only now: no later batch may have written into an earlier one
        ids = [int(i) for i in batch["id"]]
        seen += ids
        _assert_same(batch, default_collate([_sample(i) for i in ids]))
    assert sorted(seen) == sorted(list(range(N)) * 3)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_is_the_callers_to_change(store_uri: str, workers: int) -> None:
    ds = StreamingDataset(store_uri)
    loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)
    first = next(iter(loader))
    img = first["img"]
    assert img.numpy().flags.writeable
    img.zero_()  # a view of a mapped chunk could not be written (or would change the chunk)
    again = next(iter(StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)))
    assert torch.equal(again["img"][0], torch.from_numpy(_sample(int(again["id"][0]))["img"]))
    assert all(type(b) is bytes for b in first["jpeg"])


class _Watching(StreamingDataLoader):
    """A loader whose default collate reports what it is given, then collates as usual."""

    seen: list[tuple[bool, bool, type]] = []

    def default_collate(self, batched: bool) -> Any:
        inner = super().default_collate(batched)

        def watch(batch: list[dict[str, Any]]) -> Any:
            img = batch[0]["img"]
            _Watching.seen.append((img.flags.writeable, img.flags.owndata, type(batch[0]["jpeg"])))
            return inner(batch)

        return watch


def test_the_loaders_own_collate_is_handed_views_and_any_other_code_copies(
    store_uri: str,
) -> None:
    ds = StreamingDataset(store_uri)
    _Watching.seen = []
    for _ in _Watching(ds, batch_size=BATCH, num_workers=0):
        pass
    # Views of the chunk: neither writable nor owning their bytes.
    assert _Watching.seen and all(seen == (False, False, memoryview) for seen in _Watching.seen)
    # The dataset read directly, a collate_fn of the caller's, a transform: copies, as ever.
    direct = next(iter(ds))
    assert direct["img"].flags.writeable and type(direct["jpeg"]) is bytes
    got: list[dict[str, Any]] = []
    for _ in StreamingDataLoader(ds, batch_size=BATCH, collate_fn=got.extend):
        pass
    assert all(s["img"].flags.writeable and type(s["jpeg"]) is bytes for s in got)


def test_a_transform_gets_values_it_may_change(store_uri: str) -> None:
    def brighten(sample: dict[str, Any]) -> dict[str, Any]:
        sample["img"] += 1  # in place: refused on a read-only view
        return {"id": sample["id"], "img": sample["img"]}

    ds = StreamingDataset(store_uri, transform=brighten)
    for batch in StreamingDataLoader(ds, batch_size=BATCH, num_workers=2):
        for i, img in zip(batch["id"], batch["img"], strict=True):
            assert torch.equal(img, torch.from_numpy(_sample(int(i))["img"] + 1))


def test_zero_copy_reads_arrays_as_read_only_views(store_uri: str) -> None:
    store = txstore.open(store_uri)
    plain, views = store.snapshot()[7], store.snapshot().zero_copy()[7]
    assert np.array_equal(views["img"], _sample(7)["img"]) and views["img"].dtype == np.uint8
    assert not views["img"].flags.writeable and plain["img"].flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        views["img"][0, 0, 0] = 1
    # Through the loader's default collate too, which took no views before.
    ds = StreamingDataset(store_uri, zero_copy=True, fields=["id", "img", "jpeg"])
    for batch in StreamingDataLoader(ds, batch_size=BATCH, num_workers=2):
        want = default_collate(
            [{k: _sample(int(i))[k] for k in ("id", "img", "jpeg")} for i in batch["id"]]
        )
        _assert_same(batch, want)


def test_columns_torch_cannot_stack_fail_as_torchs_collate_fails(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "s"))
    store.append({"id": i, "a": np.zeros((i % 3 + 1,), dtype=np.int32)} for i in range(8))
    loader = StreamingDataLoader(StreamingDataset(store.snapshot()), batch_size=4)
    with pytest.raises(RuntimeError, match="equal size"):
        next(iter(loader))
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([{"a": np.zeros((k,), dtype=np.int32)} for k in (1, 2)])


def _column(rng: np.random.Generator, dtype: Any) -> list[np.ndarray[Any, Any]]:
    column = [rng.integers(0, 2, size=(64, 70)).astype(dtype) for _ in range(8)]
    for a in column:
        a.flags.writeable = False  # as read from a chunk
    return column


def test_a_stacked_column_crosses_through_a_reused_buffer() -> None:
    pool, receiver = BytesPool(), Receiver()
    rng = np.random.default_rng(0)
    for dtype in (np.uint8, np.float16, np.int64, np.complex64, np.bool_):
        for _ in range(3):
            column = _column(rng, dtype)
            stacked = StackedArrays(column)
            assert stacked.nbytes == 8 * column[0].nbytes
            shared = pack(stacked, pool)
            assert type(shared) is SharedArray
            got = unpack(shared, False, receiver)
            assert type(got) is torch.Tensor and got.numpy().dtype == column[0].dtype
            assert np.array_equal(got.numpy(), np.stack(column))
            del got  # the batch is done with: its buffer may be refilled
    # Each batch was gone before the next was packed: one slot served them all (grown, a
    # generation later, where a column outgrew it).
    assert len(receiver.kept) == 1


def test_a_workers_buffer_is_refilled_only_once_no_batch_uses_it() -> None:
    from txstore.torch.transport import MAX_POOL_SLOTS

    pool, receiver = BytesPool(), Receiver()
    rng = np.random.default_rng(1)
    columns = [_column(rng, np.int32) for _ in range(MAX_POOL_SLOTS + 4)]
    slots: list[int] = []

    def ship(column: list[np.ndarray[Any, Any]]) -> Any:
        shared = pack(StackedArrays(column), pool)
        slots.append(shared.key[1])
        return unpack(shared, False, receiver)

    held = [ship(c) for c in columns[: MAX_POOL_SLOTS + 1]]
    # Every batch still held: a slot each, then a one-off buffer (slot -1).
    assert slots == [*range(MAX_POOL_SLOTS), -1]
    part = held[3][2:5]  # a view of a batch holds its buffer as the batch did
    del held[3]
    held.append(ship(columns[MAX_POOL_SLOTS + 1]))
    assert slots[-1] == -1
    del part
    held.append(ship(columns[MAX_POOL_SLOTS + 2]))
    assert slots[-1] == 3  # free again: refilled
    # Nothing was written into a buffer a batch used.
    kept = [c for k, c in enumerate(columns[: MAX_POOL_SLOTS + 3]) if k != 3]
    assert len(held) == len(kept)
    for batch, column in zip(held, kept, strict=True):
        assert np.array_equal(batch.numpy(), np.stack(column))


def _mark_worker(folder: str, worker_id: int) -> None:
    Path(folder, f"worker-{worker_id}").write_text(str(os.getpid()))


def test_a_users_worker_init_fn_runs_in_each_worker(store_uri: str, tmp_path: Path) -> None:
    # The loader starts each worker's descriptor sharing from worker_init_fn: the user's own
    # must still run, once in each worker, with its id.
    ds = StreamingDataset(txstore.open(store_uri).snapshot(), fields=["id"])
    loader = StreamingDataLoader(
        ds, batch_size=BATCH, num_workers=2, worker_init_fn=partial(_mark_worker, str(tmp_path))
    )
    assert sorted(int(i) for b in loader for i in b["id"]) == list(range(N))
    pids = {p.name: int(p.read_text()) for p in tmp_path.glob("worker-*")}
    assert sorted(pids) == ["worker-0", "worker-1"]
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()


def test_sharing_descriptors_starts_before_any_is_shared() -> None:
    # In a process of its own: the resource sharer is per process and starts once.
    code = """
import os
import time
from multiprocessing import resource_sharer as r
from txstore.torch.transport import share_early

def fds():
    found = {}
    for n in os.listdir("/proc/self/fd"):
        try:
            found[n] = os.readlink(f"/proc/self/fd/{n}")
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            pass
    return found

def opened():
    return [t.split(":")[0] for n, t in fds().items() if before.get(n) != t]

assert r._resource_sharer._address is None
before = fds()
share_early()
s = r._resource_sharer
# The sharer's thread closes its copy of the pipe end just after sending it: give it time.
deadline = time.monotonic() + 10
while "pipe" in opened() and time.monotonic() < deadline:
    time.sleep(0.01)
new = opened()
print(s._address is not None, len(s._cache), "pipe" in new, "socket" in new)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # Listening (a socket more), nothing left offered, the pipe it offered closed again.
    assert out.stdout.split() == ["True", "0", "False", "True"]


def _slot_of_a_stopped_worker(conn: Any) -> None:
    """In a child: a pool slot holding b"hello", sent as a worker sends it; then stop."""
    import signal
    from multiprocessing.reduction import ForkingPickler

    from txstore.torch.transport import SlotFd, _new_buffer

    buffer = _new_buffer(64)
    buffer[:5] = torch.frombuffer(bytearray(b"hello"), dtype=torch.uint8)
    slot = SlotFd.of(buffer)
    assert slot is not None
    conn.send_bytes(bytes(ForkingPickler.dumps(slot)))
    os.kill(os.getpid(), signal.SIGSTOP)  # no thread of this process answers from here on


def test_the_main_process_maps_a_slot_without_the_workers_help() -> None:
    # A slot's first crossing is opened by its descriptor's path: a worker busy (here,
    # stopped) need not answer, as torch's resource sharer would have it.
    import multiprocessing
    import pickle
    import signal
    import threading

    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_slot_of_a_stopped_worker, args=(theirs,))
    child.start()
    try:
        data = ours.recv_bytes()
        got: list[Any] = []
        opening = threading.Thread(target=lambda: got.append(pickle.loads(data)), daemon=True)
        opening.start()
        opening.join(timeout=20)
        assert got, "opening the slot waited for the stopped worker"
        assert isinstance(got[0], memoryview) and bytes(got[0][:5]) == b"hello"
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.join(timeout=20)


def test_a_slot_whose_path_cannot_be_opened_comes_through_the_resource_sharer() -> None:
    # As from a process whose descriptors this one may not open: the descriptor's path names
    # a process that has exited, so the sharer's copy is taken instead.
    import pickle
    from multiprocessing import resource_sharer

    from txstore.torch.transport import SlotFd, _new_buffer

    buffer = _new_buffer(64)
    buffer[:3] = torch.tensor([7, 8, 9], dtype=torch.uint8)
    slot = SlotFd.of(buffer)
    assert slot is not None
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    slot.pid = int(gone.stdout)
    view = pickle.loads(pickle.dumps(slot))
    assert bytes(view[:3]) == bytes([7, 8, 9])
    view[3] = 42  # the same memory as the worker's
    assert int(buffer[3]) == 42
    assert slot.shared._id[1] not in resource_sharer._resource_sharer._cache  # taken


def test_a_slot_opened_by_its_path_leaves_nothing_offered() -> None:
    # The sharer's copy of the descriptor, not needed, is taken back on a thread.
    import pickle
    import time
    from multiprocessing import resource_sharer

    from txstore.torch.transport import SlotFd, _new_buffer

    buffer = _new_buffer(64)
    slot = SlotFd.of(buffer)
    assert slot is not None
    offered, key = resource_sharer._resource_sharer._cache, slot.shared._id[1]
    assert key in offered
    view = pickle.loads(pickle.dumps(slot))
    view[0] = 5
    assert int(buffer[0]) == 5
    deadline = time.monotonic() + 20
    while key in offered and time.monotonic() < deadline:
        time.sleep(0.01)
    assert key not in offered


_OTHER_WAYS = """
import sys, torch, txstore
from txstore.torch import StreamingDataLoader, StreamingDataset

def lists(samples):
    return {key: [s[key] for s in samples] for key in samples[0]}

if __name__ == "__main__":
    uri, way = sys.argv[1], sys.argv[2]
    kwargs = {}
    if way == "file_system":
        torch.multiprocessing.set_sharing_strategy("file_system")
    else:
        kwargs["multiprocessing_context"] = way
    ds = StreamingDataset(txstore.open(uri).snapshot())
    loader = StreamingDataLoader(ds, batch_size=32, num_workers=2, collate_fn=lists, **kwargs)
    got = {int(i): b for batch in loader for i, b in zip(batch["id"], batch["blob"])}
    assert sorted(got) == list(range(200)), sorted(got)[:5]
    assert all(b == bytes([i % 251]) * 40_000 for i, b in got.items())
    print("ok")
"""


@pytest.mark.parametrize("way", ["spawn", "forkserver", "file_system"])
def test_large_bytes_cross_from_workers_started_any_way(tmp_path: Path, way: str) -> None:
    # Batches of ~1.3 MB of bytes go through the workers' shared slots, opened by their
    # descriptors' paths: from spawned workers, from a fork server's (not the main process's
    # children), and where torch shares by file name instead (slots then cross torch's way).
    uri = str(tmp_path / "s")
    store = txstore.create(uri, chunk_bytes=1 << 20)
    store.append({"id": i, "blob": bytes([i % 251]) * 40_000} for i in range(200))
    script = tmp_path / "ways.py"
    script.write_text(_OTHER_WAYS)
    out = subprocess.run([sys.executable, str(script), uri, way], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-3000:]


@pytest.mark.parametrize("pid", ["self", -1, 1.5])
def test_a_slot_names_a_process_by_number_only(pid: Any) -> None:
    # The main process opens /proc/<pid>/fd/<fd>: nothing but numbers make that path.
    import pickle

    from txstore.torch.transport import SlotFd, _new_buffer

    slot = SlotFd.of(_new_buffer(64))
    assert slot is not None
    slot.pid = pid
    with pytest.raises(ValueError, match="shared batch buffer"):
        pickle.loads(pickle.dumps(slot))
