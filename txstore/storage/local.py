"""The local filesystem backend: POSIX calls for the steps fsspec's LocalFileSystem gets wrong.

Publishing is temp file in the same folder + fsync, then ``os.link`` (no-clobber: the commit
step) or ``os.replace`` (overwrite), then an fsync of the folder. portalocker makes local
writers queue; it is an optimisation, never what correctness rests on.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import errno
import hashlib
import mmap
import os
import platform
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import AlreadyExistsError, NotFoundError, RefChangedError, StorageError
from .base import TEMP_PREFIX, Data, FileInfo, Storage
from .forksafe import renew_after_fork

_LOCK_NAME = ".txstore.lock"
_MAX_KEPT_MAPS = 64
# A read that fails rather than wait for the disk (Linux): how a chunk's reads learn whether
# its pages are in the page cache. Where there is none, every chunk is read through its map.
_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None
# Reads of a chunk found in the page cache, one after another, before its reads go through
# the map again (after one found it out).
_WARM_AFTER = 16
# Reads through the map between two probes of whether the chunk is still cached.
_PROBE_EVERY = 16
# Ranges from this size (a default block of 64 KiB, or of one large sample) are read with
# pread even from a cached chunk. Through the map, a first touch maps in the page cache's
# folios around the range, whole (a file written in large pieces has large ones), so a
# random reader's RSS grew by far more than it read (docs/benchmarks.md, random access).
_MAP_BELOW = 32 << 10
_IOV_MAX = 1024
# Bytes per writev call, and the offsets the calls end at: a trade. One call per whole chunk
# is much slower than calls of about a MiB. The page cache sizes its folios by each write's
# length and alignment: larger folios fault less when a chunk is mapped but cost more kernel
# CPU to write; 512 KiB writes were the fastest appends (bench/bench_append.py).
_WRITE_BYTES = 512 << 10


def _load_sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of the range's dirty pages; do not wait


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing [offset, offset + length) to disk now, without waiting for it.

    A hint (RocksDB's ``bytes_per_sync``): the disk works while the writer encodes, and the
    fsync that seals the file finds its pages written or in flight instead of starting 64 MiB
    of writeback then, which makes large appends faster (bench/bench_append.py). A failure
    changes nothing: the fsync still makes the file durable.
    """
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _writev(fd: int, batch: list[bytes | memoryview], size: int) -> None:
    written = os.writev(fd, batch)
    if written < size:  # a short write (rare): finish the batch from a joined copy
        rest = memoryview(b"".join(batch))[written:]
        while rest:
            rest = rest[os.write(fd, rest) :]


def _write_all(fd: int, buffers: Iterable[bytes | memoryview]) -> None:
    """writev every buffer into a new file, in calls that end at multiples of
    ``_WRITE_BYTES`` (but the last, and calls cut short at _IOV_MAX buffers)."""
    batch: list[bytes | memoryview] = []
    size = offset = 0  # the batch's bytes; the file's before it
    for buffer in buffers:
        room = _WRITE_BYTES - (offset + size) % _WRITE_BYTES
        view = memoryview(buffer) if len(buffer) >= room else buffer
        while len(view) >= room:  # fill the batch up to the boundary
            batch.append(view[:room])
            _writev(fd, batch, size + room)
            _start_writeback(fd, offset, size + room)
            offset += size + room
            batch, size, view, room = [], 0, view[room:], _WRITE_BYTES
        if view:
            batch.append(view)
            size += len(view)
        if len(batch) >= _IOV_MAX:  # many tiny buffers: rare
            _writev(fd, batch, size)
            batch, size, offset = [], 0, offset + size
    if batch:
        _writev(fd, batch, size)


def _token(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


#: What names one file's contents: a rewrite publishes a new file (a new inode) by rename.
#: While a map of the old file is kept, its inode cannot be reused for the new one.
_Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Kept:
    """A kept map of a file, its identity, a descriptor of it, and how its ranges are read.

    ``cached_reads``: -1 before the first range read; then the count of reads, one after
    another, that found their pages in the page cache. Below ``_WARM_AFTER`` a range (of
    less than ``_MAP_BELOW``: larger ones are always preaded) is read with ``pread``, at or
    above through the map: a fault on a map of a file that is not cached
    reads megabytes around the page (a random 100 KiB read from a cold 64 MiB chunk took
    22 us at the median but 9 ms at p99 and 1.0 ms on average, where a ``pread`` took
    0.17 ms, 0.27 ms at p99). Every ``_PROBE_EVERY`` reads through the map, one probe asks
    whether the chunk is still cached, so an eviction sends its reads back to ``pread``. The
    descriptor is closed when the last reader lets go of this object, so no thread can read
    through a number that another has closed and reused.
    """

    __slots__ = ("cached_reads", "fd", "identity", "view")

    def __init__(self, view: bytes | memoryview, identity: _Identity, fd: int) -> None:
        self.view = view
        self.identity = identity
        self.fd = fd
        self.cached_reads = -1 if _NOWAIT is not None else _WARM_AFTER

    # os.close bound now: a map kept until the interpreter exits is dropped after the
    # modules' globals (contextlib, os) are gone.
    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        try:  # noqa: SIM105 (not contextlib.suppress: see above)
            _close(self.fd)
        except OSError:
            pass

    def still_cached(self, start: int, end: int) -> bool:
        """Whether the last byte of [start, end) is still in the page cache (one small read
        that fails rather than wait); where that cannot be told, True."""
        assert _NOWAIT is not None
        try:
            return os.preadv(self.fd, [bytearray(1)], end - 1, _NOWAIT) == 1
        except BlockingIOError:
            return False
        except OSError:
            return True

    def pread(self, start: int, end: int) -> tuple[memoryview, bool | None]:
        """Bytes [start, end) (fewer past the end of the file), and whether they were all in
        the page cache (None: the file system cannot tell)."""
        assert _NOWAIT is not None
        buf = bytearray(end - start)
        try:
            got = os.preadv(self.fd, [buf], start, _NOWAIT)
            cached: bool | None = got == len(buf)
        except BlockingIOError:
            got, cached = 0, False
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            got, cached = 0, None
        view = memoryview(buf)
        while got < len(buf):
            n = os.preadv(self.fd, [view[got:]], start + got)
            if n == 0:  # past the end of the file: as short as a map's slice would be
                return view[:got], cached
            got += n
        return view, cached


class Staged:
    """A file being written under a temporary name (``LocalStorage.stage_unsynced``)."""

    def __init__(self, storage: LocalStorage, key: str, path: str, tmp: str, fd: int) -> None:
        self._storage, self._key, self._path, self._tmp, self._fd = storage, key, path, tmp, fd
        self._done = False

    def _error(self, e: OSError) -> StorageError:
        return StorageError(f"cannot write {self._storage.root}/{self._key}: {e}")

    def put(self, offset: int, data: bytes | memoryview | Iterable[bytes | memoryview]) -> None:
        """Write ``data`` (a buffer, or consecutive buffers: one ``pwritev``, no join) at
        ``offset`` (plain writes: no early writeback, which would only make a disk busy for
        a file that needs no durability)."""
        buffers = [data] if isinstance(data, (bytes, memoryview)) else data
        views = [memoryview(b) for b in buffers]
        try:
            while views:
                written = os.pwritev(self._fd, views[:_IOV_MAX], offset)
                offset += written
                while views and written >= len(views[0]):  # short writes: go on after them
                    written -= len(views[0])
                    views.pop(0)
                if views and written:
                    views[0] = views[0][written:]
        except OSError as e:
            raise self._error(e) from e

    def view(self) -> bytes | memoryview:
        """What has been written, mapped (``b""`` for an empty file)."""
        try:
            return memoryview(mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ))
        except ValueError:  # an empty file, which cannot be mapped
            return b""
        except OSError as e:
            raise self._error(e) from e

    def publish(self) -> None:
        """The file, under its key; maps of it (``view``) stay valid."""
        self._close()
        try:
            os.replace(self._tmp, self._path)
        except OSError as e:
            self.discard()
            raise self._error(e) from e
        self._done = True
        self._storage._forget(self._key)

    def discard(self) -> None:
        self._close()
        if not self._done:
            self._done = True
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)

    def _close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


class LocalStorage(Storage):
    is_remote = False

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.uri = self.root
        self.storage_options: dict[str, Any] = {}
        # Kept maps, most recently used last.
        self._maps: OrderedDict[str, _Kept] = OrderedDict()
        self._maps_lock = threading.Lock()
        renew_after_fork(self, "_maps_lock")
        self._made_dirs: set[str] = set()

    @property
    def local_path(self) -> str:
        return self.root

    @property
    def endpoint(self) -> str:
        # The file system as this host sees it: another host mounting the same folder (NFS,
        # say) runs the check for itself.
        return f"file://{platform.node()}"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _forget(self, key: str) -> None:
        """Drop the kept map of ``key`` (its file is replaced or gone); views handed out keep
        theirs alive."""
        with self._maps_lock:
            self._maps.pop(key, None)

    def _parent(self, path: str) -> str:
        parent = os.path.dirname(path)
        if parent not in self._made_dirs:
            os.makedirs(parent, exist_ok=True)
            self._made_dirs.add(parent)
        return parent

    def _temp_path(self, path: str) -> str:
        """A new temporary name beside ``path``, for a file published by renaming it."""
        parent = self._parent(path)
        return os.path.join(parent, f"{TEMP_PREFIX}{uuid.uuid4().hex}.{os.path.basename(path)}")

    def _write_temp(self, path: str, data: Data) -> str:
        tmp = self._temp_path(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, [data] if isinstance(data, bytes) else data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def read(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise NotFoundError(f"{self.root}/{key} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot read {self.root}/{key}: {e}") from e

    def read_range_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        # A block from _MAP_BELOW: a pread, into a new bytes object (a bytearray would be
        # zeroed first, only to be overwritten). A smaller one out of a kept map: no syscall
        # and no copy per read, while the chunk is in the page cache; a pread when it is not
        # (``_Kept``). Only chunks are read so, which are never rewritten; this process's own
        # rewrites drop the map all the same.
        kept = self._kept(key, None)
        if end <= start:
            return kept.view[start:end]
        if end - start >= _MAP_BELOW:
            try:
                return os.pread(kept.fd, end - start, start)  # short only past the end
            except OSError as e:
                raise StorageError(f"cannot read {self.root}/{key}: {e}") from e
        reads = kept.cached_reads
        if reads >= _WARM_AFTER:
            # Every so many reads, whether the chunk is still cached (a probe on each read
            # was a tenth of a warm snap[i])
            kept.cached_reads = reads + 1
            if _NOWAIT is None or reads % _PROBE_EVERY or kept.still_cached(start, end):
                return kept.view[start:end]
            kept.cached_reads = 0  # evicted since: the map would fault it in slowly
        try:
            data, cached = kept.pread(start, end)
        except OSError as e:
            raise StorageError(f"cannot read {self.root}/{key}: {e}") from e
        if cached is None or (cached and kept.cached_reads < 0):
            kept.cached_reads = _WARM_AFTER  # cannot tell, or cached at the first read
        else:
            kept.cached_reads = kept.cached_reads + 1 if cached else 0
        return data

    def _kept(self, key: str, identity: _Identity | None) -> _Kept:
        """The kept map of ``key``, made now if there is none or (given the file's identity
        now) it maps another file. Maps are dropped, never closed, when evicted: views handed
        out keep theirs alive."""
        with self._maps_lock:
            kept = self._maps.get(key)
            if kept is not None and (identity is None or kept.identity == identity):
                self._maps.move_to_end(key)
                return kept
        fd = self._open(key)
        try:
            found = _identity(os.fstat(fd))
            mapped = self._map_fd(key, fd)
        except BaseException as e:
            os.close(fd)
            if isinstance(e, OSError):
                raise StorageError(f"cannot read {self.root}/{key}: {e}") from e
            raise
        kept = _Kept(b"" if mapped is None else memoryview(mapped), found, fd)
        with self._maps_lock:
            self._maps[key] = kept
            self._maps.move_to_end(key)
            while len(self._maps) > _MAX_KEPT_MAPS:
                self._maps.popitem(last=False)
        return kept

    def read_buffer(self, key: str, tail: int = 0) -> bytes | memoryview:
        mapped = self._map(key)
        if mapped is None:
            return b""
        if hasattr(mmap, "MADV_WILLNEED"):
            # Read a cold file ahead of the decoder, without waiting for it: the first
            # sample is ready after one page, where MAP_POPULATE would read all 64 MiB first.
            # The tail (the footer, read before any sample) is asked for first: the disk
            # serves requests in order, and behind the whole file's it waited for all of it.
            with contextlib.suppress(OSError):
                size = len(mapped)
                if 0 < tail < size:
                    start = (size - tail) // mmap.PAGESIZE * mmap.PAGESIZE
                    mapped.madvise(mmap.MADV_WILLNEED, start, size - start)
                mapped.madvise(mmap.MADV_WILLNEED)
        return memoryview(mapped)

    def is_cached(self, key: str) -> bool:
        """Whether the file's last byte is in the page cache: a one-byte read that fails
        rather than wait for the disk (``RWF_NOWAIT``, Linux). Files are read from the start,
        so a file cached to its end is cached whole, most likely."""
        nowait = getattr(os, "RWF_NOWAIT", None)
        if nowait is None or not hasattr(os, "preadv"):
            return False
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            size = os.fstat(fd).st_size
            return size == 0 or os.preadv(fd, [bytearray(1)], size - 1, nowait) == 1
        except OSError:  # BlockingIOError: not cached; others: the filesystem cannot tell
            return False
        finally:
            os.close(fd)

    def _open(self, key: str) -> int:
        """A read-only descriptor of the object's file (txstore errors for a missing one)."""
        try:
            return os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFoundError(f"{self.root}/{key} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot read {self.root}/{key}: {e}") from e

    def _map(self, key: str) -> mmap.mmap | None:
        """The file mapped read-only; None when it is empty (which cannot be mapped)."""
        # A map costs page-table entries where ``read`` would zero and fill fresh memory
        # (several times the CPU for a whole chunk). Chunk files are replaced, never
        # truncated in place, so a mapped file cannot shrink under its reader (no SIGBUS).
        # os.open, not open(): each syscall lets go of the GIL, and a prefetch thread waits up
        # to a switch interval to get it back from the busy decoding thread. open() and a size
        # check made eight syscalls (fstat three times, ioctl, lseek), this makes four.
        fd = self._open(key)
        try:
            return self._map_fd(key, fd)
        finally:
            os.close(fd)

    def _map_fd(self, key: str, fd: int) -> mmap.mmap | None:
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file, which cannot be mapped
            return None
        except OSError as e:
            raise StorageError(f"cannot read {self.root}/{key}: {e}") from e

    def read_range(self, key: str, start: int, end: int) -> bytes:
        # A copy out of the kept map, once a stat says the map is of the file now under the
        # key: another process may have replaced it (one syscall, where a fresh open, pread
        # and close would be three). (A cache of open descriptors, closed on eviction, let
        # one thread pread a number that another had closed and a third had reused.)
        kept = self._kept(key, self._identity_now(key))
        if kept.cached_reads >= _WARM_AFTER or end <= start:
            return bytes(kept.view[start:end])
        # Not known to be cached (a chunk's footer, read before its samples): a pread,
        # which leaves how the samples are read to the samples.
        try:
            return bytes(kept.pread(start, end)[0])
        except OSError as e:
            raise StorageError(f"cannot read {self.root}/{key}: {e}") from e

    def _identity_now(self, key: str) -> _Identity:
        """The identity of the file under ``key`` now (one stat)."""
        try:
            return _identity(os.stat(self._path(key)))
        except FileNotFoundError:
            self._forget(key)
            raise NotFoundError(f"{self.root}/{key} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot read {self.root}/{key}: {e}") from e

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        # One stat for all of them (as ``read_range`` makes for one), then a pread each on
        # the kept descriptor: a field's frames are hundreds of ranges of one chunk, each on
        # pages of its own, and a first fault on a map costs several times a pread even when
        # the pages are cached (a map's first touch maps the pages around it as well).
        if not ranges:
            return []
        kept = self._kept(key, self._identity_now(key))
        pread, fd = os.pread, kept.fd
        try:
            return [pread(fd, end - start, start) if end > start else b"" for start, end in ranges]
        except OSError as e:
            raise StorageError(f"cannot read {self.root}/{key}: {e}") from e

    def write(self, key: str, data: Data) -> None:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
            os.replace(tmp, path)
            self._forget(key)
            _fsync_dir(os.path.dirname(path))
        except OSError as e:
            raise StorageError(f"cannot write {self.root}/{key}: {e}") from e

    def write_unsynced(self, key: str, data: Data) -> None:
        """As ``write`` (readers see the old file or the whole new one) but not durable: a
        crash can leave a file of other bytes under the key. For caches only, whose readers
        check what they read against its checksums; a 64 MiB fsync per cached chunk would
        bound how fast a remote store streams."""
        with self.stage_unsynced(key) as staged:
            staged.put(0, data)
            staged.publish()

    def stage_unsynced(self, key: str) -> Staged:
        """A new file for ``key``, written under a temporary name (by ``Staged.put``) and
        published under the key by ``Staged.publish`` (or removed, if it is not, when the
        ``with`` block ends): as ``write_unsynced``, for a file written piece by piece, in any
        order, from several threads (a chunk downloaded as parts into a cache)."""
        path = self._path(key)
        try:
            tmp = self._temp_path(path)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            raise StorageError(f"cannot write {self.root}/{key}: {e}") from e
        return Staged(self, key, path, tmp, fd)

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool]:
        """An exclusive lock named ``key`` among the processes of this machine (a lock file
        under the root): yields True once held, or False after ``timeout`` seconds (a stuck
        peer), so that a caller using it to avoid duplicate work can go ahead anyway."""
        import portalocker  # here: a process that takes no lock need not import it

        path = self._path(key)
        self._parent(path)
        lock = portalocker.Lock(path, "a", timeout=timeout, check_interval=0.005)
        try:
            lock.acquire()
        except portalocker.LockException:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    def put_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
        except OSError as e:
            raise StorageError(f"cannot write {self.root}/{key}: {e}") from e
        try:
            os.link(tmp, path)  # the no-clobber step: exactly one process wins
        except FileExistsError:
            raise AlreadyExistsError(f"{self.root}/{key} exists") from None
        except OSError as e:
            raise StorageError(f"cannot publish {self.root}/{key}: {e}") from e
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self._forget(key)  # a map kept of an earlier file under the key, deleted elsewhere
        try:
            _fsync_dir(os.path.dirname(path))
        except OSError as e:
            raise StorageError(f"cannot sync the folder of {self.root}/{key}: {e}") from e

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        data = self.read(key)
        return data, _token(data)

    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        import portalocker

        path = self._path(key)
        lock_path = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")
        try:
            self._parent(path)
            with portalocker.Lock(lock_path, "a", timeout=30, check_interval=0.002):
                try:
                    current: str | None = _token(Path(path).read_bytes())
                except FileNotFoundError:
                    current = None
                if current != token:
                    raise RefChangedError(f"{self.root}/{key} changed since it was read")
                tmp = self._write_temp(path, data)
                os.replace(tmp, path)
                self._forget(key)
                _fsync_dir(os.path.dirname(path))
        except portalocker.LockException as e:
            raise StorageError(f"cannot lock {self.root}/{key} ({lock_path}): {e}") from e
        except OSError as e:
            raise StorageError(f"cannot write {self.root}/{key}: {e}") from e

    def exists(self, key: str) -> bool:
        try:
            os.stat(self._path(key))  # follows a symlink, as reads do
        except FileNotFoundError:  # also a dangling symlink
            return False
        except OSError as e:  # a looping link, a part of the path that is a file, EACCES
            raise StorageError(f"cannot check {self.root}/{key}: {e}") from e
        return True

    def info(self, key: str) -> FileInfo | None:
        try:
            st = os.stat(self._path(key))  # follows a symlink, as reads and list() do
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StorageError(f"cannot check {self.root}/{key}: {e}") from e
        return FileInfo(key, st.st_size, st.st_mtime)

    def read_range_fresh(self, key: str, start: int, end: int) -> bytes:
        fd = self._open(key)
        try:
            size = os.fstat(fd).st_size
            start, end = min(start, size), min(end, size)
            out = bytearray()
            while len(out) < end - start:
                piece = os.pread(fd, end - start - len(out), start + len(out))
                if not piece:
                    break
                out += piece
            return bytes(out)
        except OSError as e:
            raise StorageError(f"cannot read {self.root}/{key}: {e}") from e
        finally:
            os.close(fd)

    def list(self, prefix: str) -> Iterator[FileInfo]:
        # Folders may be symlinks to folders elsewhere (chunks/ on another disk): followed,
        # as reads follow them, so verify and vacuum see what reads see. A link into a tree
        # listed already (the root's own, or one linked before) or around one is refused:
        # its files would have two keys, and vacuum could delete one as garbage (a segment
        # listed as chunks/x.json); a link to a folder above it would loop.
        folder = prefix.rpartition("/")[0]
        start = self._path(folder) if folder else self.root
        trees = [os.path.realpath(self.root)]
        if folder and os.path.islink(start):
            self._follow(start, trees)
        stack = [(start, folder)]
        while stack:
            path, rel = stack.pop()
            try:
                with os.scandir(path) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except FileNotFoundError:  # not there, or gone meanwhile: nothing listed there
                continue
            except OSError as e:  # unreadable, a file where a folder should be, a loop
                raise StorageError(f"cannot list {self.root}/{prefix}: {path}: {e}") from e
            folders = []
            for entry in entries:
                key = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    is_dir, is_link = entry.is_dir(), entry.is_symlink()
                except FileNotFoundError:  # gone meanwhile
                    continue
                except OSError as e:  # a looping link
                    raise StorageError(f"cannot list {self.root}/{prefix}: {e}") from e
                if is_dir:
                    if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                        if is_link:
                            self._follow(entry.path, trees)
                        folders.append((entry.path, key))
                    continue
                if not key.startswith(prefix):
                    continue
                try:
                    st = entry.stat()  # follows a symlinked file
                except FileNotFoundError:  # gone meanwhile, or a dangling link (as exists())
                    continue
                except OSError as e:
                    raise StorageError(f"cannot list {self.root}/{prefix}: {e}") from e
                yield FileInfo(key, st.st_size, st.st_mtime)
            stack.extend(reversed(folders))

    def _follow(self, link: str, trees: builtins.list[str]) -> None:
        """Check that a symlinked folder leads to a tree of its own, and remember it."""
        target = os.path.realpath(link)
        for tree in trees:
            if os.path.commonpath([target, tree]) in (target, tree):  # one holds the other
                raise StorageError(
                    f"cannot list {self.root}: {link} is a symlink to {target}, which "
                    f"overlaps {tree}, listed already: its files would have two names (and "
                    "vacuum could delete one as garbage). Link each folder to a place of its own"
                )
        trees.append(target)

    def delete(self, key: str) -> None:
        self._forget(key)  # later reads here fail; views handed out stay valid
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError(f"cannot delete {self.root}/{key}: {e}") from e

    @contextlib.contextmanager
    def writer_lock(self) -> Iterator[object]:
        import portalocker

        os.makedirs(self.root, exist_ok=True)
        lock = portalocker.Lock(
            os.path.join(self.root, _LOCK_NAME), "a", timeout=10, check_interval=0.002
        )
        try:
            lock.acquire()
        except portalocker.LockException:
            yield None  # a stuck peer: go ahead unqueued; put_if_absent still decides
            return
        try:
            yield lock
        finally:
            lock.release()

    def close(self) -> None:
        # Drops the kept maps early. There is no __del__: the maps go with the object anyway,
        # and a __del__ run at interpreter exit can find this module's globals gone already.
        with self._maps_lock:
            self._maps.clear()


__all__ = ["TEMP_PREFIX", "LocalStorage"]
