"""Add fields to existing samples, or drop them, as new versions without rewriting chunks.

``add_fields`` computes the new values chunk by chunk and writes them to *field files* laid out
like chunks, each column in pieces of its own (docs/format.md §10); the new version's chunk
references name them next to the untouched chunk files. It reads only the fields ``fn`` needs
(``inputs``), and with ``missing_only`` computes only the samples that lack the fields: chunks
whose samples all have them are left as they are, and in a chunk where some do their values are
copied into the new field file. Samples appended while it runs are not left without the
fields: it computes them for the new chunks too and commits on top (it gives up with a
``HistoryChangedError`` only if the history changed otherwise, e.g. a rollback).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import (
    ConflictError,
    EncodeError,
    FieldExistsError,
    FieldNotFoundError,
    RetriesExhaustedError,
)
from ..format import columnar
from ..format import manifest as fmt
from ..format.builder import ChunkBuilder
from ..format.codec import FrameCompressor
from ..format.frames import decode_columns, row_starts
from ..format.manifest import ChunkRef, FieldFile, Manifest, StoreConfig, chunk_files
from ..storage import Storage, open_storage
from ..txn.rules import Rebase
from .context import StoreContext
from .forkpool import fork_pool, job
from .history import Commit
from .progress import QUIET, Progress, Stage
from .snapshot import (
    ChunkReader,
    Fetched,
    Runs,
    Sample,
    Snapshot,
    check_field_list,
    map_threads,
)

_MAX_ROUNDS = 20  # rounds of catching up with concurrent appends before giving up
_WRITERS = 4  # field files stored at once, while the next ones are computed


def _check_names(fields: Iterable[str]) -> tuple[str, ...]:
    check_field_list(fields)
    names = tuple(fields)
    if not names or not all(isinstance(f, str) and f for f in names):
        raise ValueError("fields must be a non-empty list of field names")
    if len(set(names)) != len(names):
        raise ValueError(f"fields has duplicates: {names}")
    return names


#: What ``fn`` gets and returns: a sample and a dict; a block's samples (``batched``) and a
#: list of dicts; a dict of lists (``batch_size``), or an Arrow RecordBatch.
BATCH_FORMATS = ("dict", "arrow")


@dataclass(frozen=True)
class FieldJob:
    """What ``add_fields`` asks of every chunk (crosses into worker processes)."""

    fields: tuple[str, ...]
    inputs: frozenset[str] | None  # None: every field
    batched: bool = False
    batch_size: int | None = None
    batch_format: str = "dict"


def _check_returned(value: dict[str, Any], names: frozenset[str], where: str) -> None:
    extra = set(value) - names
    if extra:
        raise EncodeError(f"{where}: returned fields not asked for: {sorted(extra)}")


def _per_sample(
    fn: Callable[..., Any], samples: list[Sample], job: FieldJob, first: int
) -> list[dict[str, Any]]:
    """``fn`` on each sample, or (``batched``) once on the list."""
    names = frozenset(job.fields)
    values = fn(samples) if job.batched else [fn(sample) for sample in samples]
    if not isinstance(values, list) or len(values) != len(samples):
        raise EncodeError(f"samples {first}..: the function must return one dict per sample")
    for i, new in enumerate(values):
        if not isinstance(new, dict):
            raise EncodeError(f"sample {first + i}: the function returned {type(new).__name__}")
        _check_returned(new, names, f"sample {first + i}")
    return values


def _as_columns(samples: list[Sample], job: FieldJob) -> tuple[list[str], list[list[Any]]]:
    """A batch of samples as columns: the inputs (else every key met), None where absent."""
    if job.inputs is not None:
        names = sorted(job.inputs)
    else:
        names = list(dict.fromkeys(key for sample in samples for key in sample))
    return names, [[sample.get(name) for sample in samples] for name in names]


def _rows(column: Any, name: str, n: int, where: str) -> list[Any]:
    """A returned column as one value per sample (a numpy array's rows copied: the caller
    may reuse its buffer for the next batch)."""
    rows = columnar.column_rows(column)
    if rows is None:
        raise EncodeError(
            f"{where}: field {name!r} came back as a {type(column).__name__}; give a list or "
            "an array of one value per sample"
        )
    if len(rows) != n:
        raise EncodeError(f"{where}: field {name!r} has {len(rows)} values for {n} samples")
    return rows


def _per_batch(
    fn: Callable[..., Any], samples: list[Sample], job: FieldJob, first: int
) -> list[dict[str, Any]]:
    """``fn`` once on ``samples`` as a dict of lists (or an Arrow batch); its columns back
    as a dict per sample."""
    names, columns = _as_columns(samples, job)
    where = f"the batch of samples from {first}"
    if job.batch_format == "arrow":
        from ..format import arrow

        out = fn(arrow.record_batch(names, columns))
        if arrow.is_arrow(out):
            got: dict[str, list[Any]] = {}
            for batch in columnar.as_columns(out, first) or ():
                for name, column in zip(batch.names, batch.columns, strict=True):
                    got.setdefault(name, []).extend(columnar.decoded(column))
            out = got
    else:
        out = fn(dict(zip(names, columns, strict=True)))
    if not isinstance(out, dict):
        raise EncodeError(
            f"{where}: the function returned a {type(out).__name__}; with batch_size it "
            "returns its new fields as a dict of lists (or an Arrow batch, for Arrow input)"
        )
    _check_returned(out, frozenset(job.fields), where)
    rows = {name: _rows(column, name, len(samples), where) for name, column in out.items()}
    return [{name: rows[name][k] for name in rows} for k in range(len(samples))]


def _mask(runs: Runs, n: int) -> bytearray:
    mask = bytearray(n)
    for start, stop in runs:
        mask[start:stop] = b"\x01" * (stop - start)
    return mask


def compute_field_file(
    storage: Storage,
    chunk: ChunkRef,
    version: int,
    config: StoreConfig,
    fn: Callable[..., Any],
    job: FieldJob,
    first: int,
    todo: Runs,
    reader: ChunkReader | None = None,
) -> ChunkBuilder:
    """Compute ``job.fields`` for the samples of ``chunk`` in ``todo`` (runs of local
    indices); the others keep their values of them. All of them as one field file's
    builder, to be stored (``_write``). ``reader``: the store's, whose footers are read
    already (a worker makes its own)."""
    reader = ChunkReader(storage) if reader is None else reader
    names = frozenset(job.fields)
    computed = sum(stop - start for start, stop in todo)
    keeps = computed < chunk.num_samples
    read = None if job.inputs is None else job.inputs | (names if keeps else frozenset())
    batches = job.batch_size is not None and not keeps  # read a column at a time
    fetched = reader.fetch(chunk, version, read, columns=batches)
    # Every column stored apart, in pieces of its own (docs/format.md §10).
    builder = ChunkBuilder(
        block_bytes=config.block_bytes,
        compressor=FrameCompressor(config.compression, config.compression_level),
        apart=True,
    )
    if batches:
        pieces = _batch_columns(reader, fetched, chunk, fn, job, first)
        if len({piece.names for piece in pieces}) == 1:
            builder.add_apart(columnar.ColumnBatch.concat(pieces))
            return builder
        # The batches returned different fields: their values sample by sample.
        for local, row in enumerate(row for piece in pieces for row in _piece_rows(piece)):
            builder.add(row, first + local)
        return builder
    values: list[dict[str, Any] | None] = [None] * chunk.num_samples
    pending: list[tuple[int, Sample]] = []
    compute = _per_batch if job.batch_size is not None else _per_sample
    limit = job.batch_size

    def flush() -> None:
        if not pending:
            return
        where = first + pending[0][0]
        for (local, _), new in zip(
            pending, compute(fn, [s for _, s in pending], job, where), strict=True
        ):
            values[local] = new
        pending.clear()

    inside = _mask(todo, chunk.num_samples)
    samples: Iterator[Sample] = reader.samples(fetched, chunk, version)
    base = reader.layout(chunk_files(chunk)[0], version)
    # The chunk's blocks, where a batched ``fn`` is called once a block.
    starts = base.block_starts if base.has_blocks else [0, chunk.num_samples]
    for number, ends in enumerate(starts[1:]):
        for local in range(starts[number], ends):
            sample = next(samples)
            if not keeps or inside[local]:
                if job.inputs is not None and keeps:
                    sample = {k: v for k, v in sample.items() if k in job.inputs}
                pending.append((local, sample))
                if limit is not None and len(pending) >= limit:
                    flush()
            else:
                values[local] = {k: v for k, v in sample.items() if k in names}
        if limit is None:
            flush()  # one call per block (batched), or per sample as they come
    flush()
    for local, new in enumerate(values):
        assert new is not None
        builder.add(new, first + local)
    return builder


def _write(storage: Storage, builder: ChunkBuilder, job: FieldJob) -> FieldFile:
    built = builder.finish()
    key = f"chunks/{uuid.uuid4().hex}.fields"
    storage.write(key, built)
    ref = FieldFile(
        path=key,
        size=built.size,
        crc32=built.crc32,
        footer_offset=built.footer_offset,
        columns=job.fields,
    )
    return ref


def _batch_columns(
    reader: ChunkReader,
    fetched: Fetched,
    chunk: ChunkRef,
    fn: Callable[..., Any],
    job: FieldJob,
    first: int,
) -> list[columnar.ColumnBatch]:
    """``fn`` over every sample of ``chunk``, ``batch_size`` at a time, read and written a
    column at a time (no dict per sample): the new fields, a batch of columns per call."""
    n = chunk.num_samples
    size = job.batch_size or n
    pieces: list[columnar.ColumnBatch] = []
    if job.batch_format == "arrow":  # the columns decoded into Arrow, not Python values
        from ..format import arrow

        wanted = sorted(job.inputs) if job.inputs is not None else None
        table = arrow.input_table(reader.table(fetched, chunk), wanted)
        for start in range(0, n, size):
            stop = min(n, start + size)
            given = arrow.rows_batch(table, start, stop)
            pieces.append(_call_for_columns(fn, [], [], job, first + start, stop - start, given))
        return pieces
    parts = [(layout, buf, keep) for _, layout, buf, keep in fetched.parts]
    row_starts([layout for layout, _, _ in parts])  # CorruptError unless aligned
    checked = tuple(src.path in fetched.verified for src, _, _, _ in fetched.parts)
    found = decode_columns(parts, reader.decoder, checked, fetched.pieces) if parts else {}
    names = sorted(job.inputs) if job.inputs is not None else list(found)
    columns = [found.get(name) or [None] * n for name in names]
    for start in range(0, n, size):
        stop = min(n, start + size)
        batch = [column[start:stop] for column in columns]
        pieces.append(_call_for_columns(fn, names, batch, job, first + start, stop - start))
    return pieces


def _piece_rows(piece: columnar.ColumnBatch) -> list[dict[str, Any]]:
    columns = [columnar.decoded(column) for column in piece.columns]
    return [
        {name: column[k] for name, column in zip(piece.names, columns, strict=True)}
        for k in range(piece.num_rows)
    ]


def _call_for_columns(
    fn: Callable[..., Any],
    names: list[str],
    batch: list[list[Any]],
    job: FieldJob,
    first: int,
    n: int,
    given: Any = None,
) -> columnar.ColumnBatch:
    """``fn`` on a batch of ``n`` samples (``names`` and their columns, or ``given``: an Arrow
    batch of them), its result checked and encoded."""
    where = f"the batch of samples from {first}"
    if given is not None:
        out = fn(given)
    elif job.batch_format == "arrow":
        from ..format import arrow

        out = fn(arrow.record_batch(names, batch))
    else:
        out = fn(dict(zip(names, batch, strict=True)))
    if isinstance(out, dict):
        _check_returned(out, frozenset(job.fields), where)
        for name, column in out.items():
            if columnar.column_rows(column) is None and not columnar.is_columns(column):
                raise EncodeError(
                    f"{where}: field {name!r} came back as a {type(column).__name__}; give a "
                    "list or an array of one value per sample"
                )
            if len(column) != n:
                raise EncodeError(
                    f"{where}: field {name!r} has {len(column)} values for {n} samples"
                )
        # A list of ints (ids, lengths, labels) encoded as one array, not value by value.
        out = {
            name: ints
            if isinstance(column, list) and (ints := columnar.plain_ints(column)) is not None
            else column
            for name, column in out.items()
        }
    elif not columnar.is_columns(out):
        raise EncodeError(
            f"{where}: the function returned a {type(out).__name__}; with batch_size it "
            "returns its new fields as a dict of lists (or an Arrow batch, for Arrow input)"
        )
    got = list(columnar.as_columns(out, first) or ())
    if not got:  # a dict of no columns, or an empty table
        got = [columnar.ColumnBatch((), (), 0 if not isinstance(out, dict) or out else n)]
    batch_out = columnar.ColumnBatch.concat(got)
    _check_returned(dict.fromkeys(batch_out.names), frozenset(job.fields), where)
    if batch_out.num_rows != n:
        raise EncodeError(f"{where}: {batch_out.num_rows} rows came back for {n} samples")
    return batch_out


def _with_field_file(chunk: ChunkRef, new: FieldFile | None, hide: tuple[str, ...]) -> ChunkRef:
    """``chunk`` with ``hide`` hidden everywhere (files left with nothing visible dropped),
    then ``new`` added: a column stays visible in at most one file."""
    hidden = set(hide)
    kept = []
    for extra in chunk.field_files:
        gone = tuple(sorted(set(extra.hidden) | (hidden & set(extra.columns))))
        if set(extra.columns) - set(gone):
            kept.append(fmt.replace(extra, hidden=gone))
    if new is not None:
        kept.append(new)
    return fmt.replace(
        chunk,
        hidden=tuple(sorted(set(chunk.hidden) | hidden)),
        field_files=tuple(kept),
    )


def _commit_rewrite(
    ctx: StoreContext,
    parent: Manifest,
    chunks: Sequence[ChunkRef],
    operation: str,
    message: str | None,
) -> Commit:
    """Commit ``chunks`` (same samples, new references) as the version right after
    ``parent``; a HistoryChangedError if anything was committed after it."""
    result = ctx.replace_chunks(chunks, start=parent, operation=operation, message=message)
    return Commit.from_manifest(result.manifest, result.attempts)


def _pool(num_workers: int, fn: Callable[..., Any]) -> Executor | None:
    # Forked, with the function inherited: closures and loaded models work.
    return fork_pool(num_workers, fn) if num_workers > 0 else None


def _presence(
    snap: Snapshot, chunks: Sequence[ChunkRef], names: frozenset[str]
) -> list[dict[str, Runs]]:
    """Per chunk, the runs of its samples that have each field of ``names``."""
    reader, version = snap.reader, snap.version
    threads = 16 if snap.storage.is_remote else 1  # local footers: no wait to hide
    return map_threads(lambda chunk: reader.presence(chunk, version, names), chunks, threads)


def _have_all(chunk: ChunkRef, found: dict[str, Runs], names: frozenset[str]) -> Runs:
    """The runs of the chunk's samples that have every field of ``names``."""
    runs: Runs = [(0, chunk.num_samples)]
    for name in names:
        runs = _intersect(runs, found.get(name, []))
    return runs


def _intersect(a: Runs, b: Runs) -> Runs:
    out: Runs = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, stop = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < stop:
            out.append((start, stop))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _complement(runs: Runs, n: int) -> Runs:
    out: Runs = []
    at = 0
    for start, stop in runs:
        if at < start:
            out.append((at, start))
        at = stop
    if at < n:
        out.append((at, n))
    return out


def _check_job(
    ctx: StoreContext,
    fields: Iterable[str],
    inputs: Iterable[str] | None,
    batched: bool,
    batch_size: int | None,
    batch_format: str,
    num_workers: int,
) -> FieldJob:
    names = _check_names(fields)
    if inputs is not None:
        if isinstance(inputs, str | bytes):
            raise TypeError(f"inputs must be a list of field names, not {inputs!r}")
        wanted = frozenset(inputs)
        if not all(isinstance(name, str) and name for name in wanted):
            raise TypeError(f"inputs must be a list of field names, not {inputs!r}")
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
        if batched:
            raise ValueError(
                "batched=True gives fn a block's list of samples; batch_size a "
                "dict of lists: choose one"
            )
    if batch_format not in BATCH_FORMATS:
        raise ValueError(f"batch_format must be one of {BATCH_FORMATS}, not {batch_format!r}")
    if batch_format != "dict" and batch_size is None:
        raise ValueError(f"batch_format={batch_format!r} needs a batch_size")
    if num_workers > 0 and not ctx.storage.shared_across_processes:
        raise ValueError("a memory store lives in one process: use num_workers=0")
    return FieldJob(
        names, None if inputs is None else frozenset(inputs), batched, batch_size, batch_format
    )


def add_fields(
    ctx: StoreContext,
    fn: Callable[..., Any],
    fields: Iterable[str],
    *,
    inputs: Iterable[str] | None = None,
    missing_only: bool = False,
    replace: bool = False,
    batched: bool = False,
    batch_size: int | None = None,
    batch_format: str = "dict",
    num_workers: int = 0,
    message: str | None = None,
    progress: Progress = QUIET,
) -> Commit:
    """Commit a version in which samples also have ``fields``, computed by ``fn``.

    ``fn`` gets a sample and returns a dict of new values; a field it leaves out is absent
    from that sample. ``inputs``: the fields ``fn`` gets (only their bytes are read; default
    all). ``batched``: ``fn`` gets a block's list of samples and returns a list of dicts.
    ``batch_size``: ``fn`` gets up to that many samples (of one chunk) as a dict of lists
    (None where a sample lacks an input), or with ``batch_format="arrow"`` a
    ``pyarrow.RecordBatch``, and returns the new fields the same way, one value per sample.

    ``missing_only``: compute only the samples that lack some of ``fields`` (``fn`` is
    called for those alone); the others keep their values. Otherwise a field some sample has
    already is a ``FieldExistsError`` unless ``replace``. Chunk files are not rewritten or
    copied. ``num_workers`` processes compute chunks in parallel.
    """
    job = _check_job(ctx, fields, inputs, batched, batch_size, batch_format, num_workers)
    names = frozenset(job.fields)
    done: dict[str, FieldFile] = {}
    planned: set[str] = set()  # chunks whose samples have the fields already
    pool = _pool(num_workers, fn)
    try:
        for _ in range(_MAX_ROUNDS):
            parent = ctx.log.latest()
            snap = ctx.snapshot(parent)
            chunks = snap.chunk_refs()
            if job.inputs is not None and len(snap):
                snap.check_fields(job.inputs)  # FieldNotFoundError for a typo
            fresh = [c for c in chunks if c.path not in done and c.path not in planned]
            if missing_only or not replace:
                found = _presence(snap, fresh, names)
            else:  # replacing every value: who has them does not matter
                found = [{} for _ in fresh]
            if not (missing_only or replace):
                _refuse_existing(snap, found, job.fields)
            work: list[tuple[ChunkRef, Runs]] = []
            for chunk, has in zip(fresh, found, strict=True):
                runs = _have_all(chunk, has, names)
                todo = _complement(runs, chunk.num_samples) if missing_only else None
                if todo == []:
                    planned.add(chunk.path)
                else:
                    work.append((chunk, todo or [(0, chunk.num_samples)]))
            firsts = _first_positions(chunks)
            total = sum(stop - start for _, todo in work for start, stop in todo)
            with progress.stage("computing fields", total, "samples") as report:
                for path, ref in _run(ctx, pool, work, parent, fn, job, firsts, report):
                    done[path] = ref
            rewritten = [
                _with_field_file(c, done[c.path], job.fields) if c.path in done else c
                for c in chunks
            ]
            try:
                return _commit_rewrite(ctx, parent, rewritten, "add_fields", message)
            except ConflictError:
                # Redone on the latest only if add_fields may be rebased over what came since.
                Rebase(ctx.log, parent.version, "add_fields").check(ctx.log.latest())
        raise RetriesExhaustedError(f"add_fields could not catch up with appends to {ctx.uri}")
    finally:
        if pool is not None:
            pool.shutdown()


def _refuse_existing(snap: Snapshot, found: list[dict[str, Runs]], fields: tuple[str, ...]) -> None:
    """FieldExistsError if some sample has one of ``fields`` already."""
    counts = dict.fromkeys(fields, 0)
    for has in found:
        for name in fields:
            counts[name] += sum(stop - start for start, stop in has.get(name, []))
    existing = {name: n for name, n in counts.items() if n}
    if existing:
        said = ", ".join(f"{name!r} ({n:,} samples)" for name, n in existing.items())
        raise FieldExistsError(
            f"samples of version {snap.version} of {snap.uri} have {said} already: pass "
            "replace=True to replace their values, or missing_only=True to compute the field "
            "only for the samples without it"
        )


def _first_positions(chunks: Sequence[ChunkRef]) -> dict[str, int]:
    out, position = {}, 0
    for chunk in chunks:
        out[chunk.path] = position
        position += chunk.num_samples
    return out


def _run(
    ctx: StoreContext,
    pool: Executor | None,
    work: list[tuple[ChunkRef, Runs]],
    parent: Manifest,
    fn: Callable[..., Any],
    job: FieldJob,
    firsts: dict[str, int],
    report: Stage,
) -> Iterable[tuple[str, FieldFile]]:
    version, config = parent.version, parent.config
    if pool is None:
        # ``fn`` on this thread, one chunk after another; each field file stored (and
        # fsynced) on a thread of its own meanwhile.
        storage = ctx.storage
        with ThreadPoolExecutor(_WRITERS, thread_name_prefix="txstore-fields") as writes:
            stored: list[tuple[str, Runs, Future[FieldFile]]] = []
            for chunk, todo in work:
                first = firsts[chunk.path]
                builder = compute_field_file(
                    storage, chunk, version, config, fn, job, first, todo, ctx.reader
                )
                stored.append((chunk.path, todo, writes.submit(_write, storage, builder, job)))
            for path, todo, written in stored:
                yield path, written.result()
                report.update(sum(stop - start for start, stop in todo))
        return
    uri, options = ctx.storage.uri, ctx.storage.storage_options
    futures: list[tuple[Runs, Future[tuple[str, FieldFile]]]] = [
        (
            todo,
            pool.submit(
                _compute_in_worker, uri, options, c, version, config, job, firsts[c.path], todo
            ),
        )
        for c, todo in work
    ]
    for todo, future in futures:
        yield future.result()
        report.update(sum(stop - start for start, stop in todo))


def _compute_in_worker(
    uri: str,
    options: dict[str, Any],
    chunk: ChunkRef,
    version: int,
    config: StoreConfig,
    job_: FieldJob,
    first: int,
    todo: Runs,
) -> tuple[str, FieldFile]:
    # A storage client of the worker's own: s3fs clients and open files do not survive fork.
    storage = open_storage(uri, options or None)
    builder = compute_field_file(storage, chunk, version, config, job(), job_, first, todo)
    return chunk.path, _write(storage, builder, job_)


def drop_fields(ctx: StoreContext, fields: Iterable[str], *, message: str | None = None) -> Commit:
    """Commit a version whose samples no longer have ``fields``. Nothing is rewritten; field
    files left with no visible column are no longer referenced (vacuum reclaims them).
    ``FieldNotFoundError``, committing nothing, for a field no sample has."""
    names = _check_names(fields)
    for _ in range(_MAX_ROUNDS):
        parent = ctx.log.latest()
        snap = ctx.snapshot(parent)
        if len(snap):
            snap.check_fields(names)  # no sample has one: FieldNotFoundError
        else:
            raise FieldNotFoundError(
                f"version {snap.version} of {snap.uri} has no samples, so no field {names[0]!r}"
            )
        chunks = [_with_field_file(c, None, names) for c in snap.chunk_refs()]
        try:
            return _commit_rewrite(ctx, parent, chunks, "drop_fields", message)
        except ConflictError:
            Rebase(ctx.log, parent.version, "drop_fields").check(ctx.log.latest())
    raise RetriesExhaustedError(f"drop_fields could not catch up with commits to {ctx.uri}")
