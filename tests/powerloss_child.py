"""One operation of a power-loss case, run in a child process on a LazyFS mount.

``run_case(OP, ROOT, CUT, VARIANT, SAMPLES)`` runs OP (``OPS``) on the store at ROOT (appends
of SAMPLES samples). Its *steps* are the calls whose order durability rests on: every fsync,
link, rename, replace and unlink. With CUT ``before:K`` or ``after:K`` the process SIGKILLs
itself just before or just after its K-th step, so that the test can cut the power there
(LazyFS then drops every write not fsynced yet); with ``count`` it runs to the end and prints
its steps. It prints one JSON line per acknowledged append or finished operation, as each
returns. ``python -m tests.powerloss_child`` serves cases, each in a process of its own.

VARIANT ``good`` is txstore's LocalStorage; the others are deliberately broken, to show that
the power-loss check catches them: ``unsynced`` never fsyncs a file before publishing it,
``late-sync`` publishes a file first and fsyncs it after.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import txstore
from txstore.errors import AlreadyExistsError
from txstore.storage.base import Data
from txstore.storage.local import TEMP_PREFIX, LocalStorage, _fsync_dir, _write_all

CONFIG: dict[str, Any] = {"chunk_bytes": 4096, "block_bytes": 1024}  # small: many chunks
ROLLBACK_TO = 1
STEP_CALLS = ("fsync", "link", "rename", "replace", "unlink")


def pad(tag: str, i: int) -> bytes:
    """A sample's payload, a pure function of its name: checked byte for byte after a cut."""
    return hashlib.blake2b(f"{tag}/{i}".encode(), digest_size=64).digest() * 2


def batch(tag: str, n: int) -> list[dict[str, Any]]:
    return [{"tag": tag, "i": i, "pad": pad(tag, i)} for i in range(n)]


def extra(sample: dict[str, Any]) -> dict[str, Any]:
    """The field that ``add_fields`` computes."""
    return {"extra": f"{sample['tag']}/{sample['i']}"}


class UnsyncedStorage(LocalStorage):
    """Broken: writes the temp file but never fsyncs it before the link or replace."""

    def _write_temp(self, path: str, data: Data) -> str:
        parent = self._parent(path)
        tmp = os.path.join(parent, f"{TEMP_PREFIX}{uuid.uuid4().hex}.{os.path.basename(path)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, [data] if isinstance(data, bytes) else data)
        finally:
            os.close(fd)
        return tmp


class LateSyncStorage(UnsyncedStorage):
    """Broken: publishes the unsynced temp file, then fsyncs the published file."""

    def write(self, key: str, data: Data) -> None:
        path = self._path(key)
        os.replace(self._write_temp(path, data), path)
        _fsync_dir(os.path.dirname(path))
        self._fsync_file(path)

    def put_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise AlreadyExistsError(f"{key} exists") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        _fsync_dir(os.path.dirname(path))
        self._fsync_file(path)

    @staticmethod
    def _fsync_file(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


VARIANTS: dict[str, type[LocalStorage]] = {
    "good": LocalStorage,
    "unsynced": UnsyncedStorage,
    "late-sync": LateSyncStorage,
}


def emit(**record: Any) -> None:
    print(json.dumps(record), flush=True)


def run_append(store: txstore.Store, samples: int) -> None:
    for tag in ("a0", "a1"):  # the second runs with the first acknowledged
        emit(ack=tag, version=store.append(batch(tag, samples), txn_id=tag).version)


def run_compact(store: txstore.Store, samples: int) -> None:
    result = store.compact()
    assert result.commit is not None, "nothing to compact: the base store is wrong"
    emit(done="compact", version=result.commit.version)


def run_add_fields(store: txstore.Store, samples: int) -> None:
    emit(done="add_fields", version=store.add_fields(extra, ["extra"]).version)


def run_rollback(store: txstore.Store, samples: int) -> None:
    emit(done="rollback", version=store.rollback(ROLLBACK_TO).version)


def run_vacuum(store: txstore.Store, samples: int) -> None:
    report = store.vacuum(grace=0)
    emit(done="vacuum", deleted=len(report.files))


OPS: dict[str, Callable[[txstore.Store, int], None]] = {
    "append": run_append,
    "compact": run_compact,
    "add_fields": run_add_fields,
    "rollback": run_rollback,
    "vacuum": run_vacuum,
}


def install_steps(root: str, cut: str) -> list[str]:
    """Wrap the step calls of ``os``: count them, and SIGKILL this process at the cut."""
    steps: list[str] = []
    lock = threading.Lock()  # compaction writes chunks from several threads
    timing, _, at = cut.partition(":")
    target = int(at) if at else 0

    def name(call: str, args: tuple[Any, ...]) -> str:
        if call == "fsync":
            with contextlib.suppress(OSError):
                return os.path.relpath(os.readlink(f"/proc/self/fd/{args[0]}"), root)
            return "?"
        path = args[1] if call in ("link", "rename", "replace") else args[0]
        return os.path.relpath(os.fspath(path), root)

    def wrap(call: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            with lock:
                steps.append(f"{call} {name(call, args)}")
                at = len(steps) == target
            if at and timing == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            result = real(*args, **kwargs)
            if at and timing == "after":
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        return step

    for call in STEP_CALLS:
        setattr(os, call, wrap(call, getattr(os, call)))
    return steps


def run_case(op: str, root: str, cut: str, variant: str, samples: int) -> None:
    store = txstore.open(VARIANTS[variant](root))
    steps = install_steps(root, cut)
    OPS[op](store, samples)
    store.close()
    emit(steps=steps)


def serve() -> None:
    """Run each case that arrives on stdin (one JSON list of ``run_case``'s arguments a line)
    in a process forked from this one, which has imported txstore already; answer each with
    one JSON line: the case's exit code (-9: killed at its cut) and what it printed."""
    for line in sys.stdin:
        case = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the case: its prints go to the pipe
            os.close(read_end)
            os.dup2(write_end, 1)
            code = 0
            try:
                run_case(*case)
            except BaseException:
                emit(error=traceback.format_exc())
                code = 1
            sys.stdout.flush()
            os._exit(code)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            out = pipe.read()
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print(json.dumps({"code": code, "out": out}), flush=True)


if __name__ == "__main__":
    serve()
