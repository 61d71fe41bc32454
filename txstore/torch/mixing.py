"""A weighted mix of StreamingDatasets, planned a whole epoch at a time.

An epoch of the mix is a sequence of L source ids in which source i occurs exactly c_i times,
c_i being L apportioned by the weights (largest remainders). L is as long as the sources allow
without repeating a sample ("stop"), or as long as the last source to run out needs, the
others starting over in a new order when they run out ("cycle"), or ``epoch_size``.

Where each source's samples fall in the sequence: the j-th sample of source i is at time
(j + u) / c_i, u drawn from a hash of (seed, epoch, i, j); the sequence is every source's
samples sorted by time. So every stretch of the sequence holds each source in proportion,
give or take a sample or two, in an order the seed varies, and how many samples of each
source come before any position is found without walking the sequence from its start
(``Schedule.counts_at``). The sequence is split into ranks and workers as a StreamingDataset
splits its samples: contiguous, equal shares. Each worker reads, of each source, the
contiguous run of that source's epoch order its part of the sequence takes, so it still reads
whole chunks in turn.

Resumed on another topology, the rest of an epoch is, of each source, what no worker had
delivered (``elastic``), mixed by a schedule of its own over what is left of each.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import math
import random
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from ..errors import ResumeMismatchError
from . import elastic
from .dataset import (
    LoaderDataset,
    Piece,
    StreamingDataset,
    _bool,
    _check_layout,
    _distributed,
    _int,
    _pieces,
    samples_per_rank,
    worker_share,
)

MODES = ("stop", "cycle")


def _todo_size(todo: list[elastic.Segment]) -> int:
    return sum(elastic.segment_size(s) for s in todo)


_MASK = (1 << 64) - 1


def _apportion(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (which sum to 1): floors, then one more
    to the largest remainders, the earlier source first on a tie."""
    quotas = [total * w for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def epoch_counts(
    sizes: Sequence[int], weights: Sequence[float], mode: str, epoch_size: int | None
) -> list[int]:
    """How many samples each source gives an epoch of the mix."""
    if epoch_size is not None:
        counts = _apportion(epoch_size, weights)
        if mode == "stop":
            for i, (count, size) in enumerate(zip(counts, sizes, strict=True)):
                if count > size:
                    raise ValueError(
                        f"epoch_size={epoch_size} needs {count} samples of source {i}, which "
                        f'has {size}; pass on_exhausted="cycle" to repeat its samples'
                    )
        return counts
    if mode == "stop":
        # The longest epoch in which no source gives more samples than it has.
        total = min(math.floor(size / w) for size, w in zip(sizes, weights, strict=True))
        while all(c <= s for c, s in zip(_apportion(total + 1, weights), sizes, strict=True)):
            total += 1
        return _apportion(total, weights)
    # "cycle": the shortest epoch in which every source gives all of its samples.
    total = max(math.ceil(size / w) for size, w in zip(sizes, weights, strict=True))
    while total > 0 and all(
        c >= s for c, s in zip(_apportion(total - 1, weights), sizes, strict=True)
    ):
        total -= 1
    while not all(c >= s for c, s in zip(_apportion(total, weights), sizes, strict=True)):
        total += 1
    return _apportion(total, weights)


class Schedule:
    """The source ids of one epoch of a mix, position by position (see the module's doc)."""

    def __init__(self, counts: Sequence[int], seed: int, epoch: int, resumed: int = 0) -> None:
        self.counts = list(counts)
        self.total = sum(counts)
        # A resumed epoch's rest (``resumed`` times resumed on another topology) has its own.
        name = f"txstore/mix/{seed}/{epoch}" + (f"/resumed/{resumed}" if resumed else "")
        digest = hashlib.sha256(name.encode()).digest()
        self._base = int.from_bytes(digest[:8], "little")

    def time(self, i: int, j: int) -> float:
        """When the j-th sample of source i comes, in [0, 1]."""
        x = (self._base + (i + 1) * 0x9E3779B97F4A7C15 + j * 0xD1B54A32D192ED03) & _MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK  # splitmix64's finalizer
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
        x ^= x >> 31
        return (j + (x >> 11) * 2.0**-53) / self.counts[i]

    def _before(self, i: int, t: float) -> int:
        """How many samples of source i come before time ``t``: the j-th comes within
        [j, j + 1) / c_i, so only those next to t * c_i need looking at."""
        count = self.counts[i]
        guess = min(count, max(0, int(t * count)))
        low, high = max(0, guess - 2), min(count, guess + 2)
        return low + sum(1 for j in range(low, high) if self.time(i, j) < t)

    def counts_at(self, position: int) -> list[int]:
        """How many samples of each source the first ``position`` of the sequence hold."""
        if position >= self.total:
            return list(self.counts)
        sources = [i for i, c in enumerate(self.counts) if c]

        def before(t: float) -> list[int]:
            return [self._before(i, t) if i in sources else 0 for i in range(len(self.counts))]

        low, high = 0.0, 2.0  # before(low) sums to at most position, before(high) beyond
        low_counts, high_counts = before(low), list(self.counts)
        while sum(high_counts) - sum(low_counts) > 4 * len(sources):
            middle = (low + high) / 2
            if middle in (low, high):
                break
            counts = before(middle)
            if sum(counts) <= position:
                low, low_counts = middle, counts
            else:
                high, high_counts = middle, counts
        # The few samples between the two times, in the sequence's order.
        between = sorted(
            (self.time(i, j), i, j) for i in sources for j in range(low_counts[i], high_counts[i])
        )
        counts = list(low_counts)
        for _, i, _ in between[: position - sum(low_counts)]:
            counts[i] += 1
        return counts

    def sources(self, start: int, stop: int) -> Iterator[int]:
        """The source ids at positions [start, stop)."""
        at = self.counts_at(start)
        heap = [(self.time(i, j), i, j) for i, j in enumerate(at) if j < self.counts[i]]
        heapq.heapify(heap)
        for _ in range(stop - start):
            _, i, j = heap[0]
            yield i
            if j + 1 < self.counts[i]:
                heapq.heapreplace(heap, (self.time(i, j + 1), i, j + 1))
            else:
                heapq.heappop(heap)


def _weights(value: object, count: int, sizes: list[int]) -> list[float]:
    if value is None:  # in proportion to the sources' sizes, as LitData's default
        total = sum(sizes)
        if total == 0:
            raise ValueError("MixedStreamingDataset: every source is empty")
        return [size / total for size in sizes]
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"weights must be a list of numbers or None, not {value!r}")
    weights = list(value)
    if len(weights) != count:
        raise ValueError(f"weights has {len(weights)} numbers for {count} datasets")
    for i, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise TypeError(f"weights[{i}] must be a number, not {weight!r}")
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weights[{i}] must be a positive number, not {weight!r}")
    weight_sum = math.fsum(weights)
    return [weight / weight_sum for weight in weights]


class MixedStreamingDataset(LoaderDataset):
    """Samples of several StreamingDatasets, mixed in proportion to ``weights``.

    ``weights`` (any positive numbers; default: the sources' sizes) give each source's share
    of an epoch, exactly: an epoch of L samples holds L apportioned by the weights of each.
    With ``on_exhausted="stop"`` (default) the epoch is as long as the sources allow with no
    sample twice: it ends where the first source would run out. With ``"cycle"`` it is as long
    as the last source to run out needs, and a source that runs out before starts over, in
    another order. ``epoch_size`` sets L instead (in "stop" mode, no longer than the sources
    allow). The order is a pure function of the sources' snapshots, the weights, ``seed``, the
    epoch, the world size and the number of workers; each source's ``shuffle`` and
    ``shuffle_window`` say how its own samples are ordered, its ``fields`` and ``transform``
    still apply; its seed, epoch, rank and ``drop_last`` are the mix's. Ranks get equal shares
    as a StreamingDataset's do (``drop_last``). Iterate it through a StreamingDataLoader to
    resume mid-epoch (``state_dict``), on the same or another number of workers and ranks.
    """

    def __init__(
        self,
        datasets: Sequence[StreamingDataset],
        weights: Sequence[float] | None = None,
        *,
        seed: int = 42,
        on_exhausted: str = "stop",
        epoch_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        if isinstance(datasets, StreamingDataset) or not isinstance(datasets, Sequence):
            raise TypeError(f"datasets must be a list of StreamingDatasets, not {datasets!r}")
        sources = list(datasets)
        if not sources:
            raise ValueError("MixedStreamingDataset needs at least one dataset")
        for i, ds in enumerate(sources):
            if not isinstance(ds, StreamingDataset):
                raise TypeError(f"datasets[{i}] must be a StreamingDataset, not {ds!r}")
        if on_exhausted not in MODES:
            raise ValueError(f'on_exhausted must be "stop" or "cycle", not {on_exhausted!r}')
        self.seed = _int("seed", seed)
        self.drop_last = _bool("drop_last", drop_last)
        self.epoch_size = None if epoch_size is None else _int("epoch_size", epoch_size, 0)
        self.datasets = sources
        self.sizes = [len(ds.snapshot) for ds in sources]
        self.weights = _weights(weights, len(sources), self.sizes)
        self.on_exhausted = on_exhausted
        if on_exhausted == "cycle":
            for i, size in enumerate(self.sizes):
                if size == 0:
                    raise ValueError(f"datasets[{i}] is empty: it cannot be cycled")
        self.counts = epoch_counts(self.sizes, self.weights, on_exhausted, self.epoch_size)
        self.epoch = 0
        self.rank, self.world_size = _distributed()
        self.skip = {}

    @property
    def samples_per_epoch(self) -> int:
        """Samples of an epoch across all ranks, before evening them out."""
        return sum(self.counts)

    def __len__(self) -> int:
        """Samples this rank yields per epoch (or in the rest of a resumed one)."""
        total = sum(map(_todo_size, self._todos(self.todo)))
        return samples_per_rank(total, self.world_size, self.drop_last)

    def _valid_todo(self, todo: Any) -> bool:
        if todo is None:
            return True
        if not isinstance(todo, dict) or type(todo.get("resumed")) is not int:
            return False
        sources = todo.get("sources")
        return (
            isinstance(sources, list)
            and len(sources) == len(self.counts)
            and todo["resumed"] >= 0
            and all(
                elastic.is_todo(segments, count)
                for segments, count in zip(sources, self.counts, strict=True)
            )
        )

    def _todos(self, todo: Any) -> list[list[elastic.Segment]]:
        """What of each source's run the epoch reads (``elastic``): all of it, or the rest
        of an epoch resumed on another topology."""
        if todo is None:
            return [[[0, count]] for count in self.counts]
        sources: list[list[elastic.Segment]] = todo["sources"]
        return sources

    def _parts(
        self, total: int, rank: int, worker: int, workers: int, world: int
    ) -> Iterator[tuple[int, int, int]]:
        """(part, start, stop): the positions of the epoch's sequence one worker yields, a
        part per pass over it (a second only to even out the ranks, repeating the start)."""
        per_rank = samples_per_rank(total, world, self.drop_last)
        indices = elastic.worker_range(total, per_rank, rank, worker, workers)
        position, part = indices.start, 0
        while total and position < indices.stop:
            lap_base = position - position % total
            start, end = position - lap_base, min(indices.stop - lap_base, total)
            yield part, start, end
            position, part = lap_base + end, part + 1

    def _part_items(
        self,
        todos: list[list[elastic.Segment]],
        schedule: Schedule,
        key: str,
        start: int,
        stop: int,
    ) -> tuple[list[int], list[list[elastic.Item]]]:
        """Where each source's share of positions [start, stop) begins in its todo, and the
        items that read it."""
        first, last = schedule.counts_at(start), schedule.counts_at(stop)
        items = [
            elastic.worker_items(todos[i], range(first[i], last[i]), f"{key}/{i}")[0]
            for i in range(len(todos))
        ]
        return first, items

    def _read_items(
        self, i: int, items: list[elastic.Item], skip: int
    ) -> Generator[Any, None, None]:
        """Source i's samples of ``items`` but the first ``skip``."""
        source = self.datasets[i]
        for item in items:
            size = item[2] - item[1] if item[0] == "run" else item[6] - item[5]
            if skip >= size:
                skip -= size
                continue
            if item[0] == "run":
                yield from source._read(self._source_pieces(i, item[1], item[2]), item[3], skip)
            else:
                _, a, b, key, number, lo, hi = item
                window = source._iterate([self._source_pieces(i, a, b)], key, number, lo + skip)
                yield from itertools.islice(window, hi - lo - skip)
            skip = 0

    def _windows(self, i: int, start: int, stop: int) -> list[tuple[int, int]]:
        """The ranges of source i's run positions that reading [start, stop) shuffles within."""
        pieces, step, out = self._source_pieces(i, start, stop), self.datasets[i].shuffle_window, []
        for k in range(0, len(pieces), step):
            size = sum(p.stop - p.start for p in pieces[k : k + step])
            out.append((start, start + size))
            start += size
        return out

    def _source_pieces(self, i: int, start: int, stop: int) -> list[Piece]:
        """Samples [start, stop) of source i's run through the epoch: its epoch order, then
        (cycling) another order for each time it starts over."""
        source, size = self.datasets[i], self.sizes[i]
        chunks = list(range(len(source._sizes)))
        out: list[Piece] = []
        for lap in range(start // size, -(-stop // size)):
            order = list(chunks)
            if source.shuffle:
                random.Random(f"txstore/mix/chunks/{self.seed}/{self.epoch}/{i}/{lap}").shuffle(
                    order
                )
            lap_start = max(start, lap * size) - lap * size
            lap_stop = min(stop, (lap + 1) * size) - lap * size
            out += _pieces(source._sizes, order, lap_start, lap_stop)
        return out

    def _key(self, resumed: int, rank: int, worker: int, part: int) -> str:
        return f"mix/{self.seed}/{self.epoch}/{resumed}/{rank}/{worker}/{part}"

    def __iter__(self) -> Iterator[Any]:
        self._follow_control()
        worker, num_workers = worker_share()
        todos = self._todos(self.todo)
        resumed = 0 if self.todo is None else self.todo["resumed"]
        schedule = Schedule(list(map(_todo_size, todos)), self.seed, self.epoch, resumed)
        skip = self.skip.get(worker, 0)
        for part, start, stop in self._parts(
            schedule.total, self.rank, worker, num_workers, self.world_size
        ):
            if skip >= stop - start:
                skip -= stop - start
                continue
            key = self._key(resumed, self.rank, worker, part)
            yield from self._part(todos, schedule, key, start, stop, skip)
            skip = 0

    def _part(
        self,
        todos: list[list[elastic.Segment]],
        schedule: Schedule,
        key: str,
        start: int,
        stop: int,
        skip: int,
    ) -> Iterator[Any]:
        """Positions [start, stop) of the sequence but the first ``skip``: each source's share
        is read from where the part begins (so that its windows shuffle as they did before a
        resume), its first samples skipped."""
        first, items = self._part_items(todos, schedule, key, start, stop)
        at = schedule.counts_at(start + skip)
        readers = {i: self._read_items(i, items[i], at[i] - first[i]) for i in range(len(todos))}
        try:
            for i in schedule.sources(start + skip, stop):
                yield next(readers[i])
        finally:
            for reader in readers.values():
                reader.close()

    def _unseen(self, state: dict[str, Any]) -> dict[str, Any]:
        """The rest of the state's epoch: of each source, what no worker of any rank had
        delivered (``elastic.left``), to be mixed again in the same proportions."""
        todo, workers, world = state.get("todo"), state["num_workers"], state["world_size"]
        delivered = {int(k): int(v) for k, v in state["delivered"].items()}
        saved = self.seed, self.epoch  # the state's order, to find what it delivered
        self.seed, self.epoch = state["seed"], state["epoch"]
        try:
            todos = self._todos(todo)
            resumed = 0 if todo is None else todo["resumed"]
            schedule = Schedule(list(map(_todo_size, todos)), self.seed, self.epoch, resumed)
            rest: list[list[elastic.Segment]] = [[] for _ in todos]
            for rank in range(world):
                for worker in range(workers):
                    done = delivered.get(worker, 0)
                    parts = self._parts(schedule.total, rank, worker, workers, world)
                    for part, start, stop in parts:
                        if part:  # past the end: the padding repeats others' samples
                            break
                        key = self._key(resumed, rank, worker, part)
                        first, items = self._part_items(todos, schedule, key, start, stop)
                        at = schedule.counts_at(start + min(done, stop - start))
                        last = schedule.counts_at(stop)
                        for i in range(len(todos)):
                            rest[i] += elastic.left(
                                items[i],
                                at[i] - first[i],
                                last[i] - first[i],
                                functools.partial(self._windows, i),
                            )
            # Positions past the ranks' equal shares (drop_last) were read by none.
            per_rank = samples_per_rank(schedule.total, world, self.drop_last)
            tail, end = schedule.counts_at(world * per_rank), schedule.counts_at(schedule.total)
            for i in range(len(todos)):
                rest[i] += elastic.segments_of(todos[i], tail[i], end[i])
            return {"sources": [elastic.merged(r) for r in rest], "resumed": resumed + 1}
        finally:
            self.seed, self.epoch = saved

    def _describe(self) -> dict[str, Any]:
        sources = []
        for ds in self.datasets:
            uri, version, commit_id = ds.snapshot.identity
            sources.append(
                {
                    "store": uri,
                    "version": version,
                    "commit_id": commit_id,
                    "shuffle": ds.shuffle,
                    "shuffle_window": ds.shuffle_window,
                }
            )
        return {
            "mix": {
                "weights": self.weights,
                "on_exhausted": self.on_exhausted,
                "epoch_size": self.epoch_size,
                "drop_last": self.drop_last,
                "sources": sources,
            }
        }

    def _check_resume(self, state: dict[str, Any], allow_other_version: bool) -> None:
        mix = state.get("mix")
        if not isinstance(mix, dict):
            raise ResumeMismatchError(
                "the state is a StreamingDataset's; this loader reads a MixedStreamingDataset"
            )
        mine = self._describe()["mix"]
        sources = mix.get("sources")
        if not isinstance(sources, list) or not all(isinstance(x, dict) for x in sources):
            raise ResumeMismatchError(f"a bad loader state: 'mix' has sources {sources!r}")
        if len(sources) != len(mine["sources"]):
            raise ResumeMismatchError(
                f"the state mixes {len(sources)} datasets, this loader {len(mine['sources'])}"
            )
        for i, (then, now) in enumerate(zip(sources, mine["sources"], strict=True)):
            if (then.get("version"), then.get("commit_id")) != (
                now["version"],
                now["commit_id"],
            ) and not allow_other_version:
                raise ResumeMismatchError(
                    f"dataset {i} of the state is version {then.get('version')} (commit "
                    f"{then.get('commit_id')}) of {then.get('store')}; this one reads version "
                    f"{now['version']} (commit {now['commit_id']}). Pass "
                    "allow_other_version=True to resume anyway"
                )
            _check_layout(
                {f"datasets[{i}].{k}": v for k, v in then.items()},
                {f"datasets[{i}].{k}": now[k] for k in ("shuffle", "shuffle_window")},
            )
        _check_layout(
            mix, {k: mine[k] for k in ("weights", "on_exhausted", "epoch_size", "drop_last")}
        )


__all__ = ["MixedStreamingDataset", "Schedule", "epoch_counts"]
