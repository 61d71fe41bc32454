"""Retention and garbage collection: ``expire`` marks versions expired, ``vacuum`` deletes files.

``expire`` deletes nothing: it adds versions to ``refs/retention.json``. Manifests stay (they
are small), so versions stay contiguous from 0 and the latest-version search, the log, ``diff``
and transaction ids keep working; opening an expired version raises ``VersionExpiredError``.

``vacuum`` deletes data files (chunks, segments) that no *kept* version needs, abandoned temp
files and long-lapsed leases, and only files older than the grace period. Kept versions are
the unexpired ones, the tagged or leased ones, and those expired less than the grace period
ago (a reader that opened one just before it expired keeps reading). The grace period also
protects the files of writers still at work: no version names their chunks until they commit.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from ..errors import ConflictError, CorruptError, RetriesExhaustedError, TxstoreError
from ..format import manifest as fmt
from ..format.manifest import ChunkFile, ChunkRef, Manifest, Retention, SegmentRef, chunk_files
from ..format.units import parse_duration
from ..storage import FileInfo, Storage
from ..storage.base import TEMP_PREFIX
from ..txn import VersionLog
from ..txn.log import version_of_key
from .progress import QUIET, Progress
from .refs import RETENTION_KEY, Refs, lease_key, with_expired
from .segments import Loaded, Node, Segments

logger = logging.getLogger(__name__)

DEFAULT_GRACE = 7 * 86400.0
#: The only folders vacuum deletes data files from (see format/manifest.py).
DATA_PREFIXES = fmt.DATA_PREFIXES
THREADS = 16
_CAS_ATTEMPTS = 20

T = TypeVar("T")
R = TypeVar("R")


def parallel(
    fn: Callable[[T], R],
    items: Sequence[T],
    stage: str,
    unit: str,
    progress: Progress,
    *,
    threads: int = THREADS,
) -> list[R]:
    """``fn`` over ``items`` on a thread pool (object stores answer slowly, in parallel),
    counted as one stage of ``progress``."""
    if not items:
        return []
    out: list[R] = []
    with (
        progress.stage(stage, len(items), unit) as counter,
        ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool,
    ):
        for result in pool.map(fn, items):
            out.append(result)
            counter.update()
    return out


def is_temp(key: str) -> bool:
    return key.rpartition("/")[2].startswith(TEMP_PREFIX)


@dataclass
class Problem:
    """Damage found: which object, and what is wrong with it."""

    key: str
    message: str


@dataclass
class Reach:
    """What a set of versions needs: segments, chunks and their files (held per segment and
    chunk, not per version: a long history shares most of them)."""

    segments: dict[str, SegmentRef]
    chunks: dict[ChunkRef, int]  # each distinct chunk reference -> a version that names it
    files: dict[str, ChunkFile]  # every data file by key
    problems: list[Problem]

    @property
    def keys(self) -> set[str]:
        return set(self.segments) | set(self.files)


#: Manifests read at once by a pass over many versions: the pass keeps what it needs of
#: each and drops the rest, so its memory does not grow with the history.
_MANIFEST_BATCH = 2048


def each_manifest(
    log: VersionLog,
    versions: Iterable[int],
    progress: Progress = QUIET,
    *,
    fresh: bool = False,
    stage: str = "reading manifests",
) -> Iterator[tuple[int, Manifest | Problem]]:
    """(version, its manifest or what is wrong with it), in order, read in parallel a batch
    at a time."""
    wanted = list(versions)
    if not wanted:
        return

    def read(v: int) -> Manifest | Problem:
        try:
            return log.read(v, fresh=fresh)
        except TxstoreError as e:
            return Problem(f"versions/index.v{v}.json", str(e))

    with (
        progress.stage(stage, len(wanted), "manifests") as counter,
        ThreadPoolExecutor(max_workers=min(THREADS, len(wanted))) as pool,
    ):
        for first in range(0, len(wanted), _MANIFEST_BATCH):
            batch = wanted[first : first + _MANIFEST_BATCH]
            for v, got in zip(batch, pool.map(read, batch), strict=True):
                counter.update()
                yield v, got


@dataclass
class _Owners:
    """Of the versions that need a segment: the first, and whether one is not tolerated
    (held so, not as a set of versions, which would grow with the history)."""

    first: int
    needed: bool

    def add(self, other: _Owners) -> None:
        self.first = min(self.first, other.first)
        self.needed = self.needed or other.needed


def reach(
    log: VersionLog,
    segments: Segments,
    versions: Iterable[int],
    *,
    tolerate: frozenset[int] = frozenset(),
    progress: Progress = QUIET,
) -> Reach:
    """Every file ``versions`` need; damage is a problem unless only ``tolerate`` versions
    (expired ones, which a vacuum may have cleaned already) need the damaged file.

    Reads storage, not this process's caches: it answers vacuum's safety check and verify,
    which must see a manifest or segment deleted or damaged since it was cached.
    """
    problems: list[Problem] = []
    refs: dict[str, SegmentRef] = {}
    owners: dict[str, _Owners] = {}
    for v, m in each_manifest(log, versions, progress, fresh=True):
        if isinstance(m, Problem):
            problems.append(m)
            continue
        total = 0
        mine = _Owners(v, v not in tolerate)
        for ref in m.segments:
            refs.setdefault(ref.path, ref)
            held = owners.get(ref.path)
            if held is None:
                owners[ref.path] = _Owners(mine.first, mine.needed)
            else:
                held.add(mine)
            total += ref.num_samples
        if total != m.num_samples and v not in tolerate:
            problems.append(
                Problem(
                    f"versions/index.v{v}.json",
                    f"segments hold {total} samples, not {m.num_samples}",
                )
            )

    def read(ref: SegmentRef) -> Loaded | Exception:
        try:
            return segments.read(ref, fresh=True)
        except TxstoreError as e:
            return e

    out = Reach({}, {}, {}, problems)
    level = list(refs.values())
    while level:  # the segment tree, one level at a time
        below: dict[str, SegmentRef] = {}
        read_all = parallel(read, level, "reading segments", "segments", progress)
        for ref, got in zip(level, read_all, strict=True):
            if isinstance(got, Exception):
                if owners[ref.path].needed:
                    problems.append(Problem(ref.path, str(got)))
                continue
            out.segments[ref.path] = ref
            if isinstance(got, Node):
                parent = owners[ref.path]
                for child in got.children:
                    if child.path in out.segments:
                        continue  # a forged tree names a file twice: read once
                    below.setdefault(child.path, child)
                    held = owners.get(child.path)
                    if held is None:
                        owners[child.path] = _Owners(parent.first, parent.needed)
                    else:
                        held.add(parent)
                continue
            version = owners[ref.path].first
            for chunk in got.chunks:
                # Later segments repeat most chunks of earlier ones: their files are known.
                if chunk in out.chunks:
                    continue
                out.chunks[chunk] = version
                for f in chunk_files(chunk):
                    out.files.setdefault(f.path, f)
        level = list(below.values())
    return out


@dataclass(frozen=True)
class Kept:
    """Which versions a vacuum keeps, held as ranges: asking costs O(log ranges), however
    long the history. Every version from ``latest`` on is kept (the latest never expires;
    later ones were committed after it was read)."""

    latest: int
    #: Sorted, disjoint (first, last, expired_at) of the listed versions below the latest.
    listed: tuple[tuple[int, int, float], ...]
    #: Versions a tag or an unexpired lease names.
    protected: frozenset[int]
    #: Listed versions expired after this are kept (None: no grace, only unexpired kept).
    since: float | None

    @classmethod
    def of(
        cls,
        retention: Retention,
        protection: Iterable[int],
        latest: int,
        now: float,
        grace: float | None,
    ) -> Kept:
        listed = tuple(
            (r.first, min(r.last, latest - 1), r.expired_at)
            for r in retention.expired
            if r.first < latest
        )
        return cls(latest, listed, frozenset(protection), None if grace is None else now - grace)

    def _listing(self, v: int) -> tuple[int, int, float] | None:
        i = bisect_right(self.listed, (v, _MAX_VERSION, 0.0)) - 1
        if i >= 0 and self.listed[i][0] <= v <= self.listed[i][1]:
            return self.listed[i]
        return None

    def __contains__(self, v: object) -> bool:
        return isinstance(v, int) and (self.is_unexpired(v) or self.is_graced(v))

    def is_unexpired(self, v: int) -> bool:
        return v >= self.latest or v in self.protected or self._listing(v) is None

    def is_graced(self, v: int) -> bool:
        """Expired, and kept only by the grace period."""
        if self.is_unexpired(v) or self.since is None:
            return False
        listing = self._listing(v)
        return listing is not None and listing[2] > self.since

    def dropped(self) -> Iterator[tuple[int, int]]:
        """(first, last) of each run of versions not kept, protected ones aside."""
        for first, last, at in self.listed:
            if self.since is not None and at > self.since:
                continue
            start = first
            for p in sorted(v for v in self.protected if first <= v <= last):
                if p > start:
                    yield start, p - 1
                start = p + 1
            if start <= last:
                yield start, last

    def below(self, version: int) -> Iterator[int]:
        """The kept versions below ``version``, in order."""
        v = 0
        for first, last in self.dropped():
            if first >= version:
                break
            yield from range(v, first)
            v = last + 1
        yield from range(v, version)

    def count(self, through: int) -> int:
        """How many versions up to ``through`` are kept."""
        gone = sum(
            min(last, through) + 1 - first for first, last in self.dropped() if first <= through
        )
        return through + 1 - gone


_MAX_VERSION = 2**63


def retained_versions(
    log: VersionLog,
    refs: Refs,
    now: float,
    grace: float | None,
    *,
    retention: Retention | None = None,
    latest: int | None = None,
) -> tuple[int, list[int], frozenset[int]]:
    """(latest, versions to keep, the expired ones among them kept by the grace period).

    Reads the retention record (unless given) before the tags and leases (see refs.py), and
    the latest version (unless given) after them. With ``grace`` None, only unexpired
    versions are kept. The latest, tagged and leased versions are kept whatever the record
    says: ``expire`` never lists the latest, so a record that does is damaged or forged.
    """
    kept = kept_versions(log, refs, now, grace, retention=retention, latest=latest)
    keep = list(kept.below(kept.latest + 1))
    graced = frozenset(
        v for first, last, _ in kept.listed for v in range(first, last + 1) if kept.is_graced(v)
    )
    return kept.latest, keep, graced


def kept_versions(
    log: VersionLog,
    refs: Refs,
    now: float,
    grace: float | None,
    *,
    retention: Retention | None = None,
    latest: int | None = None,
    strict: bool = False,
) -> Kept:
    """The versions a vacuum keeps, read in the order ``retained_versions`` says; ``strict``
    reads the latest as a writer does (a one-version hole is ``CorruptError``)."""
    if retention is None:
        retention, _ = refs.retention()
    protection = refs.protection(now)
    if latest is None:
        latest = log.latest_version(strict=strict)
    return Kept.of(retention, protection, latest, now, grace)


# -- expire ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpireReport:
    #: Versions expired by this call (that would be, in a dry run).
    expired: list[int]
    #: Versions old enough to expire that a tag or an unexpired lease kept, with those refs.
    protected: dict[int, list[str]]
    latest: int
    dry_run: bool


def expire(
    log: VersionLog,
    refs: Refs,
    *,
    keep_last: int | None,
    older_than: float | None,
    now: Callable[[], float],
    dry_run: bool = False,
) -> ExpireReport:
    """Expire every version but the last ``keep_last`` that is older than ``older_than``
    seconds (both conditions, when both are given), skipping tagged and leased versions."""
    if keep_last is None and older_than is None:
        raise ValueError("expire needs keep_last, older_than or both")
    if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
        raise ValueError(
            f"keep_last must be a whole number of at least 1 (the latest is always kept), "
            f"not {keep_last!r}"
        )
    for _ in range(_CAS_ATTEMPTS):
        t = now()
        retention, token = refs.retention()
        protection = refs.protection(t)
        latest = log.latest_version()
        last = latest - (keep_last or 1)  # the newest version that may expire
        candidates = unlisted(retention, last)
        if older_than is not None:
            candidates = _older(log, candidates, t - older_than)
        chosen = [v for v in candidates if v not in protection]
        report = ExpireReport(
            expired=chosen,
            protected={v: protection[v] for v in candidates if v in protection},
            latest=latest,
            dry_run=dry_run,
        )
        if dry_run or not chosen:
            return report
        updated = with_expired(retention, chosen, t)
        try:
            refs.storage.compare_and_swap(RETENTION_KEY, fmt.encode(updated), token)
        except ConflictError:
            continue  # another expire (or vacuum) changed the record: recompute
        return report
    raise RetriesExhaustedError(
        f"gave up expiring {log.storage.uri}: the retention record kept changing"
    )


def unlisted(retention: Retention, last: int) -> list[int]:
    """The versions up to ``last`` the record does not list: O(ranges + the answer)."""
    out: list[int] = []
    v = 0
    for r in sorted(retention.expired, key=lambda r: r.first):
        if r.first > last:
            break
        out += range(v, r.first)
        v = max(v, r.last + 1)
    out += range(v, last + 1)
    return out


def _older(log: VersionLog, candidates: list[int], cutoff: float) -> list[int]:
    """The candidates committed at ``cutoff`` or before, reading O(log n) manifests plus those
    of the versions that qualify, not every candidate's.

    Versions are committed in order, so their times rise but for clocks that disagree: the
    newest candidate old enough is found by bisection, and each candidate before it is read
    and kept only if its own time qualifies. So no version younger than ``older_than``
    expires; an older one committed after a younger one by a clock running behind may wait
    for a later ``expire``.
    """

    def timestamp(i: int) -> float:
        try:
            return log.read(candidates[i]).timestamp
        except TxstoreError as e:
            raise CorruptError(f"cannot expire: version {candidates[i]}: {e}") from e

    lo, hi = 0, len(candidates)
    while lo < hi:
        mid = (lo + hi) // 2
        if timestamp(mid) <= cutoff:
            lo = mid + 1
        else:
            hi = mid
    older = []
    for v, got in each_manifest(log, candidates[:lo]):
        if isinstance(got, Problem):
            raise CorruptError(f"cannot expire: {got.key}: {got.message}")
        if got.timestamp <= cutoff:
            older.append(v)
    return older


# -- vacuum ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VacuumReport:
    #: Files deleted (that would be, in a dry run), with their sizes.
    files: list[FileInfo]
    dry_run: bool
    grace: float
    #: Versions whose files were kept, and expired versions whose files could go.
    kept_versions: int
    expired_versions: int

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def collectable(key: str) -> bool:
    """Whether vacuum may delete ``key`` once no kept version needs it: a data file directly
    in a data folder, an abandoned temp file, or a probe the backend check left. Never a
    manifest, HEAD, ref, txn marker or the check's record, whatever a document names: the
    rule depends on the key alone."""
    return is_temp(key) or fmt.is_data_key(key) or fmt.is_probe_key(key)


def orphans(listing: Iterable[FileInfo], needed: Reach) -> list[FileInfo]:
    """What vacuum deletes (once older than its grace) and verify reports: the collectable
    keys that no kept version needs."""
    keys = needed.keys
    return [f for f in listing if f.key not in keys and collectable(f.key)]


def vacuum(
    log: VersionLog,
    segments: Segments,
    refs: Refs,
    *,
    grace: float,
    now: Callable[[], float],
    dry_run: bool = False,
    progress: Progress = QUIET,
) -> VacuumReport:
    storage = log.storage
    t = now()
    cutoff = t - grace
    latest, keep, graced = retained_versions(log, refs, t, grace)
    needed = reach(log, segments, keep, tolerate=graced, progress=progress)
    _refuse_if_damaged(storage, needed)
    with progress.stage("listing files", 1, "listings") as listed:
        listing = list(storage.list(""))
        listed.update()
    newest = log.latest_version()
    _refuse_if_chain_broken(storage, listing, newest)
    if newest > latest:  # committed while we looked: keep what they need too
        more = reach(log, segments, range(latest + 1, newest + 1), progress=progress)
        _refuse_if_damaged(storage, more)
        needed.segments.update(more.segments)
        needed.files.update(more.files)
    doomed = [f for f in orphans(listing, needed) if f.mtime < cutoff]
    doomed += lapsed_leases(refs, listing, cutoff)
    if dry_run:
        for f in doomed:
            logger.debug("vacuum would delete %s (%d bytes)", f.key, f.size)
    else:
        parallel(lambda f: _delete(storage, f), doomed, "deleting", "files", progress)
    logger.info(
        "vacuum of %s %s %d files (%d bytes)",
        storage.uri,
        "would delete" if dry_run else "deleted",
        len(doomed),
        sum(f.size for f in doomed),
    )
    return VacuumReport(
        files=doomed,
        dry_run=dry_run,
        grace=grace,
        kept_versions=len(keep),
        expired_versions=latest + 1 - len(keep),
    )


def lapsed_leases(refs: Refs, listing: Iterable[FileInfo], cutoff: float) -> list[FileInfo]:
    """The leases in ``listing`` that lapsed before ``cutoff`` and were last written before it."""
    lapsed = {lease_key(lease_id) for lease_id, lease in refs.leases() if lease.expires_at < cutoff}
    return [f for f in listing if f.mtime < cutoff and f.key in lapsed]


def _delete(storage: Storage, f: FileInfo) -> None:
    storage.delete(f.key)
    logger.debug("vacuum deleted %s (%d bytes)", f.key, f.size)


def listed_versions(listing: Iterable[FileInfo]) -> set[int]:
    """The versions whose manifests a listing holds."""
    return {v for f in listing if (v := version_of_key(f.key)) is not None}


def _refuse_if_chain_broken(storage: Storage, listing: list[FileInfo], latest: int) -> None:
    # A hole wider than the latest-version search sees hides the versions past it: their
    # files would look unneeded.
    beyond = [v for v in listed_versions(listing) if v > latest]
    if beyond:
        raise CorruptError(
            f"vacuum stopped before deleting anything: {storage.uri} holds version "
            f"{max(beyond)} past version {latest}, which looks like the latest: the chain of "
            "versions is broken. Run `txstore verify`"
        )


def _refuse_if_damaged(storage: Storage, found: Reach) -> None:
    if found.problems:
        first = found.problems[0]
        raise CorruptError(
            f"vacuum stopped before deleting anything: {len(found.problems)} damaged object(s) "
            f"in {storage.uri}, first {first.key}: {first.message}. Run `txstore verify`"
        )


def parse_grace(grace: float | str | timedelta | None) -> float:
    return DEFAULT_GRACE if grace is None else parse_duration(grace)
