"""TokenStreamingDataset and TokenStreamingDataLoader: token windows through real DataLoaders."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import txstore

torch = pytest.importorskip("torch")

from txstore.torch import TokenStreamingDataLoader, TokenStreamingDataset  # noqa: E402


def _arrays(n: int = 400, seed: int = 5) -> list[np.ndarray[Any, Any]]:
    """Token arrays of uneven lengths (some empty) whose tokens are their positions in the
    concatenation: a window's first token says which window it is."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 160, size=n)
    lengths[::37] = 0
    ends = np.cumsum(lengths)
    return [
        np.arange(end - size, end, dtype=np.int64) for end, size in zip(ends, lengths, strict=True)
    ]


def _store(path: Path, arrays: list[np.ndarray[Any, Any]], field: str = "tokens") -> txstore.Store:
    # Small chunks (a few samples each): windows run across chunk ends, some across several.
    store = txstore.create(str(path), chunk_bytes=2048, block_bytes=512)
    for start in range(0, len(arrays), 150):  # several commits
        store.append(
            {"id": i, field: arrays[i]} for i in range(start, min(len(arrays), start + 150))
        )
    return store


def _expected(arrays: list[np.ndarray[Any, Any]], block: int) -> list[np.ndarray[Any, Any]]:
    flat = np.concatenate(arrays)
    return [flat[k * block : (k + 1) * block] for k in range(len(flat) // block)]


def _window_ids(loader: Any, block: int) -> list[int]:
    out = []
    for batch in loader:
        for row in batch:
            first = int(row[0])
            # Each window is whole and in place: its tokens are consecutive positions.
            assert first % block == 0 and row.tolist() == list(range(first, first + block))
            out.append(first // block)
    return out


@pytest.fixture(scope="module")
def arrays() -> list[np.ndarray[Any, Any]]:
    return _arrays()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, arrays: list[Any]) -> txstore.Store:
    return _store(tmp_path_factory.mktemp("tokens") / "s", arrays)


@pytest.mark.parametrize("block", [2, 37, 700])
def test_windows_are_those_of_the_concatenation(
    store: txstore.Store, arrays: list[Any], block: int
) -> None:
    snap = store.snapshot()
    assert len(snap.chunks()) > 20
    ds = txstore.TokenStreamingDataset(snap, field="tokens", block_size=block)
    expected = _expected(arrays, block)
    got = list(ds)
    assert len(got) == len(expected) == len(ds) == ds.num_windows
    for window, want in zip(got, expected, strict=True):
        assert window.dtype == torch.int64 and window.shape == (block,)
        assert np.array_equal(window.numpy(), want)
    for k in (0, 1, len(expected) // 2, -1):
        assert np.array_equal(ds.window(k).numpy(), expected[k])


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("block", [2, 700])
def test_windows_own_their_tokens(
    tmp_path: Path, arrays: list[Any], shuffle: bool, block: int
) -> None:
    """Token arrays are read as views of the chunks (mapped: stored uncompressed here); each
    window is a copy of its own, which the caller may change."""
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=2048, compression=None)
    store.append({"tokens": a} for a in arrays)
    ds = TokenStreamingDataset(store.snapshot(), block_size=block, shuffle=shuffle)
    with warnings.catch_warnings():
        # torch warns of a tensor made over a read-only array: a window that is a view
        warnings.simplefilter("error")
        windows = list(ds)
    for window in windows:
        window.add_(1)
    again = sorted(int(w[0]) for w in TokenStreamingDataset(store.snapshot(), block_size=block))
    assert again == [k * block for k in range(len(_expected(arrays, block)))]
    assert sorted(int(w[0]) - 1 for w in windows) == again


def test_windows_of_random_tokens_keep_their_dtype(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arrays = [
        rng.integers(0, 2**16, size=int(n), dtype=np.uint16) for n in rng.integers(1, 90, 300)
    ]
    ds = TokenStreamingDataset(_store(tmp_path / "s", arrays).snapshot(), block_size=50)
    got = list(ds)
    expected = _expected(arrays, 50)
    assert len(got) == len(expected)
    assert all(w.dtype == torch.uint16 for w in got)
    assert all(np.array_equal(w.numpy(), e) for w, e in zip(got, expected, strict=True))


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_window_exactly_once_through_two_workers(store: txstore.Store, shuffle: bool) -> None:
    block = 37
    ds = TokenStreamingDataset(store.snapshot(), block_size=block, shuffle=shuffle, seed=3)
    ids = _window_ids(TokenStreamingDataLoader(ds, batch_size=8, num_workers=2), block)
    assert sorted(ids) == list(range(ds.num_windows))
    if shuffle:
        assert ids != sorted(ids)
        # Mixed across the snapshot: the first windows come from all over it.
        assert max(ids[:64]) - min(ids[:64]) > ds.num_windows // 3


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_share_the_windows(store: txstore.Store, world: int, drop_last: bool) -> None:
    block = 37
    per_rank: list[list[int]] = []
    for rank in range(world):
        ds = TokenStreamingDataset(
            store.snapshot(), block_size=block, shuffle=True, seed=9, drop_last=drop_last
        )
        ds.set_distributed(rank, world)
        workers = 2 if world == 2 else 0
        ids = _window_ids(TokenStreamingDataLoader(ds, batch_size=8, num_workers=workers), block)
        assert len(ids) == len(ds)
        per_rank.append(ids)
    total = TokenStreamingDataset(store.snapshot(), block_size=block).num_windows
    counts = Counter(i for ids in per_rank for i in ids)
    lengths = {len(ids) for ids in per_rank}
    if drop_last:
        assert lengths == {total // world}
        assert max(counts.values()) == 1 and len(counts) == total // world * world
    else:
        assert lengths == {-(-total // world)}
        assert set(counts) == set(range(total))  # every window, and the padding repeats some
        assert sum(counts.values()) - total == -(-total // world) * world - total


def test_shuffled_order_follows_seed_and_epoch(store: txstore.Store) -> None:
    block = 37

    def order(epoch: int, seed: int = 7) -> list[int]:
        ds = TokenStreamingDataset(store.snapshot(), block_size=block, shuffle=True, seed=seed)
        ds.set_epoch(epoch)
        return _window_ids(TokenStreamingDataLoader(ds, batch_size=8, num_workers=2), block)

    first = order(0)
    assert order(0) == first  # another dataset, same (seed, epoch): same order
    second = order(1)
    assert second != first and sorted(second) == sorted(first)
    assert order(0, seed=8) != first


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_mid_epoch_repeats_and_skips_nothing(
    store: txstore.Store, workers: int, shuffle: bool
) -> None:
    block = 37

    def loader(epoch: int = 2) -> TokenStreamingDataLoader:
        ds = TokenStreamingDataset(store.snapshot(), block_size=block, shuffle=shuffle, seed=4)
        ds.set_epoch(epoch)
        return TokenStreamingDataLoader(ds, batch_size=8, num_workers=workers)

    full = _window_ids(loader(), block)
    first = loader()
    seen: list[int] = []
    for i, batch in enumerate(first):
        seen += [int(row[0]) // block for row in batch]
        if i == 30:
            state = json.loads(json.dumps(first.state_dict()))  # plain data, as a checkpoint
            break
    assert 0 < len(seen) < len(full)
    resumed = loader()
    resumed.load_state_dict(state)
    rest = _window_ids(resumed, block)
    assert sorted(seen + rest) == list(range(len(full)))  # none repeated, none skipped
    assert seen + rest == full  # in the uninterrupted order, with workers too
    assert _window_ids(resumed, block) == _window_ids(loader(3), block)  # then the next epoch


def test_resume_refuses_other_windows_or_layout(store: txstore.Store) -> None:
    ds = TokenStreamingDataset(store.snapshot(), block_size=37, shuffle=True)
    loader = TokenStreamingDataLoader(ds, batch_size=4)
    next(iter(loader))
    state = loader.state_dict()
    other = TokenStreamingDataLoader(TokenStreamingDataset(store.snapshot(), block_size=38))
    with pytest.raises(txstore.ResumeMismatchError, match="block_size=37"):
        other.load_state_dict(state)
    workers = TokenStreamingDataLoader(
        TokenStreamingDataset(store.snapshot(), block_size=37, shuffle=True), num_workers=2
    )
    with pytest.raises(txstore.ResumeMismatchError, match="num_workers=1"):
        workers.load_state_dict(state)
    older = TokenStreamingDataLoader(
        TokenStreamingDataset(store.snapshot(1), block_size=37, shuffle=True)
    )
    with pytest.raises(txstore.ResumeMismatchError, match="version"):
        older.load_state_dict(state)


def test_fewer_tokens_than_a_window_give_none(tmp_path: Path) -> None:
    store = _store(tmp_path / "s", [np.arange(5), np.arange(3)])
    ds = TokenStreamingDataset(store.snapshot(), block_size=9)
    assert (len(ds), list(ds)) == (0, [])
    assert list(TokenStreamingDataset(store.snapshot(), block_size=8)) != []


def test_a_missing_field_is_named(store: txstore.Store, tmp_path: Path) -> None:
    with pytest.raises(txstore.FieldNotFoundError, match="'input_ids'"):
        TokenStreamingDataset(store.snapshot(), field="input_ids")
    partial = txstore.create(str(tmp_path / "p"))
    partial.append([{"tokens": np.arange(10)}, {"id": 1}, {"tokens": np.arange(4)}])
    with pytest.raises(txstore.FieldMissingError, match=r"'tokens'.*\b1\b") as e:
        TokenStreamingDataset(partial.snapshot(), block_size=4)
    assert e.value.samples == (1,)


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (np.linspace(0, 1, 8), "float64"),
        (np.arange(12).reshape(3, 4), "2-d"),
        ("hello", "str"),
        ([1, 2, 3], "list"),
        (np.arange(6, dtype=np.int32), "int32"),  # another dtype than the samples before it
    ],
)
def test_values_not_integer_token_arrays_are_named(tmp_path: Path, bad: Any, what: str) -> None:
    store = txstore.create(str(tmp_path / "s"))
    samples = [{"tokens": np.arange(i, i + 20)} for i in range(30)]
    samples[17] = {"tokens": bad}
    store.append(samples)
    with pytest.raises(txstore.FieldTypeError, match=what) as e:
        TokenStreamingDataset(store.snapshot(), block_size=4)
    message = str(e.value)
    assert "'tokens'" in message and "sample 17" in message and store.uri in message
    assert (e.value.field, e.value.sample) == ("tokens", 17)
    assert isinstance(e.value, txstore.TxstoreError) and isinstance(e.value, TypeError)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"block_size": 1}, "block_size"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": "2049"}, "block_size"),
        ({"field": 3}, "field"),
        ({"shuffle": "yes"}, "shuffle"),
        ({"shuffle_window": 0}, "shuffle_window"),
    ],
)
def test_bad_arguments_are_named(store: txstore.Store, kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(txstore.InvalidArgumentError, match=f"TokenStreamingDataset: {name}"):
        TokenStreamingDataset(store.snapshot(), **kwargs)


def test_the_loader_refuses_what_would_break_the_order(store: txstore.Store) -> None:
    ds = TokenStreamingDataset(store.snapshot(), block_size=37)
    for kwargs in ({"shuffle": True}, {"sampler": [0, 1]}, {"batch_size": 0}):
        with pytest.raises(txstore.InvalidArgumentError):
            TokenStreamingDataLoader(ds, **kwargs)
    with pytest.raises(txstore.InvalidArgumentError, match="TokenStreamingDataset"):
        TokenStreamingDataLoader(txstore.StreamingDataset(store.snapshot()))  # type: ignore[arg-type]


def test_exported_lazily_from_txstore() -> None:
    from txstore.torch import tokens

    assert txstore.TokenStreamingDataset is tokens.TokenStreamingDataset
    assert txstore.TokenStreamingDataLoader is tokens.TokenStreamingDataLoader


def test_counts_from_a_lengths_field(tmp_path: Path, arrays: list[Any]) -> None:
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=2048, block_bytes=512)
    store.append({"tokens": a, "n": len(a)} for a in arrays)
    ds = TokenStreamingDataset(store.snapshot(), block_size=37, lengths_field="n")
    expected = _expected(arrays, 37)
    assert ds.num_windows == len(expected)
    assert all(np.array_equal(w.numpy(), e) for w, e in zip(ds, expected, strict=True))
    # A count that is not the array's length is found when that sample is read.
    store.append([{"tokens": np.arange(10), "n": 12}, {"tokens": np.arange(40), "n": 40}])
    wrong = TokenStreamingDataset(store.snapshot(), block_size=37, lengths_field="n")
    with pytest.raises(txstore.FieldTypeError, match=rf"sample {len(arrays)}\b.*'n' says 12"):
        list(wrong)
    store.append([{"tokens": np.arange(3), "n": "three"}])
    with pytest.raises(txstore.FieldTypeError, match=rf"'n'.*sample {len(arrays) + 2}\b"):
        TokenStreamingDataset(store.snapshot(), block_size=37, lengths_field="n")


def test_windows_are_shuffled_within_a_chunk(tmp_path: Path, arrays: list[Any]) -> None:
    store = txstore.create(str(tmp_path / "s"))  # one chunk: no chunk order to shuffle
    store.append({"tokens": a} for a in arrays)
    assert len(store.snapshot().chunks()) == 1

    def order(epoch: int) -> list[int]:
        ds = TokenStreamingDataset(store.snapshot(), block_size=37, shuffle=True, seed=2)
        ds.set_epoch(epoch)
        return [int(w[0]) // 37 for w in ds]

    first = order(0)
    assert sorted(first) == list(range(len(first))) and first != sorted(first)
    assert order(1) != first and order(0) == first


def test_persistent_workers_give_each_epoch_its_own_order(store: txstore.Store) -> None:
    block = 37
    ds = TokenStreamingDataset(store.snapshot(), block_size=block, shuffle=True)
    loader = TokenStreamingDataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    epochs = [_window_ids(loader, block) for _ in range(2)]

    def fresh(epoch: int) -> list[int]:
        other = TokenStreamingDataset(store.snapshot(), block_size=block, shuffle=True)
        other.set_epoch(epoch)
        return _window_ids(TokenStreamingDataLoader(other, batch_size=8, num_workers=2), block)

    assert epochs == [fresh(0), fresh(1)]
    assert epochs[0] != epochs[1] and sorted(epochs[0]) == sorted(epochs[1])
    assert ds.seed == 42  # LitData's default
