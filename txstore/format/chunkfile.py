"""A chunk file's bytes from its sealed frames (layout in chunk.py; ``builder`` seals them).

The frames are checksummed here, small ones joined into runs, and the footer written last, as
the file is stored: on a writer's upload thread, while the next samples encode. ``ChunkStream``
gives the bytes of frames sealed so far, so a chunk can be stored while it is still built.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

from .chunk import (
    CHUNK_MAGIC,
    CHUNK_MINOR,
    HEADER,
    ROWS_MAJOR,
    TRAILER,
    TRAILER_MAGIC,
    FrameIndex,
    encode_footer,
)
from .codec import ChunkDigest, crc32, frame_checksum

#: Frames whose parts average fewer bytes than this are joined with their neighbours as the
#: chunk is written, ``_JOIN_BYTES`` at a time (writev pays per iovec, and the checksum then
#: takes one call a frame). Joins above 1 MiB let go of the GIL while they copy; each is
#: written before the next is made, so they reuse the same warm memory, which copies several
#: times faster than fresh memory.
_JOIN_BELOW = 16384
_JOIN_BYTES = 2 << 20

#: A sealed frame before its checksum: column, offset, length, raw length, codec, flags. A
#: chunk's frames are kept in flat lists of tuples of ints and of bytes, which the cyclic GC
#: stops tracking at its first pass: thousands of tracked objects a chunk made full collections
#: run during appends, each 0.2 s in a process that had imported torch (W2 paid two).
_FrameMeta = tuple[int, int, int, int, int, int]


class SealedFrames:
    """A chunk's sealed blocks: (samples, frames) per block, and per frame its metadata and
    its stored parts, in flat lists; the pieces of each column stored apart: (samples, frame
    number) per piece, by column."""

    __slots__ = ("blocks", "copies", "frames", "major", "pieces", "stored")

    def __init__(self) -> None:
        self.major = ROWS_MAJOR  # set by the builder before the first frame is sealed
        self.copies = False  # whether the blocks also hold the columns stored apart
        self.blocks: list[tuple[int, int]] = []
        self.frames: list[_FrameMeta] = []
        self.stored: list[tuple[bytes | memoryview, ...]] = []
        self.pieces: dict[int, list[tuple[int, int]]] = {}


class ChunkStream:
    """A chunk file's bytes in order, given as its frames are sealed: the header and frames
    by ``pieces``, the footer by ``tail``. Frames are checksummed as they are given (on the
    writer's upload thread, not the encoding one), and small ones joined into runs."""

    def __init__(self, sealed: SealedFrames) -> None:
        self._sealed = sealed
        self._head: _Run | None = None  # the header, once the major is known
        self._checksums: list[int] = []  # the frames', filled in as each is written
        self._given = 0  # frames given so far
        self._digest = ChunkDigest()  # of every byte given before the footer
        self.size = -1
        self.crc32 = -1
        self.digest = ""

    @property
    def _run(self) -> _Run:
        """The run of small frames being joined, which starts with the file's header: made
        when the first frame is given (or the tail), once the builder has chosen the major."""
        if self._head is None:
            self._head = _Run(HEADER.pack(CHUNK_MAGIC, self._sealed.major, CHUNK_MINOR))
        return self._head

    def pieces(self, upto: int | None = None) -> Iterator[bytes | memoryview]:
        """The bytes of frames [given so far, ``upto``) (all sealed ones for None); a run of
        small frames that has not reached ``_JOIN_BYTES`` waits for the next call."""
        frames, stored = self._sealed.frames, self._sealed.stored
        upto = len(frames) if upto is None else upto
        if upto <= self._given:
            return
        run, checksums, digest = self._run, self._checksums, self._digest.update
        first, self._given = self._given, max(self._given, upto)
        for number in range(first, upto):
            parts = stored[number]
            stored[number] = ()  # the caller's values can go once they are written
            length = frames[number][2]
            if length < _JOIN_BELOW * len(parts):
                run.add(number, parts, length)
                checksums.append(0)
                if run.size >= _JOIN_BYTES:
                    joined = run.flush(checksums)
                    digest(joined)
                    yield joined
                continue
            if run.size:
                joined = run.flush(checksums)
                digest(joined)
                yield joined
            checksums.append(frame_checksum(parts))
            for part in parts:
                digest(part)
            yield from parts

    def tail(
        self, columns: list[str], num_samples: int, footer_offset: int
    ) -> Iterator[bytes | memoryview]:
        """The last run and the footer, once every frame has been given."""
        sealed = self._sealed
        if self._given != len(sealed.frames):
            raise RuntimeError("a chunk's tail comes after all its frames")
        if self._run.size:
            joined = self._run.flush(self._checksums)
            self._digest.update(joined)
            yield joined
        self.digest = self._digest.hexdigest()
        sealed.stored.clear()
        every = [
            FrameIndex(column, offset, length, raw, codec, checksum, flags)
            for (column, offset, length, raw, codec, flags), checksum in zip(
                sealed.frames, self._checksums, strict=True
            )
        ]
        apart = [
            (column, [n for n, _ in pieces], [every[k] for _, k in pieces], sealed.copies)
            for column, pieces in sorted(sealed.pieces.items())
        ]
        if apart:
            taken = {k for pieces in sealed.pieces.values() for _, k in pieces}
            every = [f for k, f in enumerate(every) if k not in taken]
        indexes = iter(every)
        footer = encode_footer(
            num_samples,
            columns,
            [(n, tuple(islice(indexes, count))) for n, count in sealed.blocks],
            apart,
        )
        trailer = TRAILER.pack(len(footer), crc32(footer), TRAILER_MAGIC)
        self.crc32 = crc32(trailer, crc32(footer))
        self.size = footer_offset + len(footer) + len(trailer)
        yield footer
        yield trailer


class BuiltChunk:
    """A finished chunk. Iterating it (once) gives the file's bytes in order that its stream
    has not given yet, checksumming the frames as it goes: a writer does that on its upload
    thread while the next chunk encodes. ``size`` and ``crc32`` are known once it has been
    iterated."""

    def __init__(
        self, stream: ChunkStream, columns: list[str], num_samples: int, footer_offset: int
    ) -> None:
        self._stream = stream
        self._columns = columns
        self.num_samples = num_samples
        self.footer_offset = footer_offset
        self._consumed = False

    @property
    def size(self) -> int:
        return self._stream.size

    @property
    def crc32(self) -> int:
        return self._stream.crc32

    @property
    def digest(self) -> str:
        """XXH3-64 of the bytes before the footer, in hex (``ChunkRef.digest``)."""
        return self._stream.digest

    def __iter__(self) -> Iterator[bytes | memoryview]:
        if self._consumed:
            raise RuntimeError("a BuiltChunk is iterated once")
        self._consumed = True
        stream = self._stream
        yield from stream.pieces()
        yield from stream.tail(self._columns, self.num_samples, self.footer_offset)


class _Run:
    """Consecutive frames of small parts, joined into one buffer and checksummed from it."""

    def __init__(self, first: bytes) -> None:
        self.parts: list[bytes | memoryview] = [first]
        self.size = len(first)
        self.frames: list[tuple[int, int, int]] = []  # checksum slot, start in the run, length

    def add(self, slot: int, stored: tuple[bytes | memoryview, ...], length: int) -> None:
        self.frames.append((slot, self.size, length))
        self.parts += stored
        self.size += length

    def flush(self, checksums: list[int]) -> bytes:
        joined = b"".join(self.parts)
        view = memoryview(joined)
        for slot, start, length in self.frames:
            checksums[slot] = frame_checksum([view[start : start + length]])
        self.parts, self.size, self.frames = [], 0, []
        return joined
