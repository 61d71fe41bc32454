"""The storage contract every backend fulfils; ``tests/storage_suite.py`` checks it, run for
each backend by its own ``tests/test_storage_<backend>.py``."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeAlias

from ..errors import NotFoundError

#: What ``Storage.write`` takes: bytes, or buffers to store back to back, iterated once (a
#: chunk writer hands over its parts as it makes them, so a local write copies each once).
Data: TypeAlias = bytes | Iterable[bytes | memoryview]

#: Keys whose last part starts with this are a backend's temporaries (a file written before it
#: is published under its real name): never an object of a store, and garbage once stale.
TEMP_PREFIX = ".tmp."


def join(data: Data) -> bytes:
    return data if isinstance(data, bytes) else b"".join(data)


class FileInfo(NamedTuple):
    key: str
    size: int
    mtime: float  # seconds since the epoch


class Storage(ABC):
    """Bytes under string keys ("versions/index.v3.json") below one root.

    Every method raises txstore errors only: ``NotFoundError`` for a missing key,
    ``AlreadyExistsError`` when a put-if-absent loses, ``RefChangedError`` when a
    compare-and-swap meets another token, ``StorageError`` for anything else. A
    ``StorageError`` from a write means the write may or may not have happened.
    """

    #: The URI the store was opened with; with ``storage_options`` it reopens the storage.
    uri: str
    storage_options: dict[str, Any]
    #: Reads of ranges closer than this are merged into one: 0 where a read is a cheap
    #: syscall, more where each read is a round trip.
    range_merge_gap: int = 0
    #: How many requests ``read_ranges`` keeps in flight at once (1: one after another).
    max_in_flight: int = 1
    #: Whether another process opening ``uri`` with ``storage_options`` sees the same objects
    #: (False for a memory store, which lives in one process: worker processes cannot use it).
    shared_across_processes: bool = True
    #: Whether reads cross a network, so that a copy on local disk would save waiting
    #: (False for files on this machine and for memory).
    is_remote: bool = True

    @property
    def endpoint(self) -> str:
        """The server this storage's requests go to, as the backend check records it (a
        check holds for one endpoint): the ``endpoint_url`` of the options, or ``default``
        for the service's own."""
        opts = self.storage_options
        url = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
        return str(url) if url else "default"

    @property
    def local_path(self) -> str | None:
        """The local folder the objects are files under (key "a/b" is ``<local_path>/a/b``),
        or None where they are not files on this machine."""
        return None

    @abstractmethod
    def read(self, key: str) -> bytes:
        """The whole object."""

    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """``read`` of each key, None for a missing one, in order. A backend whose reads are
        round trips sends them together (as ``read_ranges``): opening a store reads its
        manifest and probes the next version in one round trip, its segments in one more."""
        found: list[bytes | None] = []
        for key in keys:
            try:
                found.append(self.read(key))
            except NotFoundError:
                found.append(None)
        return found

    def read_buffer(self, key: str, tail: int = 0) -> bytes | memoryview:
        """The whole object, as ``read``; where a backend can, a read-only view of a mapped
        file instead: no copy, no fresh memory. Only for objects not rewritten while the
        view lives (chunks; a dataset's files while it is imported).
        ``tail``: the reader needs the object's last ``tail`` bytes first (a chunk's footer);
        a backend that reads the object ahead asks for those before the rest."""
        return self.read(key)

    def is_cached(self, key: str) -> bool:
        """Whether reading the object now is answered from memory, with no wait on a disk or
        the network (a hint: False where a backend cannot tell cheaply)."""
        return False

    def _empty_range(self, key: str) -> bytes:
        """A read of no bytes, for backends whose servers refuse an empty range: ``b""``, or
        ``NotFoundError`` as any read of a missing key."""
        if not self.exists(key):
            raise NotFoundError(f"{self.uri}/{key} does not exist")
        return b""

    @abstractmethod
    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object; shorter only if the object is shorter. Always of
        the object now under the key, whichever process last wrote it."""

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """``read_range`` of each (start, end), in order. A backend whose reads are round
        trips sends them together, at most ``max_in_flight`` at once: a chunk read as parts
        over several connections, or a field's frames, wait one round trip, not one each."""
        return [self.read_range(key, start, end) for start, end in ranges]

    def read_ranges_into(
        self, key: str, ranges: Sequence[tuple[int, int]], put: Callable[[int, list[bytes]], None]
    ) -> None:
        """``read_ranges``, the bytes of each range handed to ``put(offset, pieces)`` as they
        arrive and then let go: ``pieces`` are consecutive buffers from ``offset`` on, a range
        in one call or several (in any order, on any thread; ``put`` may be called for several
        ranges at once). A chunk downloaded into a file is never whole in memory, and a
        backend that streams need not join what it received. Returns once every ``put`` has
        returned; the first failure, of a read or a ``put``, is raised."""
        for (start, _end), data in zip(ranges, self.read_ranges(key, ranges), strict=True):
            put(start, [data])

    def read_range_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """As ``read_range``; where a backend can, a view of a mapped file instead of a copy.
        Only for objects never rewritten (chunks): a map kept from an earlier read is not
        checked against a rewrite by another process (this process's own are seen)."""
        return self.read_range(key, start, end)

    def read_range_fresh(self, key: str, start: int, end: int) -> bytes:
        """As ``read_range``, never answered from a map or handle kept from an earlier read:
        for checks (verify) that must see a file replaced since this process read it."""
        return self.read_range(key, start, end)

    @abstractmethod
    def write(self, key: str, data: Data) -> None:
        """Store ``data`` durably; readers see the old object or the whole new one."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> None:
        """Store ``data`` durably only if ``key`` does not exist: one atomic step.

        Raises ``AlreadyExistsError`` when it exists (which, after a lost reply and a client
        retry, can be our own earlier write: callers read it back to tell).
        """

    @abstractmethod
    def read_with_token(self, key: str) -> tuple[bytes, str]:
        """The object and an opaque token for ``compare_and_swap``."""

    @abstractmethod
    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        """Replace the object only if it still has ``token`` (None: only if absent)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether the key exists now (never answered from a stale cache)."""

    @abstractmethod
    def list(self, prefix: str) -> Iterator[FileInfo]:
        """Every object whose key starts with ``prefix`` (a folder such as "chunks/")."""

    def info(self, key: str) -> FileInfo | None:
        """The object's size and time (None when missing), never from a stale cache. This
        default lists the key's folder; backends that can ask for one object do."""
        return next((f for f in self.list(key) if f.key == key), None)

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error."""

    def writer_lock(self) -> contextlib.AbstractContextManager[object]:
        """A lock that makes writers of this store on this machine queue instead of race.

        Only an optimisation: correctness rests on ``put_if_absent``.
        """
        return contextlib.nullcontext()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release open handles; the storage stays usable."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Storages cross process boundaries (DataLoader workers) as their URI and options.
        # Imported here: open.py imports this module, and every backend, at its top.
        from .open import open_storage

        return (open_storage, (self.uri, self.storage_options))
