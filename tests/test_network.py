"""Network faults between s3fs and a real moto server, through the loopback proxy of proxy.py.

A reply lost after the server committed, or held past the client's read timeout, makes the
client replay the request (aiohttp, botocore) or give up. Whatever it does, an append reports
the version it committed, or raises; it never commits twice, and a retry with the same txn_id
settles it exactly once.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import txstore
from txstore.errors import StorageError, TxstoreError
from txstore.storage import Storage, open_storage

from .conftest import S3Server
from .faults import FaultyStorage
from .invariants import Ack, txn_samples, violations
from .proxy import Proxy, Request, Rule

READ_TIMEOUT = 0.5  # seconds the client waits for a reply (moto answers in ms); delays exceed it
# For cases that only drop replies: a drop closes the connection, so nothing waits on the
# timeout, and a reply slowed by a loaded machine must not count as lost.
PATIENT = 30.0


def _through(proxy: Proxy, server: S3Server, attempts: int, timeout: float) -> dict[str, Any]:
    """Storage options that reach the server through the proxy, with a read timeout."""
    config = {
        "read_timeout": timeout,
        "connect_timeout": timeout,
        "retries": {"max_attempts": attempts, "mode": "standard"},
    }
    return dict(server.options, endpoint_url=proxy.endpoint, config_kwargs=config)


def is_commit(request: Request) -> bool:
    return request.method == "PUT" and "/versions/index.v" in request.path


class Case:
    """A store opened directly and through the proxy; ``append`` runs under the proxy's rules.

    The cases of one test share the store: each appends a new transaction to it.
    """

    def __init__(
        self, server: S3Server, proxy: Proxy, attempts: int = 2, timeout: float = READ_TIMEOUT
    ) -> None:
        self.uri = f"s3://{server.new_bucket()}/store"
        self.direct = txstore.create(self.uri, storage_options=server.options)
        self.direct.append(txn_samples("base", 2))
        self.options = _through(proxy, server, attempts, timeout)
        self.store = txstore.open(self.uri, storage_options=self.options)
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
    case = Case(s3_server, proxy, timeout=PATIENT)
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
    case = Case(s3_server, proxy, timeout=PATIENT)
    requests = _requests_of_an_append(case)
    assert sum(is_commit(r) for r in requests) == 1
    for k in range(1, len(requests) + 1):
        reported = case.append(f"t{k}", Rule(lambda r, k=k: r.number == k, "drop"))
        assert case.check(f"t{k}", reported) == [], f"reply to request {k} lost"
    assert case.check_all() == []


def delay_each_write(case: Case, methods: tuple[str, ...]) -> None:
    """An append for each write (request of ``methods``) of a probe append, with the reply to
    that write delayed past the client's timeout: every one settles as the store says."""
    writes = [r.number for r in _requests_of_an_append(case) if r.method in methods]
    assert len(writes) >= 4  # chunk, segment, manifest, HEAD, marker
    for k in writes:
        rule = Rule(lambda r, k=k: r.number == k, "delay", delay=2.5 * READ_TIMEOUT)
        reported = case.append(f"t{k}", rule)
        assert case.check(f"t{k}", reported) == [], f"reply to request {k} delayed"
    assert case.check_all() == []


def test_delayed_reply_at_every_write_of_an_append(s3_server: S3Server, proxy: Proxy) -> None:
    delay_each_write(Case(s3_server, proxy), ("PUT",))


class LateCommit(FaultyStorage):
    """The commit's PUT times out at the client but reaches the server late.

    Its first put of a manifest raises (a read timeout: outcome unknown) without writing;
    the write is applied just after the writer's read-back of that key found nothing, as a
    slow server completes a request its client has given up on.
    """

    def __init__(self, inner: Storage, reads: int = 1) -> None:
        super().__init__(inner)
        self.late: tuple[str, bytes] | None = None
        self.done = False
        self.reads = reads  # it lands after this many reads of its key (1: the read-back)

    def put_if_absent(self, key: str, data: bytes) -> None:
        if key.startswith("versions/") and not self.done:
            self.late, self.done = (key, data), True
            raise StorageError(f"read timeout on PUT {key}")
        self.inner.put_if_absent(key, data)

    def read(self, key: str) -> bytes:
        try:
            return self.inner.read(key)
        finally:
            if self.late is not None and self.late[0] == key and self._counted():
                late, self.late = self.late, None
                self.inner.put_if_absent(*late)  # lands after the read-back missed it
                self.landed()

    def _counted(self) -> bool:
        self.reads -= 1
        return self.reads == 0

    def landed(self) -> None:
        """Called right after the late write landed."""


class LateCommitThenUnreachable(LateCommit):
    """As LateCommit, and then the store is unreachable for the writer's next read."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.unreachable = False

    def landed(self) -> None:
        self.unreachable = True

    def read(self, key: str) -> bytes:
        if self.unreachable:
            self.unreachable = False
            raise StorageError(f"connection reset reading {key}")
        return super().read(key)


@pytest.mark.parametrize("txn", [True, False])
def test_commit_that_lands_after_its_read_back(txn: bool) -> None:
    """In process, deterministic: the write lands just after the read-back missed it."""
    uri = f"memory://{uuid.uuid4().hex}"
    direct = txstore.create(uri)
    direct.append(txn_samples("base", 2))
    late = LateCommit(open_storage(uri))
    reported = txstore.Store(late).append(txn_samples("t", 3), txn_id="t" if txn else None)
    assert late.done and late.late is None  # the late write did land, after the read-back
    assert violations(direct, [Ack("t", reported.version)])[1] == []


def test_commit_that_lands_between_its_two_looks() -> None:
    """The late write misses the read-back and the next look, then lands before the writer
    reads the latest version."""
    uri = f"memory://{uuid.uuid4().hex}"
    direct = txstore.create(uri)
    direct.append(txn_samples("base", 2))
    late = LateCommit(open_storage(uri), reads=2)
    reported = txstore.Store(late).append(txn_samples("t", 3))
    assert late.done and late.late is None
    assert violations(direct, [Ack("t", reported.version)])[1] == []


@pytest.mark.parametrize("txn", [True, False])
def test_unknown_outcome_is_never_reported_as_a_failure(txn: bool) -> None:
    """The late write lands, then the writer cannot read: it must say "unknown", not "failed"
    (a caller retries a failed append without a txn_id, committing it twice)."""
    uri = f"memory://{uuid.uuid4().hex}"
    direct = txstore.create(uri)
    direct.append(txn_samples("base", 2))
    late = LateCommitThenUnreachable(open_storage(uri))
    try:
        reported: int | None = (
            txstore.Store(late).append(txn_samples("t", 3), txn_id="t" if txn else None).version
        )
    except txstore.CommitStateUnknownError:
        reported = None
    assert late.done and late.late is None and not late.unreachable
    assert violations(direct, [Ack("t", reported)] if reported else [])[1] == []


def test_commit_request_delivered_after_the_client_gave_up(
    s3_server: S3Server, proxy: Proxy
) -> None:
    """Over the network: the proxy holds the commit's PUT, loses the client's retries of it,
    and delivers it once the client, having given up, reads the key back: the server gets the
    PUT just before the client hears "not found"."""
    case = Case(s3_server, proxy, attempts=1)
    late, lose = Rule(is_commit, "late"), Rule(is_commit, "lose", times=20)
    reported = case.append("t", late, lose)  # with a txn_id: its chunks get deleted
    assert late.times == 0 and late.held is None  # held, then delivered after the read-back
    assert case.check("t", reported, retry=False) == []
