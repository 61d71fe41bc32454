"""Chunks of a remote store kept in a local folder, for the epochs that read them again.

The folder is laid out like the store (``chunks/<id>.chunk``), so versions that share chunks
share its files: chunk files never change once written. A chunk missing from it is downloaded
as parts over several connections at once (``PART_SIZE`` each, up to the storage's
``max_in_flight``): one connection's bandwidth, not the whole link's, is what bounds a single
GET of 64 MiB. The bytes downloaded are checked once (the chunk's digest), decoded from memory
and handed out; a thread then writes them to the folder, so that the chunk's first sample does
not wait for a 64 MiB write. Processes sharing the folder (DataLoader workers) take a lock per
file while they fetch it, held until the file is written, so a chunk two of them need is
downloaded once. The folder is a cache: a file that cannot be written there is left out (and
downloaded again when next needed), with a warning, rather than failing the read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from ..errors import ChecksumError, CorruptError, MissingDataError, NotFoundError, StorageError
from ..format.manifest import ChunkFile, ChunkRef, chunk_files
from ..storage.local import LocalStorage
from .snapshot import ChunkReader, Fetched

logger = logging.getLogger(__name__)

#: The size of each ranged GET of a chunk being downloaded.
PART_SIZE = 8 * 2**20
#: Lock files the folder's fetches share (a file's lock is picked by a hash of its name).
_LOCKS = 64
#: How long a fetch waits on another process's lock before downloading the file itself.
_LOCK_TIMEOUT = 120.0


def part_ranges(size: int, part_size: int = PART_SIZE) -> list[tuple[int, int]]:
    """[start, end) of each part of an object of ``size`` bytes."""
    return [(start, min(size, start + part_size)) for start in range(0, size, part_size)] or [
        (0, 0)
    ]


class ChunkCache:
    """The local copies of a remote store's chunks, at most ``max_bytes`` of finished ones.

    ``fetch`` gives what ``ChunkReader.fetch`` gives for all fields, from the folder where
    a chunk is there and from the remote store where not; ``release`` says a chunk is
    finished with, after which it may be evicted (oldest finished first) to keep the folder
    under ``max_bytes``. With ``copy_reads``, files found in the folder are read into memory
    rather than mapped: views handed out of a mapped file (a zero-copy snapshot's) would keep
    its disk space after eviction.
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
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="txstore-cache-write")
        self._writing: dict[str, Future[None]] = {}  # by path, until its chunk is finished

    @property
    def folder(self) -> str:
        return self.local.root

    def fetch(self, chunk: ChunkRef, version: int) -> Fetched:
        files = chunk_files(chunk)
        with contextlib.ExitStack() as held:
            held.enter_context(self._locked(files))
            found: list[str] = []
            try:
                fetched, downloaded = self._fetch(files, chunk, version, found)
            except (ChecksumError, CorruptError, MissingDataError):
                if not found:
                    raise  # all downloaded just now: the store's own copy is damaged
                # A copy damaged on this disk (the folder's writes are not synced, and a
                # crash can leave other bytes) or evicted meanwhile: download them all again.
                for src in files:
                    self.local.delete(src.path)
                fetched, downloaded = self._fetch(files, chunk, version, None)
            if downloaded:
                # The writer releases the lock once the files are in the folder.
                writing = self._writer.submit(self._keep, downloaded, held.pop_all())
                self._writing.update(dict.fromkeys(downloaded, writing))
            return fetched

    def _fetch(
        self, files: list[ChunkFile], chunk: ChunkRef, version: int, found: list[str] | None
    ) -> tuple[Fetched, dict[str, bytes]]:
        """The chunk, from the folder where its files are there (their paths added to
        ``found``) and from the remote store where not (or for all, when ``found`` is None),
        and the bytes downloaded for the folder, by path."""
        given: dict[str, bytes | memoryview] = {}
        downloaded: dict[str, bytes] = {}
        for src in files:
            data = None if found is None else self._cached(src)
            if data is not None and found is not None:
                found.append(src.path)
            if data is None:
                data = self.download(src, version)
                if src.hidden:  # read by frames, from the folder (see ChunkReader.fetch)
                    self.local.write_unsynced(src.path, data)
                else:
                    downloaded[src.path] = data
            given[src.path] = data
        fetched = self._reader.fetch(chunk, version, None, True, given)
        return fetched, downloaded  # checked (the digest, or each frame): worth keeping

    def _keep(self, downloaded: dict[str, bytes], lock: contextlib.ExitStack) -> None:
        with lock:
            for path, data in downloaded.items():
                try:
                    if not self.local.exists(path):
                        self.local.write_unsynced(path, data)
                except StorageError as e:
                    logger.warning("chunk not kept in the cache, read again when needed: %s", e)

    def _cached(self, src: ChunkFile) -> bytes | memoryview | None:
        try:
            if self._copy_reads:
                return self.local.read(src.path)
            return self.local.read_buffer(src.path)
        except NotFoundError:
            return None
        except StorageError as e:
            logger.warning("chunk not read from the cache, downloaded: %s", e)
            return None

    def download(self, src: ChunkFile, version: int) -> bytes:
        """A source's bytes from the remote store, as parts fetched at once."""
        storage = self.remote.storage
        try:
            parts = storage.read_ranges(src.path, part_ranges(src.size))
        except NotFoundError:
            raise MissingDataError(
                f"chunk {storage.uri}/{src.path} (version {version}) is missing"
            ) from None
        return parts[0] if len(parts) == 1 else b"".join(parts)

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
        for path in self._finished:  # counted and evicted once on disk, not before
            writing = self._writing.pop(path, None)
            if writing is not None:
                writing.result()
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
        """Wait for the files being written, then close the folder."""
        self._writer.shutdown(wait=True)
        self.local.close()
