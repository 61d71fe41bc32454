"""Segment files: the immutable tree of chunk lists that manifests share instead of copying.

A manifest names a few segment files. At level 0 a segment lists up to ``MAX_SEGMENT_CHUNKS``
chunks; at level k > 0 a segment node lists ``NODE_FANOUT`` segment files of level k - 1
(format §5). A commit adds one segment and merges the newest ones like a binary counter
(while the one before is no larger than the last, up to ``MAX_SEGMENT_CHUNKS``); once a level
holds ``NODE_FANOUT`` references (level 0: beyond the counter's newest ``_COUNTER_TAIL``), its
oldest ``NODE_FANOUT`` become one node of the level above. So a manifest names
O(``NODE_FANOUT`` * log chunks) references, finding a sample reads O(log chunks) small files,
and a commit writes O(log chunks) references amortised, whatever the history's length.
"""

from __future__ import annotations

import threading
import uuid
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Generic, TypeVar

from ..errors import ChecksumError, CorruptError, MissingDataError, NotFoundError
from ..format import manifest as fmt
from ..format.codec import crc32
from ..format.manifest import (
    ChunkRef,
    RawRef,
    RawRefs,
    Segment,
    SegmentIndex,
    SegmentNode,
    SegmentNodeIndex,
    SegmentRef,
)
from ..storage import Storage
from ..storage.forksafe import renew_after_fork

MAX_SEGMENT_CHUNKS = 256
NODE_FANOUT = 16
# The binary counter keeps at most log2(MAX_SEGMENT_CHUNKS) + 1 growing segments at the end:
# packing them into a node would freeze them small.
_COUNTER_TAIL = MAX_SEGMENT_CHUNKS.bit_length()
_CACHE_SEGMENTS = 256

T = TypeVar("T", ChunkRef, SegmentRef)


class _Lazy(Generic[T]):
    """A segment file as read: the first sample under each of its items (a segment's chunk
    references, a node's segment references), and the items.

    A file with counts (segments since 1.4, nodes since 1.5) read to find one sample
    (``lazy``) keeps its items as JSON: ``item(k)`` decodes and checks one against its count,
    ``items`` decodes them all with the checks the whole file has (a reader of one sample
    decodes one reference where the file holds up to hundreds)."""

    __slots__ = ("_data", "_items", "_one", "_raws", "_where", "starts")

    def __init__(
        self,
        starts: list[int],
        items: tuple[T, ...] | None = None,
        lazy: tuple[RawRefs, bytes, str] | None = None,
    ) -> None:
        self.starts = starts
        self._items: tuple[T, ...] | None = items
        self._raws, self._data, self._where = lazy or ([], b"", "")
        self._one: dict[int, T] = {}

    def _decode_all(self, data: bytes, where: str) -> tuple[T, ...]:
        raise NotImplementedError

    def _decode_one(self, raw: RawRef, count: int, where: str) -> T:
        raise NotImplementedError

    @property
    def items(self) -> tuple[T, ...]:
        if self._items is None:
            # The bytes were checked against the reference, and the counts against it.
            self._items = self._decode_all(self._data, self._where)
            self._raws, self._data = [], b""
        return self._items

    def item(self, k: int) -> T:
        """Item ``k`` (decoded and checked alone while the rest are not)."""
        raws = self._raws  # first: ``items`` sets the items before it lets the JSON go
        if self._items is not None:
            return self._items[k]
        got = self._one.get(k)
        if got is None:
            count = self.starts[k + 1] - self.starts[k]
            got = self._one[k] = self._decode_one(raws[k], count, self._where)
        return got

    @property
    def num_samples(self) -> int:
        return self.starts[-1]


class Leaf(_Lazy[ChunkRef]):
    """A segment (level 0): its chunks."""

    __slots__ = ("path",)

    def __init__(
        self,
        path: str,
        starts: list[int],
        chunks: tuple[ChunkRef, ...] | None = None,
        lazy: tuple[RawRefs, bytes, str] | None = None,
    ) -> None:
        super().__init__(starts, chunks, lazy)
        self.path = path

    def _decode_all(self, data: bytes, where: str) -> tuple[ChunkRef, ...]:
        # Checks every chunk reference and that the counts are theirs.
        return fmt.decode(data, Segment, where).chunks

    def _decode_one(self, raw: RawRef, count: int, where: str) -> ChunkRef:
        return fmt.segment_chunk(raw, count, where)

    # The same functions under the names of what they are here (no call in between).
    chunks = _Lazy.items
    chunk = _Lazy.item

    @property
    def num_chunks(self) -> int:
        return len(self.starts) - 1

    @property
    def level(self) -> int:
        return 0


class Node(_Lazy[SegmentRef]):
    """A segment node (level > 0): its references, one level down."""

    __slots__ = ("_ref",)

    def __init__(
        self,
        ref: SegmentRef,
        starts: list[int],
        children: tuple[SegmentRef, ...] | None = None,
        lazy: tuple[RawRefs, bytes, str] | None = None,
    ) -> None:
        super().__init__(starts, children, lazy)
        self._ref = ref

    def _decode_all(self, data: bytes, where: str) -> tuple[SegmentRef, ...]:
        # What the lazy reader left out: every reference's level, and the chunks' sum.
        doc = fmt.decode(data, SegmentNode, where)
        fmt.check_segment(self._ref, doc, where)
        return doc.segments

    def _decode_one(self, raw: RawRef, count: int, where: str) -> SegmentRef:
        return fmt.node_child(raw, count, self.level, where)

    children = _Lazy.items
    child = _Lazy.item

    @property
    def path(self) -> str:
        return self._ref.path

    @property
    def level(self) -> int:
        return self._ref.level

    @property
    def num_chunks(self) -> int:
        return self._ref.num_chunks


Loaded = Leaf | Node


class Segments:
    """Reads (cached: segment files never change), writes and merges one store's segments."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._cache: OrderedDict[str, Loaded] = OrderedDict()
        self._merged: dict[tuple[object, ...], SegmentRef] = {}
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")

    # -- reading ----------------------------------------------------------------------------

    def read(
        self,
        ref: SegmentRef,
        *,
        version: int | None = None,
        fresh: bool = False,
        lazy: bool = False,
    ) -> Loaded:
        """The segment file ``ref`` names, checked against ``ref``; ``fresh`` reads storage
        even when it is cached, for checks (verify, vacuum) that must see a file deleted or
        damaged since this process read it; ``lazy``: a 1.4 segment's chunk references are
        decoded as they are asked for (``Leaf.chunk``), for a reader of one sample."""
        if not fresh:
            with self._lock:
                cached = self._cache.get(ref.path)
                if cached is not None:
                    self._cache.move_to_end(ref.path)
            if cached is not None:
                self.matches(ref, cached, version)
                return cached
        try:
            data: bytes | None = self._storage.read(ref.path)
        except NotFoundError:
            data = None
        return self._take(ref, data, version, lazy)

    def leaf(self, ref: SegmentRef, *, version: int | None = None) -> Leaf:
        got = self.read(ref, version=version)
        assert isinstance(got, Leaf)  # read() checked it against a level-0 reference
        return got

    def descend(
        self, ref: SegmentRef, local: int, *, version: int | None = None
    ) -> tuple[Leaf, int]:
        """The segment holding sample ``local`` of the tree under ``ref``, and its place there."""
        got = self.read(ref, version=version, lazy=True)
        while isinstance(got, Node):
            i = bisect_right(got.starts, local) - 1
            local -= got.starts[i]
            got = self.read(got.child(i), version=version, lazy=True)
        return got, local

    def chunks(self, refs: Sequence[SegmentRef], *, version: int | None = None) -> list[ChunkRef]:
        """Every chunk under ``refs``, in order: one level at a time, each level's files not
        cached yet read at once (one round trip per level on an object store)."""
        level: list[SegmentRef] = list(refs)
        loaded: dict[str, Loaded] = {}
        while level:
            loaded.update(self._read_all(level, version))
            level = [c for r in level if isinstance(n := loaded[r.path], Node) for c in n.children]
        out: list[ChunkRef] = []
        stack = list(reversed(refs))
        while stack:
            got = loaded[stack.pop().path]
            if isinstance(got, Leaf):
                out += got.chunks
            else:
                stack += reversed(got.children)
        return out

    def _read_all(self, refs: Sequence[SegmentRef], version: int | None) -> dict[str, Loaded]:
        """The files of ``refs``: cached ones from the cache, the rest read together (in
        batches the cache holds)."""
        found: dict[str, Loaded] = {}
        wanted: list[SegmentRef] = []
        with self._lock:
            for r in refs:
                cached = self._cache.get(r.path)
                if cached is None:
                    wanted.append(r)
                else:
                    found[r.path] = cached
        for r in refs:
            if r.path in found:
                self.matches(r, found[r.path], version)
        unique = list({r.path: r for r in wanted}.values())
        if len(unique) == 1:
            found[unique[0].path] = self.read(unique[0], version=version)
            return found
        for i in range(0, len(unique), _CACHE_SEGMENTS):
            batch = unique[i : i + _CACHE_SEGMENTS]
            datas = self._storage.read_many([r.path for r in batch])
            for r, data in zip(batch, datas, strict=True):
                found[r.path] = self._take(r, data, version)
        return found

    def _where(self, ref: SegmentRef, version: int | None) -> str:
        where = f"segment {self._storage.uri}/{ref.path}"
        return where if version is None else f"{where} (needed by version {version})"

    def matches(self, ref: SegmentRef, got: Loaded, version: int | None) -> None:
        """A cached file named again, by another reference: the counts must agree (O(1))."""
        if (got.level, got.num_samples, got.num_chunks) != (
            ref.level,
            ref.num_samples,
            ref.num_chunks,
        ):
            raise CorruptError(
                f"{self._where(ref, version)} is level {got.level} with {got.num_chunks} "
                f"chunks and {got.num_samples} samples, its reference says level {ref.level} "
                f"with {ref.num_chunks} and {ref.num_samples}"
            )

    def _take(
        self, ref: SegmentRef, data: bytes | None, version: int | None, lazy: bool = False
    ) -> Loaded:
        """The segment file from the bytes read under its path (None: missing), checked."""
        keep = self._where(ref, None)  # a cached file's errors name it alone
        where = keep if version is None else f"{keep} (needed by version {version})"
        if data is None:
            raise MissingDataError(f"{where} is missing")
        if len(data) != ref.size or crc32(data) != ref.crc32:
            raise ChecksumError(f"{where} does not match its checksum")
        got: Loaded | None = None
        # Counts (1.4 segments, 1.5 nodes) are a hint in the bytes, which a writer puts last:
        # without them a reader of one sample decodes the whole file.
        if lazy and data.rfind(b'"counts"') >= 0:
            if ref.level:
                node = fmt.decode(data, SegmentNodeIndex, where)
                if node.counts is not None:
                    starts = fmt.check_segment(ref, node, where)
                    lazy_refs = (node.segments, data, keep)
                    got = Node(ref, starts, lazy=lazy_refs)
            else:
                index = fmt.decode(data, SegmentIndex, where)
                if index.counts is not None:
                    starts = fmt.check_segment(ref, index, where)
                    got = Leaf(ref.path, starts, lazy=(index.chunks, data, keep))
        if got is None:
            kind: type[Segment] | type[SegmentNode] = SegmentNode if ref.level else Segment
            got = self._loaded(ref, fmt.decode(data, kind, where), where)
        self._remember(got)
        return got

    @staticmethod
    def _loaded(ref: SegmentRef, doc: Segment | SegmentNode, where: str) -> Loaded:
        """A segment file decoded whole, checked against ``ref``."""
        starts = fmt.check_segment(ref, doc, where)
        if isinstance(doc, Segment):
            return Leaf(ref.path, starts, doc.chunks)
        return Node(ref, starts, children=doc.segments)

    def _remember(self, got: Loaded) -> None:
        with self._lock:
            self._cache[got.path] = got
            self._cache.move_to_end(got.path)
            while len(self._cache) > _CACHE_SEGMENTS:
                self._cache.popitem(last=False)

    # -- writing ----------------------------------------------------------------------------

    def _write(self, doc: Segment | SegmentNode, level: int) -> SegmentRef:
        data = fmt.encode(doc)
        if isinstance(doc, Segment):
            samples, chunks = sum(c.num_samples for c in doc.chunks), len(doc.chunks)
        else:
            samples = sum(c.num_samples for c in doc.segments)
            chunks = sum(c.num_chunks for c in doc.segments)
        ref = SegmentRef(
            path=f"segments/{uuid.uuid4().hex}.json",
            num_samples=samples,
            num_chunks=chunks,
            size=len(data),
            crc32=crc32(data),
            level=level,
        )
        self._storage.write(ref.path, data)
        self._remember(self._loaded(ref, doc, ref.path))
        return ref

    def write_all(self, chunks: Sequence[ChunkRef]) -> tuple[SegmentRef, ...]:
        """A manifest's segment references for exactly ``chunks`` (a tree built anew)."""
        return self.extend((), chunks)

    def extend(
        self, segments: tuple[SegmentRef, ...], chunks: Sequence[ChunkRef]
    ) -> tuple[SegmentRef, ...]:
        """The segment references after adding ``chunks`` at the end, ``MAX_SEGMENT_CHUNKS``
        at a time. The merges of each addition are planned before anything is written, so
        one segment file is written for it: every file a commit writes is one its manifest
        names (the incremental vacuum finds only those)."""
        out = list(segments)
        for i in range(0, len(chunks), MAX_SEGMENT_CHUNKS):
            group = tuple(chunks[i : i + MAX_SEGMENT_CHUNKS])
            # The binary counter: the newest leaves no larger than what they join, up to
            # MAX_SEGMENT_CHUNKS in all, become one leaf with the new chunks.
            start, count = len(out), len(group)
            while start >= 1:
                a = out[start - 1]
                if a.level or a.num_chunks > count or a.num_chunks + count > MAX_SEGMENT_CHUNKS:
                    break
                count += a.num_chunks
                start -= 1
            tail = out[start:]
            out[start:] = [
                self._once(
                    ("leaf", *(r.path for r in tail), *group), partial(self._leaf, tail, group)
                )
            ]
            out = self._pack_full(out)
        return tuple(out)

    def _pack_full(self, out: list[SegmentRef]) -> list[SegmentRef]:
        """Full levels packed into nodes, the lowest first."""
        level = 0
        while level < fmt.MAX_SEGMENT_LEVEL and level <= max(r.level for r in out):
            start, stop = _first_run(out, level)
            if stop - start >= NODE_FANOUT + (_COUNTER_TAIL if level == 0 else 0):
                out[start : start + NODE_FANOUT] = [self._pack(out[start : start + NODE_FANOUT])]
            else:  # packed or not full: the level above may be full now
                level += 1
        return out

    def _leaf(self, tail: Sequence[SegmentRef], chunks: tuple[ChunkRef, ...]) -> SegmentRef:
        """One segment of the chunks of ``tail`` (segments), then ``chunks``."""
        before = tuple(c for r in tail for c in self.leaf(r).chunks)
        return self._write(fmt.new_segment(before + chunks), 0)

    def _pack(self, refs: Sequence[SegmentRef]) -> SegmentRef:
        """One node over ``refs`` (all of one level)."""
        return self._once(
            ("node", *(r.path for r in refs)),
            lambda: self._write(fmt.new_node(tuple(refs)), refs[0].level + 1),
        )

    def _once(self, key: tuple[object, ...], write: Callable[[], SegmentRef]) -> SegmentRef:
        """A rebase retries the same merges and packs: write each once."""
        with self._lock:
            done = self._merged.get(key)
        if done is None:
            done = write()
            with self._lock:
                if len(self._merged) >= _CACHE_SEGMENTS:  # only the latest rebase needs it
                    self._merged.clear()
                self._merged[key] = done
        return done


def _first_run(refs: Sequence[SegmentRef], level: int) -> tuple[int, int]:
    """Where the first run of consecutive references at ``level`` starts and stops."""
    start = next((i for i, r in enumerate(refs) if r.level == level), len(refs))
    stop = start
    while stop < len(refs) and refs[stop].level == level:
        stop += 1
    return start, stop
