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
from itertools import accumulate
from typing import Any

import msgspec

from ..errors import CorruptError, EncodeError, UnsupportedFormatError
from .codec import FrameCompressor, crc32, open_frame
from .values import ABSENT, ABSENT_BYTES, ValueDecoder, ValueEncoder

CHUNK_MAGIC = b"TXSC"
TRAILER_MAGIC = b"TXSCEND\0"
CHUNK_MAJOR, CHUNK_MINOR = 1, 0
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
    crc32: int
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
    data: bytes
    num_samples: int
    footer_offset: int
    crc32: int


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 65536:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def encode_frame_raw(values: list[bytes]) -> bytes:
    """Join encoded values into a frame's raw bytes: array, then a u32 start offset per value."""
    head = _array_header(len(values))
    starts = list(accumulate((len(v) for v in values[:-1]), initial=len(head)))
    return b"".join((head, *values, struct.pack(f"<{len(values)}I", *starts)))


class ChunkBuilder:
    """Accumulates samples into one chunk; the caller decides when the chunk is full."""

    def __init__(self, *, block_bytes: int, compressor: FrameCompressor) -> None:
        self._block_limit = block_bytes
        self._compressor = compressor
        self._encoder = ValueEncoder()
        self._parts: list[bytes] = [HEADER.pack(CHUNK_MAGIC, CHUNK_MAJOR, CHUNK_MINOR)]
        self._size = HEADER.size
        self._crc = crc32(self._parts[0])
        self._columns: dict[str, int] = {}
        self._blocks: list[BlockIndex] = []
        self._num_samples = 0
        self._reset_block()

    def _reset_block(self) -> None:
        self._cols: dict[str, list[bytes]] = {}
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

    def add(self, sample: Any, position: int) -> None:
        """Add one sample; on EncodeError the builder is unchanged."""
        if type(sample) is not dict:
            raise EncodeError(f"sample {position}: expected a dict, got {type(sample).__name__}")
        encode = self._encoder.encode
        encoded: list[tuple[str, bytes]] = []
        nbytes = 0
        for key, value in sample.items():
            if type(key) is not str:
                raise EncodeError(f"sample {position}: key {key!r} is not a str")
            data = encode(value, position=position, key=key)
            encoded.append((key, data))
            nbytes += len(data)
        cols, n = self._cols, self._block_n
        for key, data in encoded:
            col = cols.get(key)
            if col is None:
                col = cols[key] = [ABSENT_BYTES] * n
                if n:
                    self._sparse.add(key)
            col.append(data)
        if len(cols) != len(encoded):
            for key, col in cols.items():
                if len(col) == n:
                    col.append(ABSENT_BYTES)
                    self._sparse.add(key)
        self._block_n = n + 1
        self._block_bytes += nbytes
        if self._block_bytes >= self._block_limit or self._block_n >= MAX_BLOCK_SAMPLES:
            self._seal_block()

    def _seal_block(self) -> None:
        if not self._block_n:
            return
        frames = []
        for name, values in self._cols.items():
            column = self._columns.setdefault(name, len(self._columns))
            raw = encode_frame_raw(values)
            codec, stored = self._compressor.compress(raw)
            checksum = crc32(stored)
            flags = FLAG_SPARSE if name in self._sparse else 0
            frames.append(
                FrameIndex(column, self._size, len(stored), len(raw), codec, checksum, flags)
            )
            self._parts.append(stored)
            self._size += len(stored)
            self._crc = crc32(stored, self._crc)
        self._blocks.append(BlockIndex(self._block_n, frames))
        self._num_samples += self._block_n
        self._reset_block()

    def finish(self) -> BuiltChunk:
        self._seal_block()
        footer = msgspec.msgpack.encode(
            ChunkFooter(
                CHUNK_MAJOR, CHUNK_MINOR, self._num_samples, list(self._columns), self._blocks
            )
        )
        trailer = TRAILER.pack(len(footer), crc32(footer), TRAILER_MAGIC)
        footer_offset = self._size
        crc = crc32(trailer, crc32(footer, self._crc))
        data = b"".join((*self._parts, footer, trailer))
        self._parts = []
        return BuiltChunk(data, self._num_samples, footer_offset, crc)


class ChunkLayout:
    """A decoded footer with the lookups readers need."""

    __slots__ = ("block_starts", "columns", "footer", "where")

    def __init__(self, footer: ChunkFooter, where: str) -> None:
        self.footer = footer
        self.where = where
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
    return ChunkLayout(footer, where)


def check_header(data: bytes | memoryview, where: str) -> None:
    magic, major, _minor = HEADER.unpack_from(data)
    if magic != CHUNK_MAGIC:
        raise CorruptError(f"{where}: not a txstore chunk (bad magic)")
    if major > CHUNK_MAJOR:
        raise UnsupportedFormatError(f"{where}: chunk format {major} is newer than this txstore")


def _frame_raw(buf: bytes | memoryview, base: int, frame: FrameIndex, where: str) -> memoryview:
    start = frame.offset - base
    stored = memoryview(buf)[start : start + frame.length]
    if len(stored) != frame.length:
        raise CorruptError(f"{where}: truncated frame at offset {frame.offset}")
    return memoryview(open_frame(stored, frame.codec, frame.raw_length, frame.crc32, where))


def decode_column(
    buf: bytes | memoryview, base: int, frame: FrameIndex, n: int, decoder: ValueDecoder, where: str
) -> list[Any]:
    """All values of one frame; ``buf`` holds the file's bytes from offset ``base``."""
    raw = _frame_raw(buf, base, frame, where)
    values: list[Any] = decoder.decode(raw[: len(raw) - 4 * n])
    return values


def decode_value(
    buf: bytes | memoryview,
    base: int,
    frame: FrameIndex,
    n: int,
    i: int,
    decoder: ValueDecoder,
    where: str,
) -> Any:
    """Value ``i`` of one frame, decoding only that value."""
    raw = _frame_raw(buf, base, frame, where)
    table = len(raw) - 4 * n
    (start,) = struct.unpack_from("<I", raw, table + 4 * i)
    end = struct.unpack_from("<I", raw, table + 4 * i + 4)[0] if i + 1 < n else table
    return decoder.decode(raw[start:end])


def select_frames(
    layout: ChunkLayout, block: int, fields: frozenset[str] | None
) -> list[FrameIndex]:
    frames = layout.footer.blocks[block].frames
    if fields is None:
        return frames
    names = layout.columns
    return [f for f in frames if names[f.column] in fields]


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
