"""Hostile numbers, counts, chunk footers and values: a clear txstore error, never a raw one.

Documents and chunk footers are forged by hand with valid checksums (segment CRC, footer CRC,
frame XXH3), so that each reaches the check it is about rather than a checksum mismatch.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import xxhash

import txstore
from txstore import cli
from txstore.errors import CorruptError, EncodeError
from txstore.format.builder import ChunkBuilder
from txstore.format.chunk import MAX_BLOCK_SAMPLES, parse_footer
from txstore.format.codec import FrameCompressor
from txstore.format.frames import decode_blocks, decode_value
from txstore.format.values import (
    EXT_ABSENT,
    EXT_NDARRAY,
    EXT_NPSCALAR,
    EXT_TENSOR,
    ValueDecoder,
)
from txstore.txn import manifest_key

from . import chunkfiles

Json = dict[str, Any]


# -- forging helpers ---------------------------------------------------------------------------


def _store(tmp_path: Path, samples: list[Json] | None = None, **config: Any) -> txstore.Store:
    store = txstore.create(str(tmp_path / "s"), compression=None, **config)
    store.append(samples if samples is not None else [{"i": i} for i in range(60)])
    return store


def _root(store: txstore.Store) -> Path:
    return Path(store.uri.removeprefix("file://"))


def _read_json(root: Path, key: str) -> Json:
    doc: Json = json.loads((root / key).read_bytes())
    return doc


def _write_json(root: Path, key: str, doc: Json) -> bytes:
    data = json.dumps(doc).encode()
    (root / key).write_bytes(data)
    return data


def _forge_manifest(store: txstore.Store, change: Callable[[Json], None]) -> int:
    version = store.version
    root = _root(store)
    doc = _read_json(root, manifest_key(version))
    change(doc)
    _write_json(root, manifest_key(version), doc)
    return version


def _forge_segment(store: txstore.Store, change: Callable[[Json, Json], None]) -> int:
    """Change the latest version's first segment (``change(segment, manifest)``), then give
    the manifest the segment's new size and CRC: only the change is wrong."""
    version = store.version
    root = _root(store)
    manifest = _read_json(root, manifest_key(version))
    ref = manifest["segments"][0]
    segment = _read_json(root, ref["path"])
    change(segment, manifest)
    data = _write_json(root, ref["path"], segment)
    ref.update(size=len(data), crc32=zlib.crc32(data))
    _write_json(root, manifest_key(version), manifest)
    return version


def _footer_parts(data: bytes) -> tuple[Any, int]:
    """A chunk's footer as a tree of lists (``chunkfiles``), and where it starts."""
    body, footer = chunkfiles.split(data)
    return footer, len(body)


def _with_footer(data: bytes, start: int, footer: Any) -> bytes:
    return chunkfiles.seal(data[:start], footer)


def _replace_chunk(store: txstore.Store, data: bytes, num_samples: int | None = None) -> str:
    """Put ``data`` (a whole chunk file) in place of the latest version's first chunk, with a
    chunk reference whose size, CRC and digest match it. Returns the chunk's path."""
    root = _root(store)
    _, start = _footer_parts(data)
    path = ""

    def change(segment: Json, manifest: Json) -> None:
        nonlocal path
        chunk = segment["chunks"][0]
        path = chunk["path"]
        (root / path).write_bytes(data)
        chunk.update(
            size=len(data),
            crc32=zlib.crc32(data[start:]),
            footer_offset=start,
            digest=xxhash.xxh3_64_hexdigest(data[:start]),
        )
        if num_samples is not None:
            delta = num_samples - chunk["num_samples"]
            chunk["num_samples"] = num_samples
            segment["counts"][0] = num_samples  # the segment agrees with itself (1.4)
            manifest["segments"][0]["num_samples"] += delta
            manifest["num_samples"] += delta

    _forge_segment(store, change)
    return path


def _chunk_file(root: Path, store: txstore.Store) -> tuple[str, bytes]:
    chunk = store.snapshot().chunks()[0]
    return chunk.path, (root / chunk.path).read_bytes()


def _hand_chunk(values: list[bytes], sparse: bool = False, column: str = "x") -> bytes:
    """A chunk of one block, one column, holding these encoded values, every checksum valid."""
    n = len(values)
    head = msgspec.msgpack.encode([0] * n)[:-n]  # the array header alone
    starts, at = [], len(head)
    for value in values:
        starts.append(at)
        at += len(value)
    raw = head + b"".join(values) + struct.pack(f"<{n}I", *starts)
    frame = [0, 8, len(raw), len(raw), 0, xxhash.xxh3_64_intdigest(raw), int(sparse)]
    body = struct.pack("<4sHH", b"TXSC", 2, 0) + raw
    return _with_footer(body, len(body), [2, 0, n, [column], [[n, [frame]]]])


def _ext(code: int, payload: bytes) -> bytes:
    return msgspec.msgpack.encode(msgspec.msgpack.Ext(code, payload))


def _array_payload(header: Any, data: bytes) -> bytes:
    head = msgspec.msgpack.encode(header)
    return struct.pack("<I", len(head)) + head + data


def _decode_both_ways(data: bytes, message: str = "") -> None:
    """Read every sample of a hand-made chunk by streaming (both with views and without) and
    by random access; each must raise a CorruptError naming the chunk, then ``message``."""
    _, start = _footer_parts(data)
    layout = parse_footer(data[start:], "test chunk", footer_offset=start)
    n = layout.footer.num_samples
    pattern = f"test chunk.*{message}"
    for views in (False, True):
        with pytest.raises(CorruptError, match=pattern):
            list(decode_blocks([(layout, data, None)], 0, 1, ValueDecoder(), views))
    frame = layout.footer.blocks[0].frames[0]
    with pytest.raises(CorruptError, match=pattern):
        for i in range(n):
            decode_value(data, 0, frame, n, i, ValueDecoder(), layout, views=i % 2 == 1)


# -- item 6: counts ----------------------------------------------------------------------------


@pytest.mark.parametrize("off_by", [-1, 1])
def test_a_chunk_reference_miscounting_its_footer_is_corrupt(tmp_path: Path, off_by: int) -> None:
    """The chunk ref, its segment ref and the manifest agree with each other, not with the
    chunk's footer: a sample would be dropped (or an IndexError raised) without the check."""
    store = _store(tmp_path)

    def change(segment: Json, manifest: Json) -> None:
        segment["chunks"][0]["num_samples"] += off_by
        segment["counts"][0] += off_by
        manifest["segments"][0]["num_samples"] += off_by
        manifest["num_samples"] += off_by

    path = store.snapshot().chunks()[0].path
    version = _forge_segment(store, change)
    snap = txstore.open(store.uri).snapshot()
    pattern = rf"{path} \(version {version}\) holds 60 samples, its segment says {60 + off_by}"
    with pytest.raises(CorruptError, match=pattern):
        list(snap)
    with pytest.raises(CorruptError, match=pattern):
        snap[len(snap) - 1]
    report = txstore.open(store.uri).verify(deep=True)
    assert any(path in f"{p.key} {p.message}" for p in report.problems)


@pytest.mark.parametrize("which", ["counts", "chunk"])
def test_a_segment_whose_counts_are_not_its_chunks_is_corrupt(tmp_path: Path, which: str) -> None:
    """Counts (1.4) that say another number of samples than a chunk reference: refused by a
    reader of one sample (which decodes only that reference) and by a whole read alike."""
    store = _store(tmp_path)
    store.append([{"i": 60 + i} for i in range(5)])  # a second chunk: counts [60, 5]

    def change(segment: Json, manifest: Json) -> None:
        assert segment["counts"] == [c["num_samples"] for c in segment["chunks"]] == [60, 5]
        if which == "counts":
            segment["counts"] = [61, 4]
        else:  # the segment's totals still agree with its reference: only the counts do not
            segment["chunks"][0]["num_samples"] = 61
            segment["chunks"][1]["num_samples"] = 4

    version = _forge_segment(store, change)
    snap = txstore.open(store.uri).snapshot(version)
    with pytest.raises(CorruptError, match=r"segments/.*(counts|count says)"):
        snap[0]
    with pytest.raises(CorruptError, match=r"segments/.*counts are not its chunks"):
        list(txstore.open(store.uri).snapshot(version))


def test_a_manifest_counting_samples_its_segments_do_not_hold_is_corrupt(tmp_path: Path) -> None:
    store = _store(tmp_path)
    version = _forge_manifest(store, lambda m: m.update(segments=[], num_samples=60))
    with pytest.raises(CorruptError, match=rf"index\.v{version}\.json.*num_samples is 60"):
        txstore.open(store.uri).snapshot(version)


def test_a_segment_reference_miscounting_its_chunks_is_corrupt(tmp_path: Path) -> None:
    store = _store(tmp_path)
    version = _forge_manifest(store, lambda m: m["segments"][0].update(num_chunks=7))
    with pytest.raises(
        CorruptError,
        match=rf"\(needed by version {version}\) holds 1 chunks and 60 samples, "
        "its reference says 7",
    ):
        txstore.open(store.uri).snapshot(version).chunks()


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_samples", -1),
        ("num_samples", 2**70),
        ("version", -3),
        ("added_samples", 2**64),
        ("format_version", [1, -1]),
        ("config.chunk_bytes", 0),
        ("config.block_bytes", -4096),
        ("segment.crc32", -1),
        ("segment.crc32", 2**32),
        ("segment.size", -10),
        ("segment.num_chunks", 2**63),
    ],
)
def test_out_of_range_numbers_in_a_manifest_are_corrupt(
    tmp_path: Path, field: str, value: Any
) -> None:
    """Refused when the manifest is decoded (not as a ValueError or OverflowError from
    ``len()``, or a CRC that can never match)."""
    store = _store(tmp_path)

    def change(doc: Json) -> None:
        where, _, name = field.rpartition(".")
        target = {"": doc, "config": doc["config"], "segment": doc["segments"][0]}[where]
        target[name] = value
        if name == "num_samples":  # the segment agrees: only the range is wrong
            doc["segments"][0]["num_samples"] = value

    version = _forge_manifest(store, change)
    with pytest.raises(CorruptError, match=rf"index\.v{version}\.json is not a valid manifest"):
        txstore.open(store.uri).snapshot(version)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_samples", -1),
        ("size", -1),
        ("crc32", 2**32),
        ("footer_offset", -8),
        ("footer_offset", 10**9),  # past the file's size
    ],
)
def test_out_of_range_numbers_in_a_segment_are_corrupt(
    tmp_path: Path, field: str, value: int
) -> None:
    store = _store(tmp_path)
    _forge_segment(store, lambda segment, _: segment["chunks"][0].update({field: value}))
    with pytest.raises(CorruptError, match=r"segments/.*is not a valid segment"):
        list(txstore.open(store.uri).snapshot())


def test_the_log_reads_only_commit_fields_and_a_version_reads_its_segments(
    tmp_path: Path,
) -> None:
    """The history lists what a manifest's commit fields say; a segment reference outside the
    segments folder is the reading of that version's to refuse, naming the manifest."""
    store = _store(tmp_path)
    store.append([{"i": 60}], message="second")
    version = _forge_manifest(store, lambda m: m["segments"][0].update(path="../outside.json"))
    reopened = txstore.open(store.uri)
    log = reopened.log()
    assert [(c.version, c.message, c.total_samples) for c in log[:2]] == [
        (version, "second", 61),
        (version - 1, None, 60),
    ]
    with pytest.raises(CorruptError, match=rf"index\.v{version}\.json"):
        reopened.snapshot(version)
    assert len(reopened.snapshot(version - 1)) == 60


def test_a_retried_transaction_is_found_from_its_commit_fields(tmp_path: Path) -> None:
    """An append retried under a committed txn_id reports that commit from its manifest's
    commit fields, as the log does: it writes nothing, and a damaged segment reference of
    that version is the reading of the version's to refuse."""
    store = _store(tmp_path)
    first = store.append([{"i": 60}], txn_id="batch-7")
    store.append([{"i": 61}])  # its commit writes the marker of batch-7's version
    root = _root(store)
    doc = _read_json(root, manifest_key(first.version))
    doc["segments"][0]["path"] = "../outside.json"
    _write_json(root, manifest_key(first.version), doc)

    reopened = txstore.open(store.uri)
    again = reopened.append([{"i": 99}], txn_id="batch-7")
    assert (again.version, again.commit_id, again.attempts) == (first.version, first.commit_id, 0)
    assert reopened.version == first.version + 1
    with pytest.raises(CorruptError, match=rf"index\.v{first.version}\.json"):
        reopened.snapshot(first.version)


# -- item 9: timestamps ------------------------------------------------------------------------


@pytest.mark.parametrize("timestamp", [1e20, -1.0])
def test_a_manifest_timestamp_out_of_range_is_corrupt_for_log_and_verify(
    tmp_path: Path, timestamp: float, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store(tmp_path)
    version = _forge_manifest(store, lambda m: m.update(timestamp=timestamp))
    reopened = txstore.open(store.uri)
    with pytest.raises(CorruptError, match=rf"index\.v{version}\.json"):
        reopened.log()
    assert not reopened.verify().ok
    for command in (["log"], ["show", str(version)], ["verify"]):
        code = cli.main([command[0], store.uri, *command[1:]])  # no OverflowError traceback
        assert code not in (0, cli.EXIT_USAGE)
    assert f"index.v{version}.json" in capsys.readouterr().err


def test_tag_and_lease_timestamps_out_of_range_are_corrupt(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.tag("good")
    lease = store.lease(ttl="1h")
    lease.__enter__()
    try:
        root = _root(store)
        (tag_key,) = [p for p in root.glob("refs/tags/*.json")]
        (lease_key,) = [p for p in root.glob("refs/leases/*.json")]
        tag = json.loads(tag_key.read_bytes())
        tag_key.write_text(json.dumps({**tag, "timestamp": 1e20}))
        with pytest.raises(CorruptError, match=r"refs/tags/good\.json"):
            txstore.open(store.uri).tags()
        assert cli.main(["tags", store.uri]) not in (0, cli.EXIT_USAGE)
        tag_key.write_text(json.dumps(tag))
        record = json.loads(lease_key.read_bytes())
        for field in ("created", "expires_at"):
            lease_key.write_text(json.dumps({**record, field: 1e20}))
            with pytest.raises(CorruptError, match=r"refs/leases/"):
                txstore.open(store.uri).leases()
            assert cli.main(["leases", store.uri]) not in (0, cli.EXIT_USAGE)
    finally:
        lease.__exit__(None, None, None)


# -- item 7: hostile chunk footers -------------------------------------------------------------


def _set_frame(index: int, value: int, block: int = 0, frame: int = 0) -> Callable[[Any], None]:
    def change(footer: Any) -> None:
        footer[4][block][1][frame][index] = value

    return change


def _dup_frame(footer: Any) -> None:
    frames = footer[4][0][1]
    frames.append(frames[0])


def _dup_column(footer: Any) -> None:
    footer[3][1] = footer[3][0]


def _set_block(value: int) -> Callable[[Any], None]:
    def change(footer: Any) -> None:
        footer[4][0][0] = value

    return change


def _footer_num_samples(footer: Any) -> None:
    footer[2] += 1


def _frames_apart(footer: Any) -> None:
    footer[4][0][1][1][1] -= 1  # the second frame starts a byte inside the first


def _raw_length_short(footer: Any) -> None:
    frame = footer[4][0][1][0]
    frame[2] = frame[3] = 2  # fewer bytes than the offset table of the block's values


HOSTILE_FOOTERS: list[tuple[str, Callable[[Any], None], str]] = [
    ("column past the end", _set_frame(0, 2), "names column 2 of 2"),
    ("negative column", _set_frame(0, -1), "bad chunk footer"),
    ("two frames of a column", _dup_frame, "two frames of one column"),
    ("duplicate column names", _dup_column, "a column name appears twice"),
    ("block of no samples", _set_block(0), "bad chunk footer"),
    ("block of negative samples", _set_block(-3), "bad chunk footer"),
    ("block too large", _set_block(MAX_BLOCK_SAMPLES + 1), "bad chunk footer"),
    ("footer count", _footer_num_samples, "blocks hold 60 samples, the footer says 61"),
    ("frame past the footer", _set_frame(1, 10**6), "outside the frames"),
    ("frame in the header", _set_frame(1, 0), "outside the frames"),
    ("negative offset", _set_frame(1, -5), "bad chunk footer"),
    ("frame too short for its block", _raw_length_short, "for values needing 241"),
    ("frames of a block apart", _frames_apart, "does not follow the one ending at"),
]


@pytest.mark.parametrize(
    "change, message", [h[1:] for h in HOSTILE_FOOTERS], ids=[h[0] for h in HOSTILE_FOOTERS]
)
def test_hostile_footers_with_valid_checksums_are_corrupt(
    tmp_path: Path, change: Callable[[Any], None], message: str
) -> None:
    """A footer that checksums but describes frames or samples no reader can decode is refused
    where it is parsed: by ``snap[i]``, iteration and a deep verify alike, naming the chunk."""
    store = _store(tmp_path, [{"i": i, "s": str(i)} for i in range(60)])
    root = _root(store)
    _, data = _chunk_file(root, store)
    footer, start = _footer_parts(data)
    assert len(footer[4]) == 1 and footer[3] == ["i", "s"]
    change(footer)
    path = _replace_chunk(store, _with_footer(data, start, footer), footer[2])
    snap = txstore.open(store.uri).snapshot()
    pattern = f"{path}.*{message}"
    with pytest.raises(CorruptError, match=pattern):
        snap[0]
    with pytest.raises(CorruptError, match=pattern):
        list(snap)
    report = txstore.open(store.uri).verify(deep=True)
    assert not report.ok
    assert any(message in p.message for p in report.problems)


def _frames_not_a_list(block: int) -> Callable[[Any], None]:
    def change(footer: Any) -> None:
        footer[4][block][1] = "not frames"

    return change


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda block: _set_frame(1, 10**6, block=block), r"block {bad}: .*outside the frames"),
        (_frames_not_a_list, "bad chunk footer: .*Expected `array`"),
    ],
    ids=["frame outside the file", "frames not an array"],
)
def test_a_hostile_block_is_refused_when_it_is_read_and_by_every_whole_chunk_read(
    tmp_path: Path, damage: Callable[[int], Callable[[Any], None]], message: str
) -> None:
    """``snap[i]`` decodes and checks only the frames of the block it reads (a first read of
    a large chunk does not pay for all of them): a sample of a sound block still reads, the
    damaged block is refused, and every path that reads the chunk whole or by field refuses
    it too, also after the partly decoded footer was cached by a single-sample read."""
    samples = [{"i": i, "s": "x" * 200} for i in range(60)]
    store = _store(tmp_path, samples, block_bytes=1024)
    root = _root(store)
    _, data = _chunk_file(root, store)
    footer, start = _footer_parts(data)
    blocks = footer[4]
    assert len(blocks) >= 4  # several blocks, so that one can be damaged alone
    bad = len(blocks) - 1
    first_bad = sum(b[0] for b in blocks[:bad])
    damage(bad)(footer)
    path = _replace_chunk(store, _with_footer(data, start, footer), footer[2])
    pattern = f"{path}.*" + message.format(bad=bad)

    snap = txstore.open(store.uri).snapshot()
    assert snap[0] == samples[0]
    assert snap[first_bad - 1] == samples[first_bad - 1]
    with pytest.raises(CorruptError, match=pattern):
        snap[first_bad]
    with pytest.raises(CorruptError, match=pattern):
        list(snap)  # the footer cached above, frames partly checked
    with pytest.raises(CorruptError, match=pattern):
        list(snap.select(["s"]))  # the frames of one field, through the same cache
    with pytest.raises(CorruptError, match=pattern):
        list(txstore.open(store.uri).snapshot().select(["i"]))


# -- item 7: hostile values --------------------------------------------------------------------

F8 = np.arange(2, dtype="<f8").tobytes()

HOSTILE_VALUES: list[tuple[str, bytes, str]] = [
    ("datetime64", _ext(EXT_NDARRAY, _array_payload(["<M8[ns]", [2]], F8)), "dtype '<M8"),
    ("object dtype", _ext(EXT_NDARRAY, _array_payload(["|O", [2]], F8)), "dtype '|O'"),
    ("no such dtype", _ext(EXT_NDARRAY, _array_payload(["float99", [2]], F8)), "float99"),
    ("structured dtype", _ext(EXT_NDARRAY, _array_payload(["<f8,<f8", [1]], F8)), "dtype"),
    ("negative shape", _ext(EXT_NDARRAY, _array_payload(["<f8", [-1]], F8)), r"shape \[-1\]"),
    ("short data", _ext(EXT_NDARRAY, _array_payload(["<f8", [3]], F8)), "16 bytes of data"),
    ("header not a list", _ext(EXT_NDARRAY, _array_payload(7, F8)), "bad header"),
    ("dtype not a str", _ext(EXT_NDARRAY, _array_payload([4, [2]], F8)), "bad header"),
    ("truncated header", _ext(EXT_NDARRAY, b"\x01\x00"), "truncated"),
    ("header past the end", _ext(EXT_NDARRAY, struct.pack("<I", 99) + b"\x92"), "truncated"),
    ("bad header bytes", _ext(EXT_NDARRAY, struct.pack("<I", 2) + b"\xc1\xc1"), "bad header"),
    ("scalar of no data", _ext(EXT_NPSCALAR, _array_payload(["<f8"], b"")), "0 bytes of data"),
    ("scalar datetime", _ext(EXT_NPSCALAR, _array_payload(["<m8[s]"], F8[:8])), "dtype"),
    ("tensor float99", _ext(EXT_TENSOR, _array_payload(["float99", [2]], F8)), "float99"),
    ("tensor not a dtype", _ext(EXT_TENSOR, _array_payload(["Tensor", [2]], F8)), "Tensor"),
    ("tensor quantized", _ext(EXT_TENSOR, _array_payload(["qint8", [2]], F8[:2])), "qint8"),
    ("tensor negative shape", _ext(EXT_TENSOR, _array_payload(["float64", [-2]], F8)), "shape"),
    ("tensor short data", _ext(EXT_TENSOR, _array_payload(["float64", [5]], F8)), "bytes of"),
    ("absent, not sparse", _ext(EXT_ABSENT, b""), "absent marker"),
    (
        "absent in a list",
        msgspec.msgpack.encode([1, msgspec.msgpack.Ext(EXT_ABSENT, b"")]),
        "absent marker",
    ),
    (
        "absent in a dict",
        msgspec.msgpack.encode({"k": msgspec.msgpack.Ext(EXT_ABSENT, b"")}),
        "absent marker",
    ),
]


@pytest.mark.parametrize(
    "value, message", [h[1:] for h in HOSTILE_VALUES], ids=[h[0] for h in HOSTILE_VALUES]
)
@pytest.mark.parametrize("one_per_block", [True, False])
def test_hostile_values_are_corrupt(value: bytes, message: str, one_per_block: bool) -> None:
    """A value no writer writes is a CorruptError naming the chunk, however it is read:
    alone in its block (large samples) or beside others; streamed, with views, or by index."""
    if one_per_block:
        _decode_both_ways(_hand_chunk([value]), message)
    else:
        good = msgspec.msgpack.encode(b"ok")  # a bytes column: views are tried first
        _decode_both_ways(_hand_chunk([good, value, good]), message)


def test_an_absent_marker_inside_a_value_of_a_sparse_frame_is_corrupt() -> None:
    """A sparse frame may hold ABSENT for a sample without the key, never inside a value."""
    absent = _ext(EXT_ABSENT, b"")
    nested = msgspec.msgpack.encode([msgspec.msgpack.Ext(EXT_ABSENT, b"")])
    good = msgspec.msgpack.encode([1])
    fine = _hand_chunk([good, absent, good], sparse=True)
    _, start = _footer_parts(fine)
    layout = parse_footer(fine[start:], "test chunk", footer_offset=start)
    rows = list(decode_blocks([(layout, fine, None)], 0, 1, ValueDecoder(), False))
    assert rows == [[{"x": [1]}, {}, {"x": [1]}]]
    _decode_both_ways(_hand_chunk([good, absent, nested], sparse=True), "absent marker")


def test_a_deep_verify_reports_a_chunk_with_a_hostile_value(tmp_path: Path) -> None:
    store = _store(tmp_path, [{"x": 1.5}])
    bad = _ext(EXT_TENSOR, _array_payload(["float99", [2]], F8))
    path = _replace_chunk(store, _hand_chunk([bad]), 1)
    reopened = txstore.open(store.uri)
    with pytest.raises(CorruptError, match=path):
        list(reopened.snapshot())
    with pytest.raises(CorruptError, match=path):
        reopened.snapshot()[0]
    report = reopened.verify(deep=True)
    assert not report.ok
    assert any("float99" in p.message for p in report.problems)


# -- item 8: values the format cannot hold -----------------------------------------------------


def _files(store: txstore.Store) -> list[str]:
    return sorted(f.key for f in store.storage.list("") if ".lock" not in f.key)


def _refused(store: txstore.Store, sample: Json, pattern: str) -> None:
    """Appending ``sample`` after one good one is an EncodeError matching ``pattern``, and
    the store is as it was."""
    version, files = store.version, _files(store)
    with pytest.raises(EncodeError, match=pattern):
        store.append([{"x": 0}, sample])
    with pytest.raises(EncodeError, match=pattern):
        store.append(iter([{"x": 0}, sample]))
    assert store.version == version
    assert _files(store) == files


def test_conjugate_and_negative_views_are_stored_as_their_values(tmp_path: Path) -> None:
    """Chosen: resolve the view (its values, exactly), rather than refuse it."""
    torch = pytest.importorskip("torch")
    base = torch.tensor([1 + 2j, -3.5 - 0.25j], dtype=torch.complex64)
    real = torch.tensor([1.5, -2.0, 0.0])
    values = {
        "conj": base.conj(),
        "neg": torch._neg_view(real),
        "both": torch._neg_view(base.conj()[1:]),
    }
    assert values["conj"].is_conj() and values["neg"].is_neg()
    store = _store(tmp_path, [values])
    (back,) = list(txstore.open(store.uri).snapshot())
    for key, value in values.items():
        assert not back[key].is_conj() and not back[key].is_neg()
        assert back[key].dtype == value.dtype
        assert torch.equal(back[key], value.resolve_conj().resolve_neg())
    assert torch.equal(back["conj"], torch.tensor([1 - 2j, -3.5 + 0.25j]))
    assert torch.equal(back["neg"], torch.tensor([-1.5, 2.0, -0.0]))


def test_a_negative_view_in_a_batch_travels_from_workers_as_its_values() -> None:
    torch = pytest.importorskip("torch")
    from txstore.torch.transport import BytesPool, Receiver, pack, unpack

    batch = {"neg": torch._neg_view(torch.tensor([1.5, -2.0])), "id": torch.arange(3)}
    back = unpack(pack(batch, BytesPool()), False, Receiver())
    assert torch.equal(back["neg"], torch.tensor([-1.5, 2.0]))
    assert torch.equal(back["id"], torch.arange(3))


def test_a_meta_tensor_is_refused_naming_sample_and_key(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    store = _store(tmp_path, [{"x": 0}])
    _refused(store, {"x": 1, "t": torch.empty(3, device="meta")}, r"sample 1, key 't'.*meta")
    _refused(store, {"x": 1, "t": [torch.empty(3, device="meta")]}, r"sample 1, key 't'.*meta")


def test_an_unsupported_tensor_dtype_is_refused_as_it_would_not_read_back(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    store = _store(tmp_path, [{"x": 0}])
    bits = torch.zeros(4, dtype=torch.uint8).view(torch.bits8)
    _refused(store, {"x": 1, "t": bits}, r"sample 1, key 't'.*dtype bits8")


def _large_values() -> list[tuple[str, Any]]:
    """Values over 4 GiB that take no memory: zero pages never touched, or a broadcast view."""
    out: list[tuple[str, Any]] = [
        ("bytes", bytes(2**32)),  # calloc'ed: untouched pages cost nothing
        ("array", np.broadcast_to(np.zeros(1, np.uint8), (2**32 + 1,))),
        ("nested array", [np.broadcast_to(np.zeros(1, np.float64), (2**29 + 1,))]),
    ]
    try:
        import torch
    except ImportError:
        return out
    return [*out, ("tensor", torch.zeros(1, dtype=torch.uint8).expand(2**32 + 1))]


@pytest.mark.parametrize("kind", ["bytes", "array", "nested array", "tensor"])
def test_a_value_over_4_gib_is_refused_naming_sample_and_key(tmp_path: Path, kind: str) -> None:
    values = dict(_large_values())
    if kind not in values:
        pytest.skip("torch is not installed")
    store = _store(tmp_path, [{"x": 0}])
    _refused(store, {"x": 1, "big": values[kind]}, r"sample 1, key 'big'.*4294967295 bytes")
    assert list(store.snapshot()) == [{"x": 0}]
    store.append([{"x": 2}])  # the store takes appends as before
    assert len(store.snapshot()) == 2


def test_values_of_one_key_passing_4_gib_in_one_block_are_refused(tmp_path: Path) -> None:
    """With blocks larger than 4 GiB, the value that would start past a frame's 32-bit
    offsets is refused; those before it are kept."""
    store = _store(tmp_path, [{"x": 0}], block_bytes="8GiB", chunk_bytes="16GiB")
    version, files = store.version, _files(store)
    half = [{"b": bytes(2**31)} for _ in range(3)]  # untouched zero pages again
    with pytest.raises(EncodeError, match=r"sample 2, key 'b'.*pass 4 GiB"):
        store.append(half)
    assert store.version == version and _files(store) == files


@pytest.mark.parametrize("way", ["add", "add_many", "add_from"])
def test_a_builder_refusing_a_value_over_4_gib_keeps_what_it_took(way: str) -> None:
    """On each of the builder's paths (the fast ones too: same shape as the sample before),
    the large value is refused at its position and the samples before it are kept."""
    builder = ChunkBuilder(block_bytes=65536, compressor=FrameCompressor(None, 0))
    builder.add({"b": b"first"}, 0)
    builder.add({"b": b"second"}, 1)  # the fast path has this shape now
    big = bytes(2**32)
    pattern = r"sample 3, key 'b'.*4294967295 bytes"
    with pytest.raises(EncodeError, match=pattern):
        if way == "add":
            builder.add({"b": b"third"}, 2)
            builder.add({"b": big}, 3)
        elif way == "add_many":
            builder.add_many([{"b": b"third"}, {"b": big}, {"b": b"never"}], 2, 2**40)
        else:
            builder.add_from(iter([{"b": b"third"}, {"b": big}, {"b": b"never"}]), 2, 2**40)
    assert builder.num_samples == 3
    builder.add({"b": b"fourth", "n": 4}, 3)
    data = b"".join(builder.finish())
    _, start = _footer_parts(data)
    layout = parse_footer(data[start:], "test chunk", footer_offset=start)
    blocks = list(
        decode_blocks([(layout, data, None)], 0, len(layout.footer.blocks), ValueDecoder(), False)
    )
    assert [row for rows in blocks for row in rows] == [
        {"b": b"first"},
        {"b": b"second"},
        {"b": b"third"},
        {"b": b"fourth", "n": 4},
    ]
