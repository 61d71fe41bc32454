"""Elastic resume: a mid-epoch state taken with W workers on R ranks goes on with W' workers on
R' ranks, every sample not yet delivered that epoch delivered once. Ranks are simulated with
set_distributed, workers are real DataLoader worker processes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import txstore

torch = pytest.importorskip("torch")

from txstore.torch import (  # noqa: E402
    MixedStreamingDataset,
    StreamingDataLoader,
    StreamingDataset,
)

# Three workers on a machine of two cores are meant here: a topology change.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

N = 1200


@pytest.fixture
def snap(tmp_path: Path) -> txstore.Snapshot:
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=4096, block_bytes=512)
    for start in range(0, N, 300):  # several commits, many chunks of uneven sizes
        store.append({"id": i, "pad": bytes(i % 40)} for i in range(start, start + 300))
    return store.snapshot()


def _loaders(
    snap: txstore.Snapshot, ranks: int, workers: int, shuffle: bool
) -> list[StreamingDataLoader]:
    out = []
    for rank in range(ranks):
        ds = StreamingDataset(snap, shuffle=shuffle, seed=5)
        ds.set_epoch(3)
        ds.set_distributed(rank, ranks)
        out.append(StreamingDataLoader(ds, batch_size=8, num_workers=workers))
    return out


def _take(loaders: list[StreamingDataLoader], batches: int) -> tuple[list[int], dict[str, Any]]:
    """``batches`` batches from each rank in lockstep, as DDP takes them; rank 0's state."""
    seen: list[int] = []
    for loader in loaders:
        for k, batch in enumerate(loader):
            seen += [int(i) for i in batch["id"]]
            if k + 1 == batches:
                break
    return seen, json.loads(json.dumps(loaders[0].state_dict()))


def _resume(
    snap: txstore.Snapshot, state: dict[str, Any], ranks: int, workers: int, shuffle: bool
) -> tuple[list[list[int]], list[StreamingDataLoader]]:
    loaders = _loaders(snap, ranks, workers, shuffle)
    for loader in loaders:
        loader.load_state_dict(state)
    return [[int(i) for b in loader for i in b["id"]] for loader in loaders], loaders


def _lengths(loaders: list[StreamingDataLoader]) -> list[int]:
    """Each rank's length of the epoch its next iteration reads."""
    out = []
    for loader in loaders:
        it = iter(loader)
        next(it)  # the loaded state takes effect as the iteration starts
        out.append(len(loader.streaming_dataset))
        it.close()
    return out


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(
    ("before", "after"),
    [((2, 2), (3, 1)), ((1, 1), (2, 2)), ((1, 2), (1, 3)), ((3, 2), (2, 2)), ((2, 3), (2, 2))],
)
def test_resume_on_another_topology_delivers_each_unseen_sample_once(
    snap: txstore.Snapshot, before: tuple[int, int], after: tuple[int, int], shuffle: bool
) -> None:
    seen, state = _take(_loaders(snap, *before, shuffle), batches=13)
    assert len(seen) == len(set(seen)) == before[0] * 13 * 8
    per_rank, loaders = _resume(snap, state, *after, shuffle)
    rest = [i for ids in per_rank for i in ids]
    unseen = set(range(N)) - set(seen)
    assert set(rest) == unseen
    # Equal shares per rank, as DDP needs: when they do not divide, a few samples repeat.
    share = -(-len(unseen) // after[0])
    assert [len(ids) for ids in per_rank] == [share] * after[0]
    fresh = _loaders(snap, *after, shuffle)
    for loader in fresh:
        loader.load_state_dict(state)
    assert _lengths(fresh) == [share] * after[0]
    assert len(rest) - len(unseen) == share * after[0] - len(unseen) < after[0]
    # The epoch after is a whole one again, on the new topology.
    again = [i for loader in loaders for b in loader for i in b["id"].tolist()]
    assert set(again) == set(range(N)) and len(again) == after[0] * -(-N // after[0])


def test_a_resumed_epoch_resumes_again_on_a_third_topology(snap: txstore.Snapshot) -> None:
    seen, state = _take(_loaders(snap, 2, 2, True), batches=11)
    loaders = _loaders(snap, 1, 3, True)
    loaders[0].load_state_dict(state)
    more, state2 = _take(loaders, batches=17)
    assert state2["todo"] is not None and len(json.dumps(state2)) < 4000
    per_rank, _ = _resume(snap, state2, 3, 2, True)
    rest = [i for ids in per_rank for i in ids]
    assert len(seen + more) == len(set(seen + more)) == 2 * 11 * 8 + 17 * 8
    unseen = set(range(N)) - set(seen) - set(more)
    assert set(rest) == unseen
    assert max(Counter(rest).values()) <= 2 and len(rest) - len(unseen) < 3


def test_padding_and_drop_last_are_kept_across_the_change(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=4096, block_bytes=512)
    store.append({"id": i, "pad": bytes(i % 40)} for i in range(1001))
    for drop_last in (False, True):
        loaders = []
        for rank in range(3):
            ds = StreamingDataset(store.snapshot(), shuffle=True, drop_last=drop_last)
            ds.set_distributed(rank, 3)
            loaders.append(StreamingDataLoader(ds, batch_size=8, num_workers=2))
        seen, state = _take(loaders, batches=9)
        resumed = []
        for rank in range(2):
            ds = StreamingDataset(store.snapshot(), shuffle=True, drop_last=drop_last)
            ds.set_distributed(rank, 2)
            loader = StreamingDataLoader(ds, batch_size=8, num_workers=1)
            loader.load_state_dict(state)
            resumed.append([int(i) for b in loader for i in b["id"]])
        rest = [i for ids in resumed for i in ids]
        unseen = set(range(1001)) - set(seen)
        assert len(resumed[0]) == len(resumed[1])
        if drop_last:
            # The samples no rank had (past the equal shares) were unseen too; an odd count
            # drops one of them.
            assert len(set(rest)) == len(rest) == len(unseen) - len(unseen) % 2
            assert set(rest) <= unseen
        else:
            assert set(rest) == unseen and len(rest) - len(unseen) < 2


def _mixes(
    stores: list[txstore.Store], ranks: int, workers: int, mode: str, drop_last: bool = False
) -> list[StreamingDataLoader]:
    out = []
    for rank in range(ranks):
        sources = [StreamingDataset(s.snapshot(), shuffle=True) for s in stores]
        mix = MixedStreamingDataset(
            sources, [0.7, 0.3], seed=4, on_exhausted=mode, drop_last=drop_last
        )
        mix.set_epoch(1)
        mix.set_distributed(rank, ranks)
        out.append(StreamingDataLoader(mix, batch_size=8, num_workers=workers))
    return out


@pytest.mark.parametrize("mode", ["stop", "cycle"])
@pytest.mark.parametrize(("before", "after"), [((2, 2), (3, 1)), ((1, 1), (2, 2))])
def test_a_mix_resumes_on_another_topology(
    tmp_path: Path, mode: str, before: tuple[int, int], after: tuple[int, int]
) -> None:
    stores = []
    for k, n in enumerate((300, 1000)):
        store = txstore.create(str(tmp_path / str(k)), chunk_bytes=2048, block_bytes=512)
        store.append({"id": 10_000 * k + i, "pad": bytes(i % 30)} for i in range(n))
        stores.append(store)
    # An epoch's samples are the same on any topology (but for the padding that evens out
    # ranks): one process's.
    whole = _mixes(stores, 1, 0, mode)[0].streaming_dataset
    full = Counter(int(sample["id"]) for sample in whole)
    seen, state = _take(_mixes(stores, *before, mode), batches=9)
    assert len(seen) == before[0] * 72 and Counter(seen) - full == Counter()
    resumed = _mixes(stores, *after, mode)
    for loader in resumed:
        loader.load_state_dict(state)
    per_rank = [[int(i) for b in loader for i in b["id"]] for loader in resumed]
    rest = Counter(i for ids in per_rank for i in ids)
    assert len({len(ids) for ids in per_rank}) == 1  # equal shares
    # What the epoch had left, each as often as it had (a few more to even out the ranks).
    left = full - Counter(seen)
    assert left - rest == Counter()
    assert sum((rest - left).values()) < after[0]


def test_a_mix_resumed_on_another_topology_resumes_again(tmp_path: Path) -> None:
    stores = []
    for k, n in enumerate((300, 1000)):
        store = txstore.create(str(tmp_path / str(k)), chunk_bytes=2048, block_bytes=512)
        store.append({"id": 10_000 * k + i, "pad": bytes(i % 30)} for i in range(n))
        stores.append(store)
    full = Counter(int(s["id"]) for s in _mixes(stores, 1, 0, "cycle")[0].streaming_dataset)
    seen, state = _take(_mixes(stores, 2, 2, "cycle"), batches=7)
    middle = _mixes(stores, 1, 3, "cycle")
    middle[0].load_state_dict(state)
    more, state2 = _take(middle, batches=12)
    resumed = _mixes(stores, 2, 1, "cycle")
    for loader in resumed:
        loader.load_state_dict(state2)
    rest = Counter(int(i) for loader in resumed for b in loader for i in b["id"])
    left = full - Counter(seen) - Counter(more)
    assert Counter(seen) + Counter(more) - full == Counter()  # nothing twice so far
    assert left - rest == Counter() and sum((rest - left).values()) < 2


def test_a_mix_resumed_with_drop_last_reads_the_tail_no_rank_had(tmp_path: Path) -> None:
    stores = []
    for k, n in enumerate((300, 1000)):
        store = txstore.create(str(tmp_path / str(k)), chunk_bytes=2048, block_bytes=512)
        store.append({"id": 10_000 * k + i, "pad": bytes(i % 30)} for i in range(n))
        stores.append(store)
    # 300 samples at 0.7 allow 429 (300 and 129): two ranks of 214 leave one out.
    full = Counter(int(s["id"]) for s in _mixes(stores, 1, 0, "stop")[0].streaming_dataset)
    assert sum(full.values()) == 429
    seen, state = _take(_mixes(stores, 2, 2, "stop", drop_last=True), batches=9)
    resumed = _mixes(stores, 3, 1, "stop", drop_last=True)
    for loader in resumed:
        loader.load_state_dict(state)
    rest = Counter(int(i) for loader in resumed for b in loader for i in b["id"])
    # 429 - 144 = 285: three ranks of 95, the one left out before among them.
    assert rest == full - Counter(seen) and sum(rest.values()) == 285


def test_persistent_workers_take_up_an_elastic_resume(snap: txstore.Snapshot) -> None:
    seen, state = _take(_loaders(snap, 1, 1, True), batches=20)
    ds = StreamingDataset(snap, shuffle=True, seed=5)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    assert sorted(int(i) for b in loader for i in b["id"]) == list(range(N))  # workers up
    loader.load_state_dict(state)
    rest = [int(i) for b in loader for i in b["id"]]
    assert len(rest) == len(set(rest)) == N - 160 and set(rest) == set(range(N)) - set(seen)
