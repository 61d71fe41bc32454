"""Chunk files byte for byte: the packed footer of format 3, the list footer of formats 1 and
2, frame checksums XXH3-64 (formats 2 and 3) and CRC-32 (format 1)."""

from __future__ import annotations

import itertools
import struct
import sys
import threading
import time
import zlib
from typing import Any

import hypothesis.strategies as st
import msgspec
import pytest
import xxhash
from hypothesis import given, settings

from txstore.errors import ChecksumError, CorruptError, EncodeError, UnsupportedFormatError
from txstore.format.builder import ChunkBuilder
from txstore.format.chunk import (
    MAX_BLOCK_SAMPLES,
    BlockIndex,
    ChunkFooter,
    ChunkLayout,
    FrameIndex,
    check_header,
    parse_footer,
)
from txstore.format.codec import FrameCompressor, chunk_digest, crc32
from txstore.format.frames import decode_blocks, decode_value
from txstore.format.values import ABSENT, ValueDecoder

from . import chunkfiles

SAMPLES = [
    {"id": i, "text": f"sample {i} " * (i % 7), "blob": bytes([i % 256]) * (i * 37 % 900)}
    for i in range(300)
]
# Frames above 64 KiB are hashed in pieces by the writer: the digest must not change.
SAMPLES[5]["blob"] = bytes(range(256)) * 1000


def _chunk() -> bytes:
    builder = ChunkBuilder(
        block_bytes=4096, compressor=FrameCompressor("zstd", 3), apart_small=False
    )
    for position, sample in enumerate(SAMPLES):
        builder.add(sample, position)
    return b"".join(builder.finish())


def _footer(data: bytes) -> tuple[ChunkFooter, int]:
    """The footer and its offset, read per docs/format.md §7 (not through parse_footer)."""
    body, tree = chunkfiles.split(data)
    return msgspec.convert(tree, ChunkFooter), len(body)


def _with_footer(data: bytes, footer: ChunkFooter) -> bytes:
    """``data`` with ``footer``, laid out as its major lays it (header and trailer to match)."""
    _, start = _footer(data)
    header = struct.pack("<4sHH", b"TXSC", footer.major, footer.minor)
    return chunkfiles.seal(header + data[8:start], msgspec.to_builtins(footer))


def _rewrite(data: bytes, major: int, checksum: Any) -> bytes:
    """The same chunk with another major version and frame checksums by ``checksum``."""
    footer, _ = _footer(data)
    blocks = [
        BlockIndex(
            block.num_samples,
            tuple(
                msgspec.structs.replace(f, checksum=checksum(data[f.offset : f.offset + f.length]))
                for f in block.frames
            ),
        )
        for block in footer.blocks
    ]
    return _with_footer(data, ChunkFooter(major, 0, footer.num_samples, footer.columns, blocks))


def _read_all(data: bytes) -> list[dict[str, Any]]:
    check_header(data, "test chunk")
    layout = parse_footer(data[layout_start(data) :], "test chunk")
    decoder = ValueDecoder()
    rows: list[dict[str, Any]] = []
    blocks = decode_blocks([(layout, data, None)], 0, len(layout.footer.blocks), decoder, False)
    for number, (block, block_rows) in enumerate(zip(layout.footer.blocks, blocks, strict=True)):
        rows += block_rows
        if not block.frames:  # samples with no keys
            continue
        # One value alone, as snap[i] reads it.
        last = block.frames[-1]
        one = decode_value(data, 0, last, block.num_samples, block.num_samples - 1, decoder, layout)
        assert one == rows[-1].get(layout.columns[last.column], ABSENT), number
    return rows


def layout_start(data: bytes) -> int:
    length, _crc, _magic = struct.unpack_from("<II8s", data, len(data) - 16)
    return len(data) - 16 - length


def _flip_in_first_frame(data: bytes) -> bytes:
    footer, _ = _footer(data)
    frame: FrameIndex = footer.blocks[0].frames[0]
    at = frame.offset + frame.length // 2
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]


@pytest.mark.parametrize("major", [2, 3])
def test_frames_carry_xxh3_of_their_stored_bytes(major: int) -> None:
    data = _chunk() if major == 3 else _rewrite(_chunk(), 2, xxhash.xxh3_64_intdigest)
    assert struct.unpack_from("<4sHH", data) == (b"TXSC", major, 0)
    footer, _ = _footer(data)
    assert footer.major == major
    frames = [f for block in footer.blocks for f in block.frames]
    assert len(frames) > 30
    for f in frames:
        assert f.checksum == xxhash.xxh3_64_intdigest(data[f.offset : f.offset + f.length])
    assert _read_all(data) == SAMPLES


def test_a_chunk_is_written_in_format_3_with_a_packed_footer() -> None:
    data = _chunk()
    assert struct.unpack_from("<4sHH", data) == (b"TXSC", 3, 0)
    start = layout_start(data)
    stored = data[start : len(data) - 16]
    packed = msgspec.msgpack.decode(stored)
    assert len(packed) == 8 and packed[:2] == [3, 0] and packed[4] == []
    footer, _ = _footer(data)
    assert sum(b.num_samples for b in footer.blocks) == footer.num_samples == len(SAMPLES)
    assert len(footer.blocks) > 10
    # The same bytes as the rules of §7.3 give for these blocks.
    assert msgspec.msgpack.encode(chunkfiles.pack(msgspec.to_builtins(footer))) == stored
    # The packed footer is read the same lazily (one block at a time) and whole.
    tail = data[start:]
    lazy = parse_footer(tail, "test chunk", lazy=True)
    assert [tuple(lazy.block_frames(k)) for k in range(len(footer.blocks))] == [
        b.frames for b in footer.blocks
    ]
    assert lazy.footer == parse_footer(tail, "test chunk").footer == footer


@pytest.mark.parametrize("major", [1, 2, 3])
def test_a_flipped_byte_in_a_frame_is_caught(major: int) -> None:
    checksum = zlib.crc32 if major == 1 else xxhash.xxh3_64_intdigest
    data = _flip_in_first_frame(_rewrite(_chunk(), major, checksum))
    with pytest.raises(ChecksumError, match="test chunk"):
        _read_all(data)


def _with_block_sizes(data: bytes, sizes: list[int]) -> bytes:
    """The same chunk whose footer gives its blocks these sample counts (checksums valid)."""
    footer, _ = _footer(data)
    blocks = [BlockIndex(n, block.frames) for n, block in zip(sizes, footer.blocks, strict=True)]
    return _with_footer(
        data, ChunkFooter(footer.major, footer.minor, sum(sizes), footer.columns, blocks)
    )


@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("sample_bytes", [100, 8192])  # many samples a block, one a block
def test_a_frame_holding_another_count_than_its_block_is_corrupt(
    sample_bytes: int, views: bool
) -> None:
    """A footer that miscounts a block's samples (a writer's bug, a crafted file) is refused
    with the chunk named, whether the frames then fail to parse or parse to another count."""
    builder = ChunkBuilder(block_bytes=4096, compressor=FrameCompressor(None, 0))
    for position in range(120):
        builder.add({"id": position, "blob": bytes([position]) * sample_bytes}, position)
    data = b"".join(builder.finish())
    footer, _ = _footer(data)
    sizes = [block.num_samples for block in footer.blocks]
    assert len(sizes) >= 3 and (sample_bytes < 4096) == (sizes[0] > 1)
    for moved in (
        [sizes[0] + 1, sizes[1] - 1, *sizes[2:]],
        [sizes[0] - 1, sizes[1] + 1, *sizes[2:]],
    ):
        bad = _with_block_sizes(data, moved)
        with pytest.raises(CorruptError, match="test chunk"):  # a block of 0: at its footer
            layout = parse_footer(bad[layout_start(bad) :], "test chunk")
            list(decode_blocks([(layout, bad, None)], 0, 2, ValueDecoder(), views))


@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("values", [[7, 8], [b"ab", b"cd"]])
def test_a_frame_that_parses_to_another_count_than_its_block_is_corrupt(
    values: list[Any], views: bool
) -> None:
    """A well-formed frame of two values in a block of three (docs/format.md §4: an array,
    then one offset per sample) is refused, not read as a short block."""
    array = msgspec.msgpack.encode(values)
    raw = array + struct.pack("<3I", 0, 1, 2)
    data = struct.pack("<4sHH", b"TXSC", 2, 0) + raw
    frame = FrameIndex(0, 8, len(raw), len(raw), 0, xxhash.xxh3_64_intdigest(raw), 0)
    footer = ChunkFooter(2, 2, 3, ["x"], [BlockIndex(3, (frame,))])
    layout = ChunkLayout(footer, "test chunk")
    for checked in [(True,), (False,)]:
        blocks = decode_blocks([(layout, data, None)], 0, 1, ValueDecoder(), views, checked)
        with pytest.raises(CorruptError, match="test chunk: the frame at offset 8 holds 2"):
            list(blocks)


@pytest.mark.parametrize("layout", ["packed", "list"])
def test_a_newer_chunk_major_is_refused(layout: str) -> None:
    data = _rewrite(_chunk(), 5, xxhash.xxh3_64_intdigest)
    if layout == "list":  # a major 5 that laid its footer out as majors 1 and 2 did
        body, tree = chunkfiles.split(data)
        raw = msgspec.msgpack.encode(tree)
        data = body + raw + struct.pack("<II8s", len(raw), zlib.crc32(raw), b"TXSCEND\0")
    for lazy in (False, True):
        with pytest.raises(UnsupportedFormatError, match=r"5\.0 is newer .* upgrade txstore"):
            parse_footer(data[layout_start(data) :], "test chunk", lazy=lazy)
    with pytest.raises(UnsupportedFormatError):
        check_header(data, "test chunk")


def test_a_reader_of_major_2_refuses_a_format_3_chunk_as_newer() -> None:
    """Majors 1 and 2 decoded their footer as [major, minor, num_samples, columns, blocks]
    and checked the major next: format 3 keeps those five, with no blocks, so such a reader
    refuses it as newer, not as corrupt (the extra items MessagePack arrays of Structs
    ignore)."""
    data = _chunk()
    raw = data[layout_start(data) : len(data) - 16]
    old = msgspec.msgpack.decode(raw, type=ChunkFooter)
    assert (old.major, old.num_samples, old.blocks) == (3, len(SAMPLES), [])


def _packed_with(data: bytes, items: dict[int, Any]) -> bytes:
    """``data`` with these items of its packed footer replaced (trailer resealed)."""
    start = layout_start(data)
    packed = msgspec.msgpack.decode(data[start : len(data) - 16])
    for item, value in items.items():
        packed[item] = value
    encoded = msgspec.msgpack.encode(packed)
    trailer = struct.pack("<II8s", len(encoded), zlib.crc32(encoded), b"TXSCEND\0")
    return data[:start] + encoded + trailer


def _packed_parts(data: bytes) -> tuple[list[int], list[int], bytes]:
    raw = data[layout_start(data) : len(data) - 16]
    packed = msgspec.msgpack.decode(raw)
    count = len(packed[6]) // 4
    return (
        list(struct.unpack(f"<{count + 1}Q", packed[5])),
        list(struct.unpack(f"<{count}I", packed[6])),
        packed[7],
    )


def _broken_packings(data: bytes) -> list[tuple[dict[int, Any], str]]:
    starts, ends, frames = _packed_parts(data)
    q = lambda v: struct.pack(f"<{len(v)}Q", *v)  # noqa: E731
    i = lambda v: struct.pack(f"<{len(v)}I", *v)  # noqa: E731
    big = [0, 5000, *[5000 - starts[1] + s for s in starts[2:]]]
    return [
        ({5: q(starts[:-1])}, "do not describe the same blocks"),  # a start too few
        ({6: i([*ends, ends[-1]])}, "do not describe the same blocks"),  # a frame end too many
        ({6: i(ends)[:-1]}, "do not describe the same blocks"),  # a ragged array
        ({5: q([1, *starts[1:]])}, "does not start at sample 0"),
        ({5: q([*starts[:-2], 2**64 - 1, starts[-1]])}, "1 to 4096 samples"),
        ({5: q([0, 2**63, *starts[2:]])}, "1 to 4096 samples"),
        ({5: q([0, 0])}, "describe the same blocks"),
        ({5: q([0, 0, *starts[2:]])}, "1 to 4096 samples"),  # a block of none
        ({5: q([0, starts[2], starts[1], *starts[3:]])}, "1 to 4096 samples"),  # backwards
        ({5: q(big), 2: big[-1]}, "1 to 4096 samples"),  # a block of 5000
        ({6: i([ends[1], ends[0], *ends[2:]])}, "do not follow"),
        ({7: frames[:-1]}, "end at"),
        ({7: frames + b"\x90"}, "end at"),
        ({4: [[1, []]]}, "length <= 0"),  # blocks listed as in majors 1 and 2
    ]


@pytest.mark.parametrize("case", range(14))
@pytest.mark.parametrize("lazy", [False, True])
def test_a_packed_footer_that_breaks_its_rules_is_corrupt(case: int, lazy: bool) -> None:
    """Every rule of §7.3 a packed footer can break with its checksum valid (a crafted file,
    a writer's bug): refused when the chunk is opened, lazily or whole, naming it."""
    data = _chunk()
    items, why = _broken_packings(data)[case]
    bad = _packed_with(data, items)
    with pytest.raises(CorruptError, match=f"test chunk: bad chunk footer: .*{why}"):
        parse_footer(bad[layout_start(bad) :], "test chunk", lazy=lazy)


def test_a_packed_footer_with_a_bad_block_is_refused_when_that_block_is_read() -> None:
    """A block whose frames do not decode, or break a rule, in a footer that is otherwise
    sound: a lazy reader opens the chunk and refuses that block when it reaches it; a
    whole reader refuses the chunk."""
    data = _chunk()
    _, ends, frames = _packed_parts(data)
    one = ends[1] - ends[0]
    for block in (
        b"\xc1" * one,  # not MessagePack
        msgspec.msgpack.encode([[9, 8, 1, 1, 0, 0, 0]]).ljust(one, b"\x90"),  # trailing bytes
    ):
        bad = _packed_with(data, {7: frames[: ends[0]] + block + frames[ends[1] :]})
        tail = bad[layout_start(bad) :]
        lazy = parse_footer(tail, "test chunk", lazy=True)
        lazy.block_frames(0)
        with pytest.raises(CorruptError, match="test chunk: bad chunk footer"):
            lazy.block_frames(1)
        with pytest.raises(CorruptError, match="test chunk: bad chunk footer"):
            parse_footer(tail, "test chunk")


@pytest.mark.parametrize("bad_at", [0, 1, 7])
def test_a_sample_that_cannot_be_encoded_leaves_the_builder_as_it_was(bad_at: int) -> None:
    good = [
        {"id": 0, "blob": b"a" * 10},
        {"id": 1, "blob": b"b" * 10, "extra": "x"},
        {"id": 2},
        {"blob": b"c" * 3000, "id": 3},
        {"id": 4, "blob": b"d" * 10},
        {"id": 5, "blob": b"e" * 10},
        {"id": 6, "blob": b"f" * 10, "late": [1, 2]},
        {"id": 7, "blob": b"g" * 10},
    ]
    bad = {"new": b"z" * 50, "id": 99, "blob": b"y" * 20, "obj": object()}
    builder = ChunkBuilder(block_bytes=4096, compressor=FrameCompressor(None, 3))
    for position, sample in enumerate(good):
        if position == bad_at:
            with pytest.raises(EncodeError, match=f"sample {position}, key 'obj'"):
                builder.add(bad, position)
            with pytest.raises(EncodeError, match="key 3 is not a str"):
                builder.add({"id": 1, 3: b"x"}, position)
        builder.add(sample, position)
    data = b"".join(builder.finish())
    assert _read_all(data) == good


def test_a_column_that_turns_compressible_is_compressed_again() -> None:
    import os

    from txstore.format.codec import CODEC_RAW, CODEC_ZSTD

    builder = ChunkBuilder(block_bytes=60_000, compressor=FrameCompressor("zstd", 3))
    # 50 blocks of noise (stored raw, then no longer tried), then 100 of text.
    samples = [{"x": os.urandom(70_000)} for _ in range(50)]
    samples += [{"x": b"the same words again " * 3500} for _ in range(100)]
    for position, sample in enumerate(samples):
        builder.add(sample, position)
    data = b"".join(builder.finish())
    layout = parse_footer(data[layout_start(data) :], "test chunk")
    codecs = [block.frames[0].codec for block in layout.footer.blocks]
    assert len(codecs) == 150
    assert set(codecs[:50]) == {CODEC_RAW}
    # Found within one probe interval of the change, and compressed from then on.
    assert codecs.index(CODEC_ZSTD) < 50 + 33 and set(codecs[83:]) == {CODEC_ZSTD}
    assert [bytes(r["x"]) for r in _read_all(data)] == [s["x"] for s in samples]


def test_a_column_repeating_a_large_value_after_noise_is_compressed() -> None:
    import os

    from txstore.format.codec import CODEC_ZSTD

    builder = ChunkBuilder(block_bytes=60_000, compressor=FrameCompressor("zstd", 3))
    blob = os.urandom(20_000)  # each frame repeats it: only the whole frame compresses
    samples = [{"x": os.urandom(70_000)} for _ in range(10)] + [{"x": blob}] * 600
    for position, sample in enumerate(samples):
        builder.add(sample, position)
    data = b"".join(builder.finish())
    layout = parse_footer(data[layout_start(data) :], "test chunk")
    codecs = [block.frames[0].codec for block in layout.footer.blocks]
    assert codecs.count(CODEC_ZSTD) > len(codecs) // 2
    assert len(data) < sum(len(s["x"]) for s in samples) // 2


_KEYS = st.sampled_from(["id", "text", "blob", "ünï"])
_VALUES = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.text(max_size=40),
    st.binary(max_size=300),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
)


#: Few keys and few types, so that a refused value often comes in a sample shaped like the
#: last one (its type checks pass on the fast path, its range or UTF-8 check does not).
_SMALL_VALUES = st.one_of(
    st.integers(min_value=0, max_value=3),
    st.text(alphabet="xü", max_size=2),
    st.binary(max_size=3),
    st.sampled_from([2**64, -(2**63) - 1, "lone \ud800", b"x".decode, ABSENT]),
    st.lists(st.sampled_from([1, "ü", "lone \ud800", b"x".decode]), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.dictionaries(_KEYS, _VALUES, max_size=4), max_size=120),
    st.integers(min_value=1, max_value=2000),
    st.booleans(),
)
def test_any_run_of_samples_round_trips(
    samples: list[dict[str, Any]], block_bytes: int, shapes_repeat: bool
) -> None:
    """Samples that keep or change their keys, key order and value types, so that blocks
    switch between the fast and the slow path anywhere, read back as written."""
    if shapes_repeat:  # runs of one shape, with values of the same types: the fast path
        samples = [dict(s) for s in samples for _ in range(3)]
    builder = ChunkBuilder(block_bytes=block_bytes, compressor=FrameCompressor("zstd", 3))
    for position, sample in enumerate(samples):
        builder.add(sample, position)
    assert _read_all(b"".join(builder.finish())) == samples


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from("abc"), _SMALL_VALUES, max_size=3),
            st.integers(min_value=1, max_value=4),  # repeats: same keys and types
            st.booleans(),  # end the block after it
        ),
        max_size=40,
    )
)
def test_refused_samples_and_block_ends_leave_order_and_content_as_written(
    steps: list[tuple[dict[str, Any], int, bool]],
) -> None:
    """A block's keys come back in the order its samples first show them (docs/format.md
    §7.4), refused samples change nothing, whichever path (fast or slow) each sample took."""
    builder = ChunkBuilder(block_bytes=2**40, compressor=FrameCompressor(None, 3))
    accepted: list[dict[str, Any]] = []
    expected_keys: list[list[str]] = []
    block: list[dict[str, Any]] = []

    def close_block() -> None:
        order = list(dict.fromkeys(key for sample in block for key in sample))
        expected_keys.extend([key for key in order if key in sample] for sample in block)
        block.clear()

    for sample, repeats, end in steps:
        for _ in range(repeats):
            try:
                builder.add(sample, len(accepted))
            except EncodeError:
                continue
            accepted.append(sample)
            block.append(sample)
        if end:
            builder.end_block()
            close_block()
    close_block()
    read = _read_all(b"".join(builder.finish()))
    assert read == accepted
    assert [list(sample) for sample in read] == expected_keys


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ({"id": 2**64, "text": "x"}, "sample 3, key 'id': int 18446744073709551616"),
        ({"id": -(2**63) - 1, "text": "x"}, "sample 3, key 'id': int -9223372036854775809"),
        ({"id": 3, "text": "lone \ud800"}, "sample 3, key 'text'.*UTF-8"),
        ({"text": "x", "id": object()}, "sample 3, key 'id'"),
    ],
)
def test_a_sample_shaped_like_the_last_is_still_checked(bad: dict[str, Any], pattern: str) -> None:
    good = [{"id": i, "text": f"t{i}"} for i in range(6)]
    builder = ChunkBuilder(block_bytes=1 << 20, compressor=FrameCompressor(None, 3))
    for position in range(3):
        builder.add(good[position], position)
    with pytest.raises(EncodeError, match=pattern):
        builder.add(bad, 3)
    for position in range(3, 6):
        builder.add(good[position], position)
    assert _read_all(b"".join(builder.finish())) == good


def test_a_built_chunk_gives_its_bytes_once() -> None:
    builder = ChunkBuilder(block_bytes=4096, compressor=FrameCompressor(None, 3))
    builder.add({"id": 1}, 0)
    built = builder.finish()
    data = b"".join(built)
    assert len(data) == built.size and _read_all(data) == [{"id": 1}]
    with pytest.raises(RuntimeError, match="once"):
        b"".join(built)


@pytest.mark.parametrize("bad", [2**64, "lone \ud800"])
def test_a_refused_first_sample_of_a_block_leaves_no_column_behind(bad: Any) -> None:
    """Shaped like the last block's samples, it passes the fast path's key and type checks
    and fails its value check: the new block must not keep its keys."""
    builder = ChunkBuilder(block_bytes=2**40, compressor=FrameCompressor(None, 3))
    first = {"a": 1} if isinstance(bad, int) else {"a": "x"}
    builder.add(first, 0)
    builder.end_block()
    with pytest.raises(EncodeError, match="sample 1, key 'a'"):
        builder.add({"a": bad}, 1)
    builder.add({"b": 2}, 1)
    assert _read_all(b"".join(builder.finish())) == [first, {"b": 2}]


@pytest.mark.parametrize(
    "make",
    [
        lambda i: {f"c{j}": (i + j) % 100 for j in range(20)},  # small ints: 1 byte, not 9
        lambda i: {"text": "日本語のテキスト" * 10, "id": i},  # 3 UTF-8 bytes a character
        lambda i: {"id": i, "tokens": bytes(2048)},
    ],
)
def test_blocks_hold_about_block_bytes_of_values(make: Any) -> None:
    samples = [make(i) for i in range(3000)]
    builder = ChunkBuilder(block_bytes=4096, compressor=FrameCompressor(None, 3))
    for position, sample in enumerate(samples):
        builder.add(sample, position)
    built = builder.finish()
    data = b"".join(built)
    blocks = parse_footer(data[built.footer_offset :], "test chunk").footer.blocks
    value_bytes = sum(len(msgspec.msgpack.encode(v)) for s in samples for v in s.values())
    exact = value_bytes / 4096  # blocks if each held exactly 4096 bytes of values
    assert exact * 0.85 <= len(blocks) <= exact * 1.15 + 1


def test_samples_with_arrays_and_containers_round_trip_and_bad_ones_are_refused() -> None:
    """Shapes with values the fast path hands to the checked encoder: numpy arrays, dicts."""
    np = pytest.importorskip("numpy")
    samples = [
        {"id": i, "latent": np.full((2, 3), i, dtype=np.float16), "meta": {"tags": [i, "x"]}}
        for i in range(40)
    ]
    builder = ChunkBuilder(block_bytes=256, compressor=FrameCompressor(None, 3))
    for position, sample in enumerate(samples):
        if position == 20:  # shaped like the others, with values the format cannot store
            bad_array = {"id": 20, "latent": np.array([object()]), "meta": {}}
            with pytest.raises(EncodeError, match="sample 20, key 'latent'"):
                builder.add(bad_array, 20)
            bad_dict = {"id": 20, "latent": sample["latent"], "meta": {"k": object()}}
            with pytest.raises(EncodeError, match="sample 20, key 'meta'"):
                builder.add(bad_dict, 20)
        builder.add(sample, position)
    read = _read_all(b"".join(builder.finish()))
    assert [r["id"] for r in read] == list(range(40))
    for got, want in zip(read, samples, strict=True):
        assert got["latent"].dtype == np.float16 and np.array_equal(got["latent"], want["latent"])
        assert got["meta"] == want["meta"]


NO_LIMIT = 2**62  # a chunk size add_many never reaches


def _refused_at(error: EncodeError) -> int:
    """The position an EncodeError names ("sample 12, key 'a': ...")."""
    return int(str(error).split()[1].rstrip(",:"))


def _one_at_a_time(
    samples: list[dict[str, Any]], block_bytes: int
) -> tuple[bytes, list[tuple[int, str]]]:
    """The chunk ``add`` makes of the samples, skipping refused ones, and the refusals."""
    builder = ChunkBuilder(block_bytes=block_bytes, compressor=FrameCompressor(None, 3))
    refused = []
    for position, sample in enumerate(samples):
        try:
            builder.add(sample, position)
        except EncodeError as e:
            refused.append((position, str(e)))
    return b"".join(builder.finish()), refused


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            # Few shapes, so that neighbours often share one and a refused value (an int out
            # of range, a lone surrogate) often comes in a list of samples shaped like it.
            st.sampled_from([("a",), ("a", "b"), ("a", "b", "c")]),
            st.lists(_SMALL_VALUES, min_size=3, max_size=3),
            st.integers(min_value=1, max_value=30),  # repeats
            st.booleans(),  # every other repeat has its keys in reverse order
        ),
        max_size=20,
    ),
    st.integers(min_value=1, max_value=200),
    st.lists(st.integers(min_value=1, max_value=70), min_size=1, max_size=8),
)
def test_adding_lists_makes_the_chunk_adding_one_at_a_time_makes(
    steps: list[tuple[tuple[str, ...], list[Any], int, bool]],
    block_bytes: int,
    cuts: list[int],
) -> None:
    """``add_many`` checks a list of samples in C passes: the same blocks, bytes and
    refusals (position and message) as ``add``, however the samples are cut into lists."""
    samples = []
    for keys, values, repeats, reverse in steps:
        sample = dict(zip(keys, values, strict=False))  # as many values as keys
        for k in range(repeats):
            samples.append(dict(reversed(sample.items())) if reverse and k % 2 else sample)
    expected, expected_refusals = _one_at_a_time(samples, block_bytes)
    builder = ChunkBuilder(block_bytes=block_bytes, compressor=FrameCompressor(None, 3))
    refusals = []
    start = 0
    for n in itertools.cycle(cuts):
        if start >= len(samples):
            break
        batch = samples[start : start + n]
        while batch:
            try:
                assert builder.add_many(batch, start, NO_LIMIT) == len(batch)
                start += len(batch)
                batch = []
            except EncodeError as e:
                position = _refused_at(e)
                refusals.append((position, str(e)))
                batch = batch[position + 1 - start :]
                start = position + 1
    assert refusals == expected_refusals
    assert b"".join(builder.finish()) == expected
    # From an iterator, each sample added before the next is taken; after a refusal the
    # same iterator goes on from just past the refused sample.
    builder = ChunkBuilder(block_bytes=block_bytes, compressor=FrameCompressor(None, 3))
    source = iter(samples)
    refusals = []
    while True:
        try:
            if builder.add_from(source, builder.num_samples + len(refusals), NO_LIMIT) == 0:
                break
        except EncodeError as e:
            refusals.append((_refused_at(e), str(e)))
    assert refusals == expected_refusals
    assert b"".join(builder.finish()) == expected


def test_adding_lists_cuts_blocks_at_the_most_samples_a_block_holds() -> None:
    samples = [{"a": None}] * (2 * MAX_BLOCK_SAMPLES + 10)
    expected, _ = _one_at_a_time(samples, 2**40)
    builder = ChunkBuilder(block_bytes=2**40, compressor=FrameCompressor(None, 3))
    for start in range(0, len(samples), 1000):
        builder.add_many(samples[start : start + 1000], start, NO_LIMIT)
    data = b"".join(builder.finish())
    blocks = parse_footer(data[layout_start(data) :], "test chunk").footer.blocks
    assert [b.num_samples for b in blocks] == [MAX_BLOCK_SAMPLES, MAX_BLOCK_SAMPLES, 10]
    assert data == expected
    builder = ChunkBuilder(block_bytes=2**40, compressor=FrameCompressor(None, 3))
    assert builder.add_from(iter(samples), 0, NO_LIMIT) == len(samples)
    assert b"".join(builder.finish()) == expected


@pytest.mark.parametrize(
    ("bad", "pattern"), [(2**64, "int 18446744073709551616"), ("\ud800", "UTF-8")]
)
def test_adding_a_list_refuses_its_bad_sample_and_keeps_those_before_it(
    bad: Any, pattern: str
) -> None:
    good = [{"a": i, "b": f"x{i}"} for i in range(12)]
    builder = ChunkBuilder(block_bytes=64, compressor=FrameCompressor(None, 3))
    builder.add_many(good[:3], 0, NO_LIMIT)
    shaped_alike = {"a": bad, "b": "y"} if isinstance(bad, int) else {"a": 3, "b": bad}
    with pytest.raises(EncodeError, match=f"sample 6, key '[ab]': .*{pattern}"):
        builder.add_many([*good[3:6], shaped_alike, *good[6:9]], 3, NO_LIMIT)
    assert builder.num_samples == 6
    builder.add_many(good[6:], 6, NO_LIMIT)
    assert _read_all(b"".join(builder.finish())) == good


def test_a_chunk_keeps_no_object_per_frame_for_the_cyclic_gc() -> None:
    """Its frames are tuples the GC stops tracking and its footer structs are never tracked:
    thousands of tracked objects a chunk made full collections of a large heap (a process that
    imported torch) run during appends, each as long as a W2 append's tenth."""
    import gc

    builder = ChunkBuilder(block_bytes=256, compressor=FrameCompressor(None, 3))
    gc.collect()
    before = len(gc.get_objects())
    for position in range(2000):  # 2000 blocks of 2 frames
        builder.add({"id": position, "blob": bytes(300)}, position)
    gc.collect()
    assert len(gc.get_objects()) - before < 100
    data = b"".join(builder.finish())
    footer = parse_footer(data[layout_start(data) :], "test chunk").footer
    assert len(footer.blocks) == 2000
    assert not gc.is_tracked(footer) and not gc.is_tracked(footer.blocks[0])
    assert not any(gc.is_tracked(frame) for block in footer.blocks for frame in block.frames)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=400),  # the length of each sample's bytes
            st.integers(min_value=1, max_value=200),  # samples like it in a row
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(min_value=1, max_value=3000),
    st.integers(min_value=1, max_value=60_000),
)
def test_adding_a_list_stops_where_the_chunk_fills_as_one_at_a_time_does(
    steps: list[tuple[int, int]], block_bytes: int, limit: int
) -> None:
    """A writer starts a new chunk once ``size`` reaches the chunk size: ``add_many`` stops
    right after the sample that gets it there, wherever that is in a block."""
    samples = [{"i": k % 4, "b": bytes(length)} for length, n in steps for k in range(n)]
    one = ChunkBuilder(block_bytes=block_bytes, compressor=FrameCompressor(None, 3))
    expected = len(samples)
    for position, sample in enumerate(samples):
        if one.add(sample, position) >= limit:
            expected = position + 1
            break
    many = ChunkBuilder(block_bytes=block_bytes, compressor=FrameCompressor(None, 3))
    added = 0
    while added < len(samples):  # lists as a writer cuts them, warming up the fast path
        n = many.add_many(samples[added : added + 37], added, limit)
        added += n
        if many.size >= limit:
            break
    taken = ChunkBuilder(block_bytes=block_bytes, compressor=FrameCompressor(None, 3))
    source = iter(samples)
    assert taken.add_from(source, 0, limit) == expected
    assert next(source, None) is (samples[expected] if expected < len(samples) else None)
    assert added == expected
    chunk = b"".join(one.finish())
    assert b"".join(many.finish()) == chunk
    assert b"".join(taken.finish()) == chunk


def _built_with_hand_offs(
    hand_offs: set[int], block_bytes: int, compression: str | None
) -> tuple[bytes, Any]:
    """SAMPLES as a writer stores them: the frames sealed so far given (``stream``) before
    each position in ``hand_offs``, the rest once the builder is finished."""
    builder = ChunkBuilder(block_bytes=block_bytes, compressor=FrameCompressor(compression, 3))
    stream = builder.stream()
    out: list[bytes] = []
    for position, sample in enumerate(SAMPLES):
        if position in hand_offs:
            out += map(bytes, stream.pieces(builder.sealed_frames))
        builder.add(sample, position)
    built = builder.finish()
    out += map(bytes, built)
    assert built.size == sum(map(len, out))
    return b"".join(out), built


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=len(SAMPLES)), max_size=12),
    st.sampled_from([None, "zstd"]),
    st.sampled_from([512, 4096, 70_000]),
)
def test_a_chunk_stored_while_it_is_built_has_the_bytes_of_one_built_first(
    cuts: list[int], compression: str | None, block_bytes: int
) -> None:
    """A writer stores a chunk's sealed frames while more samples are added (``stream``),
    then the rest once it is finished: the file is the one ``finish`` alone gives, wherever
    the hand-offs fall (inside runs of small frames being joined, between a large frame's
    pieces, before any frame is sealed)."""
    streamed, _ = _built_with_hand_offs(set(cuts), block_bytes, compression)
    assert streamed == _built_with_hand_offs(set(), block_bytes, compression)[0]
    assert _read_all(streamed) == SAMPLES


def test_a_chunk_digest_is_xxh3_of_its_bytes_before_the_footer() -> None:
    """docs/format.md §5: ``digest`` is XXH3-64 (seed 0) of bytes [0, footer_offset), as 16
    lowercase hex digits, whether the chunk was stored while built or afterwards."""
    for hand_offs in (set(), {3, 50, 200}):
        data, built = _built_with_hand_offs(hand_offs, 4096, "zstd")
        expected = f"{xxhash.xxh3_64_intdigest(data[: built.footer_offset]):016x}"
        assert built.digest == expected


@settings(max_examples=60, deadline=None)
@given(
    size=st.sampled_from([0, 1, 4095, 4096, 4097, 40_000, (1 << 20) - 1, 1 << 20, (1 << 20) + 1]),
    start=st.integers(0, 2**32 - 1),
    seed=st.integers(0, 255),
)
def test_crc32_in_pieces_is_zlibs_crc32(size: int, start: int, seed: int) -> None:
    """Chunk tails are checked in pieces that keep the GIL: the result is CRC-32's."""
    pattern = bytes((seed + i * 7) & 0xFF for i in range(4099))  # not a divisor of the pieces
    data = (pattern * (size // len(pattern) + 1))[:size]
    assert crc32(data, start) == zlib.crc32(data, start)
    assert crc32(memoryview(data)) == zlib.crc32(data)


def test_checking_a_chunk_digest_lets_other_threads_run() -> None:
    """A prefetch thread checks each chunk read ahead while the training loop decodes: the
    check must let go of the GIL (the one-shot xxhash call holds it for the whole buffer,
    which halved the loop's pace). With forced switches turned off, this thread runs while
    the other is inside ``chunk_digest`` only if the hash lets go of the GIL."""
    data = memoryview(bytes(16 << 20))
    expected = f"{xxhash.xxh3_64_intdigest(data):016x}"
    inside, done, enough = threading.Event(), threading.Event(), threading.Event()
    results: list[str] = []

    def hash_until_seen() -> None:
        for _ in range(200):
            inside.set()
            results.append(chunk_digest(data))
            inside.clear()
            if enough.is_set():
                break
        done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        thread = threading.Thread(target=hash_until_seen)
        thread.start()
        steps_inside = 0
        while not done.is_set():
            if inside.is_set():
                steps_inside += 1
                if steps_inside >= 100:
                    enough.set()
            time.sleep(0)  # the only way the other thread gets the GIL back
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert steps_inside >= 100
    assert set(results) == {expected}


def test_a_stream_gives_a_tail_only_after_every_frame() -> None:
    builder = ChunkBuilder(block_bytes=512, compressor=FrameCompressor(None, 3))
    for position, sample in enumerate(SAMPLES[:50]):
        builder.add(sample, position)
    stream = builder.stream()
    list(stream.pieces(builder.sealed_frames - 1))
    with pytest.raises(RuntimeError, match="after all its frames"):
        list(stream.tail(["id"], 50, 0))


@pytest.mark.parametrize("major", [2, 3])
def test_a_shared_footer_decoded_whole_while_blocks_are_read_one_at_a_time(major: int) -> None:
    """A footer parsed for single samples, shared by threads: one decodes it whole (a read of
    some fields) while others decode its blocks one at a time (``snap[i]``). Every block
    reads; none fails for the state the whole decode replaced (IndexError, AssertionError
    before). Threads switch every microsecond so that the steps interleave."""
    builder = ChunkBuilder(block_bytes=256, compressor=FrameCompressor(None, 0))
    for position in range(400):
        builder.add({"id": position, "blob": bytes([position % 256]) * 100}, position)
    data = b"".join(builder.finish())
    if major == 2:
        data = _rewrite(data, 2, xxhash.xxh3_64_intdigest)
    tail = data[layout_start(data) :]
    whole = parse_footer(tail, "test chunk").footer
    errors: list[BaseException] = []
    seen: list[bool] = []

    def round_of_threads() -> None:
        layout = parse_footer(tail, "test chunk", lazy=True)
        start = threading.Barrier(3)

        def read_blocks() -> None:
            start.wait()
            try:
                blocks = [tuple(layout.block_frames(k)) for k in range(len(whole.blocks))]
                seen.append(blocks == [b.frames for b in whole.blocks])
            except BaseException as e:  # collected for the assertion below
                errors.append(e)

        def decode_whole() -> None:
            start.wait()
            layout.footer  # noqa: B018

        threads = [threading.Thread(target=f) for f in (read_blocks, read_blocks, decode_whole)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(200):
            round_of_threads()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert seen == [True] * 400
