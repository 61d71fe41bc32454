"""Manifests, segments, the HEAD hint and transaction markers: JSON documents as msgspec Structs.

Every document carries ``format`` ("txstore") and ``format_version`` [major, minor]; a reader
refuses a newer major version and anything that is not a txstore document. Every path a
document names is checked to stay inside the store's root, and a data file's path to lie in
its data folder.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from ..errors import CorruptError, UnsupportedFormatError

FORMAT = "txstore"
FORMAT_MAJOR, FORMAT_MINOR = 1, 5

_SAFE_PATH = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*")


# Ranges of the numbers documents hold, checked as they are decoded (format §3): a forged or
# damaged number is a CorruptError there, never an OverflowError or a wrong answer later.
#: Counts, sizes, offsets and version numbers: non-negative and within a signed 64-bit int
#: (``len()`` of a snapshot must fit in a Py_ssize_t).
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
#: A sample count difference (``added_samples`` of a rollback or compaction may be negative).
Delta = Annotated[int, msgspec.Meta(ge=-(2**63 - 1), le=2**63 - 1)]
#: A CRC-32.
U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
#: A positive size (store settings).
Size = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]
#: A format version number.
FormatNumber = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
#: Seconds since the Unix epoch, UTC, from 1970 to the end of year 9999 (what ``datetime``
#: represents): finite, so every tool can show it.
MAX_TIMESTAMP = 253402300799.0
Timestamp = Annotated[float, msgspec.Meta(ge=0, le=MAX_TIMESTAMP)]


def check_path(path: str, where: str, inside: str = "the store root") -> str:
    """A path relative to a folder (the store's, or an imported dataset's), refused if it
    could name anything outside that folder."""
    if not _SAFE_PATH.fullmatch(path) or any(p in (".", "..") for p in path.split("/")):
        raise CorruptError(f"{where} names an unsafe path {path!r} (outside {inside})")
    return path


#: The data folders: chunk files and field files live directly in ``chunks/``, segment files
#: directly in ``segments/``, and nowhere else. These are the only folders vacuum deletes
#: from, so a document naming a data file elsewhere (say ``versions/x.chunk``) is corrupt:
#: otherwise a forged reference would make a metadata folder look like data.
CHUNKS = "chunks/"
SEGMENTS = "segments/"
DATA_PREFIXES = (CHUNKS, SEGMENTS)
# A file name in a data folder: no sub-folder, and no leading dot (lock files, hidden files
# and the local backend's ".tmp." files are never data).
_DATA_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")


def is_data_path(path: str, folder: str) -> bool:
    """Whether ``path`` names a file directly in the data folder ``folder``."""
    return path.startswith(folder) and _DATA_NAME.fullmatch(path[len(folder) :]) is not None


def is_data_key(key: str) -> bool:
    """Whether ``key`` could be a data file (a chunk, field or segment file) of the store."""
    return any(is_data_path(key, folder) for folder in DATA_PREFIXES)


def check_data_path(path: str, folder: str, where: str) -> str:
    """A data file's path, refused unless it lies directly in its data folder ``folder``."""
    if path.startswith(folder) and _DATA_NAME.fullmatch(path, len(folder)) is not None:
        # A plain name in its folder is a safe path too: no "/", no "." or ".." (no leading
        # dot), only characters a safe path allows. One match, not three checks: a segment
        # names thousands of chunks.
        return path
    check_path(path, where)
    if not is_data_path(path, folder):
        raise CorruptError(
            f"{where} names a data file outside {folder}: {path!r} (data files of this kind "
            f"live only directly in {folder})"
        )
    return path


def check_chunk_paths(chunk: ChunkRef, where: str) -> None:
    """A chunk reference's chunk file and field files lie in ``chunks/``."""
    check_data_path(chunk.path, CHUNKS, where)
    for extra in chunk.field_files:
        check_data_path(extra.path, CHUNKS, where)


# Data file names, one per line: a name cannot hold a newline, so the lines are the names.
_DATA_LINES = {
    folder: re.compile(rf"(?:{re.escape(folder)}{_DATA_NAME.pattern}\n)*")
    for folder in DATA_PREFIXES
}


def _all_data_paths(paths: list[str], folder: str) -> bool:
    """Whether every path lies directly in ``folder``: one match over them all, not one a
    path (a leaf segment names hundreds of chunks, and every open reads one)."""
    if not paths:
        return True
    lines = "\n".join(paths) + "\n"
    # A path holding a newline would pass as two names: the count of lines rules it out.
    return lines.count("\n") == len(paths) and _DATA_LINES[folder].fullmatch(lines) is not None


def check_chunk_refs(chunks: Sequence[ChunkRef], where: str) -> None:
    """Chunk references' files lie in ``chunks/`` and their footers inside them."""
    paths = [c.path for c in chunks]
    for chunk in chunks:
        if chunk.field_files:
            paths += [extra.path for extra in chunk.field_files]
    clean = _all_data_paths(paths, CHUNKS)
    if clean and not any([c.footer_offset > c.size for c in chunks]):
        return
    for chunk in chunks:  # say which reference is wrong
        check_chunk_paths(chunk, where)
        if chunk.footer_offset > chunk.size:
            raise CorruptError(
                f"{where} is not a valid segment: chunk {chunk.path!r} has its footer at "
                f"{chunk.footer_offset}, past the file's size {chunk.size}"
            )


#: A new store's settings unless its creator says otherwise (``create``, ``optimize``).
DEFAULT_CHUNK_BYTES = 64 * 2**20
DEFAULT_BLOCK_BYTES = 64 * 2**10
DEFAULT_COMPRESSION_LEVEL = 3


# Documents and references are ``gc=False``: decoded they are trees of values, never cycles, so
# the cycle collector need not track them. A segment of hundreds of references then counts
# for nothing toward the collector's thresholds, whose full passes over a large heap (a
# process that imported torch) would otherwise fall inside opens.
class StoreConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False, gc=False):
    chunk_bytes: Size
    block_bytes: Size
    compression: Literal["zstd"] | None
    compression_level: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


def _check_offset(footer_offset: int, size: int) -> None:
    if footer_offset > size:
        raise ValueError(f"footer_offset {footer_offset} is past the file's size {size}")


class FieldFile(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Columns added to a chunk later (``add_fields``): a chunk-format file of the same blocks.

    Its blocks hold exactly the samples of the chunk's blocks, in order; ``columns`` are the
    columns it holds, ``hidden`` those dropped since (or replaced by a later field file).
    """

    path: str
    size: Count
    crc32: U32
    footer_offset: Count
    columns: tuple[str, ...]
    hidden: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_offset(self.footer_offset, self.size)


class ChunkRef(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One chunk file: where, how many samples, and how to check it.

    A sample's fields are the chunk file's columns minus ``hidden``, then each field file's
    visible columns (format 1.1; a column is visible in at most one file).
    """

    path: str
    num_samples: Count
    size: Count
    crc32: U32
    footer_offset: Count
    hidden: tuple[str, ...] = ()
    field_files: tuple[FieldFile, ...] = ()
    #: XXH3-64 of the file's bytes [0, footer_offset) in hex (format 1.2; None before).
    digest: str | None = None
    # No __post_init__: a segment holds thousands, whose footer offsets ``decode`` checks in
    # one loop with their paths; a writer makes them from the files it wrote.


@dataclass(frozen=True, slots=True)
class ChunkFile:
    """One file holding columns of a chunk: the chunk file itself or one of its field files,
    with what the manifest says about it."""

    path: str
    size: int
    crc32: int
    footer_offset: int
    hidden: frozenset[str]
    digest: str | None = None  # of the bytes before the footer (chunk files, format 1.2)
    #: The chunk's samples, as its segment says (every file of a chunk holds them all).
    num_samples: int = -1


def base_file(chunk: ChunkRef) -> ChunkFile:
    """The chunk file of ``chunk``."""
    return ChunkFile(
        chunk.path,
        chunk.size,
        chunk.crc32,
        chunk.footer_offset,
        frozenset(chunk.hidden),
        chunk.digest,
        chunk.num_samples,
    )


def chunk_files(chunk: ChunkRef) -> list[ChunkFile]:
    """The chunk file, then its field files (format 1.1)."""
    files = [base_file(chunk)]
    for f in chunk.field_files:
        files.append(
            ChunkFile(
                f.path,
                f.size,
                f.crc32,
                f.footer_offset,
                frozenset(f.hidden),
                num_samples=chunk.num_samples,
            )
        )
    return files


#: 1.3: the deepest a segment tree may go (levels 0 to this). Far past what any store needs
#: (each level multiplies the chunks a node covers by its fan-out), low enough that a forged
#: level cannot make a reader descend for long.
MAX_SEGMENT_LEVEL = 32
SegmentLevel = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEGMENT_LEVEL)]


class SegmentRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """A segment file as a manifest or a segment node names it: at ``level`` 0 a segment (an
    immutable list of chunks), at level k > 0 (1.3) a segment node naming segment files of
    level k - 1. ``num_samples`` and ``num_chunks`` count everything beneath it."""

    path: str
    num_samples: Count
    num_chunks: Count
    size: Count
    crc32: U32
    level: SegmentLevel = 0  # omitted at 0: a 1.2 reader sees the references it knows


class _Document(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    format: str = FORMAT
    format_version: tuple[FormatNumber, FormatNumber] = (FORMAT_MAJOR, FORMAT_MINOR)


class Segment(_Document, tag="segment", kw_only=True, frozen=True):
    chunks: tuple[ChunkRef, ...]
    #: 1.4: each chunk's ``num_samples``, in order (None: written before 1.4), so a reader of
    #: one sample finds its chunk without decoding every reference (``SegmentIndex``).
    counts: tuple[Count, ...] | None = None


#: A reference (a chunk's, a segment's) left as its JSON; a file's references, each so.
RawRef = msgspec.Raw
RawRefs = list[RawRef]


class SegmentIndex(_Document, tag="segment", kw_only=True, frozen=True):
    """A segment as a reader of one sample decodes it: its counts, and each chunk reference
    left as JSON until it is needed (``segment_chunk``)."""

    chunks: RawRefs
    counts: tuple[Count, ...] | None = None


def new_segment(chunks: tuple[ChunkRef, ...]) -> Segment:
    """The segment a writer writes for ``chunks``: with their counts (1.4)."""
    return Segment(chunks=chunks, counts=tuple(c.num_samples for c in chunks))


def counts_match(doc: Segment | SegmentNode, where: str) -> None:
    """A segment's counts (1.4) are its chunks' sample counts, a node's (1.5) its
    references'."""
    if doc.counts is None:
        return
    if isinstance(doc, Segment):
        if list(doc.counts) != [c.num_samples for c in doc.chunks]:
            raise CorruptError(f"{where} is not a valid segment: its counts are not its chunks'")
    elif list(doc.counts) != [s.num_samples for s in doc.segments]:
        raise CorruptError(
            f"{where} is not a valid segment node: its counts are not its references'"
        )


_chunk_decoder = msgspec.json.Decoder(ChunkRef)


def segment_chunk(raw: msgspec.Raw, count: int, where: str) -> ChunkRef:
    """One chunk reference of a ``SegmentIndex``, decoded and checked as a whole segment's
    are, and holding the ``count`` samples the segment's counts say."""
    try:
        chunk = _chunk_decoder.decode(raw)
    except msgspec.DecodeError as e:
        raise CorruptError(f"{where} is not a valid segment: {e}") from e
    check_chunk_refs((chunk,), where)
    if chunk.num_samples != count:
        raise CorruptError(
            f"{where} is not a valid segment: chunk {chunk.path!r} holds {chunk.num_samples} "
            f"samples, its count says {count}"
        )
    return chunk


class SegmentNode(_Document, tag="segment-node", kw_only=True, frozen=True):
    """1.3: an inner node of a manifest's segment tree: segment files one level down, in
    sample order. Its own ``type``, so a reader that predates it refuses it as corrupt
    rather than reading it as a segment of no chunks."""

    segments: tuple[SegmentRef, ...]
    #: 1.5: each reference's ``num_samples``, in order (None: written before 1.5), so a reader
    #: of one sample descends without decoding every reference (``SegmentNodeIndex``).
    counts: tuple[Count, ...] | None = None


class SegmentNodeIndex(_Document, tag="segment-node", kw_only=True, frozen=True):
    """A segment node as a reader of one sample decodes it: its counts, and each reference
    left as JSON until it is needed (``node_child``)."""

    segments: RawRefs
    counts: tuple[Count, ...] | None = None


def new_node(refs: tuple[SegmentRef, ...]) -> SegmentNode:
    """The node a writer writes over ``refs``: with their counts (1.5)."""
    return SegmentNode(segments=refs, counts=tuple(r.num_samples for r in refs))


_ref_decoder = msgspec.json.Decoder(SegmentRef)


def node_child(raw: msgspec.Raw, count: int, level: int, where: str) -> SegmentRef:
    """One reference of a ``SegmentNodeIndex`` at ``level``, decoded and checked as a whole
    node's are (a segment file one level down), and holding the ``count`` samples the node's
    counts say."""
    try:
        child = _ref_decoder.decode(raw)
    except msgspec.DecodeError as e:
        raise CorruptError(f"{where} is not a valid segment node: {e}") from e
    check_data_path(child.path, SEGMENTS, where)
    if child.level != level - 1:
        raise CorruptError(
            f"{where} is a segment node of level {level} naming {child.path!r} at level "
            f"{child.level}, not {level - 1}"
        )
    if child.num_samples != count:
        raise CorruptError(
            f"{where} is not a valid segment node: {child.path!r} holds {child.num_samples} "
            f"samples, its count says {count}"
        )
    return child


def check_segment(
    ref: SegmentRef, doc: Segment | SegmentIndex | SegmentNode | SegmentNodeIndex, where: str
) -> list[int]:
    """A segment file decoded under ``ref`` holds what ``ref`` says: a segment at level 0, a
    node of non-empty references one level down above it, the same samples and chunks.
    Returns where each chunk (or reference) starts among the samples, then their total. Of a
    ``SegmentNodeIndex`` only the samples: its references' levels and chunks are checked as
    they are decoded (``node_child``, ``Node.children``)."""
    if isinstance(doc, SegmentNodeIndex):
        if ref.level == 0:
            raise CorruptError(f"{where} is a segment node, its reference says a segment")
        if not doc.segments:
            raise CorruptError(f"{where} is a segment node naming no segments")
        if doc.counts is None or len(doc.counts) != len(doc.segments):
            raise CorruptError(f"{where} is not a valid segment node: no count per reference")
        starts = list(accumulate(doc.counts, initial=0))
        if starts[-1] != ref.num_samples:
            raise CorruptError(
                f"{where} holds {starts[-1]} samples, its reference says {ref.num_samples}"
            )
        return starts
    if isinstance(doc, (Segment, SegmentIndex)):
        if ref.level != 0:
            raise CorruptError(f"{where} is a segment, its reference says level {ref.level}")
        if isinstance(doc, SegmentIndex):
            if doc.counts is None or len(doc.counts) != len(doc.chunks):
                raise CorruptError(f"{where} is not a valid segment: it has no count per chunk")
            starts = list(accumulate(doc.counts, initial=0))
        else:
            starts = list(accumulate([c.num_samples for c in doc.chunks], initial=0))
        chunks = len(doc.chunks)
    else:
        if ref.level == 0:
            raise CorruptError(f"{where} is a segment node, its reference says a segment")
        if not doc.segments:
            raise CorruptError(f"{where} is a segment node naming no segments")
        children = doc.segments
        if [c.level for c in children].count(ref.level - 1) != len(children):
            child = next(c for c in children if c.level != ref.level - 1)
            raise CorruptError(
                f"{where} is a segment node of level {ref.level} naming {child.path!r} "
                f"at level {child.level}, not {ref.level - 1}"
            )
        starts = list(accumulate([c.num_samples for c in children], initial=0))
        chunks = sum([c.num_chunks for c in children])
    if starts[-1] != ref.num_samples or chunks != ref.num_chunks:
        raise CorruptError(
            f"{where} holds {chunks} chunks and {starts[-1]} samples, its reference says "
            f"{ref.num_chunks} and {ref.num_samples}"
        )
    return starts


class Manifest(_Document, tag="manifest", kw_only=True, frozen=True):
    """One committed version: the whole dataset as an ordered list of segments."""

    version: Count
    parent: Count | None
    commit_id: str
    txn_id: str | None = None
    operation: str
    timestamp: Timestamp
    message: str | None = None
    num_samples: Count
    added_samples: Delta
    config: StoreConfig
    segments: tuple[SegmentRef, ...]
    properties: dict[str, str] = {}
    #: 1.1: the version whose content a "rollback" restores or a "compact" rewrote.
    source_version: Count | None = None

    def __post_init__(self) -> None:
        # Cheap here, and what makes ``len()`` of a snapshot agree with its samples.
        total = sum([s.num_samples for s in self.segments])
        if total != self.num_samples:
            raise ValueError(
                f"num_samples is {self.num_samples}, its segments hold {total} samples"
            )


class CommitRecord(_Document, tag="manifest", kw_only=True, frozen=True):
    """A manifest's commit fields alone (the same document, the same checks on each field):
    what the history lists. Decoding it skips the config and the segment references, some
    seven in eight of a large store's manifest decoding time."""

    version: Count
    parent: Count | None
    commit_id: str
    txn_id: str | None = None
    operation: str
    timestamp: Timestamp
    message: str | None = None
    num_samples: Count
    added_samples: Delta
    source_version: Count | None = None


def commit_record(m: Manifest) -> CommitRecord:
    """A manifest's commit fields, without its config and segments (what a pass over the
    whole history keeps of each version)."""
    return CommitRecord(**{name: getattr(m, name) for name in CommitRecord.__struct_fields__})


class Head(_Document, tag="head", kw_only=True, frozen=True):
    """The HEAD hint: a recent version, only ever moved forward. Never trusted alone."""

    version: Count


class TxnMarker(_Document, tag="txn", kw_only=True, frozen=True):
    """Records which version committed a caller's transaction id."""

    txn_id: str
    version: Count
    commit_id: str


class Tag(_Document, tag="tag", kw_only=True, frozen=True):
    """1.1: ``refs/tags/<name>.json``, a name for one version (checked by its commit id)."""

    name: str
    version: Count
    commit_id: str
    timestamp: Timestamp
    message: str | None = None


#: The backend check (format §9): the record of the endpoints whose conditional writes were
#: proved, and the probe objects the check writes (garbage once the check is over).
CHECKS = "checks/"
STORAGE_CHECK_KEY = "checks/storage.json"
_PROBE_NAME = re.compile(r"probe\.[0-9a-f]{32}")


def probe_key(token: str) -> str:
    """The probe object of one run of the check; ``token`` is 32 hex digits."""
    key = f"{CHECKS}probe.{token}"
    if not is_probe_key(key):
        raise ValueError(f"a probe token is 32 hex digits, not {token!r}")
    return key


def is_probe_key(key: str) -> bool:
    return key.startswith(CHECKS) and _PROBE_NAME.fullmatch(key[len(CHECKS) :]) is not None


class CheckedEndpoint(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One endpoint whose conditional writes passed the check, and when."""

    endpoint: str
    checks: tuple[str, ...]
    checked_at: Timestamp


class StorageCheck(_Document, tag="storage-check", kw_only=True, frozen=True):
    """``checks/storage.json``: the endpoints through which writers may trust this store's
    backend with commits. Only a hint to skip the probe: a lost or damaged record costs one
    more probe, never a commit."""

    endpoints: tuple[CheckedEndpoint, ...] = ()


class LeaseRecord(_Document, tag="lease", kw_only=True, frozen=True):
    """1.1: ``refs/leases/<id>.json``, a running job's pin on a version until ``expires_at``."""

    version: Count
    commit_id: str
    created: Timestamp
    expires_at: Timestamp
    owner: str = ""


class ExpiredRange(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Versions ``first`` to ``last`` (inclusive), expired at ``expired_at``."""

    first: Count
    last: Count
    expired_at: Timestamp


class Retention(_Document, tag="retention", kw_only=True, frozen=True):
    """1.1: ``refs/retention.json``, the versions ``expire`` expired: disjoint, sorted."""

    expired: tuple[ExpiredRange, ...] = ()


class VacuumState(_Document, tag="vacuum-state", kw_only=True, frozen=True):
    """1.3: ``refs/vacuum.json``, where the incremental vacuum left off: it has compared every
    version up to ``through`` (whose commit id is ``commit_id``) with its parent. ``dead``
    holds each data file that some version up to ``through`` names, version ``through`` does
    not, and no vacuum has deleted yet, with the newest such version that names it."""

    through: Count
    commit_id: str
    dead: dict[str, Count] = {}


class _Envelope(msgspec.Struct, forbid_unknown_fields=False):
    format: Any = None
    format_version: Any = None
    type: Any = None


_encoder = msgspec.json.Encoder()
D = TypeVar("D", bound=_Document)
S = TypeVar("S", bound=msgspec.Struct)


def replace(struct: S, **changes: Any) -> S:
    """A copy of a frozen struct with ``changes``."""
    return msgspec.structs.replace(struct, **changes)


def encode(doc: _Document) -> bytes:
    return _encoder.encode(doc)


def _check_envelope(data: bytes, where: str) -> None:
    """Refuse a document that is not JSON, not txstore's, or of a newer major version."""
    try:
        env = msgspec.json.decode(data, type=_Envelope)
    except msgspec.DecodeError as e:
        raise CorruptError(f"{where} is not valid JSON: {e}") from e
    if env.format != FORMAT:
        raise CorruptError(f"{where} is not a txstore document (format={env.format!r})")
    version = env.format_version
    if not (isinstance(version, list) and len(version) == 2 and isinstance(version[0], int)):
        raise CorruptError(f"{where} has no valid format_version")
    if version[0] > FORMAT_MAJOR:
        raise UnsupportedFormatError(
            f"{where} is format {version[0]}.{version[1]}; this txstore reads "
            f"{FORMAT_MAJOR}.x: upgrade txstore"
        )


@functools.cache
def _own_prefix(kind: type[_Document]) -> bytes:
    """How ``encode`` starts a document of ``kind``: its type, txstore's format name and this
    major version. A document that starts so needs no envelope decode first."""
    tag = _encoder.encode(kind.__struct_config__.tag)
    return b'{"type":%s,"format":%s,"format_version":[%d,' % (
        tag,
        _encoder.encode(FORMAT),
        FORMAT_MAJOR,
    )


@functools.cache
def _decoder(kind: type[D]) -> msgspec.json.Decoder[D]:
    # One decoder a type, reused: msgspec works out a type's layout once per decoder.
    return msgspec.json.Decoder(kind)


def decode(data: bytes, kind: type[D], where: str) -> D:
    """Decode a document, telling foreign, newer and damaged documents apart."""
    if not (isinstance(data, bytes) and data.startswith(_own_prefix(kind))):
        _check_envelope(data, where)  # another writer's spelling: its envelope first
    decoder: msgspec.json.Decoder[D] = _decoder(kind)
    try:
        doc = decoder.decode(data)
    except msgspec.DecodeError as e:  # ValidationError too; invalid UTF-8 in a string
        raise CorruptError(f"{where} is not a valid {kind.__name__.lower()}: {e}") from e
    if doc.format != FORMAT or doc.format_version[0] > FORMAT_MAJOR:  # a key given twice
        _check_envelope(data, where)
        raise CorruptError(f"{where} names its format twice")
    _check_references(doc, where)
    return doc


def _check_references(doc: _Document, where: str) -> None:
    """The paths a document names are data files in their folders; a segment's chunks have
    their footers inside them."""
    if isinstance(doc, (Manifest, SegmentNode)):
        if not _all_data_paths([seg.path for seg in doc.segments], SEGMENTS):
            for seg in doc.segments:
                check_data_path(seg.path, SEGMENTS, where)
        if isinstance(doc, SegmentNode):
            counts_match(doc, where)
    elif isinstance(doc, VacuumState):
        # The incremental vacuum deletes what ``dead`` names: a key outside the data folders,
        # or a version past ``through``, is damage or forgery.
        for path, last in doc.dead.items():
            if not is_data_key(path):
                raise CorruptError(f"{where} names {path!r} as dead: not a data file")
            if last > doc.through:
                raise CorruptError(
                    f"{where} says {path!r} was last named by version {last}, past "
                    f"version {doc.through} where it left off"
                )
    elif isinstance(doc, Segment):
        check_chunk_refs(doc.chunks, where)
        counts_match(doc, where)
