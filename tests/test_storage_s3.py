"""The storage contract on S3: a moto server process (ministack for the race)."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import pytest

import txstore
from txstore.storage import Storage, open_storage

from .conftest import S3Server
from .storage_suite import StorageSuite


def _closed_port() -> int:
    """A loopback port with nothing listening on it (bound once, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TestS3Storage(StorageSuite):
    cached_after_read = False  # every read is a GET
    shared_across_processes = True
    is_remote = True
    has_local_path = False

    @pytest.fixture
    def storage(self, s3_server: S3Server) -> Storage:
        return open_storage(f"s3://{s3_server.new_bucket()}/datasets/store", s3_server.options)

    @pytest.fixture
    def strict_storage(self, ministack_server: S3Server) -> Storage:
        # moto checks a condition and writes without a lock: under preemption two racers
        # can rarely both win there (../shared/notes/storage-facts.md); that tests moto.
        server = ministack_server
        return open_storage(f"s3://{server.new_bucket()}/datasets/store", server.options)

    @pytest.fixture
    def failing_storage(self, s3_server: S3Server) -> Storage:
        # The right credentials and a real bucket, at an endpoint where no server listens:
        # every call fails to connect. One botocore attempt, so each fails in seconds.
        options = dict(
            s3_server.options,
            endpoint_url=f"http://127.0.0.1:{_closed_port()}",
            config_kwargs={"retries": {"max_attempts": 1}},
        )
        return open_storage(f"s3://{s3_server.new_bucket()}/{uuid.uuid4().hex}", options)


def test_stores_opened_with_the_same_options_share_a_client(s3_server: S3Server) -> None:
    """Opening a store again in the same process reuses the S3 client of the first open (a
    new client costs 100-200 ms before its first request, most of what an open took);
    other options (another endpoint, other credentials) get a client of their own."""
    uri = f"s3://{s3_server.new_bucket()}/store"
    txstore.create(uri, storage_options=s3_server.options).append([{"i": 1}])
    first = txstore.open(uri, storage_options=dict(s3_server.options))
    again = txstore.open(uri, storage_options=dict(s3_server.options))
    assert first.snapshot()[0] == again.snapshot()[0] == {"i": 1}
    client = first.storage._fs  # type: ignore[attr-defined]
    assert again.storage._fs is client  # type: ignore[attr-defined]
    for other in (
        dict(s3_server.options, endpoint_url=f"http://127.0.0.1:{_closed_port()}"),
        dict(s3_server.options, key="someone-else"),
    ):
        assert open_storage(uri, other)._fs is not client  # type: ignore[attr-defined]


def test_a_shared_client_answers_what_another_store_wrote_since(s3_server: S3Server) -> None:
    """Two stores on the same client see each other's writes at once: nothing is cached."""
    uri = f"s3://{s3_server.new_bucket()}/store"
    first, second = open_storage(uri, s3_server.options), open_storage(uri, s3_server.options)
    assert not first.exists("refs/a.json") and list(first.list("refs/")) == []
    second.write("refs/a.json", b"1")
    assert first.exists("refs/a.json")
    assert [f.key for f in first.list("refs/")] == ["refs/a.json"]
    assert first.read("refs/a.json") == b"1"
    second.delete("refs/a.json")
    assert not first.exists("refs/a.json") and list(first.list("refs/")) == []


def test_a_whole_read_is_one_request(s3_server: S3Server, proxy: Any) -> None:
    """Manifests, segments and cached chunks are read whole: one GET each, no HEAD first."""
    options = dict(s3_server.options, endpoint_url=proxy.endpoint)
    storage = open_storage(f"s3://{s3_server.new_bucket()}/store", options)
    storage.write("segments/a.json", b"x" * 1000)
    proxy.reset()
    assert storage.read("segments/a.json") == b"x" * 1000
    assert storage.read_with_token("segments/a.json")[0] == b"x" * 1000
    assert [r.method for r in proxy.seen] == ["GET", "GET"]


def _rebuilt(calls: list[tuple[int, bytes]], size: int) -> bytes:
    """What the calls' writes leave in a file of ``size`` bytes, in the order they came."""
    out = bytearray(size)
    for offset, data in calls:
        out[offset : offset + len(data)] = data
    return bytes(out)


def test_a_long_range_is_handed_over_as_it_arrives(s3_server: S3Server) -> None:
    """A chunk's part reaches ``put`` a megabyte or so at a time, as the reply's buffers came
    in, never joined into one buffer of the whole part first."""
    from txstore.storage.aio import HAND_OVER_BYTES

    storage = open_storage(f"s3://{s3_server.new_bucket()}/store", s3_server.options)
    payload = os.urandom(5 * HAND_OVER_BYTES + 123)
    storage.write("chunks/a.chunk", payload)
    calls: list[tuple[int, bytes]] = []
    sizes: list[int] = []

    def put(offset: int, pieces: list[bytes]) -> None:
        calls.append((offset, b"".join(pieces)))
        sizes.extend(len(p) for p in pieces)

    storage.read_ranges_into("chunks/a.chunk", [(7, len(payload))], put)
    assert _rebuilt(calls, len(payload))[7:] == payload[7:]
    assert [o for o, _ in calls] == sorted(o for o, _ in calls)  # one range: in order
    assert len(calls) >= 5
    assert max(len(d) for _, d in calls) < 2 * HAND_OVER_BYTES
    assert max(sizes) <= HAND_OVER_BYTES


def test_a_reply_cut_short_is_read_again_from_its_start(s3_server: S3Server, proxy: Any) -> None:
    """The connection breaks halfway through a part: the part is asked for again and written
    whole (the bytes handed over before the break are written again, the same)."""
    from .proxy import Rule

    options = dict(s3_server.options, endpoint_url=proxy.endpoint)
    storage = open_storage(f"s3://{s3_server.new_bucket()}/store", options)
    payload = os.urandom(3 * 2**20 + 5)
    storage.write("chunks/a.chunk", payload)
    calls: list[tuple[int, bytes]] = []
    proxy.reset(Rule(lambda r: r.method == "GET" and bool(r.range), "cut"))
    storage.read_ranges_into(
        "chunks/a.chunk", [(0, len(payload))], lambda o, p: calls.append((o, b"".join(p)))
    )
    assert _rebuilt(calls, len(payload)) == payload
    assert [r.method for r in proxy.seen] == ["GET", "GET"]
    assert sum(len(d) for _, d in calls) > len(payload)  # the first reply's half was handed over
