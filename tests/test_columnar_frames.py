"""Columns into frames: ``ChunkBuilder.add_columns`` cuts a batch of columns into blocks by the
rule the format describes, whatever its frames compress to, and writes each frame as the format
lays it out, for columns made whole (``Encoded``) and those kept as headers and payloads
(``Prefixed``: strs, bytes and arrays of one size are copied straight into their frames)."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import hypothesis.strategies as st
import msgspec
import numpy as np
from hypothesis import given, settings

from txstore.format import columnar as col
from txstore.format.builder import ChunkBuilder
from txstore.format.chunk import MAX_BLOCK_SAMPLES, parse_footer
from txstore.format.codec import CODEC_RAW, FrameCompressor, decompress_frame
from txstore.format.frames import decode_blocks
from txstore.format.values import ValueDecoder, ValueEncoder

HEADER_BYTES = 8


def _layout(data: bytes) -> Any:
    length = struct.unpack_from("<I", data, len(data) - 16)[0]
    return parse_footer(data[len(data) - 16 - length :], "test chunk")


def _raw(data: bytes, frame: Any) -> bytes:
    stored = data[frame.offset : frame.offset + frame.length]
    if frame.codec == CODEC_RAW:
        return stored
    return decompress_frame(stored, frame.codec, frame.raw_length, "test chunk")


def _value_sizes(raw: bytes, n: int) -> list[int]:
    """Each value's size in a raw frame, from its offset table (docs/format.md §7.2)."""
    table = len(raw) - 4 * n
    starts = [*struct.unpack_from(f"<{n}I", raw, table), table]
    return [b - a for a, b in itertools.pairwise(starts)]


def _build(
    batch: col.ColumnBatch, block_bytes: int, steps: list[int], compression: str | None
) -> tuple[bytes, list[tuple[int, int, int]]]:
    """The batch added as a writer adds it, ``limit`` a step past the size each time: the
    chunk, and per call its limit and the frames it sealed (from, to)."""
    # Every column in blocks: the block rule is what this checks (columns stored apart: in
    # test_chunk_format.py).
    builder = ChunkBuilder(
        block_bytes=block_bytes, compressor=FrameCompressor(compression, 3), apart_small=False
    )
    calls = []
    start, k = 0, 0
    while start < batch.num_rows:
        limit = builder.size + steps[k % len(steps)]
        k += 1
        before = builder.sealed_frames
        start += builder.add_columns(batch, start, 0, limit)
        calls.append((limit, before, builder.sealed_frames))
    return b"".join(builder.finish()), calls


def _check_blocks(data: bytes, batch: col.ColumnBatch, block_bytes: int, calls: Any) -> None:
    """Each block ends at the first row that brings its values to ``block_bytes``, or to the
    call's limit counting the chunk before it, at most 4096 rows; a call stops after the block
    that brings the chunk to its limit, or at the batch's end."""
    layout = _layout(data)
    blocks = layout.footer.blocks
    width = len(batch.names)
    # Every row's encoded size, summed over its columns, from the frames' offset tables.
    sizes: list[int] = []
    for block in blocks:
        assert len(block.frames) == width
        per_column = [_value_sizes(_raw(data, f), block.num_samples) for f in block.frames]
        sizes += [sum(row) for row in zip(*per_column, strict=True)]
    ends = np.concatenate([[0], np.cumsum(sizes)])
    assert len(sizes) == batch.num_rows
    row = 0
    for limit, first_frame, last_frame in calls:
        numbers = range(first_frame // width, last_frame // width)
        for number in numbers:
            block = blocks[number]
            before = block.frames[0].offset  # the chunk's size when the block began
            assert before == HEADER_BYTES + sum(f.length for b in blocks[:number] for f in b.frames)
            room = min(block_bytes, max(1, limit - before))
            want = int(np.searchsorted(ends, ends[row] + room, side="left"))
            want = max(row + 1, min(want, batch.num_rows, row + MAX_BLOCK_SAMPLES))
            assert row + block.num_samples == want, (number, row, before, limit)
            row = want
            after = block.frames[-1].offset + block.frames[-1].length
            if number != numbers[-1]:
                assert after < limit
            else:
                assert after >= limit or row == batch.num_rows


def _samples(data: bytes) -> list[dict[str, Any]]:
    layout = _layout(data)
    decoded = decode_blocks(
        [(layout, data, None)], 0, len(layout.footer.blocks), ValueDecoder(), False
    )
    return [row for block in decoded for row in block]


@st.composite
def _columns(draw: Any) -> tuple[dict[str, col.Encoded], list[dict[str, Any]]]:
    """Columns of one length (sometimes repeating, so that zstd shrinks some frames) and the
    samples they hold."""
    n = draw(st.integers(1, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = st.sampled_from(["tokens", "blobs", "ints", "text", "arrays", "scattered"])
    kinds = draw(st.lists(kind, min_size=1, max_size=3))
    columns: dict[str, col.Encoded] = {}
    values: dict[str, list[Any]] = {}
    for number, kind in enumerate(kinds):
        name = f"{kind}{number}"
        repeat = draw(st.booleans())  # compressible frames
        if kind in ("tokens", "blobs"):
            size = draw(st.sampled_from([0, 1, 31, 300, 2048]))
            lengths = [size] * n if kind == "tokens" else list(rng.integers(0, 700, n))
            blobs = [
                bytes([i % 3]) * int(k) if repeat else rng.bytes(int(k))
                for i, k in enumerate(lengths)
            ]
            offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
            data = np.frombuffer(b"".join(blobs) or b"", dtype=np.uint8)
            columns[name] = col.encode_binary(data, offsets)
            values[name] = blobs
        elif kind == "scattered":
            # Values anywhere in a buffer, between bytes of other things (a peer's file).
            big = draw(st.booleans())  # 16 KiB or more on average: frames may refer to them
            lengths = rng.integers(16_384 if big else 0, 40_000 if big else 600, n)
            gaps = rng.integers(0, 50, n)
            if draw(st.booleans()):  # one length, evenly apart (an MDS shard's bytes)
                lengths, gaps = np.full(n, lengths[0]), np.full(n, gaps[0])
            starts = np.cumsum(gaps) + np.concatenate([[0], np.cumsum(lengths)[:-1]])
            buffer = rng.integers(0, 256, int(starts[-1] + lengths[-1]) + 7, dtype=np.uint8)
            blobs = [buffer[a : a + k].tobytes() for a, k in zip(starts, lengths, strict=True)]
            columns[name] = col.encode_scattered(buffer, starts, lengths, text=False)
            values[name] = blobs
        elif kind == "text":
            texts = [("é" if repeat else chr(97 + i % 26)) * 20 for i in range(n)]
            encoded = [t.encode() for t in texts]
            offsets = np.concatenate([[0], np.cumsum([len(b) for b in encoded])]).astype(np.int64)
            data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
            columns[name] = col.encode_strings(data, offsets)
            values[name] = texts
        elif kind == "ints":
            ints = np.arange(n, dtype=np.int64) * draw(st.sampled_from([1, 1000, 2**40]))
            columns[name] = col.encode_ints(ints)
            values[name] = ints.tolist()
        else:
            arrays = np.zeros((n, 3, 5), np.float32) if repeat else rng.random((n, 3, 5))
            columns[name] = col.encode_arrays(arrays, name, 0)
            values[name] = list(arrays)
    samples = [{name: values[name][i] for name in columns} for i in range(n)]
    return columns, samples


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == want.dtype and (got == want).all()
    return type(got) is type(want) and got == want


@settings(max_examples=80, deadline=None)
@given(
    columns=_columns(),
    block_bytes=st.sampled_from([1, 200, 4096, 65536]),
    steps=st.lists(st.integers(1, 40_000), min_size=1, max_size=4),
    compression=st.sampled_from([None, "zstd"]),
    stable=st.booleans(),
)
def test_blocks_follow_the_rule_and_hold_the_values(
    columns: Any, block_bytes: int, steps: list[int], compression: str | None, stable: bool
) -> None:
    encoded, samples = columns
    batch = col.ColumnBatch(tuple(encoded), tuple(encoded.values()), len(samples), stable)
    data, calls = _build(batch, block_bytes, steps, compression)
    _check_blocks(data, batch, block_bytes, calls)
    got = _samples(data)
    assert len(got) == len(samples)
    for i, (row, want) in enumerate(zip(got, samples, strict=True)):
        assert list(row) == list(want), i
        assert all(_same(row[k], want[k]) for k in want), i


def test_frames_of_uniform_columns_are_laid_out_as_the_format_says() -> None:
    # Values of one header and length are copied straight into their frames: each frame is
    # the array header, the values as the value encoder writes them, and the offset table.
    n = 100
    rng = np.random.default_rng(5)
    blobs = [rng.bytes(2048) for _ in range(n)]
    texts = ["é✓" * 7 for _ in range(n)]
    arrays = rng.random((n, 4, 2)).astype(">f8")
    encoded_texts = [t.encode() for t in texts]
    columns = {
        "b": col.encode_binary(
            np.frombuffer(b"".join(blobs), np.uint8), np.arange(n + 1, dtype=np.int64) * 2048
        ),
        "t": col.encode_strings(
            np.frombuffer(b"".join(encoded_texts), np.uint8),
            np.arange(n + 1, dtype=np.int64) * len(encoded_texts[0]),
        ),
        "a": col.encode_arrays(arrays, "a", 0),
    }
    assert all(isinstance(c, col.Prefixed) and c.uniform is not None for c in columns.values())
    batch = col.ColumnBatch(tuple(columns), tuple(columns.values()), n)
    data, calls = _build(batch, 10_000, [70_000, 3_000, 250_000], None)
    _check_blocks(data, batch, 10_000, calls)
    encoder = ValueEncoder()
    by_name = {"b": blobs, "t": texts, "a": list(arrays)}
    layout = _layout(data)
    row = 0
    for block in layout.footer.blocks:
        m = block.num_samples
        for frame in block.frames:
            name = layout.columns[frame.column]
            values = [encoder.encode(v, position=0, key=name) for v in by_name[name][row : row + m]]
            head = msgspec.msgpack.encode([None] * m)[:-m]  # the array header alone
            starts = np.cumsum([len(head)] + [len(v) for v in values[:-1]])
            want = head + b"".join(values) + starts.astype("<u4").tobytes()
            assert data[frame.offset : frame.offset + frame.length] == want
        row += m
    assert row == n


def test_prefixed_values_joined_are_header_then_payload() -> None:
    # ``data`` of a Prefixed column (what lists, structs, nulls and field files read) is each
    # value's header followed by its payload, for values of one length or many.
    for blobs in ([b"ab", b"cd", b"ef"], [b"", b"x" * 300, b"yz", b"w" * 70_000]):
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
        column = col.encode_binary(np.frombuffer(b"".join(blobs), np.uint8), offsets)
        want = [msgspec.msgpack.encode(b) for b in blobs]
        assert column.data.tobytes() == b"".join(want)
        assert column.sizes.tolist() == [len(w) for w in want]
        assert col.decoded(column) == blobs


def test_blocks_after_compressed_frames_are_cut_by_the_size_stored() -> None:
    # Frames that zstd shrinks leave the chunk smaller than their raw sizes say: a block near
    # the limit is cut by the size stored, not the raw one (nor left uncut).
    n = 2000
    blobs = [bytes([i % 5]) * 300 for i in range(n)]
    offsets = np.arange(n + 1, dtype=np.int64) * 300
    column = col.encode_binary(np.frombuffer(b"".join(blobs), np.uint8), offsets)
    batch = col.ColumnBatch(("b",), (column,), n)
    for step in (10_000, 14_000, 30_000, 50_000):
        data, calls = _build(batch, 4096, [step], "zstd")
        assert any(f.codec != CODEC_RAW for b in _layout(data).footer.blocks for f in b.frames)
        _check_blocks(data, batch, 4096, calls)
        assert [row["b"] for row in _samples(data)] == blobs


def _large_batch(stable: bool) -> tuple[col.ColumnBatch, np.ndarray[Any, Any], list[bytes]]:
    """Large values of several lengths anywhere in a buffer, and ints beside them."""
    rng = np.random.default_rng(9)
    lengths = np.array([20_000, 70_000, 16_384, 33_000, 1, 50_000], dtype=np.int64)
    starts = np.concatenate([[3], 3 + np.cumsum(lengths + 5)[:-1]])
    buffer = rng.integers(0, 256, int(starts[-1] + lengths[-1]) + 9, dtype=np.uint8)
    blobs = [buffer[a : a + k].tobytes() for a, k in zip(starts, lengths, strict=True)]
    columns = (
        col.encode_ints(np.arange(len(lengths), dtype=np.int64)),
        col.encode_scattered(buffer, starts, lengths, text=False),
    )
    return col.ColumnBatch(("id", "blob"), columns, len(lengths), stable), buffer, blobs


def test_stable_large_values_are_referred_to_and_others_copied() -> None:
    # A stable batch's large values go into the chunk from their own memory, copied only as
    # the chunk is written (the buffer changed before that shows in the chunk); any other
    # batch's are copied when added: a caller may reuse its memory as soon as the call returns.
    for stable in (True, False):
        batch, buffer, blobs = _large_batch(stable)
        builder = ChunkBuilder(
            block_bytes=65_536, compressor=FrameCompressor(None, 3), apart_small=False
        )
        assert builder.add_columns(batch, 0, 0, 2**40) == len(blobs)
        buffer[:] = 0  # the caller's memory, reused before the chunk is written
        data = b"".join(builder.finish())
        got = [row["blob"] for row in _samples(data)]
        if stable:
            assert got == [bytes(len(b)) for b in blobs]
        else:
            assert got == blobs


def test_frames_of_referred_values_are_laid_out_as_the_format_says() -> None:
    batch, _buffer, blobs = _large_batch(True)
    data, calls = _build(batch, 65_536, [40_000, 300_000], None)
    _check_blocks(data, batch, 65_536, calls)
    encoder = ValueEncoder()
    layout = _layout(data)
    row = 0
    for block in layout.footer.blocks:
        m = block.num_samples
        frame = block.frames[layout.columns.index("blob")]
        values = [encoder.encode(v, position=0, key="blob") for v in blobs[row : row + m]]
        head = msgspec.msgpack.encode([None] * m)[:-m]
        starts = np.cumsum([len(head)] + [len(v) for v in values[:-1]])
        want = head + b"".join(values) + starts.astype("<u4").tobytes()
        assert data[frame.offset : frame.offset + frame.length] == want
        row += m
    assert row == len(blobs)


def test_values_of_one_length_evenly_apart_are_copied_from_where_they_lie() -> None:
    # An MDS shard's bytes column: each value between the sample's other bytes, a fixed step
    # apart. Such values are copied straight from the shard into frames, with no join first.
    rng = np.random.default_rng(3)
    n, length, step = 300, 2048, 2048 + 13
    buffer = rng.integers(0, 256, n * step + 5, dtype=np.uint8)
    starts = 5 + np.arange(n, dtype=np.int64) * step
    column = col.encode_scattered(buffer, starts, np.full(n, length), text=False)
    assert isinstance(column, col.Prefixed) and column.uniform is not None
    want = [buffer[a : a + length].tobytes() for a in starts]
    batch = col.ColumnBatch(("b",), (column,), n)
    data, calls = _build(batch, 65_536, [100_000, 7_000], None)
    _check_blocks(data, batch, 65_536, calls)
    assert [row["b"] for row in _samples(data)] == want
