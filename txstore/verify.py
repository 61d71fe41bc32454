"""Verify a store: every file an unexpired version needs is there, the right size, intact.

Checks every manifest (contiguous, each naming its parent), tags, leases and the retention
record; the segments of unexpired versions (size and CRC-32); each data file's size (from one
listing) and the CRC-32 of its tail, the footer; and with ``deep``, every frame's checksum and
every sample's decoding. Reports, without deleting them, files no unexpired version needs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import NotFoundError, TxstoreError
from .format import manifest as fmt
from .format.chunk import parse_footer
from .format.codec import crc32
from .format.manifest import LeaseRecord, Retention, Tag
from .maintenance import (
    DataFile,
    Problem,
    Progress,
    collectable,
    data_files,
    no_progress,
    parallel,
    reach,
    read_manifests,
    retained_versions,
)
from .refs import LEASES, RETENTION_KEY, TAGS, Refs, is_tag_key
from .segments import Segments
from .snapshot import Snapshot
from .storage import FileInfo
from .txn import VersionLog, manifest_key, txn_marker_key


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

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def orphan_bytes(self) -> int:
        return sum(f.size for f in self.orphans)


def _check_file(storage_read: Callable[[str, int, int], bytes], f: DataFile, size: int) -> str:
    """What is wrong with one data file, or ""."""
    if size != f.size:
        return f"is {size} bytes, its segment says {f.size}"
    tail = storage_read(f.path, f.footer_offset, f.size)
    if crc32(tail) != f.crc32:
        return "does not match its checksum (CRC-32 of its footer)"
    parse_footer(tail, f.path)  # raises CorruptError
    return ""


def verify(
    log: VersionLog,
    segments: Segments,
    refs: Refs,
    snapshot: Callable[[int], Snapshot],
    *,
    now: float,
    deep: bool = False,
    progress: Progress = no_progress,
) -> VerifyReport:
    storage = log.storage
    problems: list[Problem] = []
    try:
        latest, keep, _ = retained_versions(log, refs, now, None)
    except TxstoreError:  # a damaged ref (reported below): check every version
        latest = log.latest_version()
        keep = list(range(latest + 1))
    # Every manifest, expired ones too: they are what the log, diff and txn ids read.
    manifests, bad = read_manifests(log, range(latest + 1), progress)
    problems += bad
    for v, m in manifests.items():
        if m.parent != (v - 1 if v else None):
            problems.append(Problem(manifest_key(v), f"names parent {m.parent}, not {v - 1}"))
    problems += _check_refs(refs, manifests)

    needed = reach(log, segments, keep, progress=progress)
    problems += needed.problems
    listing = {f.key: f for f in storage.list("")}
    for v, m in manifests.items():  # every version below the latest has its txn marker
        if m.txn_id is not None and v < latest and txn_marker_key(m.txn_id) not in listing:
            problems.append(Problem(txn_marker_key(m.txn_id), f"missing (txn of version {v})"))

    needer = {f.path: v for c, v in needed.chunks.items() for f in data_files(c)}

    def check(f: DataFile) -> Problem | None:
        info = listing.get(f.path)
        if info is None:
            return Problem(f.path, f"is missing (needed by version {needer[f.path]})")
        try:
            message = _check_file(storage.read_range, f, info.size)
        except NotFoundError:
            message = "is missing"
        except TxstoreError as e:
            message = str(e)
        return Problem(f.path, message) if message else None

    files = list(needed.files.values())
    problems += [p for p in parallel(check, files, "checking files", progress) if p is not None]

    samples: int | None = None
    if deep:
        reader = snapshot(latest)
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
        for got in parallel(decode, chunks, "decoding samples", progress):
            if isinstance(got, Problem):
                problems.append(got)
            else:
                samples += got

    keys = needed.keys
    # Exactly what vacuum would consider deleting.
    orphans = [f for key, f in listing.items() if key not in keys and collectable(key)]
    return VerifyReport(
        latest=latest,
        versions=len(keep),
        segments=len(needed.segments),
        files=len(files),
        bytes=sum(f.size for f in files),
        samples=samples,
        problems=_unique(problems),
        orphans=orphans,
        deep=deep,
    )


def _unique(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.key, p.message) not in seen:
            seen.add((p.key, p.message))
            out.append(p)
    return out


_REF_KEY = re.compile(rf"(?:{TAGS}|{LEASES})[^/]+\.json")


def _check_refs(refs: Refs, manifests: dict[int, fmt.Manifest]) -> list[Problem]:
    """Tags, leases and the retention record decode and name versions that exist."""
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
    try:
        data = storage.read(RETENTION_KEY)
        fmt.decode(data, Retention, f"{storage.uri}/{RETENTION_KEY}")
    except NotFoundError:
        pass
    except TxstoreError as e:
        problems.append(Problem(RETENTION_KEY, str(e)))
    return problems
