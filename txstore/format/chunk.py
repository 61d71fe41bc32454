"""Chunk files: samples in blocks, each block a set of per-column frames, then a footer.

Layout (docs/format.md has it byte for byte)::

    header   8 bytes   b"TXSC", u16 major, u16 minor
    frames   ...       block 0 column frames, block 1 column frames, ...
    footer   ...       MessagePack footer: the block index, packed (major 3; a list in 1, 2),
                       and (major 4) where the pieces of each column stored apart are
    trailer  16 bytes  u32 footer length, u32 footer crc32, b"TXSCEND\\0"

A frame holds one column of one block: a MessagePack array of the block's values followed by a
u32 offset per value, so a reader decodes the whole column in one call when it streams, or one
value when it seeks. Blocks are small (``block_bytes``), so reading one sample reads and
decodes one block's frames of the fields asked for, never the whole chunk.

A column may also be stored apart (major 4): in pieces of its own of up to 4096 values, one
frame each, as a copy of what the blocks hold (a chunk's small columns) or alone (a field
file's columns, which then has no blocks). A reader of that column alone reads a few large
frames, not one per block; a reader of samples reads a copy's values from the blocks.

This module lays out the file and its footer (parsed, checked, encoded); ``frames`` reads the
values out of the frames; ``builder`` and ``chunkfile`` write them.
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
from .codec import CODEC_RAW, FRAME_CHECKSUMS, chunk_digest, crc32

CHUNK_MAGIC = b"TXSC"
TRAILER_MAGIC = b"TXSCEND\0"
# 4.0: columns stored apart; 3.0: a packed block index (a sample's block found without
# decoding every block); 2.x: XXH3-64 frame checksums; 1.x: CRC-32. A writer writes 4 only
# for a file with a column stored apart, so that readers of 3 read every other file.
CHUNK_MAJOR, CHUNK_MINOR = 4, 0
ROWS_MAJOR = 3  # the major of a file whose columns are all in its blocks
PACKED_FROM = 3  # the first major whose footer is a PackedFooter
APART_FROM = 4  # the first major whose footer may list columns stored apart
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


class ApartColumn(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A column stored apart (major 4): its pieces' sample starts and one frame per piece,
    and whether the blocks hold the same values too (a copy for readers of that column)."""

    column: _Nat
    starts: bytes  # u64 LE per piece, then num_samples: piece k holds [starts[k], starts[k+1])
    frames: tuple[FrameIndex, ...]  # piece k's frame
    copy: bool  # the blocks hold the column too (its values in both)


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
    apart: tuple[ApartColumn, ...] = ()  # major 4; major 3 has no such item


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
        "alone",
        "apart",
        "block_starts",
        "check",
        "columns",
        "major",
        "minor",
        "num_samples",
        "rank",
        "where",
    )

    def __init__(self, footer: ChunkFooter, where: str, footer_offset: int | None = None) -> None:
        starts = list(accumulate([b.num_samples for b in footer.blocks], initial=0))
        self._setup(footer, starts, where, footer_offset, {})
        self._head: tuple[_FooterHead, bytes] | None = None
        self._packed: tuple[bytes, Any] | None = None  # frames, their ends (numpy int64)
        self._frames: list[tuple[FrameIndex, ...] | None] = []
        self._footer: ChunkFooter | None = footer
        why = _check_frames(footer, self._high, self.alone)
        if why:
            raise CorruptError(f"{where}: bad chunk footer: {why}")

    @classmethod
    def _lazy(
        cls, head: _FooterHead, raw: bytes, where: str, footer_offset: int | None
    ) -> ChunkLayout:
        """Majors 1 and 2: the blocks' counts decoded, their frames kept encoded."""
        self = cls.__new__(cls)
        starts = list(accumulate([b.num_samples for b in head.blocks], initial=0))
        self._setup(head, starts, where, footer_offset, {})
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
        high = 2**63 if footer_offset is None else footer_offset
        apart = _apart_columns(packed, high, where)
        self._setup(packed, starts, where, footer_offset, apart)
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
        apart: dict[int, Apart],
    ) -> None:
        """The lookups, and the footer's totals checked (``CorruptError``)."""
        self.where = where
        self.apart = apart
        # The columns stored apart alone: what a reader of samples reads from pieces.
        self.alone = {column: found for column, found in apart.items() if not found.copy}
        self.major, self.minor = footer.major, footer.minor
        self.check = FRAME_CHECKSUMS[footer.major]
        self.columns = footer.columns
        # Each column's place: where a column stored apart goes among a block's columns in
        # a sample (docs/format.md §7.6).
        self.rank = {name: k for k, name in enumerate(footer.columns)}
        self.num_samples = footer.num_samples
        self.block_starts = block_starts
        self._high = 2**63 if footer_offset is None else footer_offset
        total = block_starts[-1]
        why = ""
        if len(set(self.columns)) != len(self.columns):
            why = "a column name appears twice"
        elif any(column >= len(self.columns) for column in apart):
            why = f"a column stored apart is not one of its {len(self.columns)} columns"
        elif len(block_starts) == 1 and len(apart) == len(self.columns):
            pass  # no blocks: every column is stored apart (a field file)
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
            why = _check_frames(footer, self._high, self.alone)
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
                frames,
                number,
                self.block_samples(number),
                len(self.columns),
                self._high,
                self.alone,
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

    def all_frames(self) -> Iterator[FrameIndex]:
        """Every frame of the file: the blocks', then the pieces' of columns stored apart."""
        for block in self.footer.blocks:
            yield from block.frames
        for found in self.apart.values():
            yield from found.frames

    @property
    def has_blocks(self) -> bool:
        """Whether the file has blocks: a file whose columns are all stored apart has none."""
        return len(self.block_starts) > 1

    def blocks_of(
        self, keep: frozenset[str] | None, hidden: frozenset[str] = frozenset()
    ) -> list[BlockIndex]:
        """The blocks, each frame checked (``footer.blocks``), when a reader of columns
        needs them: a column of ``keep`` (None: any) not in ``hidden`` is in them and not
        stored apart too; else none, and the blocks' frames are not decoded."""
        rank, apart = self.rank, self.apart
        wanted = self.columns if keep is None else keep
        if any(name not in hidden and rank.get(name, -1) >= 0 and rank[name] not in apart
               for name in wanted):  # fmt: skip
            return self.footer.blocks
        return []

    def apart_of(self, keep: frozenset[str] | None) -> list[tuple[str, Apart]]:
        """The columns stored apart among ``keep`` (None: all), with their names: where a
        reader of columns reads them."""
        return self._named(self.apart, keep)

    def apart_only(self, keep: frozenset[str] | None) -> list[tuple[str, Apart]]:
        """``apart_of`` less the columns the blocks hold too: what a reader of samples reads
        from pieces (the others it finds in the blocks, with the rest of each sample)."""
        return self._named(self.alone, keep) if self.alone else []

    def _named(
        self, found: dict[int, Apart], keep: frozenset[str] | None
    ) -> list[tuple[str, Apart]]:
        names = self.columns
        return [
            (names[column], one)
            for column, one in found.items()
            if keep is None or names[column] in keep
        ]

    def spans(
        self,
        keep: frozenset[str] | None,
        *,
        pieces: bool,
        hidden: frozenset[str] = frozenset(),
    ) -> list[tuple[int, int, FrameIndex]]:
        """Each frame a reader of the columns ``keep`` (None: all) not in ``hidden`` reads, with
        the samples it holds (the first, how many). ``pieces``, a reader of columns: the
        pieces of every column stored apart, and the blocks' frames of the others (the
        blocks' frames are decoded only if it needs some); else, a reader of samples: the
        blocks' frames and the pieces of the columns stored apart alone."""
        names, apart = self.columns, self.apart if pieces else self.alone

        def wanted(column: int) -> bool:
            name = names[column]
            return (keep is None or name in keep) and name not in hidden

        blocks = self.blocks_of(keep, hidden) if pieces else self.footer.blocks
        out = [
            (self.block_starts[number], block.num_samples, frame)
            for number, block in enumerate(blocks)
            for frame in block.frames
            if frame.column not in apart and wanted(frame.column)
        ]
        out += [
            (one.starts[piece], one.size(piece), frame)
            for column, one in apart.items()
            if wanted(column)
            for piece, frame in enumerate(one.frames)
        ]
        return out


class Apart:
    """A column stored apart: where its pieces start (sample numbers, then the chunk's
    count), each piece's frame, and whether the blocks hold it too (``copy``). Checked when
    the footer is parsed."""

    __slots__ = ("column", "copy", "frames", "starts")

    def __init__(
        self, column: int, starts: list[int], frames: tuple[FrameIndex, ...], copy: bool
    ) -> None:
        self.column = column
        self.starts = starts
        self.frames = frames
        self.copy = copy

    def locate(self, index: int) -> tuple[int, int]:
        """(piece number, index within the piece) of a sample."""
        piece = bisect_right(self.starts, index) - 1
        return piece, index - self.starts[piece]

    def size(self, piece: int) -> int:
        return self.starts[piece + 1] - self.starts[piece]

    def covering(self, start: int, stop: int) -> range:
        """The pieces holding samples [start, stop) (none when the range is empty)."""
        if start >= stop:
            return range(0)
        return range(self.locate(start)[0], bisect_right(self.starts, stop - 1))


def _apart_columns(footer: PackedFooter, high: int, where: str) -> dict[int, Apart]:
    """A footer's columns stored apart, checked (``CorruptError``): each a column of the
    footer at most once, its pieces of 1 to 4096 samples covering the chunk, one frame each,
    of that column, lying between the header and ``high``."""
    if footer.apart and footer.major < APART_FROM:
        raise CorruptError(
            f"{where}: bad chunk footer: major {footer.major} with columns stored apart"
        )
    out: dict[int, Apart] = {}
    for found in footer.apart:
        column = found.column
        why = ""
        count = len(found.frames)
        if column in out:
            why = f"column {column} is stored apart twice"
        elif len(found.starts) != 8 * (count + 1):
            why = f"{len(found.starts)} bytes of piece starts for {count} pieces"
        else:
            starts = np.frombuffer(found.starts, "<i8")
            if starts[0] != 0 or starts[-1] != footer.num_samples:
                why = f"its pieces do not hold samples 0 to {footer.num_samples}"
            elif not _steps_within(starts, MAX_BLOCK_SAMPLES):
                why = f"a piece does not hold 1 to {MAX_BLOCK_SAMPLES} samples"
            else:
                listed = starts.tolist()
                for number, frame in enumerate(found.frames):
                    need = 4 * (listed[number + 1] - listed[number]) + 1
                    if frame.column != column:
                        why = f"piece {number} has a frame of column {frame.column}"
                    elif (
                        frame.offset < HEADER.size
                        or frame.offset + frame.length > high
                        or frame.raw_length < need
                        or (frame.codec == CODEC_RAW and frame.length != frame.raw_length)
                    ):
                        bad = _bad_frame(frame, column + 1, HEADER.size, high, need)
                        why = f"piece {number}: {bad}"
                    if why:
                        break
                else:
                    out[column] = Apart(column, listed, found.frames, found.copy)
        if why:
            raise CorruptError(f"{where}: bad chunk footer: column {column} stored apart: {why}")
    return out


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
    num_samples: int,
    columns: list[str],
    blocks: Sequence[tuple[int, Sequence[FrameIndex]]],
    apart: Sequence[tuple[int, Sequence[int], Sequence[FrameIndex], bool]] = (),
) -> bytes:
    """The footer of a chunk of ``blocks`` (each its sample count and frames) and columns
    stored ``apart`` (each its column, its pieces' sample counts and their frames, and whether
    the blocks hold it too): major
    ``APART_FROM`` with columns stored apart, ``ROWS_MAJOR`` without (the footer's layout,
    and the major in the file's header, as ``major_of`` says)."""
    encode = _ENCODER.encode
    framed = [encode(frames) for _, frames in blocks]
    starts = list(accumulate((n for n, _ in blocks), initial=0))
    ends = list(accumulate(map(len, framed)))
    items: list[Any] = [
        major_of(bool(apart)),
        CHUNK_MINOR,
        num_samples,
        columns,
        [],
        struct.pack(f"<{len(starts)}Q", *starts),
        struct.pack(f"<{len(ends)}I", *ends),
        b"".join(framed),
    ]
    if apart:  # major 3 has no ninth item: its readers' footers are eight items long
        items.append(
            [
                ApartColumn(
                    column,
                    struct.pack(f"<{len(counts) + 1}Q", *accumulate(counts, initial=0)),
                    tuple(frames),
                    copy,
                )
                for column, counts, frames, copy in apart
            ]
        )
    return encode(items)


def major_of(apart: bool) -> int:
    """The major a writer gives a file: ``APART_FROM`` if it has columns stored apart,
    ``ROWS_MAJOR`` otherwise (readers of major 3 read it)."""
    return APART_FROM if apart else ROWS_MAJOR


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


def _check_frames(footer: ChunkFooter, high: int, alone: dict[int, Apart]) -> str:
    """What makes the frames of a footer (its checksum valid) describe values no reader could
    decode, or "": checked before any of them is decoded, so that the decoding loop can trust
    them. A 64 MiB chunk has thousands of frames: one loop over them costs half the time of
    decoding the footer."""
    width = len(footer.columns)
    for number, block in enumerate(footer.blocks):
        why = _check_block(block.frames, number, block.num_samples, width, high, alone)
        if why:
            return why
    return ""


def _check_block(
    frames: Sequence[FrameIndex],
    number: int,
    num_samples: int,
    width: int,
    high: int,
    alone: dict[int, Apart],
) -> str:
    """``_check_frames`` for the frames of one block (``alone``: the columns stored apart
    alone, of which no block may have a frame)."""
    low = HEADER.size
    need = 4 * num_samples + 1  # the raw bytes end with a u32 offset per value, after at
    # least an array header
    # Stored one after another (§7.1): a reader of one sample reads them as one range.
    at, gap = -1, ""
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
        if f.offset != at and at >= 0 and not gap:
            gap = f"block {number}: a frame at {f.offset} does not follow the one ending at {at}"
        at = end
    if len(frames) > 1 and len({f.column for f in frames}) != len(frames):
        return "a block has two frames of one column"
    if alone and any(f.column in alone for f in frames):
        return f"block {number} has a frame of a column stored apart alone"
    return gap


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
    for frame in layout.all_frames():  # within the file: parse_footer checked it
        if layout.check(view[frame.offset : frame.offset + frame.length]) != frame.checksum:
            raise ChecksumError(
                f"{where} does not match the checksum of its frame at {frame.offset}"
            )
    return layout
