"""Locks that a forked child gets back released.

A lock that one of the parent's threads holds at the moment of ``fork`` stays held in the
child, where that thread does not exist: the child's first use of it waits forever. Readers
keep caches behind locks and read ahead on threads of their own (the footers of a random
reader, the next chunk of a scan), and a process may fork at any time (a DataLoader's workers
over a snapshot). ``renew_after_fork`` names an object's lock attributes, and a forked child
finds fresh ones there, as CPython's ``threading`` and ``concurrent.futures`` renew their own
(one hook for the process, objects held weakly).
"""

from __future__ import annotations

import os
import threading
import weakref

_OWNERS: weakref.WeakKeyDictionary[object, tuple[str, ...]] = weakref.WeakKeyDictionary()


def renew_after_fork(owner: object, *names: str) -> None:
    """In a forked child, give ``owner`` a new ``threading.Lock`` under each of ``names``."""
    _OWNERS[owner] = names


def _renew() -> None:
    for owner, names in list(_OWNERS.items()):
        for name in names:
            setattr(owner, name, threading.Lock())


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_renew)
