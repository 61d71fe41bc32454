"""Frame codecs and checksums: the one place zstandard, xxhash and CRC-32 (zlib-ng) are used."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import xxhash
import zstandard

# zlib-ng's CRC-32 is zlib's (the same checksums) computed with the CPU's carry-less multiply:
# every open checks a segment file at each level of the tree, so its speed is the open's.
from zlib_ng import zlib_ng

from ..errors import ChecksumError, CorruptError, UnsupportedFormatError

CODEC_RAW = 0
CODEC_ZSTD = 1
CODEC_NAMES = {None: CODEC_RAW, "zstd": CODEC_ZSTD}

# Keep a compressed frame only when it saves at least 1/32 of the raw bytes; incompressible
# payloads (JPEG, random tokens) are then stored raw and cost nothing to read.
_MIN_SAVING_SHIFT = 5
# Frames smaller than this stay raw: beside a block's large frames they save a few hundred
# bytes, while decompressing one is a noticeable share of reading a sample with snap[i].
_MIN_COMPRESSED = 4096


#: zlib-ng, like zlib, lets go of the GIL for inputs above 5 KiB: a prefetch thread checking a
#: chunk's tail then waits up to a switch interval to get it back from the busy decoding
#: thread, twice a chunk. Pieces this small keep it.
_CRC_PIECE = 5 * 1024
#: Above this (large segments), one call that lets go of the GIL costs less than the pieces.
_CRC_HELD_UP_TO = 1 << 20


def crc32(data: bytes | bytearray | memoryview, start: int = 0) -> int:
    """The checksum of small metadata: chunk tails, segments (cheap at their size)."""
    if len(data) <= _CRC_PIECE or len(data) > _CRC_HELD_UP_TO:
        return zlib_ng.crc32(data, start)
    view = memoryview(data)
    for offset in range(0, len(view), _CRC_PIECE):
        start = zlib_ng.crc32(view[offset : offset + _CRC_PIECE], start)
    return start


#: python-xxhash's ``update`` releases the GIL for inputs above about 100 KB; a thread that
#: then wants it back waits for the other thread's switch interval, once per frame, so large
#: frames hash far slower beside a busy thread. Its one-shot functions hold the GIL at any
#: size: frames up to ``_ONE_CALL_UP_TO`` take one call (short enough to hold the GIL
#: through), larger ones or several parts go to ``update`` in pieces no larger than ``_PIECE``.
_PIECE = 65536
_ONE_CALL_UP_TO = 1 << 20


def frame_checksum(parts: Sequence[bytes | memoryview]) -> int:
    """The checksum of a frame's stored bytes (chunk format 2): XXH3-64, seed 0, which costs
    a read or a write little beside copying the bytes; CRC-32 (format 1) was several times
    slower, a large share of reading one sample (docs/benchmarks.md)."""
    if len(parts) == 1 and len(parts[0]) <= _ONE_CALL_UP_TO:
        return xxhash.xxh3_64_intdigest(parts[0])
    hasher = xxhash.xxh3_64()
    for part in parts:
        if len(part) <= _PIECE:
            hasher.update(part)
            continue
        view = memoryview(part)
        for start in range(0, len(view), _PIECE):
            hasher.update(view[start : start + _PIECE])
    return hasher.intdigest()


class ChunkDigest:
    """The digest of a chunk file's bytes before its footer (format 1.2 manifests): XXH3-64,
    seed 0, as 16 lowercase hex digits. Fed as the chunk is written; a reader that has the
    whole file checks it with one call (``chunk_digest``), which lets go of the GIL while it
    hashes, instead of one check per frame."""

    def __init__(self) -> None:
        self._hasher = xxhash.xxh3_64()

    def update(self, data: bytes | memoryview) -> None:
        self._hasher.update(data)

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()


def chunk_digest(data: bytes | memoryview) -> str:
    # Through ``update``, which lets go of the GIL: python-xxhash 3.x holds it in its one-shot
    # functions, for the 3 ms of a 64 MiB chunk, and the decoding thread stalls behind every
    # chunk a prefetch thread checks (W2 reads with zero_copy: 82,000 against 112,000
    # samples/s, with xxhash 3.8.2, which MosaicML Streaming pins).
    hasher = xxhash.xxh3_64()
    hasher.update(data)
    return hasher.hexdigest()


def _frame_checksum_v1(stored: bytes | memoryview) -> int:
    return zlib_ng.crc32(stored)


def _frame_checksum_v2(stored: bytes | memoryview) -> int:
    if len(stored) <= _ONE_CALL_UP_TO:  # most frames: one call
        return xxhash.xxh3_64_intdigest(stored)
    return frame_checksum([stored])


#: The frame checksum of each chunk format major version.
FRAME_CHECKSUMS = {
    1: _frame_checksum_v1,
    2: _frame_checksum_v2,
    3: _frame_checksum_v2,
    4: _frame_checksum_v2,
}


class FrameCompressor:
    """Compresses frames for one writer thread."""

    def __init__(self, compression: str | None, level: int) -> None:
        if compression not in CODEC_NAMES:
            raise ValueError(f"unknown compression {compression!r}; use 'zstd' or None")
        self._zstd = (
            zstandard.ZstdCompressor(level=level, write_checksum=False)
            if compression == "zstd"
            else None
        )

    @property
    def enabled(self) -> bool:
        return self._zstd is not None

    def compress(self, raw: bytes) -> tuple[int, bytes]:
        if self._zstd is None or len(raw) < _MIN_COMPRESSED:
            return CODEC_RAW, raw
        packed = self._zstd.compress(raw)
        if len(packed) <= len(raw) - (len(raw) >> _MIN_SAVING_SHIFT):
            # The result keeps its compress-bound allocation; an exact-size copy frees it.
            return CODEC_ZSTD, bytes(memoryview(packed)) if len(packed) < len(raw) // 2 else packed
        return CODEC_RAW, raw


_local = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "zstd", None)
    if d is None:
        d = _local.zstd = zstandard.ZstdDecompressor()
    return d


def open_frame(
    stored: memoryview,
    codec: int,
    raw_length: int,
    checksum: int,
    check: Callable[[bytes | memoryview], int] | None,
    where: str,
) -> memoryview:
    """Verify a stored frame's checksum with ``check`` (None: the caller checked the bytes it
    lies in) and return its raw bytes: ``stored`` itself, or a view of its decompressed
    bytes."""
    if check is not None and check(stored) != checksum:
        raise ChecksumError(f"checksum mismatch in {where}")
    if codec == CODEC_RAW:
        return stored
    return memoryview(decompress_frame(stored, codec, raw_length, where))


def decompress_frame(stored: bytes | memoryview, codec: int, raw_length: int, where: str) -> bytes:
    """The raw bytes of a verified frame stored with ``codec`` (not CODEC_RAW)."""
    if codec == CODEC_ZSTD:
        try:
            raw = _decompressor().decompress(stored, max_output_size=raw_length)
        except zstandard.ZstdError as e:
            raise CorruptError(f"cannot decompress {where}: {e}") from e
        if len(raw) != raw_length:
            raise CorruptError(f"{where}: decompressed {len(raw)} bytes, expected {raw_length}")
        return raw
    raise UnsupportedFormatError(f"{where}: unknown codec {codec}")


def zstd_decompress(data: bytes | memoryview) -> bytes:
    """Whole zstd frames, one after another, as other tools write them (their headers may
    not record the size): the peer formats' compressed files (``format/peer_*.py``)."""
    out = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)
    try:
        raw = out.decompress(data)
    except zstandard.ZstdError as e:
        raise CorruptError(f"not zstd data: {e}") from e
    return raw
