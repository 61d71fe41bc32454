"""The storage contract on GCS: a fake-gcs-server process."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from txstore.storage import Storage, open_storage

from .emulators import GcsServer, refusing_server
from .storage_suite import StorageSuite


class TestGcsStorage(StorageSuite):
    cached_after_read = False  # every read is a GET
    shared_across_processes = True
    is_remote = True
    has_local_path = False

    @pytest.fixture
    def storage(self, gcs_server: GcsServer) -> Storage:
        return open_storage(f"gs://{gcs_server.new_bucket()}/datasets/store", gcs_server.options)

    @pytest.fixture
    def failing_storage(self, gcs_server: GcsServer) -> Iterator[Storage]:
        # A server that refuses every request: gcsfs retries a refused connection six times
        # with backoff (half a minute a call), a 403 not at all.
        with refusing_server() as endpoint:
            options = dict(gcs_server.options, endpoint_url=endpoint)
            yield open_storage(f"gs://bucket-{uuid.uuid4().hex[:8]}/store", options)


def test_a_bucket_root_and_the_gcs_scheme(gcs_server: GcsServer) -> None:
    """A store at the root of a bucket: keys are the object names; ``gcs://`` is ``gs://``."""
    bucket = gcs_server.new_bucket()
    root = open_storage(f"gs://{bucket}", gcs_server.options)
    root.put_if_absent("HEAD", b"h")
    root.write("chunks/a", b"a")
    assert [f.key for f in root.list("")] == ["HEAD", "chunks/a"]
    assert open_storage(f"gcs://{bucket}/chunks", gcs_server.options).read("a") == b"a"
