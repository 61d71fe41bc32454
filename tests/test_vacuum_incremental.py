"""The incremental vacuum (``vacuum(incremental=True)``) against the exact one.

A seeded random sequence of operations (appends, appends that name committed chunks again,
compaction, rollback, add_fields, tags, leases, expiry, both vacuums) on memory and local
stores, with small segment trees (leaves of 8 chunks, nodes of 4) so that merges and packs
happen within a few appends. After every incremental vacuum: it deleted nothing the exact
vacuum (a dry run just before, at the same time) would keep; every kept version has every
file it needs and every unexpired version reads back whole; and the exact vacuum then finds
nothing more to delete (every file the store holds was named by some version). Then a
process appending during incremental vacuums, SIGKILLs between deletions and the state's
swap, and damaged or forged state documents.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import txstore
from txstore.errors import ConflictError, CorruptError, TxstoreError, VersionExpiredError
from txstore.format import manifest as fmt
from txstore.storage import Storage, open_storage
from txstore.store import Store, incremental
from txstore.store import segments as seg
from txstore.store.incremental import STATE_KEY, Trees, read_state
from txstore.store.maintenance import Kept, kept_versions, parse_grace, reach

from .conftest import Backend
from .workers import REPO, run_cli, spawn

DAY = 86400.0


@pytest.fixture
def small_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leaves of at most 8 chunks, nodes of 4 (any such tree is a valid format 1.3 tree)."""
    monkeypatch.setattr(seg, "MAX_SEGMENT_CHUNKS", 8)
    monkeypatch.setattr(seg, "NODE_FANOUT", 4)
    monkeypatch.setattr(seg, "_COUNTER_TAIL", 2)


class Clock:
    """The stores' clock: a day ahead of the files' times, moved by the test only."""

    def __init__(self) -> None:
        self.t = time.time() + DAY

    def __call__(self) -> float:
        return self.t


def data_keys(storage: Storage) -> set[str]:
    return {f.key for f in storage.list("") if fmt.is_data_key(f.key)}


def samples(first: int, n: int) -> list[dict[str, Any]]:
    return [{"id": first + i, "pad": random.randbytes(90)} for i in range(n)]


class Model:
    """A store and what each of its versions holds (sample ids, in order)."""

    def __init__(self, uri: str, rng: random.Random) -> None:
        self.clock = Clock()
        self.rng = rng
        self.uri = uri
        txstore.create(uri, chunk_bytes=1024, block_bytes=256)
        self.store = Store(open_storage(uri), clock=self.clock)
        self.contents: list[list[int]] = [[]]
        self.next_id = 0
        self.tags: set[str] = set()
        self.leases: list[Any] = []
        self.full_vacuums = 0
        self.incremental_runs = 0
        self.deleted_incrementally = 0

    @property
    def latest(self) -> int:
        return len(self.contents) - 1

    def committed(self, ids: list[int]) -> None:
        assert self.store.version == len(self.contents)
        self.contents.append(ids)

    def unexpired(self) -> list[int]:
        expired = self.store.expired_versions()
        return [v for v in range(self.latest + 1) if v not in expired]

    # -- operations ------------------------------------------------------------------------

    def append(self) -> None:
        n = self.rng.randint(1, 30)
        self.store.append(samples(self.next_id, n))
        self.committed(self.contents[-1] + list(range(self.next_id, self.next_id + n)))
        self.next_id += n

    def append_refs(self) -> None:
        """Name committed chunks again (a staged part may): a chunk twice in one version."""
        snap = self.store.snapshot()
        refs = snap.chunk_refs()
        if not refs:
            return
        ids, starts = self.contents[-1], [0]
        for r in refs:
            starts.append(starts[-1] + r.num_samples)
        picked = [self.rng.randrange(len(refs)) for _ in range(self.rng.randint(1, 12))]
        self.store._ctx.append_chunks([refs[i] for i in picked], start=snap.manifest)
        self.committed(ids + [x for i in picked for x in ids[starts[i] : starts[i + 1]]])

    def compact(self) -> None:
        before = self.store.version
        self.store.compact()
        if self.store.version != before:
            self.committed(list(self.contents[-1]))

    def rollback(self) -> None:
        choices = [v for v in self.unexpired() if v < self.latest]
        if choices:
            v = self.rng.choice(choices)
            self.store.rollback(v)
            self.committed(list(self.contents[v]))

    def add_fields(self) -> None:
        name = f"f{self.rng.randrange(3)}"
        self.store.add_fields(lambda s: {name: s["id"] * 2}, [name], replace=True)
        self.committed(list(self.contents[-1]))

    def tag(self) -> None:
        if self.tags and self.rng.random() < 0.4:
            self.store.untag(self.tags.pop())
            return
        name = f"t{self.rng.randrange(1000)}"
        try:
            self.store.tag(name, self.rng.choice(self.unexpired()), force=True)
        except VersionExpiredError:
            return
        self.tags.add(name)

    def lease(self) -> None:
        if self.leases and self.rng.random() < 0.4:
            self.leases.pop(self.rng.randrange(len(self.leases))).release()
            return
        try:
            lease = self.store.lease(self.rng.choice(self.unexpired()), ttl="5h")
        except VersionExpiredError:
            return
        self.leases.append(lease)

    def expire(self) -> None:
        older = self.rng.choice([None, "1h", "3h"])
        keep = self.rng.randint(1, 4)
        self.store.expire(keep_last=keep, older_than=older)

    def vacuum_full(self) -> None:
        self.store.vacuum(grace=self.rng.choice([0, "1h", "2h"]))
        self.full_vacuums += 1

    def vacuum_incremental(self) -> None:
        grace = self.rng.choice([0, "1h", "2h"])
        needed = self.needed(grace)  # what kept versions name, as far as it is still there
        exact = self.store.vacuum(grace=grace, dry_run=True)  # same clock time: same kept set
        done = self.store.vacuum(grace=grace, incremental=True)
        deleted = {f.key for f in done.files}
        assert deleted <= {f.key for f in exact.files}, "deleted what the exact vacuum keeps"
        assert not deleted & needed
        assert all(self.store.storage.exists(k) for k in needed)
        self.incremental_runs += 1
        self.deleted_incrementally += len(deleted)
        self.check_unexpired()
        if self.full_vacuums == 0:
            # Without a full vacuum, every file was named by a version it compared.
            left = self.store.vacuum(grace=grace, dry_run=True).files
            assert left == [], f"the incremental vacuum left {[f.key for f in left]}"

    def needed(self, grace: float | str) -> set[str]:
        """The files kept versions name that exist (an earlier vacuum with a shorter grace
        may have taken those of versions kept now only by the grace period)."""
        ctx = self.store._ctx
        kept = kept_versions(ctx.log, ctx.refs, self.clock(), parse_grace(grace))
        versions = list(kept.below(self.latest + 1))
        graced = frozenset(v for v in versions if kept.is_graced(v))
        found = reach(ctx.log, ctx.segments, versions, tolerate=graced)
        assert found.problems == []
        return {k for k in found.keys if ctx.storage.exists(k)}

    def check_unexpired(self) -> None:
        """Every unexpired version reads back whole, through a store with cold caches."""
        fresh = Store(open_storage(self.uri), clock=self.clock)
        for v in self.unexpired():
            assert [s["id"] for s in fresh.snapshot(v)] == self.contents[v], v

    def step(self) -> None:
        self.clock.t += self.rng.uniform(0, 5400)
        ops = [
            (self.append, 8),
            (self.append_refs, 3),
            (self.compact, 1),
            (self.rollback, 1),
            (self.add_fields, 1),
            (self.tag, 2),
            (self.lease, 1),
            (self.expire, 3),
            (self.vacuum_incremental, 4),
            (self.vacuum_full, 1),
        ]
        op = self.rng.choices([o for o, _ in ops], weights=[w for _, w in ops])[0]
        op()


def copy_store(source: Storage, uri: str) -> Storage:
    target = open_storage(uri)
    for f in source.list(""):
        target.write(f.key, source.read(f.key))
    return target


@pytest.mark.parametrize("seed", range(6))
def test_incremental_vacuum_against_the_exact_one(
    small_trees: None, backend: Backend, seed: int, tmp_path: Path
) -> None:
    rng = random.Random(seed)
    random.seed(seed)
    model = Model(backend.uri, rng)
    try:
        for _ in range(70):
            model.step()
        model.vacuum_incremental()
        # Finally: incremental then full leaves what a full vacuum alone leaves.
        alone_uri = str(tmp_path / "alone") if backend.name == "local" else f"{backend.uri}-alone"
        alone = Store(copy_store(model.store.storage, alone_uri), clock=model.clock)
        alone.vacuum(grace=0)
        model.store.vacuum(grace=0, incremental=True)
        model.store.vacuum(grace=0)
        assert data_keys(model.store.storage) == data_keys(alone.storage)
        assert model.store.verify(deep=True).ok
    finally:
        for lease in model.leases:
            lease.release()
    assert model.incremental_runs >= 5
    assert model.deleted_incrementally > 0  # the sequence gave it work


# -- the rule for old kept versions, young files, the state ----------------------------------


def _store(backend: Backend, clock: Clock, appends: int = 12, size: int = 12) -> Store:
    txstore.create(backend.uri, chunk_bytes=1024, block_bytes=256)
    store = Store(open_storage(backend.uri), clock=clock)
    for v in range(appends):
        store.append(samples(100 * v, size))
    return store


def test_a_tag_on_an_old_version_keeps_its_files(backend: Backend) -> None:
    """Version 2 is tagged; compaction rewrites its chunks and every version but the latest
    expires. Its old chunks are dead since version 6, which is not kept: only reading the
    kept version below it (2) shows they are needed."""
    clock = Clock()
    store = _store(backend, clock, appends=6, size=3)  # chunks of 3 samples: undersized
    store.vacuum(grace=0, incremental=True)  # the state, from version 0
    store.tag("old", 2)
    store.compact()
    store.append(samples(9000, 12))
    store.expire(keep_last=1)
    two = {c.path for c in store.snapshot(2).chunks()}
    assert two - {c.path for c in store.snapshot().chunks()}  # compaction dropped some
    exact = {f.key for f in store.vacuum(grace=0, dry_run=True).files}
    done = {f.key for f in store.vacuum(grace=0, incremental=True).files}
    assert done and done <= exact
    assert not two & done
    assert store.verify(deep=True).ok
    assert len(list(store.snapshot("old"))) == 6


def test_young_files_and_fresh_expiries_stay(tmp_path: Path) -> None:
    """Local disk, where file times can be set: a version expired less than the grace ago
    keeps its files, and so does a file younger than the grace, whatever its versions."""
    backend = Backend("local", str(tmp_path / "store"))
    clock = Clock()
    store = _store(backend, clock)
    store.vacuum(grace=0, incremental=True)
    store.compact()
    store.expire(keep_last=1)
    assert store.vacuum(grace="1h", incremental=True).files == []  # expired just now
    clock.t += 7200
    ahead = clock.t + 1800  # every file half an hour younger than the clock says
    for path in (tmp_path / "store").rglob("*"):
        if path.is_file():
            os.utime(path, (ahead, ahead))
    assert store.vacuum(grace="1h", incremental=True).files == []
    assert store.vacuum(grace="1h", dry_run=True).files == []  # as the exact vacuum
    clock.t += 7200  # the files are 1.5 h old now
    done = store.vacuum(grace="1h", incremental=True)
    assert len(done.files) > 0
    assert store.vacuum(grace="1h", dry_run=True).files == []
    assert store.verify(deep=True).ok


def test_a_rollback_over_a_chunk_named_twice_keeps_it(backend: Backend) -> None:
    """Version 6 names version 3's chunks again, version 7 rolls back to 5: the chunks leave
    the changed subtrees but stay in the shared ones; they are not dead."""
    clock = Clock()
    store = _store(backend, clock, appends=5)
    store.vacuum(grace=0, incremental=True)
    snap = store.snapshot()
    store._ctx.append_chunks(snap.chunk_refs()[:3], start=snap.manifest)
    store.rollback(5)
    store.expire(keep_last=1)
    store.vacuum(grace=0, incremental=True)
    assert [s["id"] for s in store.snapshot()] == [s["id"] for s in snap]
    assert store.verify(deep=True).ok


# -- the state document: damaged, forged -------------------------------------------------


def _with_garbage(backend: Backend) -> tuple[Store, set[str]]:
    clock = Clock()
    store = _store(backend, clock)
    store.vacuum(grace=0, incremental=True)
    store.compact()
    store.append(samples(5000, 12))
    store.expire(keep_last=1)
    return store, data_keys(store.storage)


@pytest.mark.parametrize(
    "damage",
    [
        b"{not json",
        b'{"type": "vacuum-state", "format": "txstore", "format_version": [1, 3]}',
        "versions/index.v1.json",  # a dead "file" outside the data folders
        "refs/retention.json",
        "../outside.chunk",
        "through-past-latest",
        "other-commit",
        "live-file",
        "last-past-through",
    ],
)
def test_a_damaged_or_forged_state_deletes_nothing(backend: Backend, damage: Any) -> None:
    store, before = _with_garbage(backend)
    state, _ = read_state(store.storage)
    assert state is not None
    # A chunk of the latest version that version ``through`` named already (one named since
    # would leave the forged list again as the run compares the versions after ``through``).
    ctx = store._ctx  # version ``through`` is expired: its chunks from its segments
    both = {c.path for c in ctx.segments.chunks(ctx.log.read(state.through).segments)}
    live = sorted(both & {c.path for c in store.snapshot().chunks()})[0]
    if isinstance(damage, bytes):
        data = damage
    elif damage == "through-past-latest":
        data = fmt.encode(fmt.replace(state, through=store.version + 5))
    elif damage == "other-commit":
        data = fmt.encode(fmt.replace(state, commit_id="0" * 32))
    elif damage == "live-file":  # the latest version's chunk, said to have left at version 1
        data = fmt.encode(fmt.replace(state, dead={**state.dead, live: 0}))
    elif damage == "last-past-through":
        data = fmt.encode(fmt.replace(state, dead={live: state.through + 1}))
    else:
        data = fmt.encode(fmt.replace(state, dead={damage: 0}))
    store.storage.write(STATE_KEY, data)
    with pytest.raises(CorruptError, match=r"vacuum\.json"):
        store.vacuum(grace=0, incremental=True)
    assert data_keys(store.storage) == before
    assert store.storage.read(STATE_KEY) == data
    store.storage.delete(STATE_KEY)  # what the message says to do: rebuilt from version 0
    store.vacuum(grace=0, incremental=True)
    assert store.verify(deep=True).ok
    assert store.vacuum(grace=0, dry_run=True).files == []


# -- other processes ----------------------------------------------------------------------

_KILL_CHILD = """
import sys, time
from tests.faults import FaultyStorage
from txstore.storage import open_storage
from txstore.store import Store
uri, op, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
storage = FaultyStorage(open_storage(uri), fail_at=at, mode="kill_before", only=frozenset({op}))
# The parent's clock is a day ahead: expiries it made are in the past here too.
Store(storage, clock=lambda: time.time() + 2 * 86400).vacuum(grace=0, incremental=True)
print("finished")
"""


@pytest.mark.parametrize(("op", "at"), [("compare_and_swap", 1), ("delete", 2)])
def test_sigkill_between_deletions_and_the_state_swap(tmp_path: Path, op: str, at: int) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store, _ = _with_garbage(backend)
    old_state = store.storage.read(STATE_KEY)
    exact = {f.key for f in store.vacuum(grace=0, dry_run=True).files}
    assert len(exact) >= 2
    child = subprocess.run(
        [sys.executable, "-c", _KILL_CHILD, backend.uri, op, str(at)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    assert store.storage.read(STATE_KEY) == old_state  # killed before the swap
    gone = exact - data_keys(store.storage)
    # Killed at the second deletion: deletions run on several threads, so the first may not
    # have finished, or a third may have, when the kill lands; never all of them.
    assert gone if op == "compare_and_swap" else len(gone) < len(exact)
    assert store.verify(deep=True).ok  # only garbage went
    again = {f.key for f in store.vacuum(grace=0, incremental=True).files}
    assert again == exact - gone  # the rerun finishes the job, the deleted ones forgotten
    assert store.vacuum(grace=0, dry_run=True).files == []
    assert read_state(store.storage)[0].dead == {}  # type: ignore[union-attr]


def test_incremental_vacuum_while_another_process_appends(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = txstore.create(backend.uri, chunk_bytes=1024, block_bytes=256)
    for v in range(5):
        store.append(samples(100 * v, 12))
    proc = spawn("append-loop", backend.uri, "{}", "w", "60")
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline()) == {"started": True}, proc.stderr
    runs = deleted = 0
    while proc.poll() is None or runs < 3:
        store.expire(keep_last=2)
        with contextlib.suppress(ConflictError):  # the appender outran the catch-up
            deleted += len(store.vacuum(grace=0, incremental=True).files)
        runs += 1
        for v in sorted(set(range(store.version + 1)) - store.expired_versions()):
            assert len(list(store.snapshot(v))) == len(store.snapshot(v))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    acks = [json.loads(line) for line in out.splitlines()]
    assert not [a for a in acks if "conflict" in a]
    final = tag_counts(store)
    assert all(final[a["tag"]] == 4 for a in acks)
    assert deleted > 0 and runs >= 3
    store.vacuum(grace=0, incremental=True)
    assert store.verify(deep=True).ok


def tag_counts(store: Store) -> dict[str, int]:
    """How many samples of each appender's batch the latest version holds."""
    out: dict[str, int] = {}
    for s in store.snapshot():
        if "tag" in s:
            out[s["tag"]] = out.get(s["tag"], 0) + 1
    return out


@pytest.mark.s3
def test_incremental_vacuum_on_s3(backend: Backend) -> None:
    """S3 answers one object's size and time with a HEAD, not a listing."""
    clock = Clock()
    txstore.create(backend.uri, chunk_bytes=1024, block_bytes=256, **backend.kwargs())
    store = Store(open_storage(backend.uri, backend.storage_options), clock=clock)
    for v in range(6):
        store.append(samples(100 * v, 12))
    store.vacuum(grace=0, incremental=True)
    store.compact()
    store.expire(keep_last=1)
    exact = {f.key for f in store.vacuum(grace=0, dry_run=True).files}
    done = {f.key for f in store.vacuum(grace=0, incremental=True).files}
    assert done == exact and done
    assert store.verify(deep=True).ok


def test_segments_named_twice_in_one_tree_stay(small_trees: None, backend: Backend) -> None:
    """Appends of the same chunk references make segments of the same content, which a writer
    names by one path (written once): one tree then names a leaf, and a node, in several
    places. Those leaving the top of the tree for a node it already names are not dead."""
    clock = Clock()
    store = _store(backend, clock, appends=1, size=3)
    store.vacuum(grace=0, incremental=True)
    (ref,) = store.snapshot().chunk_refs()
    for _ in range(400):  # deep enough for nodes of nodes named twice
        store._ctx.append_chunks([ref, ref], start=store.snapshot().manifest)
    paths = [r.path for r in store.snapshot().manifest.segments]
    assert len(paths) > len(set(paths))  # the same segment twice at the top
    store.expire(keep_last=1)
    exact = {f.key for f in store.vacuum(grace=0, dry_run=True).files}
    done = {f.key for f in store.vacuum(grace=0, incremental=True).files}
    assert done and done <= exact
    assert store.verify(deep=True).ok
    assert len(list(store.snapshot())) == 3 + 400 * 6


def test_a_segment_still_named_at_the_top_is_not_removed() -> None:
    """Hand-made trees: the parent names leaf S at its top and again under node N; the
    version names S at its top and not N. S is shared, so only N and A left."""
    import msgspec

    uri = f"memory://{random.getrandbits(64):x}"
    txstore.create(uri)
    store = Store(open_storage(uri))
    store.append(samples(0, 2))
    base = store.snapshot().manifest
    (chunk,) = store.snapshot().chunk_refs()
    segs = store._ctx.segments
    s, a, b = (segs._write(fmt.new_segment((chunk,)), 0) for _ in range(3))
    node = segs._write(fmt.new_node((s, a)), 1)
    n = chunk.num_samples
    old = msgspec.structs.replace(base, version=2, parent=1, segments=(node, s), num_samples=3 * n)
    new = msgspec.structs.replace(base, version=3, parent=2, segments=(s, b), num_samples=2 * n)
    kept = Kept(latest=3, listed=(), protected=frozenset(), since=None)
    change = Trees(segs, kept).compare(old, new)
    assert change.removed == {node.path, a.path}
    assert change.complete


def test_a_run_reads_each_segment_file_a_few_times_however_long_the_history(
    small_trees: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted reads, not times. With the run's cache of segment files smaller than the
    history's nodes (as at a million versions with the real sizes), a first run over 300
    versions reads each segment file at most three times: what is under a shared node is
    worked out once, not by reading the shared tree again at every version compared."""
    from .faults import FaultyStorage

    monkeypatch.setattr(incremental, "_REMEMBER", 8)
    uri = f"memory://{random.getrandbits(64):x}"
    txstore.create(uri, chunk_bytes=1024, block_bytes=256)
    store = Store(open_storage(uri))
    for v in range(300):
        store.append(samples(10 * v, 2))
    levels = {r.level for r in store.snapshot().manifest.segments}
    assert max(levels) >= 2  # nodes of nodes, shared by every version since
    counted = FaultyStorage(open_storage(uri))
    Store(counted).vacuum(grace=0, incremental=True)
    reads: dict[str, int] = {}
    for op, key in counted.calls:
        if op in ("read", "read_many") and key.startswith("segments/"):
            reads[key] = reads.get(key, 0) + 1
    assert reads
    assert max(reads.values()) <= 3


# -- expire by age: bisection over commit times ----------------------------------------------


def test_expire_older_than_never_expires_a_younger_version(backend: Backend) -> None:
    """Commit times out of order (writers' clocks disagree): ``expire(older_than=...)`` finds
    the boundary by bisection and checks each version before it; a young version is never
    expired, an old one after a young one waits for a later expire."""
    txstore.create(backend.uri, chunk_bytes=1024, block_bytes=256)
    clock = Clock()
    t0 = clock.t
    store = Store(open_storage(backend.uri), clock=clock)
    hours = [0, 10, 1, 2, 3, 4, 11]  # versions 1..7: version 2 is young, 3.. are old again
    for v, h in enumerate(hours, start=1):
        clock.t = t0 + h * 3600
        store.append(samples(10 * v, 2))
    assert [store._ctx.log.read(v).timestamp for v in range(1, 8)] == [t0 + h * 3600 for h in hours]
    clock.t = t0 + 12 * 3600  # older than 5h: committed at t0 + 7h or before
    report = store.expire(keep_last=1, older_than="5h", dry_run=True)
    assert report.expired == [0, 1, 3, 4, 5, 6]  # version 2 is before the boundary, and young
    # Versions 0..3: the bisection meets version 2 (young) first; version 3 (old) waits.
    assert store.expire(keep_last=4, older_than="5h", dry_run=True).expired == [0, 1]


# -- proportional: what the incremental vacuum and expire read --------------------------------


def test_incremental_vacuum_and_expire_read_what_changed_not_the_history(
    small_trees: None,
) -> None:
    """Counted storage calls, not times. After 80 versions, 58 kept, a run that follows 3
    appends and the expiry of 5 versions lists no data folder and reads the manifests of the
    versions since the last run and of the newly expired ones only; the exact vacuum, counted
    the same way, lists the store and reads every kept version's. ``expire(older_than=...)``
    reads the manifests of the versions it expires and a few more, not every unexpired one."""
    from .faults import FaultyStorage

    uri = f"memory://{random.getrandbits(64):x}"
    clock = Clock()
    txstore.create(uri, chunk_bytes=1024, block_bytes=256)
    store = Store(open_storage(uri), clock=clock)
    for v in range(80):
        store.append(samples(10 * v, 4))
    store.expire(keep_last=60)  # versions 0..20
    store.vacuum(grace=0, incremental=True)
    for v in range(3):
        store.append(samples(1000 + v, 4))
    clock.t += 3600
    store.expire(keep_last=58)  # versions 21..25 now

    def manifests_read(counted: FaultyStorage) -> set[int]:
        out = set()
        for op, key in counted.calls:
            if op == "read" and key.startswith("versions/index.v"):
                out.add(int(key.removeprefix("versions/index.v").removesuffix(".json")))
        return out

    counted = FaultyStorage(open_storage(uri))
    done = Store(counted, clock=clock).vacuum(grace=0, incremental=True)
    assert done.files
    listed = {key for op, key in counted.calls if op == "list"}
    assert listed <= {"refs/tags/", "refs/leases/"}
    read = manifests_read(counted)
    # 80..83 compared (84: the probe past the latest), 20..26 compared again for the check
    assert read <= set(range(20, 27)) | set(range(80, 85))
    exact = FaultyStorage(open_storage(uri))
    Store(exact, clock=clock).vacuum(grace=0, dry_run=True)
    assert "" in {key for op, key in exact.calls if op == "list"}
    assert len(manifests_read(exact)) >= 58  # it reads every kept version's

    clock.t += 10 * 3600
    for v in range(40):  # young versions: expire by age reads a few of them, not all
        store.append(samples(2000 + v, 4))
    clock.t += 2 * 3600
    aged = FaultyStorage(open_storage(uri))
    report = Store(aged, clock=clock).expire(older_than="5h")
    assert report.expired == list(range(26, 84))
    assert len(manifests_read(aged)) <= len(report.expired) + 8  # + the bisection's


def test_a_hole_in_the_chain_stops_it(backend: Backend) -> None:
    """A missing manifest below the latest, or right past a stale HEAD: versions it cannot see
    could name dead files again, so it deletes nothing (as the full vacuum)."""
    store, before = _with_garbage(backend)
    latest = store.version
    store.storage.delete(f"versions/index.v{latest - 1}.json")  # below the latest
    with pytest.raises(TxstoreError):
        store.vacuum(grace=0, incremental=True)
    assert data_keys(store.storage) == before
    # Past a stale HEAD: the latest is read as the version before the hole.
    store.storage.write("HEAD", fmt.encode(fmt.Head(version=latest - 2)))
    fresh = Store(open_storage(backend.uri), clock=store._ctx.clock)
    with pytest.raises(CorruptError, match="chain of versions is broken"):
        fresh.vacuum(grace=0, incremental=True)
    assert data_keys(store.storage) == before


def test_the_cli_runs_it(tmp_path: Path) -> None:
    """``txstore vacuum URI --incremental``: the state first, then what versions dropped."""
    uri = str(tmp_path / "store")
    store = txstore.create(uri, chunk_bytes=1024, block_bytes=256)
    for v in range(6):
        store.append(samples(10 * v, 3))

    def vacuum(*args: str) -> dict[str, Any]:
        proc = run_cli("vacuum", uri, "--grace", "0", *args)
        assert proc.returncode == 0, proc.stderr
        out: dict[str, Any] = json.loads(proc.stdout)
        return out

    assert vacuum("--incremental", "--yes", "--json")["count"] == 0
    assert read_state(store.storage)[0] is not None
    store.compact()
    store.expire(keep_last=1)
    planned = vacuum("--incremental", "--dry-run", "--json")
    assert planned["dry_run"] and planned["count"] > 0
    done = vacuum("--incremental", "--yes", "--json")
    assert {f["key"] for f in done["files"]} == {f["key"] for f in planned["files"]}
    assert vacuum("--dry-run", "--json")["count"] == 0
    assert store.verify(deep=True).ok
