"""Requests of the fsspec-based backends (S3, GCS, Azure), run on their client's event loop.

One place that blocks on that loop, so that a backend can send many requests at once: the
ranges of one object (``read_ranges``) travel together, at most ``limit`` in flight, instead of
one round trip after another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fsspec.asyn import sync

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
