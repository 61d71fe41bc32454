"""Hugging Face ``datasets`` views of a snapshot's Arrow tables, and the Arrow tables of a
dataset appended (the one module that imports ``datasets``; the ``hf`` extra). No I/O here:
the tables come from the caller."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import datasets
from datasets.table import InMemoryTable

#: Given chunk numbers, the ``pyarrow.Table`` of each, in that order.
TablesOf = Callable[[list[int]], Iterable[Any]]
#: Rows per table when a dataset is appended: a slice of its table where it has no indices
#: (no copy), a gather of those rows where it has (after ``select``, ``shuffle``...), so
#: about ``APPEND_BYTES`` of them at most, and at most ``APPEND_ROWS``; a streamed dataset,
#: whose row size is not known ahead, ``STREAMED_ROWS``.
APPEND_BYTES = 64 << 20
APPEND_ROWS = 16_384
STREAMED_ROWS = 1024


def rows_per_table(ds: Any) -> int:
    """How many rows of ``ds`` to append a table at a time."""
    data: Any = getattr(ds, "data", None)  # a Dataset's table beneath; none when streamed
    rows = int(getattr(data, "num_rows", 0) or 0)
    if not rows:
        return STREAMED_ROWS
    per_row = max(1, int(data.nbytes) // rows)
    return max(1, min(APPEND_ROWS, APPEND_BYTES // per_row))


def arrow_tables(ds: Any) -> Iterator[Any]:
    """The rows of a Hugging Face dataset as ``pyarrow.Table``s, in its order: its rows as
    ``ds[i]`` gives them, after any ``select``, ``shuffle`` or ``filter`` (``ds.data.table``
    is the table beneath, all of its rows in their first order). Columns as Arrow stores
    them: an ``Image`` or ``Audio`` feature is its ``{bytes, path}`` struct, not decoded."""
    return iter(ds.with_format("arrow").iter(batch_size=rows_per_table(ds)))


def in_memory(table: Any) -> Any:
    """A ``datasets.Dataset`` over one in-memory ``pyarrow.Table`` (no copy of its columns)."""
    return datasets.Dataset(InMemoryTable(table))


def _rows(chunks: list[int], tables_of: TablesOf) -> Iterator[dict[str, Any]]:
    for table in tables_of(chunks):
        yield from table.to_pylist()


def streaming(tables_of: TablesOf, num_chunks: int) -> Any:
    """A ``datasets.IterableDataset`` reading a chunk at a time, each chunk a shard: a
    DataLoader's workers (and ``split_dataset_by_node``) each take a share of the chunks, and
    ``shuffle`` shuffles their order."""
    return datasets.IterableDataset.from_generator(
        _rows, gen_kwargs={"chunks": list(range(num_chunks)), "tables_of": tables_of}
    )
