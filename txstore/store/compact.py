"""Compaction: rewrite runs of undersized chunks into full ones; same samples, same order.

Each append leaves its last chunk part-filled, so many small appends leave many small chunks.
``compact`` finds runs of consecutive undersized chunks whose samples fit in fewer chunks,
re-encodes their samples with the store's settings, and commits a version (operation
"compact", ``source_version`` the version it read) whose chunk list is the old one with each
run replaced. Appends committed meanwhile are kept: appends only add chunks at the end, so the
new list is the compacted one plus the parent's chunks after those compaction read. Anything
else committed meanwhile (a rollback, another compaction) is a ``HistoryChangedError``, and
nothing is committed.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..errors import ConflictError, CorruptError, HistoryChangedError
from ..format.manifest import ChunkRef, Manifest, SegmentRef, chunk_files
from ..txn import CommitResult
from ..txn.rules import Rebase
from .context import StoreContext
from .history import Commit
from .progress import QUIET, Progress, Stage
from .snapshot import Sample, Snapshot
from .writer import ChunkWriter

#: A chunk this close to ``chunk_bytes`` counts as full and is left alone.
FULL = 0.9


@dataclass(frozen=True)
class Run:
    """Chunks ``start`` to ``stop`` (exclusive) of a version, to be rewritten together."""

    start: int
    stop: int
    bytes: int
    samples: int
    #: Chunks the run should become (an estimate from the sizes).
    target_chunks: int

    @property
    def chunks(self) -> int:
        return self.stop - self.start


def _size(chunk: ChunkRef) -> int:
    return sum(f.size for f in chunk_files(chunk))


def plan(chunks: Sequence[ChunkRef], chunk_bytes: int) -> list[Run]:
    """The runs of undersized chunks worth rewriting: those that would become fewer chunks."""
    runs: list[Run] = []
    i, n = 0, len(chunks)
    while i < n:
        if _size(chunks[i]) >= FULL * chunk_bytes:
            i += 1
            continue
        j = i
        while j < n and _size(chunks[j]) < FULL * chunk_bytes:
            j += 1
        size = sum(_size(c) for c in chunks[i:j])
        target = max(1, math.ceil(size / chunk_bytes))
        if target < j - i:
            runs.append(Run(i, j, size, sum(c.num_samples for c in chunks[i:j]), target))
        i = j
    return runs


@dataclass(frozen=True)
class CompactResult:
    #: The version committed, or None when nothing was worth rewriting (or a dry run).
    commit: Commit | None
    #: The version whose chunks were read.
    source: int
    runs: list[Run]
    chunks_before: int
    #: Chunks of the source's samples afterwards (an estimate in a dry run).
    chunks_after: int
    dry_run: bool

    @property
    def bytes_rewritten(self) -> int:
        return sum(r.bytes for r in self.runs)

    @property
    def samples_rewritten(self) -> int:
        return sum(r.samples for r in self.runs)


#: Samples between two progress updates.
_REPORT_EVERY = 1024


def _counted(samples: Iterable[Sample], stage: Stage) -> Iterator[Sample]:
    unreported = 0
    for sample in samples:
        yield sample
        unreported += 1
        if unreported == _REPORT_EVERY:
            stage.update(unreported)
            unreported = 0
    if unreported:
        stage.update(unreported)


class Compaction:
    """One compaction of the latest version: plan, rewrite, commit (rebasing over appends)."""

    def __init__(self, ctx: StoreContext) -> None:
        self.ctx = ctx
        self.log = ctx.log
        self.storage = ctx.storage
        self.segments = ctx.segments

    def run(
        self, *, message: str | None, dry_run: bool, progress: Progress = QUIET
    ) -> CompactResult:
        base = self.log.latest()
        snap = self.ctx.snapshot(base)
        chunks = snap.chunk_refs()
        runs = plan(chunks, base.config.chunk_bytes)
        estimate = len(chunks) - sum(r.chunks - r.target_chunks for r in runs)
        if dry_run or not runs:
            return CompactResult(None, base.version, runs, len(chunks), estimate, dry_run)
        writers: list[ChunkWriter] = []
        try:
            compacted = self._rewrite(snap, chunks, runs, writers, progress)
            own = self._segments_for(base, chunks, compacted, runs[0].start)
        except BaseException:
            for w in writers:  # nothing names the new chunks yet
                w.abort()
            raise
        try:
            result = self._commit(base, chunks, own, message)
        except ConflictError:  # every attempt lost or gave up: ours never landed
            for w in writers:
                w.abort()
            raise
        # Any other error may leave the commit's outcome unknown: the chunks stay (vacuum).
        return CompactResult(
            Commit.from_manifest(result.manifest, result.attempts),
            base.version,
            runs,
            len(chunks),
            len(compacted),
            dry_run=False,
        )

    def _rewrite(
        self,
        snap: Snapshot,
        chunks: list[ChunkRef],
        runs: list[Run],
        writers: list[ChunkWriter],
        progress: Progress,
    ) -> list[ChunkRef]:
        out: list[ChunkRef] = []
        previous = 0
        with progress.stage("compacting", sum(r.samples for r in runs), "samples") as stage:
            for run in runs:
                out += chunks[previous : run.start]
                writer = ChunkWriter(self.storage, snap.manifest.config)
                writers.append(writer)
                samples = snap.iter_chunks(chunks[run.start : run.stop])
                writer.write(_counted(samples, stage))
                written = writer.finish()
                if sum(c.num_samples for c in written) != run.samples:
                    raise CorruptError(f"compaction of {self.storage.uri} lost samples: aborted")
                out += written
                previous = run.stop
        return out + chunks[previous:]

    def _segments_for(
        self, base: Manifest, old: list[ChunkRef], new: list[ChunkRef], first_change: int
    ) -> tuple[SegmentRef, ...]:
        """Segments for ``new``: the base's own wherever they end before the first change."""
        kept: list[SegmentRef] = []
        at = 0
        for ref in base.segments:
            if at + ref.num_chunks > first_change:
                break
            kept.append(ref)
            at += ref.num_chunks
        assert new[:at] == old[:at]
        return self.segments.extend(tuple(kept), new[at:])

    def _parent_chunks(self, m: Manifest) -> list[ChunkRef]:
        return self.segments.chunks(m.segments, version=m.version)

    def _commit(
        self,
        base: Manifest,
        old: list[ChunkRef],
        own: tuple[SegmentRef, ...],
        message: str | None,
    ) -> CommitResult:
        commit_id = uuid.uuid4().hex
        rebase = Rebase(self.log, base.version, "compact")

        def build(parent: Manifest) -> Manifest:
            segments = own
            if parent.version != base.version:
                rebase.check(parent)
                chunks = self._parent_chunks(parent)
                if chunks[: len(old)] != old:
                    raise HistoryChangedError(
                        f"{self.storage.uri} changed under compaction; compact again",
                        version=parent.version,
                        operation=parent.operation,
                    )
                segments = self.segments.extend(segments, chunks[len(old) :])
            return self.ctx.next_manifest(
                parent,
                operation="compact",
                commit_id=commit_id,
                segments=segments,
                num_samples=parent.num_samples,
                message=message,
                source_version=base.version,
            )

        return self.ctx.commit(build)
