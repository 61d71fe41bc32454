"""A Snapshot: one committed version, read-only, never changing under its reader."""

from __future__ import annotations

import logging
import operator
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, groupby
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ..errors import (
    ChecksumError,
    CorruptError,
    FieldMissingError,
    FieldNotFoundError,
    InputError,
    MissingDataError,
    NotFoundError,
    TxstoreError,
)
from ..format import manifest as fmt
from ..format.chunk import (
    FLAG_SPARSE,
    Apart,
    ChunkLayout,
    FrameIndex,
    check_header,
    parse_footer,
)
from ..format.codec import chunk_digest, crc32
from ..format.frames import (
    FileBytes,
    Ranges,
    coalesce,
    decode_blocks,
    decode_value,
    decode_values,
    frame_presence,
    opened_frame,
    row_starts,
    select_frames,
)
from ..format.manifest import ChunkFile, ChunkRef, Manifest, chunk_files
from ..format.values import ABSENT, ValueDecoder
from ..storage import Storage, open_storage
from ..storage.forksafe import renew_after_fork
from ..txn.log import VersionLog
from ..txn.rules import sample_origins
from . import exports
from .lease import Lease, lease_version
from .segments import Leaf, Segments
from .views import ChunkInfo, Config, FieldSchema, Schema

if TYPE_CHECKING:
    from datetime import timedelta

logger = logging.getLogger(__name__)

Sample = dict[str, Any]
_LAYOUT_CACHE = 1024
#: Snapshots of at most this many chunks, on local disk or in memory, have the footers of all
#: their chunks read on a thread of their own once a sample is read at random
#: (``ChunkReader.read_footers_ahead``): otherwise the first sample read of each chunk waits
#: for two reads, its footer's and then its block's, which set the tail of random reads from
#: a cold disk (W1: 6 of the 10 slowest of 1,000 reads of 7 chunks). On an object store each
#: footer is a request of its own, paid only by readers that need it.
FOOTERS_AHEAD_CHUNKS = 256
#: The opened pieces of columns stored apart a reader keeps for its next samples (small
#: columns: 32 MiB holds the int ids of about 3.5 million samples).
_PIECE_CACHE_BYTES = 32 << 20
#: A reader of some fields reads a chunk file whole when their frames are at least this share
#: of its body (100 KiB images beside small ids and labels): one read, and one digest on the
#: fetching thread, instead of a range per frame and a checksum per frame on the decoding
#: thread (W2 read with fields=["jpeg"] went at half the speed of all fields). Only where the
#: whole file is at most 2% more bytes than the frames: a projection moves the bytes of its
#: fields, not more (bench/bench_fields.py), on an object store above all.
WHOLE_FILE_SHARE = 0.98

#: Runs [start, stop) of samples, in order.
Runs = list[tuple[int, int]]


def _add_run(runs: Runs, start: int, stop: int) -> None:
    if runs and runs[-1][1] == start:
        runs[-1] = (runs[-1][0], stop)
    else:
        runs.append((start, stop))


def _by_version(
    runs: Runs, origins: list[tuple[int, int, int | None]]
) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """The appending versions whose samples all have a field (as ranges of consecutive
    ones, in sample order), and those only some of whose samples do."""
    whole: list[tuple[int, int]] = []
    partly: list[int] = []
    previous_whole = False
    for start, stop, version in origins:
        have = sum(max(0, min(stop, b) - max(start, a)) for a, b in runs)
        if version is None or have == 0:
            previous_whole = False
            continue
        if have < stop - start:
            partly.append(version)
            previous_whole = False
        elif previous_whole:
            whole[-1] = (whole[-1][0], version)
        else:
            whole.append((version, version))
            previous_whole = True
    return tuple(whole), tuple(partly)


def type_name(value: Any) -> str:
    """A value's type as a schema shows it: arrays and tensors with their dtype and shape."""
    if value is None:
        return "None"
    kind = type(value).__name__
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if dtype is not None and shape is not None:
        return f"{kind}[{str(dtype).removeprefix('torch.')}, {tuple(shape)}]"
    return kind


def _fetching(storage: Storage, path: str, start: int, end: int, what: str) -> None:
    """A DEBUG line per read from storage (a range or a whole file), never per sample
    decoded from it; callers test ``logger.isEnabledFor`` first, so a quiet logger costs one
    cached level check per read."""
    logger.debug(
        "reading %s/%s bytes %d-%d (%d bytes, %s)", storage.uri, path, start, end, end - start, what
    )


#: ``missing=`` values with a meaning of their own; anything else is a fill value.
MISSING_ERROR, MISSING_SKIP = "error", "skip"


#: For the Arrow reads, which give a null where a sample lacks a field: no check but that
#: some sample has each field.
_NULLS = object()


T = TypeVar("T")
R = TypeVar("R")


def map_threads(fn: Callable[[T], R], items: Sequence[T], threads: int) -> list[R]:
    """``fn`` over ``items`` on up to ``threads`` threads (remote reads wait on I/O); on this
    thread alone for one item."""
    if len(items) <= 1 or threads <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="txstore-fields") as pool:
        return list(pool.map(fn, items))


def _is(how: Any, word: str) -> bool:
    # A fill value may be an array, whose == is elementwise.
    return isinstance(how, str) and how == word


@dataclass(frozen=True)
class Missing:
    """What a view does with samples that lack some of its ``fields`` (those some samples
    have and others not): ``how`` is "skip" or the value to fill them with."""

    how: Any
    fields: frozenset[str]

    def apply(self, rows: Iterable[Sample]) -> Iterator[Sample]:
        fields = self.fields
        if _is(self.how, MISSING_SKIP):
            return (row for row in rows if all(name in row for name in fields))
        return (self.fill(row) for row in rows)

    def fill(self, row: Sample) -> Sample:
        if _is(self.how, MISSING_SKIP):
            return row
        for name in self.fields:
            if name not in row:
                row[name] = self.how
        return row


@dataclass
class Fetched:
    """The bytes of a chunk's sources needed for some fields, with their layouts, and the
    paths of the sources read whole and checked against their digest (whose frames need no
    check of their own)."""

    parts: list[tuple[ChunkFile, ChunkLayout, FileBytes, frozenset[str] | None]]
    verified: frozenset[str] = frozenset()
    #: Whether the pieces of every column stored apart were read (a whole file, or a fetch
    #: for a reader of columns), not only of those the blocks do not hold too.
    pieces: bool = False

    @classmethod
    def of_ranges(
        cls,
        src: ChunkFile,
        layout: ChunkLayout,
        ranges: Sequence[tuple[int, int]],
        pieces: Sequence[bytes],
    ) -> Fetched:
        """Some blocks of a chunk file (``ChunkReader.head_ranges``) as read: every field,
        each frame checked as it is decoded."""
        found = Ranges([(start, piece) for (start, _), piece in zip(ranges, pieces, strict=True)])
        return cls([(src, layout, found, ChunkReader.keep(src, layout, None))])


class ChunkReader:
    """Reads chunks of one store: footers (cached), single samples, whole chunks."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.decoder = ValueDecoder()
        self._layouts: OrderedDict[str, ChunkLayout] = OrderedDict()
        self._pieces: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._piece_bytes = 0
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._footers_asked: set[int] = set()  # versions whose footers are read ahead
        # Each chunk's files, by the id of its reference, which the entry keeps alive (so
        # that its id is not reused): a random reader's sample no longer builds them anew.
        self._files: dict[int, tuple[ChunkRef, list[ChunkFile]]] = {}

    def _sources(self, chunk: ChunkRef) -> list[ChunkFile]:
        found = self._files.get(id(chunk))
        if found is not None:
            return found[1]
        files = chunk_files(chunk)  # the chunk file, then its field files
        if len(self._files) >= _LAYOUT_CACHE:
            self._files.clear()
        self._files[id(chunk)] = (chunk, files)
        return files

    def _where(self, path: str, version: int) -> str:
        return f"chunk {self.storage.uri}/{path} (version {version})"

    def _missing(self, path: str, version: int) -> MissingDataError:
        return MissingDataError(f"{self._where(path, version)} is missing")

    def layout(self, src: ChunkFile, version: int, lazy: bool = False) -> ChunkLayout:
        """A source's footer, every frame checked; ``lazy``: a block's frames decoded and
        checked when a caller asks for them (``ChunkLayout.block_frames``)."""
        with self._lock:
            found = self._layouts.get(src.path)
        if found is not None:
            # Another segment may name the same file with another count: one int compare.
            if src.num_samples >= 0 and found.num_samples != src.num_samples:
                self._count_mismatch(src, found, version)
            if not lazy:
                found.footer  # noqa: B018 -- decodes and checks the frames not yet checked
            return found
        if logger.isEnabledFor(logging.DEBUG):
            _fetching(self.storage, src.path, src.footer_offset, src.size, "footer")
        try:
            tail = self.storage.read_range(src.path, src.footer_offset, src.size)
        except NotFoundError:
            raise self._missing(src.path, version) from None
        where = self._where(src.path, version)
        if len(tail) != src.size - src.footer_offset:
            raise CorruptError(f"{where} is shorter than its manifest says")
        if crc32(tail) != src.crc32:
            raise ChecksumError(f"{where} does not match its checksum")
        return self._remember(src, self._parse(src, tail, where, version, lazy))

    def read_footers_ahead(self, version: int, chunks: Callable[[], Sequence[ChunkRef]]) -> None:
        """Read the footers of ``chunks()`` (all those of a version) into the cache, on a
        thread of their own, once for each version: a random reader's first sample of each
        chunk then waits for its block alone."""
        with self._lock:
            if version in self._footers_asked:
                return
            self._footers_asked.add(version)
        threading.Thread(
            target=self._read_footers,
            args=(version, chunks),
            name="txstore-footers",
            daemon=True,
        ).start()

    def _read_footers(self, version: int, chunks: Callable[[], Sequence[ChunkRef]]) -> None:
        try:
            for chunk in chunks():
                for src in chunk_files(chunk):
                    if len(self._layouts) >= _LAYOUT_CACHE:
                        return  # chunks with many field files: more would evict the first
                    self.layout(src, version, lazy=True)
        except TxstoreError:
            pass  # the sample that needs the footer reads it again and says what is wrong

    def _parse(
        self, src: ChunkFile, tail: bytes | memoryview, where: str, version: int, lazy: bool
    ) -> ChunkLayout:
        """A source's footer, checked against its segment's count of samples."""
        layout = parse_footer(tail, where, footer_offset=src.footer_offset, lazy=lazy)
        if src.num_samples >= 0 and layout.num_samples != src.num_samples:
            self._count_mismatch(src, layout, version)
        return layout

    def _count_mismatch(self, src: ChunkFile, layout: ChunkLayout, version: int) -> None:
        raise CorruptError(
            f"{self._where(src.path, version)} holds {layout.num_samples} samples, "
            f"its segment says {src.num_samples}"
        )

    def _remember(self, src: ChunkFile, layout: ChunkLayout) -> ChunkLayout:
        with self._lock:
            self._layouts[src.path] = layout
            while len(self._layouts) > _LAYOUT_CACHE:
                self._layouts.popitem(last=False)
        return layout

    @staticmethod
    def keep(
        src: ChunkFile, layout: ChunkLayout, fields: frozenset[str] | None
    ) -> frozenset[str] | None:
        """The columns to read from ``src``: None for all of them."""
        if fields is None and not src.hidden:
            return None
        names = frozenset(layout.columns) - src.hidden
        return names if fields is None else names & fields

    def sample(
        self,
        chunk: ChunkRef,
        index: int,
        version: int,
        fields: frozenset[str] | None,
        views: bool = False,
    ) -> Sample:
        out: Sample = {}
        for src in self._sources(chunk):
            # One sample need not pay for checking the frames of the whole chunk.
            layout = self.layout(src, version, lazy=True)
            keep = self.keep(src, layout, fields)
            names = layout.columns
            if layout.has_blocks:
                block, i = layout.locate(index)
                frames = select_frames(layout, block, keep)
                if frames:
                    n = layout.block_samples(block)
                    start = frames[0].offset
                    buf = self._block_bytes(src, version, block, frames, "for one sample")
                    for frame in frames:
                        value = decode_value(buf, start, frame, n, i, self.decoder, layout, views)
                        if value is not ABSENT:
                            out[names[frame.column]] = value
            apart = layout.apart_only(keep)
            if not apart:
                continue
            # Each in its place among the block's columns (docs/format.md §7.6).
            got = {name: out.pop(name) for name in names if name in out}
            for name, found in apart:
                piece, i = found.locate(index)
                raw = self._piece(src, layout, found, piece, version)
                n = found.size(piece)
                frame = found.frames[piece]
                value = decode_value(raw, 0, frame, n, i, self.decoder, layout, views, True)
                if value is not ABSENT:
                    got[name] = value
            rank = layout.rank
            out.update((name, got[name]) for name in sorted(got, key=rank.__getitem__))
        return out

    def _piece(
        self, src: ChunkFile, layout: ChunkLayout, found: Apart, piece: int, version: int
    ) -> bytes:
        """A piece of a column stored apart, opened (checked, decompressed): kept for the next
        samples read from it (a random reader reads the same few pieces of a chunk again and
        again), up to ``_PIECE_CACHE_BYTES`` of them."""
        key = (src.path, found.column, piece)
        pieces = self._pieces
        with self._lock:
            raw = pieces.get(key)
            if raw is not None:
                pieces.move_to_end(key)
                return raw
        frame = found.frames[piece]
        buf = self._block_bytes(src, version, piece, (frame,), "piece of a column stored apart")
        raw = opened_frame(buf, frame.offset, frame, layout)
        with self._lock:
            if key not in pieces:
                pieces[key] = raw
                self._piece_bytes += len(raw)
                while self._piece_bytes > _PIECE_CACHE_BYTES:
                    _, old = pieces.popitem(last=False)
                    self._piece_bytes -= len(old)
        return raw

    def _block_bytes(
        self, src: ChunkFile, version: int, block: int, frames: Sequence[FrameIndex], why: str
    ) -> bytes | memoryview:
        """The bytes of a block's ``frames`` (adjacent, in file order), from the first."""
        start = frames[0].offset
        end = frames[-1].offset + frames[-1].length
        if logger.isEnabledFor(logging.DEBUG):
            _fetching(self.storage, src.path, start, end, f"block {block} {why}")
        try:
            return self.storage.read_range_view(src.path, start, end)
        except NotFoundError:
            raise self._missing(src.path, version) from None

    def take(
        self, picks: Sequence[tuple[ChunkRef, int]], version: int, fields: frozenset[str] | None
    ) -> dict[str, list[Any]]:
        """The samples at ``picks`` (a chunk and an index in it) as columns: a list per field,
        in the order of ``picks``, None where a sample lacks the field. Each block is read,
        and each of its frames checked, once for all the picks in it."""
        columns: dict[str, list[Any]] = {}
        place: dict[str, int] = {}  # the columns in the order their files list them
        count = len(picks)
        order = sorted(range(count), key=lambda k: (picks[k][0].path, picks[k][1]))
        for _, group in groupby(order, key=lambda k: picks[k][0].path):
            ks = list(group)
            chunk = picks[ks[0]][0]
            for src in self._sources(chunk):
                layout = self.layout(src, version, lazy=True)
                keep = self.keep(src, layout, fields)
                names = layout.columns
                for name in names:
                    place.setdefault(name, len(place))
                # The blocks, then each column stored apart: a partition of the samples and
                # the frames of each part.
                groups: list[tuple[list[int], Callable[[int], Sequence[FrameIndex]]]] = []
                if layout.has_blocks:
                    groups.append((layout.block_starts, partial(_block_frames, layout, keep)))
                for _, found in layout.apart_only(keep):
                    groups.append((found.starts, partial(_piece_frame, found)))
                for starts, frames_of in groups:
                    # Runs of picks in one part (sorted by index): [first, last) of ``ks``.
                    first = 0
                    while first < len(ks):
                        block = bisect_right(starts, picks[ks[first]][1]) - 1
                        last, limit = first + 1, starts[block + 1]
                        while last < len(ks) and picks[ks[last]][1] < limit:
                            last += 1
                        outs = ks[first:last]
                        first = last
                        frames = frames_of(block)
                        if not frames:
                            continue
                        base = starts[block]
                        rows = [picks[k][1] - base for k in outs]
                        buf = self._block_bytes(src, version, block, frames, "for take")
                        at, n = frames[0].offset, limit - base
                        for frame in frames:
                            values = decode_values(buf, at, frame, n, rows, self.decoder, layout)
                            column = columns.get(names[frame.column])
                            if column is None:
                                column = columns[names[frame.column]] = [None] * count
                            for k, value in zip(outs, values, strict=True):
                                if value is not ABSENT:
                                    column[k] = value
        return {name: columns[name] for name in sorted(columns, key=place.__getitem__)}

    def head_ranges(
        self, src: ChunkFile, version: int, start: int, stop: int, part_bytes: int
    ) -> tuple[ChunkLayout, list[tuple[int, int]], list[tuple[int, int]]]:
        """The footer of ``src``, the byte ranges of the blocks holding its samples
        [start, stop): whole blocks, grouped into ranges of about ``part_bytes`` (one larger
        block is one range), and those of the pieces of its columns stored apart that hold
        the same samples, which a caller reads at once and decodes (``Ranges``) before the
        rest of the file is in. None for a file without blocks."""
        layout = self.layout(src, version, lazy=True)
        if not layout.has_blocks:
            return layout, [], []
        first, _ = layout.locate(start)
        last, _ = layout.locate(stop - 1)
        ranges: list[tuple[int, int]] = []
        for block in range(first, last + 1):
            frames = layout.block_frames(block)
            if not frames:
                continue
            low = min(f.offset for f in frames)
            high = max(f.offset + f.length for f in frames)
            if ranges and ranges[-1][1] == low and high - ranges[-1][0] <= part_bytes:
                ranges[-1] = (ranges[-1][0], high)
            else:
                # From the file's first byte for the first block: with the header, the rest
                # of the file is one range, not two.
                ranges.append((0 if block == 0 else low, high))
        low, high = layout.block_starts[first], layout.block_starts[last + 1]
        pieces = [
            (frame.offset, frame.offset + frame.length)
            for _, found in layout.apart_only(None)
            for frame in (found.frames[k] for k in found.covering(low, high))
        ]
        return layout, ranges, pieces

    def map_whole(
        self, chunk: ChunkRef, version: int, fields: frozenset[str] | None = None
    ) -> dict[str, bytes | memoryview]:
        """The buffers of the sources ``fetch`` reads whole for ``fields`` (None: all; else
        those whose frames are most of a file), by path: cheap for local storage (a map,
        and a hint to read it ahead), which a caller may do on one thread and ``fetch`` on
        another. A source read as ranges is not mapped: its whole file is not read ahead."""
        found: dict[str, bytes | memoryview] = {}
        for src in chunk_files(chunk):
            if src.hidden:
                continue
            if fields is not None:
                layout = self.layout(src, version, lazy=True)
                keep = self.keep(src, layout, fields)
                if not (keep and self._mostly(src, layout, keep, False)):
                    continue
            found[src.path] = self._buffer(src, version)
        return found

    def _buffer(self, src: ChunkFile, version: int) -> bytes | memoryview:
        if logger.isEnabledFor(logging.DEBUG):
            _fetching(self.storage, src.path, 0, src.size, "whole file")
        try:
            return self.storage.read_buffer(src.path, tail=src.size - src.footer_offset)
        except NotFoundError:
            raise self._missing(src.path, version) from None

    def read_whole(
        self,
        src: ChunkFile,
        version: int,
        digest: bool = True,
        data: bytes | memoryview | None = None,
    ) -> tuple[bytes | memoryview, ChunkLayout, bool]:
        """A source's bytes (read now, unless given) and layout, and whether its digest
        checked them all (else each frame's checksum is checked as it is decoded).
        ``digest=False`` leaves the checks to the frames, for a reader that wants its first
        sample before the whole file is read."""
        if data is None:
            data = self._buffer(src, version)
        where = self._where(src.path, version)
        tail = memoryview(data)[src.footer_offset :]
        if len(data) != src.size or crc32(tail) != src.crc32:
            raise ChecksumError(f"{where} does not match its checksum")
        # One hash of the whole body, on the thread that fetched it (the prefetch thread of
        # a StreamingDataset), rather than one per frame on the thread that decodes.
        verified = digest and src.digest is not None
        if verified and chunk_digest(memoryview(data)[: src.footer_offset]) != src.digest:
            raise ChecksumError(f"{where} does not match its digest")
        check_header(data, where)
        return data, self._parse(src, tail, where, version, lazy=False), verified

    @staticmethod
    def _mostly(src: ChunkFile, layout: ChunkLayout, keep: frozenset[str], columns: bool) -> bool:
        """Whether the frames of ``keep`` are most of the file (``WHOLE_FILE_SHARE``)."""
        wanted = sum(f.length for _, _, f in layout.spans(keep, pieces=columns))
        return wanted >= WHOLE_FILE_SHARE * src.footer_offset

    def _read_frames(
        self,
        src: ChunkFile,
        layout: ChunkLayout,
        keep: frozenset[str],
        version: int,
        columns: bool,
    ) -> Ranges:
        """The frames of the columns ``keep``: for a reader of samples, the blocks' and the
        pieces of the columns stored apart alone; for a reader of ``columns``, the pieces of
        every column stored apart and the blocks' frames of the others."""
        spans = [(f.offset, f.offset + f.length) for _, _, f in layout.spans(keep, pieces=columns)]
        return self._read_spans(src, spans, version, f"frames of {sorted(keep)}")

    def _read_spans(
        self, src: ChunkFile, spans: list[tuple[int, int]], version: int, what: str
    ) -> Ranges:
        ranges = coalesce(spans, self.storage.range_merge_gap)
        if logger.isEnabledFor(logging.DEBUG):
            for start, end in ranges:
                _fetching(self.storage, src.path, start, end, what)
        try:
            # At once: on an object store, one round trip for all, not one each.
            found = self.storage.read_ranges(src.path, ranges)
            pieces = [(start, piece) for (start, _), piece in zip(ranges, found, strict=True)]
        except NotFoundError:
            raise self._missing(src.path, version) from None
        return Ranges(pieces)

    def presence(
        self, chunk: ChunkRef, version: int, fields: frozenset[str] | None, exact: bool = True
    ) -> dict[str, Runs]:
        """Each field of ``chunk`` (``fields``: only those) with the runs of the chunk's
        samples that have it. From the footers, and the offset tables of the frames flagged
        sparse (no value is decoded; only those frames are read). Not ``exact``: from the
        footers alone, a block with a sparse frame counted whole."""
        runs: dict[str, Runs] = {}
        for src in chunk_files(chunk):
            layout = self.layout(src, version, lazy=True)
            names = layout.columns
            spans = layout.spans(fields, pieces=True, hidden=src.hidden)
            sparse = [
                (f.offset, f.offset + f.length)
                for _, _, f in spans
                if exact and f.flags & FLAG_SPARSE
            ]
            buf = self._read_spans(src, sparse, version, "sparse frames") if sparse else None
            for low, n, frame in spans:
                out = runs.setdefault(names[frame.column], [])
                if buf is None or not frame.flags & FLAG_SPARSE:
                    _add_run(out, low, low + n)
                    continue
                for k, present in enumerate(frame_presence(buf, frame, n, layout)):
                    if present:
                        _add_run(out, low + k, low + k + 1)
        return runs

    def fetch(
        self,
        chunk: ChunkRef,
        version: int,
        fields: frozenset[str] | None,
        digest: bool = True,
        mapped: dict[str, bytes | memoryview] | None = None,
        columns: bool = False,
    ) -> Fetched:
        """Read what the samples of ``chunk`` need for ``fields``: whole files, or only the
        frames of the fields asked for when that is a part of a file (``columns``: for a
        reader of columns, ``table`` or ``decode_columns``, which reads the columns stored
        apart from their pieces). Whole files are checked against their digest, unless
        ``digest`` is False (see ``read_whole``). ``mapped``: what ``map_whole`` gave for
        the same ``fields``, which also chose the files read whole."""
        parts: list[tuple[ChunkFile, ChunkLayout, FileBytes, frozenset[str] | None]] = []
        verified: set[str] = set()
        for src in chunk_files(chunk):
            if fields is None and not src.hidden:
                given = None if mapped is None else mapped.get(src.path)
                data, layout, whole = self.read_whole(src, version, digest, given)
                parts.append((src, self._remember(src, layout), data, None))
                if whole:
                    verified.add(src.path)
                continue
            layout = self.layout(src, version, lazy=True)
            keep = self.keep(src, layout, fields)
            if mapped is not None:
                whole_file = src.path in mapped
            else:
                whole_file = bool(
                    keep and not src.hidden and self._mostly(src, layout, keep, columns)
                )
            if whole_file:
                given = None if mapped is None else mapped[src.path]
                data, layout, whole = self.read_whole(src, version, digest, given)
                parts.append((src, self._remember(src, layout), data, keep))
                if whole:
                    verified.add(src.path)
            elif keep:
                found = self._read_frames(src, layout, keep, version, columns)
                parts.append((src, layout, found, keep))
        whole = all(not isinstance(buf, Ranges) for _, _, buf, _ in parts)
        return Fetched(parts, frozenset(verified), columns or whole)

    def samples(
        self,
        fetched: Fetched,
        chunk: ChunkRef,
        version: int,
        start: int = 0,
        stop: int | None = None,
        views: bool = False,
    ) -> Iterator[Sample]:
        """Samples [start, stop) of a fetched chunk, decoding only the blocks they are in;
        with ``views``, top-level ``bytes`` values are read-only views (zero-copy)."""
        stop = chunk.num_samples if stop is None else stop
        if not fetched.parts:  # no field asked for is in this chunk
            yield from ({} for _ in range(start, stop))
            return
        block_starts = row_starts([layout for _, layout, _, _ in fetched.parts])
        first = bisect_right(block_starts, start) - 1 if start else 0
        last = max(first, bisect_left(block_starts, stop))  # blocks [first, last) hold them
        parts = [(layout, buf, keep) for _, layout, buf, keep in fetched.parts]
        checked = tuple(src.path in fetched.verified for src, _, _, _ in fetched.parts)
        blocks = decode_blocks(parts, first, last, self.decoder, views, checked, block_starts)
        for number, rows in enumerate(blocks, start=first):
            block_start, block_stop = block_starts[number], block_starts[number + 1]
            if block_start < start or block_stop > stop:
                rows = rows[max(0, start - block_start) : stop - block_start]
            yield from rows

    def table(self, fetched: Fetched, chunk: ChunkRef) -> Any:
        """A fetched chunk's samples as one ``pyarrow.Table`` (the ``arrow`` extra)."""
        from ..format import arrow

        if not fetched.parts:  # no field asked for is in this chunk
            return arrow.empty_table(chunk.num_samples)
        block_starts = row_starts([layout for _, layout, _, _ in fetched.parts])
        parts = [(layout, buf, keep) for _, layout, buf, keep in fetched.parts]
        checked = tuple(src.path in fetched.verified for src, _, _, _ in fetched.parts)
        return arrow.chunk_table(parts, block_starts, self.decoder, checked, fetched.pieces)


def _block_frames(
    layout: ChunkLayout, keep: frozenset[str] | None, block: int
) -> Sequence[FrameIndex]:
    return select_frames(layout, block, keep)


def _piece_frame(found: Apart, piece: int) -> Sequence[FrameIndex]:
    return (found.frames[piece],)


def _sample_index(index: Any) -> int:
    """An index as ``list`` takes one (an int, a numpy integer), else TypeError saying so."""
    if type(index) is int:
        return index
    try:
        return operator.index(index)
    except TypeError:
        raise TypeError(
            f"snapshot indices must be integers or slices, not {type(index).__name__}"
        ) from None


def check_field_list(fields: Any) -> None:
    """TypeError unless ``fields`` is a collection of names: a lone ``str`` is one too, of
    letters, and almost always a mistake."""
    if isinstance(fields, str | bytes) or not isinstance(fields, Iterable):
        raise TypeError(f"fields must be a list of field names, not {fields!r}")


class Snapshot(Sequence[Sample]):
    """The samples of one committed version, in commit order.

    ``len``, indexing (negative too; ``IndexError`` past the end), slicing and iteration.
    Nothing appended later changes it. ``select(fields)`` and ``zero_copy()`` give other views
    of the same version.
    """

    def __init__(
        self,
        manifest: Manifest,
        storage: Storage,
        segments: Segments,
        reader: ChunkReader,
        *,
        fields: Iterable[str] | None = None,
        zero_copy: bool = False,
        missing: Missing | None = None,
    ) -> None:
        self.manifest = manifest
        self._missing = missing
        self.is_zero_copy = zero_copy
        self._storage = storage
        self._segments = segments
        self._reader = reader
        self._fields = None if fields is None else frozenset(fields)
        self._segment_starts = list(
            accumulate([s.num_samples for s in manifest.segments], initial=0)
        )
        # The manifest's own segments (level 0) by number: indexing goes no further.
        self._loaded: dict[int, Leaf] = {}
        self._chunk_refs: list[ChunkRef] | None = None
        self._read_at_random = False

    @property
    def storage(self) -> Storage:
        """The storage the snapshot reads (for the faces that read chunks themselves)."""
        return self._storage

    @property
    def reader(self) -> ChunkReader:
        """The chunk reader the snapshot shares with its store (footer cache included)."""
        return self._reader

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses into DataLoader workers as storage (URI + options) and manifest bytes; the
        # worker builds fresh caches and file handles of its own.
        return (
            _rebuild,
            (
                self._storage,
                fmt.encode(self.manifest),
                self._fields,
                self.is_zero_copy,
                self._missing,
            ),
        )

    def lease(self, ttl: float | str | timedelta = "6h") -> Lease:
        """Protect this version from expiry and vacuum while a job reads it (a ``with``
        block, renewed in the background; see ``Store.lease``)."""
        return lease_version(self._storage, self.manifest, ttl=ttl)

    def reopen(self) -> Snapshot:
        """The same version through a new storage client, with empty caches.

        For forked processes: s3fs clients, open files and locks do not survive a fork.
        """
        storage = open_storage(self._storage.uri, self._storage.storage_options or None)
        return _with_own_caches(
            storage, self.manifest, self._fields, self.is_zero_copy, self._missing
        )

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def identity(self) -> tuple[str, int, str]:
        """(store URI, version, commit id): what a checkpoint records to find this again."""
        return (self.uri, self.version, self.manifest.commit_id)

    @property
    def uri(self) -> str:
        return self._storage.uri

    @property
    def fields(self) -> frozenset[str] | None:
        """The fields this view reads, or None for all of them."""
        return self._fields

    def select(self, fields: Iterable[str], *, missing: Any = MISSING_ERROR) -> Snapshot:
        """The same version, reading and decoding only ``fields``.

        ``FieldNotFoundError`` (naming the fields it has, close matches first) for a field
        that no sample of this version has (a version of no samples takes any name). For a
        field that some samples lack, ``missing`` says what to do: "error" (the default)
        raises ``FieldMissingError`` naming it and the first samples without it; "skip"
        leaves those samples out of iteration (``len`` and indexing still count them); any
        other value is given to them as the field's value (the same object to each).
        Finding out reads every chunk's footer, and the frames of columns some samples of a
        block lack.
        """
        check_field_list(fields)
        wanted = frozenset(fields)
        for name in wanted:
            if not isinstance(name, str):
                raise TypeError(f"a field name is a str, not {name!r}")
        rule = self._check_fields(wanted, missing)
        return self._view(wanted, self.is_zero_copy, rule)

    def check_fields(self, fields: Iterable[str]) -> None:
        """``FieldNotFoundError`` for a field of ``fields`` that no sample has (as ``select``
        raises it), from the footers alone."""
        self._nullable(fields)

    def _nullable(self, fields: Iterable[str]) -> Snapshot:
        """``select`` for the Arrow reads, which give nulls where samples lack a field."""
        return self.select(fields, missing=_NULLS)

    #: Chunk footers read at once to find the fields asked for (remote reads wait on I/O).
    _FOOTER_READS = 16

    def _check_fields(self, wanted: frozenset[str], missing: Any) -> Missing | None:
        """Raise FieldNotFoundError unless some sample has each field of ``wanted``, and
        FieldMissingError for one some samples lack when ``missing`` is "error"; else the
        rule for the samples that lack some (None when none does)."""
        if not wanted or not len(self):
            return None  # none asked for, or no sample to have one
        chunks = self.chunk_refs()
        exact = missing is not _NULLS
        coverage = self._coverage(chunks, wanted, exact)
        absent = sorted(wanted - set(coverage))
        if absent:
            known = set(self._coverage(chunks, None, exact=False))
            raise FieldNotFoundError(self._no_such_fields(absent, known))
        if not exact:
            return None
        n = len(self)
        partial = {name: runs for name, runs in coverage.items() if runs != [(0, n)]}
        if not partial:
            return None
        if _is(missing, MISSING_ERROR):
            name = min(partial)
            runs = tuple(partial[name])
            field = FieldSchema(name, "", sum(b - a for a, b in runs), n, runs)
            first = tuple(field.lacking(5))
            raise FieldMissingError(
                f"{field.missing:,} of the {n:,} samples of version {self.version} of "
                f"{self.uri} lack the field {name!r} (the first: "
                f"{', '.join(map(str, first))}{', ...' if field.missing > len(first) else ''}"
                f'); say what to do with them (missing="skip", or a value to fill in), or '
                f"give them the field (add_fields(..., missing_only=True))",
                field=name,
                count=field.missing,
                samples=first,
            )
        return Missing(missing, frozenset(partial))

    def _coverage(
        self, chunks: Sequence[ChunkRef], fields: frozenset[str] | None, exact: bool = True
    ) -> dict[str, Runs]:
        """Each field (``fields``: only those) with the runs of samples that have it: the
        chunks' footers, and their sparse frames, read in parallel."""
        starts = list(accumulate((c.num_samples for c in chunks), initial=0))
        version = self.version

        def one(chunk: ChunkRef) -> dict[str, Runs]:
            return self._reader.presence(chunk, version, fields, exact)

        out: dict[str, Runs] = {}
        threads = self._FOOTER_READS if self.storage.is_remote else 1  # local: no wait to hide
        for number, found in enumerate(map_threads(one, chunks, threads)):
            base = starts[number]
            for name, runs in found.items():
                merged = out.setdefault(name, [])
                for start, stop in runs:
                    _add_run(merged, base + start, base + stop)
        return out

    def schema(self) -> Schema:
        """Each field of this version: the type of its first value, and which samples have
        it (how many, and the runs of sample indices). Reads every chunk's footer, the
        frames of columns some samples of a block lack, and one block per field for its
        type; never the values otherwise."""
        chunks = self.chunk_refs()
        wanted = self._fields
        coverage = self._coverage(chunks, wanted) if len(self) else {}
        log = VersionLog(self._storage)
        origins = sample_origins(self.manifest, log.read)
        fields = []
        for name in sorted(coverage):
            runs = coverage[name]
            count = sum(stop - start for start, stop in runs)
            first = runs[0][0] if runs else None
            kind = ""
            if first is not None:
                chunk, local = self._locate(first, len(self))
                value = self._reader.sample(chunk, local, self.version, frozenset({name}))
                kind = type_name(value.get(name))
            whole, partly = _by_version(runs, origins)
            fields.append(FieldSchema(name, kind, count, len(self), tuple(runs), whole, partly))
        return Schema(self.version, len(self), tuple(fields), tuple(origins))

    def _no_such_fields(self, missing: list[str], known: set[str]) -> str:
        """What to say of fields no sample has: each with its close matches, then the known
        fields, close matches first."""
        import difflib

        names, hints, close_ones = sorted(known), [], []
        for name in missing:
            close = difflib.get_close_matches(name, names, n=3)
            close_ones += close
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            hints.append(f"{name!r}{hint}")
        order = list(dict.fromkeys([*close_ones, *names]))
        shown = ", ".join(map(repr, order[:50])) or "none"
        if len(order) > 50:
            shown += f", ... ({len(order)} in all)"
        plural = "s" if len(missing) > 1 else ""
        return (
            f"no sample of version {self.version} of {self.uri} has the field{plural} "
            f"{', '.join(hints)}; its fields: {shown}"
        )

    def zero_copy(self) -> Snapshot:
        """The same version, giving each top-level ``bytes`` value as a read-only
        ``memoryview`` of the chunk's bytes (mapped, for a local store) instead of a copy, and
        each numpy array as a read-only array over them.

        Checksums are verified as ever. A view keeps its chunk's map (or its block's
        decompressed bytes) alive for as long as it lives; ``bytes(view)`` and
        ``array.copy()`` make copies.
        """
        return self._view(self._fields, True, self._missing)

    def _view(
        self, fields: frozenset[str] | None, zero_copy: bool, missing: Missing | None
    ) -> Snapshot:
        """The same version through the same storage and caches, read another way."""
        return Snapshot(
            self.manifest,
            self._storage,
            self._segments,
            self._reader,
            fields=fields,
            zero_copy=zero_copy,
            missing=missing,
        )

    def handle_missing(self, rows: Iterable[Sample]) -> Iterable[Sample]:
        """``rows`` of this view with its ``missing`` rule applied (see ``select``)."""
        return rows if self._missing is None else self._missing.apply(rows)

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __repr__(self) -> str:
        return f"<Snapshot {self.uri} version={self.version} samples={len(self)}>"

    def chunks(self) -> list[ChunkInfo]:
        """Every chunk of this version, in sample order."""
        return [ChunkInfo.from_ref(c) for c in self.chunk_refs()]

    def chunk_refs(self) -> list[ChunkRef]:
        """Every chunk of this version as the format records it (for txstore's own layers:
        it changes with the format)."""
        if self._chunk_refs is None:
            self._chunk_refs = self._segments.chunks(self.manifest.segments, version=self.version)
        return list(self._chunk_refs)

    @property
    def config(self) -> Config:
        """The settings of the store the version belongs to."""
        return Config.from_struct(self.manifest.config)

    @overload
    def __getitem__(self, index: int) -> Sample: ...
    @overload
    def __getitem__(self, index: slice) -> list[Sample]: ...

    def __getitem__(self, index: int | slice) -> Sample | list[Sample]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        chunk, local = self._locate(_sample_index(index), len(self))
        sample = self._reader.sample(
            chunk,
            local,
            self.version,
            self._fields,
            self.is_zero_copy,
        )
        if not self._read_at_random:
            self._read_at_random = True
            self._footers_ahead()
        return sample if self._missing is None else self._missing.fill(sample)

    def _footers_ahead(self) -> None:
        """Have the reader read every chunk's footer ahead (``FOOTERS_AHEAD_CHUNKS``)."""
        count = sum(ref.num_chunks for ref in self.manifest.segments)
        if 1 < count <= FOOTERS_AHEAD_CHUNKS and not self._storage.is_remote:
            chunks = partial(self._segments.chunks, self.manifest.segments, version=self.version)
            self._reader.read_footers_ahead(self.version, chunks)

    def __iter__(self) -> Iterator[Sample]:
        return self.iter_chunks(self.chunk_refs())

    # -- columnar reads (the ``arrow`` extra: pyarrow) -------------------------------------

    def chunk_tables(
        self, fields: Iterable[str] | None = None, *, chunks: Iterable[int] | None = None
    ) -> Iterator[Any]:
        """A ``pyarrow.Table`` per chunk, in order (``fields``: only those; ``chunks``: only
        the chunks of those numbers, in that order), reading the next chunk while converting
        one."""
        view = self if fields is None else self._nullable(fields)
        refs = view._chosen_chunks(chunks)
        reader, version, wanted = view._reader, view.version, view._fields
        if not refs:
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="txstore-read") as pool:
            fetch = partial(reader.fetch, version=version, fields=wanted, columns=True)
            ahead: Future[Fetched] = pool.submit(fetch, refs[0])
            for i, chunk in enumerate(refs):
                fetched = ahead.result()
                if i + 1 < len(refs):
                    ahead = pool.submit(fetch, refs[i + 1])
                yield reader.table(fetched, chunk)

    def _chosen_chunks(self, numbers: Iterable[int] | None) -> list[ChunkRef]:
        refs = self.chunk_refs()
        if numbers is None:
            return list(refs)
        chosen = []
        for n in numbers:
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < len(refs):
                raise InputError(f"chunk {n!r}: this version has chunks 0 to {len(refs) - 1}")
            chosen.append(refs[n])
        return chosen

    def to_hf(self, fields: Iterable[str] | None = None, *, streaming: bool = False) -> Any:
        """The samples as a Hugging Face ``datasets.Dataset`` (every sample read into one
        in-memory Arrow table), or with ``streaming=True`` an ``IterableDataset`` that reads
        a chunk at a time, each chunk a shard. Columns and types as ``to_arrow`` gives them;
        ``fields``: only those. Needs the ``hf`` extra."""
        from ..format import hf

        if not streaming:
            return hf.in_memory(self.to_arrow(fields))
        wanted = None if fields is None else list(fields)
        view = self if wanted is None else self._nullable(wanted)  # refuse unknown fields now
        return hf.streaming(_ChunkTables(view), len(view.chunk_refs()))

    def to_batches(
        self,
        fields: Iterable[str] | None = None,
        *,
        batch_size: int | None = None,
        schema: Any = None,
    ) -> Iterator[Any]:
        """The samples as ``pyarrow.RecordBatch``es, in order: a batch per chunk, or of
        ``batch_size`` rows (the last may be shorter). A column per field (``fields``: only
        those), a null where a sample lacks the field; ints are int64, floats float64,
        numpy arrays of one shape fixed_size_lists (docs/arrow.md). ``schema``: cast each
        batch to it (the schema an Arrow table was appended with gives that table back)."""
        from ..format import arrow

        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        for batch in arrow.rebatch(self.chunk_tables(fields), batch_size):
            yield arrow.cast(batch, schema)

    def to_arrow(self, fields: Iterable[str] | None = None, *, schema: Any = None) -> Any:
        """Every sample as one ``pyarrow.Table`` (see ``to_batches``)."""
        from ..format import arrow

        tables = list(self.chunk_tables(fields))
        if not tables:
            return arrow.cast(arrow.table_of([], []), schema)
        return arrow.cast(arrow.concat(tables), schema)

    def take(
        self, indices: Iterable[int], fields: Iterable[str] | None = None, *, schema: Any = None
    ) -> Any:
        """The samples at ``indices`` (in that order; negative ones count from the end) as a
        ``pyarrow.Table``, reading each block they are in once, only the frames of
        ``fields``."""
        from ..format import arrow

        view = self if fields is None else self._nullable(fields)
        picks = list(view._locate_many(list(indices), len(self)))
        rows = view._reader.take(picks, view.version, view._fields)
        names = list(rows)
        table = arrow.table_of(names, [arrow.py_array(rows[name], name) for name in names])
        return arrow.cast(table, schema)

    def _locate(self, index: int, n: int) -> tuple[ChunkRef, int]:
        """The chunk holding sample ``index`` (negative: from the end) and its place there."""
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample index out of range for a snapshot of {n} samples")
        seg_no = bisect_right(self._segment_starts, index) - 1
        local = index - self._segment_starts[seg_no]
        leaf = self._loaded.get(seg_no)
        if leaf is None:
            ref = self.manifest.segments[seg_no]
            leaf, local = self._segments.descend(ref, local, version=self.version)
            if ref.level == 0:
                self._loaded[seg_no] = leaf
        chunk_no = bisect_right(leaf.starts, local) - 1
        return leaf.chunk(chunk_no), local - leaf.starts[chunk_no]

    def _locate_many(self, indices: list[int], n: int) -> Iterator[tuple[ChunkRef, int]]:
        for index in indices:
            yield self._locate(_sample_index(index), n)

    def iter_chunks(self, chunks: Sequence[ChunkRef]) -> Iterator[Sample]:
        """The samples of ``chunks`` in order, reading the next chunk while decoding one."""
        if not chunks:
            return
        reader, version, fields = self._reader, self.version, self._fields
        views = self.is_zero_copy
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="txstore-read") as pool:
            ahead: Future[Fetched] = pool.submit(reader.fetch, chunks[0], version, fields)
            for i, chunk in enumerate(chunks):
                fetched = ahead.result()
                if i + 1 < len(chunks):
                    ahead = pool.submit(reader.fetch, chunks[i + 1], version, fields)
                yield from self.handle_missing(reader.samples(fetched, chunk, version, views=views))

    # -- exports (exports.py) --------------------------------------------------------------

    def export_parquet(self, dest: str, **options: Any) -> Any:
        """Write the samples as Parquet files in the folder ``dest`` (a path or URI), one per
        chunk, of one schema; returns an ``Export``. Options: ``fields``,
        ``storage_options``, ``progress`` (``txstore.export_parquet``)."""
        return exports.export_parquet(self, dest, **options)

    def export_litdata(self, dest: str, **options: Any) -> Any:
        """Write the samples as a LitData dataset in the folder ``dest``, one that
        ``litdata.StreamingDataset`` reads; returns an ``Export``. Options: ``chunk_bytes``,
        ``storage_options``, ``progress`` (``txstore.export_litdata``)."""
        return exports.export_litdata(self, dest, **options)

    def export_mds(self, dest: str, **options: Any) -> Any:
        """Write the samples as a MosaicML MDS dataset in the folder ``dest``, one that
        ``streaming.StreamingDataset`` reads; returns an ``Export``. Options:
        ``size_limit``, ``storage_options``, ``progress``
        (``txstore.export_mds``)."""
        return exports.export_mds(self, dest, **options)


class _ChunkTables:
    """A snapshot's tables of the chunks given by number: what the shards of a streaming
    Hugging Face dataset read. A class, not a closure, so that DataLoader workers started
    with spawn receive it (with its snapshot, as ``Snapshot.__reduce__`` hands it over)."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def __call__(self, chunks: list[int]) -> Iterator[Any]:
        return self.snap.chunk_tables(chunks=chunks)


def _rebuild(
    storage: Storage,
    manifest: bytes,
    fields: frozenset[str] | None,
    zero_copy: bool,
    missing: Missing | None = None,
) -> Snapshot:
    decoded = fmt.decode(manifest, Manifest, f"{storage.uri} (pickled snapshot)")
    return _with_own_caches(storage, decoded, fields, zero_copy, missing)


def _with_own_caches(
    storage: Storage,
    manifest: Manifest,
    fields: frozenset[str] | None,
    zero_copy: bool,
    missing: Missing | None = None,
) -> Snapshot:
    """A snapshot of ``manifest`` through ``storage``, with segment and chunk caches of its own
    (in a new process, or after a fork)."""
    return Snapshot(
        manifest,
        storage,
        Segments(storage),
        ChunkReader(storage),
        fields=fields,
        zero_copy=zero_copy,
        missing=missing,
    )
