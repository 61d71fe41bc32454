"""Arrow in and out.

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

Out: ``chunk_table`` makes a chunk's samples a table (``Snapshot.to_batches``, ``to_arrow``),
``column_array`` a column's frames an array, ``py_array`` Python values one.

The modules: ``encode`` (in), ``arrays`` and ``chunks`` (out), ``tables`` (joining, slicing,
casting), ``files`` (Parquet and Arrow IPC). This package is the one place pyarrow is used
(the ``arrow`` extra).
"""

from .arrays import column_array, py_array, record_batch
from .chunks import chunk_table
from .encode import batches, encode_array, row_batches
from .files import ipc_rows, ipc_table, parquet_bytes, parquet_row_group, parquet_row_groups
from .tables import (
    cast,
    concat,
    empty_table,
    input_table,
    is_arrow,
    rebatch,
    rows_batch,
    table_of,
    unify,
)

__all__ = [
    "batches",
    "cast",
    "chunk_table",
    "column_array",
    "concat",
    "empty_table",
    "encode_array",
    "input_table",
    "ipc_rows",
    "ipc_table",
    "is_arrow",
    "parquet_bytes",
    "parquet_row_group",
    "parquet_row_groups",
    "py_array",
    "rebatch",
    "record_batch",
    "row_batches",
    "rows_batch",
    "table_of",
    "unify",
]
