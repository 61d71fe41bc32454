"""Chunk files: samples in blocks, each block a set of per-column frames, then a footer.

Layout (docs/format.md has it byte for byte)::

    header   8 bytes   b"TXSC", u16 major, u16 minor
    frames   ...       block 0 column frames, block 1 column frames, ...
    footer   ...       MessagePack ChunkFooter
    trailer  16 bytes  u32 footer length, u32 footer crc32, b"TXSCEND\\0"

A frame holds one column of one block: a MessagePack array of the block's values followed by a
u32 offset per value, so a reader decodes the whole column in one call when it streams, or one
value when it seeks. Blocks are small (``block_bytes``), so reading one sample reads and
decodes one block's frames of the fields asked for, never the whole chunk.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

import msgspec

from ..errors import ChecksumError, CorruptError, EncodeError, UnsupportedFormatError
from .codec import (
    CODEC_RAW,
    FRAME_CHECKSUMS,
    FrameCompressor,
    crc32,
    decompress_frame,
    frame_checksum,
    open_frame,
)
from .values import ABSENT, ABSENT_BYTES, INT_MAX, INT_MIN, ValueDecoder, ValueEncoder

CHUNK_MAGIC = b"TXSC"
TRAILER_MAGIC = b"TXSCEND\0"
CHUNK_MAJOR, CHUNK_MINOR = 2, 0  # 2.0: XXH3-64 frame checksums (1.x: CRC-32)
HEADER = struct.Struct("<4sHH")
TRAILER = struct.Struct("<II8s")
MAX_BLOCK_SAMPLES = 4096
FLAG_SPARSE = 1  # the frame holds ABSENT markers


class FrameIndex(msgspec.Struct, array_like=True, frozen=True):
    column: int
    offset: int
    length: int
    raw_length: int
    codec: int
    checksum: int  # of the stored bytes: XXH3-64 from format 2, CRC-32 in format 1
    flags: int


class BlockIndex(msgspec.Struct, array_like=True, frozen=True):
    num_samples: int
    frames: list[FrameIndex]


class ChunkFooter(msgspec.Struct, array_like=True, frozen=True):
    major: int
    minor: int
    num_samples: int
    columns: list[str]
    blocks: list[BlockIndex]


class BuiltChunk(msgspec.Struct, frozen=True):
    parts: list[bytes | memoryview]  # the file's bytes, in order; joined only if a backend must
    size: int
    num_samples: int
    footer_offset: int
    crc32: int  # of the file's tail: footer and trailer (frames carry their own checksums)


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 65536:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _bin_header(n: int) -> bytes:
    if n < 256:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 65536:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


_BIN_HEADERS = {n: _bin_header(n) for n in range(1 << 16)}  # 0.7 MB, saves a call per value


class _Column:
    """One column of the open block: encoded values as parts, and each value's size."""

    __slots__ = ("parts", "sizes")

    def __init__(self, absent: int) -> None:
        self.parts: list[bytes] = [ABSENT_BYTES] * absent
        self.sizes: list[int] = [len(ABSENT_BYTES)] * absent

    def raw_parts(self) -> tuple[list[bytes], int]:
        """The frame's raw bytes as parts (array, values, offset table), and their length."""
        head = _array_header(len(self.sizes))
        starts = list(accumulate(self.sizes[:-1], initial=len(head)))
        table = struct.pack(f"<{len(starts)}I", *starts)
        return [head, *self.parts, table], len(head) + sum(self.sizes) + len(table)


#: After this many frames of a column in a row that zstd could not shrink, try it only on
#: every ``_PROBE_EVERY``-th frame: incompressible columns (JPEG, tokens) stop paying for it.
#: (A slice of the frame is no cheaper a probe: a frame that repeats a value larger than the
#: slice compresses, the slice does not.)
_RAW_STREAK, _PROBE_EVERY = 4, 32
#: Frames whose parts average fewer bytes than this are joined: per-part costs would dominate.
_JOIN_BELOW = 16384


#: A sealed frame before its checksum: column, offset, length, raw length, codec, flags, parts.
_PendingFrame = tuple[int, int, int, int, int, int, list[bytes]]


def _check_utf8(text: str, what: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError:
        raise EncodeError(f"{what} is not valid UTF-8 (a lone surrogate)") from None


class ChunkBuilder:
    """Accumulates samples into one chunk; the caller decides when the chunk is full.

    Values are kept as the caller's ``bytes`` objects plus small headers until the chunk is
    written, so a large ``bytes`` value is copied once: into the file.
    """

    def __init__(self, *, block_bytes: int, compressor: FrameCompressor) -> None:
        self._block_limit = block_bytes
        self._compressor = compressor
        encoder = ValueEncoder()
        self._encode = encoder.encode
        self._encode_plain = encoder.encode_plain
        self._parts: list[bytes | memoryview] = [HEADER.pack(CHUNK_MAGIC, CHUNK_MAJOR, CHUNK_MINOR)]
        self._size = HEADER.size
        self._columns: dict[str, int] = {}
        self._blocks: list[tuple[int, list[_PendingFrame]]] = []
        self._num_samples = 0
        self._raw_streak: dict[str, int] = {}
        self._reset_block()

    def _reset_block(self) -> None:
        self._cols: dict[str, _Column] = {}
        self._sparse: set[str] = set()
        self._block_n = 0
        self._block_bytes = 0

    @property
    def num_samples(self) -> int:
        return self._num_samples + self._block_n

    @property
    def size(self) -> int:
        """Bytes so far, counting the open block uncompressed."""
        return self._size + self._block_bytes

    def add(self, sample: Any, position: int) -> int:
        """Add one sample and return ``size``; on EncodeError the builder is unchanged."""
        if type(sample) is not dict:
            raise EncodeError(f"sample {position}: expected a dict, got {type(sample).__name__}")
        # One pass that appends as it encodes (this loop is most of a writer's CPU); a value
        # that cannot be encoded rolls the block back to where it was.
        cols, n = self._cols, self._block_n
        plain = self._encode_plain
        nbytes = 0
        try:
            for key, value in sample.items():
                col = cols.get(key)
                if col is None:
                    if type(key) is not str:
                        raise EncodeError(f"sample {position}: key {key!r} is not a str")
                    if not key.isascii():
                        _check_utf8(key, f"sample {position}: key {key!r}")
                    col = cols[key] = _Column(n)
                    if n:  # the block's earlier samples lack it
                        self._sparse.add(key)
                if type(value) is bytes:  # the common large value: header + the caller's bytes
                    length = len(value)
                    head = _BIN_HEADERS[length] if length < 65536 else _bin_header(length)
                    col.parts += (head, value)
                    size = len(head) + length
                else:
                    kind = type(value)
                    if kind is str or (kind is int and INT_MIN <= value <= INT_MAX):
                        data = plain(value)
                    else:
                        data = self._encode(value, position=position, key=key)
                    col.parts.append(data)
                    size = len(data)
                col.sizes.append(size)
                nbytes += size
        except EncodeError:
            self._roll_back(sample, n)
            raise
        except UnicodeEncodeError as e:  # a str (maybe nested) that is not valid UTF-8
            self._roll_back(sample, n)
            raise EncodeError(
                f"sample {position}, key {key!r}: a str is not valid UTF-8 ({e.reason})"
            ) from None
        if len(cols) != len(sample):
            self._fill_absent(n)
        self._block_n = n + 1
        self._block_bytes += nbytes
        if self._block_bytes >= self._block_limit or self._block_n >= MAX_BLOCK_SAMPLES:
            self._seal_block()
        return self._size + self._block_bytes

    def _fill_absent(self, n: int) -> None:
        """Give the columns sample ``n`` lacks an ABSENT value; they become sparse."""
        for key, col in self._cols.items():
            if len(col.sizes) == n:
                col.parts.append(ABSENT_BYTES)
                col.sizes.append(len(ABSENT_BYTES))
                self._sparse.add(key)

    def _roll_back(self, sample: dict[Any, Any], n: int) -> None:
        """Undo the values of sample ``n`` appended so far."""
        for key in [k for k, col in self._cols.items() if len(col.sizes) > n]:
            col = self._cols[key]
            col.sizes.pop()
            value = sample.get(key)
            del col.parts[-2 if type(value) is bytes and col.parts[-1] is value else -1 :]
            if all(part is ABSENT_BYTES for part in col.parts):  # made for this sample
                del self._cols[key]
                self._sparse.discard(key)

    def end_block(self) -> None:
        """Close the open block now (field files copy their chunk's block boundaries)."""
        self._seal_block()

    def _should_compress(self, name: str) -> bool:
        if not self._compressor.enabled:
            return False
        streak = self._raw_streak.get(name, 0)
        return streak < _RAW_STREAK or streak % _PROBE_EVERY == 0

    def _seal_block(self) -> None:
        if not self._block_n:
            return
        frames = []
        for name, col in self._cols.items():
            column = self._columns.setdefault(name, len(self._columns))
            parts, raw_length = col.raw_parts()
            codec, stored = CODEC_RAW, parts
            if self._should_compress(name):
                codec, packed = self._compressor.compress(b"".join(parts))
                if codec == CODEC_RAW:
                    self._raw_streak[name] = self._raw_streak.get(name, 0) + 1
                else:
                    self._raw_streak[name] = 0
                    stored = [packed]
            else:
                if name in self._raw_streak:
                    self._raw_streak[name] += 1
                # Many small parts: one is cheaper (measured: writev spends ~1 µs an iovec).
                if raw_length < _JOIN_BELOW * len(parts):
                    stored = [b"".join(parts)]
            length = sum(len(part) for part in stored)
            flags = FLAG_SPARSE if name in self._sparse else 0
            # The checksum is left to finish(), which a writer runs on another thread.
            frames.append((column, self._size, length, raw_length, codec, flags, stored))
            self._parts.extend(stored)
            self._size += length
        self._blocks.append((self._block_n, frames))
        self._num_samples += self._block_n
        self._reset_block()

    def finish(self) -> BuiltChunk:
        """The chunk's bytes and footer. Checksums every frame: the costly part, so a writer
        runs it on its upload thread while the next chunk encodes."""
        self._seal_block()
        blocks = [
            BlockIndex(
                n,
                [
                    FrameIndex(column, offset, length, raw, codec, frame_checksum(parts), flags)
                    for column, offset, length, raw, codec, flags, parts in frames
                ],
            )
            for n, frames in self._blocks
        ]
        footer = msgspec.msgpack.encode(
            ChunkFooter(CHUNK_MAJOR, CHUNK_MINOR, self._num_samples, list(self._columns), blocks)
        )
        trailer = TRAILER.pack(len(footer), crc32(footer), TRAILER_MAGIC)
        footer_offset = self._size
        parts, self._parts = self._parts, []
        parts += [footer, trailer]
        size = footer_offset + len(footer) + len(trailer)
        return BuiltChunk(
            parts, size, self._num_samples, footer_offset, crc32(trailer, crc32(footer))
        )


class ChunkLayout:
    """A decoded footer with the lookups readers need."""

    __slots__ = ("block_starts", "check", "columns", "footer", "where")

    def __init__(self, footer: ChunkFooter, where: str) -> None:
        self.footer = footer
        self.where = where
        self.check = FRAME_CHECKSUMS[footer.major]
        self.columns = footer.columns
        self.block_starts = list(accumulate((b.num_samples for b in footer.blocks), initial=0))

    def locate(self, index: int) -> tuple[int, int]:
        """(block number, index within block) of a sample."""
        block = bisect_right(self.block_starts, index) - 1
        return block, index - self.block_starts[block]


def parse_footer(tail: bytes | memoryview, where: str) -> ChunkLayout:
    """Parse a chunk's footer from its tail (footer plus trailer)."""
    if len(tail) < TRAILER.size:
        raise CorruptError(f"{where}: truncated chunk (no trailer)")
    length, checksum, magic = TRAILER.unpack_from(tail, len(tail) - TRAILER.size)
    if magic != TRAILER_MAGIC:
        raise CorruptError(f"{where}: not a txstore chunk (bad trailer magic)")
    footer_bytes = memoryview(tail)[len(tail) - TRAILER.size - length : len(tail) - TRAILER.size]
    if len(footer_bytes) != length or crc32(footer_bytes) != checksum:
        raise CorruptError(f"{where}: chunk footer checksum mismatch")
    try:
        footer = msgspec.msgpack.decode(footer_bytes, type=ChunkFooter)
    except msgspec.DecodeError as e:
        raise CorruptError(f"{where}: bad chunk footer: {e}") from e
    if footer.major > CHUNK_MAJOR:
        raise UnsupportedFormatError(
            f"{where}: chunk format {footer.major}.{footer.minor} is newer than this txstore "
            f"reads ({CHUNK_MAJOR}.x); upgrade txstore"
        )
    if footer.major not in FRAME_CHECKSUMS:
        raise CorruptError(f"{where}: bad chunk format version {footer.major}")
    return ChunkLayout(footer, where)


def check_header(data: bytes | memoryview, where: str) -> None:
    magic, major, _minor = HEADER.unpack_from(data)
    if magic != CHUNK_MAGIC:
        raise CorruptError(f"{where}: not a txstore chunk (bad magic)")
    if major > CHUNK_MAJOR:
        raise UnsupportedFormatError(f"{where}: chunk format {major} is newer than this txstore")


class Ranges:
    """Some byte ranges of a file, read for a projection: enough to decode the frames asked for."""

    __slots__ = ("_data", "_starts")

    def __init__(self, pieces: list[tuple[int, bytes]]) -> None:
        pieces = sorted(pieces)
        self._starts = [start for start, _ in pieces]
        self._data = [data for _, data in pieces]

    def view(self, offset: int, length: int) -> memoryview:
        i = bisect_right(self._starts, offset) - 1
        if i < 0:
            return memoryview(b"")
        start = offset - self._starts[i]
        return memoryview(self._data[i])[start : start + length]


def coalesce(spans: list[tuple[int, int]], max_gap: int) -> list[tuple[int, int]]:
    """Merge [start, end) spans closer than ``max_gap`` bytes: fewer, larger reads."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start - merged[-1][1] <= max_gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


FileBytes = bytes | memoryview | Ranges


def _frame_raw(buf: FileBytes, base: int, frame: FrameIndex, layout: ChunkLayout) -> memoryview:
    if isinstance(buf, Ranges):
        stored = buf.view(frame.offset, frame.length)
    else:
        start = frame.offset - base
        stored = memoryview(buf)[start : start + frame.length]
    if len(stored) != frame.length:
        raise CorruptError(f"{layout.where}: truncated frame at offset {frame.offset}")
    raw = open_frame(
        stored, frame.codec, frame.raw_length, frame.checksum, layout.check, layout.where
    )
    return memoryview(raw)


def decode_value(
    buf: FileBytes,
    base: int,
    frame: FrameIndex,
    n: int,
    i: int,
    decoder: ValueDecoder,
    layout: ChunkLayout,
    views: bool = False,
) -> Any:
    """Value ``i`` of one frame, decoding only that value."""
    raw = _frame_raw(buf, base, frame, layout)
    table = len(raw) - 4 * n
    (start,) = struct.unpack_from("<I", raw, table + 4 * i)
    end = struct.unpack_from("<I", raw, table + 4 * i + 4)[0] if i + 1 < n else table
    return decoder.decode(raw[start:end], views=views)


def select_frames(
    layout: ChunkLayout, block: int, fields: frozenset[str] | None
) -> list[FrameIndex]:
    frames = layout.footer.blocks[block].frames
    if fields is None:
        return frames
    names = layout.columns
    return [f for f in frames if names[f.column] in fields]


def decode_blocks(
    parts: list[tuple[ChunkLayout, FileBytes, frozenset[str] | None]],
    first: int,
    last: int,
    decoder: ValueDecoder,
    views: bool,
) -> Iterator[list[dict[str, Any]]]:
    """The samples of blocks [first, last) of one chunk, a list per block, from the bytes of
    its sources (each with the columns to keep, or None for all of them).

    The streaming reader's loop, with ``_frame_raw``'s work inline: when samples are larger
    than a block, a block is one sample and this per-frame work is most of its cost (inline,
    W2 read 94,000 to 96,000 samples/s in-process; through ``_frame_raw``, 86,000 to 87,000).
    """
    prepared = []
    for layout, buf, keep in parts:
        wanted = (
            None
            if keep is None
            else frozenset(i for i, name in enumerate(layout.columns) if name in keep)
        )
        whole = None if isinstance(buf, Ranges) else memoryview(buf)
        prepared.append((layout, wanted, whole, buf))
    block_starts = parts[0][0].block_starts
    decode = decoder.decode_list
    for number in range(first, last):
        n = block_starts[number + 1] - block_starts[number]
        names: list[str] = []
        columns: list[list[Any]] = []
        sparse = False
        for layout, wanted, whole, buf in prepared:
            check, where, column_names = layout.check, layout.where, layout.columns
            for frame in layout.footer.blocks[number].frames:
                if wanted is not None and frame.column not in wanted:
                    continue
                offset, length = frame.offset, frame.length
                if whole is not None:
                    stored = whole[offset : offset + length]
                else:
                    assert isinstance(buf, Ranges)
                    stored = buf.view(offset, length)
                if len(stored) != length:
                    raise CorruptError(f"{where}: truncated frame at offset {offset}")
                if check(stored) != frame.checksum:
                    raise ChecksumError(f"checksum mismatch in {where}")
                raw = (
                    stored
                    if frame.codec == CODEC_RAW
                    else memoryview(decompress_frame(stored, frame.codec, frame.raw_length, where))
                )
                table = len(raw) - 4 * n
                values = decode(raw[:table], views=views)
                if views and type(values[0]) is not memoryview:  # not all bytes
                    values = _views_one_by_one(values, raw, table, decoder)
                columns.append(values)
                names.append(column_names[frame.column])
                sparse = sparse or bool(frame.flags)
        yield assemble(names, columns, sparse, n)


def _views_one_by_one(
    values: list[Any], raw: memoryview, table: int, decoder: ValueDecoder
) -> list[Any]:
    """A frame's values with each ``bytes`` one a view, as ``decode_value`` gives it: for a
    column whose values are not all ``bytes`` (absent, None, mixed), which a zero-copy reader
    must not hand out as copies in one block and views in another."""
    if not any(type(value) is bytes for value in values):
        return values
    starts = [*struct.unpack_from(f"<{len(values)}I", raw, table), table]
    return [
        decoder.decode(raw[starts[k] : starts[k + 1]], views=True)
        if type(value) is bytes
        else value
        for k, value in enumerate(values)
    ]


def assemble(
    names: list[str], columns: list[list[Any]], sparse: bool, n: int
) -> list[dict[str, Any]]:
    """Turn per-column value lists into ``n`` per-sample dicts, dropping ABSENT slots."""
    if not columns:
        return [{} for _ in range(n)]
    rows = [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
    if sparse:
        for row in rows:
            for key in [k for k, v in row.items() if v is ABSENT]:
                del row[key]
    return rows
