"""What every operation on one open store shares, and the one way written chunks become a
version: appended after the latest, or as the whole content of the version after another."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from ..format.manifest import ChunkRef, Manifest, SegmentRef
from ..storage import Storage
from ..txn import Build, CommitResult, RetryPolicy, VersionLog, commit, ensure_safe
from ..txn.rules import Rebase, next_manifest
from .refs import Refs
from .segments import Segments
from .snapshot import ChunkReader, Snapshot

#: Seconds since the epoch.
Clock = Callable[[], float]


class StoreContext:
    """One open store's storage, caches, retry policy and clock.

    The store's operations (fields, staged transactions, compaction, history) take this
    rather than the ``Store``, so they sit below it and the ``Store`` is their one caller.
    """

    def __init__(
        self, storage: Storage, *, retry: RetryPolicy | None = None, clock: Clock | None = None
    ) -> None:
        self.storage = storage
        self.log = VersionLog(storage)
        self.segments = Segments(storage)
        self.reader = ChunkReader(storage)
        self.refs = Refs(self.log)
        self.retry = retry or RetryPolicy()
        #: The time for manifests, expiry and leases; tests may shift it.
        self.clock: Clock = clock or time.time
        self._safe = False  # the backend check passed (or was on record) for this handle

    @property
    def uri(self) -> str:
        return self.storage.uri

    def snapshot(self, manifest: Manifest) -> Snapshot:
        return Snapshot(manifest, self.storage, self.segments, self.reader)

    def ensure_writable(self) -> None:
        """The backend check (``txn.safety``), once per open store: called before a writer
        writes its first chunk, and by every commit. ``UnsafeStorageError`` if it fails."""
        if not self._safe:
            ensure_safe(self.storage, self.clock)
            self._safe = True

    def commit(self, build: Build, *, txn_id: str | None = None) -> CommitResult:
        """Run the commit loop with this store's retry policy."""
        self.ensure_writable()
        return commit(self.log, build, txn_id=txn_id, policy=self.retry)

    def next_manifest(
        self,
        parent: Manifest,
        *,
        operation: str,
        commit_id: str,
        segments: tuple[SegmentRef, ...],
        num_samples: int,
        message: str | None = None,
        txn_id: str | None = None,
        source_version: int | None = None,
    ) -> Manifest:
        """``rules.next_manifest`` stamped with this store's clock."""
        return next_manifest(
            parent,
            operation=operation,
            commit_id=commit_id,
            timestamp=self.clock(),
            segments=segments,
            num_samples=num_samples,
            message=message,
            txn_id=txn_id,
            source_version=source_version,
        )

    def append_chunks(
        self,
        chunks: Sequence[ChunkRef],
        *,
        start: Manifest,
        message: str | None = None,
        txn_id: str | None = None,
    ) -> CommitResult:
        """Commit ``chunks`` after the latest version, rebased over what ``append`` may be
        (``HistoryChangedError`` otherwise: nothing is committed, the caller decides)."""
        added = sum(c.num_samples for c in chunks)
        rebase = Rebase(self.log, start.version, "append")
        commit_id = uuid.uuid4().hex

        def build(parent: Manifest) -> Manifest:
            rebase.check(parent)
            kept = self.segments.extend(parent.segments, chunks)
            return self.next_manifest(
                parent,
                operation="append",
                commit_id=commit_id,
                segments=kept,
                num_samples=parent.num_samples + added,
                message=message,
                txn_id=txn_id,
            )

        return self.commit(build, txn_id=txn_id)

    def replace_chunks(
        self,
        chunks: Sequence[ChunkRef],
        *,
        start: Manifest,
        operation: str,
        message: str | None = None,
        txn_id: str | None = None,
    ) -> CommitResult:
        """Commit ``chunks`` as the whole content of the version right after ``start``
        (``HistoryChangedError`` if anything was committed since: nothing is committed)."""
        segments = self.segments.write_all(chunks)
        total = sum(c.num_samples for c in chunks)
        rebase = Rebase(self.log, start.version, operation, allowed=frozenset())
        commit_id = uuid.uuid4().hex

        def build(parent: Manifest) -> Manifest:
            rebase.check(parent)
            return self.next_manifest(
                parent,
                operation=operation,
                commit_id=commit_id,
                segments=segments,
                num_samples=total,
                message=message,
                txn_id=txn_id,
            )

        return self.commit(build, txn_id=txn_id)
