"""Chunk files: samples in blocks, each block a set of per-column frames, then a footer.

Layout (docs/format.md has it byte for byte)::

    header   8 bytes   b"TXSC", u16 major, u16 minor
    frames   ...       block 0 column frames, block 1 column frames, ...
    footer   ...       MessagePack footer: the block index, packed (major 3; a list in 1, 2)
    trailer  16 bytes  u32 footer length, u32 footer crc32, b"TXSCEND\\0"

A frame holds one column of one block: a MessagePack array of the block's values followed by a
u32 offset per value, so a reader decodes the whole column in one call when it streams, or one
value when it seeks. Blocks are small (``block_bytes``), so reading one sample reads and
decodes one block's frames of the fields asked for, never the whole chunk. This module reads
them; ``builder`` writes them.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, pairwise
from typing import Annotated, Any, TypeVar

import msgspec
import numpy as np

from ..errors import ChecksumError, CorruptError, UnsupportedFormatError
from .codec import CODEC_RAW, FRAME_CHECKSUMS, chunk_digest, crc32, open_frame
from .values import ABSENT, ABSENT_BYTES, ValueDecoder

CHUNK_MAGIC = b"TXSC"
TRAILER_MAGIC = b"TXSCEND\0"
# 3.0: a packed block index (a sample's block found without decoding every block); 2.x:
# XXH3-64 frame checksums; 1.x: CRC-32
CHUNK_MAJOR, CHUNK_MINOR = 3, 0
PACKED_FROM = 3  # the first major whose footer is a PackedFooter
HEADER = struct.Struct("<4sHH")
TRAILER = struct.Struct("<II8s")
MAX_BLOCK_SAMPLES = 4096
FLAG_SPARSE = 1  # the frame holds ABSENT markers

# Ranges of the footer's numbers, checked by msgspec as it decodes (in C: no cost per frame
# in Python); what relates them to each other is checked before any frame is decoded
# (``_check_frames``).
_Nat = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_U64 = Annotated[int, msgspec.Meta(ge=0)]  # MessagePack ints stop at 2**64 - 1
_BlockSamples = Annotated[int, msgspec.Meta(ge=1, le=MAX_BLOCK_SAMPLES)]


# Footer structs hold only ints, strs and each other, so they cannot be part of a reference
# cycle: ``gc=False`` keeps the thousands a chunk has out of the cyclic GC, whose full passes
# over a large heap (torch imported: 350,000 objects) took 0.2 s each during appends and reads.
class FrameIndex(msgspec.Struct, array_like=True, frozen=True, gc=False):
    column: _Nat
    offset: _Nat
    length: _Nat
    raw_length: _Nat
    codec: _Nat
    checksum: _U64  # of the stored bytes: XXH3-64 from format 2, CRC-32 in format 1
    flags: _Nat


class BlockIndex(msgspec.Struct, array_like=True, frozen=True, gc=False):
    num_samples: _BlockSamples
    frames: tuple[FrameIndex, ...]


class ChunkFooter(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A footer with every block decoded: as majors 1 and 2 store it, and as readers of any
    major use it once they need every block."""

    major: _Nat
    minor: _Nat
    num_samples: _Nat
    columns: list[str]
    blocks: list[BlockIndex]


# The footer of major 3 on: the blocks' sample counts and where each one's frames are, as
# packed arrays, and their frames encoded one block after another. Opening a chunk decodes
# a few objects, not one per block (a 64 MiB chunk has hundreds to thousands of blocks: a
# fifth of a millisecond to decode them, the bulk of a random read's first touch of a chunk).
# ``blocks`` stays an empty list, where majors 1 and 2 have theirs, so that a reader of major
# 2 decodes the footer, finds a newer major and refuses the chunk as such.
class PackedFooter(msgspec.Struct, array_like=True, frozen=True, gc=False):
    major: _Nat
    minor: _Nat
    num_samples: _Nat
    columns: list[str]
    blocks: Annotated[list[None], msgspec.Meta(max_length=0)]
    starts: bytes  # u64 LE per block, then num_samples: block k holds [starts[k], starts[k+1])
    frame_ends: bytes  # u32 LE per block: where its frames end in ``frames``
    frames: bytes  # each block's MessagePack array of FrameIndex, one after another


# The same footer with each block's frames left encoded: what reading one sample of a chunk
# needs decodes in a quarter of the time of the whole footer (a 64 MiB chunk of 100 KiB
# samples has 650 blocks), and a block's frames are decoded when a reader asks for them.
class _BlockHead(msgspec.Struct, array_like=True, frozen=True, gc=False):
    num_samples: _BlockSamples
    frames: msgspec.Raw


class _FooterHead(msgspec.Struct, array_like=True, frozen=True, gc=False):
    major: _Nat
    minor: _Nat
    num_samples: _Nat
    columns: list[str]
    blocks: list[_BlockHead]


_FRAMES = msgspec.msgpack.Decoder(tuple[FrameIndex, ...])
_ALL_FRAMES = msgspec.msgpack.Decoder(list[tuple[FrameIndex, ...]])
_BLOCK_RAWS = msgspec.msgpack.Decoder(list[msgspec.Raw])


def _array_header(count: int) -> bytes:
    """The MessagePack header of an array of ``count`` items (array 32: any count)."""
    return b"\xdd" + count.to_bytes(4, "big")


class ChunkLayout:
    """A decoded footer with the lookups readers need.

    Parsed ``lazy``, only the footer's totals are decoded and checked at first, and a block's
    frames when a reader asks for them (``block_frames``): reading one sample of a chunk does
    not pay for the thousands of frames it does not touch. ``footer`` decodes and checks the
    rest the first time it is asked for, so every other reader sees a footer checked whole."""

    __slots__ = (
        "_footer",
        "_frames",
        "_head",
        "_high",
        "_packed",
        "block_starts",
        "check",
        "columns",
        "major",
        "minor",
        "num_samples",
        "where",
    )

    def __init__(self, footer: ChunkFooter, where: str, footer_offset: int | None = None) -> None:
        starts = list(accumulate([b.num_samples for b in footer.blocks], initial=0))
        self._setup(footer, starts, where, footer_offset)
        self._head: tuple[_FooterHead, bytes] | None = None
        self._packed: tuple[bytes, Any] | None = None  # frames, their ends (numpy int64)
        self._frames: list[tuple[FrameIndex, ...] | None] = []
        self._footer: ChunkFooter | None = footer
        why = _check_frames(footer, self._high)
        if why:
            raise CorruptError(f"{where}: bad chunk footer: {why}")

    @classmethod
    def _lazy(
        cls, head: _FooterHead, raw: bytes, where: str, footer_offset: int | None
    ) -> ChunkLayout:
        """Majors 1 and 2: the blocks' counts decoded, their frames kept encoded."""
        self = cls.__new__(cls)
        starts = list(accumulate([b.num_samples for b in head.blocks], initial=0))
        self._setup(head, starts, where, footer_offset)
        self._head = (head, raw)
        self._packed = None
        self._frames = [None] * len(head.blocks)
        self._footer = None
        return self

    @classmethod
    def _of_packed(
        cls, packed: PackedFooter, where: str, footer_offset: int | None, lazy: bool
    ) -> ChunkLayout:
        self = cls.__new__(cls)
        starts, ends = _packed_index(packed, where)
        self._setup(packed, starts, where, footer_offset)
        self._head = None
        self._packed = (packed.frames, ends)
        self._frames = [None] * len(ends)
        self._footer = None
        if not lazy:
            self.footer  # noqa: B018 -- decodes and checks every block now
            self._packed, self._frames = None, []  # not shared yet: nothing reads them
        return self

    def _setup(
        self,
        footer: ChunkFooter | _FooterHead | PackedFooter,
        block_starts: list[int],
        where: str,
        footer_offset: int | None,
    ) -> None:
        """The lookups, and the footer's totals checked (``CorruptError``)."""
        self.where = where
        self.major, self.minor = footer.major, footer.minor
        self.check = FRAME_CHECKSUMS[footer.major]
        self.columns = footer.columns
        self.num_samples = footer.num_samples
        self.block_starts = block_starts
        self._high = 2**63 if footer_offset is None else footer_offset
        total = block_starts[-1]
        why = ""
        if len(set(self.columns)) != len(self.columns):
            why = "a column name appears twice"
        elif total != self.num_samples:
            why = f"its blocks hold {total} samples, the footer says {self.num_samples}"
        if why:
            raise CorruptError(f"{where}: bad chunk footer: {why}")

    @property
    def footer(self) -> ChunkFooter:
        """The whole footer, every frame checked (``CorruptError``)."""
        footer = self._footer
        if footer is None:
            if self._head is not None:
                footer = _decode(self._head[1], ChunkFooter, self.where)
            else:
                footer = ChunkFooter(
                    self.major, self.minor, self.num_samples, self.columns, self._packed_blocks()
                )
            why = _check_frames(footer, self._high)
            if why:
                raise CorruptError(f"{self.where}: bad chunk footer: {why}")
            # The lazy state stays: another thread may be decoding a block from it right now
            # (a projection read makes the whole footer of a layout a sample reader shares).
            self._footer = footer
        return footer

    def _packed_blocks(self) -> list[BlockIndex]:
        """Every block of a packed footer, its frames decoded (unchecked). One decoding pass
        over all blocks, which takes half the time of one a block; a pass of ``Raw``s first
        checks that each block's bytes are one value ending where ``frame_ends`` says."""
        assert self._packed is not None
        frames, ends = self._packed
        whole = _array_header(len(ends)) + frames
        try:
            raws = _BLOCK_RAWS.decode(whole)
            sizes = np.fromiter(map(len, raws), np.int64, len(raws))
            decoded = _ALL_FRAMES.decode(whole) if np.array_equal(np.cumsum(sizes), ends) else None
        except msgspec.DecodeError:
            decoded = None
        if decoded is None:
            for number in range(len(ends)):
                self._packed_frames(number)  # names the block at fault, if one alone is
            raise CorruptError(
                f"{self.where}: bad chunk footer: its blocks' frames do not end where "
                "frame_ends says"
            )
        starts = self.block_starts
        return [BlockIndex(b - a, f) for (a, b), f in zip(pairwise(starts), decoded, strict=True)]

    def _packed_frames(self, number: int) -> tuple[FrameIndex, ...]:
        """A block's frames, decoded from a packed footer (unchecked)."""
        assert self._packed is not None
        frames, ends = self._packed
        start = ends[number - 1] if number else 0
        try:
            return _FRAMES.decode(memoryview(frames)[start : ends[number]])
        except msgspec.DecodeError as e:
            raise CorruptError(f"{self.where}: bad chunk footer: block {number}: {e}") from e

    def block_frames(self, number: int) -> Sequence[FrameIndex]:
        """The frames of one block, checked (``CorruptError``)."""
        footer = self._footer
        if footer is not None:
            return footer.blocks[number].frames
        frames = self._frames[number]
        if frames is None:
            head = self._head
            if head is None:
                frames = self._packed_frames(number)
            else:
                try:
                    frames = _FRAMES.decode(head[0].blocks[number].frames)
                except msgspec.DecodeError as e:
                    raise CorruptError(f"{self.where}: bad chunk footer: {e}") from e
            why = _check_block(
                frames, number, self.block_samples(number), len(self.columns), self._high
            )
            if why:
                raise CorruptError(f"{self.where}: bad chunk footer: {why}")
            self._frames[number] = frames
        return frames

    def block_samples(self, number: int) -> int:
        return self.block_starts[number + 1] - self.block_starts[number]

    def locate(self, index: int) -> tuple[int, int]:
        """(block number, index within block) of a sample."""
        block = bisect_right(self.block_starts, index) - 1
        return block, index - self.block_starts[block]


def _packed_index(footer: PackedFooter, where: str) -> tuple[list[int], Any]:
    """A packed footer's block starts and frame ends, checked as a whole (``CorruptError``):
    what majors 1 and 2 cannot break by their structure (a block of 1 to 4096 samples, its
    frames within the footer) checked in a few array operations."""
    count = len(footer.frame_ends) // 4
    if len(footer.frame_ends) % 4 or len(footer.starts) != 8 * (count + 1):
        why = (
            f"{len(footer.starts)} bytes of block starts and {len(footer.frame_ends)} of "
            "frame ends do not describe the same blocks"
        )
    else:
        # As signed: a start of 2**63 or more turns negative, a step down the rules refuse.
        starts = np.frombuffer(footer.starts, "<i8")
        ends = np.frombuffer(footer.frame_ends, "<u4").astype(np.int64)
        end = int(ends[-1]) if count else 0
        if starts[0] != 0:
            why = "its first block does not start at sample 0"
        elif not _steps_within(starts, MAX_BLOCK_SAMPLES):
            why = f"a block does not hold 1 to {MAX_BLOCK_SAMPLES} samples"
        elif count and (ends[0] < 1 or not _steps_within(ends, 2**32)):
            why = "a block's frames do not follow the previous block's"
        elif end != len(footer.frames):
            why = f"its blocks' frames end at {end} of {len(footer.frames)} bytes"
        else:
            # The ends stay an array: only this layout's own decoding indexes them.
            return starts.tolist(), ends
    raise CorruptError(f"{where}: bad chunk footer: {why}")


def _steps_within(values: Any, high: int) -> bool:
    """Whether each step from one of ``values`` (a numpy array) to the next is in [1, high]."""
    if len(values) < 2:
        return True
    steps = values[1:] - values[:-1]
    return bool(steps.min() >= 1 and steps.max() <= high)


def encode_footer(
    num_samples: int, columns: list[str], blocks: Sequence[tuple[int, Sequence[FrameIndex]]]
) -> bytes:
    """The footer of a chunk of ``blocks`` (each its sample count and frames), as this
    version writes it (major ``CHUNK_MAJOR``)."""
    encode = _ENCODER.encode
    framed = [encode(frames) for _, frames in blocks]
    starts = list(accumulate((n for n, _ in blocks), initial=0))
    ends = list(accumulate(map(len, framed)))
    return encode(
        PackedFooter(
            CHUNK_MAJOR,
            CHUNK_MINOR,
            num_samples,
            columns,
            [],
            struct.pack(f"<{len(starts)}Q", *starts),
            struct.pack(f"<{len(ends)}I", *ends),
            b"".join(framed),
        )
    )


_ENCODER = msgspec.msgpack.Encoder()


_T = TypeVar("_T")


def _decode(raw: bytes | memoryview, kind: type[_T], where: str) -> _T:
    try:
        return msgspec.msgpack.decode(raw, type=kind)
    except msgspec.DecodeError as e:
        if len(raw) > 1 and 0x90 <= raw[0] <= 0x9F and CHUNK_MAJOR < raw[1] <= 0x7F:
            _check_major(raw[1], 0, where)  # a newer major may lay its footer out anew
        raise CorruptError(f"{where}: bad chunk footer: {e}") from e


def parse_footer(
    tail: bytes | memoryview, where: str, footer_offset: int | None = None, *, lazy: bool = False
) -> ChunkLayout:
    """Parse a chunk's footer from its tail (footer plus trailer) and check that it describes
    a chunk readers can decode. With ``footer_offset`` (where the footer starts in the file),
    also that every frame lies between the header and the footer. ``lazy``: a block's frames
    are decoded and checked when first asked for (see ``ChunkLayout``)."""
    if len(tail) < TRAILER.size:
        raise CorruptError(f"{where}: truncated chunk (no trailer)")
    length, checksum, magic = TRAILER.unpack_from(tail, len(tail) - TRAILER.size)
    if magic != TRAILER_MAGIC:
        raise CorruptError(f"{where}: not a txstore chunk (bad trailer magic)")
    footer_bytes = memoryview(tail)[len(tail) - TRAILER.size - length : len(tail) - TRAILER.size]
    if len(footer_bytes) != length or crc32(footer_bytes) != checksum:
        raise CorruptError(f"{where}: chunk footer checksum mismatch")
    # The major is the footer array's first item: one byte after a fixarray's header.
    if length > 1 and footer_bytes[1] >= PACKED_FROM:
        packed = _decode(footer_bytes, PackedFooter, where)
        _check_major(packed.major, packed.minor, where)
        return ChunkLayout._of_packed(packed, where, footer_offset, lazy)
    if lazy:
        raw = bytes(footer_bytes)  # kept by the layout: never a view of a mapped file
        found: ChunkFooter | _FooterHead = _decode(raw, _FooterHead, where)
    else:
        found = _decode(footer_bytes, ChunkFooter, where)
    _check_major(found.major, found.minor, where)
    if found.major >= PACKED_FROM:
        raise CorruptError(f"{where}: bad chunk footer: major {found.major} with a list of blocks")
    if isinstance(found, _FooterHead):
        return ChunkLayout._lazy(found, raw, where, footer_offset)
    return ChunkLayout(found, where, footer_offset)


def _check_major(major: int, minor: int, where: str) -> None:
    if major > CHUNK_MAJOR:
        raise UnsupportedFormatError(
            f"{where}: chunk format {major}.{minor} is newer than this txstore "
            f"reads ({CHUNK_MAJOR}.x); upgrade txstore"
        )
    if major not in FRAME_CHECKSUMS:
        raise CorruptError(f"{where}: bad chunk format version {major}")


def _check_frames(footer: ChunkFooter, high: int) -> str:
    """What makes the frames of a footer (its checksum valid) describe values no reader could
    decode, or "": checked before any of them is decoded, so that the decoding loop can trust
    them. A 64 MiB chunk has thousands of frames: one loop over them costs half the time of
    decoding the footer."""
    width = len(footer.columns)
    for number, block in enumerate(footer.blocks):
        why = _check_block(block.frames, number, block.num_samples, width, high)
        if why:
            return why
    return ""


def _check_block(
    frames: Sequence[FrameIndex], number: int, num_samples: int, width: int, high: int
) -> str:
    """``_check_frames`` for the frames of one block."""
    low = HEADER.size
    need = 4 * num_samples + 1  # the raw bytes end with a u32 offset per value, after at
    # least an array header
    # Stored one after another (§7.1): a reader of one sample reads them as one range.
    at, apart = -1, ""
    for f in frames:
        end = f.offset + f.length
        if (
            f.column >= width
            or f.offset < low
            or end > high
            or f.raw_length < need
            or (f.codec == CODEC_RAW and f.length != f.raw_length)
        ):
            return f"block {number}: {_bad_frame(f, width, low, high, need)}"
        if f.offset != at and at >= 0 and not apart:
            apart = f"block {number}: a frame at {f.offset} does not follow the one ending at {at}"
        at = end
    if len(frames) > 1 and len({f.column for f in frames}) != len(frames):
        return "a block has two frames of one column"
    return apart


def _bad_frame(f: FrameIndex, width: int, low: int, high: int, need: int) -> str:
    if f.column >= width:
        return f"a frame names column {f.column} of {width}"
    if f.offset < low or f.offset + f.length > high:
        return (
            f"a frame at [{f.offset}, {f.offset + f.length}) lies outside the frames "
            f"[{low}, {high}) of the file"
        )
    return f"a frame of {f.raw_length} raw bytes ({f.length} stored) for values needing {need}"


def check_header(data: bytes | memoryview, where: str) -> None:
    magic, major, _minor = HEADER.unpack_from(data)
    if magic != CHUNK_MAGIC:
        raise CorruptError(f"{where}: not a txstore chunk (bad magic)")
    if major > CHUNK_MAJOR:
        raise UnsupportedFormatError(f"{where}: chunk format {major} is newer than this txstore")


def check_file(
    data: bytes | memoryview,
    *,
    size: int,
    footer_offset: int,
    crc32_: int,
    digest: str | None,
    where: str,
) -> ChunkLayout:
    """Check every byte of a whole chunk-format file against what its reference records: the
    size, the footer's CRC-32, then the body against ``digest`` or, without one (field files,
    chunks before format 1.2), each frame against its checksum. ``ChecksumError`` or
    ``CorruptError`` naming ``where``; the parsed layout otherwise."""
    view = memoryview(data)
    if len(view) != size:
        raise CorruptError(f"{where} is {len(view)} bytes, its reference says {size}")
    if not HEADER.size <= footer_offset <= size - TRAILER.size:
        raise CorruptError(f"{where} has its footer at {footer_offset}, outside the file")
    tail = view[footer_offset:]
    if crc32(tail) != crc32_:
        raise ChecksumError(f"{where} does not match its checksum (CRC-32 of its footer)")
    check_header(view, where)
    layout = parse_footer(tail, where, footer_offset)
    if digest is not None:  # covers every byte before the footer
        if chunk_digest(view[:footer_offset]) != digest:
            raise ChecksumError(f"{where} does not match its digest (XXH3-64 of its contents)")
        return layout
    for block in layout.footer.blocks:
        for frame in block.frames:  # within the file: parse_footer checked it
            if layout.check(view[frame.offset : frame.offset + frame.length]) != frame.checksum:
                raise ChecksumError(
                    f"{where} does not match the checksum of its frame at {frame.offset}"
                )
    return layout


# MessagePack: the bytes a value takes after its type byte, by type byte, and how many
# values it holds (arrays, maps); sizes read from the following bytes are added to it.
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED |= {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin, str: length bytes
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}  # ext: length bytes, then a type byte
_CONTAINER = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # (length bytes, per item)
_UINT = {1: struct.Struct(">B"), 2: struct.Struct(">H"), 4: struct.Struct(">I")}


def _skip(raw: memoryview, pos: int) -> int:
    """Where the MessagePack value at ``pos`` ends (ValueError if it runs past ``raw``)."""
    pending = 1
    while pending:
        pending -= 1
        t = raw[pos]
        pos += 1
        if t <= 0x7F or t >= 0xE0:
            continue
        if t <= 0x8F:
            pending += 2 * (t & 0x0F)
        elif t <= 0x9F:
            pending += t & 0x0F
        elif t <= 0xBF:
            pos += t & 0x1F
        elif t in _FIXED:
            pos += _FIXED[t]
        elif t in _SIZED:
            width = _SIZED[t]
            pos += width + _UINT[width].unpack_from(raw, pos)[0]
        elif t in _EXT:
            width = _EXT[t]
            pos += width + 1 + _UINT[width].unpack_from(raw, pos)[0]
        elif t in _CONTAINER:
            width, per = _CONTAINER[t]
            pending += per * _UINT[width].unpack_from(raw, pos)[0]
            pos += width
        else:
            raise ValueError(f"byte {t:#x} starts no MessagePack value")
        if pos > len(raw):
            raise ValueError("a value runs past the frame")
    return pos


def offset_table_error(raw: memoryview, n: int) -> str:
    """What is wrong with a raw frame's table of value offsets, or "": each must be where its
    value starts in the frame's array. Readers of whole blocks never look at the table; a
    reader of one sample uses nothing else, so a wrong table would give it another value."""
    table = len(raw) - 4 * n
    if table < 1:
        return "too short for its offset table"
    try:
        head = raw[0]
        if 0x90 <= head <= 0x9F:
            count, pos = head & 0x0F, 1
        elif head in (0xDC, 0xDD):
            width = _CONTAINER[head][0]
            count, pos = _UINT[width].unpack_from(raw, 1)[0], 1 + width
        else:
            return "does not hold an array of values"
        if count != n:
            return f"holds {count} values, its block {n}"
        offsets = struct.unpack_from(f"<{n}I", raw, table)
        for k, offset in enumerate(offsets):
            if offset != pos:
                return f"gives value {k} at {offset}, it is at {pos}"
            pos = _skip(raw[:table], pos)
    except (ValueError, IndexError, struct.error) as e:
        return f"does not parse: {e}"
    if pos != table:
        return f"has {table - pos} bytes between its values and its offset table"
    return ""


def check_offset_tables(data: bytes | memoryview, layout: ChunkLayout) -> None:
    """Every frame's offset table of a whole file, as ``offset_table_error``: CorruptError."""
    blocks = layout.footer.blocks
    for block in blocks:
        for frame in block.frames:
            raw = _frame_raw(data, 0, frame, layout)
            why = offset_table_error(raw, block.num_samples)
            if why:
                raise CorruptError(
                    f"{layout.where}: the frame at {frame.offset} {why} (its offset table)"
                )


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
    return open_frame(
        stored, frame.codec, frame.raw_length, frame.checksum, layout.check, layout.where
    )


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
    return _value_at(raw, len(raw) - 4 * n, n, i, frame, decoder, layout, views)


def decode_values(
    buf: FileBytes,
    base: int,
    frame: FrameIndex,
    n: int,
    rows: Sequence[int],
    decoder: ValueDecoder,
    layout: ChunkLayout,
) -> list[Any]:
    """Values ``rows`` of one frame (ABSENT where a sparse frame has none), the frame checked
    and opened once for all of them."""
    raw = _frame_raw(buf, base, frame, layout)
    table = len(raw) - 4 * n
    if len(rows) == 1:
        return [_value_at(raw, table, n, rows[0], frame, decoder, layout, False)]
    if table < 0:
        raise CorruptError(f"{layout.where}: the frame at {frame.offset} is too short")
    ends = (*struct.unpack_from(f"<{n}I", raw, table), table)
    sparse = frame.flags & FLAG_SPARSE
    decode = decoder.decode
    out = []
    try:
        for i in rows:
            data = raw[ends[i] : ends[i + 1]]
            out.append(ABSENT if sparse and data == ABSENT_BYTES else decode(data))
    except (msgspec.DecodeError, CorruptError) as e:
        raise CorruptError(f"{layout.where}: bad value in the frame at {frame.offset}: {e}") from e
    except UnsupportedFormatError as e:
        raise UnsupportedFormatError(f"{layout.where}: {e}") from e
    return out


def _value_at(
    raw: memoryview,
    table: int,
    n: int,
    i: int,
    frame: FrameIndex,
    decoder: ValueDecoder,
    layout: ChunkLayout,
    views: bool,
) -> Any:
    if not 0 <= i < n or table < 0:
        raise CorruptError(f"{layout.where}: the frame at {frame.offset} has no value {i}")
    (start,) = struct.unpack_from("<I", raw, table + 4 * i)
    end = struct.unpack_from("<I", raw, table + 4 * i + 4)[0] if i + 1 < n else table
    data = raw[start:end]
    if frame.flags & FLAG_SPARSE and data == ABSENT_BYTES:
        return ABSENT
    try:
        return decoder.decode(data, views=views)
    except (msgspec.DecodeError, CorruptError) as e:
        raise CorruptError(f"{layout.where}: bad value in the frame at {frame.offset}: {e}") from e
    except UnsupportedFormatError as e:
        raise UnsupportedFormatError(f"{layout.where}: {e}") from e


def frame_presence(buf: FileBytes, frame: FrameIndex, n: int, layout: ChunkLayout) -> list[bool]:
    """Which of a frame's ``n`` values are present (not ABSENT), from its offset table alone:
    no value is decoded. A frame not flagged sparse holds no ABSENT marker."""
    if not frame.flags & FLAG_SPARSE:
        return [True] * n
    raw = _frame_raw(buf, 0, frame, layout)
    table = len(raw) - 4 * n
    if table < 1:
        raise CorruptError(f"{layout.where}: the frame at {frame.offset} is too short")
    starts = [*struct.unpack_from(f"<{n}I", raw, table), table]
    marker, width = ABSENT_BYTES, len(ABSENT_BYTES)
    return [
        not (starts[k + 1] - starts[k] == width and raw[starts[k] : starts[k + 1]] == marker)
        for k in range(n)
    ]


def select_frames(
    layout: ChunkLayout, block: int, fields: frozenset[str] | None
) -> Sequence[FrameIndex]:
    frames = layout.block_frames(block)
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
    checked: Sequence[bool] = (),
) -> Iterator[list[dict[str, Any]]]:
    """The samples of blocks [first, last) of one chunk, a list per block, from the bytes of
    its sources (each with the columns to keep, or None for all of them). A source whose
    ``checked`` is true had its whole body checked already: its frames are not checked again.

    The streaming reader's loop. When samples are larger than a block, a block is one sample
    and the per-frame work is most of its cost: a frame's slice is taken inline, from a view
    of the whole file made once.
    """
    prepared = []
    for number, (layout, buf, keep) in enumerate(parts):
        wanted = (
            None
            if keep is None
            else frozenset(i for i, name in enumerate(layout.columns) if name in keep)
        )
        whole = None if isinstance(buf, Ranges) else memoryview(buf)
        check = None if number < len(checked) and checked[number] else layout.check
        blocks = layout.footer.blocks
        prepared.append((blocks, layout.columns, layout.where, check, wanted, whole, buf))
    block_starts = parts[0][0].block_starts
    decode = decoder.decode_list
    plain = decoder.decode_list_plain
    sparse_values = decoder.decode_sparse
    for number in range(first, last):
        n = block_starts[number + 1] - block_starts[number]
        # A block of one sample (large samples) fills its dict as it goes, with no per-column
        # lists to zip: for large samples that per-sample overhead is most of the decode.
        row: dict[str, Any] | None = {} if n == 1 else None
        names: list[str] = []
        columns: list[list[Any]] = []
        sparse = False
        for blocks, column_names, where, check, wanted, whole, buf in prepared:
            for frame in blocks[number].frames:
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
                raw = open_frame(
                    stored, frame.codec, frame.raw_length, frame.checksum, check, where
                )
                table = len(raw) - 4 * n
                try:  # only a frame flagged sparse may hold ABSENT (at its top level)
                    if frame.flags & FLAG_SPARSE:
                        sparse = True
                        values = sparse_values(raw[:table], views=views)
                    elif views:
                        values = decode(raw[:table], views=True)
                    else:
                        values = plain(raw[:table])
                except (msgspec.DecodeError, CorruptError) as e:
                    raise CorruptError(f"{where}: bad frame at offset {offset}: {e}") from e
                except UnsupportedFormatError as e:
                    raise UnsupportedFormatError(f"{where}: {e}") from e
                if type(values) is not list or len(values) != n:
                    raise CorruptError(_miscounted(where, offset, values, n))
                # A column not all bytes was decoded as copies. (One value that is bytes
                # comes as a view already: only mixed columns need this.)
                if views and row is None and bytes in map(type, values):
                    values = _views_one_by_one(values, raw, table, decoder)
                if row is not None:
                    row[column_names[frame.column]] = values[0]
                else:
                    columns.append(values)
                    names.append(column_names[frame.column])
        if row is None:
            yield assemble(names, columns, sparse, n)
        elif sparse:
            yield [{name: value for name, value in row.items() if value is not ABSENT}]
        else:
            yield [row]


def decode_columns(
    parts: list[tuple[ChunkLayout, FileBytes, frozenset[str] | None]],
    decoder: ValueDecoder,
    checked: Sequence[bool] = (),
) -> dict[str, list[Any]]:
    """Each kept column of a chunk's sources (as for ``decode_blocks``) as one list of its
    values in sample order, None where a sample lacks it: a column at a time, with no dict
    per sample, for a reader that wants columns."""
    total = parts[0][0].block_starts[-1]
    out: dict[str, list[Any]] = {}
    for number, (layout, buf, keep) in enumerate(parts):
        check = None if number < len(checked) and checked[number] else layout.check
        whole = None if isinstance(buf, Ranges) else memoryview(buf)
        names, where = layout.columns, layout.where
        for block_number, block in enumerate(layout.footer.blocks):
            n, low = block.num_samples, layout.block_starts[block_number]
            for frame in block.frames:
                name = names[frame.column]
                if keep is not None and name not in keep:
                    continue
                offset, length = frame.offset, frame.length
                if whole is not None:
                    stored = whole[offset : offset + length]
                else:
                    assert isinstance(buf, Ranges)
                    stored = buf.view(offset, length)
                if len(stored) != length:
                    raise CorruptError(f"{where}: truncated frame at offset {offset}")
                raw = open_frame(
                    stored, frame.codec, frame.raw_length, frame.checksum, check, where
                )
                table = len(raw) - 4 * n
                try:
                    if frame.flags & FLAG_SPARSE:
                        values = [
                            None if v is ABSENT else v for v in decoder.decode_sparse(raw[:table])
                        ]
                    else:
                        values = decoder.decode_list_plain(raw[:table])
                except (msgspec.DecodeError, CorruptError) as e:
                    raise CorruptError(f"{where}: bad frame at offset {offset}: {e}") from e
                except UnsupportedFormatError as e:
                    raise UnsupportedFormatError(f"{where}: {e}") from e
                if type(values) is not list or len(values) != n:
                    raise CorruptError(_miscounted(where, offset, values, n))
                column = out.get(name)
                if column is None:
                    column = out[name] = [None] * total
                column[low : low + n] = values
    return out


def _miscounted(where: str, offset: int, values: Any, n: int) -> str:
    held = f"{len(values)} values" if type(values) is list else "no list of values"
    return f"{where}: the frame at offset {offset} holds {held}, its block {n} samples"


def _views_one_by_one(
    values: list[Any], raw: memoryview, table: int, decoder: ValueDecoder
) -> list[Any]:
    """A frame's values with each ``bytes`` one a view, as ``decode_value`` gives it: for a
    column whose values are not all ``bytes`` (absent, None, mixed), which a zero-copy reader
    must not hand out as copies in one block and views in another."""
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
