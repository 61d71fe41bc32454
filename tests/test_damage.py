"""Damaged, foreign, stale and hostile files: clear errors, nothing lost."""

from __future__ import annotations

import json
from typing import Any

import pytest

import txstore
from txstore.errors import (
    ChecksumError,
    CorruptError,
    MissingDataError,
    UnsupportedFormatError,
)
from txstore.storage import Storage, open_storage
from txstore.txn import manifest_key

from .conftest import Backend
from .faults import FaultyStorage


def _store(backend: Backend, versions: int = 5) -> tuple[txstore.Store, Storage]:
    store = txstore.create(backend.uri, **backend.kwargs(), chunk_bytes=2048)
    for v in range(versions):
        store.append({"v": v, "i": i, "pad": bytes(300)} for i in range(10))
    return store, open_storage(backend.uri, backend.storage_options)


def _reopen(backend: Backend) -> txstore.Store:
    return txstore.open(backend.uri, **backend.kwargs())


@pytest.mark.parametrize(
    "head",
    [
        b"\x00garbage",
        b'{"format": "txstore"}',
        b"",
        b'{"type":"head","format":"txstore","format_version":[1,0],"version":999}',
    ],
)
def test_bad_head_never_loses_a_version(backend: Backend, head: bytes) -> None:
    _, raw = _store(backend)
    if head:
        raw.write("HEAD", head)
    else:
        raw.delete("HEAD")
    store = _reopen(backend)
    assert store.version == 5
    assert len(store.snapshot()) == 50
    assert store.append([{"v": 5}]).version == 6
    assert json.loads(raw.read("HEAD"))["version"] == 6  # repaired forward


def test_stale_head_is_probed_forward(backend: Backend) -> None:
    _, raw = _store(backend, versions=9)
    raw.write("HEAD", raw.read("HEAD").replace(b'"version":9', b'"version":2'))
    store = _reopen(backend)
    assert store.version == 9
    assert store.append([{"x": 1}]).version == 10


def test_missing_head_finds_latest_without_listing(backend: Backend) -> None:
    _, raw = _store(backend, versions=37)
    raw.delete("HEAD")
    spy = FaultyStorage(open_storage(backend.uri, backend.storage_options))
    assert txstore.open(spy).version == 37
    ops = [op for op, _ in spy.calls]
    assert "list" not in ops
    assert len(ops) < 30  # a galloping search: O(log versions) probes


def _rewrite_manifest(raw: Storage, version: int, change: Any) -> None:
    doc = json.loads(raw.read(manifest_key(version)))
    change(doc)
    raw.write(manifest_key(version), json.dumps(doc).encode())


def test_garbage_manifest_is_reported_and_older_versions_stay(backend: Backend) -> None:
    _, raw = _store(backend)
    raw.write(manifest_key(5), b"{not json")
    store = _reopen(backend)
    with pytest.raises(CorruptError, match=r"index\.v5\.json"):
        store.snapshot(5)
    assert len(store.snapshot(4)) == 40
    with pytest.raises(CorruptError):
        store.append([{"x": 1}])  # refuses to build on damage
    assert raw.read(manifest_key(5)) == b"{not json"
    assert not raw.exists(manifest_key(6))


def test_foreign_manifest_is_refused(backend: Backend) -> None:
    _, raw = _store(backend)
    litdata_index = {
        "chunks": [{"filename": "chunk-0-0.bin", "chunk_size": 10}],
        "config": {"compression": None},
    }
    raw.write(manifest_key(3), json.dumps(litdata_index).encode())
    with pytest.raises(CorruptError, match="not a txstore document"):
        _reopen(backend).snapshot(3)


def test_newer_major_format_is_refused(backend: Backend) -> None:
    _, raw = _store(backend)
    _rewrite_manifest(raw, 4, lambda d: d.update(format_version=[2, 0], new_thing=1))
    with pytest.raises(UnsupportedFormatError, match="upgrade txstore"):
        _reopen(backend).snapshot(4)


@pytest.mark.parametrize(
    "again, refused",
    [('"format":"other"', CorruptError), ('"format_version":[2,0]', UnsupportedFormatError)],
)
def test_a_manifest_naming_its_format_twice_is_judged_by_the_last(
    backend: Backend, again: str, refused: type[Exception]
) -> None:
    """A manifest that starts as txstore's own writer starts one, then names another format
    or a newer major version: JSON's last value counts, so it is refused."""
    _, raw = _store(backend)
    data = raw.read(manifest_key(4))
    assert data.startswith(b'{"type":"manifest","format":"txstore","format_version":[1,')
    raw.write(manifest_key(4), data[:-1] + b"," + again.encode() + b"}")
    with pytest.raises(refused):
        _reopen(backend).snapshot(4)
    assert len(_reopen(backend).snapshot(3)) == 30


def test_newer_minor_format_with_new_fields_reads(backend: Backend) -> None:
    _, raw = _store(backend)
    _rewrite_manifest(raw, 4, lambda d: d.update(format_version=[1, 7], new_thing=1))
    assert len(_reopen(backend).snapshot(4)) == 40


@pytest.mark.parametrize(
    "path",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "s3://other/x",
        "segments/../../x",
        "a//b",
        "",
        "segments/./x",
    ],
)
def test_paths_outside_the_store_are_never_followed(backend: Backend, path: str) -> None:
    _, raw = _store(backend)
    _rewrite_manifest(raw, 5, lambda d: d["segments"][0].update(path=path))
    spy = FaultyStorage(open_storage(backend.uri, backend.storage_options))
    with pytest.raises(CorruptError, match="unsafe path"):
        txstore.open(spy).snapshot(5)
    assert all(key != path for _, key in spy.calls)


def test_missing_chunk_names_chunk_and_version(backend: Backend) -> None:
    store, raw = _store(backend)
    snap = store.snapshot()
    victim = snap.chunk_refs()[1]
    raw.delete(victim.path)
    fresh = _reopen(backend).snapshot()
    with pytest.raises(MissingDataError, match=rf"{victim.path}.*version 5"):
        list(fresh)
    with pytest.raises(MissingDataError, match=victim.path):
        fresh[snap.chunk_refs()[0].num_samples]  # the first sample of the missing chunk
    assert fresh[0]["v"] == 0  # the other chunks still read


def test_flipped_byte_in_a_chunk_is_caught(backend: Backend) -> None:
    store, raw = _store(backend)
    victim = store.snapshot().chunk_refs()[0]
    data = bytearray(raw.read(victim.path))
    data[20] ^= 0xFF  # inside the first frame
    raw.write(victim.path, bytes(data))
    fresh = _reopen(backend).snapshot()
    for view in (fresh, fresh.zero_copy()):  # views of the bytes are checked all the same
        with pytest.raises(ChecksumError, match=victim.path):
            list(view)
        with pytest.raises(ChecksumError, match=victim.path):
            view[0]


def test_a_flipped_byte_is_caught_by_digest_and_by_frame_checksum(backend: Backend) -> None:
    """A chunk read whole is checked against its manifest digest (format 1.2); one written
    without a digest (an older writer) has each frame checked instead; a single sample is
    checked by its frame's checksum either way."""
    import msgspec

    from txstore.store.staging import StagedPart

    store = txstore.create(backend.uri, **backend.kwargs(), chunk_bytes=2048)
    with store.transaction() as txn:
        writer = txn.writer()
        writer.write({"i": i, "pad": bytes(300)} for i in range(20))
        part = writer.finish()
        txn.add(part)
    with store.transaction() as txn:  # the same chunks as an older writer records them
        older = tuple(msgspec.structs.replace(c, digest=None) for c in part.chunks)
        txn.add(StagedPart(staging_id=txn.handle.staging_id, chunks=older, num_samples=20))
    raw = open_storage(backend.uri, backend.storage_options)
    victim = part.chunks[0]
    assert victim.digest is not None
    data = bytearray(raw.read(victim.path))
    data[20] ^= 0xFF  # inside the first frame
    raw.write(victim.path, bytes(data))
    fresh = _reopen(backend)
    with pytest.raises(ChecksumError, match=rf"{victim.path} \(version 1\) .*digest"):
        list(fresh.snapshot(1))
    older_copy = fresh.snapshot(2)
    with pytest.raises(ChecksumError, match=rf"checksum mismatch in .*{victim.path}"):
        list(older_copy.iter_chunks(older_copy.chunk_refs()[len(part.chunks) :]))
    for version in (1, 2):
        with pytest.raises(ChecksumError, match=victim.path):
            fresh.snapshot(version)[0]


def test_damaged_segment_is_caught(backend: Backend) -> None:
    store, raw = _store(backend)
    seg = store.snapshot().manifest.segments[0]
    raw.write(seg.path, raw.read(seg.path).replace(b'"num_samples"', b'"num_sampleZ"'))
    with pytest.raises(ChecksumError, match=seg.path):
        list(_reopen(backend).snapshot())
