"""Chunks of a remote store kept in a local folder, for the epochs that read them again.

The folder is laid out like the store (``chunks/<id>.chunk``), so versions that share chunks
share its files: chunk files never change once written. A chunk missing from it is downloaded
as parts over several connections at once (``PART_SIZE`` each, up to the storage's
``max_in_flight``): one connection's bandwidth, not the whole link's, is what bounds a single
GET of 64 MiB. Each part is written into a new file in the folder as it arrives, so a chunk is
never whole in memory and no buffer is joined from its parts; the file is mapped, checked once
(the chunk's digest), decoded and handed out, and published under its name once checked.
Processes sharing the folder (DataLoader workers) take a lock per file while they fetch it,
so a chunk two of them need is downloaded once. The folder is a cache: a file that cannot be
written there is left out (and downloaded again when next needed), with a warning, rather than
failing the read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

from ..errors import ChecksumError, CorruptError, MissingDataError, NotFoundError, StorageError
from ..format.manifest import ChunkFile, ChunkRef, chunk_files
from ..storage.local import LocalStorage, Staged
from .maintenance import is_temp
from .snapshot import ChunkReader, Fetched

logger = logging.getLogger(__name__)

#: The size of each ranged GET of a chunk being downloaded.
PART_SIZE = 8 * 2**20
#: Lock files the folder's fetches share (a file's lock is picked by a hash of its name).
_LOCKS = 64
#: How long a fetch waits on another process's lock before downloading the file itself.
_LOCK_TIMEOUT = 120.0
#: A download's part file untouched this long is a killed worker's (a live download writes
#: it part by part): removed when a cache opens the folder.
STALE_PART_S = 3600.0


def part_ranges(size: int, part_size: int = PART_SIZE) -> list[tuple[int, int]]:
    """[start, end) of each part of an object of ``size`` bytes."""
    return [(start, min(size, start + part_size)) for start in range(0, size, part_size)] or [
        (0, 0)
    ]


def parts_around(
    size: int, skip: tuple[int, int], part_size: int = PART_SIZE
) -> list[tuple[int, int]]:
    """``part_ranges`` of an object of ``size`` bytes but the bytes [start, end) of ``skip``."""
    start, end = skip
    before = part_ranges(start, part_size) if start else []
    after = part_ranges(size - end, part_size) if end < size else []
    return before + [(end + a, end + b) for a, b in after]


@dataclass(frozen=True)
class Head:
    """Bytes [start, end) of a chunk file that its reader fetches itself, to hand out its first
    samples before the whole file is in: the download skips them and writes them in place
    once ``data`` resolves (to those bytes, or to the reader's failure, which the fetch then
    raises)."""

    path: str
    start: int
    end: int
    data: Future[bytes]


class ChunkCache:
    """The local copies of a remote store's chunks, at most ``max_bytes`` of finished ones.

    ``fetch`` gives what ``ChunkReader.fetch`` gives for all fields, from the folder where
    a chunk is there and from the remote store where not; ``release`` says a chunk is
    finished with, after which it may be evicted (oldest finished first) to keep the folder
    under ``max_bytes``. With ``copy_reads``, files are read into memory rather than mapped:
    views handed out of a mapped file (a zero-copy snapshot's) would keep its disk space
    after eviction.
    """

    def __init__(
        self, remote: ChunkReader, folder: str, max_bytes: int, copy_reads: bool = False
    ) -> None:
        self.remote = remote
        self.local = LocalStorage(folder)
        self._reader = ChunkReader(self.local)
        self._max_bytes = max_bytes
        self._copy_reads = copy_reads
        self._finished: list[str] = []
        self._remove_stale_parts()

    @property
    def folder(self) -> str:
        return self.local.root

    def _remove_stale_parts(self) -> None:
        now = time.time()
        try:
            for info in self.local.list("chunks/"):
                if is_temp(info.key) and now - info.mtime > STALE_PART_S:
                    self.local.delete(info.key)
        except StorageError as e:
            logger.warning("cache folder not cleaned: %s", e)

    def holds(self, chunk: ChunkRef) -> bool:
        """Whether every file of ``chunk`` is in the folder already (False where the folder
        cannot tell: ``fetch`` then finds out)."""
        try:
            return all(self.local.exists(src.path) for src in chunk_files(chunk))
        except StorageError:
            return False

    def fetch(self, chunk: ChunkRef, version: int, head: Head | None = None) -> Fetched:
        """The chunk, from the folder or downloaded; ``head``: bytes of it a reader is
        fetching itself, which the download takes from it rather than from the store."""
        files = chunk_files(chunk)
        with self._locked(files):
            found: list[str] = []
            try:
                return self._fetch(files, chunk, version, found, head)
            except (ChecksumError, CorruptError, MissingDataError):
                if not found:
                    raise  # all downloaded just now: the store's own copy is damaged
                # A copy damaged on this disk (the folder's writes are not synced, and a
                # crash can leave other bytes) or evicted meanwhile: download them all again.
                for src in files:
                    self.local.delete(src.path)
                return self._fetch(files, chunk, version, None)

    def _fetch(
        self,
        files: list[ChunkFile],
        chunk: ChunkRef,
        version: int,
        found: list[str] | None,
        head: Head | None = None,
    ) -> Fetched:
        """The chunk, from the folder where its files are there (their paths added to
        ``found``) and from the remote store where not (or for all, when ``found`` is None).
        Files downloaded are written into the folder as their parts arrive, and published
        there once the chunk's checks have passed."""
        given: dict[str, bytes | memoryview] = {}
        with contextlib.ExitStack() as staging:
            staged: list[Staged] = []
            for src in files:
                data = None if found is None else self._cached(src)
                if data is not None and found is not None:
                    found.append(src.path)
                if data is None:
                    part = head if head is not None and head.path == src.path else None
                    data = self._download(src, version, staging, staged, part)
                given[src.path] = data
            fetched = self._reader.fetch(chunk, version, None, True, given)
            for into in staged:  # checked (the digest, or each frame): worth keeping
                try:
                    into.publish()
                except StorageError as e:
                    logger.warning("chunk not kept in the cache, read again when needed: %s", e)
        return fetched

    def _download(
        self,
        src: ChunkFile,
        version: int,
        staging: contextlib.ExitStack,
        staged: list[Staged],
        head: Head | None = None,
    ) -> bytes | memoryview:
        """A source's bytes from the remote store, into a new file in the folder (added to
        ``staged``, to publish once checked; a hidden source's published now, since it is
        read by frames from the folder: ``ChunkReader.fetch``), or into memory where the
        folder cannot take it."""
        into = self._stage(src)
        data = None
        if into is not None:
            staging.enter_context(into)
            data = self._download_into(src, version, into, head)
        if data is None:
            data = self.download(src, version)
            if src.hidden:
                self.local.write_unsynced(src.path, data)
        elif src.hidden:
            assert into is not None
            into.publish()
        else:
            assert into is not None
            staged.append(into)
        return data

    def _stage(self, src: ChunkFile) -> Staged | None:
        """A new file in the folder for ``src``, or None (with a warning) where there is
        no room for one: the chunk is then read into memory and not kept."""
        try:
            return self.local.stage_unsynced(src.path)
        except StorageError as e:
            logger.warning("chunk not kept in the cache, read again when needed: %s", e)
            return None

    def _download_into(
        self, src: ChunkFile, version: int, into: Staged, head: Head | None = None
    ) -> bytes | memoryview | None:
        """A source's bytes, fetched as parts at once into ``into`` and mapped from there
        (copied, with ``copy_reads``): never whole in this process's memory, so no 64 MiB
        buffer is joined from the parts, and the writes are the cache's own copy. None (with
        a warning, ``into`` discarded) when a part cannot be written (a full disk)."""
        failed: list[StorageError] = []

        def put(start: int, data: list[bytes]) -> None:
            if not failed:
                try:
                    into.put(start, data)
                except StorageError as e:
                    failed.append(e)

        skip = (head.start, head.end) if head is not None else None
        ranges = part_ranges(src.size) if skip is None else parts_around(src.size, skip)
        try:
            if ranges:
                self.remote.storage.read_ranges_into(src.path, ranges, put)
        except NotFoundError:
            raise self._missing(src, version) from None
        if head is not None:
            data = head.data.result()  # the reader's failure, if it failed, is this one's
            if len(data) != head.end - head.start:
                where = f"chunk {self.remote.storage.uri}/{src.path} (version {version})"
                raise CorruptError(f"{where} is shorter than its manifest says")
            put(head.start, [data])
        if failed:
            logger.warning("chunk not kept in the cache, read again when needed: %s", failed[0])
            into.discard()
            return None
        return bytes(into.view()) if self._copy_reads else into.view()

    def download(self, src: ChunkFile, version: int) -> bytes:
        """A source's bytes from the remote store, as parts fetched at once."""
        storage = self.remote.storage
        try:
            parts = storage.read_ranges(src.path, part_ranges(src.size))
        except NotFoundError:
            raise self._missing(src, version) from None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _cached(self, src: ChunkFile) -> bytes | memoryview | None:
        try:
            if self._copy_reads:
                return self.local.read(src.path)
            return self.local.read_buffer(src.path, tail=src.size - src.footer_offset)
        except NotFoundError:
            return None
        except StorageError as e:
            logger.warning("chunk not read from the cache, downloaded: %s", e)
            return None

    def _missing(self, src: ChunkFile, version: int) -> MissingDataError:
        return MissingDataError(
            f"chunk {self.remote.storage.uri}/{src.path} (version {version}) is missing"
        )

    @contextlib.contextmanager
    def _locked(self, files: list[ChunkFile]) -> Iterator[None]:
        stripes = sorted({zlib.crc32(src.path.encode()) % _LOCKS for src in files})
        with contextlib.ExitStack() as stack:
            for stripe in stripes:  # in order: two fetches never wait on each other
                stack.enter_context(self.local.lock(f"locks/{stripe}.lock", _LOCK_TIMEOUT))
            yield

    def release(self, chunk: ChunkRef) -> None:
        """``chunk`` is finished with: evict finished files while the folder is too full."""
        self._finished += [src.path for src in chunk_files(chunk)]
        try:
            used = sum(f.size for f in self.local.list("chunks/"))
            while used > self._max_bytes and self._finished:
                victim = self._finished.pop(0)
                with contextlib.suppress(FileNotFoundError):
                    used -= os.path.getsize(os.path.join(self.local.root, *victim.split("/")))
                self.local.delete(victim)
        except StorageError as e:
            logger.warning("cache folder not trimmed: %s", e)

    def close(self) -> None:
        self.local.close()
