"""Data files live only in their data folders, and staged parts are checked before use.

A chunk, field or segment path that a document names in a metadata folder is corrupt (so
vacuum can never be led to delete manifests, tags or txn markers), and a staged part handed
over by another process is read back and checked before it can be committed or deleted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txstore
from txstore.errors import CorruptError
from txstore.format import manifest as fmt
from txstore.format.codec import crc32
from txstore.format.manifest import ChunkRef, Manifest, Segment, SegmentRef
from txstore.storage import Storage, open_storage
from txstore.store import Store
from txstore.store.staging import StagedPart, StagedWriter, Transaction, TransactionHandle
from txstore.txn import manifest_key

from .conftest import Backend

REPO = Path(__file__).resolve().parents[1]
#: Far enough ahead that every file is older than vacuum's default grace period (7 days).
LATER = 30 * 86400.0
MISPLACED = ["versions/x.chunk", "refs/tags/x.chunk", "txns/x.chunk"]


def batch(v: int, n: int = 10) -> list[dict[str, Any]]:
    return [{"b": v, "i": i, "pad": os.urandom(100)} for i in range(n)]


def make(backend: Backend) -> Store:
    """Five versions with txn ids, a tag and a retention record."""
    store = txstore.create(backend.uri, chunk_bytes=4096, block_bytes=1024, **backend.kwargs())
    for v in range(4):
        store.append(batch(v), txn_id=f"batch-{v}")
    store.tag("paper", 2)
    store.expire(keep_last=4)  # version 0 (empty): refs/retention.json
    return store


def raw(backend: Backend) -> Storage:
    return open_storage(backend.uri, backend.storage_options)


def later(backend: Backend) -> Store:
    """The store seen by a process whose clock is a month ahead: vacuum acts on every file."""
    return Store(raw(backend), clock=lambda: time.time() + LATER)


def metadata(storage: Storage) -> dict[str, bytes]:
    """Every file outside the data folders (manifests, HEAD, refs, txn markers), by key."""
    return {
        f.key: storage.read(f.key)
        for f in storage.list("")
        if not f.key.startswith(("chunks/", "segments/")) and not f.key.endswith(".lock")
    }


def samples(store: Store, version: int | None = None) -> list[tuple[int, int]]:
    return [(s["b"], s["i"]) for s in store.snapshot(version)]


def refusal(attempt: Any) -> str:
    """The CorruptError ``attempt`` raised, as text ("" if none): a test goes on either way,
    so that without the check it shows what the forged document goes on to cause."""
    try:
        attempt()
    except CorruptError as e:
        return str(e)
    return ""


def copy_chunk(storage: Storage, chunk: ChunkRef, path: str) -> ChunkRef:
    """A genuine chunk file copied to ``path``, and a reference that describes it exactly."""
    storage.write(path, storage.read(chunk.path))
    return msgspec.structs.replace(chunk, path=path)


# -- item 1: a forged segment naming a data file in a metadata folder ------------------------


def forge_version(storage: Storage, chunk: ChunkRef) -> int:
    """Commit, by hand, a version whose new segment names ``chunk``."""
    v = max(int(f.key.split(".v")[1].split(".")[0]) for f in storage.list("versions/index."))
    parent = fmt.decode(storage.read(manifest_key(v)), Manifest, "test")
    data = fmt.encode(fmt.new_segment((chunk,)))
    ref = SegmentRef(
        path=f"segments/{uuid.uuid4().hex}.json",
        num_samples=chunk.num_samples,
        num_chunks=1,
        size=len(data),
        crc32=crc32(data),
    )
    storage.write(ref.path, data)
    forged = msgspec.structs.replace(
        parent,
        version=v + 1,
        parent=v,
        commit_id=uuid.uuid4().hex,
        txn_id=None,
        segments=(*parent.segments, ref),
        num_samples=parent.num_samples + chunk.num_samples,
        added_samples=chunk.num_samples,
    )
    storage.put_if_absent(manifest_key(v + 1), fmt.encode(forged))
    return v + 1


@pytest.mark.parametrize("path", MISPLACED)
def test_forged_segment_naming_a_metadata_folder_is_refused(backend: Backend, path: str) -> None:
    store = make(backend)
    storage = raw(backend)
    before = samples(store)
    forged = forge_version(storage, copy_chunk(storage, store.snapshot().chunk_refs()[0], path))
    kept = metadata(storage)

    fresh = later(backend)
    refused = refusal(fresh.vacuum)
    # Nothing outside the data folders went: the store, its tags and txn markers are whole.
    assert metadata(storage) == kept
    assert "vacuum stopped before deleting anything" in refused
    with pytest.raises(
        CorruptError, match=rf"segments/.*names a data file outside chunks/.*{path}"
    ):
        samples(fresh, forged)
    with pytest.raises(  # one sample: its chunk reference alone decoded, and checked
        CorruptError, match=rf"segments/.*names a data file outside chunks/.*{path}"
    ):
        later(backend).snapshot(forged)[-1]
    reopened = later(backend)
    assert samples(reopened, forged - 1) == before
    assert set(reopened.tags()) == {"paper"}
    assert reopened.append(batch(1), txn_id="batch-1").version == 2  # landed before: no repeat
    assert reopened.version == forged


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("chunk", "chunks/sub/x.chunk"),
        ("chunk", "chunks/.tmp.0123.x.chunk"),
        ("chunk", "segments/x.chunk"),
        ("chunk", "x.chunk"),
        ("fields", "versions/x.fields"),
        ("fields", "fields/x.fields"),
        ("segment", "chunks/x.json"),
        ("segment", "txns/x.json"),
        ("segment", "segments/a/b.json"),
    ],
)
def test_documents_naming_a_data_file_outside_its_folder_are_corrupt(kind: str, path: str) -> None:
    chunk = ChunkRef(path="chunks/a.chunk", num_samples=1, size=100, crc32=1, footer_offset=50)
    if kind == "segment":
        ref = SegmentRef(path=path, num_samples=1, num_chunks=1, size=10, crc32=1)
        doc: fmt.Segment | fmt.Manifest = Manifest(
            version=1,
            parent=0,
            commit_id="c",
            operation="append",
            timestamp=0.0,
            num_samples=1,
            added_samples=1,
            config=fmt.StoreConfig(
                chunk_bytes=1, block_bytes=1, compression=None, compression_level=0
            ),
            segments=(ref,),
        )
    elif kind == "chunk":
        doc = Segment(chunks=(msgspec.structs.replace(chunk, path=path),))
    else:
        extra = fmt.FieldFile(path=path, size=10, crc32=1, footer_offset=5, columns=("c",))
        doc = Segment(chunks=(msgspec.structs.replace(chunk, field_files=(extra,)),))
    with pytest.raises(CorruptError, match=rf"doc\.json names .*{path}"):
        fmt.decode(fmt.encode(doc), type(doc), "doc.json")


# -- items 1 and 2: staged parts ---------------------------------------------------------------


def foreign_part(txn: Transaction, n: int = 25) -> StagedPart:
    """A part written through the handle, as another process does, and handed over as JSON."""
    writer = StagedWriter(TransactionHandle.from_json(txn.handle.to_json()))
    writer.write({"b": 100, "i": i, "pad": os.urandom(100)} for i in range(n))
    return StagedPart.from_json(writer.finish().to_json())


def with_chunk(part: StagedPart, **change: Any) -> StagedPart:
    """The part with its first chunk reference changed (the part's sample count follows)."""
    first = msgspec.structs.replace(part.chunks[0], **change)
    chunks = (first, *part.chunks[1:])
    return StagedPart(
        staging_id=part.staging_id,
        chunks=chunks,
        num_samples=sum(c.num_samples for c in chunks),
    )


@pytest.mark.parametrize("path", MISPLACED)
def test_staged_part_naming_a_metadata_folder_is_refused(backend: Backend, path: str) -> None:
    store = make(backend)
    storage = raw(backend)
    before = samples(store)
    lease = store.lease(ttl="3650d")  # not lapsed: vacuum keeps it
    try:
        txn = store.transaction(message="forged")
        good = foreign_part(txn)
        bad = with_chunk(good, path=path)
        storage.write(path, storage.read(good.chunks[0].path))  # the file itself is genuine
        kept = metadata(storage)
        refused = [
            refusal(lambda: StagedPart.from_json(msgspec.json.encode(bad))),
            refusal(lambda: txn.add(bad)),
        ]
        txn.add(good)
        txn.commit()
        later(backend).vacuum()
        # Nothing outside the data folders went: manifests, tags, the lease, the retention
        # record and txn markers (a retried txn id still finds its version) are all there.
        after = metadata(storage)
        assert set(kept) <= set(after)
        unchanging = {k for k in kept if k != "HEAD" and not k.startswith("refs/leases/")}
        assert {k: after[k] for k in unchanging} == {k: kept[k] for k in unchanging}
        assert [info.version for info in store.leases()] == [4]
    finally:
        lease.release()
    assert all(f"names a data file outside chunks/: '{path}'" in m for m in refused), refused
    reopened = later(backend)
    assert set(reopened.tags()) == {"paper"}
    assert reopened.append(batch(3), txn_id="batch-3").version == 4  # landed before: no repeat
    assert samples(reopened) == before + [(100, i) for i in range(good.num_samples)]


def test_staged_part_naming_a_file_outside_the_root_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"not yours")
    backend = Backend("local", str(tmp_path / "store"))
    store = make(backend)
    before = samples(store)
    other = txstore.open(backend.uri)
    txn = store.transaction(txn_id="job-7")
    good = foreign_part(txn)
    bad = with_chunk(good, path="../victim.txt", size=victim.stat().st_size, footer_offset=0)
    with pytest.raises(CorruptError, match=r"unsafe path '\.\./victim\.txt'"):
        StagedPart.from_json(msgspec.json.encode(bad))
    with pytest.raises(CorruptError, match=r"unsafe path '\.\./victim\.txt'"):
        txn.add(bad)
    txn.add(good)
    other.append(batch(9), txn_id="job-7")  # the same txn id lands from elsewhere first
    txn.commit()  # finds it landed: aborts, leaving the handed-over part's chunks to vacuum
    assert victim.read_bytes() == b"not yours"
    txn.abort()
    assert victim.read_bytes() == b"not yours"
    later(backend).vacuum(grace="1d")
    assert not raw(backend).exists(good.chunks[0].path)
    assert victim.read_bytes() == b"not yours"
    after = txstore.open(backend.uri)
    assert samples(after) == before + [(9, i) for i in range(10)]
    assert after.append(batch(10)).version == 6
    assert len(samples(after)) == len(before) + 20


def _flip_a_byte(storage: Storage, part: StagedPart) -> StagedPart:
    """``part``, its first chunk file damaged."""
    path = part.chunks[0].path
    data = bytearray(storage.read(path))
    data[20] ^= 0xFF  # inside the first frame
    storage.write(path, bytes(data))
    return part


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda s, p: with_chunk(p, size=p.chunks[0].size + 1), "bytes, its reference says"),
        (lambda s, p: with_chunk(p, size=p.chunks[0].size - 1), "bytes, its reference says"),
        (lambda s, p: with_chunk(p, digest="0" * 16), "does not match its digest"),
        (lambda s, p: with_chunk(p, crc32=p.chunks[0].crc32 ^ 1), "does not match its checksum"),
        (lambda s, p: with_chunk(p, num_samples=p.chunks[0].num_samples - 1), "holds .* samples"),
        (lambda s, p: with_chunk(p, path=f"chunks/{uuid.uuid4().hex}.chunk"), "does not exist"),
        (lambda s, p: _flip_a_byte(s, p), "does not match its digest"),
        (
            lambda s, p: with_chunk(_flip_a_byte(s, p), digest=None),
            "checksum of its frame at",
        ),
    ],
    ids=[
        "size+1",
        "size-1",
        "digest",
        "crc32",
        "footer count",
        "missing",
        "flipped byte",
        "flipped byte, no digest",
    ],
)
def test_staged_part_not_as_it_says_is_refused(backend: Backend, damage: Any, message: str) -> None:
    store = make(backend)
    storage = raw(backend)
    before = samples(store)
    txn = store.transaction()
    bad = damage(storage, foreign_part(txn))
    bad = StagedPart.from_json(bad.to_json())  # consistent in itself: only its files tell
    with pytest.raises(CorruptError, match=message):
        txn.add(bad)
    assert txn.num_samples == 0
    txn.abort()
    assert samples(txstore.open(backend.uri, **backend.kwargs())) == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(num_samples=d["num_samples"] + 1), "says it holds"),
        (lambda d: d.update(num_samples=-1), "says it holds"),
        (lambda d: d["chunks"][0].update(num_samples=-5), ">= 0"),
        (lambda d: d["chunks"][0].update(footer_offset=d["chunks"][0]["size"]), "does not fit"),
        (lambda d: d["chunks"][0].update(footer_offset=2), "does not fit"),
        (lambda d: d["chunks"][0].update(digest="0x12"), "bad digest"),
        (
            lambda d: d.update(chunks=[d["chunks"][0]] * 2, num_samples=2 * d["num_samples"]),
            "names a chunk twice",
        ),
        (lambda d: d["chunks"][0].update(path="chunks/a/../../x.chunk"), "unsafe path"),
        (lambda d: d["chunks"][0].update(size="big"), "not a valid staged part"),
    ],
    ids=[
        "count",
        "negative",
        "chunk negative",
        "footer at end",
        "footer in header",
        "digest",
        "twice",
        "dotdot",
        "type",
    ],
)
def test_staged_part_json_is_checked(backend: Backend, change: Any, message: str) -> None:
    store = make(backend)
    txn = store.transaction()
    doc = json.loads(foreign_part(txn).to_json())
    change(doc)
    with pytest.raises(CorruptError, match=message):
        StagedPart.from_json(json.dumps(doc))


@pytest.mark.parametrize("data", [b'{"staging_id": "x", "chunks": [', b"", "\u00ff", b"[1, 2]"])
def test_staged_part_that_is_not_one_is_corrupt(data: bytes | str) -> None:
    with pytest.raises(CorruptError, match="not a valid staged part"):
        StagedPart.from_json(data)


WRITER = """
import sys
from txstore.store.staging import StagedWriter, TransactionHandle
w = StagedWriter(TransactionHandle.from_json(sys.argv[1]))
w.write({"b": 50, "i": i} for i in range(300))
sys.stdout.write(w.finish().to_json().decode())
"""


def test_good_part_from_another_process_commits_beside_a_refused_one(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = make(backend)
    before = samples(store)
    with store.transaction() as txn:
        out = subprocess.run(
            [sys.executable, "-c", WRITER, txn.handle.to_json().decode()],
            capture_output=True,
            check=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=300,
        ).stdout
        part = StagedPart.from_json(out)
        with pytest.raises(CorruptError, match="bytes, its reference says"):
            txn.add(with_chunk(part, size=part.chunks[0].size + 8))
        txn.add(part)
        with pytest.raises(CorruptError, match="another part names already"):
            txn.add(part)  # its samples would be committed twice
    assert txn.result is not None and txn.result.num_samples == 300
    assert samples(txstore.open(backend.uri)) == before + [(50, i) for i in range(300)]


def test_parts_added_together_are_checked_together_and_added_all_or_none(
    backend: Backend,
) -> None:
    """``add(*parts)`` (a driver handed many parts): one damaged part, or one named twice,
    refuses the call and adds none of them; sound ones commit in the order given."""
    store = make(backend)
    before = samples(store)
    storage = raw(backend)
    with store.transaction() as txn:
        parts = [foreign_part(txn, n) for n in (5, 7, 9)]
        damaged = _flip_a_byte(storage, foreign_part(txn, 4))
        with pytest.raises(CorruptError, match="does not match its digest"):
            txn.add(parts[0], damaged, parts[1])
        assert txn.num_samples == 0
        with pytest.raises(CorruptError, match="another part names already"):
            txn.add(parts[0], parts[1], parts[0])
        assert txn.num_samples == 0
        txn.add(parts[2], parts[0])
        with pytest.raises(CorruptError, match="another part names already"):
            txn.add(parts[1], parts[2])
        txn.add(parts[1])
    assert txn.result is not None and txn.result.num_samples == 21
    assert samples(txstore.open(backend.uri, **backend.kwargs())) == before + [
        (100, i) for n in (9, 5, 7) for i in range(n)
    ]


def test_a_part_of_another_transaction_is_corrupt(backend: Backend) -> None:
    store = make(backend)
    part = foreign_part(store.transaction())
    txn = store.transaction()
    with pytest.raises(CorruptError, match="written for another transaction"):
        txn.add(part)


def test_aborting_a_part_that_names_committed_chunks_deletes_none_of_them(
    backend: Backend,
) -> None:
    """A handed-over part may describe, truthfully, a chunk a committed version names: it
    passes every check of its bytes, and deleting it on abort would lose that version."""
    store = make(backend)
    before = samples(store)
    committed = store.snapshot().chunk_refs()[0]
    txn = store.transaction()
    stolen = StagedPart(
        staging_id=txn.handle.staging_id, chunks=(committed,), num_samples=committed.num_samples
    )
    txn.add(StagedPart.from_json(stolen.to_json()))  # sound: the file is as it says
    txn.abort()
    assert raw(backend).exists(committed.path)
    assert samples(txstore.open(backend.uri, **backend.kwargs())) == before
    assert txstore.open(backend.uri, **backend.kwargs()).verify().ok


# -- the one-pass check of a document's many paths ---------------------------------------------

GOOD = ChunkRef(path="chunks/good.chunk", num_samples=1, size=10, crc32=0, footer_offset=5)
EXTRA = fmt.FieldFile(path="chunks/good.f1", size=10, crc32=0, footer_offset=5, columns=("x",))


@pytest.mark.parametrize(
    "bad",
    [
        "chunks/a\nchunks/b",  # two names to a one-name-a-line check: a folder "a\nchunks"
        "chunks/a\n",
        "chunks/sub/a.chunk",
        "versions/x.chunk",
        "chunks/.hidden",
    ],
)
@pytest.mark.parametrize("where", ["chunk", "field file"])
def test_a_segment_among_many_good_paths_refuses_the_one_bad_one(bad: str, where: str) -> None:
    wrong = (
        msgspec.structs.replace(GOOD, path=bad)
        if where == "chunk"
        else msgspec.structs.replace(GOOD, field_files=(msgspec.structs.replace(EXTRA, path=bad),))
    )
    chunks = (GOOD,) * 40 + (wrong,) + (msgspec.structs.replace(GOOD, field_files=(EXTRA,)),) * 9
    data = fmt.encode(Segment(chunks=chunks))
    with pytest.raises(CorruptError, match=r"^seg\.json names (an unsafe path|a data file ou)"):
        fmt.decode(data, Segment, "seg.json")
    assert fmt.decode(fmt.encode(Segment(chunks=chunks[:40])), Segment, "seg.json").chunks


@pytest.mark.parametrize("bad", ["segments/a\nsegments/b", "segments/a/b.json", "chunks/a.json"])
def test_a_segment_node_among_many_good_paths_refuses_the_one_bad_one(bad: str) -> None:
    good = SegmentRef(path="segments/a.json", num_samples=1, num_chunks=1, size=9, crc32=0)
    refs = (good,) * 20 + (msgspec.structs.replace(good, path=bad),) + (good,) * 5
    data = fmt.encode(fmt.SegmentNode(segments=refs))
    with pytest.raises(CorruptError, match=r"^node\.json names (an unsafe path|a data file ou)"):
        fmt.decode(data, fmt.SegmentNode, "node.json")


_PIECES = ["chunks/", "segments/", "a", "Z9_-", ".", "/", "\n", "é", "..", "x.chunk", ""]


@given(
    st.lists(st.lists(st.sampled_from(_PIECES), max_size=5).map("".join), max_size=6),
    st.sampled_from(fmt.DATA_PREFIXES),
)
@settings(max_examples=2000, deadline=None)
def test_the_one_pass_check_agrees_with_the_check_of_each_path(
    paths: list[str], folder: str
) -> None:
    assert fmt._all_data_paths(paths, folder) == all(fmt.is_data_path(p, folder) for p in paths)


@pytest.mark.parametrize(
    "bad",
    ["chunks/", "chunks//a", "chunks/a/", "xchunks/a", "chunks/é.chunk", "chunks/a b", "/chunks/a"],
)
def test_the_one_pass_check_refuses_each_kind_of_bad_name(bad: str) -> None:
    assert fmt._all_data_paths(["chunks/good.chunk"] * 3, fmt.CHUNKS)
    assert not fmt._all_data_paths(["chunks/good.chunk", bad, "chunks/good.chunk"], fmt.CHUNKS)
