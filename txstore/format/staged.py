"""The documents a staged transaction hands between processes: the handle a remote writer
writes for, and the part it hands back. Checked as documents here; the files a part names
are read back by the store (``Transaction.add``)."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ..errors import CorruptError
from .chunk import HEADER, TRAILER
from .manifest import CHUNKS, ChunkRef, StoreConfig, check_data_path


class TransactionHandle(msgspec.Struct, frozen=True, kw_only=True):
    """What a remote writer needs: where the store is and how to write its chunks."""

    uri: str
    storage_options: dict[str, Any]
    config: StoreConfig
    staging_id: str

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> TransactionHandle:
        return msgspec.json.decode(data, type=cls)


class StagedPart(msgspec.Struct, frozen=True, kw_only=True):
    """Chunks one writer wrote for a transaction, in sample order."""

    staging_id: str
    chunks: tuple[ChunkRef, ...]
    num_samples: int

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> StagedPart:
        """A part handed over by another process; CorruptError unless it is well formed (the
        files it names are read back by ``Transaction.add``)."""
        try:
            part = msgspec.json.decode(data, type=cls)
        except msgspec.DecodeError as e:  # ValidationError too
            raise CorruptError(f"not a valid staged part: {e}") from e
        check_part(part)
        return part


_DIGEST = re.compile(r"[0-9a-f]{16}")


def where_part(part: StagedPart) -> str:
    return f"staged part of transaction {part.staging_id!r}"


def _is_count(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def check_part(part: StagedPart) -> None:
    """What a part says about its chunks is consistent: CorruptError otherwise.

    Reads nothing; ``check_files`` compares the files with it."""
    where = where_part(part)
    if not isinstance(part.staging_id, str) or not isinstance(part.chunks, tuple):
        raise CorruptError(f"{where} is not a valid staged part")
    total = 0
    for i, chunk in enumerate(part.chunks):
        if not isinstance(chunk, ChunkRef) or not isinstance(chunk.path, str):
            raise CorruptError(f"{where}: chunk {i} is not a valid chunk reference")
        at = f"{where}, chunk {i} ({chunk.path!r})"
        check_data_path(chunk.path, CHUNKS, where)
        if not all(_is_count(n) for n in (chunk.num_samples, chunk.size, chunk.footer_offset)):
            raise CorruptError(f"{at}: sizes and counts must be non-negative integers")
        if not HEADER.size <= chunk.footer_offset <= chunk.size - TRAILER.size:
            raise CorruptError(
                f"{at}: a footer at {chunk.footer_offset} does not fit a file of {chunk.size} bytes"
            )
        if not (_is_count(chunk.crc32) and chunk.crc32 < 1 << 32):
            raise CorruptError(f"{at}: bad crc32 {chunk.crc32!r}")
        if chunk.digest is not None and not (
            isinstance(chunk.digest, str) and _DIGEST.fullmatch(chunk.digest)
        ):
            raise CorruptError(f"{at}: bad digest {chunk.digest!r}")
        if chunk.field_files or chunk.hidden:  # only add_fields makes these, never a writer
            raise CorruptError(f"{at}: a staged chunk has no field files or hidden columns")
        total += chunk.num_samples
    if not _is_count(part.num_samples) or part.num_samples != total:
        raise CorruptError(
            f"{where} says it holds {part.num_samples!r} samples, its chunks hold {total}"
        )
    paths = [c.path for c in part.chunks]
    if len(set(paths)) != len(paths):
        raise CorruptError(f"{where} names a chunk twice")
