"""Chunks are stored while they are built: what reaches storage early, and what is left when
the writer stops partway (its source fails, its storage fails, it is dropped, its process
exits)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import txstore
from txstore.errors import EncodeError
from txstore.storage import open_storage
from txstore.storage.local import TEMP_PREFIX
from txstore.store.writer import MAX_PENDING_UPLOADS, STREAM_BYTES

from .conftest import Backend
from .faults import FaultyStorage, InjectedFault

BLOB = 64 * 1024  # samples' blobs repeat 8 bytes: stores here keep them raw (compression=None)
#: Enough samples for several hand-offs, far fewer than the default 64 MiB chunk holds.
PART = 6 * STREAM_BYTES // BLOB


def _samples(count: int, then: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
    for i in range(count):
        yield {"i": i, "blob": i.to_bytes(8, "little") * (BLOB // 8)}
    if then is not None:
        then()


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(f"{TEMP_PREFIX}*")]


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll until ``condition`` holds: an upload thread does the work, at its own pace."""
    deadline = time.monotonic() + 60
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting after 60 s for {what}")
        time.sleep(0.01)


def test_a_chunk_reaches_storage_while_it_is_built(tmp_path: Path) -> None:
    """A 64 MiB chunk's first megabytes are on disk before its samples have all been taken."""
    root = tmp_path / "s"
    store = txstore.create(str(root), compression=None)
    seen: list[int] = []

    def check() -> None:
        def written() -> int:
            return sum(p.stat().st_size for p in _temp_files(root))

        _wait_for(lambda: written() >= 2 * STREAM_BYTES, "the chunk's first bytes")
        seen.append(written())

    commit = store.append(_samples(PART, then=check))
    assert commit.num_samples == PART
    assert seen and len(store.snapshot().chunks()) == 1  # it was the chunk being built
    assert store.snapshot()[PART - 1]["i"] == PART - 1
    assert not _temp_files(root)


def test_a_source_failing_mid_chunk_leaves_no_file(backend: Backend, tmp_path: Path) -> None:
    store = txstore.create(backend.uri, compression=None, **backend.kwargs())
    store.append(_samples(3))

    def fail() -> None:
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError, match="the source failed"):
        store.append(_samples(PART, then=fail))
    assert store.version == 1 and len(store.snapshot()) == 3
    (kept,) = store.snapshot().chunks()
    assert [info.key for info in store.storage.list("chunks/")] == [kept.path]
    if backend.name == "local":
        assert not _temp_files(Path(backend.uri))


def test_a_storage_failure_mid_chunk_stops_the_append_before_the_chunk_ends(
    backend: Backend,
) -> None:
    """The chunk's store fails as it starts: the writer says so at its next hand-off, not
    after encoding the rest of a 64 MiB chunk, and nothing is committed."""
    txstore.create(backend.uri, compression=None, **backend.kwargs())
    storage = FaultyStorage(
        open_storage(backend.uri, backend.storage_options), fail_at=1, only=frozenset({"write"})
    )
    store = txstore.open(storage)
    taken = 0

    def counted() -> Iterator[dict[str, Any]]:
        nonlocal taken
        for sample in _samples(100 * PART):  # 600 MiB if it were all taken
            taken += 1
            yield sample

    with pytest.raises(InjectedFault):
        store.append(counted())
    assert taken < 16 * STREAM_BYTES // BLOB  # a quarter of what the chunk holds
    assert store.version == 0
    assert list(store.storage.list("chunks/")) == []


def test_a_dropped_writer_removes_its_partial_chunk(tmp_path: Path) -> None:
    """A staged writer dropped without ``finish`` or ``abort``: the thread storing its chunk
    stops and deletes the temporary file, rather than wait forever for the rest."""
    root = tmp_path / "s"
    store = txstore.create(str(root), compression=None)
    txn = store.transaction()
    writer = txn.writer()
    writer.write(_samples(PART))
    _wait_for(lambda: bool(_temp_files(root)), "the partial chunk")
    del writer
    gc.collect()
    _wait_for(lambda: not _temp_files(root), "the partial chunk to go")
    assert store.version == 0


CHILD = """
import sys
import txstore
store = txstore.create(sys.argv[1], compression=None)
writer = store.transaction().writer()
writer.write({"i": i, "blob": bytes(65536)} for i in range(int(sys.argv[2])))
GLOBAL = writer  # alive until the interpreter exits, never finished
import pathlib, time
deadline = time.monotonic() + 60
while not list(pathlib.Path(sys.argv[1]).rglob(".tmp.*")) and time.monotonic() < deadline:
    time.sleep(0.01)  # the chunk's store has begun
"""


def test_a_process_exiting_mid_chunk_exits_and_its_partial_chunk_is_vacuumed(
    tmp_path: Path,
) -> None:
    """The thread storing an unfinished chunk does not hold the interpreter's exit; what it
    wrote is a temp file, as after a crash, which ``vacuum`` deletes."""
    root = tmp_path / "s"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), str(PART)],
        timeout=120,  # a thread waiting for the rest of the chunk would hang the exit
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    store = txstore.open(str(root))
    assert store.version == 0
    left = _temp_files(root)
    assert left
    report = store.vacuum(grace=0)
    assert sorted(f.key.rpartition("/")[2] for f in report.files) == sorted(p.name for p in left)
    assert not _temp_files(root)


def test_streamed_chunks_hold_every_sample_after_a_refusal_mid_chunk(backend: Backend) -> None:
    """Several chunks, each stored while built; a sample refused partway through one, and the
    writer goes on: every sample reads back with its own content, in order."""
    store = txstore.create(
        backend.uri, chunk_bytes=4 * STREAM_BYTES, compression=None, **backend.kwargs()
    )
    count = 5 * PART  # about 7 chunks
    bad_at = 2 * PART + 7

    def source() -> Iterator[dict[str, Any]]:
        for i in range(count):
            yield {"i": 2**64} if i == bad_at else {"i": i, "blob": os.urandom(8) * (BLOB // 8)}

    with store.transaction() as txn:
        writer = txn.writer()
        samples = source()
        with pytest.raises(EncodeError, match=f"sample {bad_at}, key 'i'"):
            writer.write(samples)
        writer.write(samples)
        txn.add(writer.finish())
    snapshot = store.snapshot()
    assert len(snapshot.chunks()) >= 6
    ids = [sample["i"] for sample in snapshot]
    assert ids == [i for i in range(count) if i != bad_at]
    for sample in snapshot:
        blob = sample["blob"]
        assert len(blob) == BLOB and blob == blob[:8] * (BLOB // 8)
    assert len({bytes(s["blob"][:8]) for s in snapshot}) == len(ids)  # each its own content


def test_a_transaction_left_by_an_exception_aborts_its_open_writers(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = txstore.create(str(root), compression=None)
    with pytest.raises(RuntimeError, match="the job failed"), store.transaction() as txn:
        writer = txn.writer()
        writer.write(_samples(PART))  # mid-chunk: its store has begun
        _wait_for(lambda: bool(_temp_files(root)), "the partial chunk")
        raise RuntimeError("the job failed")
    assert writer.closed
    assert not _temp_files(root)
    assert list(store.storage.list("chunks/")) == []
    assert store.version == 0


class _ThreadsOfWrites(FaultyStorage):
    """Records the thread each ``write`` runs on (the thread objects: idents are reused)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.threads: list[threading.Thread] = []

    def write(self, key: str, data: Any) -> None:
        self.threads.append(threading.current_thread())
        super().write(key, data)


def test_chunks_are_stored_by_a_few_reused_threads(tmp_path: Path) -> None:
    storage = _ThreadsOfWrites(open_storage(str(tmp_path / "s")))
    store = txstore.create(storage, chunk_bytes=4096, compression=None)
    store.append({"i": i, "blob": bytes(1000)} for i in range(200))
    chunks = store.snapshot().chunks()
    assert len(chunks) >= 40
    uploads = [t for t in storage.threads if t is not threading.main_thread()]
    assert len(uploads) >= len(chunks)  # every chunk stored off the caller's thread
    assert len(set(uploads)) <= MAX_PENDING_UPLOADS + 1
    assert sorted(s["i"] for s in store.snapshot()) == list(range(200))
