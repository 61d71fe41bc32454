"""``optimize``: convert inputs to a store in one call, in parallel, committed once.

Each worker process takes a contiguous share of the inputs and writes full chunks for a staged
transaction; the partly filled chunk each worker ends with is handed back, and the parent
re-packs those tails into full chunks, so the result's chunks are full whatever the number of
workers. Nothing is visible until the single commit at the end; if ``fn`` fails on an input,
the error names it, every chunk written is deleted and nothing is committed.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from typing import Any

from .errors import InputError, StoreExistsError, StoreNotFoundError
from .progress import Progress
from .snapshot import ChunkReader
from .staging import StagedPart, StagedWriter, Transaction
from .storage import MemoryStorage
from .store import Commit, Store, create, open

MODES = (None, "append", "overwrite")


class _Stopped(Exception):
    """Another worker failed: this one stops early (and deletes its chunks)."""


def _samples(
    fn: Callable[[Any], Any],
    inputs: Sequence[Any],
    start: int,
    stop: int,
    counter: Any,
    stop_flag: Any = None,
) -> Iterator[dict[str, Any]]:
    """fn's samples for inputs[start:stop]; fn returns a dict or yields several."""
    unreported = 0
    for index in range(start, stop):
        if stop_flag is not None and stop_flag.value:
            raise _Stopped
        item = inputs[index]
        try:
            out = fn(item)
            produced = [out] if isinstance(out, dict) else list(out)
        except Exception as e:
            raise InputError(
                f"fn failed on input {index} ({item!r:.200}): {type(e).__name__}: {e}", index
            ) from e
        yield from produced
        unreported += len(produced)
        if unreported >= _REPORT_EVERY or index == stop - 1:
            _report(counter, unreported)
            unreported = 0


#: Samples between progress reports: a shared counter costs a lock per update.
_REPORT_EVERY = 512


def _report(counter: Any, n: int) -> None:
    if isinstance(counter, Progress):
        counter.update(n)
    elif counter is not None:
        with counter.get_lock():
            counter.value += n


# What a worker process inherits from the parent at fork (never pickled): the function,
# the inputs, the shared progress counter and the stop flag.
_job: tuple[Callable[[Any], Any], Sequence[Any], Any, Any] | None = None


def _set_job(fn: Callable[[Any], Any], inputs: Sequence[Any], counter: Any, flag: Any) -> None:
    global _job
    _job = (fn, inputs, counter, flag)


def _write_share(handle_json: bytes, start: int, stop: int) -> bytes:
    from .staging import TransactionHandle

    assert _job is not None
    fn, inputs, counter, flag = _job
    writer = StagedWriter(TransactionHandle.from_json(handle_json))
    try:
        writer.write(_samples(fn, inputs, start, stop, counter, flag))
        return writer.finish().to_json()
    except BaseException:
        writer.abort()
        raise


def _target(
    output_dir: str, mode: str | None, storage_options: dict[str, Any] | None, **settings: Any
) -> tuple[Store, bool]:
    """The store to write, and whether the commit replaces its content ("overwrite")."""
    if mode not in MODES:
        raise ValueError(f"mode must be None, 'append' or 'overwrite', not {mode!r}")
    try:
        store = open(output_dir, storage_options=storage_options)
    except StoreNotFoundError:
        return create(output_dir, storage_options=storage_options, **settings), False
    if mode is None:
        raise StoreExistsError(
            f"a store exists at {output_dir}: pass mode='append' to add a version to it, or "
            "mode='overwrite' to commit a version that replaces its content (older versions "
            "stay readable)"
        )
    return store, mode == "overwrite"


def _shares(n: int, workers: int) -> list[tuple[int, int]]:
    base, extra = divmod(n, workers)
    bounds, start = [], 0
    for w in range(workers):
        stop = start + base + (1 if w < extra else 0)
        if stop > start:
            bounds.append((start, stop))
        start = stop
    return bounds


def _repack_tails(txn: Transaction, parts: list[StagedPart]) -> list[StagedPart]:
    """Move each part's last, partly filled chunk into full chunks written here."""
    limit = txn.handle.config.chunk_bytes
    tails = [p.chunks[-1] for p in parts if p.chunks and p.chunks[-1].size < limit]
    if len(tails) < 2:
        return parts
    tail_paths = {c.path for c in tails}
    reader = ChunkReader(txn.store.storage)

    def tail_samples() -> Iterator[dict[str, Any]]:
        for chunk in tails:
            fetched = reader.fetch(chunk, -1, None)
            yield from reader.samples(fetched, chunk, -1)

    writer = txn.writer()
    writer.write(tail_samples())
    packed = writer.finish()
    for path in tail_paths:
        txn.store.storage.delete(path)
    trimmed = [
        StagedPart(
            staging_id=p.staging_id,
            chunks=tuple(c for c in p.chunks if c.path not in tail_paths),
            num_samples=p.num_samples
            - sum(c.num_samples for c in p.chunks if c.path in tail_paths),
        )
        for p in parts
    ]
    return [*trimmed, packed]


def optimize(
    fn: Callable[[Any], Any],
    inputs: Iterable[Any],
    output_dir: str,
    *,
    num_workers: int = 1,
    chunk_bytes: int | str = "64MB",
    mode: str | None = None,
    compression: str | None = "zstd",
    storage_options: dict[str, Any] | None = None,
    message: str | None = None,
    txn_id: str | None = None,
    progress: bool = True,
) -> Commit:
    """Apply ``fn`` to every input and commit all the samples as one version of the store at
    ``output_dir`` (LitData's ``optimize``, transactional).

    ``mode``: None creates a store and refuses an existing one; "append" adds a version;
    "overwrite" commits a version holding only these samples (older versions stay).
    """
    items = inputs if isinstance(inputs, Sequence) else list(inputs)
    store, replace = _target(
        output_dir, mode, storage_options, chunk_bytes=chunk_bytes, compression=compression
    )
    txn = Transaction(store, message=message or f"optimize {len(items):,} inputs", txn_id=txn_id)
    report = Progress("optimize", None, enabled=progress)
    try:
        if num_workers <= 1:
            txn.write(_samples(fn, items, 0, len(items), report))
        else:
            if isinstance(store.storage, MemoryStorage):
                raise ValueError("a memory store lives in one process: use num_workers=1")
            for part in _run_workers(txn, fn, items, num_workers, report):
                txn.add(part)
            parts = _repack_tails(txn, list(txn._parts))
            txn._parts[:] = parts
        operation = "overwrite" if replace else "append"
        return txn.commit(replace=replace, operation=operation)
    except BaseException:
        if txn.result is None:
            txn.abort()
        raise
    finally:
        report.close()


def _run_workers(
    txn: Transaction,
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    num_workers: int,
    report: Progress,
) -> list[StagedPart]:
    ctx = multiprocessing.get_context("fork")  # fn and inputs are inherited, not pickled
    counter, stop_flag = ctx.Value("q", 0), ctx.Value("b", 0, lock=False)  # a flag needs none
    shares = _shares(len(items), num_workers)
    handle = txn.handle.to_json()
    with ProcessPoolExecutor(
        max(1, len(shares)),
        mp_context=ctx,
        initializer=_set_job,
        initargs=(fn, items, counter, stop_flag),
    ) as pool:
        futures: list[Future[bytes]] = [pool.submit(_write_share, handle, a, b) for a, b in shares]
        pending: set[Future[bytes]] = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
            report.update(counter.value - report.done)
            if any(f.exception() is not None for f in done):
                stop_flag.value = 1  # the others stop at their next input
    errors = [f.exception() for f in futures if f.exception() is not None]
    parts = [StagedPart.from_json(f.result()) for f in futures if f.exception() is None]
    if errors:
        txn._parts.extend(parts)  # so that the caller's abort deletes their chunks
        raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])  # type: ignore[misc]
    return parts


__all__ = ["InputError", "optimize"]
