"""Arrow in and out: the one place pyarrow is used (the ``arrow`` extra).

In: a column of an Arrow table becomes an ``Encoded`` column (``columnar``), its buffers read
with numpy. Every Arrow type that has a txstore value maps to it exactly:

| Arrow | txstore value |
|---|---|
| int8 … int64, uint8 … uint64 | int |
| float16, float32, float64 | float (the same value) |
| bool | bool |
| string, large_string, string_view | str |
| binary, large_binary, binary_view, fixed_size_binary | bytes |
| list, large_list, list_view of any of these | list |
| fixed_size_list of ints, floats or bools (nested: more dimensions) | numpy array |
| fixed_size_list of anything else | list |
| fixed_shape_tensor | numpy array of its shape |
| struct | dict (its fields, in order) |
| map with string keys | dict |
| dictionary | its values' value |
| null (and a null of any type) | None |

Others (timestamps, dates, times, durations, decimals, unions, maps with other keys, unknown
extension types) have no txstore value and are refused with ``EncodeError`` naming the column
and the type.

Out: ``frame_array`` turns a frame's values into an Arrow array (``Snapshot.to_batches``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute

from ..errors import CorruptError, EncodeError, TxstoreError
from . import columnar as col
from .chunk import FLAG_SPARSE
from .columnar import ColumnBatch, Encoded
from .values import ABSENT, MAX_DEPTH, ValueEncoder

msgspec_errors = (msgspec.DecodeError,)

_NUMERIC = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)


def _numeric(t: pa.DataType) -> bool:
    return any(test(t) for test in _NUMERIC)


def _valid(arr: pa.Array) -> np.ndarray[Any, Any] | None:
    if arr.null_count == 0:
        return None
    mask: np.ndarray[Any, Any] = arr.is_valid().to_numpy(zero_copy_only=False)
    return mask


def _leaf_numpy(arr: pa.Array) -> np.ndarray[Any, Any]:
    """An int, float or bool array's values (nulls as zeros: the caller replaces them)."""
    if arr.null_count:
        arr = arr.fill_null(False if pa.types.is_boolean(arr.type) else 0)
    out: np.ndarray[Any, Any] = arr.to_numpy(zero_copy_only=False)
    return out


def _offsets(arr: pa.Array, wide: bool) -> np.ndarray[Any, Any]:
    """The offsets of a string, binary or list array's rows (of a slice: its own rows)."""
    kind = np.int64 if wide else np.int32
    whole = np.frombuffer(arr.buffers()[1], dtype=kind)
    return whole[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)


def _refuse(name: str, t: pa.DataType, why: str = "") -> EncodeError:
    return EncodeError(
        f"column {name!r}: the Arrow type {t} has no txstore value{why} (see docs/arrow.md "
        "for the types that map)"
    )


def _fixed_shape(arr: pa.Array, name: str) -> np.ndarray[Any, Any] | None:
    """A (nested) fixed_size_list of numbers as an array ``(n, *shape)``, or None when its
    items are not numbers. Nulls inside refuse it: an array has no place for them."""
    shape: list[int] = []
    cur = arr
    while pa.types.is_fixed_size_list(cur.type):
        size = cur.type.list_size
        shape.append(size)
        child = cur.values.slice(cur.offset * size, len(cur) * size)
        if cur is not arr and cur.null_count:
            raise _refuse(name, arr.type, ": a null inside an array")
        cur = child
    if not _numeric(cur.type):
        return None
    if cur.null_count:
        raise _refuse(name, arr.type, ": a null inside an array")
    values: np.ndarray[Any, Any] = cur.to_numpy(zero_copy_only=False)
    return values.reshape(len(arr), *shape)


def encode_array(arr: Any, name: str, position: int, depth: int = 0) -> Encoded:
    """An Arrow array (or chunked array) as an encoded column; EncodeError names ``name`` (a
    path such as ``"meta.tags[]"`` inside nested types) and the type it refuses."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if depth > MAX_DEPTH:
        raise EncodeError(f"column {name!r}: nested deeper than {MAX_DEPTH} levels")
    t = arr.type
    n = len(arr)
    if isinstance(t, pa.ExtensionType):
        return _extension(arr, name, position)
    if pa.types.is_dictionary(t):
        return encode_array(arr.dictionary_decode(), name, position, depth)
    if pa.types.is_null(t):
        return col.nulls(n)
    valid = _valid(arr)
    if pa.types.is_boolean(t):
        return col.with_nulls(col.encode_bools(_leaf_numpy(arr)), valid)
    if pa.types.is_integer(t):
        return col.with_nulls(col.encode_ints(_leaf_numpy(arr)), valid)
    if pa.types.is_floating(t):
        return col.with_nulls(col.encode_floats(_leaf_numpy(arr)), valid)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        wide = pa.large_string() if pa.types.is_string_view(t) else pa.large_binary()
        return encode_array(arr.cast(wide), name, position, depth)
    if pa.types.is_fixed_size_binary(t):
        return encode_array(arr.cast(pa.large_binary()), name, position, depth)
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if text or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        if text:
            try:
                arr.validate(full=True)  # UTF-8, as the format requires of a str
            except pa.ArrowInvalid as e:
                raise EncodeError(f"column {name!r}: {e}") from None
        offsets = _offsets(arr, pa.types.is_large_string(t) or pa.types.is_large_binary(t))
        buffer = arr.buffers()[2]
        data = (
            np.frombuffer(buffer, dtype=np.uint8) if buffer is not None else np.empty(0, np.uint8)
        )
        encode = col.encode_strings if text else col.encode_binary
        return col.with_nulls(encode(data, offsets), valid)
    if pa.types.is_fixed_size_list(t):
        shaped = _fixed_shape(arr, name)
        if shaped is not None:
            if valid is not None:
                shaped = shaped.copy()
            return col.with_nulls(col.encode_arrays(shaped, name, position), valid)
        size = t.list_size
        items = encode_array(
            arr.values.slice(arr.offset * size, n * size), f"{name}[]", position, depth + 1
        )
        offsets = np.arange(n + 1, dtype=np.int64) * size
        return col.with_nulls(col.encode_lists(items, offsets), valid)
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return encode_array(arr.cast(pa.large_list(t.value_type)), name, position, depth)
    if pa.types.is_map(t):
        return _maps(arr, name, position)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = _offsets(arr, pa.types.is_large_list(t))
        first, last = int(offsets[0]), int(offsets[-1])
        items = encode_array(
            arr.values.slice(first, last - first), f"{name}[]", position, depth + 1
        )
        return col.with_nulls(col.encode_lists(items, offsets - first), valid)
    if pa.types.is_struct(t):
        keys = [t.field(i).name for i in range(t.num_fields)]
        if len(set(keys)) != len(keys):
            raise _refuse(name, t, ": a struct with a field name twice")
        fields = arr.flatten()  # the fields of these rows (a sliced struct's own rows)
        values = [
            encode_array(f, f"{name}.{k}", position, depth + 1)
            for k, f in zip(keys, fields, strict=True)
        ]
        return col.with_nulls(col.encode_maps(keys, values), valid)
    raise _refuse(name, t)


def _extension(arr: Any, name: str, position: int) -> Encoded:
    """Extension arrays of tensors: Arrow's fixed_shape_tensor and ones (such as Ray Data's)
    whose ``to_numpy`` gives the rows as arrays; any other extension type is refused."""
    t = arr.type
    values = None
    if isinstance(t, pa.FixedShapeTensorType):
        if arr.null_count:
            raise _refuse(name, t, ": a null tensor")
        values = arr.to_numpy_ndarray()
    elif type(arr).to_numpy is not pa.ExtensionArray.to_numpy:  # a tensor type's own
        values = arr.to_numpy(zero_copy_only=False)
    if isinstance(values, np.ndarray) and values.dtype.kind in "biufc" and values.ndim > 1:
        return col.encode_arrays(np.ascontiguousarray(values), name, position)
    if isinstance(values, np.ndarray) and values.dtype.kind == "O" and values.ndim == 1:
        return col.encode_objects(list(values), name, position, ValueEncoder())
    raise _refuse(name, t)


def _maps(arr: Any, name: str, position: int) -> Encoded:
    """A map with string keys, as dicts (a Python object per value: maps are rare)."""
    t = arr.type
    if not (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)):
        raise _refuse(name, t, ": only maps with string keys are dicts")
    rows: list[dict[str, Any] | None] = []
    for i, pairs in enumerate(arr.to_pylist()):
        if pairs is None:
            rows.append(None)
            continue
        row = dict(pairs)
        if len(row) != len(pairs):
            raise EncodeError(f"sample {position + i}, key {name!r}: a map with a key twice")
        rows.append(row)
    return col.encode_objects(rows, name, position, ValueEncoder())


def _table(obj: Any) -> Any:
    """A pyarrow Table or RecordBatch for ``obj`` (pandas goes through Arrow's converter)."""
    if isinstance(obj, pa.Table | pa.RecordBatch):
        return obj
    if type(obj).__module__.partition(".")[0] == "pandas" and hasattr(obj, "columns"):
        try:
            return pa.Table.from_pandas(obj, preserve_index=False)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise EncodeError(f"a DataFrame Arrow cannot convert: {e}") from None
    if isinstance(obj, pa.RecordBatchReader):
        return obj
    raise EncodeError(
        f"{type(obj).__module__}.{type(obj).__qualname__} is not a table of samples: give a "
        "pyarrow Table, RecordBatch or RecordBatchReader, or a pandas DataFrame"
    )


def batches(obj: Any, position: int = 0) -> Iterator[ColumnBatch]:
    """The samples of a table, record batch, batch reader or data frame, a batch at a time."""
    table = _table(obj)
    names = col._check_names(table.schema.names, "an Arrow table")
    parts = [table] if isinstance(table, pa.RecordBatch) else table.to_batches()
    for batch in parts:
        if batch.num_rows == 0:
            continue
        columns = []
        for name, column in zip(names, batch.columns, strict=True):
            encoded = encode_array(column, name, position)
            col.check_sizes(encoded, name, position)
            columns.append(encoded)
        yield ColumnBatch(names, tuple(columns), batch.num_rows)
        position += batch.num_rows


# -- out: frames to Arrow arrays -------------------------------------------------------------


def _int_bytes(body: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], width: int) -> Any:
    """The ``width`` bytes after each value's tag, as rows."""
    return body[starts[:, None] + np.arange(1, 1 + width)]


#: MessagePack int tags with a payload: (tag, big-endian numpy type).
_INT_TAGS = {
    0xCC: ">u1",
    0xCD: ">u2",
    0xCE: ">u4",
    0xCF: ">u8",
    0xD0: ">i1",
    0xD1: ">i2",
    0xD2: ">i4",
    0xD3: ">i8",
}
_STR_TAGS = {0xD9: 1, 0xDA: 2, 0xDB: 4}
#: The MessagePack tags of ints and floats with a payload, and the payload's numpy type.
_NUMBER_TAGS = {
    **{tag: np.dtype(kind) for tag, kind in _INT_TAGS.items()},
    0xCA: np.dtype(">f4"),
    0xCB: np.dtype(">f8"),
}
_BIN_TAGS = {0xC4: 1, 0xC5: 2, 0xC6: 4}


def _lengths(
    body: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], tags: np.ndarray[Any, Any], kinds: Any
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
    """Header and data lengths of str or bin values (``kinds``: tag -> bytes of length)."""
    hlen = np.ones(len(starts), dtype=np.int64)
    length = np.zeros(len(starts), dtype=np.int64)
    fix = (tags >= 0xA0) & (tags <= 0xBF) if kinds is _STR_TAGS else np.zeros(len(tags), bool)
    length[fix] = tags[fix] & 0x1F
    covered = fix.copy()
    for tag, width in kinds.items():
        rows = tags == tag
        if rows.any():
            raw = _int_bytes(body, starts[rows], width)
            length[rows] = raw.view(f">u{width}").reshape(-1).astype(np.int64)
            hlen[rows] = 1 + width
            covered |= rows
    if not covered.all():
        return None
    return hlen, length


def _fast_array(
    body: np.ndarray[Any, Any],
    starts: np.ndarray[Any, Any],
    ends: np.ndarray[Any, Any],
    decoder: Any,
) -> pa.Array | None:
    """The values of a column with numpy, when they are all ints, floats, bools, strs, bytes
    or numpy arrays of one dtype and shape (with nils as nulls); else None."""
    n = len(starts)
    if n == 0:
        return None
    tags = body[starts]
    valid = tags != 0xC0
    nulls = not valid.all()
    mask = None if not nulls else ~valid
    if nulls:
        if not valid.any():
            return pa.nulls(n)
        starts_v, ends_v, tags_v = starts[valid], ends[valid], tags[valid]
    else:
        starts_v, ends_v, tags_v = starts, ends, tags
    first = int(tags_v[0])

    def full(values: np.ndarray[Any, Any], fill: Any) -> np.ndarray[Any, Any]:
        if not nulls:
            return values
        out = np.full(n, fill, dtype=values.dtype)
        out[valid] = values
        return out

    if first <= 0x7F or first >= 0xE0 or first in _INT_TAGS:
        values = np.zeros(len(starts_v), dtype=np.int64)
        small = (tags_v <= 0x7F) | (tags_v >= 0xE0)
        values[small] = tags_v[small].astype(np.int8)
        covered = small.copy()
        for tag, kind in _INT_TAGS.items():
            rows = tags_v == tag
            if rows.any():
                raw = _int_bytes(body, starts_v[rows], int(kind[2]))
                got = raw.copy().view(kind).reshape(-1)
                if tag == 0xCF and int(got.max()) > 2**63 - 1:
                    return None  # beyond int64: pyarrow chooses
                values[rows] = got.astype(np.int64)
                covered |= rows
        widths = np.where(small, 1, 0)
        for tag, kind in _INT_TAGS.items():
            widths[tags_v == tag] = 1 + int(kind[2])
        if not covered.all() or not (widths == ends_v - starts_v).all():
            return None
        return pa.array(full(values, 0), mask=mask)
    if first in (0xCA, 0xCB):
        values = np.zeros(len(starts_v), dtype=np.float64)
        covered = np.zeros(len(starts_v), dtype=bool)
        for tag, kind in ((0xCA, ">f4"), (0xCB, ">f8")):
            rows = tags_v == tag
            if rows.any():
                width = int(kind[2])
                if not (ends_v[rows] - starts_v[rows] == 1 + width).all():
                    return None
                raw = _int_bytes(body, starts_v[rows], width)
                values[rows] = raw.copy().view(kind).reshape(-1)
                covered |= rows
        if not covered.all():
            return None
        return pa.array(full(values, 0.0), mask=mask)
    if first in (0xC2, 0xC3):
        if not np.isin(tags_v, (0xC2, 0xC3)).all() or not (ends_v - starts_v == 1).all():
            return None
        return pa.array(full(tags_v == 0xC3, False), mask=mask)
    if 0xA0 <= first <= 0xBF or first in _STR_TAGS or first in _BIN_TAGS:
        kinds = _BIN_TAGS if first in _BIN_TAGS else _STR_TAGS
        found = _lengths(body, starts_v, tags_v, kinds)
        if found is None:
            return None
        hlen, length = found
        if not (hlen + length == ends_v - starts_v).all():
            return None
        # The bytes of the values (not of the nils, nor between frames), less headers; values
        # of one length without nils were read by _uniform_array. A value has at least its
        # tag, so starts (and ends) are distinct and one fancy add each marks them.
        marks = np.zeros(len(body) + 1, dtype=np.int64)
        marks[starts] += 1
        marks[ends] -= 1
        keep = np.cumsum(marks[:-1]) > 0
        keep[starts[~valid]] = False
        for k in range(int(hlen.max())):
            rows = hlen > k
            keep[starts_v[rows] + k] = False
        data = body[keep]
        lengths = np.zeros(n, dtype=np.int64)
        lengths[valid] = length
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        large = offsets[-1] > 2**31 - 1
        kind = (
            (pa.large_binary() if large else pa.binary())
            if kinds is _BIN_TAGS
            else (pa.large_string() if large else pa.string())
        )
        bitmap = None if mask is None else pa.array(valid).buffers()[1]
        return pa.Array.from_buffers(
            kind,
            n,
            [
                bitmap,
                pa.py_buffer(offsets.astype(np.int64 if large else np.int32)),
                pa.py_buffer(data),
            ],
            null_count=int(n - valid.sum()),
        )
    if first in (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8) and not nulls:
        sizes = ends - starts
        if not (sizes == sizes[0]).all():
            return None
        one = decoder.decode(body[starts[0] : ends[0]])
        if type(one) is not np.ndarray:
            return None
        prefix = int(sizes[0]) - one.nbytes
        rows = body[starts[:, None] + np.arange(int(sizes[0]))]
        if not (rows[:, :prefix] == rows[0, :prefix]).all():
            return None
        dtype = one.dtype.newbyteorder("=") if one.dtype.byteorder == ">" else one.dtype
        values = np.ascontiguousarray(rows[:, prefix:]).view(one.dtype).astype(dtype)
        return _tensor(values.reshape(-1), (n, *one.shape))
    return None


def _tensor(flat: np.ndarray[Any, Any], shape: tuple[int, ...]) -> pa.Array:
    """``flat`` as rows of shape ``shape[1:]``: (nested) fixed_size_lists."""
    arr: pa.Array = pa.array(flat)
    for size in reversed(shape[1:]):
        arr = pa.FixedSizeListArray.from_arrays(arr, size)
    return arr


def _arrow_value(value: Any) -> Any:
    """A value as pyarrow's converter takes it: arrays and tensors as nested lists."""
    kind = type(value)
    if kind is dict:
        return {k: _arrow_value(v) for k, v in value.items()}
    if kind is list:
        return [_arrow_value(v) for v in value]
    if kind.__module__.startswith("torch"):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def py_array(values: list[Any], name: str) -> pa.Array:
    """Python values (None for a sample without the field) as one Arrow array: numpy arrays
    of one dtype and shape as (nested) fixed_size_lists; otherwise pyarrow's inference."""
    present = [v for v in values if v is not None]
    if present and all(type(v) is np.ndarray for v in present):
        first = present[0]
        if all(v.dtype == first.dtype and v.shape == first.shape for v in present) and (
            first.ndim >= 1 and first.dtype.kind in "biuf"
        ):
            filled = [v if v is not None else np.zeros_like(first) for v in values]
            arr = _tensor(np.stack(filled).reshape(-1), (len(values), *first.shape))
            if len(present) < len(values):
                valid = pa.array([v is not None for v in values])
                arr = pa.FixedSizeListArray.from_arrays(
                    arr.values, arr.type.list_size, mask=pa.compute.invert(valid)
                )
            return arr
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    if present and all(type(v) is int and v >= 0 for v in present):  # past int64
        return pa.array(values, pa.uint64())
    try:
        return pa.array([_arrow_value(v) for v in values])
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
        raise EncodeError(f"column {name!r}: its values have no one Arrow type ({e})") from None


#: The MessagePack tags a value of bytes, str or a numpy array starts with.
_SIZED_TAGS = frozenset(
    [*range(0xA0, 0xC0), 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, *range(0xD4, 0xDC)]
)


def _uniform_array(frames: list[tuple[int, memoryview | None, bool]], decoder: Any) -> Any:
    """A column whose values all have one encoded size and the same leading bytes (bytes or
    strs of one length, numpy arrays of one dtype and shape: images, latents, token windows;
    ints or floats of one MessagePack width, as a columnar append writes them),
    with each value's bytes copied once, block by block, from the frames into the Arrow
    buffer; None for any other column. A header gives the type and length of its value, so
    rows of one size that each start with the first value's header are each such a value,
    one after the other, and the first value decoded stands for all."""
    size = -1
    blocks = []
    for n, raw, _ in frames:
        assert raw is not None
        if n == 0:
            continue
        table = len(raw) - 4 * n
        if table < 0:
            return None
        head = int.from_bytes(raw[table : table + 4], "little")  # the first value's offset
        span = table - head
        if size < 0:
            size = span // n
        if size <= 0 or span != size * n:
            return None
        blocks.append(np.frombuffer(raw, dtype=np.uint8, count=span, offset=head).reshape(n, size))
    return _rows_array(blocks, decoder)


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
    heads = data[tables[:, None] + np.arange(4)].view("<u4").reshape(-1).astype(np.int64)
    spans = tables - offsets - heads
    size = int(spans[0]) // int(n[0])
    if size <= 0 or (heads < 1).any() or (spans != size * n).any():
        return None
    starts = (offsets + heads).tolist()
    blocks = [
        data[start : start + rows * size].reshape(rows, size)
        for start, rows in zip(starts, counts, strict=True)
    ]
    return _rows_array(blocks, decoder)


def _rows_array(blocks: list[np.ndarray[Any, Any]], decoder: Any) -> Any:
    """The column of ``blocks`` (each a block's values, a row per value, all rows of one
    size): see ``_uniform_array``."""
    if not blocks:
        return None
    first = blocks[0][0]
    if int(first[0]) not in _SIZED_TAGS and int(first[0]) not in _NUMBER_TAGS:
        return None
    size = len(first)
    try:
        one = decoder.decode(first)
    except (*msgspec_errors, TxstoreError):  # values of other sizes: the general path says
        return None
    kind = type(one)
    number = _NUMBER_TAGS.get(int(first[0])) if kind is int or kind is float else None
    if kind is bytes or kind is str:
        payload = len(one) if kind is bytes else len(one.encode())
    elif kind is np.ndarray and one.dtype.kind in "biuf":
        payload = one.nbytes
    elif number is not None:  # ints or floats all of one width: a tag, then big-endian bytes
        payload = number.itemsize
    else:
        return None
    skip = size - payload
    if skip <= 0 or payload == 0:
        return None
    if number is not None:
        return _numbers_array(blocks, first[:skip], number)
    if not (np.concatenate([rows[:, :skip] for rows in blocks]) == first[:skip]).all():
        return None
    total = sum(len(rows) for rows in blocks)
    # Into a buffer of Arrow's memory pool, which keeps the pages a dropped batch freed for
    # the next one: a fresh numpy array of this size is a new mapping, faulted in page by
    # page, each chunk of a scan.
    buffer = pa.allocate_buffer(total * payload)
    out = np.frombuffer(buffer, dtype=np.uint8).reshape(total, payload)
    np.concatenate([rows[:, skip:] for rows in blocks], out=out)
    if kind is np.ndarray:
        values = out.reshape(-1).view(one.dtype)
        if one.dtype.byteorder == ">":
            values = values.astype(one.dtype.newbyteorder("="))
        return _tensor(values, (total, *one.shape))
    large = total * payload > 2**31 - 1
    offsets_out = np.arange(total + 1, dtype=np.int64 if large else np.int32) * payload
    if kind is bytes:
        arrow_type = pa.large_binary() if large else pa.binary()
    else:
        arrow_type = pa.large_string() if large else pa.string()
    buffers = [None, pa.py_buffer(offsets_out), buffer]
    return pa.Array.from_buffers(arrow_type, total, buffers, null_count=0)


def _numbers_array(
    blocks: list[np.ndarray[Any, Any]], head: np.ndarray[Any, Any], number: np.dtype[Any]
) -> Any:
    """``_rows_array`` of ints or floats of one width: each row ``head`` (a tag), then the
    number big-endian. Read through a record view of the rows (a field of 1 to 8 bytes at a
    stride of 2 to 9): numpy copies narrow rows of a 2-d array a byte at a time."""
    record = np.dtype([("head", np.uint8, (len(head),)), ("value", number)])
    views = [np.ascontiguousarray(rows).reshape(-1).view(record) for rows in blocks]
    if not (np.concatenate([view["head"] for view in views]) == head).all():
        return None
    got = np.concatenate([view["value"] for view in views])
    if number.kind == "f":
        return pa.array(got.astype(np.float64))
    if number == np.dtype(">u8") and len(got) and int(got.max()) > 2**63 - 1:
        return None  # beyond int64: the general path says
    return pa.array(got.astype(np.int64))


def _locate_values(
    frames: list[tuple[int, memoryview | None, bool]],
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
    """The frames joined, and where each value starts and ends in them, from each frame's
    table of offsets (its last 4 bytes per value), for all blocks at once; None if a table
    points outside its frame's values."""
    raws = [raw for _, raw, _ in frames]
    counts = np.array([n for n, _, _ in frames], dtype=np.int64)
    sizes = np.array([len(raw) for raw in raws], dtype=np.int64)  # type: ignore[arg-type]
    joined = np.frombuffer(b"".join(raws), dtype=np.uint8)  # type: ignore[arg-type]
    frame_starts = np.zeros(len(raws), dtype=np.int64)
    np.cumsum(sizes[:-1], out=frame_starts[1:])
    tables = frame_starts + sizes - 4 * counts  # where each frame's table starts
    if (tables < frame_starts).any():
        return None
    block = np.repeat(np.arange(len(raws)), counts)
    firsts = np.cumsum(counts) - counts  # the number of each block's first value
    entry = tables[block] + 4 * (np.arange(len(block)) - firsts[block])
    offsets = joined[entry[:, None] + np.arange(4)].view("<u4").reshape(-1).astype(np.int64)
    starts = frame_starts[block] + offsets
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    filled = counts > 0
    ends[(firsts + counts - 1)[filled]] = tables[filled]  # a block's last value ends at its table
    if ((starts < frame_starts[block]) | (ends > tables[block]) | (ends < starts)).any():
        return None
    return joined, starts, ends


def column_array(
    frames: list[tuple[int, memoryview | None, bool]], name: str, decoder: Any
) -> pa.Array:
    """One column of a chunk's blocks: per block its sample count and its frame's raw bytes
    (None where the block has no such column) and whether the frame is sparse."""
    if all(raw is not None and not sparse for _, raw, sparse in frames):
        uniform = _uniform_array(frames, decoder)
        if uniform is not None:
            return uniform
        located = _locate_values(frames)
        if located is None:
            raise CorruptError("a frame's offset table points outside its values")
        body, all_starts, ends = located
        found = _fast_array(body, all_starts, ends, decoder)
        if found is not None:
            return found
    values: list[Any] = []
    for n, raw, sparse in frames:
        if raw is None:
            values += [None] * n
            continue
        table = len(raw) - 4 * n
        got = decoder.decode_sparse(raw[:table]) if sparse else decoder.decode_list(raw[:table])
        if sparse:
            got = [None if v is ABSENT else v for v in got]
        values += got
    return py_array(values, name)


def empty_table(num_rows: int) -> pa.Table:
    """A table of ``num_rows`` rows and no columns (a chunk without the fields asked for)."""
    return pa.table({"_": pa.nulls(num_rows)}).drop_columns(["_"])


def table_of(names: list[str], arrays: list[pa.Array]) -> pa.Table:
    return pa.Table.from_arrays(arrays, names=names)


def concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of the same columns, or of columns of types one can hold all of (a column of
    nulls only, a column some lack), one after the other."""
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")


def rebatch(tables: Iterator[pa.Table], batch_size: int | None) -> Iterator[pa.RecordBatch]:
    """Record batches of ``batch_size`` rows (the last may be shorter) from a stream of
    tables; with None, a batch per table."""
    if batch_size is None:
        for table in tables:
            yield from table.combine_chunks().to_batches()
        return
    pending: list[pa.Table] = []
    held = 0
    for table in tables:
        pending.append(table)
        held += table.num_rows
        while held >= batch_size:
            merged = concat(pending)
            yield merged.slice(0, batch_size).combine_chunks().to_batches()[0]
            rest = merged.slice(batch_size)
            pending, held = ([rest] if rest.num_rows else []), rest.num_rows
    if held:
        yield concat(pending).combine_chunks().to_batches()[0]


def cast(table: Any, schema: Any) -> Any:
    """``table`` in ``schema``'s column order and types (a column it lacks: nulls)."""
    if schema is None:
        return table
    n = table.num_rows
    arrays = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type)
        for f in schema
    ]
    if isinstance(table, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    return pa.Table.from_arrays(arrays, schema=schema)


# -- Parquet (the importer and exporter read and write it here, through pyarrow) ----------


def parquet_row_groups(file: Any, where: str) -> int:
    """How many row groups a Parquet file (a local path or a seekable binary file object)
    has."""
    return len(_parquet_fragment(file, where).split_by_row_group())


def parquet_row_group(file: Any, number: int, columns: list[str] | None, where: str) -> pa.Table:
    """Row group ``number`` of a Parquet file as a table (``columns``: only those),
    read through ``pyarrow.dataset``: only that group's pages (of those columns) are read."""
    fragment = _parquet_fragment(file, where).split_by_row_group()[number]
    try:
        return fragment.to_table(columns=columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptError(f"{where}, row group {number}: {e}") from e
    except KeyError as e:
        raise EncodeError(f"{where}: no column {e} (columns=...)") from e


def _parquet_fragment(file: Any, where: str) -> Any:
    """``file``: a local path (read by Arrow's own file system, several times faster than
    through a Python file object) or a seekable binary file object."""
    import pyarrow.dataset as ds
    from pyarrow import fs as arrow_fs

    try:
        if isinstance(file, str):
            local = arrow_fs.LocalFileSystem(use_mmap=True)
            fragment = ds.ParquetFileFormat().make_fragment(file, filesystem=local)
        else:
            fragment = ds.ParquetFileFormat().make_fragment(pa.PythonFile(file, mode="r"))
        fragment.ensure_complete_metadata()
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptError(f"{where}: not a Parquet file: {e}") from e
    return fragment


def ipc_table(data: bytes | memoryview, where: str) -> pa.Table:
    """An Arrow IPC file (or stream), checked whole: its buffers are views of ``data``."""
    source = pa.py_buffer(data)
    try:
        if bytes(data[:6]) == b"ARROW1":
            table = pa.ipc.open_file(source).read_all()
        else:
            table = pa.ipc.open_stream(source).read_all()
        # Offsets within their buffers, strings UTF-8: to_pylist and the column encoders
        # trust both (a bad offset raised SystemError, a bad string UnicodeDecodeError).
        table.validate(full=True)
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptError(f"{where}: a bad Arrow IPC block: {e}") from e
    return table


def ipc_rows(data: bytes | memoryview, where: str) -> list[dict[str, Any]]:
    """The rows of an Arrow IPC file (or stream) as dicts, as ``to_pylist`` gives them."""
    rows: list[dict[str, Any]] = ipc_table(data, where).to_pylist()
    return rows


def _as_rows(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` reads back from txstore as ``to_pylist`` gives it
    (a fixed-size list would come back as an array, a map as a dict, a float16 as float)."""
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return True
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        return True
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _as_rows(t.value_type)
    if pa.types.is_struct(t):
        return all(_as_rows(t.field(k).type) for k in range(t.num_fields))
    return False


def row_batches(table: pa.Table) -> list[ColumnBatch] | None:
    """A table's rows encoded a column at a time, exactly as their ``to_pylist`` dicts
    would be; None when a column's type does not read back so (or there are none)."""
    if table.num_columns == 0 or not all(_as_rows(f.type) for f in table.schema):
        return None
    parts = len(table.to_batches())
    if parts > 1 and table.nbytes < min(_SMALL_BATCH * parts, 1 << 30):
        # Record batches of a few hundred small rows (LitData's): one copy into a batch of
        # the whole table costs less than a column batch each.
        table = table.combine_chunks()
    return list(batches(table))


#: Record batches smaller than this on average are joined before they are encoded (into
#: one of at most 1 GiB: a binary column's offsets are 32-bit).
_SMALL_BATCH = 4 << 20


def parquet_bytes(table: Any) -> bytes:
    """A table as one Parquet file's bytes."""
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    out: bytes = sink.getvalue().to_pybytes()
    return out


def unify(schemas: list[Any]) -> Any:
    """The schema that holds tables of each of ``schemas`` (a column of nulls only takes
    its type from the others)."""
    return pa.unify_schemas(schemas, promote_options="permissive")


__all__ = [
    "batches",
    "column_array",
    "encode_array",
    "ipc_rows",
    "ipc_table",
    "parquet_bytes",
    "parquet_row_group",
    "parquet_row_groups",
    "py_array",
    "rebatch",
    "row_batches",
    "unify",
]


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
    from .frames import Ranges, frame_raw

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


def input_table(table: pa.Table, names: list[str] | None) -> pa.Table:
    """A chunk's table with only the columns ``names`` (None: all), in that order; one the
    chunk lacks as nulls."""
    if names is None:
        return table
    have, n = set(table.column_names), table.num_rows
    return pa.table({name: table.column(name) if name in have else pa.nulls(n) for name in names})


def rows_batch(table: pa.Table, start: int, stop: int) -> pa.RecordBatch:
    """Rows [start, stop) of a table as one RecordBatch."""
    piece = table.slice(start, stop - start).combine_chunks()
    batches = piece.to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=piece.schema)


def record_batch(names: list[str], columns: list[list[Any]]) -> pa.RecordBatch:
    """Python values by column (None for a sample without the field) as one RecordBatch,
    typed as ``Snapshot.to_batches`` types them."""
    arrays = [py_array(values, name) for name, values in zip(names, columns, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def is_arrow(obj: Any) -> bool:
    return isinstance(obj, pa.RecordBatch | pa.Table)
