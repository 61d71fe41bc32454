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
