"""Building chunks: samples in, sealed frames out (``chunkfile`` turns them into the file).

A block keeps its samples as rows of values until it is sealed, then encodes them column by
column, a few C calls per column. A writer's CPU is mostly the per-sample loop, so a sample of
the shape last seen (its keys in order, the exact type of each value) takes a fast path: one C
call takes the row out of the dict and one checks its types; its ints and strs get a range and
UTF-8 check, its arrays and containers the checked encoder. Any other sample takes the slow
path, which checks every key and value and makes its shape the fast one (shapes are kept, so
samples alternating between shapes do not rebuild them). The fast path's check of a sample is
one function, ``_FastPath.take``: ``add`` calls it and ``add_from`` maps it over its source,
taking the samples one at a time with no Python call of its own per sample. ``add_many``
checks a list of samples with its list form, ``take_all``: one C pass per check over the
whole list. Either way a sample that cannot be stored is refused when it is added.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate, islice, pairwise, repeat, zip_longest
from operator import add as plus
from operator import itemgetter
from typing import Any

import numpy as np

from ..errors import EncodeError
from .chunk import FLAG_SPARSE, HEADER, MAX_BLOCK_SAMPLES, major_of
from .chunkfile import BuiltChunk, ChunkStream, SealedFrames
from .codec import CODEC_RAW, FrameCompressor
from .column_frames import (
    ARRAY_HEADERS,
    EvenTables,
    array_header,
    bin_header,
    bin_headers,
    column_frames,
)
from .columnar import ColumnBatch, Encoded
from .pieces import APART_BLOCK_SAMPLES, APART_VALUE_BYTES, Pending, absent_column
from .values import (
    ABSENT,
    ABSENT_BYTES,
    INT_MAX,
    INT_MIN,
    MAX_VALUE_BYTES,
    Absent,
    ValueEncoder,
)

#: After this many frames of a column in a row that zstd could not shrink, try it only on
#: every ``_PROBE_EVERY``-th frame: incompressible columns (JPEG, tokens) stop paying for it.
#: (A slice of the frame is no cheaper a probe: a frame that repeats a value larger than the
#: slice compresses, the slice does not.)
_RAW_STREAK, _PROBE_EVERY = 4, 32
#: The types a fast-path row may hold, and about how many bytes each takes (beyond its
#: ``len``, for bytes and str): the open block's size is an estimate until it is sealed.
_PLAIN_SIZES: dict[type, int] = {bytes: 3, str: 3, int: 9, float: 9, bool: 1, type(None): 1}
_SIZED = (bytes, str)
#: Sample shapes a builder keeps fast paths for (a chunk with more starts over).
_MAX_SHAPES = 64
#: After a list of samples that mixes shapes, ``add_many`` adds this many more lists one
#: sample at a time before it checks a whole list in C again.
_BATCH_BACKOFF = 8
_END = object()  # the end of a source
#: A block whose estimated size reaches this is checked for a value the format cannot
#: address (one over ``MAX_VALUE_BYTES``, or one starting past 4 GiB in its frame: a frame's
#: offsets are u32) before it takes its next sample. Below it, none can be: the estimate is
#: at most a few bytes a value short. Only blocks this large pay for the check.
_CHECK_BLOCK_AT = 2**32 - 2**20


def _value_bytes(value: Any) -> int:
    """About how many bytes a value of a block takes in its frame (at most 5 over)."""
    kind = type(value)
    if kind is bytes:
        return len(value) + 5
    if kind is str:
        return (len(value) if value.isascii() else len(value.encode(errors="replace"))) + 5
    if kind is _Encoded:
        return len(value.data)
    return 9  # ABSENT, ints, floats, bools, None


class _Encoded:
    """A value checked and encoded when it was added (arrays, containers)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _check_utf8(text: str, what: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError:
        raise EncodeError(f"{what} is not valid UTF-8 (a lone surrogate)") from None


def _not_utf8(position: int, key: str, error: UnicodeEncodeError) -> EncodeError:
    return EncodeError(f"sample {position}, key {key!r}: a str is not valid UTF-8 ({error.reason})")


class _FastPath:
    """A sample shape: keys in order and the exact type of each value. A sample of this shape
    skips the slow path's per-key work; its plain values get the same checks inline, and its
    other values (arrays, containers) are checked and encoded as the slow path does.
    ``fixed`` is what its values take beyond the ``len`` of its bytes and strs and the encoded
    size of the others: a guess, then what the last block sealed with these keys measured."""

    __slots__ = (
        "encoded",
        "fixed",
        "index",
        "ints",
        "keys",
        "measured",
        "row_of",
        "sized",
        "strs",
        "take",
        "types",
        "width",
    )

    def __init__(self, keys: Sequence[str], types: tuple[type, ...]) -> None:
        self.keys = tuple(keys)
        self.index = {key: j for j, key in enumerate(self.keys)}
        self.width = len(keys)
        self.types = types
        getter = itemgetter(*keys)
        # itemgetter of one key returns the value, not a 1-tuple.
        self.row_of: Callable[[dict[str, Any]], tuple[Any, ...]] = (
            getter if len(keys) > 1 else lambda sample: (getter(sample),)
        )
        self.fixed = sum(_PLAIN_SIZES.get(t, 0) for t in types)
        self.sized = tuple(j for j, t in enumerate(types) if t in _SIZED)
        self.ints = tuple(j for j, t in enumerate(types) if t is int)
        self.strs = tuple(j for j, t in enumerate(types) if t is str)
        self.encoded = tuple(j for j, t in enumerate(types) if t not in _PLAIN_SIZES)
        self.measured = tuple(
            j for j, t in enumerate(types) if t in _PLAIN_SIZES and t not in _SIZED
        )
        self.take = self._taker()

    def _taker(self) -> Callable[..., tuple[Any, Any]]:
        """``take``: a closure, whose constants are local to it (it runs for every sample)."""
        width, row_of, types, keys = self.width, self.row_of, self.types, self.keys
        ints, sized, strs, path = self.ints, self.sized, self.strs, self
        # The usual shapes have one int and one bytes or str: those take no loop.
        int0 = ints[0] if len(ints) == 1 else None
        sized0 = sized[0] if len(sized) == 1 else None

        def take(sample: Any, first: bool = False) -> tuple[Any, Any]:
            """The check of one sample against this path, which ``add`` calls and
            ``add_from`` maps over its source: ``(row, size)``, the sample's values in the
            path's order and its size in the open block (but for its arrays and containers,
            ``encoded``, which the caller encodes), or ``(None, sample)`` for a sample the
            slow path takes, which checks it again and names what it refuses. ``first``: the
            sample would open a block, whose columns are in the order of its first sample's
            keys."""
            if type(sample) is not dict or len(sample) != width:
                return None, sample
            try:
                row = row_of(sample)
            except KeyError:  # a key this shape does not have
                return None, sample
            if tuple(map(type, row)) != types or (first and tuple(sample) != keys):
                return None, sample
            if int0 is not None:
                if not INT_MIN <= row[int0] <= INT_MAX:
                    return None, sample
            else:
                for j in ints:
                    if not INT_MIN <= row[j] <= INT_MAX:
                        return None, sample
            if sized0 is not None:
                nbytes = path.fixed + len(row[sized0])
            else:
                nbytes = path.fixed
                for j in sized:
                    nbytes += len(row[j])
            if strs:
                for j in strs:
                    text = row[j]
                    if not text.isascii():
                        try:  # UTF-8 bytes, not characters, for the block's size
                            nbytes += len(text.encode()) - len(text)
                        except UnicodeEncodeError:
                            return None, sample
            return row, nbytes

        return take

    def take_all(self, samples: Sequence[Any]) -> tuple[list[tuple[Any, ...]], list[int]] | None:
        """``take`` for a whole list, each check one C pass over it (for samples that do not
        open a block): their rows and the running sum of their sizes beyond ``fixed``
        (``before[k]`` for the samples before k), or None when a sample would not take this
        path. Stricter than ``take``: no arrays or containers, and strs only ASCII (their
        sizes are their lens)."""
        if self.encoded or not samples:
            return None
        if set(map(type, samples)) != {dict} or set(map(len, samples)) != {self.width}:
            return None
        try:
            rows = list(map(self.row_of, samples))
        except KeyError:
            return None
        columns = list(zip(*rows, strict=True))
        for column, kind in zip(columns, self.types, strict=True):
            if set(map(type, column)) != {kind}:
                return None
        for j in self.ints:
            if min(columns[j]) < INT_MIN or max(columns[j]) > INT_MAX:
                return None
        for j in self.strs:
            if not all(map(str.isascii, columns[j])):
                return None
        # Sizes beyond ``fixed``: the lens of bytes and (ASCII) strs, summed per sample.
        extra: Iterable[int] = repeat(0, len(rows))
        for j in self.sized:
            lens = map(len, columns[j])
            extra = lens if j == self.sized[0] else map(plus, extra, lens)
        return rows, list(accumulate(extra, initial=0))


class ChunkBuilder:
    """Accumulates samples into one chunk; the caller decides when the chunk is full.

    Values are kept as the caller's ``bytes`` objects plus small headers until the chunk is
    written, so a large ``bytes`` value is copied once: into the file.
    """

    def __init__(
        self,
        *,
        block_bytes: int,
        compressor: FrameCompressor,
        apart: bool = False,
        apart_small: bool = True,
    ) -> None:
        self._block_limit = block_bytes
        # Columns stored apart, in pieces of up to ``block_bytes`` or 4096 values: every one
        # (``apart``: a field file), or (``apart_small``) those the chunk's first block shows
        # to be small (``_choose_apart``); and the values of each waiting for their piece.
        self._apart_all = apart
        self._apart_small = apart_small
        self._apart: frozenset[str] | None = None  # not chosen yet
        self._pending: dict[str, Pending] = {}
        self._check_at = min(block_bytes, _CHECK_BLOCK_AT)  # seal, or check the block
        self._compressor = compressor
        self._compressing = compressor.enabled
        encoder = ValueEncoder()
        self._encode = encoder.encode
        self._encode_plain = encoder.encode_plain
        self._size = HEADER.size
        self._columns: dict[str, int] = {}
        self._sealed = SealedFrames()
        self._stream: ChunkStream | None = None
        self._num_samples = 0
        self._raw_streak: dict[str, int] = {}
        self._fast: _FastPath | None = None
        self._shapes: dict[tuple[tuple[str, ...], tuple[type, ...]], _FastPath] = {}
        self._batch_skips = 0  # lists to add one at a time before trying a C pass again
        self._even_tables = EvenTables(_MAX_SHAPES)
        self._reset_block()

    def _reset_block(self) -> None:
        """Start a block. It keeps the last block's fast path, for a first sample whose keys
        come in the same order: a block's columns are in the order its samples show them."""
        self._keys: list[str] = []
        self._key_index: dict[str, int] = {}
        self._rows: list[Sequence[Any]] = []
        self._block_bytes = 0  # an estimate until the block is sealed

    @property
    def num_samples(self) -> int:
        return self._num_samples + len(self._rows)

    @property
    def size(self) -> int:
        """Bytes so far, counting the open block's estimated size."""
        return self._size + self._block_bytes

    def add(self, sample: Any, position: int) -> int:
        """Add one sample and return ``size``; on EncodeError the builder is unchanged."""
        rows = self._rows
        fast = self._fast
        row, nbytes = fast.take(sample, not rows) if fast is not None else (None, sample)
        if row is None:
            row, nbytes = self._checked_row(sample, position)
        else:
            assert fast is not None
            if fast.encoded:  # arrays and containers: checked and encoded as the slow path does
                row = list(row)
                for j in fast.encoded:
                    data = self._checked_encode(row[j], position, fast.keys[j])
                    row[j] = _Encoded(data)
                    nbytes += len(data)
            if not rows:
                self._open_block(fast)
        rows.append(row)
        block_bytes: int = self._block_bytes + nbytes
        self._block_bytes = block_bytes
        if block_bytes >= self._check_at or len(rows) >= MAX_BLOCK_SAMPLES:
            self._added_last(position, nbytes)  # may seal the block, or take the sample back
            block_bytes = self._block_bytes
        return self._size + block_bytes

    def add_many(self, samples: Sequence[Any], position: int, limit: int) -> int:
        """Add samples in order, as ``add`` does one at a time, until ``size`` reaches
        ``limit`` (a chunk's size); return how many were added. On EncodeError the samples
        before the refused one are added and the rest are not."""
        done = 0
        if self._batch_skips > 0:
            self._batch_skips -= 1
        elif self._fast is not None:
            done = self._add_shaped(samples, position, limit)
            if done == 0:
                self._batch_skips = _BATCH_BACKOFF
            elif self.size >= limit:
                return done
        for k in range(done, len(samples)):
            if self.add(samples[k], position + k) >= limit:
                return k + 1
        return len(samples)

    def add_from(self, source: Iterator[Any], position: int, limit: int) -> int:
        """Add samples taken from ``source`` one at a time, each added (or refused) before the
        next is taken, as ``add`` does, until ``size`` reaches ``limit`` or the source ends;
        return how many were added. Samples of the fast path's shape with no arrays or
        containers run in a loop of local variables, the path's check mapped over the source:
        no call per sample from Python."""
        added = 0
        while True:
            fast, rows = self._fast, self._rows
            if fast is None or fast.encoded or not rows:
                sample = next(source, _END)
                if sample is _END:
                    return added
                added += 1
                if self.add(sample, position + added - 1) >= limit:
                    return added
                continue
            # Stop where ``add`` would check or seal the block, or the chunk reaches ``limit``.
            stop_at = min(self._check_at, limit - self._size)
            block_bytes, append, other, had = self._block_bytes, rows.append, _END, len(rows)
            try:  # the block's size stays right if the source raises
                for row, nbytes in map(fast.take, islice(source, MAX_BLOCK_SAMPLES - had)):
                    if row is None:  # then ``nbytes`` is the sample
                        other = nbytes
                        break
                    append(row)
                    block_bytes += nbytes
                    if block_bytes >= stop_at:
                        break
                else:
                    if len(rows) < MAX_BLOCK_SAMPLES:  # the source ended
                        added += len(rows) - had
                        return added
            finally:
                self._block_bytes = block_bytes
            added += len(rows) - had
            if other is not _END:  # not on the fast path: ``add`` checks it, and may refuse it
                added += 1
                if self.add(other, position + added - 1) >= limit:
                    return added
                continue
            self._added_last(position + added - 1, nbytes)
            if self.size >= limit:
                return added

    def _add_shaped(self, samples: Sequence[Any], position: int, limit: int) -> int:
        """Add the samples if all have the fast path's shape and plain values that need no
        per-sample work: each check is one C pass over the whole list. Returns how many were
        added: all, none, those up to the one that brings ``size`` to ``limit``, or those
        before a block whose first sample has its keys in another order (``add`` then starts
        that block)."""
        fast = self._fast
        taken = fast.take_all(samples) if fast is not None else None
        if taken is None:
            return 0
        assert fast is not None
        rows, before = taken
        start = 0
        while start < len(rows):
            if not self._rows:  # a block's first sample sets the order of its columns
                if tuple(samples[start]) != fast.keys:
                    return start
                self._open_block(fast)
            # Taking the samples before k fills the block (``add`` would seal it there) or the
            # chunk once before[k] + k * fixed reaches ``need``. Large samples often do alone.
            fixed = fast.fixed
            room = min(self._check_at - self._block_bytes, limit - self.size)
            need = room + before[start] + start * fixed
            end = start + min(len(rows) - start, MAX_BLOCK_SAMPLES - len(self._rows))
            stop = start + 1
            if before[stop] + stop * fixed < need:

                def weighed(k: int, fixed: int = fixed) -> int:
                    return before[k] + k * fixed

                stop = min(end, stop + bisect_left(range(stop, end + 1), need, key=weighed))
            self._rows.extend(rows[start:stop])
            self._block_bytes += before[stop] - before[start] + (stop - start) * fixed
            self._added_last(position + stop - 1, before[stop] - before[stop - 1] + fixed)
            start = stop
            if self.size >= limit:
                break
        return start

    def add_columns(self, batch: ColumnBatch, start: int, position: int, limit: int) -> int:
        """Add rows ``start:`` of a batch of columns, in blocks of their own (an open block of
        samples is sealed first), until ``size`` reaches ``limit`` or the batch ends; return
        how many were added. Blocks close where a block of samples would: once their
        encoded size reaches ``block_bytes``, or at 4096 samples."""
        self._seal_block()
        n, i = batch.num_rows, start
        while i < n:
            bounds = self._plan(batch, i, limit)
            self._add_blocks(batch, bounds)
            i = bounds[-1]
            if self._size >= limit:
                break
        return i - start

    def _plan(self, batch: ColumnBatch, start: int, limit: int) -> list[int]:
        """The bounds of the next blocks of a batch of columns, from row ``start``: each block
        ends at the first row that brings it to ``block_bytes``, or to ``limit`` counting the
        chunk's size before it. The blocks after the first are planned with the raw sizes of
        the frames before them, before those are stored (compressed, a frame is smaller):
        planning stops at a block whose end that size could change, one the chunk's
        ``limit`` would cut short, which the next plan starts with, from the size stored."""
        ends = batch.row_end_list
        n = batch.num_rows
        cap = min(self._block_limit, _CHECK_BLOCK_AT)  # a frame's offsets are u32
        width = len(batch.names)
        size, i = self._size, start
        bounds = [i]
        while i < n:
            room = min(cap, max(1, limit - size))
            if room < cap and i != start:
                break
            j = bisect_left(ends, ends[i] + room, i, min(n, i + MAX_BLOCK_SAMPLES))
            j = max(i + 1, j)
            size += ends[j] - ends[i] + width * (len(ARRAY_HEADERS[j - i]) + 4 * (j - i))
            bounds.append(j)
            i = j
            if room < cap or size >= limit:
                break
        return bounds

    def add_apart(self, batch: ColumnBatch) -> None:
        """Add every row of a batch of columns to a builder made with ``apart``: each column
        joins its pieces (an open block of samples is sealed first)."""
        if not self._apart_all:
            raise ValueError("add_apart needs a builder made with apart=True")
        self._seal_block()
        self._add_blocks(batch, [0, batch.num_rows])

    def _add_blocks(self, batch: ColumnBatch, bounds: list[int]) -> None:
        """Seal the blocks of rows ``bounds[k]:bounds[k + 1]`` of a batch of columns; the
        columns stored apart join their pieces instead."""
        first, last = bounds[0], bounds[-1]
        for name in batch.names:  # the chunk's columns in the batch's order
            self._columns.setdefault(name, len(self._columns))
        if self._apart is None and last > first:
            n = bounds[1] - first
            self._choose_apart(
                {
                    name: int(column.offsets[first + n] - column.offsets[first]) / n
                    for name, column in zip(batch.names, batch.columns, strict=True)
                },
                n,
            )
        pairs = list(zip(batch.names, batch.columns, strict=True))
        in_blocks = [] if self._apart_all else pairs  # copies stay in the blocks too
        for name, column in pairs:
            if self._is_apart(name):
                self._pend(name, column, first, last, False)
        self._pad_pending(batch.names, last - first)
        width = len(in_blocks)
        tables = self._even_tables
        frames = [column_frames(c, bounds, tables, batch.stable) for _, c in in_blocks]
        store, blocks = self._store_frame, self._sealed.blocks
        for number, (i, j) in enumerate(pairwise(bounds)):
            for (name, _), of_column in zip(in_blocks, frames, strict=True):
                parts, raw_length = of_column[number]
                store(name, parts, raw_length, False)
            if not self._apart_all:
                blocks.append((j - i, width))
            self._num_samples += j - i
        self._seal_all_pieces(final=False)

    def _is_apart(self, name: str) -> bool:
        return self._apart_all or (self._apart is not None and name in self._apart)

    def _choose_apart(self, sizes: dict[str, float], n: int) -> None:
        """Choose the chunk's columns stored apart from its first block (``n`` samples, each
        column's average encoded size), before any of its frames is sealed: the file's
        major follows (4 with columns stored apart, 3 without). In a chunk they are copies:
        the blocks hold them too, so that a reader of samples reads each sample's values
        from its block alone."""
        chosen: frozenset[str] = frozenset()
        if self._apart_small and not self._apart_all and n <= APART_BLOCK_SAMPLES:
            small = frozenset(name for name, size in sizes.items() if size <= APART_VALUE_BYTES)
            if len(small) < len(sizes):  # a block of small values only is a fine frame each
                chosen = small
        self._apart = chosen
        self._sealed.major = major_of(self._apart_all or bool(chosen))
        self._sealed.copies = not self._apart_all

    def _pend(self, name: str, column: Encoded, start: int, stop: int, sparse: bool) -> None:
        """Rows [start, stop) of ``column`` join the pieces of ``name``, stored apart."""
        column.data  # noqa: B018 -- joined now: the caller may reuse its buffers on return
        self._pending_of(name).add(column, start, stop, sparse)

    def _pending_of(self, name: str) -> Pending:
        """The values of ``name`` waiting for their piece. A column first seen now is ABSENT
        in every sample of the chunk before."""
        found = self._pending.get(name)
        if found is None:
            found = self._pending[name] = Pending()
            self._columns.setdefault(name, len(self._columns))
            if self._num_samples:
                found.add(absent_column(self._num_samples), 0, self._num_samples, True)
        return found

    def _pad_pending(self, shown: Sequence[str], n: int) -> None:
        """The columns stored apart that ``n`` new samples lack (not in ``shown``): ABSENT."""
        for name, found in self._pending.items():
            if name not in shown:
                found.add_values([ABSENT_BYTES * n], [len(ABSENT_BYTES)] * n, True)

    def _seal_all_pieces(self, final: bool) -> None:
        for name, found in self._pending.items():
            self._seal_pieces(name, found, final)

    def _seal_pieces(self, name: str, found: Pending, final: bool) -> None:
        """Seal the full pieces of a column's pending values (``final``: all of them): each
        ends at the first value that brings it to ``block_bytes``, or at 4096 values."""
        limit = min(self._block_limit, _CHECK_BLOCK_AT)
        while found.count:
            if not final and found.count < MAX_BLOCK_SAMPLES and found.nbytes < limit:
                return  # no piece is full yet
            sizes = found.sizes(MAX_BLOCK_SAMPLES)
            ends = np.cumsum(sizes)
            cut = int(np.searchsorted(ends, limit, side="left")) + 1
            if cut > len(sizes):  # below the limit
                if not final and len(sizes) < MAX_BLOCK_SAMPLES:
                    return  # more values may come
                cut = len(sizes)
            values, sparse = found.take(cut)
            head = ARRAY_HEADERS[cut]
            offsets = np.zeros(cut, dtype=np.int64)
            np.cumsum(sizes[: cut - 1], out=offsets[1:])
            table = (offsets + len(head)).astype("<u4").tobytes()
            raw_length = len(head) + int(ends[cut - 1]) + len(table)
            self._store_frame(name, (head, values, table), raw_length, sparse, piece=cut)

    def _open_block(self, fast: _FastPath) -> None:
        """The open block's first sample took ``fast``: its columns are the path's keys."""
        self._keys = list(fast.keys)
        self._key_index = dict(fast.index)

    def _added_last(self, position: int, nbytes: int) -> None:
        """After the block's last sample (at ``position``, ``nbytes`` of the estimate) was
        added: refuse it if the block grew past what the format can address (only the last
        sample can have made it so), and seal the block if it is full."""
        if self._block_bytes >= _CHECK_BLOCK_AT:
            self._refuse_unaddressable(position, nbytes)
        if self._block_bytes >= self._block_limit or len(self._rows) >= MAX_BLOCK_SAMPLES:
            self._seal_block()

    def _checked_row(self, sample: Any, position: int) -> tuple[list[Any], int]:
        """The slow path: check every key and value, and make the block's fast path match
        this sample. Changes nothing when it raises."""
        if type(sample) is not dict:
            raise EncodeError(f"sample {position}: expected a dict, got {type(sample).__name__}")
        index = self._key_index
        row: list[Any] = [ABSENT] * len(self._keys)
        new_keys: list[str] = []
        nbytes = 0
        for key, value in sample.items():
            if value is ABSENT:  # the builder's own marker, never a value
                raise EncodeError(f"sample {position}, key {key!r}: unsupported type Absent")
            j = index.get(key)
            if j is None:
                if type(key) is not str:
                    raise EncodeError(f"sample {position}: key {key!r} is not a str")
                if not key.isascii():
                    _check_utf8(key, f"sample {position}: key {key!r}")
                new_keys.append(key)
                row.append(value)
            else:
                row[j] = value
        types = tuple(map(type, row))
        for j, value in enumerate(row):
            if value is ABSENT:
                continue
            kind = type(value)
            if kind is str and not value.isascii():
                try:  # UTF-8 bytes, not characters, for the block's size
                    nbytes += len(value.encode()) - len(value)
                except UnicodeEncodeError as e:
                    raise _not_utf8(position, self._key_name(j, new_keys), e) from None
            if kind in _SIZED:
                nbytes += len(value) + _PLAIN_SIZES[kind]
            elif kind in _PLAIN_SIZES and (kind is not int or INT_MIN <= value <= INT_MAX):
                nbytes += _PLAIN_SIZES[kind]
            else:
                data = self._checked_encode(value, position, self._key_name(j, new_keys))
                row[j] = _Encoded(data)
                nbytes += len(data)
        for key in new_keys:
            index[key] = len(self._keys)
            self._keys.append(key)
        self._fast = self._shape(types) if row and len(sample) == len(row) else None
        return row, nbytes

    def _refuse_unaddressable(self, position: int, nbytes: int) -> None:
        """Take back the block's last sample (at ``position``, ``nbytes`` in the estimate)
        and raise EncodeError if one of its values cannot be stored: over
        ``MAX_VALUE_BYTES``, or starting past 4 GiB in its column's frame. A rare path: only
        for blocks of about 4 GiB."""
        rows = self._rows
        last = rows[-1]
        why = ""
        for j, value in enumerate(last):
            if _value_bytes(value) > MAX_VALUE_BYTES + 5:  # a bin or str header
                why = (
                    f"a value of {_value_bytes(value) - 5} bytes or more; the format holds at "
                    f"most {MAX_VALUE_BYTES} bytes a value"
                )
            elif (
                len(rows) > 1
                and 5 + sum(_value_bytes(row[j]) for row in rows[:-1] if j < len(row))
                > MAX_VALUE_BYTES
            ):
                why = (
                    "this key's values in one block would pass 4 GiB (a frame's offsets are "
                    "32-bit): lower block_bytes"
                )
            if why:
                key = self._keys[j] if j < len(self._keys) else "?"
                rows.pop()
                self._block_bytes -= nbytes
                # The refused sample may have brought new keys, and its shape is the fast one.
                width = max(map(len, rows), default=0)
                for gone in self._keys[width:]:
                    del self._key_index[gone]
                del self._keys[width:]
                self._fast = None
                raise EncodeError(f"sample {position}, key {key!r}: {why}")

    def _shape(self, types: tuple[type, ...]) -> _FastPath:
        """The fast path for samples with the block's keys in order and these types: made
        once per shape, so that samples alternating between shapes do not rebuild it."""
        shape = (tuple(self._keys), types)
        fast = self._shapes.get(shape)
        if fast is None:
            if len(self._shapes) >= _MAX_SHAPES:
                self._shapes.clear()
            fast = self._shapes[shape] = _FastPath(self._keys, types)
        return fast

    def _checked_encode(self, value: Any, position: int, key: str) -> bytes:
        try:
            return self._encode(value, position=position, key=key)
        except UnicodeEncodeError as e:  # a str in a container that is not UTF-8
            raise _not_utf8(position, key, e) from None

    def _key_name(self, j: int, new_keys: list[str]) -> str:
        keys = self._keys
        return keys[j] if j < len(keys) else new_keys[j - len(keys)]

    def end_block(self) -> None:
        """Close the open block now (field files copy their chunk's block boundaries)."""
        self._seal_block()

    def _seal_block(self) -> None:
        rows = self._rows
        if not rows:
            return
        n = len(rows)
        values_by_column = zip_longest(*rows, fillvalue=ABSENT)
        columns = [self._encode_column(values) for values in values_by_column]
        if self._apart is None:
            self._choose_apart(
                {name: sum(c[1]) / n for name, c in zip(self._keys, columns, strict=True)}, n
            )
        width = 0
        for name, (parts, sizes, sparse) in zip(self._keys, columns, strict=True):
            if self._is_apart(name):
                self._pending_of(name).add_values(parts, sizes, sparse)
            if not self._apart_all:  # in the block too: a copy (docs/format.md §7.6)
                self._seal_frame(name, parts, sizes, sparse)
                width += 1
        self._pad_pending(self._keys, n)
        fast = self._fast
        if fast is not None and fast.keys == tuple(self._keys):
            # What its unsized values really took (a small int takes 1 byte, not 9).
            measured = sum(sum(columns[j][1]) for j in fast.measured)
            fast.fixed = -(-measured // len(rows)) + _PLAIN_SIZES[bytes] * len(fast.sized)
        if not self._apart_all:
            self._sealed.blocks.append((n, width))
        self._num_samples += n
        self._reset_block()
        self._seal_all_pieces(final=False)

    def _encode_column(self, values: tuple[Any, ...]) -> tuple[list[bytes], list[int], bool]:
        """One column of the block: encoded values as parts, each value's size, and whether
        some are absent. Whole-column calls when the values share one plain type."""
        kinds = set(map(type, values))
        if len(kinds) == 1:
            if bytes in kinds:
                lengths = list(map(len, values))
                first = lengths[0]
                if lengths.count(first) == len(lengths):  # one length (tokens, latents)
                    head = bin_header(first)
                    parts = [head] * (2 * len(values))
                    parts[1::2] = values
                    return parts, [len(head) + first] * len(values), False
                heads = bin_headers(lengths)
                parts = [b""] * (2 * len(values))
                parts[::2], parts[1::2] = heads, values
                return parts, list(map(plus, map(len, heads), lengths)), False
            if _Encoded not in kinds:
                parts = list(map(self._encode_plain, values))
                return parts, list(map(len, parts)), False
        return self._encode_values(values)

    def _encode_values(self, values: tuple[Any, ...]) -> tuple[list[bytes], list[int], bool]:
        parts: list[bytes] = []
        sizes: list[int] = []
        sparse = False
        for value in values:
            kind = type(value)
            if kind is bytes:
                head = bin_header(len(value))
                parts += (head, value)
                sizes.append(len(head) + len(value))
                continue
            if kind is _Encoded:
                data = value.data
            elif kind is Absent:
                data, sparse = ABSENT_BYTES, True
            else:
                data = self._encode_plain(value)  # plain, checked when it was added
            parts.append(data)
            sizes.append(len(data))
        return parts, sizes, sparse

    def _seal_frame(self, name: str, parts: list[bytes], sizes: list[int], sparse: bool) -> None:
        n = len(sizes)
        head = array_header(n)
        if sizes.count(sizes[0]) == n:  # values of one size: a table made before
            shape = (len(head), sizes[0], n)
            table = self._even_tables.table(*shape)
        else:
            table = struct.pack(f"<{n}I", *accumulate(sizes[:-1], initial=len(head)))
        raw_length = len(head) + sum(sizes) + len(table)
        self._store_frame(name, (head, *parts, table), raw_length, sparse)

    def _store_frame(
        self,
        name: str,
        stored: tuple[bytes | memoryview, ...],
        raw_length: int,
        sparse: bool,
        piece: int = 0,
    ) -> None:
        """Seal one frame from its raw bytes in parts: compressed when that pays. ``piece``:
        the frame is a piece of that many values of a column stored apart, not a block's."""
        column = self._columns.setdefault(name, len(self._columns))
        codec = CODEC_RAW
        streaks = self._raw_streak
        streak = streaks.get(name, 0)
        if self._compressing and (streak < _RAW_STREAK or streak % _PROBE_EVERY == 0):
            codec, packed = self._compressor.compress(b"".join(stored))
            if codec == CODEC_RAW:
                streaks[name] = streak + 1
            else:
                streaks[name] = 0
                stored = (packed,)
        elif name in streaks:
            streaks[name] = streak + 1
        length = raw_length if codec == CODEC_RAW else len(stored[0])
        flags = FLAG_SPARSE if sparse else 0
        sealed = self._sealed
        if piece:
            sealed.pieces.setdefault(column, []).append((piece, len(sealed.frames)))
        sealed.frames.append((column, self._size, length, raw_length, codec, flags))
        sealed.stored.append(stored)
        self._size += length

    @property
    def sealed_frames(self) -> int:
        """Frames sealed so far: ``stream().pieces`` may be asked for the bytes of these."""
        return len(self._sealed.frames)

    def stream(self) -> ChunkStream:
        """The chunk's bytes as its frames are sealed, for a writer that stores them while
        this builder still takes samples (on another thread: frames are appended to lists
        that the stream reads only below ``sealed_frames``)."""
        if self._stream is None:
            self._stream = ChunkStream(self._sealed)
        return self._stream

    def finish(self) -> BuiltChunk:
        """The chunk, to be iterated once for its bytes (those ``stream`` gave already
        excepted); the builder is spent."""
        self._seal_block()
        self._seal_all_pieces(final=True)
        built = BuiltChunk(self.stream(), list(self._columns), self._num_samples, self._size)
        self._sealed, self._stream = SealedFrames(), None
        return built
