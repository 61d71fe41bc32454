"""MixedStreamingDataset: weighted mixes of snapshots through real DataLoader workers."""

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
    ResumeMismatchError,
    StreamingDataLoader,
    StreamingDataset,
)
from txstore.torch.mixing import Schedule  # noqa: E402

B0 = 10_000  # the second store's ids start here: an id tells its source


def _store(uri: str, ids: range) -> txstore.Store:
    store = txstore.create(uri, chunk_bytes=2048, block_bytes=512)
    step = 250
    for start in range(ids.start, ids.stop, step):  # several commits, many chunks
        store.append(
            {"id": i, "pad": bytes(i % 30)} for i in range(start, min(ids.stop, start + step))
        )
    return store


@pytest.fixture
def stores(tmp_path: Path) -> tuple[txstore.Store, txstore.Store]:
    return _store(str(tmp_path / "a"), range(600)), _store(
        str(tmp_path / "b"), range(B0, B0 + 2000)
    )


def _mix(
    stores: tuple[txstore.Store, txstore.Store],
    weights: list[float] | None = None,
    shuffle: bool = True,
    **kw: Any,
) -> MixedStreamingDataset:
    a, b = stores
    return MixedStreamingDataset(
        [
            StreamingDataset(a.snapshot(), shuffle=shuffle),
            StreamingDataset(b.snapshot(), shuffle=shuffle),
        ],
        weights=[0.7, 0.3] if weights is None else weights,
        **kw,
    )


def _ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


def _loader(ds: Any, workers: int = 2, **kw: Any) -> StreamingDataLoader:
    return StreamingDataLoader(ds, batch_size=10, num_workers=workers, **kw)


def test_proportions_are_exact_and_no_sample_repeats(stores: Any) -> None:
    ds = _mix(stores, seed=3)
    ids = _ids(_loader(ds))
    # 600 samples of A at 0.7 allow an epoch of 857: 0.7 * 857 = 599.9 and 0.3 * 857 = 257.1
    # round (largest remainder first) to 600 and 257; at 858, A would need 601.
    assert len(ds) == len(ids) == 857
    a = [i for i in ids if i < B0]
    b = [i for i in ids if i >= B0]
    assert sorted(a) == list(range(600))
    assert len(b) == len(set(b)) == 257 and all(B0 <= i < B0 + 2000 for i in b)


def test_every_stretch_of_the_epoch_holds_the_sources_in_proportion(stores: Any) -> None:
    ids = [int(s["id"]) for s in _mix(stores, seed=3)]
    for start in range(0, len(ids) - 100, 50):
        from_a = sum(1 for i in ids[start : start + 100] if i < B0)
        assert 65 <= from_a <= 75, (start, from_a)
    # Not a fixed pattern: another seed interleaves otherwise.
    other = [int(s["id"]) < B0 for s in _mix(stores, seed=4)]
    assert other != [i < B0 for i in ids]


def test_the_order_is_a_function_of_seed_epoch_and_nothing_else(stores: Any) -> None:
    def run(seed: int, epoch: int) -> list[int]:
        ds = _mix(stores, seed=seed)
        ds.set_epoch(epoch)
        return _ids(_loader(ds))

    first = run(5, 0)
    assert run(5, 0) == first
    assert run(5, 1) != first and run(6, 0) != first
    assert len(set(run(5, 1))) == 857  # another epoch: other samples of B, none twice
    assert set(run(5, 1)) != set(first)


def test_cycling_starts_a_source_over_when_it_runs_out(tmp_path: Path) -> None:
    a = _store(str(tmp_path / "a"), range(200))
    b = _store(str(tmp_path / "b"), range(B0, B0 + 600))
    for shuffle in (False, True):
        sources = [
            StreamingDataset(a.snapshot(), shuffle=shuffle),
            StreamingDataset(b.snapshot(), shuffle=shuffle),
        ]
        # Half and half: B's 600 samples need an epoch of 1200, so A gives 600, three times each.
        ds = MixedStreamingDataset(sources, weights=[1, 1], on_exhausted="cycle", seed=2)
        ids = [int(s["id"]) for s in ds]
        from_a = [i for i in ids if i < B0]
        assert len(ids) == 1200 and Counter(from_a) == Counter(list(range(200)) * 3)
        assert sorted(i for i in ids if i >= B0) == list(range(B0, B0 + 600))
        if not shuffle:
            assert from_a == list(range(200)) * 3  # commit order, over again
        else:
            laps = [from_a[k * 200 : (k + 1) * 200] for k in range(3)]
            assert len({tuple(lap) for lap in laps}) == 3
            # Each start over reads A's chunks in another order, not only shuffled windows.
            chunk_orders = {
                tuple(p.chunk for p in ds._source_pieces(0, lap * 200, (lap + 1) * 200))
                for lap in range(3)
            }
            assert len(chunk_orders) == 3
        stopped = MixedStreamingDataset(sources, weights=[1, 1], seed=2)
        stop_ids = [int(s["id"]) for s in stopped]
        assert len(stop_ids) == 400 == len(set(stop_ids))
        assert sum(1 for i in stop_ids if i < B0) == 200


def test_epoch_size_sets_the_length(stores: Any) -> None:
    ids = _ids(_loader(_mix(stores, epoch_size=500, seed=1)))
    assert len(ids) == len(set(ids)) == 500 and sum(1 for i in ids if i < B0) == 350
    with pytest.raises(ValueError, match="epoch_size=2000 needs 1400 samples of source 0"):
        _mix(stores, epoch_size=2000)
    cycled = _ids(_loader(_mix(stores, epoch_size=2000, on_exhausted="cycle")))
    assert len(cycled) == 2000 and sum(1 for i in cycled if i < B0) == 1400


@pytest.mark.parametrize("mode", ["stop", "cycle"])
@pytest.mark.parametrize("persistent", [False, True])
def test_resume_mid_epoch_through_two_workers(stores: Any, mode: str, persistent: bool) -> None:
    def loader() -> StreamingDataLoader:
        ds = _mix(stores, seed=8, on_exhausted=mode)
        ds.set_epoch(2)
        return _loader(ds, persistent_workers=persistent)

    full = _ids(loader())
    first = loader()
    seen: list[int] = []
    for k, batch in enumerate(first):
        seen += [int(i) for i in batch["id"]]
        if k == 30:
            state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint would
            break
    second = loader()
    if persistent:
        _ids(second)  # workers already running on another epoch follow the loaded state
    second.load_state_dict(state)
    rest = _ids(second)
    assert len(seen) == 310
    assert Counter(seen + rest) == Counter(full)
    assert seen == full[:310]
    if mode == "stop":
        assert len(set(seen + rest)) == len(full) == 857


def test_ranks_share_the_epoch(stores: Any) -> None:
    everything: list[int] = []
    for rank in range(2):
        ds = _mix(stores, seed=1, epoch_size=800)
        ds.set_distributed(rank, 2)
        ids = _ids(_loader(ds))
        assert len(ids) == len(ds) == 400
        everything += ids
    assert len(everything) == len(set(everything)) == 800
    assert sum(1 for i in everything if i < B0) == 560
    # An odd length repeats one sample so that the ranks are even; drop_last drops one.
    for drop_last, per_rank in [(False, 429), (True, 428)]:
        everything = []
        for rank in range(2):
            ds = _mix(stores, seed=1, drop_last=drop_last)
            ds.set_distributed(rank, 2)
            everything += _ids(_loader(ds))
        assert len(everything) == 2 * per_rank
        assert len(set(everything)) == min(857, 2 * per_rank)


def test_the_loader_starts_the_next_epoch(stores: Any) -> None:
    loader = _loader(_mix(stores, seed=1))
    one, two = _ids(loader), _ids(loader)
    assert one != two and len(set(two)) == 857


def test_schedule_counts_match_walking_the_sequence() -> None:
    schedule = Schedule([50, 0, 31, 7], seed=9, epoch=3)
    walked = list(schedule.sources(0, 88))
    assert Counter(walked) == {0: 50, 2: 31, 3: 7}
    for position in range(89):
        expected = [walked[:position].count(i) for i in range(4)]
        assert schedule.counts_at(position) == expected
        assert list(schedule.sources(position, 88)) == walked[position:]


def test_bad_arguments_are_refused(stores: Any) -> None:
    a, b = stores
    one, two = StreamingDataset(a.snapshot()), StreamingDataset(b.snapshot())
    with pytest.raises(ValueError, match="weights has 1 numbers for 2 datasets"):
        MixedStreamingDataset([one, two], weights=[1])
    with pytest.raises(ValueError, match=r"weights\[1\] must be a positive number"):
        MixedStreamingDataset([one, two], weights=[1, -2])
    with pytest.raises(TypeError, match=r"weights\[0\] must be a number"):
        MixedStreamingDataset([one, two], weights=["1", 2])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"datasets\[1\] must be a StreamingDataset"):
        MixedStreamingDataset([one, b.snapshot()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="on_exhausted"):
        MixedStreamingDataset([one, two], on_exhausted="repeat")
    # Without weights: in proportion to the sizes, every sample once.
    ids = [int(s["id"]) for s in MixedStreamingDataset([one, two])]
    assert sorted(ids) == list(range(600)) + list(range(B0, B0 + 2000))


def test_resume_refuses_another_mix(stores: Any) -> None:
    a, b = stores
    a.append([{"id": 600, "pad": b""}])
    state = _loader(_mix(stores)).state_dict()
    other_weights = _loader(_mix(stores, weights=[0.5, 0.5]))
    with pytest.raises(ResumeMismatchError, match="weights"):
        other_weights.load_state_dict(state)
    older = MixedStreamingDataset(
        [
            StreamingDataset(a.snapshot(a.version - 1), shuffle=True),
            StreamingDataset(b.snapshot(), shuffle=True),
        ],
        weights=[0.7, 0.3],
    )
    with pytest.raises(ResumeMismatchError, match="dataset 0 of the state is version"):
        _loader(older).load_state_dict(state)
    with pytest.raises(ResumeMismatchError, match="MixedStreamingDataset"):
        _loader(StreamingDataset(a.snapshot())).load_state_dict(state)
    plain = _loader(StreamingDataset(a.snapshot())).state_dict()
    with pytest.raises(ResumeMismatchError, match="StreamingDataset's"):
        _loader(_mix(stores)).load_state_dict(plain)


def test_reachable_from_txstore() -> None:
    assert txstore.MixedStreamingDataset is MixedStreamingDataset
