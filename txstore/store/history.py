"""History: commits as the API shows them, rollback, and the difference between two versions.

What each operation does to a version's samples:

- ``append`` adds ``added_samples`` at the end;
- ``compact`` (and ``add_fields``, ``drop_fields``) keeps the parent's samples, in order;
- ``rollback`` makes the content of ``source_version`` again;
- ``create`` starts empty.

So a version's samples are a list of whole appended batches, and two versions share a prefix
of batches: ``diff`` walks both back (always the higher one first) until they meet.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from ..errors import ConflictError, CorruptError, TxstoreError
from ..format.manifest import Manifest
from ..txn import VersionLog


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

    @classmethod
    def from_manifest(cls, m: Manifest) -> Commit:
        return cls(
            version=m.version,
            num_samples=m.added_samples,
            total_samples=m.num_samples,
            timestamp=datetime.fromtimestamp(m.timestamp, tz=timezone.utc),
            message=m.message,
            operation=m.operation,
            txn_id=m.txn_id,
            commit_id=m.commit_id,
        )


class HistoryGuard:
    """Refuses to commit on top of a rollback (or any change but appends, compactions and
    field changes) committed since ``start``: a batch meant to extend what the caller saw is
    never silently added to something else. Call ``check(parent)`` in a commit's build."""

    def __init__(self, log: VersionLog, start: Manifest) -> None:
        self.log = log
        self.start = start.version
        self._checked = start.version

    def check(self, parent: Manifest) -> None:
        for v in range(self._checked + 1, parent.version + 1):
            m = parent if v == parent.version else self.log.read(v)
            if m.operation in KEEPS_PREFIX:
                continue
            what = (
                f"rolled back to version {m.source_version}"
                if m.operation == "rollback"
                else f"replaced the samples ({m.operation})"
            )
            raise ConflictError(
                f"version {v} of {self.log.storage.uri} {what} while this commit was prepared "
                f"(it began at version {self.start}); nothing was committed: commit again if "
                "the batch still belongs"
            )
        self._checked = parent.version


class RollbackBuild:
    """The commit loop's ``build`` for a rollback: refuses to land on anything but ``seen``."""

    def __init__(self, target: Manifest, seen: int, message: str | None, uri: str) -> None:
        self.target = target
        self.seen = seen
        self.message = message
        self.uri = uri
        self.commit_id = uuid.uuid4().hex

    def __call__(self, parent: Manifest) -> Manifest:
        if parent.version != self.seen:
            raise ConflictError(
                f"{self.uri} moved from version {self.seen} to {parent.version} (by "
                f"{parent.operation}) while rolling back to version {self.target.version}; "
                "nothing was committed: look at the log and roll back again if still wanted"
            )
        return Manifest(
            version=parent.version + 1,
            parent=parent.version,
            commit_id=self.commit_id,
            operation="rollback",
            timestamp=time.time(),
            message=self.message,
            num_samples=self.target.num_samples,
            added_samples=self.target.num_samples - parent.num_samples,
            config=parent.config,
            segments=self.target.segments,
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


#: Operations that keep their parent's samples, in order (chunks or fields change).
SAME_SAMPLES = frozenset({"compact", "add_fields", "drop_fields"})
#: Operations after which the parent's samples are still the first samples, in order.
KEEPS_PREFIX = SAME_SAMPLES | {"append"}


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
