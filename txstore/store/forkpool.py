"""Worker processes that inherit their job instead of receiving it pickled.

A ``fork`` child starts with a copy of its parent's memory, so a user's function (a closure,
a loaded model) and its inputs reach the workers without pickling. The pool's initializer
keeps the job in each child, where ``job()`` hands it to the task functions; in the parent
it is never set.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

#: The start method every pool here uses; shared values for the workers come from it too.
FORK = multiprocessing.get_context("fork")

_job: Any = None  # set in each worker by the initializer, only there


def _inherit(job: Any) -> None:
    global _job
    _job = job


def fork_pool(num_workers: int, job: Any) -> ProcessPoolExecutor:
    """``num_workers`` forked processes whose tasks can read ``job`` through ``job()``."""
    return ProcessPoolExecutor(
        max(1, num_workers), mp_context=FORK, initializer=_inherit, initargs=(job,)
    )


def job() -> Any:
    """The job of the pool this worker belongs to."""
    if _job is None:
        raise RuntimeError("job() is only for the tasks of a fork_pool")
    return _job
