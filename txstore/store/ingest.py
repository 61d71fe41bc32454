"""``optimize``: convert inputs to a store in one call, in parallel, committed once.

Each worker process takes a contiguous share of the inputs and writes full chunks for a staged
transaction; the partly filled chunk each worker ends with is handed back, and the parent
re-packs adjacent ones less than half full (workers of less than a chunk each) into full
chunks. Samples keep the inputs' order, so a tail is never moved past the next worker's
chunks: a worker's tail before another's full chunks stays as written (``compact`` merges
such chunks later; re-packing fuller ones would rewrite up to a chunk per worker). Nothing is
visible until the single commit at the end, and a new store is made only then; if ``fn`` fails
on an input, the error names it, every chunk written is deleted and nothing is committed.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from itertools import groupby
from typing import Any

from ..errors import (
    AlreadyExistsError,
    CommitStateUnknownError,
    EncodeError,
    InputError,
    StoreExistsError,
    StoreNotFoundError,
    TxstoreError,
)
from ..format.columnar import is_columns
from ..format.manifest import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_COMPRESSION_LEVEL,
    ChunkRef,
    StoreConfig,
)
from ..format.units import parse_size
from ..storage import Storage, open_storage
from .core import Commit, Store, create
from .core import open as open_store
from .forkpool import FORK, fork_pool, job
from .progress import Progress, ProgressArg, Stage
from .snapshot import ChunkReader
from .staging import StagedPart, StagedWriter, TransactionHandle, check_part

MODES = (None, "append", "overwrite")


class _Stopped(Exception):
    """Another worker failed: this one stops early (and deletes its chunks)."""


#: What fn gave for one input: its samples and tables, and how many of them are tables.
_Output = tuple[list[Any], int]


#: Set (True) on a function ``optimize`` maps that may be called for the next input, on
#: another thread, while the writer takes the samples of this one: it keeps no state between
#: calls and never changes what it returned. The importers' readers are, and their reading
#: (Arrow's Parquet decoding) lets go of the GIL, so the two overlap.
READS_AHEAD = "_txstore_reads_ahead"


def _reads_ahead(fn: Callable[[Any], Any]) -> bool:
    return getattr(fn, READS_AHEAD, False) is True


class _Samples:
    """fn's samples for inputs[start:stop] (fn returns a dict or an iterable of dicts), and
    which input the sample taken last came from, to name it when it cannot be encoded."""

    def __init__(
        self,
        fn: Callable[[Any], Any],
        inputs: Sequence[Any],
        start: int,
        stop: int,
        counter: Any,
        stop_flag: Any = None,
    ) -> None:
        self.fn, self.inputs, self.start, self.stop = fn, inputs, start, stop
        self.counter, self.stop_flag = counter, stop_flag
        self.index = -1  # the input whose samples are being taken
        self.first = 0  # how many samples were taken before that input's

    def runs(self) -> Iterator[Any]:
        """The samples as ``StagedWriter.write`` takes them, in order: each table alone, and
        each stretch of samples (of one input or of several in a row) as one iterator.
        Nothing of an input is taken before the writer has added what came before it: fn
        may reuse its buffers (one marked ``READS_AHEAD`` is called for the next input
        meanwhile, and promises not to)."""
        outputs = self._outputs()
        held: list[_Output] = []  # an input's output, taken to find it holds a table

        def samples(first: list[Any]) -> Iterator[Any]:
            yield from first
            for output in outputs:
                if output[1]:
                    held.append(output)
                    return
                yield from output[0]

        for produced, tables in _chain_held(held, outputs):
            if not tables:
                yield samples(produced)
                continue
            # Tables alone; samples between them (a list fn returned) as a list.
            stretch: list[Any] = []
            for p in produced:
                if type(p) is not dict and is_columns(p):
                    if stretch:
                        yield stretch
                        stretch = []
                    yield p
                else:
                    stretch.append(p)
            if stretch:
                yield stretch

    def _outputs(self) -> Iterator[_Output]:
        """fn's output for each input in turn, counted once the writer has taken it."""
        taken = 0
        fn, inputs, stop, flag = self.fn, self.inputs, self.stop, self.stop_flag
        # Progress counts inputs (their number is the total known up front). A shared
        # counter is told in batches, by count for fast inputs and by time for slow ones;
        # this process's own progress, input by input.
        every = 1 if isinstance(self.counter, Stage) else _REPORT_EVERY
        unreported, reported_at = 0, time.monotonic()
        ahead = _reads_ahead(fn) and stop - self.start > 1
        pool = ThreadPoolExecutor(1, thread_name_prefix="txstore-read-ahead") if ahead else None
        try:
            next_output = (
                pool.submit(self._call, fn, inputs[self.start], self.start) if pool else None
            )
            for index in range(self.start, stop):
                if flag is not None and flag.value:
                    raise _Stopped
                if pool is None or next_output is None:
                    output = self._call(fn, inputs[index], index)
                else:
                    output = next_output.result()
                    if index + 1 < stop:  # read on while the writer takes this one
                        next_output = pool.submit(self._call, fn, inputs[index + 1], index + 1)
                self.index, self.first = index, taken
                yield output
                produced, tables = output
                # A table (or data frame) fn returned holds as many samples as it has rows.
                if tables:
                    taken += sum(len(p) if is_columns(p) else 1 for p in produced)
                else:
                    taken += len(produced)
                unreported += 1
                if (
                    unreported >= every
                    or index == stop - 1
                    or time.monotonic() - reported_at >= _REPORT_SECONDS
                ):
                    _report(self.counter, unreported)
                    unreported, reported_at = 0, time.monotonic()
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _call(fn: Callable[[Any], Any], item: Any, index: int) -> _Output:
        """fn's samples and tables for one input, and how many of them are tables."""
        try:
            out = fn(item)
            if isinstance(out, dict):
                return [out], 0
            if is_columns(out):
                return [out], 1
            if isinstance(out, Iterable) and not isinstance(out, str | bytes | bytearray):
                produced = list(out)  # a generator's own errors are fn's: named below
                tables = sum(type(p) is not dict and is_columns(p) for p in produced)
                return produced, tables
        except EncodeError as e:  # what fn made of the input cannot be stored (an importer's)
            raise EncodeError(f"input {index} ({item!r:.200}): {e}", index) from e
        except Exception as e:
            raise InputError(
                f"fn failed on input {index} ({item!r:.200}): {type(e).__name__}: {e}", index
            ) from e
        what = "None" if out is None else f"{out!r:.100} (of type {type(out).__name__})"
        raise InputError(
            f"fn returned {what} for input {index} ({item!r:.200}): it must return a dict "
            "(one sample) or an iterable of dicts such as a list or a generator (several)",
            index,
        )

    def named(self, error: EncodeError) -> EncodeError:
        """``error``, which names a sample by its position in this share, naming the input
        and the sample's place among those fn gave for it instead. The writer encodes each
        sample as it is taken, so the sample refused is one of the current input's."""
        item = self.inputs[self.index]
        text = str(error)
        match = _POSITION.match(text)
        nth = -1 if match is None else int(match.group(1)) - self.first
        if match is None or nth < 0:  # not tied to a sample of this input
            return EncodeError(
                f"while writing input {self.index} ({item!r:.200}): {text}", self.index
            )
        where = f"input {self.index} ({item!r:.200}), its sample {nth}"
        return EncodeError(f"{where}{match.group(2)}{text[match.end() :]}", self.index)


#: The builder's "sample <position in the writer>" prefix.
_POSITION = re.compile(r"sample (\d+)(, |: )")


def _chain_held(held: list[_Output], outputs: Iterator[_Output]) -> Iterator[_Output]:
    """``outputs``, the one ``held`` back by a stretch of samples given first, before the
    next is taken (taking it calls fn)."""
    while True:
        if held:
            yield held.pop()
            continue
        produced = next(outputs, None)
        if produced is None:
            return
        yield produced


def _write(writer: StagedWriter, samples: _Samples) -> StagedPart:
    """Write ``samples`` and finish; an EncodeError names the input the sample came from."""
    try:
        for run in samples.runs():
            writer.write(run)
    except EncodeError as e:
        if e.index is not None or samples.index < 0:
            raise
        raise samples.named(e) from e
    return writer.finish()


#: Inputs, or seconds, between progress reports: a shared counter costs a lock per update.
_REPORT_EVERY = 512
_REPORT_SECONDS = 0.2


def _report(counter: Any, n: int) -> None:
    if isinstance(counter, Stage):
        counter.update(n)
    elif counter is not None:
        with counter.get_lock():
            counter.value += n


# What a worker process inherits from the parent at fork (never pickled): the function,
# the inputs, the shared progress counter and the stop flag.
def _write_share(handle_json: bytes, start: int, stop: int) -> bytes:
    fn, inputs, counter, flag = job()
    writer = StagedWriter(TransactionHandle.from_json(handle_json))
    try:
        return _write(writer, _Samples(fn, inputs, start, stop, counter, flag)).to_json()
    except BaseException:
        writer.abort()
        raise


#: What a folder may hold for a new store to be made in it: chunks (and their temp files) a
#: killed optimize left, unreferenced by any version; and the local backend's lock file.
_LEFTOVER = re.compile(
    r"chunks/(\.tmp\.[0-9a-f]{32}\.)?[0-9a-f]{32}\.(chunk|fields)|\.txstore\.lock"
)


def _target(storage: Storage, mode: str | None, config: StoreConfig) -> Store | None:
    """The store to write, or None when there is none yet (one is made at the commit)."""
    root = storage.local_path
    if root is not None and os.path.lexists(root) and not os.path.isdir(root):
        raise AlreadyExistsError(f"{storage.uri} is a file: output_dir must be a folder")
    try:
        store = open_store(storage)
    except StoreNotFoundError:
        _check_unused(storage)
        return None
    if mode is None and not _left_empty(store, config):
        raise StoreExistsError(
            f"a store exists at {storage.uri}: pass mode='append' to add a version to it, or "
            "mode='overwrite' to commit a version that replaces its content (older versions "
            "stay readable)"
        )
    return store


def _left_empty(store: Store, config: StoreConfig) -> bool:
    """Whether ``store`` is what a run with these settings leaves when the storage fails (or
    the process dies) between making the store and committing to it: version 0 alone."""
    latest = store.snapshot().manifest
    return latest.version == 0 and latest.num_samples == 0 and latest.config == config


def _check_unused(storage: Storage) -> None:
    """Refuse a location that holds files other than a store's, before writing any there
    (``_target`` has refused a file in place of the folder already)."""
    for info in storage.list(""):
        if not _LEFTOVER.fullmatch(info.key):
            raise AlreadyExistsError(
                f"{storage.uri} holds files and no txstore store (such as {info.key!r}): "
                "optimize makes a new store only in a new or empty folder; choose another "
                "output_dir"
            )


def _new_config(chunk_bytes: int | str, compression: str | None) -> StoreConfig:
    """The configuration ``create`` gives a store made with these settings."""
    if compression not in (None, "zstd"):
        raise ValueError(f"unknown compression {compression!r}; use 'zstd' or None")
    return StoreConfig(
        chunk_bytes=parse_size(chunk_bytes),
        block_bytes=DEFAULT_BLOCK_BYTES,
        compression=compression,  # type: ignore[arg-type]
        compression_level=DEFAULT_COMPRESSION_LEVEL,
    )


def _shares(n: int, workers: int) -> list[tuple[int, int]]:
    base, extra = divmod(n, workers)
    bounds, start = [], 0
    for w in range(workers):
        stop = start + base + (1 if w < extra else 0)
        if stop > start:
            bounds.append((start, stop))
        start = stop
    return bounds


def _repack_tails(
    storage: Storage, handle: TransactionHandle, parts: list[StagedPart], own: list[StagedPart]
) -> list[StagedPart]:
    """The parts with each run of two or more adjacent chunks less than half full (workers'
    tails, and a worker's only chunk between them) rewritten into full chunks in its place
    (parts written here are added to ``own``). Samples keep their order: a tail is merged
    only with its neighbours, never moved past another worker's chunks."""
    limit = handle.config.chunk_bytes
    flat = [(k, c) for k, p in enumerate(parts) for c in p.chunks]
    # Each chunk's place: -1 - (its run's first chunk) in a run of 2 or more small chunks,
    # else the number of its part. Consecutive chunks of one place go out together.
    place = [k for k, _ in flat]
    i = 0
    while i < len(flat):
        j = i
        while j < len(flat) and flat[j][1].size < limit // 2:
            j += 1
        if j - i >= 2:
            place[i:j] = [-1 - i] * (j - i)
        i = max(j, i + 1)
    if all(p >= 0 for p in place):
        return parts
    reader = ChunkReader(storage)

    def samples_of(chunks: list[ChunkRef]) -> Iterator[dict[str, Any]]:
        for chunk in chunks:
            fetched = reader.fetch(chunk, -1, None)
            yield from reader.samples(fetched, chunk, -1)

    out: list[StagedPart] = []
    for where, group in groupby(range(len(flat)), key=place.__getitem__):
        chunks = [flat[n][1] for n in group]
        if where >= 0:  # kept as its worker wrote them
            count = sum(c.num_samples for c in chunks)
            out.append(StagedPart(staging_id=parts[where].staging_id, chunks=tuple(chunks),
                                  num_samples=count))  # fmt: skip
            continue
        writer = StagedWriter(handle)
        try:
            writer.write(samples_of(chunks))
            packed = writer.finish()
        except BaseException:
            writer.abort()
            raise
        own.append(packed)
        out.append(packed)
        for c in chunks:
            storage.delete(c.path)
    return out


def optimize(
    fn: Callable[[Any], Any],
    inputs: Iterable[Any],
    output_dir: str,
    *,
    num_workers: int = 1,
    chunk_bytes: int | str = DEFAULT_CHUNK_BYTES,
    mode: str | None = None,
    compression: str | None = "zstd",
    storage_options: dict[str, Any] | None = None,
    message: str | None = None,
    txn_id: str | None = None,
    progress: ProgressArg = True,
    _stage: tuple[str, str] = ("optimize", "inputs"),
) -> Commit:
    """Apply ``fn`` to every input and commit all the samples as one version of the store at
    ``output_dir`` (LitData's ``optimize``, transactional).

    ``fn`` returns a sample (a dict) or several (an iterable of dicts, e.g. a generator, or
    a pyarrow Table or RecordBatch or a pandas DataFrame: a sample per row); inputs may
    differ in which they give.
    ``mode``: None creates a store and refuses an existing one (but for an empty one with
    these settings, as a storage failure mid-call can leave); "append" adds a version;
    "overwrite" commits a version holding only these samples (older versions stay). A new
    store is made only in a new or empty folder, and only when the samples are committed:
    a failed call leaves no store behind, and its rerun starts afresh.
    ``progress``: by default a bar on stderr counting inputs (plain lines when stderr is not
    a terminal); False for none, a callback ``(stage, done, total)``, or a ``txstore.Progress``.
    ``_stage``: the name and unit progress shows (the importers count files, not inputs).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be None, 'append' or 'overwrite', not {mode!r}")
    storage = open_storage(output_dir, storage_options)
    # The local folders this call will make, to remove again (if left empty) when it fails.
    root = storage.local_path
    made = (
        []
        if root is None
        else [f for f in (os.path.join(root, "chunks"), root) if not os.path.lexists(f)]
    )
    config = _new_config(chunk_bytes, compression)
    store = _target(storage, mode, config)
    replace = store is not None and mode == "overwrite"
    items = inputs if isinstance(inputs, Sequence) else list(inputs)
    text = message or f"optimize {len(items):,} inputs"
    # An existing store's transaction begins now (an overwrite refuses what lands meanwhile);
    # a new store's only once its samples are written, when the store is made.
    txn = None if store is None else store.transaction(message=text, txn_id=txn_id)
    handle = (
        txn.handle
        if txn is not None
        else TransactionHandle(
            uri=storage.uri,
            storage_options=dict(storage.storage_options),
            config=config,
            staging_id=uuid.uuid4().hex,
        )
    )
    parts: list[StagedPart] = []
    own: list[StagedPart] = []  # written in this process (not read back to be checked)
    report = Progress.of(progress).stage(_stage[0], len(items), _stage[1])
    failed = True
    try:
        if num_workers <= 1:
            writer = StagedWriter(handle)
            try:
                own.append(_write(writer, _Samples(fn, items, 0, len(items), report)))
            except BaseException:
                writer.abort()
                raise
            parts.append(own[-1])
        else:
            if not storage.shared_across_processes:
                raise ValueError("a memory store lives in one process: use num_workers=1")
            _run_workers(handle, parts, fn, items, num_workers, report)
            parts[:] = _repack_tails(storage, handle, parts, own)
        if txn is None:
            store = create(
                storage,
                chunk_bytes=config.chunk_bytes,
                block_bytes=config.block_bytes,
                compression=config.compression,
                compression_level=config.compression_level,
            )
            # The parts were written for this handle: this store, its config.
            txn = store.transaction(message=text, txn_id=txn_id, handle=handle)
        # In order; the workers' parts are read back and checked first, each run of them
        # together.
        for mine, run in groupby(parts, key=lambda part: any(part is p for p in own)):
            if mine:
                for part in run:
                    txn.adopt(part)
            else:
                txn.add(*run)
        result = txn.commit(replace=replace)
        failed = False
        return result
    except CommitStateUnknownError:
        raise  # the commit may have landed: its chunks stay (the error says how to settle it)
    except BaseException:
        if txn is None or txn.result is None:
            _delete(storage, parts)
            for folder in made:  # a folder someone else has filled meanwhile stays
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
        raise
    finally:
        report.close(failed=failed)


def _delete(storage: Storage, parts: list[StagedPart]) -> None:
    """Delete the chunks of parts known not to be committed."""
    for part in parts:
        try:
            check_part(part)  # names data files only: nothing else is ever deleted
        except TxstoreError:
            continue
        for chunk in part.chunks:
            with contextlib.suppress(TxstoreError):
                storage.delete(chunk.path)


def _run_workers(
    handle: TransactionHandle,
    parts: list[StagedPart],
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    num_workers: int,
    report: Stage,
) -> None:
    """Write the inputs' samples in worker processes, adding their parts to ``parts`` (also
    those of the workers that finished when another failed, for the caller to delete)."""
    # fn and inputs are inherited, not pickled; a flag needs no lock
    counter, stop_flag = FORK.Value("q", 0), FORK.Value("b", 0, lock=False)
    shares = _shares(len(items), num_workers)
    handle_json = handle.to_json()
    with fork_pool(len(shares), (fn, items, counter, stop_flag)) as pool:
        futures: list[Future[bytes]] = [
            pool.submit(_write_share, handle_json, a, b) for a, b in shares
        ]
        pending: set[Future[bytes]] = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
            report.update(counter.value - report.done)
            if any(f.exception() is not None for f in done):
                stop_flag.value = 1  # the others stop at their next input
    errors = [f.exception() for f in futures if f.exception() is not None]
    parts += [StagedPart.from_json(f.result()) for f in futures if f.exception() is None]
    if errors:
        raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])  # type: ignore[misc]


__all__ = ["InputError", "optimize"]
