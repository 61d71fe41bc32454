"""The storage contract on Azure Blob: an Azurite process."""

from __future__ import annotations

import socket
import uuid

import pytest

from txstore.storage import Storage, open_storage

from .emulators import AZURITE_ACCOUNT, AzuriteServer
from .storage_suite import StorageSuite


def _closed_port() -> int:
    """A loopback port with nothing listening on it (bound once, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TestAzureStorage(StorageSuite):
    cached_after_read = False  # every read is a GET
    shared_across_processes = True
    is_remote = True
    has_local_path = False

    @pytest.fixture
    def storage(self, azurite_server: AzuriteServer) -> Storage:
        container = azurite_server.new_container()
        return open_storage(f"az://{container}/datasets/store", azurite_server.options)

    @pytest.fixture
    def failing_storage(self, azurite_server: AzuriteServer) -> Storage:
        # The right account and key at an endpoint where no server listens; no retries (the
        # SDK's first retry waits about 15 s), so each call fails at once.
        endpoint = f"http://127.0.0.1:{_closed_port()}/{AZURITE_ACCOUNT}"
        connection = azurite_server.connection_string.replace(azurite_server.endpoint, endpoint)
        options = {"connection_string": connection, "retry_total": 0}
        return open_storage(f"az://{azurite_server.new_container()}/{uuid.uuid4().hex}", options)


@pytest.mark.parametrize("scheme", ["az", "abfs"])
def test_a_container_root_and_both_schemes(azurite_server: AzuriteServer, scheme: str) -> None:
    """A store at the root of a container: keys are the blob names; ``abfs://`` is ``az://``."""
    container = azurite_server.new_container()
    root = open_storage(f"{scheme}://{container}", azurite_server.options)
    root.put_if_absent("HEAD", b"h")
    root.write("chunks/a", b"a")
    assert [f.key for f in root.list("")] == ["HEAD", "chunks/a"]
    assert open_storage(f"az://{container}/chunks", azurite_server.options).read("a") == b"a"
