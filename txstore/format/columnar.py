"""Columns in: samples given as columns (N values each: N samples) encoded a column at a time.

A column becomes an ``Encoded``: the MessagePack encodings of its values end to end and where
each starts, which the builder cuts into frames (``ChunkBuilder.add_columns``). Columns of
fixed-width values (ints, floats, bools, arrays of one shape) are encoded with numpy, with no
Python object per value; a list column's values are encoded one by one with ``ValueEncoder``,
the dict path's checks included. The values read back are those the dict path gives for the
same samples: an int column gives ints, a float column floats, a row of a 2-d array an array.

What counts as columns (``as_columns``): a dict of equal-length lists or numpy arrays, and,
through ``arrow`` (imported only when one is met, as pyarrow is an optional extra), a
pyarrow ``Table`` or ``RecordBatch``, a pandas ``DataFrame``, and a dict holding Arrow arrays.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import EncodeError
from .values import ABSENT, MAX_ARRAY_BYTES, MAX_VALUE_BYTES, ValueEncoder

_U8 = np.uint8
_LARGE = 16 << 10
#: MessagePack's one-byte nil, the encoding of a null.
NIL = 0xC0


class Encoded:
    """A column's values encoded: value ``i`` is ``data[offsets[i]:offsets[i + 1]]``."""

    __slots__ = ("_data", "_even", "offsets")

    def __init__(self, data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> None:
        self._data = data  # uint8
        self.offsets = offsets  # int64, one more than the values
        self._even: int | None = -1  # not yet known

    @property
    def even_size(self) -> int | None:
        """The size of every value when they all have one (ints of one width, floats), else
        None."""
        if self._even == -1:
            sizes = self.sizes
            one = len(sizes) > 0 and bool((sizes == sizes[0]).all())
            self._even = int(sizes[0]) if one else None
        return self._even

    @property
    def data(self) -> np.ndarray[Any, Any]:
        return self._data

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray[Any, Any]:
        return np.diff(self.offsets)


class Prefixed(Encoded):
    """Values that are each a header and a payload (strs, bytes, lists, numpy arrays), kept
    apart: value ``i`` is ``heads[i, :used[i]]`` then ``payload[starts[i]:starts[i + 1]]``
    (``starts`` index ``payload`` itself: a slice's values start where its first one does),
    or, given ``lengths``, ``payload[starts[i]:starts[i] + lengths[i]]``: values anywhere in
    ``payload`` (a peer's file, between its other columns).
    ``data`` joins them when first asked for; a chunk builder instead copies a column of one
    header and one payload length straight into its frames (``uniform``), so each value's
    bytes are copied once, not into ``data`` and again into a frame, or refers to large
    values' payloads where they stay unchanged (``is_large``, ``ColumnBatch.stable``)."""

    __slots__ = ("_ready", "heads", "is_large", "lengths", "payload", "starts", "uniform", "used")

    def __init__(
        self,
        heads: np.ndarray[Any, Any],
        used: np.ndarray[Any, Any],
        payload: np.ndarray[Any, Any],
        starts: np.ndarray[Any, Any],
        lengths: np.ndarray[Any, Any] | None = None,
    ) -> None:
        n = len(used)
        scattered = lengths is not None
        if lengths is None:
            lengths = np.diff(starts)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(used + lengths, out=offsets[1:])
        super().__init__(np.empty(0, dtype=_U8), offsets)
        self.heads, self.used, self.payload, self.starts = heads, used, payload, starts
        self.lengths = lengths
        #: (the header every value has, the payload length every value has), or None:
        #: values of one length that lie evenly in ``payload`` (``value_rows``).
        self.uniform: tuple[bytes, int] | None = None
        if n and (lengths == lengths[0]).all() and (used == used[0]).all():
            h = int(used[0])
            even = not scattered or n == 1 or bool((np.diff(starts) == starts[1] - starts[0]).all())
            if even and (heads[:, :h] == heads[0, :h]).all():
                self.uniform = (heads[0, :h].tobytes(), int(lengths[0]))
        self._ready = False
        #: Values of 16 KiB or more on average, which a frame may refer to, not copy.
        self.is_large = n > 0 and int(lengths.sum()) >= _LARGE * n

    def value_rows(self) -> np.ndarray[Any, Any]:
        """The payloads of ``uniform`` values as a row each: a view of ``payload``."""
        assert self.uniform is not None
        n, length = len(self.used), self.uniform[1]
        first = int(self.starts[0])
        if len(self.starts) == n + 1:
            return self.payload[first : first + n * length].reshape(n, length)
        step = int(self.starts[1] - self.starts[0]) if n > 1 else length
        return np.lib.stride_tricks.as_strided(
            self.payload[first:], shape=(n, length), strides=(step, 1), writeable=False
        )

    def spans(self, first: int = 0, last: int | None = None) -> tuple[list[int], list[int]]:
        """Where the payloads of values ``first:last`` start and end in ``payload``."""
        last = len(self.used) if last is None else last
        starts = self.starts[first:last]
        return starts.tolist(), (starts + self.lengths[first:last]).tolist()

    @property
    def data(self) -> np.ndarray[Any, Any]:
        if not self._ready:
            if len(self.starts) == len(self.used) + 1:
                self._data = _joined(self.heads, self.used, self.payload, self.starts, self.offsets)
            else:
                view, used = self.payload.data, self.used.tolist()
                parts: list[Any] = []
                for k, (a, b) in enumerate(zip(*self.spans(), strict=True)):
                    parts += (self.heads[k, : used[k]].tobytes(), view[a:b])
                self._data = np.frombuffer(b"".join(parts), dtype=_U8)
            self._ready = True
        return self._data


@dataclass(frozen=True)
class ColumnBatch:
    """N samples as columns: ``columns[k]`` holds the values of key ``names[k]``."""

    names: tuple[str, ...]
    columns: tuple[Encoded, ...]
    num_rows: int
    #: The values' bytes stay as they are until the writer has stored them (an importer's
    #: source files, read through a map): a chunk builder may refer to large values' bytes
    #: where it would otherwise copy them (``Prefixed.is_large``).
    stable: bool = False

    def __len__(self) -> int:
        return self.num_rows

    def rows(self, start: int, stop: int) -> ColumnBatch:
        """Rows [start, stop) of the batch (views of its bytes)."""
        columns = []
        for column in self.columns:
            offsets = column.offsets[start : stop + 1]
            columns.append(Encoded(column.data[offsets[0] : offsets[-1]], offsets - offsets[0]))
        return ColumnBatch(self.names, tuple(columns), stop - start)

    @staticmethod
    def concat(batches: Sequence[ColumnBatch]) -> ColumnBatch:
        """Batches of the same columns, one after the other."""
        if len(batches) == 1:
            return batches[0]
        names = batches[0].names
        columns = []
        for k in range(len(names)):
            parts = [b.columns[k] for b in batches]
            data = np.concatenate([p.data[p.offsets[0] : p.offsets[-1]] for p in parts])
            offsets, base = [np.zeros(1, dtype=np.int64)], 0
            for p in parts:
                offsets.append(p.offsets[1:] - p.offsets[0] + base)
                base += int(p.offsets[-1] - p.offsets[0])
            columns.append(Encoded(data, np.concatenate(offsets)))
        return ColumnBatch(names, tuple(columns), sum(b.num_rows for b in batches))

    @cached_property
    def row_end_list(self) -> list[int]:
        """``row_ends`` as a list."""
        ends: list[int] = self.row_ends.tolist()
        return ends

    @cached_property
    def row_ends(self) -> np.ndarray[Any, Any]:
        """The running total of the rows' encoded sizes (``num_rows + 1`` values)."""
        total = np.zeros(self.num_rows + 1, dtype=np.int64)
        for column in self.columns:
            total += column.offsets - column.offsets[0]
        return total


def _even(data: np.ndarray[Any, Any], width: int, n: int) -> Encoded:
    return Encoded(data.reshape(-1), np.arange(n + 1, dtype=np.int64) * width)


def _tagged(tag: int, values: np.ndarray[Any, Any], dtype: str) -> Encoded:
    """Values of one MessagePack type: a tag byte, then each value big-endian as ``dtype``.
    Written through a record view (numpy copies narrow rows of a 2-d array a byte at a
    time)."""
    n = len(values)
    record = np.dtype([("tag", _U8), ("value", dtype)])
    out = np.empty(n, dtype=record)
    out["tag"] = tag
    out["value"] = values
    return _even(out.view(_U8), record.itemsize, n)


def encode_ints(values: np.ndarray[Any, Any]) -> Encoded:
    """Integers, all in the smallest MessagePack width that holds every one of them (the
    dict path's msgspec picks one per value; both decode to the same ints)."""
    n = len(values)
    if n == 0:
        return _even(np.empty(0, dtype=_U8), 1, 0)
    if values.dtype.kind == "u" and values.dtype.itemsize == 8 and int(values.max()) > 2**63 - 1:
        return _tagged(0xCF, values, ">u8")
    low, high = int(values.min()), int(values.max())
    if low >= -32 and high <= 127:  # fixints: the value's own byte
        return _even(values.astype(np.int8).view(_U8), 1, n)
    for tag, kind, lo, hi in _INT_WIDTHS:
        if lo <= low and high <= hi:
            return _tagged(tag, values, kind)
    raise AssertionError("an int64 always fits")  # pragma: no cover


_INT_WIDTHS = (
    (0xD0, ">i1", -(2**7), 2**7 - 1),
    (0xD1, ">i2", -(2**15), 2**15 - 1),
    (0xD2, ">i4", -(2**31), 2**31 - 1),
    (0xD3, ">i8", -(2**63), 2**63 - 1),
)


def encode_floats(values: np.ndarray[Any, Any]) -> Encoded:
    """Floats: 32-bit (and 16-bit, widened exactly) as MessagePack float 32, 64-bit as float
    64; either reads back as the Python float of the same value."""
    if values.dtype.itemsize <= 4:
        return _tagged(0xCA, values.astype(np.float32), ">f4")
    return _tagged(0xCB, values, ">f8")


def encode_bools(values: np.ndarray[Any, Any]) -> Encoded:
    return _even(np.where(values, 0xC3, 0xC2).astype(_U8), 1, len(values))


def nulls(n: int) -> Encoded:
    return _even(np.full(n, NIL, dtype=_U8), 1, n)


def encode_arrays(values: np.ndarray[Any, Any], name: str, position: int) -> Encoded:
    """Row ``i`` of ``values`` (shape ``(n, *shape)``) as one numpy array value each: the
    encoding ``ValueEncoder`` gives such an array, its bytes laid out with numpy."""
    n = len(values)
    shape, dtype = values.shape[1:], values.dtype
    itemsize = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if itemsize > MAX_ARRAY_BYTES:
        raise EncodeError(
            f"sample {position}, key {name!r}: an array of {itemsize} bytes; the format holds "
            f"at most {MAX_VALUE_BYTES} bytes a value"
        )
    # The header of every row's value is that of any array of this dtype and shape.
    template = ValueEncoder().encode(np.zeros(shape, dtype=dtype), position=position, key=name)
    prefix = np.frombuffer(template[: len(template) - itemsize], dtype=_U8)
    payload = np.ascontiguousarray(values).reshape(-1).view(_U8)
    starts = np.arange(n + 1, dtype=np.int64) * itemsize
    heads = np.broadcast_to(prefix, (n, len(prefix)))
    return Prefixed(heads, np.full(n, len(prefix), dtype=np.int64), payload, starts)


def encode_objects(
    values: Iterable[Any], name: str, position: int, encoder: ValueEncoder
) -> Encoded:
    """Python values one at a time, as the dict path checks and encodes them."""
    parts = []
    for i, value in enumerate(values):
        if value is ABSENT:
            raise EncodeError(f"sample {position + i}, key {name!r}: unsupported type Absent")
        try:
            parts.append(encoder.encode(value, position=position + i, key=name))
        except UnicodeEncodeError as e:
            raise EncodeError(
                f"sample {position + i}, key {name!r}: a str is not valid UTF-8 ({e.reason})"
            ) from None
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    return Encoded(np.frombuffer(b"".join(parts), dtype=_U8), offsets)


def _headers(
    lengths: np.ndarray[Any, Any], classes: Sequence[tuple[int, int, int]]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """MessagePack length headers, ``(n, 5)`` bytes and how many of each row are used.
    ``classes``: (the largest length, tag, bytes of length after the tag), smallest first;
    a tag of bytes 0 holds the length in its low bits (fixstr, fixarray, fixmap)."""
    n = len(lengths)
    heads = np.zeros((n, 5), dtype=_U8)
    used = np.zeros(n, dtype=np.int64)
    todo = np.ones(n, dtype=bool)
    for most, tag, nbytes in classes:
        rows = todo & (lengths <= most)
        if not rows.any():
            continue
        todo &= ~rows
        if nbytes == 0:
            heads[rows, 0] = tag | lengths[rows]
        else:
            heads[rows, 0] = tag
            be = lengths[rows].astype(f">u{nbytes}").view(_U8).reshape(-1, nbytes)
            heads[rows, 1 : 1 + nbytes] = be
        used[rows] = 1 + nbytes
    return heads, used


_STR = ((31, 0xA0, 0), (255, 0xD9, 1), (65535, 0xDA, 2), (2**32 - 1, 0xDB, 4))
_BIN = ((255, 0xC4, 1), (65535, 0xC5, 2), (2**32 - 1, 0xC6, 4))
_ARRAY = ((15, 0x90, 0), (65535, 0xDC, 2), (2**32 - 1, 0xDD, 4))
_MAP = ((15, 0x80, 0), (65535, 0xDE, 2), (2**32 - 1, 0xDF, 4))
#: Values longer than this on average are joined by ``bytes.join`` (a Python call per value
#: costs little beside their bytes) rather than scattered with numpy masks.
_JOIN_ABOVE = 2048


def _joined(
    heads: np.ndarray[Any, Any],
    used: np.ndarray[Any, Any],
    data: np.ndarray[Any, Any],
    offsets: np.ndarray[Any, Any],
    out_offsets: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    """The values of a ``Prefixed`` end to end: each header, then its payload."""
    n = len(used)
    lengths = np.diff(offsets)
    if n and (lengths == lengths[0]).all() and (used == used[0]).all():
        # One length (tokens, latents): a row per value, header then data.
        h, length = int(used[0]), int(lengths[0])
        rows = np.empty((n, h + length), dtype=_U8)
        rows[:, :h] = heads[:, :h]
        rows[:, h:] = data[offsets[0] : offsets[-1]].reshape(n, length)
        return rows.reshape(-1)
    if n and int(lengths.sum()) > _JOIN_ABOVE * n:
        view = data.data
        parts: list[Any] = []
        for i in range(n):
            parts.append(heads[i, : used[i]].tobytes())
            parts.append(view[offsets[i] : offsets[i + 1]])
        return np.frombuffer(b"".join(parts), dtype=_U8)
    out = np.empty(int(out_offsets[-1]), dtype=_U8)
    is_data = np.ones(len(out), dtype=bool)
    starts = out_offsets[:-1]
    for k in range(int(used.max(initial=0))):
        used_k = used > k
        where = starts[used_k] + k
        out[where] = heads[used_k, k]
        is_data[where] = False
    out[is_data] = data[offsets[0] : offsets[-1]]
    return out


def gather(buf: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], width: int) -> Any:
    """The ``width`` bytes at each of ``starts`` in ``buf`` (each start at most
    ``len(buf) - width``), one row each: read through an overlapping view of ``buf``, so the
    only index is the starts themselves (an index per byte took eight bytes per byte)."""
    rows = np.lib.stride_tricks.as_strided(
        buf, (len(buf) - width + 1, width), (1, 1), writeable=False
    )
    return rows[starts]


def encode_strings(data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> Encoded:
    """UTF-8 strings (checked by the caller), ``data[offsets[i]:offsets[i+1]]``."""
    heads, used = _headers(np.diff(offsets), _STR)
    return Prefixed(heads, used, data, offsets)


def encode_binary(data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> Encoded:
    heads, used = _headers(np.diff(offsets), _BIN)
    return Prefixed(heads, used, data, offsets)


def encode_scattered(
    data: np.ndarray[Any, Any],
    starts: np.ndarray[Any, Any],
    lengths: np.ndarray[Any, Any],
    text: bool,
) -> Encoded:
    """Bytes (or UTF-8 strings, checked by the caller: ``text``) found anywhere in ``data``:
    value ``i`` is ``data[starts[i]:starts[i] + lengths[i]]``."""
    heads, used = _headers(lengths, _STR if text else _BIN)
    return Prefixed(heads, used, data, starts, lengths)


def encode_lists(items: Encoded, offsets: np.ndarray[Any, Any]) -> Encoded:
    """Lists of the values of ``items``: list ``i`` holds items ``offsets[i]:offsets[i+1]``."""
    heads, used = _headers(np.diff(offsets), _ARRAY)
    ends = items.offsets[offsets]  # where each list's items start and end in items.data
    return Prefixed(heads, used, items.data, ends)


def _rowwise(columns: Sequence[Encoded]) -> Encoded:
    """Value ``i`` of each column, one after the other, as one value ``i``."""
    n = len(columns[0])
    sizes = [c.sizes for c in columns]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.sum(sizes, axis=0), out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=_U8)
    start = offsets[:-1].copy()
    for column, size in zip(columns, sizes, strict=True):
        first = column.offsets[0]
        body = column.data[first : column.offsets[-1]]
        shift = np.repeat(start - (column.offsets[:-1] - first), size)
        out[np.arange(len(body)) + shift] = body
        start += size
    return Encoded(out, offsets)


def encode_maps(keys: Sequence[str], values: Sequence[Encoded]) -> Encoded:
    """Dicts with the same keys in every row (a struct): value ``i`` of ``values[k]`` under
    ``keys[k]``."""
    n = len(values[0]) if values else 0
    heads, used = _headers(np.full(n, len(keys), dtype=np.int64), _MAP)
    encoder = ValueEncoder()
    parts: list[Encoded] = [Prefixed(heads, used, np.empty(0, _U8), np.zeros(n + 1, np.int64))]
    for key, column in zip(keys, values, strict=True):
        key_bytes = np.frombuffer(encoder.encode_plain(key), dtype=_U8)
        parts += [_even(np.tile(key_bytes, n), len(key_bytes), n), column]
    return _rowwise(parts)


def with_nulls(column: Encoded, valid: np.ndarray[Any, Any] | None) -> Encoded:
    """``column`` with nil where ``valid`` is false (those rows' own bytes dropped)."""
    if valid is None or valid.all():
        return column
    first = column.offsets[0]
    body = column.data[first : column.offsets[-1]]
    sizes = np.where(valid, column.sizes, 1)
    kept = body[np.repeat(valid, column.sizes)]
    kept_starts = np.zeros(len(valid) + 1, dtype=np.int64)
    np.cumsum(np.where(valid, column.sizes, 0), out=kept_starts[1:])
    data = np.insert(kept, kept_starts[:-1][~valid], NIL)
    offsets = np.zeros(len(valid) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return Encoded(data, offsets)


def check_sizes(column: Encoded, name: str, position: int) -> None:
    """Refuse a value larger than the format holds, naming its sample."""
    sizes = column.sizes
    if len(sizes) and int(sizes.max()) > MAX_VALUE_BYTES:
        i = int(np.argmax(sizes))
        raise EncodeError(
            f"sample {position + i}, key {name!r}: a value of {int(sizes[i])} bytes; the format "
            f"holds at most {MAX_VALUE_BYTES} bytes a value"
        )


def encode_numpy(values: np.ndarray[Any, Any], name: str, position: int) -> Encoded:
    """A numpy column: 1-d bool, int and float columns give bools, ints and floats (as an
    Arrow column does); a column of more dimensions gives each row as an array; any other
    1-d column gives ``values[i]``, as the dict path stores it."""
    kind = values.dtype.kind
    if values.ndim == 0:
        raise EncodeError(f"column {name!r}: a 0-d array is not a column of values")
    if values.ndim == 1 and values.dtype.byteorder not in "=|" and kind in "biuf":
        values = values.astype(values.dtype.newbyteorder("="))
    if values.ndim == 1 and kind == "b":
        return encode_bools(values)
    if values.ndim == 1 and kind in "iu":
        return encode_ints(values)
    if values.ndim == 1 and kind == "f" and values.dtype.itemsize <= 8:
        return encode_floats(values)
    if values.ndim > 1 and kind in "biufc" and not values.dtype.hasobject:
        return encode_arrays(values, name, position)
    if kind == "O":
        return encode_objects(list(values), name, position, ValueEncoder())
    return encode_objects((values[i] for i in range(len(values))), name, position, ValueEncoder())


def _is_arrow(obj: Any) -> bool:
    return type(obj).__module__.partition(".")[0] in ("pyarrow", "pandas")


def _is_hf(obj: Any) -> bool:
    """A Hugging Face ``datasets.Dataset`` or ``IterableDataset``, told by its module (so
    that asking does not import ``datasets``)."""
    return type(obj).__module__.partition(".")[0] == "datasets" and hasattr(obj, "with_format")


def is_columns(obj: Any) -> bool:
    """Whether ``obj`` is a table of samples (Arrow, pandas, a Hugging Face dataset, or
    columns encoded already by an importer), not a sample."""
    return _is_arrow(obj) or isinstance(obj, ColumnBatch) or _is_hf(obj)


def _check_names(names: Iterable[Any], where: str) -> tuple[str, ...]:
    out = tuple(names)
    for name in out:
        if type(name) is not str:
            raise EncodeError(f"{where}: column name {name!r} is not a str")
        try:
            name.encode()
        except UnicodeEncodeError:
            raise EncodeError(f"{where}: column name {name!r} is not valid UTF-8") from None
    if len(set(out)) != len(out):
        dupes = sorted({n for n in out if out.count(n) > 1})
        raise EncodeError(f"{where}: column names {dupes} appear more than once")
    return out


def dict_columns(columns: dict[Any, Any], position: int) -> ColumnBatch:
    """A dict of equal-length columns (lists, tuples, numpy arrays, Arrow arrays)."""
    names = _check_names(columns, "a dict of columns")
    lengths = {}
    for name, column in columns.items():
        if isinstance(column, list | tuple | np.ndarray) or _is_arrow(column):
            lengths[name] = len(column)
        elif _is_hf(column):
            raise EncodeError(
                f"a dict of datasets (a DatasetDict: a dataset per split) holds {name!r}: "
                f"append one of them, such as samples[{name!r}]"
            )
        else:
            raise EncodeError(
                f"a dict given as samples is a dict of columns (N values each: N samples), "
                f"but column {name!r} is a {type(column).__name__}, not a list or array; "
                "pass one sample as [sample]"
            )
    if len(set(lengths.values())) > 1:
        raise EncodeError(f"the columns of a dict of columns differ in length: {lengths}")
    n = next(iter(lengths.values()), 0)
    encoded = []
    encoder = ValueEncoder()
    for name in names:
        column = columns[name]
        if isinstance(column, np.ndarray):
            enc = encode_numpy(column, name, position)
        elif isinstance(column, list | tuple):
            enc = encode_objects(column, name, position, encoder)
        else:
            from . import arrow

            enc = arrow.encode_array(column, name, position)
        check_sizes(enc, name, position)
        encoded.append(enc)
    return ColumnBatch(names, tuple(encoded), n)


def as_columns(samples: Any, position: int = 0) -> Iterator[ColumnBatch] | None:
    """The column batches of ``samples``, or None when they are not columns (samples are
    then an iterable of dicts). An iterable whose first item is a table or batch is taken
    as a stream of them; a dict among them is a dict of columns."""
    if isinstance(samples, dict) or is_columns(samples):
        return _batches(iter([samples]), position)
    return None


def peek_columns(
    samples: Iterable[Any], position: int = 0
) -> tuple[Iterator[ColumnBatch] | None, Iterable[Any]]:
    """``as_columns`` for an iterable that may be a stream of tables: its first item is taken
    to find out, and put back in front of the rest when they are samples after all."""
    found = as_columns(samples, position)
    if found is not None or isinstance(samples, list | tuple):
        if isinstance(samples, list | tuple) and samples and is_columns(samples[0]):
            return _batches(iter(samples), position), samples
        return found, samples
    try:
        it = iter(samples)
    except TypeError:
        raise EncodeError(
            f"samples must be an iterable of dicts (or a table, or a dict of columns), not "
            f"{type(samples).__name__}"
        ) from None
    try:
        first = next(it)
    except StopIteration:
        return None, ()
    if is_columns(first):
        return _batches(_chain(first, it), position), ()
    return None, _chain(first, it)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    # Not a generator: closing one would close ``rest`` too (``yield from``), and a caller
    # that caught an EncodeError may go on with the same iterator.
    return itertools.chain((first,), rest)


def _batches(items: Iterator[Any], position: int) -> Iterator[ColumnBatch]:
    for item in items:
        if isinstance(item, dict):
            batch = dict_columns(item, position)
            position += batch.num_rows
            yield batch
            continue
        if isinstance(item, ColumnBatch):
            position += item.num_rows
            yield item
            continue
        from . import arrow

        if _is_hf(item):
            # Its rows in its order, a table at a time (``ds.data.table`` would ignore a
            # select, shuffle or filter), features as Arrow stores them.
            from . import hf

            tables = hf.arrow_tables(item)
        elif _is_arrow(item):
            tables = iter([item])
        else:
            raise EncodeError(
                f"an iterable of tables holds a {type(item).__name__} after {position} "
                "samples: give tables, record batches, data frames or dicts of columns only"
            )
        for table in tables:
            for batch in arrow.batches(table, position):
                position += batch.num_rows
                yield batch


def decoded(column: Encoded) -> list[Any]:
    """A column's values as the format reads them back (an Arrow column's as if appended)."""
    from .values import ValueDecoder

    decoder = ValueDecoder()
    data, offsets = column.data, column.offsets
    return [
        decoder.decode(data[int(offsets[i]) : int(offsets[i + 1])].tobytes())
        for i in range(len(column))
    ]


def plain_ints(values: list[Any]) -> np.ndarray[Any, Any] | None:
    """A list of Python ints that fit in 64 bits as an int64 array (encoded a column at a
    time, reading back as the same ints); None for any other list."""
    if not values or set(map(type, values)) != {int}:
        return None
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None


def column_rows(column: Any) -> list[Any] | None:
    """A column's values, one per row: a list or tuple as it is, a numpy array's rows as
    copies (its caller may reuse the buffer) and its scalars as Python values; None for
    anything else."""
    if isinstance(column, np.ndarray):
        if column.ndim == 1 and column.dtype.kind in "biuf":
            values: list[Any] = column.tolist()
            return values
        return [np.array(row) if isinstance(row, np.ndarray) else row for row in column]
    if isinstance(column, list | tuple):
        return list(column)
    return None


__all__ = [
    "ColumnBatch",
    "Encoded",
    "as_columns",
    "column_rows",
    "decoded",
    "peek_columns",
    "plain_ints",
]
