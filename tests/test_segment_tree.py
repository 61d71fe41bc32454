"""The segment tree (format §5, 1.3): manifests stay small, every sample is found, damage in
a node is caught, maintenance walks the whole tree.

Large histories are built as the scale benchmark builds them: real one-sample chunks, named
many times by commits through the real commit path (``StoreContext.append_chunks``), so
tens of thousands of chunk references cost no chunk files.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txstore
from txstore.format import manifest as fmt
from txstore.format.codec import crc32
from txstore.format.manifest import ChunkRef
from txstore.storage.memory import MemoryStorage
from txstore.store import segments as seg
from txstore.store.segments import Segments

DISTINCT = 7  # real one-sample chunks, sample {"id": k} in chunk k


def _store(uri: str) -> tuple[txstore.Store, list[ChunkRef]]:
    store = txstore.create(uri)
    for k in range(DISTINCT):
        store.append([{"id": k}])
    refs = store.snapshot().chunk_refs()
    assert [store.snapshot()[i]["id"] for i in range(DISTINCT)] == list(range(DISTINCT))
    return store, refs


def _grow(
    store: txstore.Store, refs: list[ChunkRef], ids: list[int], sizes: list[int]
) -> list[int]:
    """Commit one version per size after ``ids`` (the ids of the latest version's samples),
    each naming that many chunks in a known pattern; the ids of the last version's samples."""
    ctx = store._ctx
    ids = list(ids)
    manifest = ctx.log.latest()
    for n in sizes:
        new = [(len(ids) + j) * 5 % DISTINCT for j in range(n)]
        manifest = ctx.append_chunks([refs[k] for k in new], start=manifest).manifest
        ids += new
    return ids


def _latest(store: txstore.Store) -> fmt.Manifest:
    return store._ctx.log.latest()


@pytest.fixture(params=["memory", "local"])
def uri(request: pytest.FixtureRequest, tmp_path) -> str:
    return (
        f"memory://tree-{random.getrandbits(64):x}"
        if request.param == "memory"
        else str(tmp_path / "s")
    )


def test_a_long_history_keeps_a_small_manifest_and_finds_every_sample(uri: str) -> None:
    store, refs = _store(uri)
    # 300 commits of 1 to 400 chunks: about 60,000 chunks, past the size where a flat list
    # of full segments would already name over 100 of them.
    rng = random.Random(5)
    ids = _grow(store, refs, list(range(DISTINCT)), [rng.randint(1, 400) for _ in range(300)])
    m = _latest(store)
    assert m.num_samples == len(ids)
    levels = [r.level for r in m.segments]
    assert max(levels) >= 1, "a history of this size has segment nodes"
    assert levels == sorted(levels, reverse=True), "oldest, highest levels first"
    assert len(store.storage.read(f"versions/index.v{m.version}.json")) <= 16 * 1024
    reopened = txstore.open(uri)
    snap = reopened.snapshot()
    assert [c.path for c in snap.chunk_refs()] == [refs[k].path for k in ids]
    for i in rng.sample(range(len(ids)), 300):
        assert snap[i]["id"] == ids[i]
    assert snap[-1]["id"] == ids[-1] and snap[0]["id"] == ids[0]
    # An old version still reads as it was.
    old = reopened.snapshot(DISTINCT + 10)
    assert [old[i]["id"] for i in range(len(old))] == ids[: len(old)]
    assert reopened.verify().ok


def test_a_manifest_stays_small_at_ten_million_chunks() -> None:
    """Format §5's bound, through the writer alone (references, no files to read back)."""
    storage = MemoryStorage(f"memory://big-{random.getrandbits(64):x}")
    segments = Segments(storage)
    chunk = ChunkRef(path="chunks/x.chunk", num_samples=1, size=100, crc32=0, footer_offset=50)
    full = [chunk] * seg.MAX_SEGMENT_CHUNKS  # a full leaf each time, written once
    refs: tuple[fmt.SegmentRef, ...] = ()
    for _ in range(10_000_000 // seg.MAX_SEGMENT_CHUNKS):
        refs = segments.extend(refs, full)
    leaves = 10_000_000 // seg.MAX_SEGMENT_CHUNKS
    assert sum(r.num_chunks for r in refs) == leaves * seg.MAX_SEGMENT_CHUNKS
    per_level: dict[int, int] = {}
    for r in refs:
        per_level[r.level] = per_level.get(r.level, 0) + 1
    assert per_level[0] <= seg.NODE_FANOUT + seg._COUNTER_TAIL - 1
    assert all(n <= seg.NODE_FANOUT - 1 for lv, n in per_level.items() if lv)
    encoded = msgspec.json.encode(refs)
    assert len(encoded) < 16 * 1024 - 1024  # room for the manifest's other members


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 1500), min_size=1, max_size=60))
def test_the_tree_holds_the_chunks_in_order_whatever_the_commits(sizes: list[int]) -> None:
    storage = MemoryStorage(f"memory://prop-{random.getrandbits(64):x}")
    segments = Segments(storage)
    refs: tuple[fmt.SegmentRef, ...] = ()
    expected: list[ChunkRef] = []
    for n in sizes:
        new = [
            ChunkRef(
                path=f"chunks/{len(expected) + j}.chunk",
                num_samples=1 + (len(expected) + j) % 3,
                size=9,
                crc32=0,
                footer_offset=1,
            )
            for j in range(n)
        ]
        refs = segments.extend(refs, new)
        expected += new
        levels = [r.level for r in refs]
        assert levels == sorted(levels, reverse=True)
    # Read back through a fresh reader: nothing from the writer's cache.
    reader = Segments(storage)
    assert reader.chunks(refs) == expected
    starts = [0]
    for c in expected:
        starts.append(starts[-1] + c.num_samples)
    top = [0]
    for r in refs:
        top.append(top[-1] + r.num_samples)
    rng = random.Random(len(expected))
    for _ in range(50):
        i = rng.randrange(starts[-1])
        k = max(j for j, s in enumerate(top) if s <= i)
        leaf, local = reader.descend(refs[k], i - top[k])
        c = max(j for j, s in enumerate(leaf.starts[:-1]) if s <= local)
        want = max(j for j, s in enumerate(starts[:-1]) if s <= i)
        assert leaf.chunks[c] == expected[want]


def _node(store: txstore.Store) -> fmt.SegmentRef:
    return next(r for r in _latest(store).segments if r.level > 0)


def _forge(
    store: txstore.Store,
    ref: fmt.SegmentRef,
    change: Callable[[Any], object],
    fix_counts: bool = True,
) -> None:
    """Rewrite the node ``ref`` names with ``change`` applied, and the manifest's reference
    to it with the new size and CRC-32 (a forger who fixes checksums and, with
    ``fix_counts``, the node's counts)."""
    node = json.loads(store.storage.read(ref.path))
    change(node)
    if fix_counts:
        node["counts"] = [r["num_samples"] for r in node["segments"]]
    data = json.dumps(node).encode()
    store.storage.delete(ref.path)
    store.storage.write(ref.path, data)
    key = f"versions/index.v{_latest(store).version}.json"
    manifest = json.loads(store.storage.read(key))
    for r in manifest["segments"]:
        if r["path"] == ref.path:
            r["size"], r["crc32"] = len(data), crc32(data)
    store.storage.delete(key)
    store.storage.write(key, json.dumps(manifest).encode())


def _tree_store(uri: str) -> tuple[txstore.Store, list[int]]:
    store, refs = _store(uri)
    ids = _grow(store, refs, list(range(DISTINCT)), [512] * 50)
    assert any(r.level for r in _latest(store).segments)
    return store, ids


def test_a_damaged_node_is_a_checksum_error_and_verify_names_it(uri: str) -> None:
    store, ids = _tree_store(uri)
    path = _node(store).path
    data = bytearray(store.storage.read(path))
    data[len(data) // 2] ^= 1
    store.storage.delete(path)
    store.storage.write(path, bytes(data))
    snap = txstore.open(uri).snapshot()
    with pytest.raises(txstore.ChecksumError, match=path):
        snap[0]
    with pytest.raises(txstore.ChecksumError):
        snap.chunk_refs()
    report = txstore.open(uri).verify()
    assert not report.ok and any(path in p.key for p in report.problems)
    # Samples outside the damaged node still read.
    assert snap[len(ids) - 1]["id"] == ids[-1]


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda n: n["segments"][0].update(level=3), "level"),
        (lambda n: n["segments"].pop(), "holds"),
        (lambda n: n.update(segments=[]), "naming no segments"),
        (lambda n: n["segments"][0].update(path="versions/index.v0.json"), "outside segments/"),
        (lambda n: n["segments"][0].update(path="../../etc/passwd"), "unsafe path"),
    ],
)
def test_a_forged_node_is_corrupt_and_vacuum_deletes_nothing(uri: str, change, match: str) -> None:
    store, _ = _tree_store(uri)
    _forge(store, _node(store), change)
    before = sorted(f.key for f in store.storage.list(""))
    snap = txstore.open(uri).snapshot()
    with pytest.raises(txstore.CorruptError, match=match):
        snap[0]  # a reader of one sample, descending through the node's counts (1.5)
    with pytest.raises(txstore.CorruptError, match=match):
        snap.chunk_refs()
    fresh = txstore.open(uri)
    with pytest.raises(txstore.TxstoreError):
        fresh.vacuum(grace=0)
    assert sorted(f.key for f in store.storage.list("")) == before


@pytest.mark.parametrize("which", ["counts", "reference"])
def test_a_node_whose_counts_are_not_its_references_is_corrupt(uri: str, which: str) -> None:
    """Counts (1.5) that say another number of samples than a reference: refused by a reader
    of one sample (which decodes only the reference it descends into) and a whole read."""
    store, _ = _tree_store(uri)
    ref = _node(store)

    def change(node: Any) -> None:
        first, second = node["segments"][0], node["segments"][1]
        assert node["counts"][:2] == [first["num_samples"], second["num_samples"]]
        if which == "counts":
            node["counts"][0] += 1
            node["counts"][1] -= 1
        else:  # the node's sums still agree with its reference: only the counts do not
            first["num_samples"] += 1
            second["num_samples"] -= 1

    _forge(store, ref, change, fix_counts=False)
    snap = txstore.open(uri).snapshot()
    with pytest.raises(txstore.CorruptError, match=rf"{ref.path}.*count"):
        snap[0]
    with pytest.raises(txstore.CorruptError, match=rf"{ref.path}.*counts are not its references"):
        txstore.open(uri).snapshot().chunk_refs()


def test_a_node_without_counts_is_read_whole_by_a_reader_of_one_sample(uri: str) -> None:
    """A node written before 1.5 has no counts: a reader of one sample decodes it whole."""
    store, ids = _tree_store(uri)
    _forge(store, _node(store), lambda node: node.pop("counts"), fix_counts=False)
    snap = txstore.open(uri).snapshot()
    rng = random.Random(3)
    for i in [0, *rng.sample(range(len(ids)), 100)]:
        assert snap[i]["id"] == ids[i]


def test_a_node_read_for_one_sample_is_checked_whole_when_read_whole(uri: str) -> None:
    """A reference the lazy reader never decoded is still checked when the same cached node
    is read whole: a forged level past the one descended into."""
    store, ids = _tree_store(uri)
    _forge(store, _node(store), lambda node: node["segments"][-1].update(level=3))
    snap = txstore.open(uri).snapshot()
    assert snap[0]["id"] == ids[0]  # through the node's first reference, decoded alone
    with pytest.raises(txstore.CorruptError, match="at level 3"):
        snap.chunk_refs()


def test_vacuum_keeps_every_file_under_the_tree_and_drops_expired_nodes(uri: str) -> None:
    store, ids = _tree_store(uri)
    first = _latest(store)
    refs = store.snapshot(DISTINCT).chunk_refs()
    ids = _grow(store, refs, ids, [300] * 40)  # packs level 0 again: new nodes
    latest = _latest(store)
    assert {r.path for r in latest.segments} != {r.path for r in first.segments}
    store.expire(keep_last=1)
    report = store.vacuum(grace=0)
    gone = {f.key for f in report.files}
    assert any(k.startswith("segments/") for k in gone), "superseded segment files are garbage"
    reopened = txstore.open(uri)
    assert reopened.verify().ok
    snap = reopened.snapshot()
    assert snap.version == latest.version
    assert [c.path for c in snap.chunk_refs()] == [refs[k].path for k in ids]
    rng = random.Random(1)
    for i in rng.sample(range(len(ids)), 200):
        assert snap[i]["id"] == ids[i]


def test_the_first_commit_on_a_large_flat_store_packs_its_segments() -> None:
    """A 1.2 store's manifest names its full segments side by side (up to 4,096 chunks each):
    the first commit through this writer packs them, every chunk kept in order."""
    storage = MemoryStorage(f"memory://flat-{random.getrandbits(64):x}")
    segments = Segments(storage)
    flat: list[fmt.SegmentRef] = []
    expected: list[ChunkRef] = []
    for s in range(200):
        chunks = [
            ChunkRef(path=f"chunks/{s}-{j}.chunk", num_samples=2, size=9, crc32=0, footer_offset=1)
            for j in range(4096 if s % 3 else 1000)
        ]
        (ref,) = (segments._write(fmt.Segment(chunks=tuple(chunks)), 0),)
        flat.append(ref)
        expected += chunks
    new = [ChunkRef(path="chunks/new.chunk", num_samples=1, size=9, crc32=0, footer_offset=1)]
    refs = segments.extend(tuple(flat), new)
    # 201 level-0 references: packed NODE_FANOUT at a time while NODE_FANOUT + _COUNTER_TAIL
    # or more remain; the newest (the new one last) left as they are.
    fanout, keep = seg.NODE_FANOUT, seg.NODE_FANOUT + seg._COUNTER_TAIL - 1
    nodes = -(-(201 - keep) // fanout)
    assert [r.level for r in refs] == [1] * nodes + [0] * (201 - nodes * fanout)
    assert 201 - nodes * fanout <= keep
    assert refs[-1].num_chunks == 1
    assert Segments(storage).chunks(refs) == [*expected, *new]
