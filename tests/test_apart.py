"""Columns stored apart (docs/format.md §7.6): small columns of chunks of many blocks, and
every column of a field file, in pieces of their own; every reader gives what was written."""

from __future__ import annotations

import math
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest

import txstore
from txstore.format.builder import ChunkBuilder
from txstore.format.chunk import ChunkLayout, check_file, parse_footer
from txstore.format.codec import FrameCompressor
from txstore.torch import StreamingDataset

from . import chunkfiles

N = 9000


def _samples(n: int = N, first: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(first)
    return [
        {"id": first + i, "tokens": rng.randbytes(2048), "label": (first + i) % 7} for i in range(n)
    ]


def _layouts(store: txstore.Store, suffix: str = ".chunk") -> list[tuple[bytes, ChunkLayout]]:
    """Each file of the latest version ending in ``suffix``, read and checked whole."""
    root = Path(store.uri)
    out = []
    for ref in store.snapshot().chunk_refs():
        files = [ref] if suffix == ".chunk" else list(ref.field_files)
        for f in files:
            data = (root / f.path).read_bytes()
            layout = check_file(
                data,
                size=f.size,
                footer_offset=f.footer_offset,
                crc32_=f.crc32,
                digest=None,
                where=f.path,
            )
            out.append((data, layout))
    return out


def _apart_names(layout: ChunkLayout) -> set[str]:
    return {layout.columns[c] for c in layout.apart}


@pytest.mark.parametrize("how", ["dicts", "arrow"])
def test_small_columns_of_a_chunk_of_many_blocks_are_stored_apart(tmp_path: Path, how: str) -> None:
    store = txstore.create(str(tmp_path / "s"))
    samples = _samples()
    if how == "dicts":
        store.append(samples)
    else:
        store.append(pa.Table.from_pylist(samples))
    ((data, layout),) = _layouts(store)
    assert data[4] == 4 and layout.major == 4
    assert _apart_names(layout) == {"id", "label"}
    assert len(layout.block_starts) - 1 > 200  # 2 KiB samples in blocks of 64 KiB
    for found in layout.apart.values():  # a few pieces of at most 4096, not one per block
        assert len(found.frames) == math.ceil(N / 4096)
        assert found.copy  # the blocks hold them too: a sample is read from its block alone
    for block in layout.footer.blocks:
        assert [layout.columns[f.column] for f in block.frames] == ["id", "tokens", "label"]

    snap = store.snapshot()
    assert list(snap) == samples
    assert [list(s) for s in snap][:2] == [["id", "tokens", "label"]] * 2  # keys in place
    for i in [*random.Random(1).sample(range(N), 50), 0, 4095, 4096, N - 1]:
        assert snap[i] == samples[i]
        assert list(snap[i]) == ["id", "tokens", "label"]
    assert list(snap.select(["id"])) == [{"id": s["id"]} for s in samples]
    table = snap.to_arrow()
    assert table.column_names == ["id", "tokens", "label"]
    assert table.column("id").to_pylist() == list(range(N))
    assert snap.to_arrow(fields=["label"]).column("label").to_pylist() == [
        s["label"] for s in samples
    ]
    picks = [N - 1, 3, 4096, 4095, 17]
    got = snap.take(picks)
    got = got.to_pylist() if isinstance(got, pa.Table) else got
    assert got == [samples[i] for i in picks]
    ds = StreamingDataset(snap, fields=["id", "label"])
    assert [s["id"] for s in ds] == list(range(N))
    assert store.verify(deep=True).problems == []


def test_a_chunk_of_small_values_only_keeps_them_in_blocks(tmp_path: Path) -> None:
    """A block of small values is one fine frame a column: nothing is stored apart, and the
    file is of major 3, which readers of that major read."""
    store = txstore.create(str(tmp_path / "s"))
    samples = [{"id": i, "label": i % 3} for i in range(N)]
    store.append(samples)
    for data, layout in _layouts(store):
        assert data[4] == 3 and layout.apart == {}
    assert list(store.snapshot()) == samples


def test_a_column_stored_apart_that_some_samples_lack(tmp_path: Path) -> None:
    """ABSENT where a block's samples lack a column stored apart, and where a later block
    starts showing one: each sample keeps exactly its keys."""
    samples: list[dict[str, Any]] = []
    for i in range(N):
        s: dict[str, Any] = {"id": i, "tokens": bytes(2048)}
        if i % 1000 < 300:
            s["label"] = i
        if i > 5000:
            s["late"] = -i  # first seen once the chunk's columns were chosen: in blocks
        samples.append(s)
    store = txstore.create(str(tmp_path / "s"))
    store.append(samples)
    ((_, layout),) = _layouts(store)
    assert _apart_names(layout) == {"id", "label"}
    snap = store.snapshot()
    assert list(snap) == samples
    for i in (0, 299, 300, 999, 5000, 5001, N - 1):
        assert snap[i] == samples[i]
    assert snap.schema()["label"].count == sum("label" in s for s in samples)
    assert snap.to_arrow(fields=["label"]).column("label").to_pylist() == [
        s.get("label") for s in samples
    ]


def test_a_field_file_stores_its_columns_apart_with_no_blocks(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "s"), block_bytes=4096)
    samples = _samples(N)
    store.append(samples)
    calls = []

    def twice(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        calls.append(len(batch["id"]))
        return {"id2": [2 * i for i in batch["id"]], "name": [f"s{i}" for i in batch["id"]]}

    store.add_fields(twice, ["id2", "name"], inputs=["id"], batch_size=1000)
    ((data, layout),) = _layouts(store, ".fields")
    assert data[4] == 4 and len(layout.block_starts) == 1  # no blocks
    assert _apart_names(layout) == {"id2", "name"}
    ((_, chunk),) = _layouts(store)
    assert len(chunk.block_starts) - 1 >= N // 2  # 2 KiB samples in blocks of 4 KiB
    pieces = sum(len(a.frames) for a in layout.apart.values())
    assert pieces < 2 * math.ceil(N / 100)  # not one a block, as aligned field files had
    snap = store.snapshot()
    expected = [s | {"id2": 2 * s["id"], "name": f"s{s['id']}"} for s in samples]
    assert list(snap) == expected
    for i in (0, 1, 4095, 4096, N - 1):
        assert snap[i] == expected[i]
    assert snap.to_arrow(fields=["id2"]).column("id2").to_pylist() == [2 * i for i in range(N)]
    assert store.verify(deep=True).problems == []

    # Samples appended since, computed alone: the new field file holds values for those
    # and ABSENT for none (the old samples' values are copied), read back exactly.
    more = _samples(500, first=N)
    store.append(more)
    calls.clear()
    store.add_fields(twice, ["id2", "name"], inputs=["id"], batch_size=1000, missing_only=True)
    assert sum(calls) == 500
    snap = store.snapshot()
    assert [s["id2"] for s in snap] == [2 * i for i in range(N + 500)]
    assert snap.schema()["name"].count == N + 500


def test_a_field_some_samples_lack_in_a_field_file(tmp_path: Path) -> None:
    """A field file's piece holding ABSENT values: presence, schema and reads agree."""
    store = txstore.create(str(tmp_path / "s"))
    store.append(_samples(3000))
    store.add_fields(lambda s: {"odd": s["id"]} if s["id"] % 2 else {}, ["odd"])
    snap = store.snapshot()
    assert [s.get("odd") for s in snap] == [i if i % 2 else None for i in range(3000)]
    assert snap.schema()["odd"].count == 1500
    assert snap[2] == _samples(3000)[2]
    assert snap[3]["odd"] == 3


# -- the footer's rules (docs/format.md §7.6) ------------------------------------------------


def _chunk_with_apart(copy: bool = True) -> bytes:
    """A chunk whose `id` is stored apart (a copy), or (``copy`` false) a field file-like
    chunk whose columns are all stored apart."""
    builder = ChunkBuilder(block_bytes=65536, compressor=FrameCompressor(None, 3), apart=not copy)
    for i in range(5000):
        builder.add({"id": i, "blob": bytes(2000)}, i)
    return b"".join(builder.finish())


def _footer(data: bytes) -> tuple[bytes, Any]:
    return chunkfiles.split(data)


def _refused(data: bytes, match: str) -> None:
    start = len(data) - 16 - struct.unpack_from("<I", data, len(data) - 16)[0]
    for lazy in (False, True):
        with pytest.raises(txstore.CorruptError, match=match):
            parse_footer(data[start:], "test chunk", start, lazy=lazy).footer  # noqa: B018


def _resealed(body: bytes, footer: Any) -> bytes:
    return chunkfiles.seal(body, footer)


def test_the_rules_of_columns_stored_apart_are_checked() -> None:
    data = _chunk_with_apart()
    body, footer = _footer(data)
    assert footer[0] == 4 and len(footer[5]) == 1  # id, stored apart
    ((column, pieces, copy),) = footer[5]
    assert copy is True
    assert footer[3][column] == "id" and [n for n, _ in pieces] == [4096, 904]
    _resealed(body, footer)  # the untouched tree packs back to a valid file
    parse_footer(_resealed(body, footer)[len(body) :], "test", len(body))

    short = [*footer[:5], [[column, [[4096, pieces[0][1]]], True]]]  # samples left out
    _refused(_resealed(body, short), r"stored apart: its pieces do not hold samples 0 to 5000")
    other = [*footer[:5], [[column, [pieces[0], [904, [1 - column, *pieces[1][1][1:]]]], True]]]
    _refused(_resealed(body, other), r"stored apart: piece 1 has a frame of column")
    outside = [
        *footer[:5],
        [[column, [pieces[0], [904, [column, 10**9, *pieces[1][1][2:]]]], True]],
    ]
    _refused(_resealed(body, outside), r"piece 1: a frame at \[1000000000, .* lies outside")
    twice = [*footer[:5], [[column, pieces, True], [column, pieces, True]]]
    _refused(_resealed(body, twice), r"column 0 is stored apart twice")
    # Major 3 has no columns stored apart: its footer is eight items long.
    three = struct.pack("<4sHH", b"TXSC", 3, 0) + body[8:]
    _refused(_resealed(three, [3, *footer[1:]]), r"major 3 with columns stored apart")
    # A column stored apart alone (no copy): no block may hold a frame of it. The blocks of
    # a chunk whose columns are all apart are none; give it one, holding an id frame.
    body, alone = _footer(_chunk_with_apart(copy=False))
    assert alone[4] == [] and all(copy is False for _, _, copy in alone[5])
    ids = next(pieces for c, pieces, _ in alone[5] if alone[3][c] == "id")
    blocks = [[n, [frame]] for n, frame in ids]  # the pieces' frames, again as blocks
    _refused(
        _resealed(body, [*alone[:4], blocks, alone[5]]), r"frame of a column stored apart alone"
    )


def test_a_reader_of_major_3_refuses_a_major_4_chunk_as_newer() -> None:
    """What a reader of major 3 sees: a footer whose major is 4, refused as newer (its
    decoder ignores the ninth item), not as corrupt."""
    data = _chunk_with_apart()
    start = len(data) - 16 - struct.unpack_from("<I", data, len(data) - 16)[0]
    raw = data[start : len(data) - 16]
    assert zlib.crc32(raw) == struct.unpack_from("<I", data, len(data) - 12)[0]
    items = msgspec.msgpack.decode(raw)
    assert len(items) == 9 and items[0] == 4


def test_pieces_hold_at_most_4096_values_and_about_block_bytes() -> None:
    builder = ChunkBuilder(block_bytes=1000, compressor=FrameCompressor(None, 3), apart=True)
    sizes = np.random.default_rng(0).integers(0, 300, size=10_000)
    values = [{"b": bytes(int(k))} if k % 5 else {} for k in sizes]
    for i, v in enumerate(values):
        builder.add(v, i)
    data = b"".join(builder.finish())
    layout = parse_footer(data[builder_footer(data) :], "test", builder_footer(data))
    (found,) = layout.apart.values()
    counts = np.diff(found.starts)
    assert counts.max() <= 4096 and counts.min() >= 1
    for piece, frame in enumerate(found.frames):
        table = 4 * int(counts[piece])
        values_bytes = frame.raw_length - table
        # At most the limit plus the value that reached it (and its array header).
        assert values_bytes - 5 < 1000 + 305 or counts[piece] == 1
    from txstore.format.frames import decode_columns
    from txstore.format.values import ValueDecoder

    got = decode_columns([(layout, data, None)], ValueDecoder())["b"]
    assert got == [v.get("b") for v in values]


def builder_footer(data: bytes) -> int:
    return len(data) - 16 - struct.unpack_from("<I", data, len(data) - 16)[0]


def test_numbers_of_one_width_but_two_types_read_back_exactly(tmp_path: Path) -> None:
    """Ints of one encoded size but two MessagePack types (uint 32 and int 32: the dict path
    picks one per value), floats and uint64s past int64, read a column at a time into Arrow:
    the fast path for numbers of one width must notice the two types and leave them to the
    general one."""
    store = txstore.create(str(tmp_path / "s"))
    samples = [
        {"v": 70000 if i % 2 else -70000, "f": i / 4, "u": 2**64 - 1 - i, "b": bytes(3000)}
        for i in range(5000)
    ]
    store.append(samples)
    ((_, layout),) = _layouts(store)
    assert _apart_names(layout) == {"v", "f", "u"}
    table = store.snapshot().to_arrow(fields=["v", "f", "u"])
    assert table.column("v").to_pylist() == [s["v"] for s in samples]
    assert table.column("f").to_pylist() == [s["f"] for s in samples]
    assert table.column("u").to_pylist() == [s["u"] for s in samples]


def test_a_copy_that_differs_from_its_blocks_is_found_by_a_deep_check() -> None:
    """A footer whose copy of `a` points at the pieces of `b` (checksums all valid): readers
    of samples and of the column would read different values; the deep check says which
    column, and from which sample."""
    from txstore.format.frames import check_copies, check_offset_tables

    builder = ChunkBuilder(block_bytes=65536, compressor=FrameCompressor(None, 3))
    for i in range(5000):
        builder.add({"a": i, "b": i if i < 100 else -i, "blob": bytes(2000)}, i)
    data = b"".join(builder.finish())
    body, footer = _footer(data)
    by_name = {footer[3][c]: (c, pieces) for c, pieces, _ in footer[5]}
    check_copies(data, parse_footer(data[len(body) :], "test", len(body)))  # as written: fine
    (a, _), (_, b_pieces) = by_name["a"], by_name["b"]
    forged = [[a, [[n, [a, *frame[1:]]] for n, frame in b_pieces], True]] + [
        item for item in footer[5] if item[0] != a
    ]
    bad = _resealed(body, [*footer[:5], forged])
    layout = parse_footer(bad[len(body) :], "test", len(body))
    check_offset_tables(bad, layout)  # every frame well formed: only the copy is wrong
    with pytest.raises(txstore.CorruptError, match=r"column 'a' stored apart differs .* 100"):
        check_copies(bad, layout)
