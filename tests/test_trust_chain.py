"""What checks trust: the chain of versions, the retention record, caches, symlinked folders,
and what ``verify`` says it read."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import txstore
from txstore.errors import CorruptError, StorageError, VersionExpiredError
from txstore.format import manifest as fmt
from txstore.format.manifest import ExpiredRange, Retention
from txstore.storage import Storage, open_storage
from txstore.store import Store
from txstore.store.refs import RETENTION_KEY
from txstore.txn import manifest_key

from .conftest import Backend
from .workers import REPO


def _samples(v: int, n: int = 10) -> list[dict[str, Any]]:
    return [{"v": v, "i": i, "pad": os.urandom(100)} for i in range(n)]


def _make(backend: Backend, appends: int) -> Store:
    """A store of ``appends`` appends of 10 samples, an undersized chunk each."""
    store = txstore.create(backend.uri, chunk_bytes=4096, block_bytes=1024, **backend.kwargs())
    for v in range(appends):
        store.append(_samples(v), txn_id=f"batch-{v}")
    return store


def _reopen(backend: Backend) -> Store:
    return Store(open_storage(backend.uri, backend.storage_options))


def _keys(snap: txstore.Snapshot) -> list[tuple[int, int]]:
    return [(s["v"], s["i"]) for s in snap]


def _files(storage: Storage, prefix: str = "") -> set[str]:
    return {f.key for f in storage.list(prefix)}


# -- a hole in the chain of versions ---------------------------------------------------------


@pytest.mark.s3  # put-if-absent decides the commit
def test_an_append_never_commits_into_a_hole(backend: Backend) -> None:
    _make(backend, appends=10)  # versions 0 to 10
    raw = open_storage(backend.uri, backend.storage_options)
    raw.delete(manifest_key(3))
    raw.delete("HEAD")
    versions = _files(raw, "versions/")
    chunks = _files(raw, "chunks/")

    writer = _reopen(backend)
    with pytest.raises(CorruptError, match=r"index\.v3\.json is missing"):
        writer.append(_samples(99), txn_id="late")
    assert _files(raw, "versions/") == versions  # nothing committed
    assert _files(raw, "chunks/") == chunks  # and its chunks cleaned up
    with pytest.raises(CorruptError, match="chain of versions is broken"):
        writer.append(_samples(2), txn_id="batch-2")  # a retry of the lost version's txn
    # A reader sees every acknowledged append past the hole.
    reader = _reopen(backend)
    assert reader.version == 10
    assert _keys(reader.snapshot()) == [(v, i) for v in range(10) for i in range(10)]
    # A stale HEAD below the hole (not missing) is refused too.
    raw.write("HEAD", fmt.encode(fmt.Head(version=2)))
    with pytest.raises(CorruptError, match=r"index\.v3\.json is missing"):
        _reopen(backend).append(_samples(99))
    assert _files(raw, "versions/") == versions

    report = _reopen(backend).verify(quick=True)
    assert report.latest == 10
    assert [p.key for p in report.problems] == [manifest_key(3)]
    assert "chain of versions is broken" in report.problems[0].message
    assert "batch-2" in report.problems[0].message  # its txn marker tells what it held


def test_verify_finds_the_whole_chain_and_what_does_not_line_up(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = _make(backend, appends=10)
    store.tag("t", 6)
    raw = store.storage
    # A hole of two versions: the latest-version search stops below it.
    raw.delete(manifest_key(3))
    raw.delete(manifest_key(4))
    raw.delete("HEAD")
    doc = json.loads(raw.read(manifest_key(8)))
    doc["parent"] = 5
    raw.write(manifest_key(8), json.dumps(doc).encode())
    marker = "txns/" + hashlib.sha256(b"batch-6").hexdigest() + ".json"  # version 7's txn
    doc = json.loads(raw.read(marker))
    doc["commit_id"] = "0" * 32
    raw.write(marker, json.dumps(doc).encode())
    doc = json.loads(raw.read("refs/tags/t.json"))
    doc["commit_id"] = "1" * 32
    raw.write("refs/tags/t.json", json.dumps(doc).encode())

    report = _reopen(backend).verify(quick=True)
    assert report.latest == 10
    problems = {p.key: p.message for p in report.problems}
    assert set(problems) == {
        manifest_key(3),
        manifest_key(4),
        manifest_key(8),
        marker,
        "refs/tags/t.json",
    }
    assert "missing" in problems[manifest_key(3)] and "missing" in problems[manifest_key(4)]
    assert "parent 5" in problems[manifest_key(8)]
    assert "0" * 32 in problems[marker]
    assert "another history" in problems["refs/tags/t.json"]
    # Vacuum sees versions past the one the search found: it deletes nothing.
    files = _files(raw)
    with pytest.raises(CorruptError, match="chain of versions is broken"):
        _reopen(backend).vacuum(grace=0)
    assert _files(raw) == files


# -- a retention record naming the latest version -------------------------------------------


def test_the_latest_tagged_and_leased_versions_never_expire(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = _make(backend, appends=5)  # versions 0 to 5
    store.rollback(1)  # version 6, the latest: version 1's samples only
    store.tag("paper", 3)
    lease = store.lease(4, ttl="1h")
    expected = {v: _keys(store.snapshot(v)) for v in (3, 4, 6)}
    # A record listing every version, the latest too, expired long ago.
    forged = Retention(expired=(ExpiredRange(first=0, last=6, expired_at=time.time() - 1e6),))
    store.storage.write(RETENTION_KEY, fmt.encode(forged))

    report = _reopen(backend).verify(quick=True)
    assert [p.key for p in report.problems] == [RETENTION_KEY]
    assert "latest" in report.problems[0].message

    later = _reopen(backend)
    later.vacuum(grace=0)
    assert _keys(later.snapshot()) == expected[6]
    assert _keys(later.snapshot(6)) == expected[6]
    assert _keys(later.snapshot("paper")) == expected[3]
    assert _keys(later.snapshot(3)) == expected[3]
    assert _keys(later.snapshot(4)) == expected[4]
    assert later.expired_versions() == {0, 1, 2, 5}
    with pytest.raises(VersionExpiredError):
        later.snapshot(5)
    assert later.expire(keep_last=1).expired == []  # all listed already
    assert later.verify(deep=True).problems == report.problems  # nothing else is damaged
    lease.release()


# -- a long-lived Store's caches -------------------------------------------------------------


def test_a_long_lived_store_sees_damage_done_on_disk(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = _make(backend, appends=6)
    store.expire(keep_last=1)  # something for vacuum to delete
    snap = store.snapshot()
    assert len(list(snap)) == 60 and snap[5]["i"] == 5  # every cache filled
    assert store.verify(deep=True).ok
    assert len(snap.manifest.segments) > 1
    segment = snap.manifest.segments[0].path
    chunk = snap.chunk_refs()[-1]  # in another segment
    raw = open_storage(backend.uri)  # another process's doing
    raw.delete(segment)
    data = bytearray(raw.read(chunk.path))
    data[-20] ^= 0xFF  # its footer, rewritten as a new file
    raw.write(chunk.path, bytes(data))
    files = _files(raw)

    for report in (store.verify(quick=True), store.verify(), store.verify(deep=True)):
        bad = {p.key for p in report.problems}
        assert segment in bad
    assert chunk.path in {p.key for p in store.verify(quick=True).problems}
    with pytest.raises(CorruptError, match=segment):
        store.vacuum(grace=0)
    assert _files(raw) == files


# -- a symlinked chunks/ folder -------------------------------------------------------------


def test_a_symlinked_chunks_folder_is_verified_and_vacuumed_as_read(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = _make(backend, appends=4)
    store.rollback(2)  # version 5: versions 3 and 4's chunks only expired versions need
    expected = _keys(store.snapshot())
    kept = {c.path for c in store.snapshot().chunk_refs()}
    gone = {c.path for c in store.snapshot(4).chunk_refs()} - kept
    assert len(gone) == 2
    elsewhere = tmp_path / "other-disk" / "chunks"
    elsewhere.parent.mkdir()
    os.rename(tmp_path / "store" / "chunks", elsewhere)
    os.symlink(elsewhere, tmp_path / "store" / "chunks")
    store = _reopen(backend)
    assert _keys(store.snapshot()) == expected
    report = store.verify()
    assert report.ok, report.problems
    assert report.files == 4
    store.expire(keep_last=1)
    before = set(os.listdir(elsewhere))
    vacuumed = store.vacuum(grace=0)
    assert {f.key for f in vacuumed.files if f.key.startswith("chunks/")} == gone
    assert set(os.listdir(elsewhere)) == before - {k.rpartition("/")[2] for k in gone}
    assert _keys(_reopen(backend).snapshot()) == expected
    assert _reopen(backend).verify(deep=True).ok

    # A link that gives files a second name, or loops, is refused, not listed twice.
    store.append(_samples(9))
    store.expire(keep_last=1)  # garbage for vacuum again
    files = _files(store.storage)
    for link, target in [
        (tmp_path / "store" / "alias", tmp_path / "store" / "segments"),
        (elsewhere / "up", tmp_path / "store"),
        (tmp_path / "store" / "twin", elsewhere),
    ]:
        os.symlink(target, link)
        with pytest.raises(StorageError, match="symlink"):
            _reopen(backend).vacuum(grace=0)
        os.unlink(link)
        assert _files(store.storage) == files


# -- what verify reads ----------------------------------------------------------------------


def _flip_inside_body(storage: Storage, path: str, footer_offset: int) -> None:
    data = bytearray(storage.read(path))
    data[footer_offset // 2] ^= 0x01  # a frame's byte, far from the footer
    storage.write(path, bytes(data))


def test_verify_reads_every_byte_by_default(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = _make(backend, appends=3)
    store.add_fields(lambda s: {"sq": s["i"] * s["i"]}, ["sq"])
    chunks = store.snapshot().chunk_refs()
    _flip_inside_body(store.storage, chunks[0].path, chunks[0].footer_offset)
    field = chunks[1].field_files[0]  # no digest: checked frame by frame
    _flip_inside_body(store.storage, field.path, field.footer_offset)
    damaged = {chunks[0].path, field.path}

    stages: list[str] = []
    report = _reopen(backend).verify(progress=lambda stage, done, total: stages.append(stage))
    assert (report.level, report.contents_checked) == ("contents", True)
    assert {p.key for p in report.problems} == damaged
    assert "reading contents" in stages
    quick = _reopen(backend).verify(quick=True)
    assert quick.ok and (quick.level, quick.contents_checked) == ("quick", False)
    deep = _reopen(backend).verify(deep=True)
    assert deep.level == "deep" and damaged <= {p.key for p in deep.problems}
    with pytest.raises(ValueError):
        store.verify(quick=True, deep=True)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "txstore.cli", "verify", backend.uri, *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    found = cli()
    assert found.returncode == 3, found.stdout + found.stderr
    assert chunks[0].path in found.stdout and field.path in found.stdout
    unread = cli("--quick")
    assert unread.returncode == 0
    assert "no damage found" not in unread.stdout.replace("no damage found in the metadata", "")
    assert "NOT read" in unread.stdout
    doc = json.loads(cli("--quick", "--json").stdout)
    assert (doc["level"], doc["contents_checked"]) == ("quick", False)
    assert cli("--quick", "--deep").returncode == 2
