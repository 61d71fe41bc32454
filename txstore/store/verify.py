"""Verify a store: every file an unexpired version needs is there, the right size, intact.

Checks the chain of manifests (every version from 0 to the highest one listed in
``versions/``, each naming its parent, transaction markers naming the commits they record),
tags, leases and the retention record; the segments of unexpired versions (size and CRC-32);
and each data file: by default every byte of it, against the digest or frame checksums its
writer recorded (as ``git fsck`` does); with ``quick``, only its size (from one listing) and
the CRC-32 of its tail, the footer; with ``deep``, also every sample's decoding. Everything is
read from storage, never from this process's caches. Reports, without deleting them, files
no unexpired version needs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..errors import CorruptError, NotFoundError, StoreNotFoundError, TxstoreError
from ..format import manifest as fmt
from ..format.chunk import check_file, parse_footer
from ..format.codec import crc32
from ..format.frames import check_copies, check_offset_tables
from ..format.manifest import ChunkFile, LeaseRecord, Retention, Tag, TxnMarker, chunk_files
from ..storage import FileInfo, Storage
from ..txn import VersionLog, manifest_key, txn_marker_key
from .maintenance import (
    Problem,
    each_manifest,
    listed_versions,
    orphans,
    parallel,
    reach,
    retained_versions,
)
from .progress import QUIET, Progress
from .refs import LEASES, RETENTION_KEY, TAGS, Refs, is_tag_key
from .segments import Segments
from .snapshot import Snapshot

#: What a verify reads: ``quick`` the metadata and each data file's footer, ``contents``
#: (the default) every byte of every data file too, ``deep`` also decodes every sample.
Level = Literal["quick", "contents", "deep"]
#: Whole data files read at once while checking contents (each up to a chunk's size).
_CONTENT_THREADS = 4


@dataclass(frozen=True)
class VerifyReport:
    latest: int
    #: Unexpired versions whose files were checked.
    versions: int
    segments: int
    files: int
    bytes: int
    #: Samples decoded (``deep`` only).
    samples: int | None
    problems: list[Problem]
    #: Files no unexpired version needs: expired versions' files not vacuumed yet, leftovers
    #: of crashed writers, and the new files of writers still at work.
    orphans: list[FileInfo]
    deep: bool
    #: "quick", "contents" or "deep": what was read (see ``Level``).
    level: Level = "contents"

    @property
    def contents_checked(self) -> bool:
        """Whether every byte of every data file was read and checked (not ``quick``)."""
        return self.level != "quick"

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def orphan_bytes(self) -> int:
        return sum(f.size for f in self.orphans)


def _check_tail(storage: Storage, f: ChunkFile, size: int) -> str:
    """What is wrong with one data file's size and footer, or ""."""
    if size != f.size:
        return f"is {size} bytes, its segment says {f.size}"
    tail = storage.read_range_fresh(f.path, f.footer_offset, f.size)
    if len(tail) != f.size - f.footer_offset or crc32(tail) != f.crc32:
        return "does not match its checksum (CRC-32 of its footer)"
    parse_footer(tail, f.path, f.footer_offset)  # raises CorruptError
    return ""


def _check_contents(storage: Storage, f: ChunkFile, size: int, tables: bool) -> str:
    """What is wrong with any byte of one data file, or "" (``check_file``); with ``tables``
    also its frames' offset tables, which only a reader of single samples uses."""
    if size != f.size:
        return f"is {size} bytes, its segment says {f.size}"
    data = storage.read_buffer(f.path)
    try:
        layout = check_file(
            data,
            size=f.size,
            footer_offset=f.footer_offset,
            crc32_=f.crc32,
            digest=f.digest,
            where="the file",
        )
        if tables:
            check_offset_tables(data, layout)
            check_copies(data, layout)
    except CorruptError as e:
        return str(e).removeprefix("the file ")
    return ""


def verify(
    log: VersionLog,
    segments: Segments,
    refs: Refs,
    snapshot: Callable[[int], Snapshot],
    *,
    now: float,
    quick: bool = False,
    deep: bool = False,
    progress: Progress = QUIET,
) -> VerifyReport:
    """Check the store; ``snapshot`` opens a version through caches of its own (fresh)."""
    if quick and deep:
        raise ValueError("verify takes quick or deep, not both")
    level: Level = "quick" if quick else "deep" if deep else "contents"
    storage = log.storage
    problems: list[Problem] = []
    # The record first, the latest after it (as vacuum reads them): expire never lists the
    # latest, so a record that lists the latest read after it is damaged or forged.
    retention: Retention | None
    try:
        retention, _ = refs.retention()
    except TxstoreError as e:
        retention = None
        problems.append(Problem(RETENTION_KEY, str(e)))
    try:
        found = log.latest_version()
    except StoreNotFoundError:
        found = -1  # version 0 is gone: the listing may still hold later ones
    # A listing after the search: it holds every version the search found, and shows the
    # versions a hole hides from the search.
    listing = {f.key: f for f in storage.list("")}
    stored = listed_versions(listing.values())
    latest = max([found, *stored])
    if latest < 0:
        raise StoreNotFoundError(f"no txstore store at {storage.uri}")
    missing = [v for v in range(latest + 1) if v not in stored]

    keep: list[int]
    try:
        if retention is None:
            raise TxstoreError("no retention record")
        _, keep, _ = retained_versions(log, refs, now, None, retention=retention, latest=latest)
    except TxstoreError:  # a damaged ref (reported below): check every version
        keep = list(range(latest + 1))
    if retention is not None:
        problems += _check_retention(retention, latest)
    keep = [v for v in keep if v not in missing]
    # Every manifest, expired ones too: they are what the log, diff and txn ids read.
    present = [v for v in range(latest + 1) if v not in missing]
    # Each version's commit fields are kept, not its manifest: the pass is over the whole
    # history, and the segments are reach()'s to read.
    manifests: dict[int, fmt.CommitRecord] = {}
    for v, entry in each_manifest(
        log, present, progress, fresh=True, stage="reading every manifest"
    ):
        if isinstance(entry, Problem):
            problems.append(entry)
        else:
            manifests[v] = fmt.commit_record(entry)
    markers, marker_problems = _read_markers(storage, listing, progress)
    problems += marker_problems
    for v in missing:
        lost = markers.get(v)
        what = f" (it committed txn {lost.txn_id!r}, commit {lost.commit_id})" if lost else ""
        problems.append(
            Problem(
                manifest_key(v),
                f"is missing while version {latest} exists: the chain of versions is broken{what}",
            )
        )
    problems += _check_chain(manifests, markers, listing, latest)
    problems += _check_refs(refs, manifests)

    needed = reach(log, segments, keep, progress=progress)
    problems += needed.problems
    needer = {f.path: v for c, v in needed.chunks.items() for f in chunk_files(c)}

    def check(f: ChunkFile) -> Problem | None:
        info = listing.get(f.path)
        if info is None:
            return Problem(f.path, f"is missing (needed by version {needer[f.path]})")
        try:
            if quick:
                message = _check_tail(storage, f, info.size)
            else:
                message = _check_contents(storage, f, info.size, deep)
        except NotFoundError:
            message = "is missing"
        except TxstoreError as e:
            message = str(e)
        return Problem(f.path, message) if message else None

    files = list(needed.files.values())
    if quick:
        checked = parallel(check, files, "checking footers", "files", progress)
    else:
        checked = parallel(
            check, files, "reading contents", "files", progress, threads=_CONTENT_THREADS
        )
    problems += [p for p in checked if p is not None]

    samples: int | None = None
    if deep and manifests:
        reader = snapshot(max(manifests))
        chunks = list(needed.chunks)

        def decode(chunk: fmt.ChunkRef) -> int | Problem:
            try:
                n = sum(1 for _ in reader.iter_chunks([chunk]))
            except TxstoreError as e:
                return Problem(chunk.path, str(e))
            if n != chunk.num_samples:
                return Problem(chunk.path, f"decodes to {n} samples, not {chunk.num_samples}")
            return n

        samples = 0
        for got in parallel(decode, chunks, "decoding samples", "chunks", progress):
            if isinstance(got, Problem):
                problems.append(got)
            else:
                samples += got

    # Exactly what vacuum would consider deleting.
    unneeded = orphans(listing.values(), needed)
    return VerifyReport(
        latest=latest,
        versions=len(keep),
        segments=len(needed.segments),
        files=len(files),
        bytes=sum(f.size for f in files),
        samples=samples,
        problems=_unique(problems),
        orphans=unneeded,
        deep=deep,
        level=level,
    )


def _unique(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.key, p.message) not in seen:
            seen.add((p.key, p.message))
            out.append(p)
    return out


_MARKER_KEY = re.compile(r"txns/[0-9a-f]{64}\.json")


def _read_markers(
    storage: Storage, listing: dict[str, FileInfo], progress: Progress
) -> tuple[dict[int, TxnMarker], list[Problem]]:
    """Every transaction marker, by the version it names."""
    keys = [k for k in listing if _MARKER_KEY.fullmatch(k)]

    def read(key: str) -> TxnMarker | Problem | None:
        try:
            marker = fmt.decode(storage.read(key), TxnMarker, f"{storage.uri}/{key}")
        except NotFoundError:
            return None
        except TxstoreError as e:
            return Problem(key, str(e))
        if txn_marker_key(marker.txn_id) != key:
            return Problem(key, f"holds the marker of txn {marker.txn_id!r}, another key's")
        return marker

    markers: dict[int, TxnMarker] = {}
    problems: list[Problem] = []
    read_all = parallel(read, keys, "reading txn markers", "markers", progress)
    for key, got in zip(keys, read_all, strict=True):
        if isinstance(got, Problem):
            problems.append(got)
        elif got is not None:
            if got.version in markers:
                problems.append(Problem(key, f"names version {got.version}, as another does"))
            markers[got.version] = got
    return markers, problems


def _check_chain(
    manifests: dict[int, fmt.CommitRecord],
    markers: dict[int, TxnMarker],
    listing: dict[str, FileInfo],
    latest: int,
) -> list[Problem]:
    """Each manifest names its parent; commit ids and txn ids line up with the markers."""
    problems: list[Problem] = []
    txns: dict[str, int] = {}
    for v, m in sorted(manifests.items()):
        key = manifest_key(v)
        if m.parent != (v - 1 if v else None):
            problems.append(Problem(key, f"names parent {m.parent}, not {v - 1 if v else None}"))
        if m.txn_id is not None:
            if m.txn_id in txns:
                problems.append(
                    Problem(key, f"commits txn {m.txn_id!r} again (version {txns[m.txn_id]})")
                )
            txns.setdefault(m.txn_id, v)
            # Every version below the latest has its txn marker.
            if v < latest and txn_marker_key(m.txn_id) not in listing:
                problems.append(Problem(txn_marker_key(m.txn_id), f"missing (txn of version {v})"))
    for v, marker in sorted(markers.items()):
        named = manifests.get(v)
        key = txn_marker_key(marker.txn_id)
        if named is None:
            if v > latest:
                problems.append(Problem(key, f"names version {v}, which does not exist"))
        elif named.txn_id != marker.txn_id or named.commit_id != marker.commit_id:
            problems.append(
                Problem(
                    key,
                    f"names version {v} as txn {marker.txn_id!r} (commit {marker.commit_id}); "
                    f"the version is txn {named.txn_id!r} (commit {named.commit_id})",
                )
            )
    return problems


def _check_retention(retention: Retention, latest: int) -> list[Problem]:
    """The record lists no version from the latest on (``expire`` never lists the latest;
    vacuum keeps it whatever the record says)."""
    return [
        Problem(
            RETENTION_KEY,
            f"lists versions {r.first} to {r.last} as expired, but version {latest} is the "
            "latest, which never expires: the record is damaged or forged (vacuum keeps the "
            "latest version's files)",
        )
        for r in retention.expired
        if r.last >= latest
    ]


_REF_KEY = re.compile(rf"(?:{TAGS}|{LEASES})[^/]+\.json")


def _check_refs(refs: Refs, manifests: dict[int, fmt.CommitRecord]) -> list[Problem]:
    """Tags and leases decode and name versions that exist, by their commit ids."""
    storage = refs.storage
    problems: list[Problem] = []
    keys = [f.key for f in storage.list("refs/") if _REF_KEY.fullmatch(f.key)]
    for key in keys:
        try:
            data = storage.read(key)
        except NotFoundError:
            continue  # released meanwhile
        except TxstoreError as e:
            problems.append(Problem(key, str(e)))
            continue
        kind: type[Tag] | type[LeaseRecord] = Tag if key.startswith(TAGS) else LeaseRecord
        try:
            doc = (
                refs.decode_tag(key, data)  # also checks the name against the key's
                if is_tag_key(key)
                else fmt.decode(data, kind, f"{storage.uri}/{key}")
            )
        except TxstoreError as e:
            problems.append(Problem(key, str(e)))
            continue
        m = manifests.get(doc.version)
        if m is None:
            problems.append(Problem(key, f"names version {doc.version}, which does not exist"))
        elif m.commit_id != doc.commit_id:
            problems.append(Problem(key, f"names version {doc.version} of another history"))
    return problems
