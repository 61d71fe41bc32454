"""Frames of a chunk-format file read into values: one value, a block's rows, a column's
values, from the whole file or from some byte ranges of it (``Ranges``), each frame checked
as it is opened; and the check of a frame's table of value offsets. ``chunk`` lays out the
file and its footer (where each frame is); this module reads what is in them."""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from ..errors import CorruptError, UnsupportedFormatError
from .chunk import FLAG_SPARSE, Apart, ChunkLayout, FrameIndex
from .codec import open_frame
from .values import ABSENT, ABSENT_BYTES, ValueDecoder

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
    frames = [(block.num_samples, f) for block in layout.footer.blocks for f in block.frames]
    frames += [
        (found.size(piece), f)
        for found in layout.apart.values()
        for piece, f in enumerate(found.frames)
    ]
    for n, frame in frames:
        raw = frame_raw(data, 0, frame, layout)
        why = offset_table_error(raw, n)
        if why:
            raise CorruptError(
                f"{layout.where}: the frame at {frame.offset} {why} (its offset table)"
            )


def check_copies(data: bytes | memoryview, layout: ChunkLayout) -> None:
    """Every column stored apart as a copy (docs/format.md §7.6) holds, piece by piece, the
    same encoded values as the blocks (ABSENT where a block lacks the column): a reader of
    samples and a reader of that column must read the same file. CorruptError naming the
    column; the frames' offset tables are checked first (``check_offset_tables``)."""
    for column, found in layout.apart.items():
        if not found.copy:
            continue
        in_pieces: list[bytes] = []
        for piece, frame in enumerate(found.frames):
            in_pieces += _raw_values(frame_raw(data, 0, frame, layout), found.size(piece))
        in_blocks: list[bytes] = []
        for block in layout.footer.blocks:
            n = block.num_samples
            held = next((f for f in block.frames if f.column == column), None)
            if held is None:
                in_blocks += [ABSENT_BYTES] * n
            else:
                in_blocks += _raw_values(frame_raw(data, 0, held, layout), n)
        if in_pieces != in_blocks:
            pairs = zip(in_pieces, in_blocks, strict=True)  # both cover the chunk
            k = next(k for k, (a, b) in enumerate(pairs) if a != b)
            raise CorruptError(
                f"{layout.where}: column {layout.columns[column]!r} stored apart differs from "
                f"its blocks at sample {k}"
            )


def _raw_values(raw: memoryview, n: int) -> list[bytes]:
    """The encoded values of a frame of ``n``, by its offset table."""
    table = len(raw) - 4 * n
    starts = [*struct.unpack_from(f"<{n}I", raw, table), table]
    return [bytes(raw[starts[k] : starts[k + 1]]) for k in range(n)]


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


def frame_raw(
    buf: FileBytes, base: int, frame: FrameIndex, layout: ChunkLayout, check: Any = ...
) -> memoryview:
    """A frame's raw bytes from ``buf`` (the file from ``base``, or ranges of it), checked with
    ``check`` (default the layout's; None: its file's digest was) and decompressed."""
    if isinstance(buf, Ranges):
        stored = buf.view(frame.offset, frame.length)
    else:
        start = frame.offset - base
        stored = memoryview(buf)[start : start + frame.length]
    if len(stored) != frame.length:
        raise CorruptError(f"{layout.where}: truncated frame at offset {frame.offset}")
    check = layout.check if check is ... else check
    return open_frame(stored, frame.codec, frame.raw_length, frame.checksum, check, layout.where)


def decode_value(
    buf: FileBytes,
    base: int,
    frame: FrameIndex,
    n: int,
    i: int,
    decoder: ValueDecoder,
    layout: ChunkLayout,
    views: bool = False,
    opened: bool = False,
) -> Any:
    """Value ``i`` of one frame, decoding only that value. ``opened``: ``buf`` is the frame's
    raw bytes already (``opened_frame``), checked and decompressed."""
    raw = memoryview(buf) if opened else frame_raw(buf, base, frame, layout)  # type: ignore[arg-type]
    return _value_at(raw, len(raw) - 4 * n, n, i, frame, decoder, layout, views)


def opened_frame(buf: FileBytes, base: int, frame: FrameIndex, layout: ChunkLayout) -> bytes:
    """A frame's raw bytes, checked and decompressed, as bytes of their own (a copy for a
    frame stored raw: never a view of the file), for a reader that keeps them
    (``decode_value(..., opened=True)``)."""
    raw = frame_raw(buf, base, frame, layout)
    return raw.obj if isinstance(raw.obj, bytes) and len(raw) == len(raw.obj) else bytes(raw)


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
    raw = frame_raw(buf, base, frame, layout)
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
    raw = frame_raw(buf, 0, frame, layout)
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
    block_starts: list[int] | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """The samples of blocks [first, last) of one chunk, a list per block, from the bytes of
    its sources (each with the columns to keep, or None for all of them). The blocks are
    ``block_starts`` (default ``row_starts``): those of every source that has blocks; the columns
    stored apart are read piece by piece into them, after the blocks' own columns. A source
    whose ``checked`` is true had its whole body checked already: its frames are not checked
    again.

    The streaming reader's loop. When samples are larger than a block, a block is one sample
    and the per-frame work is most of its cost: a frame's slice is taken inline, from a view
    of the whole file made once.
    """
    prepared = []
    cursors: list[tuple[str, PieceCursor]] = []
    place: dict[str, tuple[int, int]] = {}  # a column's source and its place in that one
    for number, (layout, buf, keep) in enumerate(parts):
        wanted = (
            None
            if keep is None
            else frozenset(i for i, name in enumerate(layout.columns) if name in keep)
        )
        whole = None if isinstance(buf, Ranges) else memoryview(buf)
        check = None if number < len(checked) and checked[number] else layout.check
        cursors += [
            (name, PieceCursor(found, buf, layout, decoder, check, views))
            for name, found in layout.apart_only(keep)
        ]
        place.update((name, (number, k)) for k, name in enumerate(layout.columns))
        if layout.has_blocks:
            blocks = layout.footer.blocks
            prepared.append((blocks, layout.columns, layout.where, check, wanted, whole, buf))
    if block_starts is None:
        block_starts = row_starts([layout for layout, _, _ in parts])
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
        if cursors:
            # The columns stored apart, each in its place among the block's (§7.6).
            low = block_starts[number]
            for name, cursor in cursors:
                values = cursor.take(low, low + n)
                sparse = sparse or cursor.sparse
                if row is not None:
                    row[name] = values[0]
                else:
                    columns.append(values)
                    names.append(name)
            if row is not None:
                row = {name: row[name] for name in sorted(row, key=place.__getitem__)}
            else:
                order = sorted(range(len(names)), key=lambda k: place[names[k]])
                names = [names[k] for k in order]
                columns = [columns[k] for k in order]
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
    pieces: bool = True,
) -> dict[str, list[Any]]:
    """Each kept column of a chunk's sources (as for ``decode_blocks``, read for columns:
    ``ChunkReader.fetch``) as one list of its values in sample order, None where a sample
    lacks it: a column at a time, with no dict per sample, for a reader that wants columns.
    A column stored apart is read from its pieces (``pieces`` false: only one the blocks do
    not hold too, as a fetch for samples reads them)."""
    total = parts[0][0].num_samples
    out: dict[str, list[Any]] = {}
    for number, (layout, buf, keep) in enumerate(parts):
        check = None if number < len(checked) and checked[number] else layout.check
        names = layout.columns
        for low, n, frame in layout.spans(keep, pieces=pieces):
            name = names[frame.column]
            values = frame_values(buf, frame, n, decoder, layout, check, False)
            if frame.flags & FLAG_SPARSE:
                values = [None if v is ABSENT else v for v in values]
            column = out.get(name)
            if column is None:
                column = out[name] = [None] * total
            column[low : low + n] = values
    return out


def frame_values(
    buf: FileBytes,
    frame: FrameIndex,
    n: int,
    decoder: ValueDecoder,
    layout: ChunkLayout,
    check: Any,
    views: bool,
) -> list[Any]:
    """Every value of one frame of ``n`` (ABSENT where a sparse frame has none), the frame
    checked with ``check`` (None: not at all, its file's digest was) and opened once."""
    offset, where = frame.offset, layout.where
    raw = frame_raw(buf, 0, frame, layout, check)
    table = len(raw) - 4 * n
    try:
        if frame.flags & FLAG_SPARSE:
            values = decoder.decode_sparse(raw[:table], views=views)
        elif views:
            values = decoder.decode_list(raw[:table], views=True)
        else:
            values = decoder.decode_list_plain(raw[:table])
    except (msgspec.DecodeError, CorruptError) as e:
        raise CorruptError(f"{where}: bad frame at offset {offset}: {e}") from e
    except UnsupportedFormatError as e:
        raise UnsupportedFormatError(f"{where}: {e}") from e
    if type(values) is not list or len(values) != n:
        raise CorruptError(_miscounted(where, offset, values, n))
    if views and bytes in map(type, values) and n > 1:
        values = _views_one_by_one(values, raw, table, decoder)
    return values


class PieceCursor:
    """The values of a column stored apart, for consecutive ranges of samples (a streaming
    reader's blocks, in order): each piece is opened and decoded once, when first needed."""

    __slots__ = (
        "_buf",
        "_check",
        "_decoder",
        "_found",
        "_layout",
        "_number",
        "_values",
        "_views",
        "sparse",
    )

    def __init__(
        self,
        found: Apart,
        buf: FileBytes,
        layout: ChunkLayout,
        decoder: ValueDecoder,
        check: Any,
        views: bool,
    ) -> None:
        self._found, self._buf, self._layout = found, buf, layout
        self._decoder, self._check, self._views = decoder, check, views
        self._number = -1
        self._values: list[Any] = []
        self.sparse = False  # whether a piece opened so far holds ABSENT values

    def take(self, start: int, stop: int) -> list[Any]:
        """The values of samples [start, stop)."""
        found = self._found
        starts = found.starts
        out: list[Any] = []
        while start < stop:
            number = self._number
            if number < 0 or not starts[number] <= start < starts[number + 1]:
                number = found.locate(start)[0]
                frame = found.frames[number]
                self._values = frame_values(
                    self._buf,
                    frame,
                    found.size(number),
                    self._decoder,
                    self._layout,
                    self._check,
                    self._views,
                )
                self._number = number
                self.sparse = self.sparse or bool(frame.flags & FLAG_SPARSE)
            end = min(stop, starts[number + 1])
            low = starts[number]
            if not out and end == stop:
                return self._values[start - low : end - low]
            out += self._values[start - low : end - low]
            start = end
        return out


def row_starts(layouts: Sequence[ChunkLayout]) -> list[int]:
    """The blocks a chunk's samples are read in, from its sources' layouts: those of the
    sources that have blocks (``CorruptError`` unless they are the same), else the pieces of
    the first column stored apart."""
    found: list[int] | None = None
    for layout in layouts:
        if not layout.has_blocks:
            continue
        if found is None:
            found = layout.block_starts
        elif layout.block_starts != found:
            raise CorruptError(f"{layout.where} is not aligned with its chunk's blocks")
    if found is not None:
        return found
    for layout in layouts:
        for one in layout.apart.values():
            return one.starts
    return [0, layouts[0].num_samples] if layouts and layouts[0].num_samples else [0]


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
