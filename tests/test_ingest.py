"""optimize (modes, workers, failures, chunk fill) and staged multi-writer transactions."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import txstore
from txstore.errors import ConflictError, StoreExistsError
from txstore.store.ingest import InputError, optimize
from txstore.store.staging import StagedPart, TransactionHandle

from .conftest import Backend
from .workers import REPO


def _two(i: int) -> Iterator[dict[str, Any]]:
    yield {"id": 2 * i, "pad": os.urandom(500)}
    yield {"id": 2 * i + 1, "pad": os.urandom(500)}


def _ids(store: txstore.Store, version: int | None = None) -> list[int]:
    return sorted(s["id"] for s in store.snapshot(version))


@pytest.mark.parametrize("workers", [1, 2])
def test_modes(backend: Backend, workers: int) -> None:
    opts = backend.storage_options
    if backend.name == "memory" and workers > 1:
        with pytest.raises(ValueError, match="one process"):
            optimize(_two, range(3), backend.uri, num_workers=workers, progress=False)
        return
    first = optimize(
        _two,
        range(300),
        backend.uri,
        num_workers=workers,
        storage_options=opts,
        chunk_bytes="16KB",
        progress=False,
    )
    store = txstore.open(backend.uri, **backend.kwargs())
    assert first.version == 1 and _ids(store) == list(range(600))
    with pytest.raises(StoreExistsError, match="mode='append'"):
        optimize(_two, range(3), backend.uri, storage_options=opts, progress=False)
    second = optimize(
        lambda i: {"id": 600 + i},
        range(50),
        backend.uri,
        mode="append",
        num_workers=workers,
        storage_options=opts,
        progress=False,
    )
    assert second.version == 2 and _ids(store) == list(range(650))
    third = optimize(
        lambda i: {"id": -i},
        range(1, 4),
        backend.uri,
        mode="overwrite",
        num_workers=workers,
        storage_options=opts,
        progress=False,
    )
    assert third.operation == "overwrite" and _ids(store) == [-3, -2, -1]
    assert _ids(store, 2) == list(range(650))  # earlier versions stay readable


def test_failure_names_the_input_and_commits_nothing(backend: Backend) -> None:
    workers = 1 if backend.name == "memory" else 2
    txstore.create(backend.uri, **backend.kwargs())
    store = txstore.open(backend.uri, **backend.kwargs())
    before = {f.key for f in store.storage.list("chunks/")}

    def flaky(i: int) -> dict[str, Any]:
        if i == 1234:
            raise ValueError("corrupt image")
        return {"id": i, "pad": os.urandom(300)}

    with pytest.raises(InputError, match=r"input 1234 .*corrupt image") as info:
        optimize(
            flaky,
            range(3000),
            backend.uri,
            mode="append",
            num_workers=workers,
            storage_options=backend.storage_options,
            chunk_bytes="32KB",
            progress=False,
        )
    assert info.value.index == 1234
    assert store.version == 0
    assert {f.key for f in store.storage.list("chunks/")} == before  # nothing left behind


@pytest.mark.parametrize("workers", [1, 2])
def test_inputs_may_give_tables_and_samples_in_any_mix(tmp_path: Path, workers: int) -> None:
    pa = pytest.importorskip("pyarrow")

    def mixed(i: int) -> Any:
        ids = list(range(10 * i, 10 * i + 10))
        if i % 3 == 0:
            return pa.table({"id": ids, "pad": [bytes([i]) * 40_000] * 10})
        if i % 3 == 1:
            return [{"id": k, "pad": bytes([i]) * 40_000} for k in ids]
        return iter([pa.table({"id": ids[:4]}), *({"id": k} for k in ids[4:])])

    out = str(tmp_path / "store")
    optimize(mixed, range(40), out, num_workers=workers, chunk_bytes="256KB", progress=False)
    samples = list(txstore.open(out).snapshot())
    assert [s["id"] for s in samples] == list(range(400))
    for s in samples:
        i = s["id"] // 10
        assert s.get("pad") == (None if i % 3 == 2 else bytes([i]) * 40_000), s["id"]


def test_an_input_is_taken_only_once_what_came_before_is_written(tmp_path: Path) -> None:
    # fn reuses one buffer for every table it returns (Arrow wraps numpy ints without a
    # copy): each must be written before fn is called again, also after samples.
    pa = pytest.importorskip("pyarrow")
    buffer = np.zeros(5, dtype=np.int64)

    def reusing(i: int) -> Any:
        if i % 3 == 0:
            return {"id": 5 * i}
        buffer[:] = np.arange(5 * i, 5 * i + 5)
        return pa.table({"id": pa.array(buffer)})

    out = str(tmp_path / "store")
    optimize(reusing, range(30), out, progress=False)
    want = [k for i in range(30) for k in ([5 * i] if i % 3 == 0 else range(5 * i, 5 * i + 5))]
    assert [s["id"] for s in txstore.open(out).snapshot()] == want


class _Reader:
    """A function that says it may read ahead (as the importers' readers do): it notes the
    thread each input was read on and which inputs it had been asked for by then."""

    _txstore_reads_ahead = True

    def __init__(self, fail_at: int = -1) -> None:
        self.calls: list[tuple[int, bool]] = []
        self.fail_at = fail_at

    def __call__(self, i: int) -> list[dict[str, Any]]:
        self.calls.append((i, threading.current_thread() is threading.main_thread()))
        if i == self.fail_at:
            raise ValueError("unreadable")
        return [{"id": 3 * i + k, "pad": bytes([i % 256]) * 3000} for k in range(3)]


def test_a_function_that_may_read_ahead_is_called_on_another_thread_in_order(
    tmp_path: Path,
) -> None:
    reader = _Reader()
    out = str(tmp_path / "store")
    optimize(reader, range(50), out, chunk_bytes="64KB", progress=False)
    assert [s["id"] for s in txstore.open(out).snapshot()] == list(range(150))
    assert [i for i, _ in reader.calls] == list(range(50))  # each input once, in order
    assert not any(on_main for _, on_main in reader.calls)
    # Any other function is called on the caller's thread only.
    calls: list[bool] = []

    def plain(i: int) -> dict[str, Any]:
        calls.append(threading.current_thread() is threading.main_thread())
        return {"id": i}

    optimize(plain, range(20), str(tmp_path / "plain"), progress=False)
    assert calls == [True] * 20


def test_a_reader_that_fails_ahead_names_its_input_and_commits_nothing(tmp_path: Path) -> None:
    out = str(tmp_path / "store")
    reader = _Reader(fail_at=17)
    with pytest.raises(InputError, match=r"input 17 .*unreadable") as info:
        optimize(reader, range(50), out, chunk_bytes="64KB", progress=False)
    assert info.value.index == 17
    assert not os.path.exists(out)  # a failed call leaves no store behind
    assert max(i for i, _ in reader.calls) <= 18  # read no further than one input ahead


def test_an_input_whose_table_cannot_be_stored_is_an_encode_error_naming_it(
    tmp_path: Path,
) -> None:
    pa = pytest.importorskip("pyarrow")

    def dated(i: int) -> Any:
        kind = pa.timestamp("s") if i == 3 else pa.int64()
        return pa.table({"id": [i], "t": pa.array([i], kind)})

    out = str(tmp_path / "store")
    with pytest.raises(txstore.EncodeError, match=r"input 3 .*column 't'.*timestamp") as info:
        optimize(dated, range(6), out, progress=False)
    assert info.value.index == 3
    assert not os.path.exists(out)  # no store was made


def _pad(i: int) -> dict[str, Any]:
    return {"id": i, "pad": os.urandom(1000)}


def _padded(out: Path, count: int, workers: int, limit: int) -> txstore.Store:
    """A store of ``count`` samples of about 1,010 bytes each, made by ``optimize``."""
    optimize(_pad, range(count), str(out), num_workers=workers, chunk_bytes=limit,
             compression=None, progress=False)  # fmt: skip
    return txstore.open(str(out))


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("count", [2000, 2800])
def test_chunks_are_at_least_half_full_whatever_the_workers(
    tmp_path: Path, workers: int, count: int
) -> None:
    """Adjacent chunks less than half full are re-packed into full ones, and samples keep
    the inputs' order whatever the number of workers (2,000 samples: every share ends in a
    tail under half a chunk; a tail before the next worker's full chunks stays, a re-pack
    there would move its samples past them); a fuller tail is kept as written (2,800 on 2
    workers: two tails of 0.54 chunk)."""
    limit = 64 * 1024
    store = _padded(tmp_path / "s", count, workers, limit)
    sizes = [c.size for c in store.snapshot().chunks()]
    halves = [s < limit // 2 for s in sizes]
    assert not any(a and b for a, b in pairwise(halves)), sizes  # no two small in a row
    assert sum(halves) <= workers, sizes  # at most a tail a worker
    assert len(sizes) <= count * 1010 // limit + workers
    if (count, workers) == (2800, 2):
        assert sum(s < limit for s in sizes) == 2, sizes  # both tails kept, none rewritten
    assert [s["id"] for s in store.snapshot()] == list(range(count))  # in order


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_of_less_than_a_chunk_each_are_re_packed_in_order(
    tmp_path: Path, workers: int
) -> None:
    """Shares smaller than half a chunk: every worker's one chunk is a tail, all adjacent,
    re-packed into full chunks in the inputs' order."""
    limit = 64 * 1024
    count = 30 * workers  # about 30 KB a worker
    snap = _padded(tmp_path / "s", count, workers, limit).snapshot()
    sizes = [c.size for c in snap.chunks()]
    assert len(sizes) == -(-count * 1010 // limit), sizes  # as few as the bytes need
    assert [s["id"] for s in snap] == list(range(count))
    left = {p.name for p in (tmp_path / "s" / "chunks").iterdir()}
    assert left == {c.path.removeprefix("chunks/") for c in snap.chunk_refs()}  # tails gone


WRITER = """
import sys, txstore
from txstore.store.staging import StagedWriter, TransactionHandle
handle = TransactionHandle.from_json(sys.argv[1])
w = StagedWriter(handle)
start = int(sys.argv[2])
w.write({"id": i, "writer": start} for i in range(start, start + 500))
sys.stdout.write(w.finish().to_json().decode())
"""


@pytest.mark.s3  # parts staged by several processes
def test_transaction_from_several_processes(shared_backend: Backend) -> None:
    store = txstore.create(shared_backend.uri, chunk_bytes=4096, **shared_backend.kwargs())
    store.append({"id": -1 - i} for i in range(10))
    with store.transaction(message="crawl 2026-11-29") as txn:
        handle = txn.handle.to_json().decode()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, handle, str(start)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            for start in (0, 500, 1000)
        ]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs)
        store.append([{"id": 5000}])  # someone else commits meanwhile: rebased over
        for out in outs:
            txn.add(StagedPart.from_json(out))
        assert store.version == 2  # nothing visible before the commit
    assert txn.result is not None and txn.result.version == 3
    assert txn.result.num_samples == 1500
    assert _ids(store) == [*range(-10, 0), *range(1500), 5000]
    assert store.snapshot(3).manifest.message == "crawl 2026-11-29"


def test_abandoned_transaction_commits_nothing(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "s"))
    with pytest.raises(RuntimeError), store.transaction() as txn:
        txn.write({"id": i} for i in range(100))
        raise RuntimeError("job killed")
    assert store.version == 0
    assert list(store.storage.list("chunks/")) == []
    # A part from another transaction is refused.
    other = store.transaction()
    part = store.transaction().write([{"id": 1}])
    with pytest.raises(txstore.TxstoreError, match="another transaction"):
        other.add(part)


def test_handle_round_trips_as_json(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "s"), chunk_bytes="1MB")
    handle = store.transaction().handle
    assert TransactionHandle.from_json(handle.to_json()) == handle
    assert handle.config.chunk_bytes == 1_000_000


def test_overwrite_racing_a_commit_conflicts(tmp_path: Path) -> None:
    optimize(lambda i: {"id": i}, range(10), str(tmp_path / "s"), progress=False)
    racer = txstore.open(str(tmp_path / "s"))

    def slow(i: int) -> dict[str, Any]:
        if i == 0:
            racer.append([{"id": 99}])
        return {"id": -i}

    with pytest.raises(ConflictError, match="committed meanwhile"):
        optimize(slow, range(5), str(tmp_path / "s"), mode="overwrite", progress=False)
    assert _ids(racer) == [*range(10), 99]


def test_a_writer_process_keeps_one_storage_across_transactions(tmp_path: Path) -> None:
    from txstore.store.staging import StagedWriter

    store = txstore.create(str(tmp_path / "s"))
    other = txstore.create(str(tmp_path / "other"))
    kept = None
    for round_no in range(3):
        with store.transaction() as txn:
            handle = TransactionHandle.from_json(txn.handle.to_json())  # as sent elsewhere
            writer = StagedWriter(handle, storage=kept)
            if kept is not None:
                assert writer.storage is kept
            kept = writer.storage
            writer.write({"id": round_no * 10 + k} for k in range(10))
            txn.add(StagedPart.from_json(writer.finish().to_json()))
    assert _ids(store) == list(range(30))
    with pytest.raises(ValueError, match="handle's store"):
        StagedWriter(handle, storage=other.storage)
    assert store.version == 3 and other.version == 0
    assert not list((tmp_path / "other").glob("chunks/*"))
