"""docs/format.md's examples, decoded by txstore's own decoders, so the document cannot drift.

Every example in format.md is marked with ``<!-- example: NAME -->`` on the line before its
fenced block. Each is decoded as the document it claims to be, and the facts the text around
it states (the format version in the title, the version a tag names, the sample a chunk file
holds, the key of a transaction marker, the fields a table lists) are checked against what the
decoders make of it. A JSON block without a marker, a marker without a check here, or a check
without its example fails too: a new example must come with its check.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
import xxhash

import txstore
from txstore.format import chunk as chunkfmt
from txstore.format import frames as framefmt
from txstore.format import manifest as fmt
from txstore.format.manifest import (
    ChunkRef,
    FieldFile,
    Head,
    LeaseRecord,
    Manifest,
    Retention,
    Segment,
    Tag,
    TxnMarker,
)
from txstore.storage.memory import MemoryStorage
from txstore.txn import safety, txn_marker_key

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "format.md"
DOC = DOC_PATH.read_text(encoding="utf-8")

_MARKED = re.compile(r"<!-- example: ([a-z0-9-]+) -->\n```([a-z]*)\n(.*?)\n```", re.S)
_FENCE_OPEN = re.compile(r"^```([a-z]*)$")
_HEX_LINE = re.compile(r"([0-9a-f]{8})  ((?:[0-9a-f]{2} ?)+)")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")


def _examples() -> dict[str, tuple[str, str, int]]:
    """Each marked example: (fence language, body, where it ends in the document)."""
    found: dict[str, tuple[str, str, int]] = {}
    for m in _MARKED.finditer(DOC):
        name = m.group(1)
        assert name not in found, f"two examples named {name!r} in {DOC_PATH}"
        found[name] = (m.group(2), m.group(3), m.end())
    return found


EXAMPLES = _examples()


def _json(name: str) -> bytes:
    lang, body, _ = EXAMPLES[name]
    assert lang == "json", f"example {name!r} is fenced as {lang!r}, not json"
    return body.encode()


def _after(name: str, chars: int = 600) -> str:
    """The text right after an example (what it says about it)."""
    return DOC[EXAMPLES[name][2] : EXAMPLES[name][2] + chars]


def _section(heading: str) -> str:
    """A section's text, from its heading to the next heading of any level."""
    start = DOC.index(heading)
    end = DOC.find("\n#", start + len(heading))
    return DOC[start : end if end != -1 else len(DOC)]


def _table_fields(section: str) -> set[str]:
    """The names in the first column of a section's field table (``| `name` | ... |``)."""
    return set(re.findall(r"^\| `([a-z_0-9]+)` \|", section, re.M))


def _struct_fields(kind: type[msgspec.Struct]) -> set[str]:
    return {f.name for f in msgspec.structs.fields(kind)}


def _document(kind: type[msgspec.Struct]) -> set[str]:
    """The members a writer writes for a document struct: its fields and its ``type`` tag."""
    return _struct_fields(kind) | {"type"}


def _current_version(doc: Any) -> None:
    assert tuple(doc.format_version) == (fmt.FORMAT_MAJOR, fmt.FORMAT_MINOR), (
        f"an example shows format_version {list(doc.format_version)}; txstore writes "
        f"[{fmt.FORMAT_MAJOR}, {fmt.FORMAT_MINOR}]"
    )


# -- the document as a whole ---------------------------------------------------------------


def test_every_example_is_marked_and_checked() -> None:
    unmarked = []
    lines = DOC.splitlines()
    inside = False
    for number, line in enumerate(lines):
        opened = _FENCE_OPEN.fullmatch(line)
        if line == "```" and inside:
            inside = False
            continue
        if opened is None or inside:
            continue
        inside = True
        body = lines[number + 1] if number + 1 < len(lines) else ""
        is_example = opened.group(1) == "json" or _HEX_LINE.fullmatch(body) is not None
        if is_example and not lines[number - 1].startswith("<!-- example: "):
            unmarked.append(number + 1)
    assert not unmarked, f"{DOC_PATH}: examples without a marker at lines {unmarked}"
    assert set(EXAMPLES) == set(CHECKS), (
        f"marked examples {sorted(EXAMPLES)} and checked ones {sorted(CHECKS)} differ"
    )


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example(name: str) -> None:
    CHECKS[name]()


def test_title_names_the_versions_written() -> None:
    title = DOC.splitlines()[0]
    m = re.fullmatch(r"# .*, version (\d+)\.(\d+) \(chunk files: version (\d+)\.(\d+)\)", title)
    assert m, f"unexpected title {title!r}"
    assert tuple(map(int, m.groups())) == (
        fmt.FORMAT_MAJOR,
        fmt.FORMAT_MINOR,
        chunkfmt.CHUNK_MAJOR,
        chunkfmt.CHUNK_MINOR,
    )


def test_manifest_table_lists_every_field() -> None:
    # format and format_version are described once for all documents (section 1).
    listed = _table_fields(_section("## 4. Manifest")) | {"format", "format_version"}
    assert listed == _document(Manifest)


def _footer_schema() -> None:
    _lang, body, _ = EXAMPLES["footer-schema"]
    schema = dict(re.findall(r"^(\w+)\s*= \[([^\]]*)\]", body, re.M))
    kinds = (
        chunkfmt.PackedFooter,
        chunkfmt.ApartColumn,
        chunkfmt.ChunkFooter,
        chunkfmt.BlockIndex,
        chunkfmt.FrameIndex,
    )
    assert set(schema) == {kind.__name__ for kind in kinds}
    for kind in kinds:
        written = [n.strip() for n in schema[kind.__name__].split(",")]
        assert written == [f.name for f in msgspec.structs.fields(kind)], kind.__name__
        assert kind.__struct_config__.array_like  # "Structs encoded as arrays"
    # The first five items of both footers are alike (a reader of major 2 decodes a packed
    # footer far enough to see its major).
    packed = [f.name for f in msgspec.structs.fields(chunkfmt.PackedFooter)]
    assert packed[:5] == [f.name for f in msgspec.structs.fields(chunkfmt.ChunkFooter)]


def _chunk_layout() -> None:
    _lang, body, _ = EXAMPLES["chunk-layout"]
    header = re.search(
        r'header\s+(\d+) bytes: "(\w+)", u16 major \((\d+); (\d+) with columns stored '
        r"apart\), u16 minor \((\d+)\)",
        body,
    )
    assert header, body
    size, magic, rows, apart, minor = header.groups()
    assert int(size) == chunkfmt.HEADER.size
    assert magic.encode() == chunkfmt.CHUNK_MAGIC
    assert (int(rows), int(apart), int(minor)) == (
        chunkfmt.major_of(apart=False),
        chunkfmt.major_of(apart=True),
        chunkfmt.CHUNK_MINOR,
    )
    assert chunkfmt.major_of(apart=True) == chunkfmt.CHUNK_MAJOR  # the newest is written
    trailer = re.search(r'offset size-(\d+)\s+trailer .*"(\w+)\\0"', body)
    assert trailer, body
    assert int(trailer.group(1)) == chunkfmt.TRAILER.size
    assert trailer.group(2).encode() + b"\0" == chunkfmt.TRAILER_MAGIC


# -- each example ----------------------------------------------------------------------------


def _manifest() -> None:
    m = fmt.decode(_json("manifest"), Manifest, "format.md manifest")
    _current_version(m)
    assert set(json.loads(_json("manifest"))) == _document(Manifest)
    assert m.parent == m.version - 1  # "version - 1, or null for version 0"
    assert _HEX32.fullmatch(m.commit_id)
    # The defaults section 7.1 states: 64 MiB chunks, 64 KiB blocks.
    assert (m.config.chunk_bytes, m.config.block_bytes) == (64 << 20, 64 << 10)
    # Changing a segment's count breaks the sum the decoder checks (section 3).
    broken = json.loads(_json("manifest"))
    broken["segments"][0]["num_samples"] += 1
    with pytest.raises(txstore.CorruptError):
        fmt.decode(json.dumps(broken).encode(), Manifest, "format.md manifest")


def _segment() -> None:
    seg = fmt.decode(_json("segment"), Segment, "format.md segment")
    _current_version(seg)
    (ref,) = seg.chunks
    assert set(json.loads(_json("segment"))["chunks"][0]) == _struct_fields(ChunkRef)
    assert ref.digest is not None and _HEX16.fullmatch(ref.digest)  # "16 lowercase hex digits"
    assert ref.footer_offset <= ref.size
    assert seg.counts == (ref.num_samples,)  # "each chunk's num_samples"


def _segment_node() -> None:
    node = fmt.decode(_json("segment-node"), fmt.SegmentNode, "format.md segment node")
    _current_version(node)
    for child in json.loads(_json("segment-node"))["segments"]:
        assert set(child) <= _struct_fields(fmt.SegmentRef)
    # "each reference's num_samples, in the order of segments" (1.5)
    assert node.counts == tuple(c.num_samples for c in node.segments)
    samples = sum(c.num_samples for c in node.segments)
    chunks = sum(c.num_chunks for c in node.segments)
    ref = fmt.SegmentRef(
        path="segments/n.json", num_samples=samples, num_chunks=chunks, size=1, crc32=0, level=1
    )
    fmt.check_segment(ref, node, "format.md segment node")
    # A reader of one sample decodes the counts and the one reference it descends into.
    index = fmt.decode(_json("segment-node"), fmt.SegmentNodeIndex, "format.md segment node")
    assert fmt.check_segment(ref, index, "format.md segment node")[-1] == samples
    assert fmt.node_child(index.segments[1], node.counts[1], 1, "node") == node.segments[1]
    # "every one at level k - 1" and "the sums ... equal those of the reference"
    for wrong in (
        msgspec.structs.replace(ref, level=2),
        msgspec.structs.replace(ref, num_samples=samples + 1),
        msgspec.structs.replace(ref, num_chunks=chunks - 1),
    ):
        with pytest.raises(txstore.CorruptError):
            fmt.check_segment(wrong, node, "format.md segment node")
    # A reader that predates nodes decodes one as a segment and refuses it (section 11.9).
    with pytest.raises(txstore.CorruptError):
        fmt.decode(_json("segment-node"), Segment, "format.md segment node")
    # The writer's limits the text states are the ones txstore uses.
    from txstore.store import segments

    why = _section("**Why segments.**")
    assert f"at most {segments.MAX_SEGMENT_CHUNKS}" in why
    assert (
        f"holds {segments.NODE_FANOUT} (at level 0: {segments.NODE_FANOUT} beyond the "
        f"counter's newest {segments._COUNTER_TAIL})" in why.replace("\n", " ")
    )


def _head() -> None:
    head = fmt.decode(_json("head"), Head, "format.md HEAD")
    _current_version(head)
    # A reader probes forward from a stale HEAD (section 6, step 2).
    store = _store_with_versions(head.version + 2)
    store.storage.write("HEAD", _json("head"))
    assert txstore.open(store.storage).version == head.version + 2


def _txn() -> None:
    marker = fmt.decode(_json("txn"), TxnMarker, "format.md txn marker")
    _current_version(marker)
    stated = re.search(r"`(txns/[0-9a-f]{64}\.json)`", _after("txn"))
    assert stated, "the text after the txn example states its key"
    assert stated.group(1) == txn_marker_key(marker.txn_id)
    digest = hashlib.sha256(marker.txn_id.encode("utf-8")).hexdigest()
    assert stated.group(1) == f"txns/{digest}.json"


def _chunk_ref_fields() -> None:
    ref_json = json.loads(_json("chunk-ref-fields"))
    # The reference lives in a segment: decoded as one, with its path checks.
    wrapped = {"type": "segment", "format": "txstore", "format_version": [1, 3]}
    wrapped["chunks"] = [ref_json]
    (ref,) = fmt.decode(json.dumps(wrapped).encode(), Segment, "format.md field files").chunks
    assert set(ref_json) == _struct_fields(ChunkRef)
    (extra,) = ref.field_files
    assert set(ref_json["field_files"][0]) == _struct_fields(FieldFile)
    assert extra.path.endswith(".fields") and ref.path.endswith(".chunk")
    # "the chunk file's own latent_256 column is hidden and replaced by the field file's"
    assert "latent_256" in ref.hidden
    assert "latent_256" in set(extra.columns) - set(extra.hidden)


def _store_with_versions(n: int) -> txstore.Store:
    store = txstore.create(MemoryStorage())
    for _ in range(n):
        store.append([{"x": 1}])
    return store


def _tag() -> None:
    tag = fmt.decode(_json("tag"), Tag, "format.md tag")
    _current_version(tag)
    store = _store_with_versions(tag.version)
    stated = re.search(r"`(refs/tags/[^`]+)`", _after("tag"))
    assert stated, "the text after the tag example states its key"
    store.storage.write(stated.group(1), _json("tag"))  # "name ... equals the file name"
    info = store.tags()[tag.name]
    assert (info.version, info.commit_id, info.message) == (tag.version, tag.commit_id, tag.message)


def _lease() -> None:
    lease = fmt.decode(_json("lease"), LeaseRecord, "format.md lease")
    _current_version(lease)
    stated = re.search(r"the default ttl, (\d+) hours", _after("lease"))
    assert stated, "the text after the lease example states its ttl"
    ttl = int(stated.group(1)) * 3600
    assert lease.expires_at - lease.created == ttl
    assert inspect.signature(txstore.Store.lease).parameters["ttl"].default == ttl
    store = _store_with_versions(lease.version)
    lease_id = "35e2f132e8c943c6a6b7530aecb5e550"  # "a random id, 32 lowercase hex digits"
    store.storage.write(f"refs/leases/{lease_id}.json", _json("lease"))
    (info,) = store.leases()
    assert (info.id, info.version, info.owner) == (lease_id, lease.version, lease.owner)
    assert info.expires_at.timestamp() == lease.expires_at


def _retention() -> None:
    record = fmt.decode(_json("retention"), Retention, "format.md retention")
    _current_version(record)
    ranges = [(r.first, r.last) for r in record.expired]
    assert ranges == sorted(ranges)  # "disjoint ranges of versions (inclusive), sorted"
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))  # disjoint
    latest = record.expired[-1].last + 1  # "expire never lists the latest version"
    store = _store_with_versions(latest)
    store.storage.write("refs/retention.json", _json("retention"))
    listed = {v for first, last in ranges for v in range(first, last + 1)}
    assert store.expired_versions() == listed
    with pytest.raises(txstore.VersionExpiredError):
        store.snapshot(max(listed))
    assert store.snapshot(latest).version == latest


def _storage_check() -> None:
    record = fmt.decode(_json("storage-check"), fmt.StorageCheck, "format.md storage check")
    _current_version(record)
    (entry,) = record.endpoints
    assert set(json.loads(_json("storage-check"))["endpoints"][0]) == _struct_fields(
        fmt.CheckedEndpoint
    )
    assert entry.checks == safety.CHECKS  # the checks, named as a writer records them
    storage = MemoryStorage()
    storage.write(fmt.STORAGE_CHECK_KEY, _json("storage-check"))
    assert not safety.is_checked(storage)  # another endpoint's pass does not cover this one
    ours = fmt.replace(record, endpoints=(fmt.replace(entry, endpoint=storage.endpoint),))
    storage.write(fmt.STORAGE_CHECK_KEY, fmt.encode(ours))
    assert safety.is_checked(storage)


def _chunk_file_ref() -> None:
    # Its bytes are checked against the chunk file in _chunk_file.
    seg = fmt.decode(_json("chunk-file-ref"), Segment, "format.md chunk file reference")
    _current_version(seg)
    assert set(json.loads(_json("chunk-file-ref"))["chunks"][0]) == _struct_fields(ChunkRef)


def _hex_bytes(body: str) -> bytes:
    data = bytearray()
    for line in body.splitlines():
        m = _HEX_LINE.fullmatch(line)
        assert m, f"not a hex dump line: {line!r}"
        assert int(m.group(1), 16) == len(data), f"offset {m.group(1)} after {len(data)} bytes"
        data += bytes.fromhex(m.group(2))
    return bytes(data)


def _chunk_file() -> None:
    _lang, body, _ = EXAMPLES["chunk-file"]
    data = _hex_bytes(body)
    section = _section("### 7.5")
    size = re.search(r"The chunk file, (\d+) bytes", section)
    assert size and int(size.group(1)) == len(data)
    seg_json = _json("chunk-file-ref")
    seg = fmt.decode(seg_json, Segment, "format.md chunk file reference")
    _current_version(seg)
    (ref,) = seg.chunks
    assert ref.size == len(data)

    # The layout of section 7, checked without txstore: header, trailer, checksums.
    magic, major, minor = struct.unpack_from("<4sHH", data)
    assert (magic, major, minor) == (b"TXSC", 3, 0)
    length, footer_crc, end = struct.unpack_from("<II8s", data, len(data) - 16)
    assert end == b"TXSCEND\0"
    assert ref.footer_offset == len(data) - 16 - length
    footer_bytes = data[ref.footer_offset : len(data) - 16]
    assert zlib.crc32(footer_bytes) == footer_crc
    assert zlib.crc32(data[ref.footer_offset :]) == ref.crc32
    assert xxhash.xxh3_64(data[: ref.footer_offset]).hexdigest() == ref.digest
    footer = msgspec.msgpack.decode(footer_bytes)
    assert footer[:5] == [3, 0, 2, ["id", "text"], []]
    assert struct.unpack("<2Q", footer[5]) == (0, 2)  # one block of samples [0, 2)
    (end,) = struct.unpack("<I", footer[6])
    assert end == len(footer[7])
    frames = msgspec.msgpack.decode(footer[7])
    assert len(frames) == 2
    for _col, offset, stored, _raw, codec, checksum, _flags in frames:
        assert codec == 0  # compression=None
        assert xxhash.xxh3_64_intdigest(data[offset : offset + stored]) == checksum

    # txstore's reader: the checks of a whole-file read, then the samples the text names.
    layout = chunkfmt.check_file(
        data,
        size=ref.size,
        footer_offset=ref.footer_offset,
        crc32_=ref.crc32,
        digest=ref.digest,
        where="format.md chunk file",
    )
    framefmt.check_offset_tables(data, layout)
    stated = re.search(r"`append\((\[.*?\])\)`", section)
    assert stated, "section 7.5 states the samples appended"
    samples = json.loads(stated.group(1))
    columns = re.search(r"with columns `(\w+)` and `(\w+)`", section)
    assert columns and layout.columns == list(columns.groups())
    assert layout.footer.num_samples == ref.num_samples == len(samples)

    # And through a store: a version naming this segment reads the samples back, whole and
    # one at a time.
    storage = MemoryStorage()
    txstore.create(storage, compression=None)
    base = fmt.decode(storage.read("versions/index.v0.json"), Manifest, "version 0")
    seg_path = "segments/04672244ac874e419657b6adca62b955.json"
    storage.write(ref.path, data)
    storage.write(seg_path, seg_json)
    storage.write(
        "versions/index.v1.json",
        fmt.encode(
            Manifest(
                version=1,
                parent=0,
                commit_id="5f0c2b9e8d1a4c7f9e3b6a2d4c8f1e07",
                operation="append",
                timestamp=1796000000.0,
                num_samples=len(samples),
                added_samples=len(samples),
                config=base.config,
                segments=(
                    fmt.SegmentRef(
                        path=seg_path,
                        num_samples=ref.num_samples,
                        num_chunks=1,
                        size=len(seg_json),
                        crc32=zlib.crc32(seg_json),
                    ),
                ),
            )
        ),
    )
    snap = txstore.open(storage).snapshot(1)
    assert list(snap) == samples
    assert [snap[i] for i in range(len(samples))] == samples


CHECKS = {
    "manifest": _manifest,
    "segment": _segment,
    "segment-node": _segment_node,
    "head": _head,
    "txn": _txn,
    "chunk-ref-fields": _chunk_ref_fields,
    "tag": _tag,
    "lease": _lease,
    "retention": _retention,
    "storage-check": _storage_check,
    "chunk-file": _chunk_file,
    "chunk-file-ref": _chunk_file_ref,
    "footer-schema": _footer_schema,
    "chunk-layout": _chunk_layout,
}
