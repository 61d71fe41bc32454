"""The values of a column stored apart (docs/format.md §7.6) while they wait for their piece:
which columns go apart, and each one's values queued oldest first until a piece is sealed."""

from __future__ import annotations

from typing import Any

import numpy as np

from .columnar import Encoded
from .values import ABSENT_BYTES

#: A column is stored apart in a chunk when, in the chunk's first block, its values take at
#: most this many bytes on average and the block holds at most ``APART_BLOCK_SAMPLES``
#: samples: small values in a chunk of many blocks (ids, labels and lengths beside images or
#: token windows), which a reader of that column alone would otherwise read in as many small
#: frames as the chunk has blocks.
APART_VALUE_BYTES = 32
APART_BLOCK_SAMPLES = 1024


def absent_column(n: int) -> Encoded:
    """``n`` ABSENT values, encoded."""
    width = len(ABSENT_BYTES)
    return Encoded(
        np.frombuffer(ABSENT_BYTES * n, dtype=np.uint8), np.arange(n + 1, dtype=np.int64) * width
    )


class Pending:
    """A column's values waiting for their piece (a column stored apart), oldest first: rows
    of encoded columns (the columnar path), and the values of the blocks of samples since,
    joined into one buffer as they come (so that a block adds no object of its own for the
    cyclic GC to track: see ``SealedFrames``)."""

    __slots__ = ("_open", "count", "nbytes", "runs")

    def __init__(self) -> None:
        self.runs: list[tuple[Encoded, int, int, bool]] = []  # column, rows [start, stop)
        self._open: tuple[bytearray, list[int], list[bool]] | None = None
        self.count = 0
        self.nbytes = 0

    def add(self, column: Encoded, start: int, stop: int, sparse: bool) -> None:
        """Rows [start, stop) of an encoded column (kept as they are until sealed)."""
        if stop > start:
            self._close()
            self.runs.append((column, start, stop, sparse))
            self.count += stop - start
            self.nbytes += int(column.offsets[stop] - column.offsets[start])

    def add_values(self, parts: list[bytes], sizes: list[int], sparse: bool) -> None:
        """A block's values, encoded: ``parts`` joined are their bytes, ``sizes`` each one's."""
        if self._open is None:
            self._open = (bytearray(), [], [False])
        data, all_sizes, holes = self._open
        data += b"".join(parts)
        all_sizes += sizes
        holes[0] = holes[0] or sparse
        self.count += len(sizes)
        self.nbytes += sum(sizes)

    def _close(self) -> None:
        """The values added one block at a time become a run like the others."""
        if self._open is not None:
            data, sizes, holes = self._open
            self._open = None
            offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
            np.cumsum(sizes, out=offsets[1:])
            column = Encoded(np.frombuffer(bytes(data), dtype=np.uint8), offsets)
            self.runs.append((column, 0, len(sizes), holes[0]))

    def sizes(self, most: int) -> np.ndarray[Any, Any]:
        """The sizes of the first ``most`` values (or all, if fewer)."""
        self._close()
        out, left = [], most
        for column, start, stop, _ in self.runs:
            take = min(left, stop - start)
            out.append(np.diff(column.offsets[start : start + take + 1]))
            left -= take
            if not left:
                break
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def take(self, n: int) -> tuple[bytes, bool]:
        """The bytes of the first ``n`` values, which leave; whether any is ABSENT."""
        self._close()
        parts: list[memoryview] = []
        sparse = False
        runs = self.runs
        while n:
            column, start, stop, holes = runs[0]
            take = min(n, stop - start)
            offsets = column.offsets
            low, high = int(offsets[start]), int(offsets[start + take])
            parts.append(column.data.data[low:high])
            self.nbytes -= high - low
            sparse = sparse or holes
            if take == stop - start:
                runs.pop(0)
            else:
                runs[0] = (column, start + take, stop, holes)
            n -= take
            self.count -= take
        return b"".join(parts), sparse
