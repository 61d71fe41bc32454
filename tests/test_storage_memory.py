"""The storage contract on the in-process memory backend."""

from __future__ import annotations

import pickle
import uuid

import pytest

from txstore.storage import MemoryStorage, Storage, open_storage

from .storage_suite import StorageSuite


class TestMemoryStorage(StorageSuite):
    cached_after_read = True
    shared_across_processes = False  # a dict in this process
    is_remote = False
    has_local_path = False

    @pytest.fixture
    def storage(self) -> Storage:
        return open_storage(f"memory://{uuid.uuid4().hex}")

    @pytest.fixture
    def failing_storage(self) -> Storage:
        pytest.skip("a memory store makes no I/O that could fail")


def test_a_named_memory_store_is_one_dict_within_the_process() -> None:
    name = uuid.uuid4().hex
    first = open_storage(f"memory://{name}")
    first.write("HEAD", b"h")
    assert open_storage(f"memory://{name}").read("HEAD") == b"h"
    assert pickle.loads(pickle.dumps(first)).read("HEAD") == b"h"


def test_an_anonymous_memory_store_refuses_to_be_pickled() -> None:
    with pytest.raises(TypeError, match="anonymous"):
        pickle.dumps(MemoryStorage())
