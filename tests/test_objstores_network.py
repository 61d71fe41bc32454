"""Lost and delayed replies between the GCS / Azure clients and their emulators, through the
loopback proxy of proxy.py: the cases of test_network.py, through its helpers.

gcsfs retries after a lost reply itself (six attempts, backing off from a second), and so
replays the commit as aiohttp does on S3; a reply later than its ``requests_timeout`` it does
not retry. The Azure SDK's first retry waits about 15 s, so its
clients here have none (``retry_total=0``): each lost reply is an unknown outcome that the
writer settles by reading back, at once. Every case runs on both: losing one reply of every
request of an append costs GCS a backoff of gcsfs's per request (about 10 s in all), and the
proxy pairs a commit it delivers late with the read-back of the same object (``object_of``:
a GCS upload names its object in the query).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pytest

import txstore

from .conftest import Backend
from .emulators import AzuriteServer, GcsServer
from .invariants import txn_samples
from .proxy import Proxy, Request, Rule
from .test_network import PATIENT, READ_TIMEOUT, Case, delay_each_write


@dataclass
class Remote:
    """A fresh store on an emulator, and how to reach the emulator through a proxy."""

    backend: Backend
    upstream: tuple[str, int]
    through: Callable[[str, float], dict[str, Any]]  # options: at an endpoint, with a timeout


@pytest.fixture(params=["gcs", "azure"])
def remote(request: pytest.FixtureRequest) -> Remote:
    if request.param == "gcs":
        gcs: GcsServer = request.getfixturevalue("gcs_server")
        backend = Backend("gcs", f"gs://{gcs.new_bucket()}/store", gcs.options)

        def gcs_through(endpoint: str, timeout: float) -> dict[str, Any]:
            return dict(gcs.options, endpoint_url=endpoint, requests_timeout=timeout)

        return Remote(backend, _host_port(gcs.endpoint), gcs_through)
    azure: AzuriteServer = request.getfixturevalue("azurite_server")
    backend = Backend("azure", f"az://{azure.new_container()}/store", azure.options)
    host_port = _host_port(azure.endpoint)

    def azure_through(endpoint: str, timeout: float) -> dict[str, Any]:
        upstream = "http://{}:{}".format(*host_port)
        connection = azure.connection_string.replace(upstream, endpoint)
        return {
            "connection_string": connection,
            "read_timeout": timeout,
            "connection_timeout": timeout,
            "retry_total": 0,
        }

    return Remote(backend, host_port, azure_through)


def _host_port(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.removeprefix("http://").split("/")[0].split(":")
    return host, int(port)


@pytest.fixture
def remote_proxy(remote: Remote) -> Iterator[Proxy]:
    p = Proxy(remote.upstream)
    try:
        yield p
    finally:
        p.close()


class RemoteCase(Case):
    """test_network's Case on a GCS or Azure store."""

    def __init__(self, remote: Remote, proxy: Proxy, timeout: float = READ_TIMEOUT) -> None:
        self.uri = remote.backend.uri
        self.direct = txstore.create(self.uri, **remote.backend.kwargs())
        self.direct.append(txn_samples("base", 2))
        self.options = remote.through(proxy.endpoint, timeout)
        self.store = txstore.open(self.uri, storage_options=self.options)
        self.proxy = proxy
        self.checked = 0


def is_commit(request: Request) -> bool:
    # Azure PUTs the blob at its path; GCS POSTs a multipart upload naming it in the query.
    return request.method in ("PUT", "POST") and "/versions/index.v" in unquote(request.path)


# One lost reply: the replay (GCS) or the read-back (Azure) meets our own manifest. Losing
# the replays too costs gcsfs's backoff each time; test_network.py does that on S3.
@pytest.mark.parametrize("txn", [True, False])
def test_lost_reply_to_the_commit(remote: Remote, remote_proxy: Proxy, txn: bool) -> None:
    """The server commits the manifest; its reply never arrives."""
    case = RemoteCase(remote, remote_proxy, timeout=PATIENT)
    reported = case.append("t", Rule(is_commit, "drop"), txn=txn)
    assert reported == 2  # a replay or the read-back met our own manifest: ours
    assert case.check("t", reported, retry=txn) == []


def test_reply_to_the_commit_delayed_past_the_client_timeout(
    remote: Remote, remote_proxy: Proxy
) -> None:
    case = RemoteCase(remote, remote_proxy)
    reported = case.append("t", Rule(is_commit, "delay", delay=2.5 * READ_TIMEOUT))
    assert reported in (2, None)
    assert case.check("t", reported) == []


def test_lost_reply_at_every_request_of_an_append(remote: Remote, remote_proxy: Proxy) -> None:
    case = RemoteCase(remote, remote_proxy, timeout=PATIENT)
    case.append("probe")
    requests = list(case.proxy.seen)
    assert sum(is_commit(r) for r in requests) == 1
    for k in range(1, len(requests) + 1):
        reported = case.append(f"t{k}", Rule(lambda r, k=k: r.number == k, "drop"))
        assert case.check(f"t{k}", reported) == [], f"reply to request {k} lost"
    assert case.check_all() == []


def test_delayed_reply_at_every_write_of_an_append(remote: Remote, remote_proxy: Proxy) -> None:
    # Writes: Azure PUTs each blob; GCS POSTs each upload.
    delay_each_write(RemoteCase(remote, remote_proxy), ("PUT", "POST"))


def test_commit_request_delivered_after_the_client_gave_up(
    remote: Remote, remote_proxy: Proxy
) -> None:
    """The proxy holds the commit's PUT, loses the client's retries of it, and delivers it
    once the client, having given up, reads the key back."""
    # The proxy delivers a held write when a read of the same object comes (``object_of``).
    case = RemoteCase(remote, remote_proxy)
    late, lose = Rule(is_commit, "late"), Rule(is_commit, "lose", times=20)
    reported = case.append("t", late, lose)
    assert late.times == 0 and late.held is None  # held, then delivered after the read-back
    assert case.check("t", reported, retry=False) == []
