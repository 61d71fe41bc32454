"""A snapshot read in a forked child (a DataLoader's workers over a snapshot) while threads of
the parent (reading footers ahead, the next chunk) held the locks behind its caches."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import txstore

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")


def _in_forked_child(fn: Callable[[], bytes], timeout: float = 20.0) -> bytes:
    """What ``fn`` returns in a forked child; fails the test if the child hangs or fails."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists here
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, fn())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_end)
            pytest.fail(f"the forked child still waited after {timeout} s")
        time.sleep(0.02)
    try:
        got = os.read(read_end, 1 << 16)
    finally:
        os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0
    return got


def test_a_forked_child_reads_while_a_parent_thread_held_the_readers_locks(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "store")
    store = txstore.create(path, chunk_bytes=8192, block_bytes=2048)
    store.append([{"i": i, "pad": bytes(200)} for i in range(300)])
    snap = txstore.open(path).snapshot()
    assert snap[0]["i"] == 0
    for thread in threading.enumerate():
        if thread.name == "txstore-footers":
            thread.join(30)

    # A thread holds every lock a sample's read takes, as one reading ahead may at the fork.
    held = [snap.reader._lock, snap._segments._lock, snap.storage._maps_lock]
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in held:
            lock.acquire()
        taken.set()
        done.wait()
        for lock in held:
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(10)
    last = len(snap) - 1
    try:
        got = _in_forked_child(lambda: repr(snap[last]["i"]).encode())
    finally:
        done.set()
        holder.join()
    assert got == repr(last).encode()
    assert snap[last]["i"] == last  # the parent's locks work as before
