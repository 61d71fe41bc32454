"""The public API: create or open a store, append, snapshot, log."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .errors import (
    AlreadyExistsError,
    ConflictError,
    StorageError,
    StoreExistsError,
    TxstoreError,
    VersionNotFoundError,
)
from .format import manifest as fmt
from .format.manifest import Manifest, StoreConfig
from .segments import Segments
from .snapshot import ChunkReader, Snapshot
from .storage import Storage, open_storage
from .txn import RetryPolicy, VersionLog, commit, manifest_key
from .writer import ChunkWriter

DEFAULT_CHUNK_BYTES = 64 * 2**20
DEFAULT_BLOCK_BYTES = 64 * 2**10
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


def parse_size(size: int | str) -> int:
    """Bytes from an int or a string such as "64MB" or "256KiB"."""
    if isinstance(size, int):
        value = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", size)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"cannot read {size!r} as a size (e.g. 64MB, 256KiB)")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return value


@dataclass(frozen=True)
class Commit:
    """One entry of a store's history."""

    version: int
    num_samples: int  # samples added by this commit
    total_samples: int  # samples in the version it made
    timestamp: datetime
    message: str | None
    operation: str
    txn_id: str | None
    commit_id: str

    @classmethod
    def from_manifest(cls, m: Manifest) -> Commit:
        return cls(
            version=m.version,
            num_samples=m.added_samples,
            total_samples=m.num_samples,
            timestamp=datetime.fromtimestamp(m.timestamp, tz=timezone.utc),
            message=m.message,
            operation=m.operation,
            txn_id=m.txn_id,
            commit_id=m.commit_id,
        )


class Store:
    """A versioned dataset. Thread-safe; one instance per process is plenty."""

    def __init__(self, storage: Storage, *, retry: RetryPolicy | None = None) -> None:
        self._storage = storage
        self._log = VersionLog(storage)
        self._segments = Segments(storage)
        self._reader = ChunkReader(storage)
        self._retry = retry or RetryPolicy()

    @property
    def uri(self) -> str:
        return self._storage.uri

    @property
    def storage(self) -> Storage:
        return self._storage

    @property
    def version(self) -> int:
        """The latest committed version, read fresh."""
        return self._log.latest_version()

    @property
    def config(self) -> StoreConfig:
        return self._log.latest().config

    def __repr__(self) -> str:
        return f"<txstore.Store {self.uri}>"

    def snapshot(self, version: int | None = None) -> Snapshot:
        """A pinned, read-only view of ``version`` (default: the latest)."""
        if version is None:
            manifest = self._log.latest()
        else:
            if isinstance(version, bool) or not isinstance(version, int) or version < 0:
                raise VersionNotFoundError(f"no version {version!r} in {self.uri}")
            manifest = self._log.read(version)
        return Snapshot(manifest, self._storage, self._segments, self._reader)

    def log(self, limit: int | None = None) -> list[Commit]:
        """The commit history, newest first."""
        latest = self._log.latest_version()
        stop = -1 if limit is None else max(-1, latest - limit)
        return [Commit.from_manifest(self._log.read(v)) for v in range(latest, stop, -1)]

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
        a sample cannot be stored.
        """
        if txn_id is not None:
            existing = self._log.find_txn(txn_id, self._log.latest())
            if existing is not None:
                return Commit.from_manifest(existing)
        config = self._log.latest().config
        writer = ChunkWriter(self._storage, config)
        try:
            writer.write(samples)
            chunks = writer.finish()
        except BaseException:
            writer.abort()  # nothing references these chunks: nothing was committed
            raise
        added = writer.num_samples
        new_segment = self._segments.write(chunks) if chunks else None
        commit_id = uuid.uuid4().hex

        def build(parent: Manifest) -> Manifest:
            segments = parent.segments
            if new_segment is not None:
                segments = self._segments.append(segments, new_segment)
            return Manifest(
                version=parent.version + 1,
                parent=parent.version,
                commit_id=commit_id,
                txn_id=txn_id,
                operation="append",
                timestamp=time.time(),
                message=message,
                num_samples=parent.num_samples + added,
                added_samples=added,
                config=parent.config,
                segments=segments,
            )

        try:
            result = commit(self._log, build, txn_id=txn_id, policy=self._retry)
        except ConflictError:
            writer.abort()  # every attempt read back as someone else's: ours never landed
            raise
        if not result.created:
            writer.abort()  # the same txn_id landed from elsewhere meanwhile
        return Commit.from_manifest(result.manifest)

    def close(self) -> None:
        self._storage.close()

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
    compression_level: int = 3,
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
    initial = Manifest(
        version=0,
        parent=None,
        commit_id=uuid.uuid4().hex,
        operation="create",
        timestamp=time.time(),
        message="create store",
        num_samples=0,
        added_samples=0,
        config=config,
        segments=(),
    )
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
    storage = open_storage(uri, storage_options)
    VersionLog(storage).latest_version()  # raises StoreNotFoundError
    return Store(storage)
