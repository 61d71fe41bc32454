"""Segment files: immutable chunk lists that manifests share instead of copying.

A commit adds one segment and merges the newest ones like a binary counter (while the one
before is no larger than the last, up to ``MAX_SEGMENT_CHUNKS``). So a manifest names
O(chunks / MAX_SEGMENT_CHUNKS + log chunks) segments, and a commit rewrites O(log chunks)
chunk references amortised: commit cost does not grow with the store's history.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence

from ..errors import ChecksumError, MissingDataError, NotFoundError
from ..format import manifest as fmt
from ..format.codec import crc32
from ..format.manifest import ChunkRef, Segment, SegmentRef
from ..storage import Storage

MAX_SEGMENT_CHUNKS = 4096
_CACHE_SEGMENTS = 256


class Segments:
    """Reads (cached: segments never change), writes and merges the segments of one store."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._cache: OrderedDict[str, Segment] = OrderedDict()
        self._merged: dict[tuple[str, str], SegmentRef] = {}
        self._lock = threading.Lock()

    def read(self, ref: SegmentRef, *, version: int | None = None, fresh: bool = False) -> Segment:
        """A segment; ``fresh`` reads storage even when it is cached, for checks (verify,
        vacuum) that must see a segment deleted or damaged since this process read it."""
        if not fresh:
            with self._lock:
                cached = self._cache.get(ref.path)
                if cached is not None:
                    self._cache.move_to_end(ref.path)
                    return cached
        try:
            data: bytes | None = self._storage.read(ref.path)
        except NotFoundError:
            data = None
        return self._take(ref, data, version)

    def preload(self, refs: Sequence[SegmentRef], *, version: int | None = None) -> None:
        """Read the segments of ``refs`` not cached yet, all at once (one round trip on an
        object store, where reading them one by one waits one each)."""
        with self._lock:
            wanted = list(dict.fromkeys(r.path for r in refs if r.path not in self._cache))
        if not 2 <= len(wanted) <= _CACHE_SEGMENTS:
            return  # one is read when needed; more than the cache holds, as they are needed
        by_path = {r.path: r for r in refs}
        for path, data in zip(wanted, self._storage.read_many(wanted), strict=True):
            self._take(by_path[path], data, version)

    def _take(self, ref: SegmentRef, data: bytes | None, version: int | None) -> Segment:
        """The segment from the bytes read under its path (None: missing), checked."""
        where = f"{self._storage.uri}/{ref.path}"
        if version is not None:
            where += f" (needed by version {version})"
        if data is None:
            raise MissingDataError(f"segment {where} is missing")
        if len(data) != ref.size or crc32(data) != ref.crc32:
            raise ChecksumError(f"segment {where} does not match its checksum")
        segment = fmt.decode(data, Segment, where)
        with self._lock:
            self._cache[ref.path] = segment
            while len(self._cache) > _CACHE_SEGMENTS:
                self._cache.popitem(last=False)
        return segment

    def write(self, chunks: Sequence[ChunkRef]) -> SegmentRef:
        segment = Segment(chunks=tuple(chunks))
        data = fmt.encode(segment)
        ref = SegmentRef(
            path=f"segments/{uuid.uuid4().hex}.json",
            num_samples=sum(c.num_samples for c in chunks),
            num_chunks=len(chunks),
            size=len(data),
            crc32=crc32(data),
        )
        self._storage.write(ref.path, data)
        with self._lock:
            self._cache[ref.path] = segment
        return ref

    def _merge(self, first: SegmentRef, second: SegmentRef) -> SegmentRef:
        key = (first.path, second.path)
        with self._lock:
            done = self._merged.get(key)
        if done is None:  # a rebase retries the same merge: write it once
            chunks = self.read(first).chunks + self.read(second).chunks
            done = self.write(chunks)
            with self._lock:
                if len(self._merged) >= _CACHE_SEGMENTS:  # only the latest rebase needs it
                    self._merged.clear()
                self._merged[key] = done
        return done

    def write_all(self, chunks: Sequence[ChunkRef]) -> tuple[SegmentRef, ...]:
        """``chunks`` as new segments of at most ``MAX_SEGMENT_CHUNKS`` each."""
        return tuple(
            self.write(chunks[i : i + MAX_SEGMENT_CHUNKS])
            for i in range(0, len(chunks), MAX_SEGMENT_CHUNKS)
        )

    def extend(
        self, segments: tuple[SegmentRef, ...], chunks: Sequence[ChunkRef]
    ) -> tuple[SegmentRef, ...]:
        """The segment list after adding ``chunks`` at the end."""
        for i in range(0, len(chunks), MAX_SEGMENT_CHUNKS):
            segments = self.append(segments, self.write(chunks[i : i + MAX_SEGMENT_CHUNKS]))
        return segments

    def append(self, segments: tuple[SegmentRef, ...], new: SegmentRef) -> tuple[SegmentRef, ...]:
        """The segment list after adding ``new``, with the newest segments merged."""
        out = [*segments, new]
        while len(out) >= 2:
            a, b = out[-2], out[-1]
            if a.num_chunks > b.num_chunks or a.num_chunks + b.num_chunks > MAX_SEGMENT_CHUNKS:
                break
            out[-2:] = [self._merge(a, b)]
        return tuple(out)
