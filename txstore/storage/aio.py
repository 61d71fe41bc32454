"""Requests of the fsspec-based backends (S3, GCS, Azure), run on their client's event loop.

One place that blocks on that loop, so that a backend can send many requests at once: the
ranges of one object (``read_ranges``) travel together, at most ``limit`` in flight, instead of
one round trip after another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from fsspec.asyn import sync

from ..errors import NotFoundError

_T = TypeVar("_T")


def run(loop: Any, make: Callable[[], Awaitable[_T]]) -> _T:
    """``make()`` awaited on ``loop`` (the client's own thread), from a plain thread."""

    async def call() -> _T:
        return await make()

    result: _T = sync(loop, call)
    return result


def run_all(loop: Any, makes: Sequence[Callable[[], Awaitable[_T]]], limit: int) -> list[_T]:
    """Each ``make()`` awaited on ``loop``, at most ``limit`` at a time, results in order.
    Every call finishes (none is left running) before the first failure, if any, is raised."""
    if len(makes) == 1:
        return [run(loop, makes[0])]

    async def call() -> list[_T]:
        gate = asyncio.Semaphore(max(1, limit))

        async def one(make: Callable[[], Awaitable[_T]]) -> _T:
            async with gate:
                return await make()

        found = await asyncio.gather(*(one(make) for make in makes), return_exceptions=True)
        for item in found:
            if isinstance(item, BaseException):
                raise item
        return found  # type: ignore[return-value]

    result: list[_T] = sync(loop, call)
    return result


#: How much of a streamed reply is gathered before it is handed to ``put``: one write of
#: the buffers received (no join), not one per buffer of 64-256 KiB.
HAND_OVER_BYTES = 1 << 20


class PutFailed(Exception):
    """A ``put`` of ``read_ranges_into`` failed: a backend passes it on untouched (never
    retried or reported as a failed read), and ``read_ranges_into`` raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def hand_over(
    put: Callable[[int, list[bytes]], None], offset: int, pieces: list[bytes]
) -> None:
    """``put(offset, pieces)`` on a thread of the loop's executor: the loop goes on reading
    the other ranges (and the rest of this one) while these bytes are written."""
    try:
        await asyncio.get_running_loop().run_in_executor(None, put, offset, pieces)
    except Exception as e:
        raise PutFailed(e) from e


class LoopReads:
    """``read_ranges`` and ``read_many`` for a backend whose client runs on an event loop.
    The backend gives ``_fs`` (its fsspec filesystem), ``max_in_flight``, and two coroutines
    that raise txstore errors: ``_aread(key)`` and ``_read_range(key, start, end)``."""

    _fs: Any
    max_in_flight: int

    async def _aread(self, key: str) -> bytes:
        raise NotImplementedError

    async def _read_range(self, key: str, start: int, end: int) -> bytes:
        raise NotImplementedError

    def read_range(self, key: str, start: int, end: int) -> bytes:
        raise NotImplementedError

    async def _read_or_none(self, key: str) -> bytes | None:
        try:
            return await self._aread(key)
        except NotFoundError:
            return None

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if any(end <= start for start, end in ranges):  # read_range's own answer for those
            return [self.read_range(key, start, end) for start, end in ranges]
        makes = [partial(self._read_range, key, start, end) for start, end in ranges]
        return run_all(self._fs.loop, makes, self.max_in_flight)

    async def _read_range_into(
        self, key: str, start: int, end: int, put: Callable[[int, list[bytes]], None]
    ) -> None:
        """Bytes [start, end) handed to ``put`` (``Storage.read_ranges_into``); a backend
        that can stream a reply hands them over as they arrive. This one reads them whole."""
        await hand_over(put, start, [await self._read_range(key, start, end)])

    def read_ranges_into(
        self, key: str, ranges: Sequence[tuple[int, int]], put: Callable[[int, list[bytes]], None]
    ) -> None:
        if any(end <= start for start, end in ranges):
            for start, end in ranges:
                put(start, [self.read_range(key, start, end)])
            return
        makes = [partial(self._read_range_into, key, start, end, put) for start, end in ranges]
        try:
            run_all(self._fs.loop, makes, self.max_in_flight)
        except PutFailed as e:
            raise e.error from None

    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        makes = [partial(self._read_or_none, key) for key in keys]
        return run_all(self._fs.loop, makes, self.max_in_flight)
