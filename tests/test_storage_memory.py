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


def test_listing_a_prefix_gives_exactly_the_keys_under_it() -> None:
    """Against a plain scan of the keys written, for folders, nested folders, the root and
    prefixes that end inside a name, as keys come and go (the store keeps an index of them)."""
    storage = open_storage(f"memory://{uuid.uuid4().hex}")
    keys = {
        "HEAD",
        "chunks/a.chunk",
        "chunks/ab.chunk",
        "chunks/b.chunk",
        "refs/tags/v1",
        "refs/leases/x",
        "refs/retention.json",
        "versions/index.v1.json",
        "versions/index.v10.json",
    }
    prefixes = ["", "chunks/", "chunks/a", "refs/", "refs/tags/", "refs/t", "versions/index.v1",
                "nothing/", "H", "refs/tags/v1"]  # fmt: skip

    def check() -> None:
        for prefix in prefixes:
            want = sorted(k for k in keys if k.startswith(prefix))
            assert [f.key for f in storage.list(prefix)] == want, prefix

    for key in sorted(keys):
        storage.write(key, key.encode())
    check()
    storage.write("chunks/a.chunk", b"again")  # a rewrite adds no second entry
    check()
    for key in ["chunks/a.chunk", "refs/tags/v1", "HEAD", "nothing/here"]:
        storage.delete(key)
        keys.discard(key)
        check()
    storage.put_if_absent("refs/tags/v2", b"t")
    keys.add("refs/tags/v2")
    check()
