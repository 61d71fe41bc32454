"""Frame codecs and checksums: the one place zstandard and zlib's crc32 are used."""

from __future__ import annotations

import threading
import zlib

import zstandard

from ..errors import ChecksumError, CorruptError, UnsupportedFormatError

CODEC_RAW = 0
CODEC_ZSTD = 1
CODEC_NAMES = {None: CODEC_RAW, "zstd": CODEC_ZSTD}

# Keep a compressed frame only when it saves at least 1/32 of the raw bytes; incompressible
# payloads (JPEG, random tokens) are then stored raw and cost nothing to read.
_MIN_SAVING_SHIFT = 5


def crc32(data: bytes | bytearray | memoryview, start: int = 0) -> int:
    return zlib.crc32(data, start)


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
        if self._zstd is None or len(raw) < 64:
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
    stored: bytes | memoryview, codec: int, raw_length: int, checksum: int, where: str
) -> bytes | memoryview:
    """Verify a stored frame's checksum and return its raw bytes."""
    if zlib.crc32(stored) != checksum:
        raise ChecksumError(f"checksum mismatch in {where}")
    if codec == CODEC_RAW:
        return stored
    if codec == CODEC_ZSTD:
        try:
            raw = _decompressor().decompress(stored, max_output_size=raw_length)
        except zstandard.ZstdError as e:
            raise CorruptError(f"cannot decompress {where}: {e}") from e
        if len(raw) != raw_length:
            raise CorruptError(f"{where}: decompressed {len(raw)} bytes, expected {raw_length}")
        return raw
    raise UnsupportedFormatError(f"{where}: unknown codec {codec}")
