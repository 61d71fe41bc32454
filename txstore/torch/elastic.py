"""What of an epoch is still to be read, so that another number of workers or ranks can go on.

An epoch of a StreamingDataset is a sequence of positions in its chunk order. A resumed epoch
reads a ``todo``: a list of segments, each either a run of positions ``[a, b]`` or the slice
``[a, b, key, number, lo, hi]`` of one shuffle window: the samples ``lo`` to ``hi`` of the
window over positions [a, b) in the order that (key, number) shuffles it into. The todo's
samples are split over ranks and workers as a fresh epoch's positions are, so each worker
reads a list of *items*, runs and slices with the key that shuffles them.

Given the samples each worker has delivered (the same on every rank: DDP ranks take batches in
lockstep, and equal shares split alike over their workers), ``unseen`` finds what no worker
has delivered yet, window by window: a window read whole is done, a window read in part leaves
a slice of itself, the windows after it a run. That is again a todo, so a resumed epoch can be
checkpointed and resumed again, on yet another topology.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: A run [a, b] of positions, or a window's slice [a, b, key, number, lo, hi].
Segment = list[Any]
#: A worker's read: ["run", a, b, key] or ["slice", a, b, key, number, lo, hi].
Item = list[Any]


def segment_size(segment: Segment) -> int:
    return int(segment[1] - segment[0] if len(segment) == 2 else segment[5] - segment[4])


def is_todo(todo: Any, total: int) -> bool:
    """Whether ``todo`` (from a saved state) is a list of segments, runs ``[a, b]`` and
    window slices ``[a, b, key, number, lo, hi]``, of positions within ``total``."""
    return isinstance(todo, list) and all(_is_segment(s, total) for s in todo)


def _is_segment(segment: Any, total: int) -> bool:
    if not isinstance(segment, list) or len(segment) not in (2, 6):
        return False
    a, b = segment[0], segment[1]
    if not (type(a) is int and type(b) is int and 0 <= a <= b <= total):
        return False
    if len(segment) == 2:
        return True
    key, number, lo, hi = segment[2:]
    return (
        isinstance(key, str)
        and type(number) is int
        and type(lo) is int
        and type(hi) is int
        and 0 <= lo <= hi <= b - a
    )


def worker_range(total: int, per_rank: int, rank: int, worker: int, workers: int) -> range:
    """The indices of the epoch's sequence one worker reads; past ``total`` they wrap around
    (the repetition that evens out ranks)."""
    base, extra = divmod(per_rank, workers)
    first = rank * per_rank + worker * base + min(worker, extra)
    return range(first, first + base + (1 if worker < extra else 0))


def worker_items(todo: list[Segment], indices: range, key: str) -> tuple[list[Item], int]:
    """The items one worker reads for ``indices`` of ``todo``, and how many of its samples come
    before the wrap-around (the padding after them repeats other workers' samples)."""
    total = sum(segment_size(s) for s in todo)
    items: list[Item] = []
    if total == 0:
        return items, 0
    index, stop = indices.start, indices.stop
    while index < stop:
        lap = index - index % total
        offset, end = index - lap, min(stop - lap, total)
        at = 0
        for segment in todo:
            size = segment_size(segment)
            lo, hi = max(offset, at) - at, min(end, at + size) - at
            if lo < hi:
                sub = f"{key}/{len(items)}"
                if len(segment) == 2:
                    items.append(["run", segment[0] + lo, segment[0] + hi, sub])
                else:
                    a, b, window_key, number, first, _ = segment
                    items.append(["slice", a, b, window_key, number, first + lo, first + hi])
            at += size
        index = lap + end
    return items, max(0, min(stop, total) - indices.start)


def unseen(
    todo: list[Segment],
    *,
    per_rank: int,
    world_size: int,
    workers: int,
    delivered: dict[int, int],
    items: Callable[[int, int], tuple[list[Item], int]],
    windows: Callable[[int, int], list[tuple[int, int]]],
) -> list[Segment]:
    """What of ``todo`` no worker has delivered: ``delivered`` samples by each worker of every
    rank, ``items(rank, worker)`` what it reads (``worker_items``), ``windows(a, b)`` the
    windows a run of positions is shuffled in (position ranges, in order)."""
    total = sum(segment_size(s) for s in todo)
    out: list[Segment] = []
    for rank in range(world_size):
        for worker in range(workers):
            reads, real = items(rank, worker)
            out += left(reads, delivered.get(worker, 0), real, windows)
    # Samples past the ranks' equal shares (drop_last) were read by none.
    out += segments_of(todo, world_size * per_rank, total)
    return merged(out)


def segments_of(todo: list[Segment], start: int, stop: int) -> list[Segment]:
    """Indices [start, stop) of ``todo`` (no wrap) as segments."""
    out: list[Segment] = []
    at = 0
    for segment in todo:
        size = segment_size(segment)
        lo, hi = max(start, at) - at, min(stop, at + size) - at
        if lo < hi:
            if len(segment) == 2:
                out.append([segment[0] + lo, segment[0] + hi])
            else:
                a, b, window_key, number, first, _ = segment
                out.append([a, b, window_key, number, first + lo, first + hi])
        at += size
    return out


def left(
    items: list[Item],
    done: int,
    limit: int,
    windows: Callable[[int, int], list[tuple[int, int]]],
) -> list[Segment]:
    """What of one worker's first ``limit`` samples is left once it has delivered ``done``.

    Past ``limit`` the worker repeats samples of others (padding), which are left to them; a
    window that holds both is kept whole, since its order mixes them (a repeat, never a loss).
    """
    out: list[Segment] = []
    at = 0  # samples of the worker's sequence before this window or slice
    for item in items:
        if item[0] == "slice":
            if at >= limit:
                break
            _, a, b, window_key, number, lo, hi = item
            if lo + max(0, done - at) < hi:
                out.append([a, b, window_key, number, lo + max(0, done - at), hi])
            at += hi - lo
            continue
        _, a, b, item_key = item
        for number, (wa, wb) in enumerate(windows(a, b)):
            if at >= limit:
                return out
            size = wb - wa
            seen = min(size, max(0, done - at))
            if seen == 0:
                out.append([wa, wb])
            elif seen < size:
                out.append([wa, wb, item_key, number, seen, size])
            at += size
    return out


def merged(segments: list[Segment]) -> list[Segment]:
    """Adjacent runs joined, so that the todo stays short."""
    out: list[Segment] = []
    for segment in segments:
        if len(segment) == 2 and out and len(out[-1]) == 2 and out[-1][1] == segment[0]:
            out[-1] = [out[-1][0], segment[1]]
        elif segment_size(segment) > 0:
            out.append(list(segment))
    return out
