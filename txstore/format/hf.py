"""Hugging Face ``datasets`` views of a snapshot's Arrow tables (the one module that imports
``datasets``; the ``hf`` extra). No I/O here: the tables come from the caller."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import datasets
from datasets.table import InMemoryTable

#: Given chunk numbers, the ``pyarrow.Table`` of each, in that order.
TablesOf = Callable[[list[int]], Iterable[Any]]


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
