"""The API's values: plain frozen dataclasses made from the on-disk structs, so that a change
of the format is not a change of the API."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import FieldNotFoundError
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


@dataclass(frozen=True)
class FieldSchema:
    """One field of a version: its type and which samples have it."""

    name: str
    #: The type of its first value: "int", "str", "bytes", "ndarray[float32, (2, 2)]", ...
    #: (values of one field may differ in type; this names the first sample's).
    type: str
    count: int  #: how many samples have it
    total: int  #: how many samples the version has
    #: The runs of samples [start, stop) that have it, in order, merged where they touch.
    ranges: tuple[tuple[int, int], ...]
    #: The versions whose appended samples all have it, as ranges [first, last] of the
    #: appending versions in sample order (``Schema.origins``).
    versions: tuple[tuple[int, int], ...] = ()
    #: Appending versions only some of whose samples have it.
    partly: tuple[int, ...] = ()

    @property
    def missing(self) -> int:
        """How many samples lack it."""
        return self.total - self.count

    @property
    def complete(self) -> bool:
        """Whether every sample has it."""
        return self.count == self.total

    def lacking(self, limit: int | None = None) -> list[int]:
        """The samples without it, in order (at most ``limit``)."""
        out: list[int] = []
        at = 0
        for start, stop in (*self.ranges, (self.total, self.total)):
            for index in range(at, start):
                if limit is not None and len(out) >= limit:
                    return out
                out.append(index)
            at = stop
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "count": self.count,
            "missing": self.missing,
            "ranges": [list(r) for r in self.ranges],
            "versions": [list(r) for r in self.versions],
            "partly": list(self.partly),
        }


@dataclass(frozen=True)
class Schema:
    """The fields of one version (``Snapshot.schema()``), by name, in name order."""

    version: int
    num_samples: int
    fields: tuple[FieldSchema, ...]
    #: The runs of samples [start, stop) with the version that appended them (None where the
    #: history is expired and gone), in sample order.
    origins: tuple[tuple[int, int, int | None], ...] = ()

    def __getitem__(self, name: str) -> FieldSchema:
        for field in self.fields:
            if field.name == name:
                return field
        raise FieldNotFoundError(
            f"no sample of version {self.version} has the field {name!r}; its fields: "
            f"{', '.join(repr(f.name) for f in self.fields) or 'none'}"
        )

    def __contains__(self, name: object) -> bool:
        return any(field.name == name for field in self.fields)

    def __iter__(self) -> Iterator[FieldSchema]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    @property
    def names(self) -> list[str]:
        return [field.name for field in self.fields]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "samples": self.num_samples,
            "fields": [field.to_dict() for field in self.fields],
            "origins": [list(r) for r in self.origins],
        }
