"""Staged transactions: many writers (threads, processes, hosts) write chunks, one commit.

    with store.transaction(message="crawl 2026-11-29") as txn:
        handle = txn.handle                      # small, JSON-serializable: send it anywhere
        ...                                      # elsewhere: StagedWriter(handle).write(...)
        txn.add(part)                            # each writer hands back a StagedPart
    # commit on exit: one version with every part, in the order added; nothing on error

Writers never touch the version chain: their chunks are invisible until the commit names them.
An abandoned transaction leaves only unreferenced chunks, which vacuum reclaims after its
grace period. Appends committed by others meanwhile are rebased over, as for ``append``.
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from collections.abc import Iterable
from typing import Any

import msgspec

from .errors import ConflictError, TxstoreError
from .format.manifest import ChunkRef, StoreConfig
from .storage import open_storage
from .store import Commit, Store
from .writer import ChunkWriter


class TransactionHandle(msgspec.Struct, frozen=True, kw_only=True):
    """What a remote writer needs: where the store is and how to write its chunks."""

    uri: str
    storage_options: dict[str, Any]
    config: StoreConfig
    staging_id: str

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> TransactionHandle:
        return msgspec.json.decode(data, type=cls)


class StagedPart(msgspec.Struct, frozen=True, kw_only=True):
    """Chunks one writer wrote for a transaction, in sample order."""

    staging_id: str
    chunks: tuple[ChunkRef, ...]
    num_samples: int

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> StagedPart:
        return msgspec.json.decode(data, type=cls)


class StagedWriter:
    """Writes samples as chunks for a transaction; usable in any process that has the handle."""

    def __init__(self, handle: TransactionHandle) -> None:
        self.handle = handle
        self._storage = open_storage(handle.uri, handle.storage_options or None)
        self._writer = ChunkWriter(self._storage, handle.config)

    def write(self, samples: Iterable[dict[str, Any]]) -> None:
        self._writer.write(samples)

    def finish(self) -> StagedPart:
        chunks = self._writer.finish()
        return StagedPart(
            staging_id=self.handle.staging_id,
            chunks=tuple(chunks),
            num_samples=self._writer.num_samples,
        )

    def abort(self) -> None:
        """Delete the chunks written so far (they were never committed)."""
        self._writer.abort()

    @property
    def closed(self) -> bool:
        """Finished or aborted."""
        return self._writer.closed


class Transaction:
    """One commit assembled from the chunks of many writers. Use as a context manager."""

    def __init__(
        self, store: Store, *, message: str | None = None, txn_id: str | None = None
    ) -> None:
        self.store = store
        self.message = message
        self.txn_id = txn_id
        self._start = store._log.latest()  # what the transaction builds on
        self.handle = TransactionHandle(
            uri=store.storage.uri,
            storage_options=dict(store.storage.storage_options),
            config=self._start.config,
            staging_id=uuid.uuid4().hex,
        )
        self._parts: list[StagedPart] = []
        self._writers: list[weakref.ref[StagedWriter]] = []  # made here, in this process
        self.result: Commit | None = None

    def writer(self) -> StagedWriter:
        writer = StagedWriter(self.handle)
        self._writers.append(weakref.ref(writer))
        return writer

    def add(self, part: StagedPart) -> None:
        if part.staging_id != self.handle.staging_id:
            raise TxstoreError("this part was written for another transaction")
        self._parts.append(part)

    def write(self, samples: Iterable[dict[str, Any]]) -> StagedPart:
        """Write ``samples`` here and add them: a convenience for one-process use."""
        writer = self.writer()
        try:
            writer.write(samples)
            part = writer.finish()
        except BaseException:
            writer.abort()
            raise
        self.add(part)
        return part

    @property
    def num_samples(self) -> int:
        return sum(p.num_samples for p in self._parts)

    def commit(self, *, replace: bool = False, operation: str = "append") -> Commit:
        """Commit every part added, in order, as one version: appended to the latest, or with
        ``replace`` as the store's whole content (a ConflictError if anything was committed
        since the transaction began; an append likewise refuses to land on a rollback)."""
        if self.result is not None:
            raise TxstoreError("this transaction is committed already")
        chunks = [c for part in self._parts for c in part.chunks]
        try:
            result = self.store.commit_chunks(
                chunks,
                start=self._start,
                message=self.message,
                txn_id=self.txn_id,
                operation=operation,
                replace=replace,
            )
        except ConflictError:
            self.abort()  # known not committed
            raise
        if not result.created:
            self.abort()  # the same txn_id landed before: these chunks are not needed
        self.result = Commit.from_manifest(result.manifest)
        return self.result

    def abort(self) -> None:
        """Delete the chunks of every part added, and abort this process's writers of it that
        are still open (only for a transaction not committed)."""
        for ref in self._writers:
            writer = ref()
            if writer is not None and not writer.closed:
                writer.abort()
        self._writers.clear()
        storage = self.store.storage
        for part in self._parts:
            for chunk in part.chunks:
                with contextlib.suppress(TxstoreError):
                    storage.delete(chunk.path)
        self._parts.clear()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            if self.result is None:
                self.commit()
        elif self.result is None:
            self.abort()


def transaction(
    store: Store, *, message: str | None = None, txn_id: str | None = None
) -> Transaction:
    return Transaction(store, message=message, txn_id=txn_id)
