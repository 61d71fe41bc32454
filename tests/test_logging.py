"""The ``txstore`` logger: what a commit that retries or rebases says, what vacuum deletes,
what a reader fetches; and ``Commit.attempts``. Real stores, real racing writers."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import txstore
from txstore.storage import FileInfo, Storage, open_storage
from txstore.storage.base import Data
from txstore.store import snapshot as snapshot_module

from .conftest import Backend


def batch(tag: int, n: int = 10) -> list[dict[str, Any]]:
    return [{"tag": tag, "i": i, "pad": bytes(100)} for i in range(n)]


class RacedStorage(Storage):
    """A store's storage on which another writer commits first, once: right before this
    writer's first try at creating a version. As object storage, it lets writers race
    rather than queue (no writer lock), so the race is decided by put-if-absent alone."""

    def __init__(self, inner: Storage, rival: Callable[[], object]) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.storage_options = inner.storage_options
        self.rival: Callable[[], object] | None = rival

    def put_if_absent(self, key: str, data: bytes) -> None:
        if self.rival is not None and key.startswith("versions/index.v"):
            rival, self.rival = self.rival, None
            rival()
        self.inner.put_if_absent(key, data)

    def read(self, key: str) -> bytes:
        return self.inner.read(key)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.read_range(key, start, end)

    def write(self, key: str, data: Data) -> None:
        self.inner.write(key, data)

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        return self.inner.read_with_token(key)

    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        self.inner.compare_and_swap(key, data, token)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> Iterator[FileInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def writer_lock(self) -> Any:
        return contextlib.nullcontext()


def messages(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(logger)]


def test_the_logger_is_silent_unless_configured() -> None:
    root = logging.getLogger("txstore")
    assert any(isinstance(h, logging.NullHandler) for h in root.handlers)
    # Nothing of its own prints: records go up to whatever the application configures.
    assert root.propagate and root.level == logging.NOTSET


def test_a_commit_that_loses_the_race_retries_rebases_and_counts_its_attempts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "store")
    txstore.create(path, chunk_bytes=4096)
    rival = txstore.open(path)  # another writer, on its own handle of the same store
    rival_commits: list[txstore.Commit] = []
    store = txstore.open(
        RacedStorage(
            open_storage(path),
            lambda: rival_commits.append(rival.append(batch(1), message="rival")),
        )
    )
    caplog.set_level(logging.DEBUG, logger="txstore")

    ours = store.append(batch(2), message="ours")

    assert [c.version for c in rival_commits] == [1]
    assert rival_commits[0].attempts == 1
    assert (ours.version, ours.parent, ours.attempts) == (2, 1, 2)
    said = messages(caplog, "txstore.txn")
    assert any(
        "attempt 1 of" in m and "version 1 was committed by another writer" in m for m in said
    ), said
    assert any("attempt 2 of" in m and "rebasing onto version 1" in m for m in said), said
    assert any("append begun at version 0" in m and "over version 1 (append)" in m for m in said)
    assert any("committed version 2 (append)" in m and "in 2 attempt(s)" in m for m in said)
    # Both batches landed, the rival's first.
    assert [s["tag"] for s in txstore.open(path).snapshot()] == [1] * 10 + [2] * 10


def test_a_transaction_rebased_over_a_commit_made_meanwhile(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "store")
    first = txstore.create(path, chunk_bytes=4096)
    second = txstore.open(path)
    assert first.append(batch(0)).attempts == 1
    caplog.set_level(logging.INFO, logger="txstore")

    txn = first.transaction(message="staged")
    txn.write(batch(1))
    meanwhile = second.append(batch(2), message="meanwhile")
    committed = txn.commit()

    assert (meanwhile.version, committed.version, committed.parent) == (2, 3, 2)
    # The loop read the latest afresh: one try, on top of what landed meanwhile.
    assert committed.attempts == 1
    said = messages(caplog, "txstore")
    assert any(
        "append begun at version 1" in m and "rebased over version 2 (append)" in m for m in said
    ), said
    assert not any("another writer" in m for m in said)


def test_attempts_of_a_repeated_txn_and_of_history_entries(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "store"))
    made = store.append(batch(0), txn_id="once")
    again = store.append(batch(0), txn_id="once")
    assert (made.attempts, again.attempts) == (1, 0)  # the second returned the first, untried
    assert again.version == made.version
    entry = store.log()[0]
    assert entry.attempts is None  # the history does not record it
    assert entry == made  # attempts is no part of a commit's identity


def test_vacuum_logs_the_keys_it_deletes_and_they_are_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = txstore.create(str(tmp_path / "store"), chunk_bytes=4096, block_bytes=1024)
    for v in range(6):
        store.append(batch(v))
    store.compact()  # the small chunks now only expired versions need
    store.expire(keep_last=1)
    before = {f.key: f.size for f in store.storage.list("")}
    caplog.set_level(logging.DEBUG, logger="txstore")

    dry = store.vacuum(grace=0, dry_run=True)
    would = [
        found.group(1)
        for m in messages(caplog, "txstore.store.maintenance")
        if (found := re.fullmatch(r"vacuum would delete (\S+) \(\d+ bytes\)", m))
    ]
    assert {f.key for f in store.storage.list("")} == set(before)  # nothing deleted
    caplog.clear()

    store.vacuum(grace=0)
    lines = messages(caplog, "txstore.store.maintenance")
    deleted = {}
    for m in lines:
        found = re.fullmatch(r"vacuum deleted (\S+) \((\d+) bytes\)", m)
        if found:
            deleted[found.group(1)] = int(found.group(2))
    after = {f.key for f in store.storage.list("")}
    assert deleted, lines
    assert set(deleted) == set(before) - after  # exactly what went, each with its size
    assert all(before[k] == size for k, size in deleted.items())
    assert sorted(would) == sorted(deleted) and len(dry.files) == len(deleted)
    assert any(k.startswith("chunks/") for k in deleted)
    summary = f"deleted {len(deleted)} files ({sum(deleted.values())} bytes)"
    assert any(summary in m for m in lines), lines
    assert list(store.snapshot()) == list(store.snapshot())  # the kept version still reads


def test_a_reader_logs_what_it_fetches_per_read_not_per_sample(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "store")
    store = txstore.create(path, chunk_bytes=8192, block_bytes=2048)
    store.append([{"i": i, "pad": bytes(200)} for i in range(300)])
    sizes = {c.path: c.size for c in store.snapshot().chunk_refs()}
    assert len(sizes) > 1
    caplog.set_level(logging.DEBUG, logger="txstore.store.snapshot")

    snap = txstore.open(path).snapshot()
    assert snap[7]["i"] == 7
    samples = list(snap)
    assert len(samples) == 300

    pattern = re.compile(r"reading (\S+) bytes (\d+)-(\d+) \((\d+) bytes, (.+)\)")
    reads = [pattern.fullmatch(m) for m in messages(caplog, "txstore.store.snapshot")]
    assert reads and all(reads), messages(caplog, "txstore.store.snapshot")
    for got in reads:
        assert got is not None
        uri, _, key = got.group(1).rpartition("/chunks/")
        start, end = int(got.group(2)), int(got.group(3))
        assert uri == snap.uri and f"chunks/{key}" in sizes
        assert 0 <= start < end <= sizes[f"chunks/{key}"] and end - start == int(got.group(4))
    what = [got.group(5) for got in reads if got is not None]
    assert "footer" in what and any("one sample" in w for w in what)
    assert what.count("whole file") == len(sizes)  # iterating reads each chunk once, whole
    assert len(reads) < len(samples) / 10


def _footers_read(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The chunk files whose footers the reader fetched, as the DEBUG lines say."""
    pattern = re.compile(r"reading \S+/(chunks/\S+) bytes \d+-\d+ \(\d+ bytes, footer\)")
    found = [pattern.fullmatch(m) for m in messages(caplog, "txstore.store.snapshot")]
    return [got.group(1) for got in found if got is not None]


def _footer_threads_done() -> None:
    for thread in threading.enumerate():
        if thread.name == "txstore-footers":
            thread.join(30)
            assert not thread.is_alive()


@pytest.mark.s3
def test_a_random_reader_reads_the_other_footers_ahead_unless_each_is_a_request(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    store = txstore.create(backend.uri, **backend.kwargs(), chunk_bytes=8192, block_bytes=2048)
    store.append([{"i": i, "pad": bytes(200)} for i in range(300)])
    paths = [c.path for c in store.snapshot().chunk_refs()]
    assert len(paths) > 2
    caplog.set_level(logging.DEBUG, logger="txstore.store.snapshot")

    snap = txstore.open(backend.uri, **backend.kwargs()).snapshot()
    assert snap[0]["i"] == 0
    _footer_threads_done()
    if backend.name == "s3":  # a request per footer: only the chunk read
        assert _footers_read(caplog) == paths[:1]
    else:
        assert sorted(_footers_read(caplog)) == sorted(paths)

    caplog.clear()  # the last chunk's first sample: its block, and its footer only on S3
    assert snap[len(snap) - 1]["i"] == len(snap) - 1
    assert _footers_read(caplog) == (paths[-1:] if backend.name == "s3" else [])
    assert any("one sample" in m for m in messages(caplog, "txstore.store.snapshot"))


def test_footers_are_read_ahead_once_and_not_for_a_snapshot_of_many_chunks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "store")
    store = txstore.create(path, chunk_bytes=8192, block_bytes=2048)
    store.append([{"i": i, "pad": bytes(200)} for i in range(300)])
    count = len(store.snapshot().chunk_refs())
    caplog.set_level(logging.DEBUG, logger="txstore.store.snapshot")

    snap = txstore.open(path).snapshot()
    for view, i in ((snap, 0), (snap.zero_copy(), 5), (snap, 299)):
        assert view[i]["i"] == i  # views of one version share its reader
    _footer_threads_done()
    assert len(_footers_read(caplog)) == count  # each footer read once

    monkeypatch.setattr(snapshot_module, "FOOTERS_AHEAD_CHUNKS", count - 1)
    caplog.clear()
    snap = txstore.open(path).snapshot()
    assert snap[0]["i"] == 0
    _footer_threads_done()
    assert len(_footers_read(caplog)) == 1

    # Footers of more files than the reader keeps: it stops when its cache is full.
    monkeypatch.setattr(snapshot_module, "FOOTERS_AHEAD_CHUNKS", count)
    monkeypatch.setattr(snapshot_module, "_LAYOUT_CACHE", 3)
    caplog.clear()
    snap = txstore.open(path).snapshot()
    assert snap[0]["i"] == 0
    _footer_threads_done()
    assert len(_footers_read(caplog)) == 3


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_damaged_footer_read_ahead_is_reported_by_the_sample_that_needs_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    store = txstore.create(str(path), chunk_bytes=8192, block_bytes=2048)
    store.append([{"i": i, "pad": bytes(200)} for i in range(300)])
    last = store.snapshot().chunk_refs()[-1]
    damaged = path / last.path
    data = bytearray(damaged.read_bytes())
    data[last.footer_offset + 3] ^= 0xFF
    damaged.write_bytes(bytes(data))

    snap = txstore.open(str(path)).snapshot()
    assert snap[0]["i"] == 0  # the thread reading ahead meets the damage and says nothing
    _footer_threads_done()
    with pytest.raises(txstore.ChecksumError, match=last.path):
        snap[len(snap) - 1]


def test_a_quiet_reader_logs_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = str(tmp_path / "store")
    txstore.create(path).append(batch(0))
    caplog.set_level(logging.INFO, logger="txstore")
    assert len(list(txstore.open(path).snapshot())) == 10
    assert messages(caplog, "txstore.store.snapshot") == []
