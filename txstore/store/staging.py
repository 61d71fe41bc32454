"""Staged transactions: many writers (threads, processes, hosts) write chunks, one commit.

    with store.transaction(message="crawl 2026-11-29") as txn:
        handle = txn.handle                      # small, JSON-serializable: send it anywhere
        ...                                      # elsewhere: StagedWriter(handle).write(...)
        txn.add(part)                            # each writer hands back a StagedPart
    # commit on exit: one version with every part, in the order added; nothing on error

Writers never touch the version chain: their chunks are invisible until the commit names them.
An abandoned transaction leaves only unreferenced chunks, which vacuum reclaims after its
grace period. Appends committed by others meanwhile are rebased over, as for ``append``.

A part handed over from elsewhere is checked as strictly as a document read from storage:
``StagedPart.from_json`` checks what it says (paths in ``chunks/``, counts, sizes), ``add``
reads back every file it names (size, footer checksum, digest, sample count). Only parts
checked so, and those this transaction's own writers made, are committed or deleted.
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import (
    ConflictError,
    CorruptError,
    NotFoundError,
    TransactionClosedError,
    TxstoreError,
)
from ..format.chunk import check_file
from ..format.manifest import ChunkRef
from ..format.staged import StagedPart, TransactionHandle, check_part, where_part
from ..storage import Storage, open_storage
from .context import StoreContext
from .history import Commit
from .writer import ChunkWriter

#: Threads that read back the chunks of a part handed over (S3 answers each slowly; more
#: would hold more whole chunks in memory at once).
_CHECK_THREADS = 4


def check_files(storage: Storage, parts: Sequence[StagedPart]) -> None:
    """Every file the ``parts`` name exists in ``storage`` as its part describes it: its size,
    the CRC-32 of its footer, the digest of the rest, and the footer's sample count;
    CorruptError otherwise. One read of each file, checked in one pass; the files of all the
    parts are read together, a few at a time."""
    files = [(where_part(part), chunk) for part in parts for chunk in part.chunks]

    def check(file: tuple[str, ChunkRef]) -> None:
        where, chunk = file
        at = f"{where}: chunk {storage.uri}/{chunk.path}"
        try:
            data = storage.read_buffer(chunk.path)
        except NotFoundError:
            raise CorruptError(f"{at} does not exist") from None
        layout = check_file(
            data,
            size=chunk.size,
            footer_offset=chunk.footer_offset,
            crc32_=chunk.crc32,
            digest=chunk.digest,
            where=at,
        )
        found = layout.block_starts[-1]
        if found != chunk.num_samples:
            raise CorruptError(f"{at} holds {found} samples, the part says {chunk.num_samples}")

    if len(files) <= 1:
        for file in files:
            check(file)
        return
    with ThreadPoolExecutor(max_workers=min(_CHECK_THREADS, len(files))) as pool:
        for _ in pool.map(check, files):  # raises the first failure
            pass


class StagedWriter:
    """Writes samples as chunks for a transaction; usable in any process that has the handle."""

    def __init__(self, handle: TransactionHandle, *, storage: Storage | None = None) -> None:
        """``storage``: the open storage of the handle's store to write through (an earlier
        writer's ``storage``), so that a process writing a part for transaction after
        transaction keeps one client and its connections rather than opening one per handle
        (on S3 that open costs more than a small part's writes); by default one is opened."""
        if storage is not None and storage.uri != handle.uri:
            raise ValueError(
                f"the storage given is of {storage.uri}, the handle's store is {handle.uri}"
            )
        self.handle = handle
        if storage is None:
            storage = open_storage(handle.uri, handle.storage_options or None)
        self._storage = storage
        self._writer = ChunkWriter(self._storage, handle.config)
        #: Told of the part ``finish`` makes (a transaction's own writers: see its ``writer``).
        self._on_finish: Callable[[StagedPart], None] | None = None

    @property
    def storage(self) -> Storage:
        """The storage this writer writes through (to give the next writer)."""
        return self._storage

    def write(self, samples: Iterable[dict[str, Any]]) -> None:
        self._writer.write(samples)

    def finish(self) -> StagedPart:
        chunks = self._writer.finish()
        part = StagedPart(
            staging_id=self.handle.staging_id,
            chunks=tuple(chunks),
            num_samples=self._writer.num_samples,
        )
        if self._on_finish is not None:
            self._on_finish(part)
        return part

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
        self,
        ctx: StoreContext,
        *,
        message: str | None = None,
        txn_id: str | None = None,
        handle: TransactionHandle | None = None,
    ) -> None:
        self._ctx = ctx
        self.message = message
        self.txn_id = txn_id
        ctx.ensure_writable()  # before any writer writes a part
        self._start = ctx.log.latest()  # what the transaction builds on
        if handle is not None and (
            handle.uri != ctx.storage.uri or handle.config != self._start.config
        ):
            raise ValueError(f"the handle was made for another store than {ctx.uri}")
        self.handle = handle or TransactionHandle(
            uri=ctx.storage.uri,
            storage_options=dict(ctx.storage.storage_options),
            config=self._start.config,
            staging_id=uuid.uuid4().hex,
        )
        self._parts: list[StagedPart] = []
        self._writers: list[weakref.ref[StagedWriter]] = []  # made here, in this process
        # Parts this transaction's own writers made (never handed over: not read back), and
        # the chunk paths of every part made here or checked by ``add``: the only files a
        # commit names or an abort deletes.
        self._own: list[StagedPart] = []
        self._known: set[str] = set()
        self._added: set[str] = set()  # chunk paths of the parts added
        self.result: Commit | None = None

    def writer(self) -> StagedWriter:
        writer = StagedWriter(self.handle, storage=self._ctx.storage)
        writer._on_finish = self._made
        self._writers.append(weakref.ref(writer))
        return writer

    def _made(self, part: StagedPart) -> None:
        self._own.append(part)
        self._known.update(c.path for c in part.chunks)

    def adopt(self, part: StagedPart) -> None:
        """Add a part a ``StagedWriter`` of this transaction's handle made in this process:
        checked as a document but not read back, and deleted by ``abort``."""
        if not isinstance(part, StagedPart) or part.staging_id != self.handle.staging_id:
            raise CorruptError(f"{where_part(part)} was not written for this transaction")
        self._made(part)
        self.add(part)

    def _check(self, parts: Sequence[StagedPart]) -> None:
        """Refuse a part not written for this transaction, or not as it says (CorruptError);
        the parts handed over have each of their files read back."""
        for part in parts:
            if not isinstance(part, StagedPart):
                raise TypeError(f"a StagedPart is needed, not {type(part).__name__}")
            if part.staging_id != self.handle.staging_id:
                raise CorruptError(f"{where_part(part)} was written for another transaction")
            check_part(part)
        check_files(self._ctx.storage, [p for p in parts if not any(p is own for own in self._own)])

    def _checked(self, part: StagedPart) -> bool:
        return all(c.path in self._known for c in part.chunks)

    def add(self, *parts: StagedPart) -> None:
        """Add parts to commit, in order; CorruptError (and none of them added) unless every
        one passes the check. Parts added together have their files read back together (a
        driver handed many parts at once: ``txn.add(*parts)``)."""
        self._check(parts)
        added: set[str] = set()
        for part in parts:
            paths = [c.path for c in part.chunks]
            if not (self._added.isdisjoint(paths) and added.isdisjoint(paths)):
                # committed twice, its samples would repeat
                raise CorruptError(f"{where_part(part)} names a chunk another part names already")
            added.update(paths)
        self._added.update(added)
        self._known.update(added)
        self._parts.extend(parts)

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

    def commit(self, *, replace: bool = False) -> Commit:
        """Commit every part added, in order, as one version: appended to the latest, or with
        ``replace`` as the store's whole content (a ConflictError if anything was committed
        since the transaction began; an append likewise refuses to land on a rollback)."""
        if self.result is not None:
            raise TransactionClosedError("this transaction is committed already")
        unchecked = [p for p in self._parts if not self._checked(p)]  # put without ``add``
        if unchecked:
            self._check(unchecked)
            self._known.update(c.path for p in unchecked for c in p.chunks)
        chunks = [c for part in self._parts for c in part.chunks]
        try:
            if replace:
                result = self._ctx.replace_chunks(
                    chunks,
                    start=self._start,
                    operation="overwrite",
                    message=self.message,
                    txn_id=self.txn_id,
                )
            else:
                result = self._ctx.append_chunks(
                    chunks, start=self._start, message=self.message, txn_id=self.txn_id
                )
        except ConflictError:
            self.abort()  # known not committed
            raise
        if not result.created:
            self.abort()  # the same txn_id landed before: these chunks are not needed
        self.result = Commit.from_manifest(result.manifest, result.attempts)
        return self.result

    def abort(self) -> None:
        """Abort this process's writers of the transaction that are still open and delete
        the chunks of the parts they made (only for a transaction not committed).

        The chunks of parts handed over by other processes are left for ``vacuum``: a part
        can name, correctly, a chunk that a committed version names too, and only vacuum,
        which reads every kept version, knows which files no version needs."""
        for ref in self._writers:
            writer = ref()
            if writer is not None and not writer.closed:
                writer.abort()
        self._writers.clear()
        storage = self._ctx.storage
        for part in self._parts:
            if any(part is own for own in self._own):
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


__all__ = [
    "StagedPart",
    "StagedWriter",
    "Transaction",
    "TransactionHandle",
    "check_files",
    "check_part",
]
