"""Tables and record batches: joining, slicing, casting to a schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa


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


def unify(schemas: list[Any]) -> Any:
    """The schema that holds tables of each of ``schemas`` (a column of nulls only takes
    its type from the others)."""
    return pa.unify_schemas(schemas, promote_options="permissive")


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


def is_arrow(obj: Any) -> bool:
    return isinstance(obj, pa.RecordBatch | pa.Table)
