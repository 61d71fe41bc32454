"""A storage wrapper that injects faults at the k-th storage call, for crash and network tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from txstore.errors import AlreadyExistsError, StorageError
from txstore.storage import FileInfo, Storage

T = TypeVar("T")

#: before: raise before the call; after: make the call, then raise (a dropped connection);
#: replay: make the call, then raise what a client's replay would see (412 for put_if_absent);
#: kill_before / kill_after: SIGKILL this process before or after the call.
MODES = ("before", "after", "replay", "kill_before", "kill_after")


class InjectedFault(StorageError):
    """The fault this wrapper raised (a StorageError, as a transport failure would be)."""


class FaultyStorage(Storage):
    def __init__(
        self,
        inner: Storage,
        *,
        fail_at: int | None = None,
        mode: str = "before",
        only: frozenset[str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(mode)
        self.inner = inner
        self.uri = inner.uri
        self.storage_options = inner.storage_options
        # What the backend below declares (a wrapper changes which calls fail, nothing else).
        self.is_remote = inner.is_remote
        self.shared_across_processes = inner.shared_across_processes
        self.range_merge_gap = inner.range_merge_gap
        self.fail_at = fail_at
        self.mode = mode
        self.only = only  # count only these operations (None: every call)
        self.calls: list[tuple[str, str]] = []

    @property
    def endpoint(self) -> str:
        return self.inner.endpoint

    @property
    def local_path(self) -> str | None:
        return self.inner.local_path

    def __reduce__(self) -> tuple[Any, ...]:
        return (FaultyStorage, (self.inner,), {"fail_at": None})

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        if self.only is not None and op not in self.only:
            return fn()
        self.calls.append((op, key))
        if len(self.calls) != self.fail_at:
            return fn()
        if self.mode == "kill_before":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "before":
            raise InjectedFault(f"injected fault before {op} {key}")
        try:
            fn()
        finally:  # a call that fails on its own (NotFound) still counts as done
            if self.mode == "kill_after":
                os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "replay" and op == "put_if_absent":
            raise AlreadyExistsError(f"injected: a replayed {op} {key} met its own write")
        raise InjectedFault(f"injected: reply to {op} {key} lost")

    def read(self, key: str) -> bytes:
        return self._call("read", key, lambda: self.inner.read(key))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self._call("read_range", key, lambda: self.inner.read_range(key, start, end))

    def write(self, key: str, data: bytes) -> None:
        self._call("write", key, lambda: self.inner.write(key, data))

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._call("put_if_absent", key, lambda: self.inner.put_if_absent(key, data))

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        return self._call("read_with_token", key, lambda: self.inner.read_with_token(key))

    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        self._call("compare_and_swap", key, lambda: self.inner.compare_and_swap(key, data, token))

    def exists(self, key: str) -> bool:
        return self._call("exists", key, lambda: self.inner.exists(key))

    def list(self, prefix: str) -> Iterator[FileInfo]:
        return self._call("list", prefix, lambda: iter(list(self.inner.list(prefix))))

    def info(self, key: str) -> FileInfo | None:
        return self._call("info", key, lambda: self.inner.info(key))

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.inner.delete(key))

    def writer_lock(self) -> Any:
        return self.inner.writer_lock()
