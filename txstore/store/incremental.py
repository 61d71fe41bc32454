"""The incremental vacuum: work proportional to what changed since the last run and what
expired, not to the history.

Versions are linear and manifests immutable, so the files a version stops naming are found
by comparing each version with its parent: only the subtrees of their segment trees that
the two do not share are read (a segment file named by both is the same subtree). The state,
``refs/vacuum.json`` (format §11.10), records the last version compared and the "dead" files:
named by some version up to it, not by it, not deleted yet, each with the newest version that
names it. A dead file whose newest version ``m`` is not kept is named by no version after
``m`` (it would not be dead), so it may go unless a kept version before ``m`` names it, which
is checked by reading those versions (tags and leases on old versions are few).

What it never finds: files no version ever named (crashed writers' chunks, temp files,
probes) and files of subtrees it could not read (of expired versions a full vacuum cleaned).
Those are the full vacuum's (``maintenance.vacuum``), which stays the exact one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ConflictError, CorruptError, NotFoundError, TxstoreError
from ..format import manifest as fmt
from ..format.manifest import Manifest, SegmentRef, VacuumState, chunk_files
from ..storage import FileInfo, Storage
from ..txn import VersionLog
from .maintenance import (
    Kept,
    VacuumReport,
    _delete,
    _refuse_if_damaged,
    collectable,
    kept_versions,
    lapsed_leases,
    parallel,
    reach,
)
from .progress import QUIET, Progress
from .refs import LEASES, Refs
from .segments import Leaf, Loaded, Node, Segments

logger = logging.getLogger(__name__)

STATE_KEY = "refs/vacuum.json"
#: Versions committed while a run compares: it catches up this many times before deleting.
_CATCH_UP = 8
#: Segment files a run remembers between comparisons before it starts afresh.
_REMEMBER = 4096


@dataclass
class Change:
    """What one version changed against its parent."""

    #: Files the parent names and the version does not.
    removed: set[str]
    #: Files in the version's changed subtrees that the parent's changed subtrees do not name:
    #: every file new to the version, and perhaps some it shares (harmless: see ``run``).
    added: set[str]
    #: False when a subtree could not be read (skipped): ``removed`` may lack files.
    complete: bool = True


class Trees:
    """Compares segment trees, reading each segment file once per run.

    ``kept`` decides what a segment that cannot be read means: damage that stops the run if a
    kept version (not one kept only by the grace period) needs it, otherwise a subtree an
    earlier vacuum cleaned, skipped (its files leak to the full vacuum, never the reverse).
    """

    def __init__(self, segments: Segments, kept: Kept, progress: Progress = QUIET) -> None:
        self.segments = segments
        self.kept = kept
        self.progress = progress
        # Segment files never change: what one comparison read, the next (whose old side is
        # this one's new side) reuses. A failed read is remembered too, and judged again for
        # each version that needs the file.
        self._loaded: dict[str, Loaded | TxstoreError] = {}
        # The segment files under each node, worked out once a run: every comparison that
        # drops a segment looks it up under the shared nodes, which would otherwise mean
        # walking the whole shared tree once per version compared.
        self._below: dict[str, frozenset[str]] = {}
        self.skipped = 0

    def trim(self) -> None:
        if len(self._loaded) > _REMEMBER:
            self._loaded.clear()

    def load(
        self, refs: Sequence[SegmentRef], version: int, *, keep_leaves: bool = True
    ) -> list[Loaded | None]:
        """The segment files of ``refs`` as ``version`` needs them (None: skipped); without
        ``keep_leaves``, leaves are not remembered (a whole tree's would fill memory)."""
        wanted = list({r.path: r for r in refs if r.path not in self._loaded}.values())

        def read(ref: SegmentRef) -> Loaded | TxstoreError:
            try:
                return self.segments.read(ref, version=version, fresh=True)
            except TxstoreError as e:
                return e

        got_all = (
            parallel(read, wanted, "reading segments", "segments", QUIET)
            if len(wanted) > 2
            else [read(r) for r in wanted]
        )
        fetched = {r.path: got for r, got in zip(wanted, got_all, strict=True)}
        self._loaded.update(
            (p, got) for p, got in fetched.items() if keep_leaves or not isinstance(got, Leaf)
        )
        out: list[Loaded | None] = []
        for ref in refs:
            got = fetched[ref.path] if ref.path in fetched else self._loaded[ref.path]
            if not isinstance(got, TxstoreError) and ref.path not in fetched:
                try:  # read under another reference: the counts must agree (as Segments)
                    self.segments.matches(ref, got, version)
                except TxstoreError as e:
                    got = e
            if isinstance(got, TxstoreError):
                if version in self.kept and not self.kept.is_graced(version):
                    raise CorruptError(
                        f"vacuum stopped before deleting anything: {got}. Run `txstore verify`"
                    )
                logger.debug("vacuum skips %s of version %d: %s", ref.path, version, got)
                self.skipped += 1
                out.append(None)
            else:
                out.append(got)
        return out

    def compare(self, old: Manifest, new: Manifest) -> Change:
        """The files ``new`` stopped naming and those it may have added, against ``old``."""
        skipped = self.skipped
        sides = (
            ({r.path: r for r in old.segments}, set[str](), old.version),
            ({r.path: r for r in new.segments}, set[str](), new.version),
        )
        (old_todo, old_files, _), (new_todo, new_files, _) = sides
        shared: list[SegmentRef] = []
        while old_todo or new_todo:
            # A path both name is one subtree. Levels go down one at a time on both sides, so
            # a segment one side names at level k is matched before either side reads it.
            for path in old_todo.keys() & new_todo.keys():
                del old_todo[path]
                shared.append(new_todo.pop(path))
            if not (old_todo or new_todo):
                break
            level = max(r.level for todo, _, _ in sides for r in todo.values())
            for todo, files, version in sides:
                now = [r for r in todo.values() if r.level == level]
                for ref, got in zip(now, self.load(now, version), strict=True):
                    del todo[ref.path]
                    files.add(ref.path)
                    if isinstance(got, Node):
                        for child in got.children:
                            todo.setdefault(child.path, child)
                    elif isinstance(got, Leaf):
                        for chunk in got.chunks:
                            files.update(f.path for f in chunk_files(chunk))
        removed = old_files - new_files
        # One version may name a file twice: a chunk (a staged part may name a committed one)
        # and a segment too (appends of the same chunks make segments of the same content,
        # which a writer writes once and names wherever they occur). So what left the changed
        # subtrees may still be under a shared one: look there. For a chunk that means every
        # shared segment (rare: compaction, rollback, dropped fields); for a segment, only
        # the shared nodes (a few, and read once a run: they persist). If a shared subtree
        # cannot be read, nothing is called removed: it leaks to the full vacuum.
        if removed and shared:
            before = self.skipped
            # What the new version names again, as a shared subtree or under one.
            named = {r.path for r in shared} & removed
            if any(not f.startswith(fmt.SEGMENTS) for f in removed):
                named |= removed & self._under(shared, new.version)
            else:
                for ref in shared:
                    if ref.level:
                        named |= removed & self._segments_below(ref, new.version)
            removed = set() if self.skipped != before else removed - named
        return Change(removed, new_files - old_files, complete=self.skipped == skipped)

    def _segments_below(self, ref: SegmentRef, version: int) -> frozenset[str]:
        """Every segment file under the node ``ref`` (empty, with ``skipped`` counted, where
        a node cannot be read)."""
        known = self._below.get(ref.path)
        if known is not None:
            return known
        before = self.skipped
        (got,) = self.load([ref], version, keep_leaves=False)
        if not isinstance(got, Node):
            return frozenset()
        nodes = [c for c in got.children if c.level and c.path not in self._below]
        if len(nodes) > 1:
            self.load(nodes, version, keep_leaves=False)  # read together, then remembered
        paths = {c.path for c in got.children}
        for child in got.children:
            if child.level:
                paths |= self._segments_below(child, version)
        if self.skipped != before:
            return frozenset(paths)  # incomplete: not remembered
        self._below[ref.path] = frozen = frozenset(paths)
        return frozen

    def _under(self, refs: Sequence[SegmentRef], version: int) -> set[str]:
        """Every segment, chunk and field file under ``refs``."""
        found: set[str] = set()
        level = list(refs)
        while level:
            below: dict[str, SegmentRef] = {}
            for got in self.load(level, version, keep_leaves=False):
                if isinstance(got, Node):
                    for child in got.children:
                        if child.path not in found:
                            found.add(child.path)
                            below[child.path] = child
                elif isinstance(got, Leaf):
                    for chunk in got.chunks:
                        found.update(f.path for f in chunk_files(chunk))
            level = list(below.values())
        return found


def _latest(log: VersionLog) -> int:
    """The latest version, refusing a one-version hole in the chain as a writer does (the
    full vacuum lists ``versions/`` and finds any): versions past it could name dead files."""
    try:
        return log.latest_version(strict=True)
    except CorruptError as e:
        raise CorruptError(f"vacuum stopped before deleting anything: {e}") from e


def read_state(storage: Storage) -> tuple[VacuumState | None, str | None]:
    """The state and its compare-and-swap token (None, None: no state yet)."""
    try:
        data, token = storage.read_with_token(STATE_KEY)
    except NotFoundError:
        return None, None
    return fmt.decode(data, VacuumState, f"{storage.uri}/{STATE_KEY}"), token


def _check_state(log: VersionLog, state: VacuumState, latest: int) -> Manifest:
    """The manifest the state left off at, if the state belongs to this history."""
    where = f"{log.storage.uri}/{STATE_KEY}"
    advice = f"delete {STATE_KEY} to rebuild it (the next incremental vacuum reads the history)"
    if state.through > latest:
        raise CorruptError(
            f"vacuum stopped before deleting anything: {where} left off at version "
            f"{state.through}, past the latest version {latest}: {advice}"
        )
    manifest = log.read(state.through, fresh=True)
    if manifest.commit_id != state.commit_id:
        raise CorruptError(
            f"vacuum stopped before deleting anything: {where} left off at commit "
            f"{state.commit_id} as version {state.through}, which is commit "
            f"{manifest.commit_id}: {advice}"
        )
    return manifest


def vacuum_incremental(
    log: VersionLog,
    segments: Segments,
    refs: Refs,
    *,
    grace: float,
    now: Callable[[], float],
    dry_run: bool = False,
    progress: Progress = QUIET,
) -> VacuumReport:
    """Delete the files that versions stopped naming since the last run, once no kept
    version needs them and they are older than ``grace``; see the module's docstring."""
    storage = log.storage
    t = now()
    cutoff = t - grace
    state, token = read_state(storage)
    try:
        kept = kept_versions(log, refs, t, grace, strict=True)
    except CorruptError as e:  # a hole in the chain, or a damaged record
        raise CorruptError(f"vacuum stopped before deleting anything: {e}") from e
    latest = kept.latest
    if state is None:
        prev = log.read(0, fresh=True)
        dead: dict[str, int] = {}
    else:
        prev = _check_state(log, state, latest)
        dead = dict(state.dead)
    trees = Trees(segments, kept, progress)
    target = latest
    for _ in range(_CATCH_UP):
        if prev.version < target:
            with progress.stage("comparing versions", target - prev.version, "versions") as counter:
                for v in range(prev.version + 1, target + 1):
                    cur = log.read(v, fresh=True)
                    if cur.parent is not None and cur.parent != v - 1:
                        raise CorruptError(
                            f"vacuum stopped before deleting anything: version {v} of "
                            f"{storage.uri} names parent {cur.parent}, not {v - 1}"
                        )
                    change = trees.compare(prev, cur)
                    # Added first: a rollback names again what its parent dropped.
                    for f in change.added:
                        dead.pop(f, None)
                    for f in change.removed:
                        dead[f] = v - 1
                    trees.trim()
                    prev = cur
                    counter.update()
        # Versions committed meanwhile may name dead files again: compare them too.
        target = _latest(log)
        if target == prev.version:
            break
    else:
        raise ConflictError(f"vacuum of {storage.uri} gave up: versions kept being committed")

    doomed, gone = _doomed(log, kept, dead, cutoff, trees, progress)
    doomed += lapsed_leases(refs, storage.list(LEASES), cutoff)
    for key in gone:
        del dead[key]
    if not dry_run:
        parallel(lambda info: _delete(storage, info), doomed, "deleting", "files", progress)
        for info in doomed:
            dead.pop(info.key, None)
        new_state = VacuumState(through=prev.version, commit_id=prev.commit_id, dead=dead)
        try:
            storage.compare_and_swap(STATE_KEY, fmt.encode(new_state), token)
        except ConflictError:
            # Another vacuum ran meanwhile and recorded its own progress: ours only repeated
            # deletions of garbage.
            logger.info("vacuum of %s: another vacuum ran meanwhile", storage.uri)
    logger.info(
        "incremental vacuum of %s %s %d files (%d bytes)",
        storage.uri,
        "would delete" if dry_run else "deleted",
        len(doomed),
        sum(f.size for f in doomed),
    )
    kept_count = kept.count(latest)
    return VacuumReport(
        files=doomed,
        dry_run=dry_run,
        grace=grace,
        kept_versions=kept_count,
        expired_versions=latest + 1 - kept_count,
    )


def _doomed(
    log: VersionLog,
    kept: Kept,
    dead: dict[str, int],
    cutoff: float,
    trees: Trees,
    progress: Progress,
) -> tuple[list[FileInfo], list[str]]:
    """(dead files to delete now, dead files already gone)."""
    # A dead file whose newest version m is kept stays; otherwise no version after m names it.
    candidates = {f: m for f, m in dead.items() if m not in kept and collectable(f)}
    if not candidates:
        return [], []
    # Kept versions before some candidate's m (a tag or a lease on an old version, a range
    # in its grace period) may name it: read them, all at once (their trees share most).
    below = list(kept.below(max(candidates.values())))
    if below:
        graced = frozenset(v for v in below if kept.is_graced(v))
        needed = reach(log, trees.segments, below, tolerate=graced, progress=progress)
        _refuse_if_damaged(log.storage, needed)
        first, needed_keys = below[0], needed.keys
        candidates = {f: m for f, m in candidates.items() if m < first or f not in needed_keys}
    storage = log.storage
    keys = sorted(candidates)
    infos = parallel(storage.info, keys, "checking files", "files", progress)
    gone = [k for k, info in zip(keys, infos, strict=True) if info is None]
    doomed = [info for info in infos if info is not None and info.mtime < cutoff]
    unproven = _check_dead(log, trees, {f.key: candidates[f.key] for f in doomed})
    gone += unproven
    return [f for f in doomed if f.key not in unproven], gone


def _check_dead(log: VersionLog, trees: Trees, doomed: dict[str, int]) -> list[str]:
    """Check the state's word before deleting: each file must be one that version m + 1
    stopped naming, by comparing m and m + 1 again (what expired, read once more). A file it
    does not name is damage or forgery: nothing is deleted. Returns the files the comparison
    could not prove for want of a cleaned subtree: kept off the list, left to a full vacuum."""
    by_version: dict[int, list[str]] = {}
    for f, m in doomed.items():
        by_version.setdefault(m, []).append(f)
    unproven: list[str] = []
    for m, files in sorted(by_version.items()):
        change = trees.compare(log.read(m, fresh=True), log.read(m + 1, fresh=True))
        trees.trim()
        wrong = [f for f in files if f not in change.removed]
        if wrong and change.complete:
            raise CorruptError(
                f"vacuum stopped before deleting anything: {log.storage.uri}/{STATE_KEY} "
                f"says version {m + 1} stopped naming {wrong[0]!r}, and it did not (damaged "
                f"or forged): delete {STATE_KEY} to rebuild it, or run the full vacuum"
            )
        unproven += wrong
    return unproven


def state_size(storage: Storage) -> int:
    """How many dead files the state holds (0 without one): for benchmarks and tests."""
    state, _ = read_state(storage)
    return 0 if state is None else len(state.dead)


__all__ = ["STATE_KEY", "Change", "Trees", "read_state", "state_size", "vacuum_incremental"]
