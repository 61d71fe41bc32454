"""The storage contract on S3: a moto server process (ministack for the race)."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import pytest

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
