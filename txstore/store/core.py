"""The public API: create or open a store, append, snapshot, log, and operate it.

The operations live in their own modules (refs, lease, history, maintenance, compact,
verify); ``Store`` ties them to one storage, version log and clock.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from ..errors import (
    AlreadyExistsError,
    ConflictError,
    CorruptError,
    StorageError,
    StoreExistsError,
    StoreNotFoundError,
    TxstoreError,
    VersionNotFoundError,
)
from ..format import manifest as fmt
from ..format.manifest import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_COMPRESSION_LEVEL,
    Manifest,
    StoreConfig,
)
from ..format.units import parse_duration, parse_size
from ..storage import Storage, open_storage
from ..txn import RetryPolicy, VersionLog, ensure_safe, manifest_key
from ..txn.rules import first_manifest
from .compact import Compaction, CompactResult
from .context import StoreContext
from .fields import add_fields, drop_fields
from .history import Commit as Commit  # re-exported: txstore.store.Commit is public
from .history import Diff, RollbackBuild, diff
from .incremental import vacuum_incremental
from .lease import DEFAULT_TTL, Lease
from .maintenance import (
    ExpireReport,
    VacuumReport,
    expire,
    parse_grace,
    vacuum,
)
from .progress import Progress, ProgressArg
from .refs import LeaseInfo, TagInfo
from .segments import Segments
from .snapshot import ChunkReader, Snapshot
from .staging import Transaction, TransactionHandle
from .verify import VerifyReport, verify
from .views import Config
from .writer import ChunkWriter

#: A version number, or the name of a tag.
Ref = int | str


class Store:
    """A versioned dataset. Thread-safe; one instance per process is plenty."""

    def __init__(
        self,
        storage: Storage,
        *,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._ctx = StoreContext(storage, retry=retry, clock=clock)

    @property
    def uri(self) -> str:
        return self._ctx.storage.uri

    @property
    def storage(self) -> Storage:
        return self._ctx.storage

    @property
    def version(self) -> int:
        """The latest committed version, read fresh."""
        return self._ctx.log.latest_version()

    @property
    def config(self) -> Config:
        """The store's settings, fixed when it was created."""
        return Config.from_struct(self._ctx.log.latest().config)

    def __repr__(self) -> str:
        return f"<txstore.Store {self.uri}>"

    def snapshot(self, version: Ref | None = None) -> Snapshot:
        """A pinned, read-only view of ``version`` or a tag (default: the latest).

        Raises ``VersionNotFoundError``, ``TagNotFoundError``, or ``VersionExpiredError`` for
        a version ``expire`` expired (a snapshot opened before keeps reading until ``vacuum``
        deletes its files, a grace period after the expiry).
        """
        manifest = self._ctx.log.latest() if version is None else self._manifest(version)
        return self._ctx.snapshot(manifest)

    def commit_info(self, version: Ref | None = None) -> Commit:
        """The commit that made a version or tag (default: the latest), expired versions
        too: the history of commits is never deleted."""
        if version is None:
            return Commit.from_manifest(self._ctx.log.latest())
        return Commit.from_manifest(self._manifest(version, check_expired=False))

    def tag_info(self, name: str) -> TagInfo:
        """One tag; ``TagNotFoundError`` if there is none."""
        return TagInfo.from_doc(self._ctx.refs.tag(name))

    def _manifest(self, ref: Ref, *, check_expired: bool = True) -> Manifest:
        """The manifest of a version number or tag name; tagged versions never expire."""
        if isinstance(ref, str) and ref.isdigit():
            ref = int(ref)
        if isinstance(ref, str):
            tag = self._ctx.refs.tag(ref)
            manifest = self._ctx.log.read(tag.version)
            if manifest.commit_id != tag.commit_id:
                raise CorruptError(
                    f"tag {ref!r} of {self.uri} names version {tag.version} of another history "
                    f"(commit {tag.commit_id}, the version is commit {manifest.commit_id})"
                )
            return manifest
        if isinstance(ref, bool) or not isinstance(ref, int) or ref < 0:
            raise VersionNotFoundError(f"no version {ref!r} in {self.uri}")
        try:
            manifest = self._ctx.log.read(ref)
        except VersionNotFoundError:
            # Say what does exist: the usual mistake is a number past the end.
            latest = self._ctx.log.latest_version()
            raise VersionNotFoundError(
                f"version {ref} does not exist in {self.uri} (latest is {latest})"
            ) from None
        if check_expired:
            self._ctx.refs.check_retained(ref, self._ctx.clock())
        return manifest

    def log(self, limit: int | None = None) -> list[Commit]:
        """The commit history, newest first (``limit``: at most that many commits)."""
        if limit is not None and (type(limit) is not int or limit < 0):
            raise ValueError(f"limit must be a whole number of commits, not {limit!r}")
        latest = self._ctx.log.latest_version()
        stop = -1 if limit is None else max(-1, latest - limit)
        return [Commit.from_manifest(self._ctx.log.read_record(v)) for v in range(latest, stop, -1)]

    def append(
        self,
        samples: Iterable[dict[str, Any]],
        *,
        message: str | None = None,
        txn_id: str | None = None,
    ) -> Commit:
        """Commit ``samples`` as a new version after the latest.

        Streams: a generator of any size holds a few chunks in memory. With ``txn_id``, a
        transaction already committed under that id is returned and nothing is written.
        Raises ``EncodeError`` (naming the sample and key) and leaves the store unchanged when
        a sample cannot be stored, and ``ConflictError`` if a rollback was committed while it
        ran (nothing is committed: the caller decides whether the batch still belongs).
        """
        if txn_id is not None:
            existing = self._ctx.log.find_txn_record(txn_id, self._ctx.log.latest())
            if existing is not None:
                return Commit.from_manifest(existing, attempts=0)
        self._ctx.ensure_writable()  # before any chunk is written
        start = self._ctx.log.latest()
        config = start.config
        writer = ChunkWriter(self._ctx.storage, config)
        try:
            writer.write(samples)
            chunks = writer.finish()
        except BaseException:
            writer.abort()  # nothing references these chunks: nothing was committed
            raise
        try:
            result = self._ctx.append_chunks(chunks, start=start, message=message, txn_id=txn_id)
        except (ConflictError, CorruptError):
            # Every attempt read back as someone else's, or damage stopped the commit before
            # it wrote its manifest (a doubtful write is CommitStateUnknownError): ours never
            # landed.
            writer.abort()
            raise
        if not result.created:
            writer.abort()  # the same txn_id landed from elsewhere meanwhile
        return Commit.from_manifest(result.manifest, result.attempts)

    # -- staged writes and fields ----------------------------------------------------------

    def transaction(
        self,
        *,
        message: str | None = None,
        txn_id: str | None = None,
        handle: TransactionHandle | None = None,
    ) -> Transaction:
        """A staged transaction: writers anywhere add chunks, one commit (``with`` block).

        ``handle``: the handle parts were already written for (e.g. before this store was
        created); by default a new one."""
        return Transaction(self._ctx, message=message, txn_id=txn_id, handle=handle)

    def add_fields(
        self,
        fn: Callable[..., Any],
        fields: Iterable[str],
        *,
        inputs: Iterable[str] | None = None,
        missing_only: bool = False,
        replace: bool = False,
        batched: bool = False,
        batch_size: int | None = None,
        batch_format: str = "dict",
        num_workers: int = 0,
        message: str | None = None,
        progress: ProgressArg = False,
    ) -> Commit:
        """Commit a version whose samples also have ``fields`` computed by ``fn``, stored
        beside the chunks without rewriting them (see ``txstore.store.fields.add_fields``):
        ``inputs`` the fields ``fn`` reads, ``missing_only`` for the samples without them
        alone, ``replace`` to replace values samples have, ``batch_size`` for a dict of
        lists (or ``batch_format="arrow"``: a RecordBatch) per call. ``progress``: True shows
        it on stderr (see ``txstore.Progress``)."""
        return add_fields(
            self._ctx,
            fn,
            fields,
            inputs=inputs,
            missing_only=missing_only,
            replace=replace,
            batch_size=batch_size,
            batch_format=batch_format,
            batched=batched,
            num_workers=num_workers,
            message=message,
            progress=Progress.of(progress),
        )

    def drop_fields(self, fields: Iterable[str], *, message: str | None = None) -> Commit:
        """Commit a version without ``fields``; nothing is rewritten. ``FieldNotFoundError``
        (nothing committed) for a field no sample has."""
        return drop_fields(self._ctx, fields, message=message)

    # -- tags and leases -------------------------------------------------------------------

    def tag(
        self,
        name: str,
        version: Ref | None = None,
        *,
        message: str | None = None,
        force: bool = False,
    ) -> TagInfo:
        """Name ``version`` (default: the latest) ``name``; ``snapshot(name)`` opens it.

        A tagged version never expires. ``TagExistsError`` if the tag exists, unless ``force``
        moves it; ``VersionExpiredError`` for an expired version.
        """
        manifest = self._ctx.log.latest() if version is None else self._manifest(version)
        return TagInfo.from_doc(
            self._ctx.refs.put_tag(
                name, manifest, message=message, force=force, now=self._ctx.clock()
            )
        )

    def untag(self, name: str) -> TagInfo:
        """Delete a tag (``TagNotFoundError`` if there is none); returns what it was."""
        return TagInfo.from_doc(self._ctx.refs.delete_tag(name))

    def tags(self) -> dict[str, TagInfo]:
        """Every tag, by name."""
        return {t.name: TagInfo.from_doc(t) for t in self._ctx.refs.tags()}

    def lease(
        self, version: Ref | None = None, *, ttl: float | str | timedelta = DEFAULT_TTL
    ) -> Lease:
        """Pin ``version`` (default: the latest) against expiry and vacuum while a job runs.

        Renewed in the background every ttl/3; ``release()`` or leaving a ``with`` block
        deletes it, and a job that dies stops protecting the version one ttl later.
        """
        manifest = self._ctx.log.latest() if version is None else self._manifest(version)
        return Lease(self._ctx.refs, manifest, ttl=ttl, clock=self._ctx.clock)

    def leases(self) -> list[LeaseInfo]:
        """Every lease, lapsed ones included (``active`` tells them apart)."""
        now = self._ctx.clock()
        return sorted(
            (LeaseInfo.from_doc(i, r, now) for i, r in self._ctx.refs.leases()),
            key=lambda info: (info.version, info.expires_at),
        )

    # -- history ---------------------------------------------------------------------------

    def rollback(
        self, version: Ref, *, message: str | None = None, expected_version: int | None = None
    ) -> Commit:
        """Commit a new version whose samples are those of ``version`` (or a tag).

        History stays: the versions rolled over remain readable. ``expected_version`` is the
        latest version the caller looked at (default: the latest now); if anything else is
        committed first, nothing is committed and ``ConflictError`` is raised, so a racing
        append is never dropped silently.
        """
        target = self._manifest(version)
        seen = self._ctx.log.latest_version() if expected_version is None else expected_version
        if target.version == seen:
            raise ValueError(f"version {target.version} is the latest already")
        build = RollbackBuild(self._ctx, target, seen, message)
        result = self._ctx.commit(build)
        return Commit.from_manifest(result.manifest, result.attempts)

    def diff(self, a: Ref, b: Ref) -> Diff:
        """The commits between two versions and the samples ``b`` adds and removes vs ``a``."""
        return diff(
            self._ctx.log,
            self._manifest(a, check_expired=False).version,
            self._manifest(b, check_expired=False).version,
        )

    # -- retention, garbage collection, compaction, verification ---------------------------

    def expire(
        self,
        *,
        keep_last: int | None = None,
        older_than: float | str | timedelta | None = None,
        dry_run: bool = False,
    ) -> ExpireReport:
        """Expire versions but the last ``keep_last`` that are ``older_than`` (e.g. "30d").

        With both, a version must meet both to expire. The latest, tagged and leased versions
        never expire. Nothing is deleted: ``vacuum`` reclaims the space later.
        """
        age = None if older_than is None else parse_duration(older_than)
        return expire(
            self._ctx.log,
            self._ctx.refs,
            keep_last=keep_last,
            older_than=age,
            now=self._ctx.clock,
            dry_run=dry_run,
        )

    def expired_versions(self) -> set[int]:
        """The versions that are expired now (listed by ``expire``, not tagged or leased)."""
        retention, _ = self._ctx.refs.retention()
        if not retention.expired:
            return set()
        protected = self._ctx.refs.protection(self._ctx.clock())
        latest = self._ctx.log.latest_version()  # never expired, whatever the record says
        return {
            v
            for r in retention.expired
            for v in range(r.first, min(r.last, latest - 1) + 1)
            if v not in protected
        }

    def vacuum(
        self,
        *,
        grace: float | str | timedelta | None = None,
        dry_run: bool = False,
        progress: ProgressArg = None,
        incremental: bool = False,
    ) -> VacuumReport:
        """Delete files no kept version needs that are older than ``grace`` (default 7 days).

        Safe while others append, as long as ``grace`` exceeds the longest append or
        compaction: until they commit, their new files are named by no version.
        ``progress``: True shows it on stderr; a callback ``(stage, done, total)`` or a
        ``txstore.Progress`` also works (quiet by default). The ``txstore.store.maintenance``
        logger says what was deleted.

        ``incremental``: only the files versions stopped naming since the last incremental
        vacuum (its state is ``refs/vacuum.json``), at a cost proportional to what changed
        and what expired, not to the history; the first one reads the history once. It never
        finds files no version named (abandoned chunks, temp files, probes) nor lapsed
        leases: a full vacuum now and then does.
        """
        run = vacuum_incremental if incremental else vacuum
        return run(
            self._ctx.log,
            self._ctx.segments,
            self._ctx.refs,
            grace=parse_grace(grace),
            now=self._ctx.clock,
            dry_run=dry_run,
            progress=Progress.of(progress),
        )

    def compact(
        self,
        *,
        message: str | None = None,
        dry_run: bool = False,
        progress: ProgressArg = None,
    ) -> CompactResult:
        """Rewrite runs of undersized chunks into full ones, as a new version (operation
        "compact") with the same samples in the same order. Appends committed meanwhile are
        kept; anything else committed meanwhile raises ``ConflictError``. ``progress`` as
        for ``vacuum``."""
        return Compaction(self._ctx).run(
            message=message, dry_run=dry_run, progress=Progress.of(progress)
        )

    def verify(
        self, *, quick: bool = False, deep: bool = False, progress: ProgressArg = None
    ) -> VerifyReport:
        """Check the chain of versions, the refs, and every file unexpired versions need:
        present, the right size, and every byte against its checksums. ``quick`` reads only
        the metadata and each data file's footer; ``deep`` also decodes every sample.
        ``report.level`` says which. Reads storage, not this store's caches. Reports damage
        in ``problems``; never repairs. ``progress`` as for ``vacuum``."""

        def fresh_snapshot(version: int) -> Snapshot:
            manifest = self._ctx.log.read(version, fresh=True)
            storage = self._ctx.storage
            return Snapshot(manifest, storage, Segments(storage), ChunkReader(storage))

        return verify(
            self._ctx.log,
            self._ctx.segments,
            self._ctx.refs,
            fresh_snapshot,
            now=self._ctx.clock(),
            quick=quick,
            deep=deep,
            progress=Progress.of(progress),
        )

    def close(self) -> None:
        self._ctx.storage.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create(
    uri: str | os.PathLike[str] | Storage,
    *,
    chunk_bytes: int | str = DEFAULT_CHUNK_BYTES,
    block_bytes: int | str = DEFAULT_BLOCK_BYTES,
    compression: str | None = "zstd",
    compression_level: int = DEFAULT_COMPRESSION_LEVEL,
    storage_options: dict[str, Any] | None = None,
) -> Store:
    """Create an empty store (version 0); ``StoreExistsError`` if one exists there.

    ``chunk_bytes`` is the size chunks fill up to; ``block_bytes`` the unit of random access
    and compression inside a chunk; ``storage_options`` go to fsspec (endpoint, credentials).
    """
    if compression not in (None, "zstd"):
        raise ValueError(f"unknown compression {compression!r}; use 'zstd' or None")
    config = StoreConfig(
        chunk_bytes=parse_size(chunk_bytes),
        block_bytes=parse_size(block_bytes),
        compression=compression,  # type: ignore[arg-type]
        compression_level=compression_level,
    )
    storage = open_storage(uri, storage_options)
    ensure_safe(storage, time.time)  # version 0 is a commit too
    initial = first_manifest(config, commit_id=uuid.uuid4().hex, timestamp=time.time())
    log = VersionLog(storage)
    try:
        storage.put_if_absent(manifest_key(0), fmt.encode(initial))
    except AlreadyExistsError:
        raise StoreExistsError(f"a store exists at {storage.uri} already") from None
    except StorageError:
        try:
            ours = log.read(0).commit_id == initial.commit_id
        except TxstoreError:
            raise
        if not ours:
            raise StoreExistsError(f"a store exists at {storage.uri} already") from None
    log.advance_head(0)
    return Store(storage)


def open(
    uri: str | os.PathLike[str] | Storage, *, storage_options: dict[str, Any] | None = None
) -> Store:
    """Open an existing store; ``StoreNotFoundError`` if there is none."""
    store = Store(open_storage(uri, storage_options))
    store._ctx.log.find_store()  # raises StoreNotFoundError
    return store


def open_or_create(
    uri: str | os.PathLike[str] | Storage,
    *,
    storage_options: dict[str, Any] | None = None,
    **settings: Any,
) -> Store:
    """Open the store at ``uri``, or create it with ``settings`` (those of ``create``) if
    there is none; a store another process creates meanwhile is opened."""
    storage = open_storage(uri, storage_options)
    try:
        return open(storage)
    except StoreNotFoundError:
        pass
    try:
        return create(storage, **settings)
    except StoreExistsError:
        return open(storage)
