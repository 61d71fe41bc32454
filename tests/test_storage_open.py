"""open_storage: the backend for a URI."""

from __future__ import annotations

from pathlib import Path

import pytest

from txstore.storage import LocalStorage, MemoryStorage, S3Storage, open_storage


def test_the_scheme_picks_the_backend(tmp_path: Path) -> None:
    assert isinstance(open_storage(str(tmp_path)), LocalStorage)
    assert isinstance(open_storage(tmp_path), LocalStorage)
    local = open_storage(f"file://{tmp_path}")
    assert isinstance(local, LocalStorage) and local.root == str(tmp_path)
    assert isinstance(open_storage("memory://x"), MemoryStorage)
    s3 = open_storage("s3://bucket/prefix/", {"anon": True})
    assert isinstance(s3, S3Storage) and s3.uri == "s3://bucket/prefix"


def test_unknown_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported store URI"):
        open_storage("ftp://example/x")


def test_storage_options_for_a_local_store_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only apply to remote stores"):
        open_storage(str(tmp_path), {"anon": True})
