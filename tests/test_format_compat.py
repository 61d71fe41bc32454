"""A store written by format 1.2 (tests/data/format-1.2-store, made by
tests/data/make_format_1_2_store.py) stays readable and writable by this txstore."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import txstore

STORE = Path(__file__).parent / "data" / "format-1.2-store"
FIRST, SECOND = 12, 7
TXN_ID = "fixture/second-append"


def sample(i: int) -> dict[str, Any]:
    """Sample ``i`` of the stored versions: every kind of plain value."""
    return {
        "id": i,
        "name": f"sample-{i:03d}",
        "payload": bytes(range(i % 7, i % 7 + 40)) * 3,
        "score": i / 4,
        "tags": [i, str(i), None],
        "meta": {"even": i % 2 == 0, "half": i // 2},
    }


def double(sample: dict[str, Any]) -> dict[str, Any]:
    return {"double": 2 * sample["id"]}


@pytest.fixture
def store(tmp_path: Path) -> txstore.Store:
    # A copy: the test appends, and the kept store must stay as format 1.2 wrote it.
    shutil.copytree(STORE, tmp_path / "store")
    return txstore.open(tmp_path / "store")


def test_the_kept_store_is_format_1_2() -> None:
    for path in sorted((STORE / "versions").glob("*.json")):
        assert json.loads(path.read_bytes())["format_version"] == [1, 2], path
    assert len(list((STORE / "chunks").iterdir())) > 2  # several chunks and field files
    # Chunk files of major 2: footers listing their blocks, not packed (docs/format.md §7.3).
    for path in (STORE / "chunks").iterdir():
        assert path.read_bytes()[:8] == b"TXSC\x02\x00\x00\x00", path


def test_reads_every_version_of_a_format_1_2_store(store: txstore.Store) -> None:
    assert store.version == 3
    assert [c.message for c in store.log()][::2] == ["doubled", "first"]
    assert [list(store.snapshot(1)), list(store.snapshot(2))] == [
        [sample(i) for i in range(FIRST)],
        [sample(i) for i in range(FIRST + SECOND)],
    ]
    latest = store.snapshot()
    assert len(latest.chunks()) > 2
    assert list(latest) == [sample(i) | double(sample(i)) for i in range(FIRST + SECOND)]
    assert latest[FIRST + 3] == sample(FIRST + 3) | double(sample(FIRST + 3))
    assert list(latest.select(["id", "double"])) == [
        {"id": i, "double": 2 * i} for i in range(FIRST + SECOND)
    ]


def test_refs_and_txn_ids_of_a_format_1_2_store(store: txstore.Store) -> None:
    assert store.tag_info("second").version == 2
    assert list(store.snapshot("second")) == [sample(i) for i in range(FIRST + SECOND)]
    again = store.append([sample(99)], txn_id=TXN_ID)  # committed already: nothing written
    assert (again.version, again.attempts, store.version) == (2, 0, 3)


def test_verify_and_append_to_a_format_1_2_store(store: txstore.Store) -> None:
    report = store.verify(deep=True)
    assert (report.problems, report.level, report.latest) == ([], "deep", 3)
    commit = store.append([sample(100)], txn_id="after")
    assert commit.version == 4
    reopened = txstore.open(store.uri)
    assert reopened.snapshot()[-1] == sample(100)
    assert list(reopened.snapshot(3))[-1] == sample(FIRST + SECOND - 1) | double(
        sample(FIRST + SECOND - 1)
    )
    assert reopened.verify().problems == []


def test_a_format_1_2_store_takes_new_chunks_and_fields_beside_its_old_ones(
    store: txstore.Store,
) -> None:
    """Chunks of major 2 and of major 4 (packed footers, small columns stored apart) in one
    version, and field files of major 4 (every column stored apart) added over old chunks,
    read whole and one sample at a time, verified."""
    store.append([sample(100 + i) for i in range(5)])
    store.add_fields(lambda s: {"triple": 3 * s["id"]}, ["triple"])
    root = Path(store.uri)
    majors = {p.suffix: set() for p in (root / "chunks").iterdir()}
    for p in (root / "chunks").iterdir():
        majors[p.suffix].add(p.read_bytes()[4])
    assert majors == {".chunk": {2, 4}, ".fields": {2, 4}}
    snap = txstore.open(store.uri).snapshot()
    ids = [*range(FIRST + SECOND), *range(100, 105)]
    assert [(s["id"], s["triple"]) for s in snap] == [(i, 3 * i) for i in ids]
    assert [snap[k]["triple"] for k in range(len(ids))] == [3 * i for i in ids]
    report = store.verify(deep=True)
    assert report.problems == []
