"""Fixed-length token windows over one field of token arrays, for language-model pretraining.

Each sample holds a 1-d numpy array of integer tokens in ``field``. Laid end to end in commit
order they are one sequence of T tokens; window ``k`` is tokens [k * B, (k + 1) * B) of it, for
the ``T // B`` whole windows (the tail shorter than a window is left out, as LitData's
``TokensLoader`` leaves out each chunk's).

How an epoch is laid out follows ``StreamingDataset`` (``plan_worker``), with windows in place
of samples: a window belongs to the chunk its first token is in, so each chunk holds a run of
windows; the chunks are put in an order (commit order, or a permutation drawn from (seed,
epoch)), each rank takes an equal contiguous share of the windows in that order (repeating
from the start to even out ranks unless ``drop_last``), and each DataLoader worker a
contiguous part of its rank's share. Shuffling permutes the windows within runs of
``shuffle_window`` consecutive chunk pieces of a worker, so a worker reads whole chunks once.

Where windows are is computed from the token count of every sample, counted once when the
dataset is made (a read of the field's frames, in threads): cumulative sums locate a window's
first and last sample, and a worker decodes only those samples, concatenates them with numpy
and slices the windows out. A window that runs past its chunk's end reads the samples it needs
from the next chunks one by one, not those chunks whole.
"""

from __future__ import annotations

import itertools
import operator
import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_convert

from ..errors import CorruptError, FieldTypeError, InvalidArgumentError
from ..format.manifest import ChunkRef
from ..format.units import parse_size
from ..store.core import open as open_store
from ..store.snapshot import Fetched, Snapshot, map_threads
from .dataset import (
    Piece,
    SnapshotDataset,
    StreamingDataLoader,
    _ChunkFetcher,
    _distributed,
    worker_share,
)
from .dataset import samples_per_rank as windows_per_rank

#: Chunks whose token counts are read at once when a dataset is made (remote reads wait on
#: I/O; local ones decompress and decode, in part outside the GIL).
_COUNT_THREADS = 4


def _bad(name: str, message: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"TokenStreamingDataset: {name} {message}")


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, f"must be True or False, not {value!r}")
    return value


def _whole(name: str, value: object, minimum: int, why: str = "") -> int:
    """An int (numpy's too, never a bool) of at least ``minimum``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise _bad(name, f"must be an int, not {value!r}") from None
    if number < minimum:
        raise _bad(name, f"must be at least {minimum}{why}, not {number}")
    return number


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.ndim}-d numpy array of {value.dtype}"
    return f"a {type(value).__qualname__}"


class _Counted:
    """The token counts of one chunk's samples, or the first sample not a token array."""

    __slots__ = ("bad", "counts", "dtype")

    def __init__(self, counts: np.ndarray[Any, Any], dtype: np.dtype[Any] | None) -> None:
        self.counts = counts
        self.dtype = dtype
        self.bad: tuple[int, str] | None = None


class TokenStreamingDataset(SnapshotDataset):
    """Windows of ``block_size`` tokens over the concatenated token arrays of ``field``.

    ``source`` is a Snapshot, or a store URI with ``version`` (default: the latest at
    construction, then pinned). Each sample's ``field`` must be a 1-d numpy array of integers,
    all of one dtype; windows come as 1-d tensors of that dtype. Where the windows are is
    worked out from each sample's token count: read from ``lengths_field`` when the samples
    have one (ints, cheap to read: e.g. written beside the tokens at append time), else
    counted when the dataset is made, which reads the whole field once. Each sample read is
    checked against its count.

    Every window once per epoch (with ranks that do not divide the windows, a few repeat
    unless ``drop_last``), in an order that is a pure function of (snapshot, field,
    block_size, seed, epoch, world size, workers). ``TokenStreamingDataLoader`` saves and
    resumes its place mid-epoch. Remote chunks are cached under ``cache_dir``, at most
    ``max_cache_size`` bytes of finished chunks. Bad arguments raise
    ``InvalidArgumentError`` naming them, values of ``field`` that are not token arrays
    ``FieldTypeError`` naming the sample.
    """

    def __init__(
        self,
        source: Snapshot | str | os.PathLike[str],
        *,
        field: str = "tokens",
        block_size: int = 2049,
        lengths_field: str | None = None,
        version: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
        shuffle: bool = False,
        seed: int = 42,
        drop_last: bool = False,
        shuffle_window: int = 2,
        cache_dir: str | os.PathLike[str] | None = None,
        max_cache_size: int | str = 8 * 2**30,
        prefetch_chunks: int = 2,
    ) -> None:
        if not isinstance(field, str):
            raise _bad("field", f"must be a field name (a str), not {field!r}")
        if lengths_field is not None and not isinstance(lengths_field, str):
            raise _bad("lengths_field", f"must be a field name or None, not {lengths_field!r}")
        block_size = _whole(
            "block_size", block_size, 2, " (a window is an input and its target shifted by one)"
        )
        self.shuffle, self.drop_last = _flag("shuffle", shuffle), _flag("drop_last", drop_last)
        self.seed = _whole("seed", seed, -(2**63))
        self.shuffle_window = _whole("shuffle_window", shuffle_window, 1)
        self.prefetch_chunks = _whole("prefetch_chunks", prefetch_chunks, 0)
        if isinstance(max_cache_size, bool) or not isinstance(max_cache_size, int | str):
            raise _bad(
                "max_cache_size", f"must be bytes or a size such as '100GB', not {max_cache_size!r}"
            )
        try:
            self.max_cache_size = parse_size(max_cache_size) if max_cache_size else 0
        except ValueError as e:
            raise _bad("max_cache_size", str(e)) from None
        if cache_dir is not None and not isinstance(cache_dir, str | os.PathLike):
            raise _bad("cache_dir", f"must be a path or None, not {cache_dir!r}")
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        if isinstance(source, Snapshot):
            if version is not None and version != source.version:
                raise _bad("version", f"is {version} but the snapshot is {source.version}")
            snapshot = source
        elif isinstance(source, str | os.PathLike):
            snapshot = open_store(source, storage_options=storage_options).snapshot(version)
        else:
            raise _bad("source", f"must be a Snapshot or a store's URI, not {source!r}")
        # FieldNotFoundError / FieldMissingError here, naming the field and the samples.
        self.snapshot = snapshot.select([field])
        self.field = field
        self.lengths_field = lengths_field
        self.block_size = block_size
        self.epoch = 0
        self.rank, self.world_size = _distributed()
        self._chunks = self.snapshot.chunk_refs()
        sizes = [c.num_samples for c in self._chunks]
        #: First sample of each chunk, and one past the last.
        self._chunk_starts = np.cumsum([0, *sizes], dtype=np.int64)
        if lengths_field is None:
            counts, self.dtype = self._count()
        else:
            counts, self.dtype = self._read_lengths(snapshot.select([lengths_field]), lengths_field)
        self._counts = counts
        #: Where each sample's tokens start in the concatenation, and where the last ends.
        self._token_starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
        self.num_tokens = int(self._token_starts[-1])
        self.num_windows = self.num_tokens // block_size
        # The windows of chunk c are those whose first token is in it: [first[c], first[c+1]).
        chunk_tokens = self._token_starts[self._chunk_starts]
        first = np.minimum(-(-chunk_tokens // block_size), self.num_windows)
        self._first_window = first
        self._sizes = [int(n) for n in np.diff(first)]
        # Windows each worker skips at the start of the next iteration (set on resume).
        self.skip: dict[int, int] = {}
        self._pid = os.getpid()

    # -- the token counts --------------------------------------------------------------------

    def _count(self) -> tuple[np.ndarray[Any, Any], np.dtype[Any] | None]:
        snapshot, field = self.snapshot, self.field
        reader, version = snapshot.reader, snapshot.version

        def one(chunk: Any) -> _Counted:
            fetched = reader.fetch(chunk, version, snapshot.fields)
            out = _Counted(np.empty(chunk.num_samples, dtype=np.int64), None)
            rows = snapshot.handle_missing(reader.samples(fetched, chunk, version))
            for k, row in enumerate(rows):
                value = row.get(field)
                if (
                    not isinstance(value, np.ndarray)
                    or value.ndim != 1
                    or value.dtype.kind not in "iu"
                ):
                    out.bad = (k, f"is {_describe(value)}, not a 1-d numpy array of integers")
                    return out
                if out.dtype is None:
                    out.dtype = value.dtype
                elif value.dtype != out.dtype:
                    out.bad = (k, f"is an array of {value.dtype}, sample before it {out.dtype}")
                    return out
                out.counts[k] = value.shape[0]
            return out

        counted = map_threads(one, self._chunks, _COUNT_THREADS)
        dtype = None
        for number, found in enumerate(counted):
            base = int(self._chunk_starts[number])
            if found.bad is not None:
                k, why = found.bad
                raise self._type_error(base + k, why)
            if found.dtype is not None:
                if dtype is not None and found.dtype != dtype:
                    raise self._type_error(
                        base, f"is an array of {found.dtype}, the samples before it {dtype}"
                    )
                dtype = found.dtype
        counts = np.concatenate([c.counts for c in counted]) if counted else np.zeros(0, np.int64)
        return counts, dtype

    def _read_lengths(
        self, view: Snapshot, name: str
    ) -> tuple[np.ndarray[Any, Any], np.dtype[Any] | None]:
        """The token counts held in field ``name`` (a projection of ints, cheap to read), and
        the tokens' dtype from the first sample that has some."""
        version = view.version
        reader = view.reader

        def one(chunk: Any) -> list[Any]:
            fetched = reader.fetch(chunk, version, view.fields)
            return [row.get(name) for row in reader.samples(fetched, chunk, version)]

        values = [v for part in map_threads(one, self._chunks, _COUNT_THREADS) for v in part]
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise FieldTypeError(
                    f"token windows read the token counts from {name!r}: in sample {i} of "
                    f"version {version} of {view.uri} it is {value!r}, not a count of tokens",
                    field=name,
                    sample=i,
                )
        counts = np.array(values, dtype=np.int64)
        dtype = None
        nonzero = np.flatnonzero(counts)
        if len(nonzero):
            first = int(nonzero[0])
            value = self.snapshot[first].get(self.field)
            if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in "iu":
                raise self._type_error(
                    first, f"is {_describe(value)}, not a 1-d numpy array of integers"
                )
            dtype = value.dtype
        return counts, dtype

    def _checked(self, arrays: Iterator[Any], first: int) -> Iterator[np.ndarray[Any, Any]]:
        """``arrays``, samples ``first`` on, each checked against the count and dtype the
        windows were laid out by (a wrong ``lengths_field`` would shift every window after)."""
        counts, dtype = self._counts, self.dtype
        for i, array in enumerate(arrays, start=first):
            if (
                not isinstance(array, np.ndarray)
                or array.ndim != 1
                or array.dtype != dtype
                or len(array) != counts[i]
            ):
                said = f"{self.lengths_field!r} says" if self.lengths_field else "counted"
                size = f" of {len(array)} tokens" if isinstance(array, np.ndarray) else ""
                why = f"is {_describe(array)}{size} ({said} {counts[i]} of {dtype})"
                raise self._type_error(i, why)
            yield array

    def _type_error(self, sample: int, why: str) -> FieldTypeError:
        uri, version = self.snapshot.uri, self.snapshot.version
        return FieldTypeError(
            f"token windows need {self.field!r} to be a 1-d numpy array of integers in every "
            f"sample: in sample {sample} of version {version} of {uri} it {why}",
            field=self.field,
            sample=sample,
        )

    # -- the epoch's layout ------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration follows (the loader otherwise
        starts the next epoch on each new iteration)."""
        super().set_epoch(_whole("epoch", epoch, 0))

    def set_distributed(self, rank: int, world_size: int) -> None:
        """Override the rank and world size (read from torch.distributed by default)."""
        rank, world_size = _whole("rank", rank, 0), _whole("world_size", world_size, 1)
        if rank >= world_size:
            raise _bad("rank", f"{rank} is not in a world of {world_size}")
        self.rank, self.world_size = rank, world_size

    def __len__(self) -> int:
        """Windows this rank yields per epoch."""
        if self.num_windows == 0:
            return 0
        return windows_per_rank(self.num_windows, self.world_size, self.drop_last)

    def _order(self, worker: int, run: int, n: int) -> list[int]:
        order = list(range(n))
        if self.shuffle:
            rng = random.Random(
                f"txstore/tokens/{self.seed}/{self.epoch}/{self.rank}/{worker}/{run}"
            )
            rng.shuffle(order)
        return order

    # -- resuming (StreamingDataLoader) -------------------------------------------------------

    def _layout(self) -> dict[str, Any]:
        return {"field": self.field, "block_size": self.block_size, **super()._layout()}

    # -- reading -----------------------------------------------------------------------------

    def _samples_span(self, first: int, stop: int) -> tuple[int, int, int, int]:
        """(first token, first sample, stop sample, token offset in the first sample) of
        windows [first, stop)."""
        low, high = first * self.block_size, stop * self.block_size
        starts = self._token_starts
        # The first sample that ends after ``low`` and the last that starts before ``high``.
        s0 = int(np.searchsorted(starts[1:], low, side="right"))
        s1 = int(np.searchsorted(starts[:-1], high, side="left"))
        return low, s0, s1, low - int(starts[s0])

    def _arrays(self, snapshot: Snapshot, first: int, stop: int) -> list[np.ndarray[Any, Any]]:
        """The token arrays of samples [first, stop), one at a time (for windows that run
        past their chunk, and ``window``)."""
        return [snapshot[i][self.field] for i in range(first, stop)]

    def window(self, index: int) -> torch.Tensor:
        """Window ``index`` (negative: from the end), reading only the samples it spans."""
        n = self.num_windows
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise _bad("index", f"must be an int, not {index!r}")
        index = int(index) + (n if index < 0 else 0)
        if not 0 <= index < n:
            raise IndexError(f"window {index} is out of range: there are {n}")
        _, s0, s1, offset = self._samples_span(index, index + 1)
        flat = np.concatenate(
            list(self._checked(iter(self._arrays(self._own_snapshot(), s0, s1)), s0))
        )
        return torch.from_numpy(flat[offset : offset + self.block_size].copy())

    def __iter__(self) -> Iterator[torch.Tensor]:
        self._follow_control()
        worker, num_workers = worker_share()
        pieces = self.pieces(worker, num_workers)
        skip = self.skip.get(worker, 0)
        step = self.shuffle_window if self.shuffle else 1
        runs = [pieces[i : i + step] for i in range(0, len(pieces), step)]
        skipped = 0  # runs delivered whole already are not read at all
        while skipped < len(runs) and skip >= (
            size := sum(p.stop - p.start for p in runs[skipped])
        ):
            skip -= size
            skipped += 1
        return self._iterate(runs[skipped:], worker, skipped, skip)

    def _span_tokens(self, piece: Piece) -> int:
        """Tokens of the samples a piece's windows span."""
        base = int(self._first_window[piece.chunk])
        _, s0, s1, _ = self._samples_span(base + piece.start, base + piece.stop)
        return int(self._token_starts[s1] - self._token_starts[s0])

    def _piece_arrays(
        self, snapshot: Snapshot, chunk: ChunkRef, fetched: Fetched, piece: Piece
    ) -> tuple[Iterator[np.ndarray[Any, Any]], int]:
        """The token arrays of the samples a piece's windows span, decoded a block at a time
        as they are asked for, and where its first window starts in the first of them."""
        base = int(self._first_window[piece.chunk])
        _, s0, s1, offset = self._samples_span(base + piece.start, base + piece.stop)
        low, high = int(self._chunk_starts[piece.chunk]), int(self._chunk_starts[piece.chunk + 1])
        reader, field = snapshot.reader, self.field
        # Views of the chunk (read-only): every window is a copy of its own (``_cut``, and the
        # shuffled runs), so each token is copied once on its way to a window, not twice.
        rows = reader.samples(
            fetched, chunk, snapshot.version, s0 - low, min(s1, high) - low, views=True
        )
        arrays: Iterator[np.ndarray[Any, Any]] = (row[field] for row in rows)
        if s1 > high:  # the last window runs on into the next chunks
            arrays = itertools.chain(arrays, (snapshot[i][field] for i in range(high, s1)))
        return self._checked(arrays, s0), offset

    def _iterate(
        self, runs: list[list[Piece]], worker: int, first_run: int, skip: int
    ) -> Iterator[torch.Tensor]:
        snapshot = self._own_snapshot()
        fetcher = _ChunkFetcher(
            snapshot, self._cache_dir(), self.max_cache_size, self.prefetch_chunks, views=True
        )
        stream = fetcher.stream([self._chunks[p.chunk] for run in runs for p in run])
        block = self.block_size
        buffer: np.ndarray[Any, Any] | None = None  # shuffled runs' tokens (windows are copies)
        try:
            for number, run in enumerate(runs, start=first_run):
                if not self.shuffle:  # one piece a run: windows as its blocks decode
                    (piece,) = run
                    if skip:  # resumed: the windows delivered are not read
                        piece, skip = Piece(piece.chunk, piece.start + skip, piece.stop), 0
                    chunk, fetched = next(stream)
                    arrays, offset = self._piece_arrays(snapshot, chunk, fetched, piece)
                    yield from _cut(arrays, offset, piece.stop - piece.start, block)
                    del fetched
                    fetcher.release(chunk)
                    continue
                # Each piece as (its tokens, where its first window starts in them), laid
                # out in one buffer the iteration reuses run after run: fresh memory costs
                # more than the copy into it.
                spans = [self._span_tokens(piece) for piece in run]
                if buffer is None or len(buffer) < sum(spans):
                    assert self.dtype is not None  # a run has windows, so tokens of a dtype
                    buffer = _buffer(sum(spans), self.dtype)
                flats: list[tuple[np.ndarray[Any, Any], int]] = []
                at = 0
                for piece, span in zip(run, spans, strict=True):
                    chunk, fetched = next(stream)
                    arrays, offset = self._piece_arrays(snapshot, chunk, fetched, piece)
                    flats.append((_fill(buffer[at : at + span], arrays), offset))
                    at += span
                    del fetched, arrays
                    fetcher.release(chunk)
                sizes = [p.stop - p.start for p in run]
                # Window k of the run: piece ``which[k]``, window ``within[k]`` of it.
                which = np.repeat(np.arange(len(run)), sizes).tolist()
                within = (
                    np.arange(len(which)) - np.repeat(np.cumsum([0, *sizes[:-1]]), sizes)
                ).tolist()
                order = self._order(worker, number, len(which))
                if skip:
                    order, skip = order[skip:], 0
                for k in order:
                    flat, offset = flats[which[k]]
                    start = offset + within[k] * block
                    # A copy: a view would keep (and ship to the main process) the whole run.
                    yield torch.from_numpy(flat[start : start + block].copy())
        finally:
            stream.close()
            fetcher.close()


def _concatenate(arrays: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _buffer(size: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """An array of ``size`` items over a ``bytearray``: numpy asks the kernel for huge
    pages for a large array of its own (``MADV_HUGEPAGE``), and where none are free the
    kernel compacts memory on each first touch, several times slower than plain pages."""
    return np.frombuffer(bytearray(size * dtype.itemsize), dtype)


def _fill(
    out: np.ndarray[Any, Any], arrays: Iterator[np.ndarray[Any, Any]]
) -> np.ndarray[Any, Any]:
    """``out``, filled with ``arrays`` laid end to end, each copied in as it decodes."""
    at = 0
    for array in arrays:
        if at + len(array) > len(out):
            raise CorruptError("the samples hold more tokens than counted")
        out[at : at + len(array)] = array
        at += len(array)
    if at != len(out):
        raise CorruptError(f"{len(out) - at} tokens short: the samples hold fewer than counted")
    return out


def _cut(
    arrays: Iterator[np.ndarray[Any, Any]], offset: int, count: int, block: int
) -> Iterator[torch.Tensor]:
    """``count`` windows of ``block`` tokens from the arrays laid end to end, the first
    ``offset`` tokens left out: each array is copied once into the windows it completes (and
    once more the remainder shorter than a window)."""
    pending: list[np.ndarray[Any, Any]] = []
    have = 0
    for array in arrays:
        if offset:
            cut = min(offset, len(array))
            array, offset = array[cut:], offset - cut
        pending.append(array)
        have += len(array)
        if have < block:
            continue
        flat = _concatenate(pending)
        n = min(have // block, count)
        for k in range(n):
            yield torch.from_numpy(flat[k * block : (k + 1) * block].copy())
        count -= n
        if not count:
            return
        pending, have = [flat[n * block :]], have - n * block
    if count:
        raise CorruptError(
            f"{count} token windows short: the samples hold fewer tokens than counted"
        )


def _stack(windows: list[torch.Tensor]) -> torch.Tensor:
    """The default collate for windows (all of one length): ``default_collate`` stacks them
    into a new shared-memory segment in a worker, which a batch this small then leaves to
    cross the pipe as bytes anyway (``transport``); a plain stack spares making it."""
    return torch.stack(windows)


class TokenStreamingDataLoader(StreamingDataLoader):
    """``StreamingDataLoader`` over a TokenStreamingDataset: saves and resumes its place
    mid-epoch, starts the next epoch on each new iteration, keeps persistent workers; its
    batches are windows stacked into one tensor."""

    def __init__(
        self,
        dataset: TokenStreamingDataset,
        *args: Any,
        collate_fn: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, TokenStreamingDataset):
            raise InvalidArgumentError(
                f"TokenStreamingDataLoader needs a TokenStreamingDataset, not {dataset!r}"
            )
        try:
            super().__init__(dataset, *args, collate_fn=collate_fn, **kwargs)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"TokenStreamingDataLoader: {e}") from None

    def default_collate(self, batched: bool) -> Callable[[Any], Any]:
        return _stack if batched else default_convert


__all__ = ["TokenStreamingDataLoader", "TokenStreamingDataset"]
