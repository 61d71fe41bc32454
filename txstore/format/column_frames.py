"""The MessagePack frames of columns: the array and bin headers values and frames start
with, the offset table of a frame whose values take one size, and the frames of a column
batch's rows (``ColumnBatch``), made a block at a time without a Python object per value.
``builder`` seals them into a chunk."""

from __future__ import annotations

import struct
from functools import cache
from itertools import accumulate, pairwise
from typing import Any

import numpy as np

from .chunk import MAX_BLOCK_SAMPLES
from .columnar import Encoded, Prefixed


def array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 65536:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def bin_header(n: int) -> bytes:
    if n < 256:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 65536:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


#: The array header of each block size (a block holds at most ``MAX_BLOCK_SAMPLES``).
ARRAY_HEADERS = tuple(array_header(n) for n in range(MAX_BLOCK_SAMPLES + 1))
_SMALL_BINS = 1 << 16


@cache
def small_bin_headers() -> tuple[bytes, ...]:
    """The bin header of each length below ``_SMALL_BINS`` (0.7 MB: no call per value), made
    by the first writer rather than by every process that imports txstore to read."""
    return tuple(bin_header(n) for n in range(_SMALL_BINS))


def bin_headers(lengths: list[int]) -> list[bytes]:
    if max(lengths) < _SMALL_BINS:
        return list(map(small_bin_headers().__getitem__, lengths))
    return list(map(bin_header, lengths))


class EvenTables:
    """The offset tables of frames whose values take one size, kept for the next frame like
    it (a few shapes per column; at most ``most`` kept)."""

    def __init__(self, most: int) -> None:
        self._most = most
        self._tables: dict[tuple[int, int, int], bytes] = {}

    def table(self, start: int, size: int, n: int) -> bytes:
        """The table of ``n`` values of ``size`` bytes each, the first at ``start``."""
        found = self._tables.get((start, size, n))
        if found is not None:
            return found
        if len(self._tables) >= self._most:
            self._tables.clear()
        table = struct.pack(f"<{n}I", *range(start, start + size * n, size))
        self._tables[start, size, n] = table
        return table

    def uniform(self, start: int, size: int, n: int) -> np.ndarray[Any, Any]:
        """``table`` as bytes of a numpy array."""
        return np.frombuffer(self.table(start, size, n), dtype=np.uint8)


def column_frames(
    column: Encoded, bounds: list[int], tables: EvenTables, stable: bool = False
) -> list[tuple[tuple[bytes | memoryview, ...], int]]:
    """The raw frame of each block of rows ``bounds[k]:bounds[k + 1]`` of one column: its
    parts and its length. ``stable``: the column's bytes stay as they are until the
    chunk is stored (``ColumnBatch.stable``)."""
    if stable and isinstance(column, Prefixed) and column.is_large:
        return referenced_frames(column, bounds)
    if isinstance(column, Prefixed) and column.uniform is not None:
        head, length = column.uniform
        return even_frames(column.value_rows(), length, head, bounds, tables)
    width = column.even_size
    if width is not None:
        rows = column.data[int(column.offsets[0]) : int(column.offsets[-1])]
        return even_frames(rows.reshape(-1, width), width, b"", bounds, tables)
    offsets, data = column.offsets, column.data.data
    spans = np.asarray(bounds, dtype=np.int64)
    sizes = np.diff(spans)
    heads = [ARRAY_HEADERS[j - i] for i, j in pairwise(bounds)]
    head_lengths = np.fromiter(map(len, heads), dtype=np.int64, count=len(heads))
    # Every block's offset table at once: a value's offset from its block's first
    # value, past the block's array header.
    starts = np.repeat(offsets[spans[:-1]] - head_lengths, sizes)
    first, last = bounds[0], bounds[-1]
    offset_tables = memoryview((offsets[first:last] - starts).astype("<u4").tobytes())
    at = offsets[spans].tolist()
    frames: list[tuple[tuple[bytes | memoryview, ...], int]] = []
    for number, (i, j) in enumerate(pairwise(bounds)):
        head = heads[number]
        body = data[at[number] : at[number + 1]]
        table = offset_tables[4 * (i - first) : 4 * (j - first)]
        frames.append(((head, body, table), len(head) + len(body) + len(table)))
    return frames


def referenced_frames(
    column: Prefixed, bounds: list[int]
) -> list[tuple[tuple[bytes | memoryview, ...], int]]:
    """``column_frames`` of large values whose bytes stay unchanged until the chunk is
    stored: a frame's parts are its values' headers and views of their payloads, which
    the chunk's writer copies into the file, the one copy of each value's bytes."""
    first, last = bounds[0], bounds[-1]
    begins, ends = column.spans(first, last)
    heads = column.heads[first:last]
    used = column.used[first:last].tolist()
    sizes = np.diff(column.offsets[first : last + 1]).tolist()
    payload = column.payload.data
    frames: list[tuple[tuple[bytes | memoryview, ...], int]] = []
    for i, j in pairwise(bounds):
        head = ARRAY_HEADERS[j - i]
        parts: list[bytes | memoryview] = [head]
        for k in range(i - first, j - first):
            parts += (heads[k, : used[k]].tobytes(), payload[begins[k] : ends[k]])
        own = sizes[i - first : j - first]
        table = struct.pack(f"<{j - i}I", *accumulate(own[:-1], initial=len(head)))
        parts.append(table)
        frames.append((tuple(parts), len(head) + sum(own) + len(table)))
    return frames


def even_frames(
    rows: np.ndarray[Any, Any], length: int, head: bytes, bounds: list[int], tables: EvenTables
) -> list[tuple[tuple[bytes | memoryview, ...], int]]:
    """``column_frames`` of values that each take ``head`` and then a row of ``rows``
    (``length`` bytes; rows may lie apart, a view of a source's file): every frame made
    whole by copying its values' bytes straight into it, those of blocks of as many rows
    together (not the values joined first and then copied again into frames)."""
    width = len(head) + length
    frames: list[tuple[tuple[bytes | memoryview, ...], int]] = []
    k, last = 0, len(bounds) - 1
    while k < last:
        i, n = bounds[k], bounds[k + 1] - bounds[k]
        run = 1  # the blocks from k of n rows each
        while k + run < last and bounds[k + run + 1] - bounds[k + run] == n:
            run += 1
        array_head = ARRAY_HEADERS[n]
        h = len(array_head)
        body_end = h + n * width
        size = body_end + 4 * n
        out = np.empty((run, size), dtype=np.uint8)
        out[:, :h] = np.frombuffer(array_head, dtype=np.uint8)
        values = rows[i : i + run * n].reshape(run, n, length)
        body = out[:, h:body_end].reshape(run, n, width)
        if head:
            body[:, :, : len(head)] = np.frombuffer(head, dtype=np.uint8)
        body[:, :, len(head) :] = values
        out[:, body_end:] = tables.uniform(h, width, n)
        view = out.reshape(-1).data
        frames += [((view[q : q + size],), size) for q in range(0, run * size, size)]
        k += run
    return frames
