"""Arrow in: the columns of tables and record batches as ``Encoded`` columns
(``columnar``), their buffers read with numpy (the mapping of types: the package's
docstring)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute

from ...errors import EncodeError
from .. import columnar as col
from ..columnar import ColumnBatch, Encoded
from ..values import MAX_DEPTH, ValueEncoder

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
    if isinstance(t, pa.BaseExtensionType):  # Arrow's own (fixed_shape_tensor) and Python's
        return _extension(arr, name, position)
    if pa.types.is_dictionary(t):
        return encode_array(arr.dictionary_decode(), name, position, depth)
    if pa.types.is_run_end_encoded(t):
        return encode_array(pyarrow.compute.run_end_decode(arr), name, position, depth)
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
        return encode_array(_list_view_as_list(arr), name, position, depth)
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


def _list_view_as_list(arr: Any) -> Any:
    """A list view as a large list of the same rows, its items gathered in row order. (Not
    through ``cast``: pyarrow 26 gives a list view ending in an empty list a last offset of
    0, a list array of negative length.)"""
    n = len(arr)
    valid = _valid(arr)
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    sizes = np.asarray(arr.sizes, dtype=np.int64)
    if valid is not None:
        sizes = np.where(valid, sizes, 0)
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if n else 0
    items = np.repeat(offsets - (ends - sizes), sizes) + np.arange(total, dtype=np.int64)
    values = arr.values.take(pa.array(items, pa.int64()))
    starts = pa.array(np.concatenate([np.zeros(1, np.int64), ends]), pa.int64())
    mask = None if valid is None else pa.array(~valid)
    return pa.LargeListArray.from_arrays(starts, values, mask=mask)


# Arrow's bool8 and json extension types (pyarrow 18 and 19; an empty tuple before them).
_BOOL8: Any = getattr(pa, "Bool8Type", ())
_JSON: Any = getattr(pa, "JsonType", ())


def _extension(arr: Any, name: str, position: int) -> Encoded:
    """Extension arrays of tensors: Arrow's fixed_shape_tensor and ones (such as Ray Data's)
    whose ``to_numpy`` gives the rows as arrays; any other extension type is refused."""
    t = arr.type
    values = None
    if isinstance(t, _BOOL8):  # bools stored as int8: any other than 0 is true
        return encode_array(arr.storage.cast(pa.bool_()), name, position)
    if isinstance(t, _JSON):  # JSON text: the text itself
        return encode_array(arr.storage, name, position)
    if isinstance(t, pa.FixedShapeTensorType):
        if arr.null_count:
            raise _refuse(name, t, ": a null tensor")
        values = arr.to_numpy_ndarray()
    elif isinstance(t, pa.ExtensionType) and type(arr).to_numpy is not pa.ExtensionArray.to_numpy:
        # a Python tensor type's own
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
