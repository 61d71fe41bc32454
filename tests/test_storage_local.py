"""The storage contract on the local filesystem backend, and what only it does."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from txstore.errors import AlreadyExistsError, StorageError
from txstore.storage import LocalStorage, Storage, open_storage

from .storage_suite import StorageSuite, in_another_process


class TestLocalStorage(StorageSuite):
    cached_after_read = True  # just written and read: in the page cache
    shared_across_processes = True
    is_remote = False
    has_local_path = True

    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        return open_storage(str(tmp_path / "store"))

    @pytest.fixture
    def failing_storage(self, tmp_path: Path) -> Storage:
        # A part of the root's path is a regular file: every call meets ENOTDIR, even as root
        # (for whom a folder's permissions stop nothing).
        (tmp_path / "file").write_bytes(b"not a folder")
        return open_storage(str(tmp_path / "file" / "store"))


def test_a_file_out_of_the_page_cache_is_not_cached(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    storage.write("chunks/c.chunk", bytes(range(256)) * 4096)  # written durably: clean pages
    fd = os.open(tmp_path / "chunks" / "c.chunk", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drops clean, unmapped pages
    finally:
        os.close(fd)
    assert storage.is_cached("chunks/c.chunk") is False
    assert storage.read("chunks/c.chunk") == bytes(range(256)) * 4096
    assert storage.is_cached("chunks/c.chunk") is True


def test_publish_leaves_no_temp_files(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    storage.put_if_absent("versions/index.v0.json", b"x")
    with pytest.raises(AlreadyExistsError):
        storage.put_if_absent("versions/index.v0.json", b"y")
    storage.write("chunks/c", b"z")
    assert sorted(p.name for p in (tmp_path / "versions").iterdir()) == ["index.v0.json"]
    assert sorted(p.name for p in (tmp_path / "chunks").iterdir()) == ["c"]


def test_a_failed_writeback_hint_is_ignored() -> None:
    # sync_file_range fails on a pipe (ESPIPE): the hint must neither raise nor block.
    from txstore.storage import local

    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"x")
        local._start_writeback(write_end, 0, 1)
        assert os.read(read_end, 1) == b"x"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_looping_symlink_is_an_error_for_exists_and_list(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    storage.write("chunks/a.chunk", b"a")
    os.symlink("loop.chunk", tmp_path / "chunks" / "loop.chunk")  # points at itself
    with pytest.raises(StorageError, match=re.escape("chunks/loop.chunk")):
        storage.exists("chunks/loop.chunk")
    with pytest.raises(StorageError, match=re.escape("loop.chunk")):
        list(storage.list("chunks/"))
    assert storage.exists("chunks/a.chunk")


def test_a_dangling_symlink_is_absent_for_exists_and_list(tmp_path: Path) -> None:
    # What a read would find: nothing (NotFoundError), so neither error nor listed.
    storage = open_storage(str(tmp_path))
    storage.write("chunks/a.chunk", b"a")
    os.symlink(tmp_path / "gone", tmp_path / "chunks" / "b.chunk")
    assert storage.exists("chunks/b.chunk") is False
    assert [f.key for f in storage.list("chunks/")] == ["chunks/a.chunk"]


def test_a_file_where_a_folder_should_be_is_an_error_for_list(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    storage.write("chunks", b"a file named like the folder")
    with pytest.raises(StorageError, match=re.escape("chunks/")):
        list(storage.list("chunks/"))
    with pytest.raises(StorageError, match=re.escape("chunks/a.chunk")):
        storage.exists("chunks/a.chunk")


def test_a_range_read_is_of_the_file_renamed_over_the_key_by_another_process(
    tmp_path: Path,
) -> None:
    """The kept map is of the old inode (held alive by the map), so a rewrite with the same
    size and time would be missed by a check of size and time alone."""
    storage = LocalStorage(tmp_path)
    path = tmp_path / "HEAD"
    storage.write("HEAD", b"old!" * 1000)
    assert storage.read_range("HEAD", 0, 4) == b"old!"
    before = os.stat(path)
    assert in_another_process(storage, ("write", "HEAD", (b"new!" * 1000).hex())) == ["ok"]
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size
    assert storage.read_range("HEAD", 0, 4) == b"new!"
    assert storage.read_range_fresh("HEAD", 0, 4) == b"new!"


def test_local_path_is_the_root(tmp_path: Path) -> None:
    assert open_storage(str(tmp_path / "a" / ".." / "b")).local_path == str(tmp_path / "b")


# ------------------------------------------------------------- ranges of cached/uncached chunks

_CHUNK = bytes(range(256)) * (4 << 12)  # 4 MiB, each byte a function of its offset


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drops clean, unmapped pages
    finally:
        os.close(fd)


def _pages_resident(path: Path, start: int, end: int) -> list[bool]:
    """Whether each page of [start, end) is in the page cache, asked with mincore(2), which
    reads nothing: a read with RWF_NOWAIT that finds a page missing starts reading it in, so
    the test's own probe would bring back the pages it found evicted."""
    import ctypes
    import ctypes.util
    import mmap

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    page = mmap.PAGESIZE
    low = start // page * page
    length = end - low
    fd = os.open(path, os.O_RDONLY)
    try:  # private and writable only so that ctypes can take its address; nothing is touched
        mapped = mmap.mmap(fd, length, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE,
                           offset=low)  # fmt: skip
    finally:
        os.close(fd)
    try:
        pages = (length + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        base = ctypes.c_char.from_buffer(mapped)
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(base)), ctypes.c_size_t(length),
                            vec) != 0:  # fmt: skip
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del base
        return [bool(v & 1) for v in vec]
    finally:
        mapped.close()


def _resident(path: Path, start: int, end: int) -> bool:
    """Whether all of [start, end) is in the page cache."""
    return all(_pages_resident(path, start, end))


def _uncached_chunk(tmp_path: Path) -> tuple[LocalStorage, Path]:
    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no RWF_NOWAIT here: every range is read through the map")
    storage = LocalStorage(tmp_path)
    storage.write("chunks/c.chunk", _CHUNK)  # written durably: clean pages
    path = tmp_path / "chunks" / "c.chunk"
    _evict(path)
    if _resident(path, 1 << 20, (1 << 20) + 100_000):
        pytest.skip("the kernel kept the advised-away pages")
    return storage, path


def _backing(view: bytes | memoryview) -> type:
    return type(view.obj) if isinstance(view, memoryview) else bytes


def test_ranges_of_an_uncached_chunk_are_read_not_faulted_through_its_map(
    tmp_path: Path,
) -> None:
    import mmap

    storage, path = _uncached_chunk(tmp_path)
    for start in (1 << 20, 3 << 20, 17):
        view = storage.read_range_view("chunks/c.chunk", start, start + 100_000)
        assert bytes(view) == _CHUNK[start : start + 100_000]
        assert _backing(view) is not mmap.mmap  # a pread into a buffer of its own
    # Once the file is cached, reads go back to the map after a run of cached reads.
    assert storage.read("chunks/c.chunk") == _CHUNK
    backings = []
    for k in range(40):
        view = storage.read_range_view("chunks/c.chunk", k * 4096, k * 4096 + 5000)
        assert bytes(view) == _CHUNK[k * 4096 : k * 4096 + 5000]
        backings.append(_backing(view))
    assert backings[0] is bytearray and backings[-1] is mmap.mmap
    flipped = backings.index(mmap.mmap)
    assert set(backings[flipped:]) == {mmap.mmap}
    # Evicted again: a probe among the next reads sees it, and reads then go by pread. The
    # views are checked last: touching a mapped one would fault its pages back in.
    from txstore.storage.local import _PROBE_EVERY

    # (The last MiB: pages mapped by the reads above, at the start, cannot be advised away.)
    _evict(path)
    if any(_pages_resident(path, 3 << 20, 4 << 20)):
        pytest.skip("the kernel kept the advised-away pages")
    starts = [(3 << 20) + k * (1 << 20) // _PROBE_EVERY for k in range(_PROBE_EVERY)]
    views = [storage.read_range_view("chunks/c.chunk", a, a + 8192) for a in starts]
    assert bytearray in [_backing(v) for v in views]
    assert [bytes(v) for v in views] == [_CHUNK[a : a + 8192] for a in starts]


def test_a_chunk_cached_at_its_first_read_is_read_through_its_map(tmp_path: Path) -> None:
    import mmap

    storage = LocalStorage(tmp_path)
    storage.write("chunks/c.chunk", _CHUNK)
    assert storage.read("chunks/c.chunk") == _CHUNK  # now in the page cache
    if hasattr(os, "RWF_NOWAIT") and not _resident(tmp_path / "chunks" / "c.chunk", 0, 1 << 22):
        pytest.skip("the file was not cached after a whole read")
    first = storage.read_range_view("chunks/c.chunk", 100, 20_000)
    second = storage.read_range_view("chunks/c.chunk", 5000, 9000)
    assert bytes(first) == _CHUNK[100:20_000] and bytes(second) == _CHUNK[5000:9000]
    assert _backing(second) is mmap.mmap
    # Past the end of the file: as short as the file, either way.
    assert (
        bytes(storage.read_range_view("chunks/c.chunk", len(_CHUNK) - 10, len(_CHUNK) + 90))
        == (_CHUNK[-10:])
    )


def test_a_large_range_of_a_cached_chunk_is_read_not_mapped(tmp_path: Path) -> None:
    """A block's range (from _MAP_BELOW) is preaded even once the chunk reads through its
    map: a first touch through the map would map in the page cache's folios around it."""
    import mmap

    from txstore.storage.local import _MAP_BELOW

    storage = LocalStorage(tmp_path)
    storage.write("chunks/c.chunk", _CHUNK)
    assert storage.read("chunks/c.chunk") == _CHUNK
    if hasattr(os, "RWF_NOWAIT") and not _resident(tmp_path / "chunks" / "c.chunk", 0, 1 << 22):
        pytest.skip("the file was not cached after a whole read")
    storage.read_range_view("chunks/c.chunk", 100, 900)  # finds the chunk cached
    small = storage.read_range_view("chunks/c.chunk", 5000, 9000)
    assert _backing(small) is mmap.mmap  # so it reads through its map
    large = storage.read_range_view("chunks/c.chunk", 1 << 20, (1 << 20) + _MAP_BELOW)
    assert bytes(large) == _CHUNK[1 << 20 : (1 << 20) + _MAP_BELOW]
    assert _backing(large) is not mmap.mmap


def test_range_reads_past_the_end_of_an_uncached_chunk_are_short(tmp_path: Path) -> None:
    storage, _ = _uncached_chunk(tmp_path)
    end = len(_CHUNK)
    assert bytes(storage.read_range_view("chunks/c.chunk", end - 10, end + 90)) == _CHUNK[-10:]
    assert storage.read_range("chunks/c.chunk", end - 4, end + 4) == _CHUNK[-4:]


def test_kept_maps_hold_a_bounded_number_of_descriptors(tmp_path: Path) -> None:
    from txstore.storage.local import _MAX_KEPT_MAPS

    storage = LocalStorage(tmp_path)
    for k in range(3 * _MAX_KEPT_MAPS):
        storage.write(f"chunks/{k}.chunk", bytes([k % 256]) * 10_000)
    before = len(os.listdir("/proc/self/fd"))
    for k in range(3 * _MAX_KEPT_MAPS):
        assert bytes(storage.read_range_view(f"chunks/{k}.chunk", 10, 20)) == bytes([k % 256]) * 10
    # Two per kept map: the one it reads through and the one Python's mmap keeps (a dup).
    assert len(os.listdir("/proc/self/fd")) - before <= 2 * _MAX_KEPT_MAPS
    storage.close()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_a_staged_file_is_published_whole_or_not_at_all(tmp_path: Path) -> None:
    """Parts written out of order make the file, which appears under its key only when
    published (replacing what was there, which a kept map had read); one not published
    leaves nothing behind, not even its temporary name."""
    storage = LocalStorage(tmp_path)
    storage.write("chunks/a.chunk", b"old bytes")
    assert storage.read_range_view("chunks/a.chunk", 0, 3) == b"old"  # a map kept
    payload = os.urandom(10_000)
    with storage.stage_unsynced("chunks/a.chunk") as staged:
        staged.put(6000, payload[6000:])
        staged.put(0, memoryview(payload)[:6000])
        assert storage.read("chunks/a.chunk") == b"old bytes"  # not yet published
        assert bytes(staged.view()) == payload
        staged.publish()
    assert storage.read("chunks/a.chunk") == payload
    assert bytes(storage.read_range_view("chunks/a.chunk", 0, 3)) == payload[:3]
    with storage.stage_unsynced("chunks/b.chunk") as staged:
        staged.put(0, b"never published")
    with pytest.raises(ValueError), storage.stage_unsynced("chunks/c.chunk") as staged:
        staged.put(0, b"abandoned")
        raise ValueError("the download failed")
    assert sorted(os.listdir(tmp_path / "chunks")) == ["a.chunk"]
