"""Operating a store through the API: tags, leases, rollback, expire, vacuum, compact, verify,
diff. Every backend; the tests with processes running alongside are in test_ops_concurrency.py.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import txstore
from txstore.errors import (
    ConflictError,
    HistoryChangedError,
    MissingDataError,
    TagExistsError,
    TagNotFoundError,
    VersionExpiredError,
    VersionNotFoundError,
)
from txstore.storage import FileInfo, Storage, open_storage
from txstore.store import Store

from .conftest import Backend


def batch(v: int, n: int = 10) -> list[dict[str, Any]]:
    # Incompressible padding: chunk sizes follow sample counts.
    return [{"b": v, "i": i, "pad": os.urandom(120)} for i in range(n)]


def make(backend: Backend, appends: int = 8) -> Store:
    """Appends of 10 samples (about 1.4 KB) into 4 KiB chunks: one undersized chunk each."""
    store = txstore.create(backend.uri, chunk_bytes=4096, block_bytes=1024, **backend.kwargs())
    for v in range(appends):
        store.append(batch(v), message=f"batch {v}", txn_id=f"batch-{v}")
    return store


def reopen(backend: Backend, **kw: Any) -> Store:
    return Store(open_storage(backend.uri, backend.storage_options), **kw)


def keys(snap: txstore.Snapshot) -> list[tuple[int, int]]:
    return [(s["b"], s["i"]) for s in snap]


# -- tags ------------------------------------------------------------------------------------


def test_tags(backend: Backend) -> None:
    store = make(backend, appends=4)
    made = store.tag("paper-v1", 2, message="the paper's numbers")
    assert (made.name, made.version, made.message) == ("paper-v1", 2, "the paper's numbers")
    store.tag("latest.ok")  # default: the latest
    other = reopen(backend)
    assert sorted(other.tags()) == ["latest.ok", "paper-v1"]
    assert other.tags()["latest.ok"].version == 4
    assert keys(other.snapshot("paper-v1")) == keys(other.snapshot(2))
    assert other.snapshot("2").version == 2  # digits are a version, never a tag

    with pytest.raises(TagExistsError, match="force"):
        other.tag("paper-v1", 3)
    assert other.snapshot("paper-v1").version == 2  # unchanged
    assert other.tag("paper-v1", 3, force=True).version == 3
    assert store.snapshot("paper-v1").version == 3
    assert store.tag("again", "paper-v1").version == 3  # a tag names a version too

    for bad in ["", "../x", "a/b", ".hidden", "-x", "123", "x" * 129, "sp ace", "é"]:
        with pytest.raises(ValueError, match="tag name"):
            store.tag(bad, 1)
    with pytest.raises(VersionNotFoundError):
        store.tag("future", 99)
    with pytest.raises(TagNotFoundError):
        store.snapshot("nope")
    assert store.untag("paper-v1").version == 3
    with pytest.raises(TagNotFoundError):
        store.untag("paper-v1")
    with pytest.raises(TagNotFoundError):
        store.snapshot("paper-v1")
    assert sorted(store.tags()) == ["again", "latest.ok"]


# -- rollback and diff -------------------------------------------------------------------------


def test_rollback_keeps_history_and_diff_explains_it(backend: Backend) -> None:
    store = make(backend, appends=6)
    before = keys(store.snapshot(6))
    commit = store.rollback(3, message="drop the bad batches")
    assert (commit.version, commit.operation, commit.total_samples) == (7, "rollback", 30)
    assert commit.num_samples == -30
    assert keys(store.snapshot()) == keys(store.snapshot(3))
    assert keys(store.snapshot(6)) == before  # history stays readable
    store.append(batch(100), message="after")
    assert keys(store.snapshot())[-10:] == [(100, i) for i in range(10)]

    d = store.diff(6, 8)
    assert d.common == 3
    assert [(r.start, r.stop, r.version, r.txn_id) for r in d.removed] == [
        (30, 40, 4, "batch-3"),
        (40, 50, 5, "batch-4"),
        (50, 60, 6, "batch-5"),
    ]
    assert [(r.start, r.stop, r.version) for r in d.added] == [(30, 40, 8)]
    assert [c.version for c in d.commits] == [7, 8]
    back = store.diff(8, 6)
    assert [(r.start, r.stop) for r in back.added] == [(30, 40), (40, 50), (50, 60)]
    assert [(r.start, r.stop) for r in back.removed] == [(30, 40)]
    same = store.diff(3, 7)
    assert (same.added, same.removed, same.num_added) == ([], [], 0)
    plain = store.diff(1, 3)
    assert [(r.start, r.stop, r.txn_id) for r in plain.added] == [
        (10, 20, "batch-1"),
        (20, 30, "batch-2"),
    ]

    with pytest.raises(ValueError, match="latest"):
        store.rollback(8)
    with pytest.raises(HistoryChangedError, match="roll back again") as raised:
        store.rollback(2, expected_version=7)  # the caller looked at 7; 8 landed since
    assert (raised.value.version, raised.value.operation) == (8, "append")
    assert store.version == 8
    with pytest.raises(VersionNotFoundError):
        store.rollback(42)


def test_append_racing_a_rollback_fails_visibly(backend: Backend) -> None:
    store = make(backend, appends=4)
    other = reopen(backend)
    chunks_before = {f.key for f in store.storage.list("chunks/")}

    def samples() -> Iterator[dict[str, Any]]:
        yield from batch(50, 5)
        other.rollback(1, message="meanwhile")  # lands while the append is writing
        yield from batch(50, 5)

    with pytest.raises(ConflictError, match="rolled back to version 1"):
        store.append(samples(), message="raced")
    assert store.version == 5  # the rollback, and nothing on top of it
    assert store.snapshot().manifest.operation == "rollback"
    assert keys(store.snapshot()) == keys(store.snapshot(1))
    assert {f.key for f in store.storage.list("chunks/")} == chunks_before  # its chunks deleted
    store.append(batch(51), message="retried deliberately")
    assert keys(store.snapshot())[-10:] == [(51, i) for i in range(10)]


# -- expire and vacuum -------------------------------------------------------------------------


@pytest.mark.s3  # vacuum lists and deletes keys
def test_expire_vacuum_and_what_stays_readable(backend: Backend) -> None:
    store = make(backend, appends=8)
    held = store.snapshot(7)  # opened before the expiry, read after it
    store.rollback(5, message="drop batches 5-7")  # version 9
    store.append(batch(9))  # version 10
    store.tag("keep-me", 2)
    with store.lease(3, ttl="1h") as lease:
        report = store.expire(keep_last=2, dry_run=True)
        assert report.expired == [0, 1, 4, 5, 6, 7, 8] and report.dry_run
        assert set(report.protected) == {2, 3}
        assert store.expired_versions() == set()  # a dry run changes nothing
        report = store.expire(keep_last=2)
        assert report.expired == [0, 1, 4, 5, 6, 7, 8]
        assert report.protected[3] == [lease.key]
    assert store.expired_versions() == {0, 1, 4, 5, 6, 7, 8}
    for v in (1, 4, 8):
        with pytest.raises(VersionExpiredError, match=f"version {v}"):
            store.snapshot(v)
    assert len(store.snapshot("keep-me")) == 20
    assert len(list(store.snapshot(3))) == 30  # the lease kept it unexpired
    assert len(list(held)) == 70  # not vacuumed yet: an open snapshot keeps working
    assert [c.version for c in store.log()] == list(range(10, -1, -1))  # the log is whole
    assert store.append(batch(0), txn_id="batch-0").version == 1  # txn ids still settle
    assert store.diff(8, 10).common == 5  # so does diff

    files_before = {f.key for f in store.storage.list("")}
    dry = store.vacuum(grace=0, dry_run=True)
    assert dry.files and dry.bytes == sum(f.size for f in dry.files)
    assert {f.key for f in store.storage.list("")} == files_before
    done = store.vacuum(grace=0)
    assert {f.key for f in done.files} == {f.key for f in dry.files}
    gone = {f.key for f in done.files}
    assert not any(store.storage.exists(k) for k in gone)
    assert sum(k.startswith("chunks/") for k in gone) == 3  # batches 5, 6, 7
    with pytest.raises(MissingDataError):
        list(held)
    report = store.verify(deep=True)
    assert report.ok, report.problems
    assert report.orphans == []
    assert report.versions == 4  # 2, 3, 9, 10
    for v, n in ((2, 20), (3, 30), (9, 50), (10, 60)):
        assert len(list(store.snapshot(v))) == n
    assert store.vacuum(grace=0).files == []  # nothing left to do

    # The latest-version search does not depend on expired manifests being gone.
    store.storage.delete("HEAD")
    assert reopen(backend).version == 10
    store.append(batch(11))
    assert store.version == 11


def test_tag_or_lease_of_an_expired_version_is_refused(backend: Backend) -> None:
    store = make(backend, appends=4)
    store.expire(keep_last=1)
    with pytest.raises(VersionExpiredError):
        store.tag("late", 2)
    with pytest.raises(VersionExpiredError):
        store.lease(2)
    assert store.tags() == {} and store.leases() == []
    with pytest.raises(VersionExpiredError):
        store.rollback(2)
    with pytest.raises(ValueError):
        store.expire()
    with pytest.raises(ValueError):
        store.expire(keep_last=0)


def test_expire_older_than_uses_commit_times(backend: Backend) -> None:
    store = make(backend, appends=4)
    assert store.expire(older_than="1h").expired == []  # everything is younger
    future = reopen(backend, clock=lambda: time.time() + 7200)
    report = future.expire(keep_last=2, older_than="1h")
    assert report.expired == [0, 1, 2]  # old enough, but the last two are kept anyway


def test_lapsed_lease_stops_protecting(backend: Backend) -> None:
    store = make(backend, appends=3)
    lease = store.lease(1, ttl="10m")
    try:
        assert store.expire(keep_last=1).expired == [0, 2]
        later = reopen(backend, clock=lambda: time.time() + 3600)
        assert [info.active for info in later.leases()] == [False]
        assert later.expire(keep_last=1).expired == [1]  # the lease has lapsed by then
    finally:
        lease.release()
    assert store.leases() == []


def test_lease_renews_in_the_background(backend: Backend) -> None:
    store = make(backend, appends=1)
    with store.lease(ttl=0.6) as lease:
        first = store.leases()[0].expires_at
        for _ in range(600):  # renewed every ttl/3; polls a generous while, never times it
            if store.leases()[0].expires_at != first:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the lease was never renewed")
        assert not lease.lapsed
    assert lease.released and store.leases() == []


def test_vacuum_grace_protects_young_files_and_fresh_expiries(tmp_path: Any) -> None:
    """Local disk, where file times can be set: what the grace period keeps, and for how long."""
    backend = Backend("local", str(tmp_path / "store"))
    store = make(backend, appends=5)
    root = tmp_path / "store"
    day_ago = time.time() - 86400
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (day_ago, day_ago))
    old_orphan = root / "chunks" / "0123456789abcdef0123456789abcdef.chunk"
    old_orphan.write_bytes(b"crashed writer")
    os.utime(old_orphan, (day_ago, day_ago))
    old_temp = root / "versions" / ".tmp.0123456789abcdef0123456789abcdef.index.v9.json"
    old_temp.write_bytes(b"{")
    os.utime(old_temp, (day_ago, day_ago))
    young_orphan = root / "chunks" / "fedcba9876543210fedcba9876543210.chunk"
    young_orphan.write_bytes(b"a writer at work")
    needed = set()
    for v in range(6):
        snap = store.snapshot(v)
        needed |= {c.path for c in snap.chunks()} | {s.path for s in snap.manifest.segments}
    store.rollback(2)
    store.expire(keep_last=1)  # expires 0..5 now: their files are a day old

    first = store.vacuum(grace="1h")
    gone = {f.key for f in first.files}
    assert {k for k in gone if not k.startswith("segments/")} == {
        "chunks/0123456789abcdef0123456789abcdef.chunk",
        "versions/.tmp.0123456789abcdef0123456789abcdef.index.v9.json",
    }
    assert not gone & needed  # only segments merged away by later appends, named by no version
    assert all(store.storage.exists(k) for k in needed)
    assert young_orphan.exists()
    assert len(list(store.snapshot(6))) == 20

    later = reopen(backend, clock=lambda: time.time() + 7200)
    second = later.vacuum(grace="1h")  # the expiry is two hours old now
    gone = {f.key for f in second.files}
    assert "chunks/fedcba9876543210fedcba9876543210.chunk" in gone
    assert sum(k.startswith("chunks/") for k in gone) == 4  # versions 3, 4, 5's chunks + young
    assert later.verify(deep=True).ok
    assert keys(later.snapshot()) == [(b, i) for b in range(2) for i in range(10)]


# -- compaction --------------------------------------------------------------------------------


def test_compact_rewrites_small_chunks_same_samples_same_order(backend: Backend) -> None:
    store = make(backend, appends=9)
    before = keys(store.snapshot())
    chunks_before = len(store.snapshot().chunks())
    assert chunks_before == 9
    plan = store.compact(dry_run=True)
    assert plan.commit is None and plan.runs and store.version == 9
    result = store.compact(message="tidy")
    assert result.commit is not None
    assert (result.commit.version, result.commit.operation) == (10, "compact")
    assert result.chunks_before == 9 and result.chunks_after < 9
    snap = store.snapshot()
    assert len(snap.chunks()) == result.chunks_after
    assert all(c.size <= 4096 + 2048 for c in snap.chunks())
    assert keys(snap) == before
    assert [snap[i]["pad"] for i in (0, 45, 89)] == [
        store.snapshot(9)[i]["pad"] for i in (0, 45, 89)
    ]
    assert snap.manifest.source_version == 9
    d = store.diff(9, 10)
    assert (d.added, d.removed) == ([], [])
    assert store.compact().commit is None  # nothing left worth rewriting
    assert store.verify(deep=True).ok


def test_compact_keeps_appends_committed_meanwhile(backend: Backend) -> None:
    store = make(backend, appends=6)
    other = reopen(backend)
    appended: list[int] = []

    def progress(stage: str, done: int, total: int) -> None:
        if not appended:  # while compaction rewrites: another writer appends twice
            appended.append(other.append(batch(70), message="meanwhile").version)
            appended.append(other.append(batch(71), message="meanwhile").version)

    expected = keys(store.snapshot(6)) + [(70, i) for i in range(10)] + [(71, i) for i in range(10)]
    result = store.compact(progress=progress)
    assert appended == [7, 8]
    assert result.commit is not None and result.commit.version == 9
    assert result.source == 6
    assert keys(store.snapshot()) == expected
    assert store.snapshot().chunks()[-2:] == store.snapshot(8).chunks()[-2:]  # kept as they were
    assert store.verify(deep=True).ok


def test_compact_conflicts_with_a_rollback_meanwhile(backend: Backend) -> None:
    store = make(backend, appends=6)
    other = reopen(backend)
    chunks_before = {f.key for f in store.storage.list("chunks/")}

    def progress(stage: str, done: int, total: int) -> None:
        if other.version == 6:
            other.rollback(2)

    with pytest.raises(ConflictError, match="compact again"):
        store.compact(progress=progress)
    assert store.version == 7
    assert {f.key for f in store.storage.list("chunks/")} == chunks_before  # new ones deleted


# -- verify ------------------------------------------------------------------------------------


def test_verify_finds_damage(backend: Backend) -> None:
    store = make(backend, appends=4)
    storage = store.storage
    assert store.verify(deep=True).ok
    chunks = store.snapshot().chunks()
    storage.write("chunks/ffffffffffffffffffffffffffffffff.chunk", b"orphan")

    storage.delete(chunks[0].path)
    data = bytearray(storage.read(chunks[1].path))
    data[-20] ^= 0xFF  # the footer: caught by the tail checksum
    storage.write(chunks[1].path, bytes(data))
    data = bytearray(storage.read(chunks[2].path))
    data[20] ^= 0xFF  # inside a frame: only reading the contents finds it
    storage.write(chunks[2].path, bytes(data))
    storage.write(chunks[3].path, storage.read(chunks[3].path) + b"extra")

    store = reopen(backend)
    quick = store.verify(quick=True)
    assert (quick.level, quick.contents_checked) == ("quick", False)
    bad = {p.key: p.message for p in quick.problems}
    assert set(bad) == {chunks[0].path, chunks[1].path, chunks[3].path}
    assert "missing" in bad[chunks[0].path]
    assert "checksum" in bad[chunks[1].path]
    assert "bytes" in bad[chunks[3].path]
    orphans = [f.key for f in quick.orphans if not f.key.startswith("segments/")]
    assert orphans == ["chunks/ffffffffffffffffffffffffffffffff.chunk"]
    for report in (store.verify(), store.verify(deep=True)):
        assert report.contents_checked
        assert {p.key for p in report.problems} == {c.path for c in chunks}


def test_vacuum_refuses_a_store_with_damaged_metadata(backend: Backend) -> None:
    store = make(backend, appends=3)
    store.rollback(1)
    store.expire(keep_last=1)
    segment = store.snapshot().manifest.segments[0].path
    store.storage.write(segment, b"{}")
    files = {f.key for f in store.storage.list("")}
    with pytest.raises(txstore.CorruptError, match="verify"):
        reopen(backend).vacuum(grace=0)
    assert {f.key for f in store.storage.list("")} == files


def test_verify_checks_refs_and_markers(backend: Backend) -> None:
    store = make(backend, appends=3)
    store.tag("ok", 1)
    store.storage.write("refs/tags/broken.json", b"{not json")
    store.storage.delete("txns/" + hashlib.sha256(b"batch-0").hexdigest() + ".json")
    problems = {p.key for p in store.verify().problems}
    assert "refs/tags/broken.json" in problems
    assert any(k.startswith("txns/") for k in problems)


def test_diff_across_compaction_and_overwrite(tmp_path: Any) -> None:

    store = make(Backend("local", str(tmp_path / "store")), appends=3)
    store.compact()  # version 4: same samples
    assert store.diff(3, 4).num_added == 0 and store.diff(1, 4).num_added == 20
    txn = store.transaction(message="replace everything")
    txn.write(batch(9, 5))
    txn.commit(replace=True)  # version 5
    d = store.diff(3, 5)
    assert [(r.start, r.stop, r.version) for r in d.removed] == [
        (0, 10, 1),
        (10, 20, 2),
        (20, 30, 3),
    ]
    assert [(r.start, r.stop, r.version) for r in d.added] == [(0, 5, 5)]
    with pytest.raises(ConflictError, match="replaced the samples"):
        other = reopen(Backend("local", str(tmp_path / "store")))

        def samples() -> Iterator[dict[str, Any]]:
            yield from batch(10, 2)
            t = other.transaction()
            t.write(batch(11, 1))
            t.commit(replace=True)

        store.append(samples())


class _Hooked(Storage):
    """Delegates to ``inner``; runs ``hook`` once, just before the first write of a key
    under ``prefix``: a deterministic interleaving of two clients."""

    def __init__(self, inner: Storage, prefix: str, hook: Callable[[], None]) -> None:
        self.inner, self.prefix, self.hook = inner, prefix, hook
        self.uri, self.storage_options = inner.uri, inner.storage_options
        self.fired = False

    def _maybe(self, key: str) -> None:
        if key.startswith(self.prefix) and not self.fired:
            self.fired = True
            self.hook()

    def read(self, key: str) -> bytes:
        return self.inner.read(key)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.read_range(key, start, end)

    def write(self, key: str, data: Any) -> None:
        self._maybe(key)
        self.inner.write(key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._maybe(key)
        self.inner.put_if_absent(key, data)

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        return self.inner.read_with_token(key)

    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        self._maybe(key)
        self.inner.compare_and_swap(key, data, token)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> Iterator[FileInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


@pytest.mark.parametrize("kind", ["tag", "lease"])
def test_ref_racing_expire_never_protects_a_version_vacuum_may_take(
    backend: Backend, kind: str
) -> None:
    """expire lists the version after the ref's first check, before the ref is written: the
    check after the write sees it, removes the ref and fails."""
    make(backend, appends=3)
    admin = reopen(backend)
    prefix = "refs/tags/" if kind == "tag" else "refs/leases/"
    hooked = _Hooked(
        open_storage(backend.uri, backend.storage_options),
        prefix,
        lambda: admin.expire(keep_last=1),
    )
    store = txstore.open(hooked)
    with pytest.raises(VersionExpiredError):
        store.tag("late", 1) if kind == "tag" else store.lease(1)
    assert hooked.fired
    assert admin.tags() == {} and admin.leases() == []
    assert 1 in admin.expired_versions()


def test_lease_without_a_store(backend: Backend) -> None:
    """What Snapshot.lease / StreamingDataset use: a storage and a manifest."""
    from txstore.store.lease import lease_version

    store = make(backend, appends=2)
    snap = store.snapshot(1)
    with lease_version(open_storage(backend.uri, backend.storage_options), snap.manifest) as lease:
        assert [(info.version, info.id) for info in store.leases()] == [(1, lease.id)]
        assert store.expire(keep_last=1).expired == [0]
    assert store.leases() == []
