"""Network faults between s3fs and a real moto server, through the loopback proxy of proxy.py.

A reply lost after the server committed, or held past the client's read timeout, makes the
client replay the request (aiohttp, botocore) or give up. Whatever it does, an append reports
the version it committed, or raises; it never commits twice, and a retry with the same txn_id
settles it exactly once.
"""

from __future__ import annotations

from typing import Any

import pytest

import txstore
from txstore.errors import TxstoreError

from .conftest import S3Server
from .invariants import Ack, txn_samples, violations
from .proxy import Proxy, Request, Rule

READ_TIMEOUT = 0.5  # seconds the client waits for a reply (moto answers in ms); delays exceed it


def _through(proxy: Proxy, server: S3Server, attempts: int) -> dict[str, Any]:
    """Storage options that reach the server through the proxy, with a short read timeout."""
    config = {
        "read_timeout": READ_TIMEOUT,
        "connect_timeout": READ_TIMEOUT,
        "retries": {"max_attempts": attempts, "mode": "standard"},
    }
    return dict(server.options, endpoint_url=proxy.endpoint, config_kwargs=config)


def is_commit(request: Request) -> bool:
    return request.method == "PUT" and "/versions/index.v" in request.path


class Case:
    """A store opened directly and through the proxy; ``append`` runs under the proxy's rules.

    The cases of one test share the store: each appends a new transaction to it.
    """

    def __init__(self, server: S3Server, proxy: Proxy, attempts: int = 2) -> None:
        self.uri = f"s3://{server.new_bucket()}/store"
        self.direct = txstore.create(self.uri, storage_options=server.options)
        self.direct.append(txn_samples("base", 2))
        self.store = txstore.open(self.uri, storage_options=_through(proxy, server, attempts))
        self.proxy = proxy
        self.checked = 0  # versions below this one passed a check already

    def append(self, tag: str, *rules: Rule, txn: bool = True) -> int | None:
        """The version reported, or None if the append raised."""
        self.proxy.reset(*rules)
        try:
            return self.store.append(txn_samples(tag, 3), txn_id=tag if txn else None).version
        except TxstoreError:
            return None
        finally:
            self.proxy.disarm()

    def check(self, tag: str, reported: int | None, *, retry: bool = True) -> list[str]:
        """Violations after an append of ``tag`` that reported ``reported``.

        Checks the versions made since the last check (each check of a long test would
        otherwise reread the whole store); ``check_all`` rereads everything.
        """
        history, found = violations(
            self.direct, [Ack(tag, reported)] if reported else [], first=self.checked
        )
        landed = history.version_of(tag)
        if reported is not None and landed is None:
            found.append(f"{tag} reported v{reported} but is not in the store")
        if retry:  # the same txn id again: returns the landed version, or lands now
            again = self.direct.append(txn_samples(tag, 3), txn_id=tag).version
            if landed is not None and again != landed:
                found.append(f"the retry of {tag} reported v{again}, it landed at v{landed}")
            history, more = violations(self.direct, [Ack(tag, again)], first=self.checked)
            found += more
        self.checked = history.latest + 1
        return found

    def check_all(self) -> list[str]:
        return violations(self.direct)[1]


@pytest.mark.parametrize("txn", [True, False])
@pytest.mark.parametrize("lost", [1, 2, 3])
def test_lost_replies_to_the_commit(
    s3_server: S3Server, proxy: Proxy, lost: int, txn: bool
) -> None:
    """The server commits the manifest; its reply, and those to replays, never arrive."""
    case = Case(s3_server, proxy)
    reported = case.append("t", Rule(is_commit, "drop", times=lost), txn=txn)
    if lost == 1:
        assert reported == 2  # the client's replay met our own manifest: read back, ours
    assert case.check("t", reported, retry=txn) == []


@pytest.mark.parametrize("attempts", [1, 3])
def test_reply_to_the_commit_delayed_past_the_client_timeout(
    s3_server: S3Server, proxy: Proxy, attempts: int
) -> None:
    case = Case(s3_server, proxy, attempts)
    rule = Rule(is_commit, "delay", times=attempts, delay=2.5 * READ_TIMEOUT)
    reported = case.append("t", rule)
    assert reported in (2, None)
    assert case.check("t", reported) == []


def _requests_of_an_append(case: Case) -> list[Request]:
    case.append("probe")
    return list(case.proxy.seen)


def test_lost_reply_at_every_request_of_an_append(s3_server: S3Server, proxy: Proxy) -> None:
    case = Case(s3_server, proxy)
    requests = _requests_of_an_append(case)
    assert sum(is_commit(r) for r in requests) == 1
    for k in range(1, len(requests) + 1):
        reported = case.append(f"t{k}", Rule(lambda r, k=k: r.number == k, "drop"))
        assert case.check(f"t{k}", reported) == [], f"reply to request {k} lost"
    assert case.check_all() == []


def test_delayed_reply_at_every_write_of_an_append(s3_server: S3Server, proxy: Proxy) -> None:
    case = Case(s3_server, proxy)
    writes = [r.number for r in _requests_of_an_append(case) if r.method == "PUT"]
    assert len(writes) >= 4  # chunk, segment, manifest, HEAD, marker
    for k in writes:
        rule = Rule(lambda r, k=k: r.number == k, "delay", delay=2.5 * READ_TIMEOUT)
        reported = case.append(f"t{k}", rule)
        assert case.check(f"t{k}", reported) == [], f"reply to request {k} delayed"
    assert case.check_all() == []
