"""History: commits as the API shows them, rollback, and the difference between two versions.

By what each operation does to a version's samples (``txn.rules``), a version's samples are
a list of whole appended batches, and two versions share a prefix of batches: ``diff`` walks
both back (always the higher one first) until they meet.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..errors import CorruptError, UnsupportedFormatError
from ..format.manifest import CommitRecord, Manifest
from ..txn import VersionLog
from ..txn.rules import SAME_SAMPLES, Rebase
from .context import StoreContext


@dataclass(frozen=True)
class Commit:
    """One entry of a store's history."""

    version: int
    num_samples: int  # samples added by this commit (negative for a rollback that drops some)
    total_samples: int  # samples in the version it made
    timestamp: datetime
    message: str | None
    operation: str
    txn_id: str | None
    commit_id: str
    parent: int | None = None  #: the version it was committed on (None for version 0)
    #: the version a rollback restored or a compaction rewrote
    source_version: int | None = None
    #: How many tries the commit loop took to land it (1 when nothing raced it; 0 when an
    #: earlier commit with the same txn_id was returned untried). None for an entry read
    #: from the history (``log``, ``commit_info``): the store does not record it. Not part of
    #: equality: a commit equals its history entry.
    attempts: int | None = field(default=None, compare=False)

    @classmethod
    def from_manifest(cls, m: Manifest | CommitRecord, attempts: int | None = None) -> Commit:
        return cls(
            version=m.version,
            num_samples=m.added_samples,
            total_samples=m.num_samples,
            timestamp=datetime.fromtimestamp(m.timestamp, tz=timezone.utc),
            message=m.message,
            operation=m.operation,
            txn_id=m.txn_id,
            commit_id=m.commit_id,
            parent=m.parent,
            source_version=m.source_version,
            attempts=attempts,
        )


class RollbackBuild:
    """The commit loop's ``build`` for a rollback: refuses to land on anything but ``seen``."""

    def __init__(self, ctx: StoreContext, target: Manifest, seen: int, message: str | None) -> None:
        self.ctx = ctx
        self.target = target
        self.message = message
        self.rebase = Rebase(ctx.log, seen, "rollback")
        self.commit_id = uuid.uuid4().hex

    def __call__(self, parent: Manifest) -> Manifest:
        self.rebase.check(parent)
        return self.ctx.next_manifest(
            parent,
            operation="rollback",
            commit_id=self.commit_id,
            segments=self.target.segments,
            num_samples=self.target.num_samples,
            message=self.message,
            source_version=self.target.version,
        )


# -- diff ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleRange:
    """Samples ``start`` to ``stop`` (exclusive) of a version, appended by ``version``."""

    start: int
    stop: int
    version: int  # the append that added them
    txn_id: str | None

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Diff:
    """How version ``b`` differs from version ``a``."""

    a: int
    b: int
    #: The commits after the older of the two up to the newer, oldest first.
    commits: list[Commit]
    #: Samples of ``b`` that ``a`` lacks, as index ranges of ``b``.
    added: list[SampleRange]
    #: Samples of ``a`` that ``b`` lacks, as index ranges of ``a``.
    removed: list[SampleRange]
    #: The version whose samples both start with (the rest is added or removed).
    common: int

    @property
    def num_added(self) -> int:
        return sum(len(r) for r in self.added)

    @property
    def num_removed(self) -> int:
        return sum(len(r) for r in self.removed)


def _step(log: VersionLog, m: Manifest) -> tuple[int, int]:
    """(the version whose samples ``m`` starts with, or -1 for none; samples it adds after)."""
    if m.operation == "create":
        return -1, 0
    if m.operation == "append":
        return m.version - 1, m.added_samples
    if m.operation == "overwrite":  # ingest's mode="overwrite": new samples replace all
        return -1, m.num_samples
    if m.operation in SAME_SAMPLES:
        return m.version - 1, 0
    if m.operation == "rollback":
        if m.source_version is None or not 0 <= m.source_version < m.version:
            raise CorruptError(f"version {m.version} of {log.storage.uri} is a bad rollback")
        return m.source_version, 0
    raise UnsupportedFormatError(
        f"cannot diff across version {m.version} of {log.storage.uri}: unknown operation "
        f"{m.operation!r} (upgrade txstore)"
    )


def diff(log: VersionLog, a: int, b: int) -> Diff:
    start = {a: log.read(a), b: log.read(b)}
    cursors = [a, b]
    batches: list[list[tuple[Manifest, int]]] = [[], []]
    while cursors[0] != cursors[1]:
        side = 0 if cursors[0] > cursors[1] else 1
        m = log.read(cursors[side])
        cursors[side], added = _step(log, m)
        if added:
            batches[side].append((m, added))
    common = cursors[0]
    base = log.read(common).num_samples if common >= 0 else 0
    ranges: list[list[SampleRange]] = [[], []]
    for side, version in enumerate((a, b)):
        at = base
        for m, added in reversed(batches[side]):
            ranges[side].append(SampleRange(at, at + added, m.version, m.txn_id))
            at += added
        if at != start[version].num_samples:
            raise CorruptError(
                f"the history of version {version} of {log.storage.uri} does not add up: "
                f"{at} samples by its commits, {start[version].num_samples} by its manifest"
            )
    low, high = min(a, b), max(a, b)
    commits = [Commit.from_manifest(log.read(v)) for v in range(low + 1, high + 1)]
    return Diff(
        a=a, b=b, commits=commits, added=ranges[1], removed=ranges[0], common=max(common, 0)
    )
