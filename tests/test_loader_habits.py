"""StreamingDataLoader's epoch habits, as LitData users expect them: a new iteration starts the
next epoch, persistent workers follow the epoch and a loaded state, the seed defaults to 42."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import txstore

torch = pytest.importorskip("torch")

from txstore.torch import StreamingDataLoader, StreamingDataset  # noqa: E402

N = 600


def _store(uri: str, n: int = N, pad: int = 40) -> txstore.Store:
    store = txstore.create(uri, chunk_bytes=4096, block_bytes=512)
    for start in range(0, n, 200):  # several commits, many chunks
        store.append({"id": i, "pad": bytes(i % pad)} for i in range(start, min(n, start + 200)))
    return store


def _ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


def _epoch_order(snap: txstore.Snapshot, epoch: int, workers: int = 2) -> list[int]:
    """The order of one epoch chosen with set_epoch, from a loader of its own."""
    ds = StreamingDataset(snap, shuffle=True, seed=9)
    ds.set_epoch(epoch)
    return _ids(StreamingDataLoader(ds, batch_size=10, num_workers=workers))


def _with_pid(sample: dict[str, Any]) -> dict[str, Any]:
    return {"id": sample["id"], "pid": os.getpid()}


def test_each_new_iteration_starts_the_next_epoch(tmp_path: Path) -> None:
    snap = _store(str(tmp_path / "s")).snapshot()
    ds = StreamingDataset(snap, shuffle=True, seed=9)
    loader = StreamingDataLoader(ds, batch_size=10, num_workers=2)
    orders = [_ids(loader) for _ in range(3)]
    assert orders == [_epoch_order(snap, e) for e in range(3)]
    assert len({tuple(o) for o in orders}) == 3
    assert all(sorted(o) == list(range(N)) for o in orders)
    assert ds.epoch == 2
    # An iteration broken off counts too: the next one is a new epoch.
    for _ in loader:
        break
    assert _ids(loader) == _epoch_order(snap, 4)


def test_set_epoch_chooses_the_next_iterations_epoch(tmp_path: Path) -> None:
    snap = _store(str(tmp_path / "s")).snapshot()
    ds = StreamingDataset(snap, shuffle=True, seed=9)
    loader = StreamingDataLoader(ds, batch_size=10, num_workers=2)
    _ids(loader)
    ds.set_epoch(5)
    assert _ids(loader) == _epoch_order(snap, 5)
    assert _ids(loader) == _epoch_order(snap, 6)  # and on from there
    for epoch in (1, 1):  # the usual loop that sets each epoch repeats none by itself
        ds.set_epoch(epoch)
        assert _ids(loader) == _epoch_order(snap, 1)


def test_a_resumed_epoch_is_followed_by_the_next(tmp_path: Path) -> None:
    snap = _store(str(tmp_path / "s")).snapshot()
    ds = StreamingDataset(snap, shuffle=True, seed=9)
    ds.set_epoch(3)
    loader = StreamingDataLoader(ds, batch_size=10, num_workers=2)
    seen: list[int] = []
    for k, batch in enumerate(loader):
        seen += [int(i) for i in batch["id"]]
        if k == 20:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    ds2 = StreamingDataset(snap, shuffle=True, seed=9)
    loader2 = StreamingDataLoader(ds2, batch_size=10, num_workers=2)
    _ids(loader2)  # an epoch before the resume does not move the resumed one
    loader2.load_state_dict(state)
    rest = _ids(loader2)
    # The same samples; the workers' batches may interleave otherwise after the resume.
    assert len(seen) == 210 and sorted(seen + rest) == list(range(N))
    assert seen == _epoch_order(snap, 3)[:210]
    assert _ids(loader2) == _epoch_order(snap, 4)


def test_seed_defaults_to_42_as_litdata(tmp_path: Path) -> None:
    snap = _store(str(tmp_path / "s")).snapshot()
    default = StreamingDataset(snap, shuffle=True)
    assert default.seed == 42
    assert list(s["id"] for s in default) == list(
        s["id"] for s in StreamingDataset(snap, shuffle=True, seed=42)
    )


def test_persistent_workers_follow_each_epoch(tmp_path: Path) -> None:
    snap = _store(str(tmp_path / "s")).snapshot()
    ds = StreamingDataset(snap, shuffle=True, seed=9, transform=_with_pid)
    loader = StreamingDataLoader(ds, batch_size=10, num_workers=2, persistent_workers=True)
    orders, pids = [], []
    for _ in range(3):
        batches = list(loader)
        orders.append([int(i) for b in batches for i in b["id"]])
        pids.append({int(p) for b in batches for p in b["pid"]})
    assert orders == [_epoch_order(snap, e) for e in range(3)]
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]  # the same two processes
    ds.set_epoch(7)
    assert _ids(loader) == _epoch_order(snap, 7)


def test_persistent_workers_resume_mid_epoch(tmp_path: Path) -> None:
    snap = _store(str(tmp_path / "s")).snapshot()
    ds = StreamingDataset(snap, shuffle=True, seed=9)
    loader = StreamingDataLoader(ds, batch_size=10, num_workers=2, persistent_workers=True)
    _ids(loader)
    seen: list[int] = []
    for k, batch in enumerate(loader):  # epoch 1
        seen += [int(i) for i in batch["id"]]
        if k == 13:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    assert state["epoch"] == 1
    ds2 = StreamingDataset(snap, shuffle=True, seed=9)
    loader2 = StreamingDataLoader(ds2, batch_size=10, num_workers=2, persistent_workers=True)
    _ids(loader2)  # the workers start, and keep epoch 0's dataset
    loader2.load_state_dict(state)
    rest = _ids(loader2)
    assert len(seen) == 140 and sorted(seen + rest) == list(range(N))
    assert seen == _epoch_order(snap, 1)[:140]


def test_persistent_workers_keep_sending_large_bytes_through_shared_memory(
    tmp_path: Path,
) -> None:
    # Batches of 32 samples of ~40 KB: over a MiB a batch, so they travel in each worker's
    # reused shared buffers, which outlive an epoch when the workers do.
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=1 << 20)
    store.append({"id": i, "blob": bytes([i % 251]) * 40_000} for i in range(256))
    ds = StreamingDataset(store.snapshot())
    loader = StreamingDataLoader(
        ds, batch_size=32, num_workers=2, persistent_workers=True, collate_fn=_lists
    )
    for _ in range(3):
        got = {int(i): blob for b in loader for i, blob in zip(b["id"], b["blob"], strict=True)}
        assert sorted(got) == list(range(256))
        assert all(blob == bytes([i % 251]) * 40_000 for i, blob in got.items())


def _lists(samples: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {key: [s[key] for s in samples] for key in samples[0]}


def test_a_state_taken_after_an_epoch_resumes_at_the_next(tmp_path: Path) -> None:
    snap = _store(str(tmp_path / "s")).snapshot()
    loader = StreamingDataLoader(
        StreamingDataset(snap, shuffle=True, seed=9), batch_size=10, num_workers=2
    )
    _ids(loader)  # epoch 0, to its end: a checkpoint at the end of an epoch
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = StreamingDataLoader(
        StreamingDataset(snap, shuffle=True, seed=9), batch_size=10, num_workers=2
    )
    resumed.load_state_dict(state)
    assert _ids(resumed) == _epoch_order(snap, 1) == _ids(loader)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("stop_after", [3, 4])  # after worker 0's batch, and after worker 1's
def test_a_resumed_epoch_gives_the_batches_of_an_uninterrupted_one_in_order(
    tmp_path: Path, persistent: bool, stop_after: int
) -> None:
    snap = _store(str(tmp_path / "st"), n=400).snapshot()

    def loader() -> StreamingDataLoader:
        ds = StreamingDataset(snap, shuffle=True, seed=5)
        return StreamingDataLoader(ds, batch_size=16, num_workers=2,
                                   persistent_workers=persistent)  # fmt: skip

    whole = _ids(loader())
    first = loader()
    it = iter(first)
    before = [i for _ in range(stop_after) for i in next(it)["id"].tolist()]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert before + _ids(resumed) == whole
