"""A Snapshot: one committed version, read-only, never changing under its reader."""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, overload

from .errors import ChecksumError, CorruptError, MissingDataError, NotFoundError
from .format import manifest as fmt
from .format.chunk import (
    ChunkLayout,
    assemble,
    check_header,
    decode_column,
    decode_value,
    parse_footer,
    select_frames,
)
from .format.codec import crc32
from .format.manifest import ChunkRef, Manifest
from .format.values import ABSENT, ValueDecoder
from .segments import Segments
from .storage import Storage, open_storage

Sample = dict[str, Any]
_LAYOUT_CACHE = 1024


@dataclass(frozen=True)
class _LoadedSegment:
    chunks: tuple[ChunkRef, ...]
    starts: list[int]  # first sample index of each chunk, within the segment


class ChunkReader:
    """Reads chunks of one store: footers (cached), single samples, whole chunks."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.decoder = ValueDecoder()
        self._layouts: OrderedDict[str, ChunkLayout] = OrderedDict()
        self._lock = threading.Lock()

    def _where(self, chunk: ChunkRef, version: int) -> str:
        return f"chunk {self.storage.uri}/{chunk.path} (version {version})"

    def _missing(self, chunk: ChunkRef, version: int) -> MissingDataError:
        return MissingDataError(f"{self._where(chunk, version)} is missing")

    def layout(self, chunk: ChunkRef, version: int) -> ChunkLayout:
        with self._lock:
            found = self._layouts.get(chunk.path)
        if found is not None:
            return found
        try:
            tail = self.storage.read_range(chunk.path, chunk.footer_offset, chunk.size)
        except NotFoundError:
            raise self._missing(chunk, version) from None
        where = self._where(chunk, version)
        if len(tail) != chunk.size - chunk.footer_offset:
            raise CorruptError(f"{where} is shorter than its manifest says")
        layout = parse_footer(tail, where)
        with self._lock:
            self._layouts[chunk.path] = layout
            while len(self._layouts) > _LAYOUT_CACHE:
                self._layouts.popitem(last=False)
        return layout

    def sample(
        self, chunk: ChunkRef, index: int, version: int, fields: frozenset[str] | None
    ) -> Sample:
        layout = self.layout(chunk, version)
        block, i = layout.locate(index)
        frames = select_frames(layout, block, fields)
        if not frames:
            return {}
        n = layout.footer.blocks[block].num_samples
        start = frames[0].offset
        end = frames[-1].offset + frames[-1].length
        try:
            buf = self.storage.read_range(chunk.path, start, end)
        except NotFoundError:
            raise self._missing(chunk, version) from None
        names = layout.columns
        out: Sample = {}
        for frame in frames:
            value = decode_value(buf, start, frame, n, i, self.decoder, layout.where)
            if value is not ABSENT:
                out[names[frame.column]] = value
        return out

    def read_whole(self, chunk: ChunkRef, version: int) -> bytes:
        try:
            data = self.storage.read(chunk.path)
        except NotFoundError:
            raise self._missing(chunk, version) from None
        # The tail's checksum here; every frame's as it is decoded.
        if len(data) != chunk.size or crc32(memoryview(data)[chunk.footer_offset :]) != chunk.crc32:
            raise ChecksumError(f"{self._where(chunk, version)} does not match its checksum")
        return data

    def samples(
        self,
        data: bytes,
        chunk: ChunkRef,
        version: int,
        fields: frozenset[str] | None,
        start: int = 0,
        stop: int | None = None,
    ) -> Iterator[Sample]:
        """Samples [start, stop) of a chunk read whole, decoding only the blocks they are in."""
        where = self._where(chunk, version)
        check_header(data, where)
        layout = parse_footer(memoryview(data)[chunk.footer_offset :], where)
        names = layout.columns
        decoder = self.decoder
        stop = layout.footer.num_samples if stop is None else stop
        first = layout.locate(start)[0] if start else 0
        for number in range(first, len(layout.footer.blocks)):
            block_start = layout.block_starts[number]
            if block_start >= stop:
                return
            block = layout.footer.blocks[number]
            frames = (
                block.frames
                if fields is None
                else [f for f in block.frames if names[f.column] in fields]
            )
            n = block.num_samples
            columns = [decode_column(data, 0, f, n, decoder, where) for f in frames]
            sparse = any(f.flags for f in frames)
            rows = assemble([names[f.column] for f in frames], columns, sparse, n)
            if block_start < start or block_start + n > stop:
                rows = rows[max(0, start - block_start) : stop - block_start]
            yield from rows


class Snapshot(Sequence[Sample]):
    """The samples of one committed version, in commit order.

    ``len``, indexing (negative too; ``IndexError`` past the end), slicing and iteration.
    Nothing appended later changes it.
    """

    def __init__(
        self,
        manifest: Manifest,
        storage: Storage,
        segments: Segments,
        reader: ChunkReader,
        *,
        fields: Iterable[str] | None = None,
    ) -> None:
        self.manifest = manifest
        self._storage = storage
        self._segments = segments
        self._reader = reader
        self._fields = None if fields is None else frozenset(fields)
        self._segment_starts = list(
            accumulate((s.num_samples for s in manifest.segments), initial=0)
        )
        self._loaded: dict[int, _LoadedSegment] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses into DataLoader workers as storage (URI + options) and manifest bytes; the
        # worker builds fresh caches and file handles of its own.
        return (_rebuild, (self._storage, fmt.encode(self.manifest), self._fields))

    def reopen(self) -> Snapshot:
        """The same version through a new storage client, with empty caches.

        For forked processes: s3fs clients, open files and locks do not survive a fork.
        """
        storage = open_storage(self._storage.uri, self._storage.storage_options or None)
        return Snapshot(
            self.manifest, storage, Segments(storage), ChunkReader(storage), fields=self._fields
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

    def select(self, fields: Iterable[str]) -> Snapshot:
        """The same version, reading and decoding only ``fields``."""
        return Snapshot(self.manifest, self._storage, self._segments, self._reader, fields=fields)

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __repr__(self) -> str:
        return f"<Snapshot {self.uri} version={self.version} samples={len(self)}>"

    def _segment(self, number: int) -> _LoadedSegment:
        loaded = self._loaded.get(number)
        if loaded is None:
            ref = self.manifest.segments[number]
            chunks = self._segments.read(ref, version=self.version).chunks
            starts = list(accumulate((c.num_samples for c in chunks), initial=0))
            if starts[-1] != ref.num_samples:
                raise CorruptError(
                    f"segment {ref.path} holds {starts[-1]} samples, "
                    f"its manifest says {ref.num_samples}"
                )
            loaded = self._loaded[number] = _LoadedSegment(chunks, starts)
        return loaded

    def chunks(self) -> list[ChunkRef]:
        """Every chunk of this version, in sample order."""
        return [c for i in range(len(self.manifest.segments)) for c in self._segment(i).chunks]

    @overload
    def __getitem__(self, index: int) -> Sample: ...
    @overload
    def __getitem__(self, index: slice) -> list[Sample]: ...

    def __getitem__(self, index: int | slice) -> Sample | list[Sample]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample index out of range for a snapshot of {n} samples")
        seg_no = bisect_right(self._segment_starts, index) - 1
        segment = self._segment(seg_no)
        local = index - self._segment_starts[seg_no]
        chunk_no = bisect_right(segment.starts, local) - 1
        return self._reader.sample(
            segment.chunks[chunk_no], local - segment.starts[chunk_no], self.version, self._fields
        )

    def __iter__(self) -> Iterator[Sample]:
        return self.iter_chunks(self.chunks())

    def iter_chunks(self, chunks: Sequence[ChunkRef]) -> Iterator[Sample]:
        """The samples of ``chunks`` in order, reading the next chunk while decoding one."""
        if not chunks:
            return
        reader, version = self._reader, self.version
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="txstore-read") as pool:
            ahead: Future[bytes] = pool.submit(reader.read_whole, chunks[0], version)
            for i, chunk in enumerate(chunks):
                data = ahead.result()
                if i + 1 < len(chunks):
                    ahead = pool.submit(reader.read_whole, chunks[i + 1], version)
                yield from reader.samples(data, chunk, version, self._fields)


def _rebuild(storage: Storage, manifest: bytes, fields: frozenset[str] | None) -> Snapshot:
    decoded = fmt.decode(manifest, Manifest, f"{storage.uri} (pickled snapshot)")
    return Snapshot(decoded, storage, Segments(storage), ChunkReader(storage), fields=fields)
