"""Arrow out: a chunk's samples as a table, from the bytes of its files (``chunk_table``)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import CorruptError
from ..chunk import FLAG_SPARSE
from ..columnar import gather
from ..frames import Ranges, frame_raw
from .arrays import column_array, msgspec_errors, rows_array
from .tables import empty_table


def chunk_table(
    parts: list[tuple[Any, Any, frozenset[str] | None]],
    block_starts: list[int],
    decoder: Any,
    checked: tuple[bool, ...],
    pieces: bool = True,
) -> pa.Table:
    """A chunk's samples as a table, from the bytes of its sources (as ``decode_blocks``
    takes them, with the blocks of those that have them): a column per field, in the order
    the chunk's blocks first show them (a column stored apart in its place among them); a
    sample without a field has a null there. A column stored apart is read from its pieces
    (``pieces`` false: only one the blocks do not hold too, as a fetch for samples reads
    them)."""
    num_blocks = len(block_starts) - 1
    columns: dict[str, list[tuple[int, memoryview | None, bool]]] = {}
    done: dict[str, pa.Array] = {}
    shown: dict[str, None] = {}  # the columns in the order the blocks first show them
    for number_of_part, (layout, buf, keep) in enumerate(parts):
        check = None if number_of_part < len(checked) and checked[number_of_part] else layout.check
        whole = None if isinstance(buf, Ranges) else memoryview(buf)
        names = layout.columns
        part_shown: dict[str, None] = {}
        apart = layout.apart_of(keep) if pieces else layout.apart_only(keep)
        skip = {found.column for _, found in apart}  # read from their pieces below
        if whole is not None and check is None:
            done |= _whole_columns(layout, whole, keep, block_starts, decoder)
        for number, block in enumerate(layout.blocks_of(keep) if pieces else layout.footer.blocks):
            n = block_starts[number + 1] - block_starts[number]
            for frame in block.frames:
                name = names[frame.column]
                if (keep is not None and name not in keep) or frame.column in skip:
                    continue
                part_shown.setdefault(name)
                if name in done:
                    continue
                raw = frame_raw(buf if whole is None else whole, 0, frame, layout, check)
                slots = columns.get(name)
                if slots is None:
                    slots = columns[name] = [
                        (block_starts[b + 1] - block_starts[b], None, False)
                        for b in range(num_blocks)
                    ]
                slots[number] = (n, raw, bool(frame.flags & FLAG_SPARSE))
        for name, found in apart:
            # A column stored apart: its pieces, in order, stand for the blocks.
            part_shown.setdefault(name)
            if name in done:
                continue
            columns[name] = [
                (
                    found.size(piece),
                    frame_raw(buf if whole is None else whole, 0, frame, layout, check),
                    bool(frame.flags & FLAG_SPARSE),
                )
                for piece, frame in enumerate(found.frames)
            ]
        if apart:  # each in its place among the block's columns (docs/format.md §7.6)
            part_shown = dict.fromkeys(sorted(part_shown, key=layout.rank.__getitem__))
        for name in part_shown:
            shown.setdefault(name)
    names_out = [name for name in shown if name in done or name in columns]
    try:
        arrays = [
            done[name] if name in done else column_array(columns[name], name, decoder)
            for name in names_out
        ]
    except msgspec_errors as e:
        raise CorruptError(f"{parts[0][0].where}: a bad frame: {e}") from e
    if not names_out:
        return empty_table(block_starts[-1])
    return pa.Table.from_arrays(arrays, names=names_out)


def _whole_columns(
    layout: Any,
    whole: memoryview,
    keep: frozenset[str] | None,
    block_starts: Sequence[int],
    decoder: Any,
) -> dict[str, pa.Array]:
    """The columns of a whole, checked chunk that ``_uniform_column`` can make: each kept
    column with a raw, dense frame in every block, of values of one size. Others are left
    to the frame-by-frame path."""
    counts = [b - a for a, b in pairwise(block_starts)]
    frames: dict[int, list[tuple[int, int]]] = {}
    refused: set[int] = set()
    for block in layout.footer.blocks:
        for f in block.frames:
            if f.column in layout.apart:
                continue  # read from its pieces
            if f.codec or f.flags & FLAG_SPARSE:
                refused.add(f.column)
            else:
                frames.setdefault(f.column, []).append((f.offset, f.length))
    out: dict[str, pa.Array] = {}
    for column, found in frames.items():
        name = layout.columns[column]
        if column in refused or (keep is not None and name not in keep):
            continue
        array = _uniform_column(whole, found, counts, decoder)
        if array is not None:
            out[name] = array
    for name, apart in layout.apart_of(keep):
        if any(f.codec or f.flags & FLAG_SPARSE for f in apart.frames):
            continue
        pieces = [(f.offset, f.length) for f in apart.frames]
        sizes = [b - a for a, b in pairwise(apart.starts)]
        array = _uniform_column(whole, pieces, sizes, decoder)
        if array is not None:
            out[name] = array
    return out


def _uniform_column(
    whole: memoryview, frames: list[tuple[int, int]], counts: list[int], decoder: Any
) -> Any:
    """``_uniform_array`` of one column of a chunk held whole (its bytes checked against its
    digest) whose every block has a raw, dense frame of it (None where one has not):
    ``frames`` gives each frame as (offset, length) in ``whole``, ``counts`` each block's
    samples. The frames'
    offset tables are read and checked for all blocks at once, and each block's values are
    a slice of one array over the chunk: no Python object per frame but that slice."""
    data = np.frombuffer(whole, dtype=np.uint8)
    where = np.array(frames, dtype=np.int64).reshape(-1, 2)
    n = np.array(counts, dtype=np.int64)
    if len(where) != len(n) or not len(n) or (n <= 0).any():
        return None
    offsets, lengths = where[:, 0], where[:, 1]
    tables = offsets + lengths - 4 * n
    if (tables < offsets).any() or (offsets + lengths > len(data)).any():
        return None
    heads = gather(data, tables, 4).view("<u4").reshape(-1).astype(np.int64)
    spans = tables - offsets - heads
    size = int(spans[0]) // int(n[0])
    if size <= 0 or (heads < 1).any() or (spans != size * n).any():
        return None
    return rows_array(_runs(data, offsets + heads, n, size), decoder)


def _runs(
    data: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], n: np.ndarray[Any, Any], size: int
) -> list[np.ndarray[Any, Any]]:
    """The blocks' values (block k: ``n[k]`` rows of ``size`` bytes from ``starts[k]`` in
    ``data``) as few arrays: consecutive blocks of as many rows, each as far from the one
    before, are one strided view (blocks, rows, size), so that checking and copying them
    costs a numpy call a run, not one a block (a chunk of 2 KiB samples has a thousand)."""
    count = len(n)
    new = np.zeros(count, dtype=bool)  # where a run starts
    new[0] = True
    steps = np.diff(starts)
    new[1:] |= (n[1:] != n[:-1]) | (steps <= 0)
    new[2:] |= steps[1:] != steps[:-1]
    firsts = np.flatnonzero(new).tolist()
    runs = []
    for a, b in pairwise([*firsts, count]):
        start, rows = int(starts[a]), int(n[a])
        if b - a == 1:
            runs.append(data[start : start + rows * size].reshape(rows, size))
        else:
            # Every row the view reads is one of the blocks' values, which lie in ``data``.
            step = int(starts[a + 1] - starts[a])
            runs.append(
                np.lib.stride_tricks.as_strided(
                    data[start:], (b - a, rows, size), (step, size, 1), writeable=False
                )
            )
    return runs
