"""The backend check: a server that lets conditional writes through is refused before any
commit, on a real moto server behind a proxy that strips the conditional headers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import txstore
from txstore.errors import UnsafeStorageError
from txstore.format import manifest as fmt
from txstore.storage import MemoryStorage, Storage, open_storage

from .broken import BlindPut
from .conftest import Backend, S3Server
from .faults import FaultyStorage
from .proxy import Proxy

CONDITIONS = frozenset({"if-none-match", "if-match"})


def _proxied(server: S3Server, strip: frozenset[str]) -> Iterator[tuple[Proxy, dict]]:
    host, port = server.endpoint.removeprefix("http://").split(":")
    proxy = Proxy((host, int(port)), strip=strip)
    try:
        yield proxy, dict(server.options, endpoint_url=proxy.endpoint)
    finally:
        proxy.close()


@pytest.fixture
def ignoring(s3_server: S3Server) -> Iterator[tuple[Proxy, dict]]:
    """Options that reach moto through a proxy dropping If-None-Match and If-Match."""
    yield from _proxied(s3_server, CONDITIONS)


def _keys(server: S3Server, uri: str) -> list[str]:
    return sorted(f.key for f in open_storage(uri, server.options).list(""))


def test_a_server_that_ignores_conditions_cannot_be_created_on(
    s3_server: S3Server, ignoring: tuple[Proxy, dict]
) -> None:
    proxy, options = ignoring
    uri = f"s3://{s3_server.new_bucket()}/store"
    with pytest.raises(UnsafeStorageError, match=r"put_if_absent check.*second conditional create"):
        txstore.create(uri, storage_options=options)
    assert any(r.method == "PUT" for r in proxy.seen)  # it went through the proxy
    assert _keys(s3_server, uri) == []  # no version 0, and the probe deleted
    with pytest.raises(txstore.StoreNotFoundError):
        txstore.open(uri, storage_options=s3_server.options)


def test_a_writer_through_such_a_server_commits_nothing(
    s3_server: S3Server, ignoring: tuple[Proxy, dict]
) -> None:
    """The store was made through a safe endpoint; a writer reaching it through an unsafe
    one is checked (its endpoint is not on record) and refused before writing a chunk."""
    uri = f"s3://{s3_server.new_bucket()}/store"
    store = txstore.create(uri, storage_options=s3_server.options)
    store.append([{"i": 0}])
    before = _keys(s3_server, uri)
    _, options = ignoring
    writer = txstore.open(uri, storage_options=options)  # reading is fine
    assert len(writer.snapshot()) == 1
    with pytest.raises(UnsafeStorageError, match="put_if_absent"):
        writer.append([{"i": i} for i in range(1, 5)])
    with pytest.raises(UnsafeStorageError), writer.transaction() as txn:
        txn.writer().write([{"i": 9}])
    assert _keys(s3_server, uri) == before
    assert txstore.open(uri, storage_options=s3_server.options).version == 1


@pytest.mark.parametrize(
    ("strip", "check", "what"),
    [
        ({"if-match"}, "compare_and_swap", "stale token succeeded"),
        ({"if-none-match"}, "put_if_absent", "second conditional create"),
    ],
)
def test_a_server_that_keeps_only_one_condition_is_refused(
    s3_server: S3Server, strip: set[str], check: str, what: str
) -> None:
    for _, options in _proxied(s3_server, frozenset(strip)):
        uri = f"s3://{s3_server.new_bucket()}/store"
        with pytest.raises(UnsafeStorageError, match=rf"{check} check: .*{what}"):
            txstore.create(uri, storage_options=options)
        assert _keys(s3_server, uri) == []


def _record(storage: Storage) -> fmt.StorageCheck:
    return fmt.decode(storage.read(fmt.STORAGE_CHECK_KEY), fmt.StorageCheck, "record")


def _probes(spy: FaultyStorage) -> set[str]:
    """The probe objects a writer made: one per run of the check."""
    return {key for op, key in spy.calls if op == "put_if_absent" and fmt.is_probe_key(key)}


def test_the_pass_is_recorded_per_endpoint(s3_server: S3Server) -> None:
    uri = f"s3://{s3_server.new_bucket()}/store"
    txstore.create(uri, storage_options=s3_server.options)
    raw = open_storage(uri, s3_server.options)
    record = _record(raw)
    assert [e.endpoint for e in record.endpoints] == [s3_server.endpoint]
    assert set(record.endpoints[0].checks) == {"put_if_absent", "compare_and_swap"}
    # A writer through the recorded endpoint reads the record and runs no probe.
    spy = FaultyStorage(open_storage(uri, s3_server.options))
    txstore.Store(spy).append([{"i": 1}])
    assert _probes(spy) == set() and ("read_with_token", fmt.STORAGE_CHECK_KEY) in spy.calls
    # Through another endpoint (an honest proxy) it probes once and adds that endpoint.
    for proxy, options in _proxied(s3_server, frozenset()):
        spy = FaultyStorage(open_storage(uri, options))
        store = txstore.Store(spy)
        store.append([{"i": 2}])
        store.append([{"i": 3}])
        assert len(_probes(spy)) == 1
        assert [e.endpoint for e in _record(raw).endpoints] == [s3_server.endpoint, proxy.endpoint]
    assert [s["i"] for s in txstore.open(uri, storage_options=s3_server.options).snapshot()] == [
        1,
        2,
        3,
    ]


def test_a_damaged_record_costs_a_probe_not_a_commit(s3_server: S3Server) -> None:
    uri = f"s3://{s3_server.new_bucket()}/store"
    txstore.create(uri, storage_options=s3_server.options)
    raw = open_storage(uri, s3_server.options)
    raw.write(fmt.STORAGE_CHECK_KEY, b'{"type": "storage-check", [')
    spy = FaultyStorage(open_storage(uri, s3_server.options))
    assert txstore.Store(spy).append([{"i": 1}]).version == 1
    assert len(_probes(spy)) == 1
    assert _record(raw).endpoints[0].checks == ("put_if_absent", "compare_and_swap")


def test_a_blind_put_over_a_remote_backend_is_refused(s3_server: S3Server) -> None:
    """The check runs on what the writer was handed, whatever sits below: a wrapper whose
    put-if-absent overwrites is caught in process too."""
    uri = f"s3://{s3_server.new_bucket()}/store"
    with pytest.raises(UnsafeStorageError, match="put_if_absent"):
        txstore.create(BlindPut(open_storage(uri, s3_server.options)))
    assert _keys(s3_server, uri) == []


def test_local_and_memory_stores_are_not_probed(tmp_path: Path) -> None:
    for storage in (open_storage(str(tmp_path / "s")), MemoryStorage()):
        spy = FaultyStorage(storage)
        txstore.create(spy).append([{"i": 1}])
        assert _probes(spy) == set() and not any(k.startswith("checks/") for _, k in spy.calls)


def test_vacuum_deletes_a_probe_left_behind_never_the_record(tmp_path: Path) -> None:
    uri = str(tmp_path / "s")
    store = txstore.create(uri)
    left = tmp_path / "s" / fmt.probe_key(uuid.uuid4().hex)  # a writer killed mid-check
    left.parent.mkdir()
    left.write_bytes(b"probe:1")
    (tmp_path / "s" / fmt.STORAGE_CHECK_KEY).write_bytes(b"{}")  # a record, damaged or not
    not_a_probe = tmp_path / "s" / "checks" / "probe.notes"
    not_a_probe.write_bytes(b"mine")
    old = os.stat(left).st_mtime - 30 * 86400
    for path in (left, not_a_probe, tmp_path / "s" / fmt.STORAGE_CHECK_KEY):
        os.utime(path, (old, old))
    report = store.vacuum(grace=0)
    assert [f.key for f in report.files] == [fmt.probe_key(left.name.removeprefix("probe."))]
    assert not left.exists() and not_a_probe.exists()
    assert (tmp_path / "s" / fmt.STORAGE_CHECK_KEY).exists()


def test_gcs_and_azure_pass_the_check_and_record_their_endpoints(objstore: Backend) -> None:
    """The emulators keep both conditions on the calls the backends make; the endpoint on
    record is the server the client talks to, so a blind wrapper over it is still caught."""
    store = txstore.create(objstore.uri, **objstore.kwargs())
    raw = open_storage(objstore.uri, objstore.storage_options)
    (entry,) = _record(raw).endpoints
    assert entry.endpoint == raw.endpoint and "127.0.0.1" in entry.endpoint
    assert store.append([{"i": 1}]).version == 1
    fresh = f"{objstore.uri}-other"
    with pytest.raises(UnsafeStorageError, match="put_if_absent"):
        txstore.create(BlindPut(open_storage(fresh, objstore.storage_options)))
