"""The builder's ways in (``add``, ``add_from``, ``add_many`` and its list check) make the same
chunk and refuse the same samples with the same errors; ``decode_blocks`` and ``decode_value``
open frames alike."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import numpy as np
import pytest

from txstore.errors import ChecksumError, CorruptError, EncodeError, UnsupportedFormatError
from txstore.format.builder import ChunkBuilder
from txstore.format.chunk import MAX_BLOCK_SAMPLES, ChunkLayout, parse_footer
from txstore.format.codec import CODEC_RAW, CODEC_ZSTD, FrameCompressor, open_frame
from txstore.format.frames import decode_blocks, decode_value
from txstore.format.values import ABSENT, ValueDecoder

NO_LIMIT = 2**62  # a chunk size no test reaches
Refusal = tuple[int, str, str]  # position, exception type, message


def _builder(block_bytes: int, compression: str | None = None) -> ChunkBuilder:
    return ChunkBuilder(block_bytes=block_bytes, compressor=FrameCompressor(compression, 3))


def _position(error: EncodeError) -> int:
    """The position an EncodeError names ("sample 12, key 'a': ..." or "sample 12: ...")."""
    return int(str(error).split()[1].rstrip(",:"))


def _by_add(samples: list[Any], block_bytes: int) -> tuple[bytes, list[Refusal]]:
    builder = _builder(block_bytes)
    refused = []
    for position, sample in enumerate(samples):
        try:
            builder.add(sample, position)
        except EncodeError as e:
            refused.append((position, type(e).__name__, str(e)))
    return b"".join(builder.finish()), refused


def _by_add_from(samples: list[Any], block_bytes: int) -> tuple[bytes, list[Refusal]]:
    """From one iterator; after a refusal the same iterator goes on past the refused sample."""
    builder = _builder(block_bytes)
    source = iter(samples)
    refused: list[Refusal] = []
    while True:
        try:
            if builder.add_from(source, builder.num_samples + len(refused), NO_LIMIT) == 0:
                break
        except EncodeError as e:
            refused.append((_position(e), type(e).__name__, str(e)))
    return b"".join(builder.finish()), refused


def _by_add_many(samples: list[Any], block_bytes: int, cut: int) -> tuple[bytes, list[Refusal]]:
    """In lists of ``cut`` samples; after a refusal, the rest of the list again."""
    builder = _builder(block_bytes)
    refused = []
    start = 0
    while start < len(samples):
        batch = samples[start : start + cut]
        try:
            builder.add_many(batch, start, NO_LIMIT)
            start += len(batch)
        except EncodeError as e:
            position = _position(e)
            refused.append((position, type(e).__name__, str(e)))
            start = position + 1
    return b"".join(builder.finish()), refused


def _read(data: bytes) -> list[dict[str, Any]]:
    length = struct.unpack_from("<I", data, len(data) - 16)[0]
    layout = parse_footer(data[len(data) - 16 - length :], "test chunk")
    blocks = decode_blocks(
        [(layout, data, None)], 0, len(layout.footer.blocks), ValueDecoder(), False
    )
    return [sample for block in blocks for sample in block]


def _every_way(samples: list[Any], block_bytes: int) -> tuple[bytes, list[Refusal]]:
    """The chunk and refusals of ``add``, after checking that every other way gives the same."""
    expected = _by_add(samples, block_bytes)
    assert _by_add_from(samples, block_bytes) == expected
    for cut in (1, 3, 64, len(samples)):
        assert _by_add_many(samples, block_bytes, cut) == expected, cut
    return expected


def _plain(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "blob": bytes([i % 256]) * (i * 37 % 300)} for i in range(n)]


def _text(n: int) -> list[dict[str, Any]]:
    words = ["plain", "café", "日本語", "emoji 🙂", "", "x" * 200]
    return [
        {"id": -i, "text": words[i % len(words)] * (i % 4), "score": i / 3, "ok": i % 2 == 0}
        for i in range(n)
    ]


def _nested(n: int) -> list[dict[str, Any]]:
    return [
        {"id": i, "list": [i, "é" * (i % 3), None], "map": {"k": i}, "array": np.arange(i % 5)}
        for i in range(n)
    ]


def _shapes(n: int) -> list[dict[str, Any]]:
    """Shapes that change: keys reversed, missing, added, and the int range's ends."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        sample: dict[str, Any] = {"a": i, "b": b"v" * (i % 50), "c": None}
        if i % 5 == 1:
            sample = dict(reversed(sample.items()))
        elif i % 5 == 2:
            del sample["b"]
        elif i % 5 == 3:
            sample["d"] = "new"
        elif i % 7 == 4:
            sample["a"] = 2**64 - 1 if i % 2 else -(2**63)
        out.append(sample)
    return out


def _wide(n: int) -> list[dict[str, Any]]:
    """Several ints and several bytes and strs a sample."""
    return [
        {"a": i, "x": b"x" * (i % 90), "b": -(i**3), "y": "ü" * (i % 7), "z": bytes(i % 40)}
        for i in range(n)
    ]


MAKERS: dict[str, Callable[[int], list[dict[str, Any]]]] = {
    "wide": _wide,
    "plain": _plain,
    "text": _text,
    "nested": _nested,
    "shapes": _shapes,
}


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Samples equal, arrays by value."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.keys() != y.keys():
            return False
        for key, value in x.items():
            if isinstance(value, np.ndarray):
                if not np.array_equal(value, y[key]):
                    return False
            elif value != y[key]:
                return False
    return True


@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.parametrize("block_bytes", [64, 1000, 2**20])
def test_every_way_in_makes_the_same_chunk(kind: str, block_bytes: int) -> None:
    """Block boundaries follow each path's size estimate (non-ASCII strs count their UTF-8
    bytes): a path that sized or checked a sample otherwise would cut other blocks."""
    samples = MAKERS[kind](300)
    data, refused = _every_way(samples, block_bytes)
    assert refused == []
    assert _same(_read(data), samples)


def test_the_list_check_takes_what_add_takes() -> None:
    """The list path (a C pass per check over a whole list) on lists it takes whole, against
    ``add`` one sample at a time: the same chunk."""
    samples = [s for s in _text(400) if s["text"].isascii()]  # the list check takes ASCII
    for block_bytes in (64, 1000, 2**20):
        expected, _ = _by_add(samples, block_bytes)
        builder = _builder(block_bytes)
        builder.add(samples[0], 0)
        start = 1
        while start < len(samples):
            batch = samples[start : start + 50]
            assert builder._add_shaped(batch, start, NO_LIMIT) == len(batch), start
            start += len(batch)
        assert b"".join(builder.finish()) == expected, block_bytes


BAD: dict[str, tuple[dict[str, Any], Any, str]] = {
    # name: (a good sample, the bad sample, what its error names) - each bad sample has the
    # good one's keys in order and, where it can, its types: the fast path meets it first.
    "int too large": ({"id": 1, "blob": b"x"}, {"id": 2**64, "blob": b"x"}, "'id'"),
    "int too small": ({"id": 1, "blob": b"x"}, {"id": -(2**63) - 1, "blob": b"x"}, "'id'"),
    "second int too large": ({"id": 1, "n": 2, "s": "ü"}, {"id": 1, "n": 2**64, "s": "ü"}, "'n'"),
    "lone surrogate": ({"id": 1, "t": "é"}, {"id": 1, "t": "a\ud800"}, "'t'"),
    "surrogate in a key": ({"id": 1}, {"id": 1, "\udc80": 2}, "key"),
    "key not a str": ({"id": 1, "b": b"x"}, {"id": 1, 3: b"x"}, "key 3"),
    "None": ({"id": 1}, None, "NoneType"),
    "a list": ({"id": 1}, [("id", 1)], "list"),
    "ABSENT": ({"id": 1, "b": 2}, {"id": 1, "b": ABSENT}, "'b'"),
    "unsupported type": ({"id": 1, "b": b"x"}, {"id": 1, "b": object()}, "'b'"),
    "int too large, nested": ({"id": 1, "l": [1]}, {"id": 1, "l": [2**70]}, "'l'"),
    "surrogate, nested": ({"id": 1, "l": ["a"]}, {"id": 1, "l": ["\udc80"]}, "'l'"),
}


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("at", [0, 1, 7, 40])
def test_every_way_in_refuses_a_bad_sample_alike(name: str, at: int) -> None:
    """The same error (type and message, naming its position) from each way in, the samples
    around it kept; the samples before it set the fast path that meets it first."""
    good, bad, names = BAD[name]
    goods = [dict(good) for _ in range(60)]
    samples = [*goods[:at], bad, *goods[at:]]
    data, refused = _every_way(samples, 96)
    assert len(refused) == 1
    position, kind, message = refused[0]
    assert (position, kind) == (at, "EncodeError")
    assert message.startswith(f"sample {at}") and names in message
    assert _read(data) == goods


def test_add_from_refuses_a_sample_that_is_none() -> None:
    """A None in a stream of samples on the fast path is refused, as ``add`` refuses it, not
    dropped."""
    builder = _builder(2**20)
    source: Iterator[Any] = iter([{"a": 1}, {"a": 2}, None, {"a": 3}])
    with pytest.raises(EncodeError, match="sample 2: expected a dict, got NoneType"):
        builder.add_from(source, 0, NO_LIMIT)
    assert builder.num_samples == 2
    assert builder.add_from(source, 3, NO_LIMIT) == 1
    assert _read(b"".join(builder.finish())) == [{"a": 1}, {"a": 2}, {"a": 3}]


def _zstd_chunk() -> tuple[bytes, ChunkLayout]:
    builder = _builder(2**20, "zstd")
    for i in range(4):
        builder.add({"id": i, "text": "compressible " * 2000}, i)
    data = b"".join(builder.finish())
    length = struct.unpack_from("<I", data, len(data) - 16)[0]
    return data, parse_footer(data[len(data) - 16 - length :], "test chunk")


def _with_codec(layout: ChunkLayout, codec: int) -> ChunkLayout:
    """The chunk's layout with every zstd frame's codec replaced (its checksum kept)."""
    footer = layout.footer
    blocks = [
        msgspec.structs.replace(
            block,
            frames=[
                msgspec.structs.replace(f, codec=codec) if f.codec == CODEC_ZSTD else f
                for f in block.frames
            ],
        )
        for block in footer.blocks
    ]
    return ChunkLayout(msgspec.structs.replace(footer, blocks=blocks), layout.where)


def _errors(data: bytes, layout: ChunkLayout, prechecked: bool) -> tuple[str, str]:
    """What ``decode_blocks`` raises, and what opening its first compressed frame alone
    raises (``prechecked``: the body was checked before, the frame is not)."""
    frame = next(f for f in layout.footer.blocks[0].frames if f.codec != CODEC_RAW)
    failures = (ChecksumError, CorruptError, UnsupportedFormatError)
    with pytest.raises(failures) as in_blocks:
        list(decode_blocks([(layout, data, None)], 0, 1, ValueDecoder(), False, (prechecked,)))
    stored = memoryview(data)[frame.offset : frame.offset + frame.length]
    check = None if prechecked else layout.check
    with pytest.raises(failures) as alone:
        open_frame(stored, frame.codec, frame.raw_length, frame.checksum, check, layout.where)
    return f"{in_blocks.type.__name__}: {in_blocks.value}", f"{alone.type.__name__}: {alone.value}"


def test_a_damaged_frame_fails_alike_in_blocks_and_alone() -> None:
    """A flipped byte in a compressed frame: a checksum mismatch when frames are checked (as
    ``decode_value`` finds), a decompression error when the body was checked before."""
    data, layout = _zstd_chunk()
    frame = next(f for f in layout.footer.blocks[0].frames if f.codec == CODEC_ZSTD)
    damaged = bytearray(data)
    damaged[frame.offset] ^= 0xFF  # zstd's magic number
    bad = bytes(damaged)
    in_blocks, alone = _errors(bad, layout, prechecked=False)
    assert in_blocks == alone == "ChecksumError: checksum mismatch in test chunk"
    with pytest.raises(ChecksumError) as one:
        decode_value(bad, 0, frame, 4, 0, ValueDecoder(), layout)
    assert str(one.value) == "checksum mismatch in test chunk"
    in_blocks, alone = _errors(bad, layout, prechecked=True)
    assert in_blocks == alone
    assert in_blocks.startswith("CorruptError: cannot decompress test chunk")


def test_an_unknown_codec_fails_alike_in_blocks_and_alone() -> None:
    data, layout = _zstd_chunk()
    layout = _with_codec(layout, 9)
    for prechecked in (False, True):
        in_blocks, alone = _errors(data, layout, prechecked)
        assert in_blocks == alone == "UnsupportedFormatError: test chunk: unknown codec 9"


@pytest.mark.parametrize(
    ("count", "blocks"),
    [
        (MAX_BLOCK_SAMPLES - 1, [MAX_BLOCK_SAMPLES - 1]),
        (MAX_BLOCK_SAMPLES, [MAX_BLOCK_SAMPLES]),
        (MAX_BLOCK_SAMPLES + 1, [MAX_BLOCK_SAMPLES, 1]),
    ],
)
def test_a_source_that_ends_at_a_full_block_makes_the_same_chunk(
    count: int, blocks: list[int]
) -> None:
    """Blocks cut at the most samples a block holds, and a source that ends just there."""
    samples = [{"a": i % 3 == 0} for i in range(count)]
    data, refused = _every_way(samples, 2**40)
    assert refused == []
    length = struct.unpack_from("<I", data, len(data) - 16)[0]
    footer = parse_footer(data[len(data) - 16 - length :], "test chunk").footer
    assert [b.num_samples for b in footer.blocks] == blocks
    assert _read(data) == samples
