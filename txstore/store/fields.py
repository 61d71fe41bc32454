"""Add fields to existing samples, or drop them, as new versions without rewriting chunks.

``add_fields`` computes the new values chunk by chunk and writes them to *field files* laid out
like chunks and aligned with their blocks (docs/format.md §10); the new version's chunk
references name them next to the untouched chunk files. Samples appended while it runs are not
left without the fields: it computes them for the new chunks too and commits on top (it gives
up with a ``HistoryChangedError`` only if the history changed otherwise, e.g. a rollback).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future
from typing import Any

from ..errors import ConflictError, EncodeError, RetriesExhaustedError
from ..format import manifest as fmt
from ..format.builder import ChunkBuilder
from ..format.codec import FrameCompressor
from ..format.manifest import ChunkRef, FieldFile, Manifest, StoreConfig, chunk_files
from ..storage import Storage, open_storage
from ..txn.rules import Rebase
from .context import StoreContext
from .forkpool import fork_pool, job
from .history import Commit
from .progress import QUIET, Progress, Stage
from .snapshot import ChunkReader, Sample

FieldFn = Callable[[Sample], dict[str, Any]]
BatchFieldFn = Callable[[list[Sample]], list[dict[str, Any]]]

_MAX_ROUNDS = 20  # rounds of catching up with concurrent appends before giving up


def _check_names(fields: Iterable[str]) -> tuple[str, ...]:
    names = tuple(fields)
    if not names or not all(isinstance(f, str) and f for f in names):
        raise ValueError("fields must be a non-empty list of field names")
    if len(set(names)) != len(names):
        raise ValueError(f"fields has duplicates: {names}")
    return names


def _new_values(
    fn: Callable[..., Any], block: list[Sample], batched: bool, first: int, names: set[str]
) -> list[dict[str, Any]]:
    values = fn(block) if batched else [fn(sample) for sample in block]
    if not isinstance(values, list) or len(values) != len(block):
        raise EncodeError(f"samples {first}..: the function must return one dict per sample")
    for i, new in enumerate(values):
        if not isinstance(new, dict):
            raise EncodeError(f"sample {first + i}: the function returned {type(new).__name__}")
        extra = set(new) - names
        if extra:
            raise EncodeError(f"sample {first + i}: returned fields not asked for: {extra}")
    return values


def compute_field_file(
    storage: Storage,
    chunk: ChunkRef,
    version: int,
    config: StoreConfig,
    fn: Callable[..., Any],
    fields: tuple[str, ...],
    batched: bool,
    first: int,
) -> tuple[str, FieldFile]:
    """Compute ``fields`` for every sample of ``chunk``; store them as one field file."""
    reader = ChunkReader(storage)
    fetched = reader.fetch(chunk, version, None)
    base = reader.layout(chunk_files(chunk)[0], version)
    builder = ChunkBuilder(
        block_bytes=2**62, compressor=FrameCompressor(config.compression, config.compression_level)
    )
    samples = reader.samples(fetched, chunk, version)
    position, names = first, set(fields)
    for number in range(len(base.footer.blocks)):
        block = [next(samples) for _ in range(base.footer.blocks[number].num_samples)]
        for new in _new_values(fn, block, batched, position, names):
            builder.add(new, position)
            position += 1
        builder.end_block()  # the same block boundaries as the chunk
    built = builder.finish()
    key = f"chunks/{uuid.uuid4().hex}.fields"
    storage.write(key, built)
    ref = FieldFile(
        path=key,
        size=built.size,
        crc32=built.crc32,
        footer_offset=built.footer_offset,
        columns=fields,
    )
    return chunk.path, ref


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


def add_fields(
    ctx: StoreContext,
    fn: FieldFn | BatchFieldFn,
    fields: Iterable[str],
    *,
    batched: bool = False,
    num_workers: int = 0,
    message: str | None = None,
    progress: Progress = QUIET,
) -> Commit:
    """Commit a version in which every sample also has ``fields``, computed by ``fn``.

    ``fn`` gets a sample (or, with ``batched``, a list of samples: one block) and returns a
    dict of new values (a list of dicts); a field it leaves out is absent from that sample.
    Existing values of ``fields`` are replaced. Chunk files are not rewritten or copied.
    ``num_workers`` processes compute chunks in parallel.
    """
    names = _check_names(fields)
    if num_workers > 0 and not ctx.storage.shared_across_processes:
        raise ValueError("a memory store lives in one process: use num_workers=0")
    done: dict[str, FieldFile] = {}
    pool = _pool(num_workers, fn)
    try:
        for _ in range(_MAX_ROUNDS):
            parent = ctx.log.latest()
            chunks = ctx.snapshot(parent).chunk_refs()
            todo = [c for c in chunks if c.path not in done]
            firsts = _first_positions(chunks)
            total = sum(c.num_samples for c in todo)
            with progress.stage("computing fields", total, "samples") as report:
                for path, ref in _run(ctx, pool, todo, parent, fn, names, batched, firsts, report):
                    done[path] = ref
            rewritten = [_with_field_file(c, done[c.path], names) for c in chunks]
            try:
                return _commit_rewrite(ctx, parent, rewritten, "add_fields", message)
            except ConflictError:
                # Redone on the latest only if add_fields may be rebased over what came since.
                Rebase(ctx.log, parent.version, "add_fields").check(ctx.log.latest())
        raise RetriesExhaustedError(f"add_fields could not catch up with appends to {ctx.uri}")
    finally:
        if pool is not None:
            pool.shutdown()


def _first_positions(chunks: Sequence[ChunkRef]) -> dict[str, int]:
    out, position = {}, 0
    for chunk in chunks:
        out[chunk.path] = position
        position += chunk.num_samples
    return out


def _run(
    ctx: StoreContext,
    pool: Executor | None,
    todo: list[ChunkRef],
    parent: Manifest,
    fn: Callable[..., Any],
    names: tuple[str, ...],
    batched: bool,
    firsts: dict[str, int],
    report: Stage,
) -> Iterable[tuple[str, FieldFile]]:
    version, config = parent.version, parent.config
    if pool is None:
        for chunk in todo:
            first = firsts[chunk.path]
            yield compute_field_file(ctx.storage, chunk, version, config, fn, names, batched, first)
            report.update(chunk.num_samples)
        return
    uri, options = ctx.storage.uri, ctx.storage.storage_options
    futures: list[tuple[ChunkRef, Future[tuple[str, FieldFile]]]] = [
        (
            c,
            pool.submit(
                _compute_in_worker, uri, options, c, version, config, names, batched, firsts[c.path]
            ),
        )
        for c in todo
    ]
    for chunk, future in futures:
        yield future.result()
        report.update(chunk.num_samples)


def _compute_in_worker(
    uri: str,
    options: dict[str, Any],
    chunk: ChunkRef,
    version: int,
    config: StoreConfig,
    names: tuple[str, ...],
    batched: bool,
    first: int,
) -> tuple[str, FieldFile]:
    # A storage client of the worker's own: s3fs clients and open files do not survive fork.
    storage = open_storage(uri, options or None)
    return compute_field_file(storage, chunk, version, config, job(), names, batched, first)


def drop_fields(ctx: StoreContext, fields: Iterable[str], *, message: str | None = None) -> Commit:
    """Commit a version whose samples no longer have ``fields``. Nothing is rewritten; field
    files left with no visible column are no longer referenced (vacuum reclaims them)."""
    names = _check_names(fields)
    for _ in range(_MAX_ROUNDS):
        parent = ctx.log.latest()
        chunks = [_with_field_file(c, None, names) for c in ctx.snapshot(parent).chunk_refs()]
        try:
            return _commit_rewrite(ctx, parent, chunks, "drop_fields", message)
        except ConflictError:
            Rebase(ctx.log, parent.version, "drop_fields").check(ctx.log.latest())
    raise RetriesExhaustedError(f"drop_fields could not catch up with commits to {ctx.uri}")
