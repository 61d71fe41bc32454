"""The API's values: plain frozen dataclasses made from the on-disk structs, so that a change
of the format is not a change of the API."""

from __future__ import annotations

from dataclasses import dataclass

from ..format.manifest import ChunkRef, StoreConfig


@dataclass(frozen=True)
class Config:
    """A store's settings, fixed when it is created."""

    chunk_bytes: int  #: the size chunks fill up to
    block_bytes: int  #: the unit of random access and compression inside a chunk
    compression: str | None  #: "zstd" or None
    compression_level: int

    @classmethod
    def from_struct(cls, config: StoreConfig) -> Config:
        return cls(
            config.chunk_bytes, config.block_bytes, config.compression, config.compression_level
        )


@dataclass(frozen=True)
class FieldFileInfo:
    """A file of columns added to a chunk by ``add_fields``."""

    path: str
    size: int
    columns: tuple[str, ...]  #: the columns it holds (some may be hidden by later drops)


@dataclass(frozen=True)
class ChunkInfo:
    """One chunk of a version: its file, its samples, and its field files."""

    path: str
    num_samples: int
    size: int  #: bytes of the chunk file alone
    field_files: tuple[FieldFileInfo, ...] = ()

    @property
    def total_size(self) -> int:
        """Bytes of the chunk file and its field files."""
        return self.size + sum(f.size for f in self.field_files)

    @classmethod
    def from_ref(cls, chunk: ChunkRef) -> ChunkInfo:
        return cls(
            chunk.path,
            chunk.num_samples,
            chunk.size,
            tuple(FieldFileInfo(f.path, f.size, tuple(f.columns)) for f in chunk.field_files),
        )
