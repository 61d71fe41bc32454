"""An in-process backend: a dict under a lock. For tests, demos and caches."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..errors import AlreadyExistsError, NotFoundError, RefChangedError
from .base import Data, FileInfo, Storage, join

# Named memory stores live for the process, so "memory://name" opens what create() made.
_Entry = tuple[bytes, float, int]  # data, mtime, generation (the CAS token)


class _Objects:
    """A store's objects, and the keys under each folder (every "a/", "a/b/" a key is in, and
    "" for all): listing a folder reads its keys, not every key of the store."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._folders: dict[str, set[str]] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __getitem__(self, key: str) -> _Entry:
        return self._entries[key]

    def get(self, key: str) -> _Entry | None:
        return self._entries.get(key)

    def __setitem__(self, key: str, entry: _Entry) -> None:
        if key not in self._entries:
            for folder in _folders_of(key):
                self._folders.setdefault(folder, set()).add(key)
        self._entries[key] = entry

    def discard(self, key: str) -> None:
        if self._entries.pop(key, None) is not None:
            for folder in _folders_of(key):
                keys = self._folders[folder]
                keys.discard(key)
                if not keys:
                    del self._folders[folder]

    def under(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix``."""
        folder = prefix[: prefix.rfind("/") + 1]
        keys = self._folders.get(folder, ())
        return list(keys) if folder == prefix else [k for k in keys if k.startswith(prefix)]


def _folders_of(key: str) -> list[str]:
    ends = [i + 1 for i, c in enumerate(key) if c == "/"]
    return ["", *(key[:end] for end in ends)]


_named: dict[str, _Objects] = {}
_generation = itertools.count(1)
_named_lock = threading.Lock()


class MemoryStorage(Storage):
    shared_across_processes = False
    is_remote = False

    def __init__(self, name: str | None = None) -> None:
        self.storage_options: dict[str, Any] = {}
        self._lock = threading.Lock()
        if name is None:
            self.uri = f"memory://anonymous-{id(self):x}"
            self._objects = _Objects()
        else:
            self.uri = f"memory://{name}"
            with _named_lock:
                self._objects = _named.setdefault(name, _Objects())

    @property
    def endpoint(self) -> str:
        return "memory"

    def __reduce__(self) -> tuple[Any, ...]:
        # A memory store cannot cross a process boundary; within one it stays the same dict.
        if self.uri.startswith("memory://anonymous-"):
            raise TypeError("an anonymous MemoryStorage cannot be pickled; name it")
        return (MemoryStorage, (self.uri.removeprefix("memory://"),))

    def _get(self, key: str) -> bytes:
        try:
            return self._objects[key][0]
        except KeyError:
            raise NotFoundError(f"{self.uri}/{key} does not exist") from None

    def read(self, key: str) -> bytes:
        with self._lock:
            return self._get(key)

    def is_cached(self, key: str) -> bool:
        return self.exists(key)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        with self._lock:
            return self._get(key)[start:end]

    def write(self, key: str, data: Data) -> None:
        blob = join(data)
        with self._lock:
            self._objects[key] = (blob, time.time(), next(_generation))

    def put_if_absent(self, key: str, data: bytes) -> None:
        with self._lock:
            if key in self._objects:
                raise AlreadyExistsError(f"{self.uri}/{key} exists")
            self._objects[key] = (bytes(data), time.time(), next(_generation))

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        with self._lock:
            data = self._get(key)
            return data, str(self._objects[key][2])

    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        with self._lock:
            current = self._objects.get(key)
            current_token = None if current is None else str(current[2])
            if current_token != token:
                raise RefChangedError(f"{self.uri}/{key} changed since it was read")
            self._objects[key] = (bytes(data), time.time(), next(_generation))

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self._objects

    def list(self, prefix: str) -> Iterator[FileInfo]:
        with self._lock:
            objects = self._objects
            items = [(k, objects[k]) for k in objects.under(prefix)]
        for key, (data, mtime, _) in sorted(items):
            yield FileInfo(key, len(data), mtime)

    def info(self, key: str) -> FileInfo | None:
        with self._lock:
            entry = self._objects.get(key)
        return None if entry is None else FileInfo(key, len(entry[0]), entry[1])

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.discard(key)
