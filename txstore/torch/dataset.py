"""PyTorch datasets over one pinned Snapshot: exactly once per epoch, deterministic, resumable.

How an epoch is laid out (a pure function of the snapshot, seed, epoch, world size and number
of workers, so every machine and every run agrees):

1. The snapshot's chunks are put in an order: their commit order, or a permutation drawn from
   (seed, epoch) when shuffling. Concatenated, they are one sequence of N sample positions.
2. Each rank takes an equal, contiguous share of that sequence. When N does not divide, the
   default repeats positions from the start so every rank has ceil(N / world) samples (DDP needs
   equal counts); ``drop_last=True`` drops the tail instead (floor(N / world)).
3. Each DataLoader worker takes a contiguous part of its rank's share, so it reads whole chunks
   sequentially, and shuffles samples within windows of ``shuffle_window`` consecutive chunks.

Resuming: ``StreamingDataLoader`` counts the samples each worker has delivered; a loaded
``state_dict`` makes each worker skip exactly those, so nothing repeats and nothing is lost.
A state taken on another number of workers or ranks resumes with what no worker had delivered
(``elastic``), split over the new ones.

The loader drives any ``LoaderDataset`` (this module's StreamingDataset, and the weighted mix of
several in ``mixing``): it starts the next epoch on each new iteration unless ``set_epoch`` was
called, and tells persistent workers the epoch, rank and samples to skip through a small
shared-memory buffer, since they keep the copy of the dataset they started with.
"""

from __future__ import annotations

import inspect
import itertools
import json
import operator
import os
import random
import shutil
import tempfile
import threading
from bisect import bisect_right
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    IterableDataset,
    default_convert,
    get_worker_info,
)

from ..errors import ResumeMismatchError, TxstoreError
from ..format.manifest import ChunkRef, chunk_files
from ..format.units import parse_duration, parse_size
from ..store.cache import PART_SIZE, ChunkCache, Head
from ..store.core import open as open_store
from ..store.snapshot import ChunkReader, Fetched, Sample, Snapshot
from . import elastic
from .collate import collate
from .transport import BytesPool, Receiver, WorkerStart, pack, unpack

STATE_FORMAT = 1
#: The size of each ranged read of the blocks a first batch needs from a chunk not yet
#: downloaded (``_ChunkFetcher.head``): small enough that several connections share them.
HEAD_PART_BYTES = 1 << 20
#: A local chunk's files, mapped ahead on the decoding thread, or why they could not be.
Mapped = dict[str, bytes | memoryview] | TxstoreError | None


@dataclass(frozen=True)
class Piece:
    """Samples [start, stop) of chunk number ``chunk`` of the snapshot."""

    chunk: int
    start: int
    stop: int


def _chunk_order(sizes: list[int], shuffle: bool, seed: int, epoch: int) -> list[int]:
    order = list(range(len(sizes)))
    if shuffle:
        random.Random(f"txstore/chunks/{seed}/{epoch}").shuffle(order)
    return order


def _pieces(sizes: list[int], order: list[int], first: int, stop: int) -> list[Piece]:
    """Positions [first, stop) of the chunks concatenated in ``order``, as chunk pieces.

    Positions past the end wrap around to the start: the repetition that evens out ranks.
    """
    total = sum(sizes)
    starts = list(accumulate((sizes[c] for c in order), initial=0))
    out: list[Piece] = []
    position = first
    while position < stop:
        lap_base = position - position % total
        offset, end = position - lap_base, min(stop - lap_base, total)
        k = bisect_right(starts, offset) - 1
        while offset < end:
            if sizes[order[k]]:
                take = min(end, starts[k + 1]) - offset
                out.append(Piece(order[k], offset - starts[k], offset - starts[k] + take))
                offset += take
            k += 1
        position = lap_base + end
    return out


def plan_worker(
    sizes: list[int],
    *,
    shuffle: bool,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    drop_last: bool,
) -> list[Piece]:
    """The pieces one worker of one rank reads in one epoch, in order."""
    total = sum(sizes)
    if total == 0:
        return []
    per_rank = samples_per_rank(total, world_size, drop_last)
    rank_first = rank * per_rank
    base, extra = divmod(per_rank, num_workers)
    worker_first = rank_first + worker * base + min(worker, extra)
    worker_stop = worker_first + base + (1 if worker < extra else 0)
    order = _chunk_order(sizes, shuffle, seed, epoch)
    return _pieces(sizes, order, worker_first, worker_stop)


def samples_per_rank(total: int, world_size: int, drop_last: bool) -> int:
    return total // world_size if drop_last else -(-total // world_size)


# Arguments are checked where they are given: a wrong one found later fails in a DataLoader
# worker, mid-epoch. A wrong type is a TypeError, a wrong value a ValueError.


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


def _int(name: str, value: object, minimum: int | None = None) -> int:
    """An int (numpy's too, never a bool) of at least ``minimum``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, not {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {number}")
    return number


def _callable(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a function or None, not {value!r}")
    return value


def _cache_size(value: object) -> int:
    """Bytes from an int (0: keep no finished chunk) or a string such as "100GB"."""
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return 0
    if not isinstance(value, int | str) or isinstance(value, bool):
        raise TypeError(
            f"max_cache_size must be bytes (an int) or a string such as '100GB', not {value!r}"
        )
    try:
        return parse_size(value)
    except ValueError as e:
        raise ValueError(f"max_cache_size: {e}") from None


def _fields(value: object) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"fields must be a list of field names or None, not {value!r}")
    names = list(value)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"fields must be a list of field names (str), not {value!r}")
    return names


def _distributed() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _ChunkFetcher:
    """Chunks for one worker, read ahead in threads; remote ones through a disk cache
    (``ChunkCache``), where a worker evicts only files it has finished with, oldest first,
    while the folder holds more than ``max_cache_size`` bytes."""

    def __init__(
        self, snapshot: Snapshot, cache_dir: str, max_cache_size: int, ahead: int, views: bool
    ) -> None:
        self._snapshot = snapshot
        self._remote = snapshot.reader
        # Remote chunks go through the disk cache; a projection fetches only its frames
        # instead (caching whole files would download all of them).
        cached = snapshot.storage.is_remote and snapshot.fields is None
        self._cache = (
            ChunkCache(self._remote, cache_dir, max_cache_size, copy_reads=views)
            if cached
            else None
        )
        self._pool = ThreadPoolExecutor(max(1, ahead), thread_name_prefix="txstore-fetch")
        # A chunk already in memory is only hashed: CPU work, for which more threads beside
        # the decoding thread only take its core by turns, so one does it. Chunks still on
        # disk or remote wait on I/O, and read faster in parallel.
        self._cached_pool = ThreadPoolExecutor(1, thread_name_prefix="txstore-check")
        # Local chunks are mapped on the decoding thread (``_map``), for the fetch to read
        # whole (all fields, or fields that are most of a file).
        self._maps_whole_files = not snapshot.storage.is_remote
        self._ahead = ahead
        self._chunks: list[ChunkRef] = []
        self._futures: dict[int, Future[Fetched]] = {}
        self._held = False
        self._lock = threading.Lock()

    def _map(self, chunk: ChunkRef) -> Mapped:
        """A local chunk's files mapped on the decoding thread (a failure kept for ``_fetch``
        to raise in turn). Each syscall on a prefetch thread is a GIL round trip, up to the
        switch interval behind the busy decoding thread; left there, mapping made the chunks
        read ahead late."""
        if not self._maps_whole_files:
            return None
        try:
            return self._remote.map_whole(chunk, self._snapshot.version, self._snapshot.fields)
        except TxstoreError as e:
            return e

    def _fetch(self, chunk: ChunkRef, digest: bool, mapped: Mapped) -> Fetched:
        if isinstance(mapped, TxstoreError):
            raise mapped
        version, fields = self._snapshot.version, self._snapshot.fields
        if self._cache is None:
            return self._remote.fetch(chunk, version, fields, digest, mapped)
        # Downloaded whole and checked once against the digest, before it is decoded.
        return self._cache.fetch(chunk, version)

    def head(
        self, chunk: ChunkRef, start: int, stop: int
    ) -> tuple[Fetched, Future[Fetched]] | None:
        """Samples [start, stop) of a remote chunk not in the cache, read as their blocks
        alone (the footer, then the blocks' ranges at once: two round trips), while the whole
        chunk downloads on a fetch thread (which takes those bytes from here rather than
        from the store): the first batch need not wait for 64 MiB. Returns them and that
        whole chunk's fetch, for ``stream`` to go on with; None when the chunk is read
        otherwise (local, cached, with field files, or when the blocks are most of it)."""
        files = chunk_files(chunk)
        if (
            self._cache is None
            or len(files) != 1
            or files[0].size < PART_SIZE  # one round trip brings it all, like the blocks
            or self._cache.holds(chunk)
        ):
            return None
        src, version = files[0], self._snapshot.version
        layout, ranges, apart = self._remote.head_ranges(src, version, start, stop, HEAD_PART_BYTES)
        adjacent = all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        if not ranges or not adjacent or ranges[-1][1] - ranges[0][0] > src.size // 2:
            return None
        head = Head(src.path, ranges[0][0], ranges[-1][1], Future())
        whole = self._pool.submit(self._cache.fetch, chunk, version, head)
        try:
            # The pieces of columns stored apart lie elsewhere in the file: read with the
            # blocks, in the same round trip, but not part of the head the download takes.
            pieces = self._snapshot.storage.read_ranges(src.path, ranges + apart)
        except BaseException as e:
            head.data.set_exception(e)
            raise
        blocks = pieces[: len(ranges)]
        # The ranges are adjacent: the download writes them as one piece.
        head.data.set_result(blocks[0] if len(blocks) == 1 else b"".join(blocks))
        return Fetched.of_ranges(src, layout, ranges + apart, pieces), whole

    def release(self, chunk: ChunkRef) -> None:
        if self._cache is None:
            return
        with self._lock:
            self._cache.release(chunk)

    def stream(
        self,
        chunks: list[ChunkRef],
        hold: bool = False,
        started: Future[Fetched] | None = None,
    ) -> Generator[tuple[ChunkRef, Fetched], None, None]:
        """(chunk, fetched bytes) in order, keeping ``ahead`` fetches in flight. With ``hold``,
        the first chunk is fetched alone until ``go_ahead()`` (or the second chunk is asked
        for): on a cold disk, chunks read ahead slow the first one's reads (W1, 2 workers, to
        the first batch: 0.17-0.25 s without holding, 0.14-0.19 s with). ``started``: the
        first chunk's fetch, already under way (``head``)."""
        self._chunks, self._held = chunks, hold
        self._futures = {} if started is None else {0: started}
        try:
            for i, chunk in enumerate(chunks):
                if i:
                    self._held = False
                self._submit_from(i)
                yield chunk, self._futures.pop(i).result()
        finally:
            for future in self._futures.values():
                future.cancel()

    def go_ahead(self) -> None:
        """Start the fetches ``stream`` held back, once the first sample is out."""
        if self._held:
            self._held = False
            self._submit_from(0)

    def _submit_from(self, i: int) -> None:
        last = i if self._held else min(len(self._chunks) - 1, i + self._ahead)
        for j in range(i, last + 1):
            if j not in self._futures:
                # The first chunk is checked frame by frame as it is decoded, so that the
                # first sample does not wait for the whole file to be read and hashed (cold:
                # 0.34 against 0.16 s to the first batch of W1); the chunks read ahead are
                # checked whole, in the pools' threads.
                chunk = self._chunks[j]
                hashed = j > 0
                # Asked before the map, whose read-ahead may bring in a small file meanwhile.
                cached = hashed and self._maps_whole_files and self._cached(chunk)
                mapped = self._map(chunk)
                pool = self._cached_pool if cached and isinstance(mapped, dict) else self._pool
                self._futures[j] = pool.submit(self._fetch, chunk, hashed, mapped)

    def _cached(self, chunk: ChunkRef) -> bool:
        """Whether all of a chunk's files are in memory already, so that checking it is CPU
        work alone."""
        storage = self._snapshot.storage
        return all(storage.is_cached(src.path) for src in chunk_files(chunk) if not src.hidden)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._cached_pool.shutdown(wait=True, cancel_futures=True)
        if self._cache is not None:
            self._cache.close()


#: Bytes of the shared buffer through which a loader tells its persistent workers what the next
#: iteration is (JSON): room for the skip counts of many workers, and for what is left of an
#: epoch resumed on another topology (a few segments per worker of the old one).
CONTROL_BYTES = 1 << 20


def _write_control(buffer: torch.Tensor, values: dict[str, Any]) -> None:
    data = json.dumps(values, sort_keys=True).encode()
    if 8 + len(data) > buffer.numel():
        raise ValueError(f"loader state of {len(data)} bytes does not fit its worker buffer")
    view = buffer.numpy().data
    view[8 : 8 + len(data)] = data
    view[0:8] = len(data).to_bytes(8, "little")


def _read_control(buffer: torch.Tensor) -> dict[str, Any]:
    view = buffer.numpy().data
    size = int.from_bytes(bytes(view[0:8]), "little")
    values: dict[str, Any] = json.loads(bytes(view[8 : 8 + size]))
    return values


def worker_share() -> tuple[int, int]:
    """(the worker share this DataLoader worker reads, the number of workers), turned by its
    dataset's ``rotation``; (0, 1) outside a worker."""
    info = get_worker_info()
    if info is None:
        return 0, 1
    rotation = getattr(info.dataset, "rotation", 0)
    return (info.id + rotation) % info.num_workers, info.num_workers


class LoaderDataset(IterableDataset[Any]):
    """What StreamingDataLoader drives: a dataset whose epoch is a pure function of its seed,
    epoch, rank, world size and number of workers, and whose workers can skip what was
    delivered. Subclasses set ``seed``, ``epoch``, ``rank``, ``world_size`` and ``skip``."""

    seed: int
    epoch: int
    rank: int
    world_size: int
    #: Samples each worker skips at the start of the next iteration (set on resume).
    skip: dict[int, int]
    #: What of the epoch the next iteration reads (``elastic``), when it resumes one that
    #: another topology began; None: the whole epoch.
    todo: Any = None
    #: The worker whose share DataLoader worker 0 reads (the others follow in turn): a
    #: resumed iteration starts at the worker whose batch came next, since the DataLoader
    #: always asks worker 0 first, so that batches come in the order of an uninterrupted run.
    rotation: int = 0
    #: Whether set_epoch was called since the loader last started an iteration.
    _epoch_chosen: bool = False
    #: The shared buffer of the persistent-worker loader iterating this dataset, if any.
    _control: torch.Tensor | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration follows (StreamingDataLoader
        otherwise starts the next epoch on each new iteration)."""
        self.epoch = _int("epoch", epoch, 0)
        self._epoch_chosen = True

    def set_distributed(self, rank: int, world_size: int) -> None:
        """Override the rank and world size (read from torch.distributed by default)."""
        rank, world_size = _int("rank", rank, 0), _int("world_size", world_size, 1)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        self.rank, self.world_size = rank, world_size

    def _iteration(self) -> dict[str, Any]:
        """What a worker needs to know of the next iteration besides the dataset itself."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "skip": {str(k): v for k, v in self.skip.items()},
            "todo": self.todo,
            "rotation": self.rotation,
        }

    def _follow_control(self) -> None:
        """In a persistent worker: take up the iteration its loader has written."""
        if self._control is None or get_worker_info() is None:
            return
        values = _read_control(self._control)
        self.seed, self.epoch = values["seed"], values["epoch"]
        self.rank, self.world_size = values["rank"], values["world_size"]
        self.skip = {int(k): v for k, v in values["skip"].items()}
        self.todo = values["todo"]
        self.rotation = values["rotation"]

    def _describe(self) -> dict[str, Any]:
        """What identifies the data and its epoch layout in a loader's state."""
        raise NotImplementedError

    def _check_resume(self, state: dict[str, Any], allow_other_version: bool) -> None:
        """Raise ResumeMismatchError unless ``state`` was taken over the same data and layout."""
        raise NotImplementedError

    def _valid_todo(self, todo: Any) -> bool:
        """Whether ``todo`` is what is left of an epoch as ``_unseen`` makes it (here: no
        dataset resumes on another topology, so a state's is always None)."""
        return todo is None

    def _unseen(self, state: dict[str, Any]) -> Any:
        """What of the state's epoch no worker had delivered, for another topology to read."""
        raise ResumeMismatchError(
            f"cannot resume: the state has world_size={state['world_size']} and "
            f"num_workers={state['num_workers']}, this loader {self.world_size} and another "
            f"number of workers; {type(self).__name__} resumes only on the same topology"
        )


class SnapshotDataset(LoaderDataset):
    """A LoaderDataset over one pinned snapshot: its epoch is ``plan_worker``'s layout of
    ``_sizes`` (items per chunk: samples, or token windows), and a loader's state names the
    snapshot and ``_layout``. Subclasses set ``snapshot``, ``cache_dir``, ``shuffle``,
    ``drop_last``, ``shuffle_window``, ``_sizes`` and ``_pid`` (the process that opened it)."""

    snapshot: Snapshot
    cache_dir: str | None
    shuffle: bool
    drop_last: bool
    shuffle_window: int
    _sizes: list[int]
    _pid: int

    def pieces(self, worker: int, num_workers: int) -> list[Piece]:
        """The runs of items one worker yields in one epoch: (chunk, first, stop), items
        counted from the chunk's first."""
        return plan_worker(
            self._sizes,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            rank=self.rank,
            world_size=self.world_size,
            worker=worker,
            num_workers=num_workers,
            drop_last=self.drop_last,
        )

    def _own_snapshot(self) -> Snapshot:
        """The snapshot with storage clients and caches of this process's own.

        DataLoader workers are forked; s3fs clients, open files and locks are not fork-safe.
        """
        if self._pid != os.getpid():
            self.snapshot = self.snapshot.reopen()
            self._pid = os.getpid()
        return self.snapshot

    def _cache_dir(self) -> str:
        if self.cache_dir is not None:
            return self.cache_dir
        key = f"{self.snapshot.uri}".replace("/", "_").replace(":", "_")
        return os.path.join(tempfile.gettempdir(), "txstore-cache", key)

    def _layout(self) -> dict[str, Any]:
        """What decides which items a loader's counts point at, besides the snapshot."""
        return {
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "shuffle_window": self.shuffle_window,
        }

    def _describe(self) -> dict[str, Any]:
        uri, version, commit_id = self.snapshot.identity
        return {"store": uri, "version": version, "commit_id": commit_id, **self._layout()}

    def _check_resume(self, state: dict[str, Any], allow_other_version: bool) -> None:
        _, version, commit_id = self.snapshot.identity
        if (state.get("version"), state.get("commit_id")) != (version, commit_id) and not (
            allow_other_version
        ):
            raise ResumeMismatchError(
                f"the state is from version {state.get('version')} (commit "
                f"{state.get('commit_id')}) of {state.get('store')}; this dataset reads version "
                f"{version} (commit {commit_id}). Pass allow_other_version=True to resume anyway"
            )
        _check_layout(state, self._layout())


class StreamingDataset(SnapshotDataset):
    """An iterable (and indexable) torch dataset over one pinned snapshot.

    ``source`` is a Snapshot, or a store URI with ``version`` (default: the latest at
    construction, then pinned). ``fields`` limits what is read and decoded. ``transform`` runs
    on each sample in the worker. Remote stores cache chunks under ``cache_dir`` (default: a
    temporary folder), at most ``max_cache_size`` bytes of finished chunks per folder. With
    ``lease_ttl`` (e.g. "6h") the dataset holds a lease on its version, renewed in the
    background, so that expire and vacuum leave it alone for the run (``release_lease()``).
    ``zero_copy`` gives top-level ``bytes`` values as read-only memoryviews of the chunks and
    numpy arrays as read-only arrays over them (``Snapshot.zero_copy``): ``transform`` can
    decode them without a copy. Without a ``transform``, a StreamingDataLoader with its
    default collate reads views anyway and copies each value once, into the batch.
    A field of ``fields`` that some samples lack is a ``FieldMissingError`` here, naming it
    and the first samples without it, unless ``missing`` is a value to fill them with
    (``Snapshot.select``; "skip" is refused: the epoch's plan and a resumed state count
    every sample).
    """

    def __init__(
        self,
        source: Snapshot | str | os.PathLike[str],
        *,
        version: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
        shuffle: bool = False,
        seed: int = 42,
        drop_last: bool = False,
        shuffle_window: int = 2,
        fields: Iterable[str] | None = None,
        transform: Callable[[Sample], Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        max_cache_size: int | str = 8 * 2**30,
        prefetch_chunks: int = 2,
        lease_ttl: str | float | None = None,
        zero_copy: bool = False,
        missing: Any = "error",
    ) -> None:
        shuffle, drop_last = _bool("shuffle", shuffle), _bool("drop_last", drop_last)
        zero_copy = _bool("zero_copy", zero_copy)
        seed = _int("seed", seed)
        shuffle_window = _int("shuffle_window", shuffle_window, 1)
        prefetch_chunks = _int("prefetch_chunks", prefetch_chunks, 0)
        max_cache_size = _cache_size(max_cache_size)
        transform = _callable("transform", transform)
        names = _fields(fields)
        if cache_dir is not None and not isinstance(cache_dir, str | os.PathLike):
            raise TypeError(f"cache_dir must be a path or None, not {cache_dir!r}")
        if lease_ttl is not None:
            parse_duration(lease_ttl)  # a bad one raises before the dataset is made
        if version is not None and not isinstance(version, str):  # a str names a tag
            version = _int("version", version, 0)
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"storage_options must be a dict or None, not {storage_options!r}")
        if isinstance(source, Snapshot):
            if version is not None and version != source.version:
                raise ValueError(f"version={version} but the snapshot is {source.version}")
            snapshot = source
        elif isinstance(source, str | os.PathLike):
            snapshot = open_store(source, storage_options=storage_options).snapshot(version)
        else:
            raise TypeError(f"source must be a Snapshot or a store's URI, not {source!r}")
        if isinstance(missing, str) and missing == "skip":
            raise ValueError(
                'a StreamingDataset cannot skip samples (missing="skip"): its epoch plan and '
                "resumable state count every sample; pass a value to fill in, or give the "
                "samples the field (add_fields(..., missing_only=True))"
            )
        if names is not None:
            snapshot = snapshot.select(names, missing=missing)
        if zero_copy:
            snapshot = snapshot.zero_copy()
        self.snapshot = snapshot
        # A lease keeps expire and vacuum away from the version for as long as this dataset
        # lives in the process that made it (workers do not renew it).
        self.lease = snapshot.lease(lease_ttl) if lease_ttl is not None else None
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.shuffle_window = shuffle_window
        self.transform = transform
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.max_cache_size = max_cache_size
        self.prefetch_chunks = prefetch_chunks
        self.epoch = 0
        self.rank, self.world_size = _distributed()
        self._chunks = snapshot.chunk_refs()
        self._sizes = [c.num_samples for c in self._chunks]
        self.skip = {}
        self._views_for_collate = False  # set by a StreamingDataLoader while it iterates
        # Samples to yield before reading other chunks ahead: the first batch of a
        # StreamingDataLoader (set while it iterates), else the first sample.
        self._first_batch = 1
        self._pid = os.getpid()

    def release_lease(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def __getstate__(self) -> dict[str, Any]:
        # Workers get the dataset without the lease: only the process that made it renews it.
        return {**self.__dict__, "lease": None}

    def __len__(self) -> int:
        """Samples this rank yields per epoch (or in the rest of a resumed one)."""
        return samples_per_rank(self._todo_size(self.todo), self.world_size, self.drop_last)

    def _todo_size(self, todo: list[list[Any]] | None) -> int:
        if todo is None:
            return len(self.snapshot)
        return sum(elastic.segment_size(s) for s in todo)

    def _valid_todo(self, todo: Any) -> bool:
        return todo is None or elastic.is_todo(todo, len(self.snapshot))

    def __getitem__(self, index: int) -> Any:
        sample = self._own_snapshot()[index]
        return self.transform(sample) if self.transform else sample

    def _window_order(self, key: str, window: int, n: int) -> list[int]:
        order = list(range(n))
        if self.shuffle:
            random.Random(f"txstore/window/{key}/{window}").shuffle(order)
        return order

    def __iter__(self) -> Iterator[Any]:
        self._follow_control()
        worker, num_workers = worker_share()
        items, _ = self._items(self.todo, self.rank, worker, num_workers, self.world_size)
        skip = self.skip.get(worker, 0)
        for item in items:
            size = item[2] - item[1] if item[0] == "run" else item[6] - item[5]
            if skip >= size:
                skip -= size
                continue
            if item[0] == "run":
                yield from self._read(self._run(item[1], item[2]), item[3], skip)
            else:
                _, a, b, key, number, lo, hi = item
                window = self._iterate([self._run(a, b)], key, number, lo + skip)
                yield from itertools.islice(window, hi - lo - skip)
            skip = 0

    def _items(
        self, todo: list[list[Any]] | None, rank: int, worker: int, workers: int, world: int
    ) -> tuple[list[list[Any]], int]:
        """What one worker reads (``elastic.worker_items``): of the whole epoch, its share of
        the positions in one run, as ``plan_worker`` lays it out."""
        total = self._todo_size(todo)
        per_rank = samples_per_rank(total, world, self.drop_last)
        indices = elastic.worker_range(total, per_rank, rank, worker, workers)
        key = f"{self.seed}/{self.epoch}/{rank}/{worker}"
        if total == 0:
            return [], 0
        if todo is None:
            real = max(0, min(indices.stop, total) - indices.start)
            return [["run", indices.start, indices.stop, key]], real
        return elastic.worker_items(todo, indices, key)

    def _run(self, start: int, stop: int) -> list[Piece]:
        """Positions [start, stop) of the epoch's chunk order, as pieces."""
        order = _chunk_order(self._sizes, self.shuffle, self.seed, self.epoch)
        return _pieces(self._sizes, order, start, stop)

    def _windows(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The position ranges of the windows that reading [start, stop) shuffles within."""
        pieces, step, out = self._run(start, stop), self.shuffle_window, []
        for i in range(0, len(pieces), step):
            size = sum(p.stop - p.start for p in pieces[i : i + step])
            out.append((start, start + size))
            start += size
        return out

    def _unseen(self, state: dict[str, Any]) -> list[list[Any]]:
        todo = state.get("todo")
        workers, world = state["num_workers"], state["world_size"]
        total = self._todo_size(todo)
        saved = self.seed, self.epoch  # the state's order, to find what it delivered
        self.seed, self.epoch = state["seed"], state["epoch"]
        try:
            return elastic.unseen(
                [[0, total]] if todo is None else todo,
                per_rank=samples_per_rank(total, world, self.drop_last),
                world_size=world,
                workers=workers,
                delivered={int(k): int(v) for k, v in state["delivered"].items()},
                items=lambda rank, worker: self._items(todo, rank, worker, workers, world),
                windows=self._windows,
            )
        finally:
            self.seed, self.epoch = saved

    def _read(self, pieces: list[Piece], key: str, skip: int) -> Iterator[Any]:
        """The samples of ``pieces`` but the first ``skip``, shuffled (if at all) within
        windows whose order ``key`` seeds: the same pieces and key give the same order."""
        step = self.shuffle_window
        windows = [pieces[i : i + step] for i in range(0, len(pieces), step)]
        skipped = 0  # windows already delivered whole are not read at all
        while skipped < len(windows) and skip >= (
            size := sum(p.stop - p.start for p in windows[skipped])
        ):
            skip -= size
            skipped += 1
        return self._iterate(windows[skipped:], key, skipped, skip)

    def _iterate(
        self, windows: list[list[Piece]], key: str, first_window: int, skip: int
    ) -> Iterator[Any]:
        snapshot = self._own_snapshot()
        transform = self.transform
        # Read for a StreamingDataLoader's own collate, values need no copy of their own: it
        # copies arrays straight into the batch and views of bytes into its shared buffers.
        views = snapshot.is_zero_copy or (self._views_for_collate and transform is None)
        reader, version = snapshot.reader, snapshot.version
        fetcher = _ChunkFetcher(
            snapshot, self._cache_dir(), self.max_cache_size, self.prefetch_chunks, views
        )
        flat = [p for window in windows for p in window]
        chunks = [self._chunks[p.chunk] for p in flat]
        held = self._first_batch
        head = started = None
        head_stop = 0
        if not self.shuffle and not skip and flat:
            # A remote chunk's first batch, read as its blocks while the chunk downloads.
            head_stop = min(flat[0].stop, flat[0].start + held)
            try:
                head, started = fetcher.head(chunks[0], flat[0].start, head_stop) or (None, None)
            except BaseException:
                fetcher.close()
                raise
        # Without shuffle, the first sample needs only the first chunk's first block.
        stream = fetcher.stream(chunks, hold=not self.shuffle, started=started)
        try:
            if not self.shuffle:  # nothing to reorder: yield as blocks decode
                for number, piece in enumerate(flat):
                    start, first = piece.start, None
                    if number == 0 and head is not None:
                        first = reader.samples(head, chunks[0], version, start, head_stop, views)
                        start = head_stop
                    rows = snapshot.handle_missing(
                        itertools.chain(
                            first or (),
                            self._rest(reader, stream, version, start, piece.stop, views),
                        )
                    )
                    if skip:
                        rows = itertools.islice(rows, skip, None)
                    if transform is not None:
                        rows = map(transform, rows)
                    # Other chunks are read ahead once the first batch is out: asked for
                    # when the sample after it is, so after a DataLoader worker collated and
                    # sent it. On a cold disk their reads queued before its pages (and the
                    # pages of the code that collates and sends it); warm, checking them
                    # took the core from it.
                    for row in itertools.islice(rows, held):
                        held -= 1
                        yield row
                        if not held:
                            fetcher.go_ahead()
                    yield from rows
                    skip = max(0, skip - (piece.stop - piece.start))
                    fetcher.release(chunks[number])
                return
            for number, window in enumerate(windows, start=first_window):
                samples: list[Sample] = []
                for piece in window:
                    chunk, fetched = next(stream)
                    samples += snapshot.handle_missing(
                        reader.samples(fetched, chunk, version, piece.start, piece.stop, views)
                    )
                    del fetched
                    fetcher.release(chunk)
                order = self._window_order(key, number, len(samples))
                if skip:
                    order, skip = order[skip:], 0
                if transform is None:
                    for i in order:
                        yield samples[i]
                else:
                    for i in order:
                        yield transform(samples[i])
        finally:
            stream.close()
            fetcher.close()

    @staticmethod
    def _rest(
        reader: ChunkReader,
        stream: Iterator[tuple[ChunkRef, Fetched]],
        version: int,
        start: int,
        stop: int,
        views: bool,
    ) -> Iterator[Sample]:
        """Samples [start, stop) of the next chunk ``stream`` gives, fetched once the first
        of them is asked for (after the head's, where a head was read)."""
        chunk, fetched = next(stream)
        yield from reader.samples(fetched, chunk, version, start, stop, views)

    def clear_cache(self) -> None:
        shutil.rmtree(self._cache_dir(), ignore_errors=True)

    def _check_resume(self, state: dict[str, Any], allow_other_version: bool) -> None:
        if "mix" in state:
            raise ResumeMismatchError(
                "the state is a MixedStreamingDataset's; this loader reads one StreamingDataset"
            )
        super()._check_resume(state, allow_other_version)


#: The most ranks and workers a loader state may name: beyond any real run, and a bound on
#: the work of resuming one (what every worker of every rank delivered is walked).
_MAX_RANKS = 1 << 16
_MAX_WORKERS = 1 << 10


def check_state(state: Any, dataset: LoaderDataset) -> None:
    """ResumeMismatchError naming the member, for a loader state that ``state_dict`` could
    not have made (a damaged or edited checkpoint), before anything is taken from it; its
    ``todo`` as ``dataset`` makes them."""

    def bad(key: str, want: str) -> ResumeMismatchError:
        got = state.get(key, "nothing") if isinstance(state, dict) else state
        return ResumeMismatchError(f"a bad loader state: {key!r} must be {want}, not {got!r}")

    def count(key: str, low: int, high: int | None = None) -> int:
        value = state.get(key)
        if type(value) is not int or value < low or (high is not None and value > high):
            raise bad(key, f"an int from {low}" + ("" if high is None else f" to {high}"))
        return value

    if not isinstance(state, dict):
        raise ResumeMismatchError(f"a loader state is a dict, not {type(state).__name__}")
    if state.get("format") != STATE_FORMAT:
        raise ResumeMismatchError(f"unknown loader state format {state.get('format')!r}")
    if type(state.get("seed")) is not int:
        raise bad("seed", "an int")
    count("epoch", 0)
    world = count("world_size", 1, _MAX_RANKS)
    count("rank", 0, world - 1)
    workers = count("num_workers", 1, _MAX_WORKERS)
    if "next_worker" in state:
        count("next_worker", 0, workers - 1)
    delivered = state.get("delivered")
    if not isinstance(delivered, dict) or not all(
        isinstance(k, str) and k.isdigit() and int(k) < workers and type(v) is int and v >= 0
        for k, v in delivered.items()
    ):
        raise bad("delivered", f'a dict of samples (ints) by worker ("0" to "{workers - 1}")')
    if not dataset._valid_todo(state.get("todo")):
        raise bad("todo", "null or what is left of an epoch, as this dataset writes it")


def _check_layout(state: dict[str, Any], layout: dict[str, Any]) -> None:
    for key, value in layout.items():
        if state.get(key) != value:
            raise ResumeMismatchError(
                f"cannot resume: the state has {key}={state.get(key)!r}, this loader "
                f"{value!r}; the same samples would not be skipped"
            )


class _CountingCollate:
    """Wraps a collate function to tag each batch with its worker and sample count."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate
        self.pool: BytesPool | None = None  # made in the worker: each has its own

    def __getstate__(self) -> dict[str, Any]:
        return {"collate": self.collate, "pool": None}

    def __call__(self, batch: Any) -> tuple[int, int, Any]:
        info = get_worker_info()
        count = len(batch) if isinstance(batch, list) else 1
        if info is None:  # no worker: nothing to ship
            return 0, count, self.collate(batch)
        if self.pool is None:
            self.pool = BytesPool()
        return worker_share()[0], count, pack(self.collate(batch), self.pool)


def _can_pin() -> bool:
    """Whether a DataLoader with pin_memory=True pins (it does not without an accelerator)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())


#: DataLoader's arguments, to check those given to a StreamingDataLoader by name.
_LOADER_ARGS = inspect.signature(DataLoader.__init__).replace(
    parameters=list(inspect.signature(DataLoader.__init__).parameters.values())[1:]
)


def _check_loader_args(given: dict[str, Any]) -> None:
    """Check what DataLoader leaves to fail later (in its workers, or at the first batch)."""
    if given.get("shuffle") not in (None, False):
        raise ValueError(
            "StreamingDataLoader does not shuffle: pass shuffle=True to the StreamingDataset "
            "(chunks are permuted, samples shuffled within windows; set_epoch for a new order)"
        )
    for name in ("sampler", "batch_sampler"):
        if given.get(name) is not None:
            raise ValueError(f"StreamingDataLoader takes no {name}: the dataset orders itself")
    for name in ("pin_memory", "drop_last", "persistent_workers", "in_order"):
        if name in given:
            _bool(name, given[name])
    if given.get("batch_size") is not None:
        _int("batch_size", given["batch_size"], 1)
    if "num_workers" in given:
        _int("num_workers", given["num_workers"], 0)
    if given.get("prefetch_factor") is not None:
        _int("prefetch_factor", given["prefetch_factor"], 0)
    timeout = given.get("timeout", 0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, not {timeout!r}")
    for name in ("collate_fn", "worker_init_fn"):
        _callable(name, given.get(name))


class StreamingDataLoader(DataLoader[Any]):
    """A DataLoader over a StreamingDataset (or a MixedStreamingDataset) that can save and
    resume its place mid-epoch.

    Each new iteration starts the next epoch (the first one starts at the dataset's), unless
    ``set_epoch`` or ``load_state_dict`` chose one since. ``persistent_workers=True`` keeps the
    workers between epochs; they follow the epoch and a loaded state all the same.
    """

    def __init__(
        self,
        dataset: LoaderDataset,
        *args: Any,
        collate_fn: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, LoaderDataset):
            raise TypeError(
                "StreamingDataLoader needs a StreamingDataset or a MixedStreamingDataset"
            )
        try:
            given = _LOADER_ARGS.bind(dataset, *args, collate_fn=collate_fn, **kwargs).arguments
        except TypeError as e:
            raise TypeError(f"StreamingDataLoader: {e}") from None
        _check_loader_args(given)
        batched = given.get("batch_size", 1) is not None
        # The dataset may hand its values to our own collate as views of the chunks.
        self._own_collate = collate_fn is None and batched
        kwargs["collate_fn"] = _CountingCollate(collate_fn or self.default_collate(batched))
        # (Never positional: collate_fn, which DataLoader takes before it, is keyword-only.)
        kwargs["worker_init_fn"] = WorkerStart(kwargs.get("worker_init_fn"))
        super().__init__(dataset, *args, **kwargs)
        self.streaming_dataset = dataset
        self._delivered: dict[int, int] = {}
        # A loaded state, for the next iteration: what of its epoch to read, and the samples
        # each worker skips of it.
        self._pending: tuple[list[list[Any]] | None, dict[int, int]] | None = None
        self._next_worker = 0  # the worker whose batch comes next this epoch
        self._pending_next = 0  # that worker, in a loaded state
        self._started = False  # whether an iteration has begun (the next starts a new epoch)
        self._finished = False  # whether the last iteration ran to the end of its epoch
        persistent = self.persistent_workers and self.num_workers > 0
        # Persistent workers keep the dataset copy they started with: the epoch, rank and
        # samples to skip reach them through this buffer, written before each iteration.
        self._control: torch.Tensor | None = None
        if persistent:
            self._control = torch.zeros(CONTROL_BYTES, dtype=torch.uint8)
            self._control.share_memory_()  # type: ignore[no-untyped-call]
        # The workers' shared batch buffers live as long as the workers: a receiver per
        # iteration, or one for the loader when the workers persist.
        self._receiver = Receiver() if persistent else None

    def default_collate(self, batched: bool) -> Callable[[Any], Any]:
        """The collate function used when none is given: torch's ``default_collate``, which
        ``collate.collate`` makes with one copy of each array (or ``default_convert`` for
        unbatched loading)."""
        return collate if batched else default_convert

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset = self.streaming_dataset
        dataset.rank, dataset.world_size = (
            _distributed()
            if dist.is_available() and dist.is_initialized()
            else (dataset.rank, dataset.world_size)
        )
        if self._started and self._pending is None and not dataset._epoch_chosen:
            dataset.epoch += 1
        dataset._epoch_chosen = False
        self._started, self._finished = True, False
        dataset.todo, self._delivered = self._pending or (None, {})
        dataset.skip = dict(self._delivered)
        workers = max(1, self.num_workers)
        first = self._pending_next if self._pending else 0
        dataset.rotation = self._next_worker = first % workers
        self._pending, self._pending_next = None, 0
        dataset._control = self._control
        if self._control is not None:
            _write_control(self._control, dataset._iteration())
        if isinstance(dataset, StreamingDataset):
            dataset._views_for_collate = self._own_collate
            dataset._first_batch = self.batch_size or 1
        batches: Any = None
        try:
            shipped, pin = self.num_workers > 0, self.pin_memory and _can_pin()
            receiver = self._receiver or Receiver()
            batches = super().__iter__()
            for worker, count, batch in batches:
                self._delivered[worker] = self._delivered.get(worker, 0) + count
                self._next_worker = (worker + 1) % workers
                yield unpack(batch, pin, receiver) if shipped else batch
        except BaseException as e:
            if not isinstance(e, GeneratorExit):
                self._stop_workers(batches)
            raise
        finally:
            dataset.skip, dataset.rotation = {}, 0
            if isinstance(dataset, StreamingDataset):
                dataset._views_for_collate, dataset._first_batch = False, 1
        # A finished epoch resumes at the start of the next.
        self._delivered, dataset.todo, self._finished = {}, None, True

    def _stop_workers(self, batches: Any) -> None:
        """Stop the workers of an epoch that failed, now. torch re-raises a worker's error
        from a frame that holds it, so the failed iterator lives on in a reference cycle until
        the garbage collector, which closes its queues before the iterator can tell its
        workers to stop: each worker would then be waited for until a timeout."""
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        if self.persistent_workers:  # the next epoch starts new ones
            self._iterator = None

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: the snapshot, the epoch's layout, samples per worker."""
        ds = self.streaming_dataset
        epoch = ds.epoch + 1 if self._finished and not ds._epoch_chosen else ds.epoch
        return {
            "format": STATE_FORMAT,
            **ds._describe(),
            "seed": ds.seed,
            "epoch": epoch,
            "world_size": ds.world_size,
            "rank": ds.rank,
            "num_workers": max(1, self.num_workers),
            "delivered": {str(k): v for k, v in sorted(self._delivered.items())},
            "next_worker": self._next_worker if self._delivered else 0,
            # What of the epoch this loader reads, when it resumed one begun on another
            # topology (None: all of it).
            "todo": ds.todo,
        }

    def load_state_dict(self, state: dict[str, Any], *, allow_other_version: bool = False) -> None:
        """Resume from ``state`` at the next iteration.

        Refuses a state from another snapshot unless ``allow_other_version`` (the samples then
        differ from what was trained on), and one whose epoch layout differs (shuffle
        settings, drop_last), since the skipped samples would not be the ones delivered. A
        state resumes on another number of workers or ranks too: the rest
        of the epoch is then what no worker of any rank had delivered (ranks deliver in
        lockstep, so any rank's state tells), split over the new ones.
        """
        ds = self.streaming_dataset
        check_state(state, ds)
        ds._check_resume(state, allow_other_version)
        delivered = {int(k): int(v) for k, v in state["delivered"].items()}
        self._pending_next = 0
        if (state["world_size"], state["num_workers"]) == (ds.world_size, max(1, self.num_workers)):
            pending = state.get("todo"), delivered
            self._pending_next = _int("next_worker", state.get("next_worker", 0), 0)
        else:
            pending = ds._unseen(state), {}
            ds.todo = pending[0]  # len() tells the resumed epoch's length before it starts
        ds.seed = state["seed"]
        ds.set_epoch(state["epoch"])
        self._pending = pending


__all__ = [
    "LoaderDataset",
    "Piece",
    "ResumeMismatchError",
    "SnapshotDataset",
    "StreamingDataLoader",
    "StreamingDataset",
    "plan_worker",
    "samples_per_rank",
]
