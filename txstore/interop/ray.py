"""Ray Data faces: write a dataset as one txstore commit, read a pinned snapshot.

    ds.write_datasink(TxstoreDatasink("s3://bucket/emb", storage_options=...))
    ray.data.read_datasource(TxstoreDatasource(store.snapshot(12)))

Each write task writes its own chunks for a staged transaction and returns a small JSON
description; the driver commits all of them as one version in ``on_write_complete``. A failed
job commits nothing (its chunks are left unreferenced for vacuum to reclaim). Blocks go both
ways as Arrow: a write task appends each block a column at a time, and a read task yields one
Arrow block per chunk (``Snapshot.to_batches``'s conversion).
Needs the ``ray`` extra: ``pip install 'txstore[ray]'``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ray.data import Datasink, Datasource, ReadTask
from ray.data.block import Block, BlockAccessor, BlockMetadata

from ..storage import open_storage
from ..store.core import Commit, open_or_create
from ..store.snapshot import ChunkReader, Snapshot
from ..store.staging import StagedPart, StagedWriter, Transaction, TransactionHandle

#: Chunks' worth of blocks each write task is given at least.
TASK_CHUNKS = 2


def _tables(blocks: Iterable[Block]) -> Iterator[Any]:
    """Each block as an Arrow table (a pandas block through Ray's own conversion); Ray's
    tensor columns are extension arrays whose rows the columnar append takes as arrays."""
    for block in blocks:
        yield BlockAccessor.for_block(block).to_arrow()


class TxstoreDatasink(Datasink[str]):
    """Writes a Ray dataset to a store (created if absent) as one new version."""

    def __init__(
        self,
        uri: str,
        *,
        storage_options: dict[str, Any] | None = None,
        message: str | None = None,
        txn_id: str | None = None,
        **create_settings: Any,
    ) -> None:
        store = open_or_create(uri, storage_options=storage_options, **create_settings)
        self._txn: Transaction | None = store.transaction(message=message, txn_id=txn_id)
        self._handle = self._txn.handle.to_json()
        self._chunk_bytes = self._txn.handle.config.chunk_bytes
        self.result: Commit | None = None

    @property
    def min_bytes_per_write(self) -> int:
        # A write task writes its own chunks and ends with a part-filled one, and each task
        # costs Ray tens of milliseconds to schedule: given two chunks' worth of blocks at
        # least (with the default 64 MiB chunks, Ray's largest default block), a task writes
        # full chunks, at most a third of them part-filled, not one small chunk a block.
        return TASK_CHUNKS * self._chunk_bytes

    def __getstate__(self) -> dict[str, Any]:
        # Write tasks need only the handle, never the driver's store and transaction.
        return {**self.__dict__, "_txn": None}

    def write(self, blocks: Iterable[Block], ctx: Any) -> str:
        writer = StagedWriter(TransactionHandle.from_json(self._handle))
        try:
            writer.write(_tables(blocks))
            return writer.finish().to_json().decode()
        except BaseException:
            writer.abort()
            raise

    def on_write_complete(self, write_result: Any) -> None:
        assert self._txn is not None, "on_write_complete runs on the driver"
        # All together: their files are read back at once, a few at a time.
        self._txn.add(*(StagedPart.from_json(part) for part in write_result.write_returns))
        self.result = self._txn.commit()

    def get_name(self) -> str:
        return "Txstore"


class TxstoreDatasource(Datasource):
    """Reads one pinned snapshot: a read task per group of chunks, rows as samples."""

    def __init__(self, snapshot: Snapshot, *, fields: list[str] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        # Arrow blocks hold a null where a sample lacks a field, as Snapshot.to_batches does.
        self._snapshot = snapshot if fields is None else snapshot.select(fields, missing=None)

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(c.size for c in self._snapshot.chunk_refs())

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        chunks = self._snapshot.chunk_refs()
        if not chunks:
            return []
        groups = max(1, min(parallelism, len(chunks)))
        storage = self._snapshot.storage
        uri, options = storage.uri, dict(storage.storage_options)
        version, fields = self._snapshot.version, self._snapshot.fields
        tasks = []
        for g in range(groups):
            mine = chunks[g * len(chunks) // groups : (g + 1) * len(chunks) // groups]
            if not mine:
                continue

            def read(mine: list[Any] = mine) -> Iterator[Block]:
                reader = ChunkReader(open_storage(uri, options or None))
                for chunk in mine:
                    yield reader.table(reader.fetch(chunk, version, fields, columns=True), chunk)

            meta = BlockMetadata(
                num_rows=sum(c.num_samples for c in mine),
                size_bytes=sum(c.size for c in mine),
                input_files=None,
                exec_stats=None,
            )
            tasks.append(ReadTask(read, meta, per_task_row_limit=per_task_row_limit))
        return tasks

    def get_name(self) -> str:
        return "Txstore"


__all__ = ["TxstoreDatasink", "TxstoreDatasource"]
