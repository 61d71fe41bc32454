"""A loader state comes back from a checkpoint file: one that ``state_dict`` could not have
made (damaged, edited, another program's) is ``ResumeMismatchError`` naming what is wrong,
before anything is taken from it; never a ``KeyError`` or ``TypeError`` from deep inside, nor
a resume that loops over a billion ranks."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import txstore

pytest.importorskip("torch")

from txstore.torch import (
    MixedStreamingDataset,
    ResumeMismatchError,
    StreamingDataLoader,
    StreamingDataset,
)


@pytest.fixture
def stores(tmp_path: Path) -> tuple[txstore.Store, txstore.Store]:
    a = txstore.create(str(tmp_path / "a"))
    a.append({"id": i} for i in range(300))
    b = txstore.create(str(tmp_path / "b"))
    b.append({"id": 1000 + i} for i in range(200))
    return a, b


def _single(stores: tuple[txstore.Store, txstore.Store]) -> Any:
    return StreamingDataset(stores[0].snapshot(), shuffle=True, seed=3)


def _mixed(stores: tuple[txstore.Store, txstore.Store]) -> Any:
    return MixedStreamingDataset(
        [StreamingDataset(s.snapshot(), shuffle=True) for s in stores], weights=[3, 2], seed=1
    )


def _elastic_state(make: Any, stores: Any) -> dict[str, Any]:
    """A state with a ``todo``: taken after resuming, on one worker, a state of two."""
    loader = StreamingDataLoader(make(stores), batch_size=8, num_workers=0)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    state = loader.state_dict()
    state.update(num_workers=2, delivered={"0": 16, "1": 24})
    resumed = StreamingDataLoader(make(stores), batch_size=8, num_workers=0)
    resumed.load_state_dict(state)
    next(iter(resumed))
    out = resumed.state_dict()
    assert out["todo"] is not None
    return out


def _edits(state: dict[str, Any]) -> list[tuple[str, Any]]:
    """(the member the error names, an edit of a state)."""
    edits: list[tuple[str, Any]] = []
    for key in ("seed", "epoch", "world_size", "num_workers", "delivered"):
        edits.append((key, lambda s, k=key: s.pop(k)))
        edits.append((key, lambda s, k=key: s.update({k: "x"})))
    edits += [
        ("epoch", lambda s: s.update(epoch=-1)),
        ("epoch", lambda s: s.update(epoch=True)),
        ("world_size", lambda s: s.update(world_size=10**30)),  # was a resume without end
        ("num_workers", lambda s: s.update(num_workers=10**30)),
        ("num_workers", lambda s: s.update(num_workers=0)),
        ("rank", lambda s: s.update(rank=s["world_size"])),
        ("next_worker", lambda s: s.update(next_worker=-1)),
        ("delivered", lambda s: s.update(delivered={"0": "12"})),
        ("delivered", lambda s: s.update(delivered={"9": 1})),
        ("delivered", lambda s: s.update(delivered=[16, 24])),
        ("todo", lambda s: s.update(todo=5)),
        ("todo", lambda s: s.update(todo=[[5]])),
        ("todo", lambda s: s.update(todo=[[0, 10**12]])),
        ("todo", lambda s: s.update(todo={"sources": [[[0, 10**15]], []], "resumed": 0})),
        ("todo", lambda s: s.update(todo=[[0, 5, "key", 1, 0, 10]])),
    ]
    if "mix" in state:
        edits.append(("sources", lambda s: s.update(mix={"sources": [5, 6]})))
    return edits


@pytest.mark.parametrize("make", [_single, _mixed], ids=["streaming", "mixed"])
def test_a_state_state_dict_could_not_make_is_refused_naming_the_member(
    make: Any, stores: Any
) -> None:
    state = _elastic_state(make, stores)
    loader = StreamingDataLoader(make(stores), batch_size=8, num_workers=0)
    loader.load_state_dict(copy.deepcopy(state))  # the state as made resumes
    for member, edit in _edits(state):
        bad = copy.deepcopy(state)
        edit(bad)
        loader = StreamingDataLoader(make(stores), batch_size=8, num_workers=0)
        with pytest.raises(ResumeMismatchError, match=member):
            loader.load_state_dict(bad)


def test_a_state_that_is_no_dict_is_refused(stores: Any) -> None:
    loader = StreamingDataLoader(_single(stores), batch_size=8, num_workers=0)
    with pytest.raises(ResumeMismatchError, match="is a dict"):
        loader.load_state_dict([1, 2])  # type: ignore[arg-type]
