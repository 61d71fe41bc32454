"""Take a snapshot out: Parquet, LitData and MosaicML MDS folders their own readers open.

``Snapshot.export_parquet``, ``export_litdata`` and ``export_mds`` call these. Each writes the
pinned version's samples, in order, to a new or empty folder through txstore's storage
layer (a local path or any supported object store); the index (LitData's and MDS's
``index.json``) is written last, so a folder an export was stopped in is never read as
whole. The peers' formats are written by the pure functions of ``format/peer_*.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import AlreadyExistsError, EncodeError
from ..format import peer_litdata, peer_mds
from ..format.units import parse_size
from ..storage import Storage, open_storage
from .progress import Progress, ProgressArg, Stage

if TYPE_CHECKING:
    from .snapshot import Snapshot


@dataclass(frozen=True)
class Export:
    """What an export wrote: where, how many samples, and which files of how many bytes."""

    uri: str
    format: str
    version: int
    num_samples: int
    files: list[str] = field(default_factory=list)
    bytes: int = 0


def _target(dest: str | os.PathLike[str], options: dict[str, Any] | None) -> Storage:
    storage = open_storage(dest, options)
    for info in storage.list(""):
        raise AlreadyExistsError(
            f"{storage.uri} holds files already (such as {info.key!r}): an export writes to a "
            "new or empty folder"
        )
    return storage


class _Writer:
    """Files written so far, and the samples counted into the progress stage."""

    def __init__(self, storage: Storage, snap: Snapshot, what: str, stage: Stage) -> None:
        self.storage, self.snap, self.what, self.stage = storage, snap, what, stage
        self.sizes: dict[str, int] = {}

    def write(self, key: str, data: bytes) -> None:
        self.storage.write(key, data)
        self.sizes[key] = len(data)

    def result(self, num_samples: int) -> Export:
        files, size = list(self.sizes), sum(self.sizes.values())
        return Export(self.storage.uri, self.what, self.snap.version, num_samples, files, size)


def _samples(snap: Snapshot, stage: Stage) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, sample in enumerate(snap):
        yield number, sample
        stage.update(1)


class _Widen(Exception):
    """A field with values of two encodings that the peer's ``json`` both holds (None and
    floats, say): the export starts again, writing that field as ``json``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _typed(
    snap: Snapshot,
    stage: Stage,
    kind: Callable[[Any], str | None],
    in_json: frozenset[str],
    what: str,
    as_json: frozenset[str],
) -> Iterator[tuple[int, list[str], list[str], dict[str, Any]]]:
    """Each sample with the fields and the peer's encoding of each, as the first sample set
    them (``json`` for the fields of ``as_json``, whose values the encodings ``in_json``
    are); a sample whose fields or value types differ is refused, naming it, unless ``json``
    holds both (``_Widen``)."""

    def kind_of(name: str, value: Any) -> str | None:
        if name in as_json:  # as the peer writes a value inside a json leaf, or not at all
            return "json" if kind([value]) == "json" else None
        return kind(value)

    names: list[str] | None = None
    kinds: list[str] = []
    for number, sample in _samples(snap, stage):
        if names is None:
            names = list(sample)
            kinds = []
            for name in names:
                found = kind_of(name, sample[name])
                if found is None:
                    raise _cannot(what, number, name, sample[name])
                kinds.append(found)
        elif sample.keys() != set(names):
            raise EncodeError(
                f"sample {number} has fields {sorted(sample)}, sample 0 {sorted(names)}: {what} "
                "needs every sample to have the same fields"
            )
        else:
            for name, expected in zip(names, kinds, strict=True):
                found = kind_of(name, sample[name])
                if found != expected:
                    if found is None:
                        raise _cannot(what, number, name, sample[name])
                    if expected in in_json and found in in_json:  # never one of as_json's
                        raise _Widen(name)
                    raise EncodeError(
                        f"sample {number}, field {name!r}: a value written as {found!r} where "
                        f"sample 0's is {expected!r}: {what} needs one type per field"
                    )
        yield number, names, kinds, sample


def _widening(storage: Storage, write: Callable[[frozenset[str]], Export]) -> Export:
    """``write`` the export, again with a field as ``json`` each time one turns out to need
    it (what the first attempts wrote deleted first: the folder was empty)."""
    as_json: frozenset[str] = frozenset()
    while True:
        try:
            return write(as_json)
        except _Widen as e:
            for info in list(storage.list("")):
                storage.delete(info.key)
            as_json |= {e.name}


def _cannot(what: str, number: int, name: str, value: Any) -> EncodeError:
    return EncodeError(
        f"sample {number}, field {name!r}: {type(value).__name__} {value!r:.80} has no {what} "
        "encoding that reads back equal"
    )


def export_litdata(
    snap: Snapshot,
    dest: str | os.PathLike[str],
    *,
    chunk_bytes: int | str = "64MB",
    storage_options: dict[str, Any] | None = None,
    progress: ProgressArg = True,
) -> Export:
    """Write the snapshot as a LitData dataset (``litdata.StreamingDataset(dest)`` reads it):
    uncompressed chunks of about ``chunk_bytes`` and ``index.json``. A sample is a dict of
    one leaf per field: bool, int, float, str and bytes as LitData's serializers of those,
    numpy arrays as ``numpy``, torch tensors as ``tensor``, None, lists and dicts as its
    ``json`` leaves. Every sample needs the fields of the first, each of one type (or of
    types ``json`` holds: that field is then written as ``json``)."""
    storage = _target(dest, storage_options)
    limit = parse_size(chunk_bytes)
    return _widening(storage, lambda as_json: _litdata(snap, storage, limit, progress, as_json))


def _litdata(
    snap: Snapshot, storage: Storage, limit: int, progress: ProgressArg, as_json: frozenset[str]
) -> Export:
    with Progress.of(progress).stage("export litdata", len(snap), "samples") as stage:
        out = _Writer(storage, snap, "litdata", stage)
        chunks: list[dict[str, Any]] = []
        items: list[bytes] = []
        held = 0
        names: list[str] = []
        formats: list[str] = []

        def flush() -> None:
            nonlocal items, held
            name = f"chunk-0-{len(chunks)}.bin"
            data = peer_litdata.encode_chunk(items)
            out.write(name, data)
            chunks.append(
                {"chunk_bytes": len(data), "chunk_size": len(items), "dim": None, "filename": name}
            )
            items, held = [], 0

        count = 0
        for _number, names, formats, sample in _typed(
            snap, stage, peer_litdata.format_of, peer_litdata.IN_JSON, "LitData", as_json
        ):
            item = peer_litdata.encode_item(formats, [sample[n] for n in names])
            if items and held + len(item) > limit:
                flush()
            items.append(item)
            held += len(item)
            count += 1
        if items:
            flush()
        out.write("index.json", peer_litdata.index_json(chunks, formats, names, limit))
    return out.result(count)


def export_mds(
    snap: Snapshot,
    dest: str | os.PathLike[str],
    *,
    size_limit: int | str = 1 << 26,
    storage_options: dict[str, Any] | None = None,
    progress: ProgressArg = True,
) -> Export:
    """Write the snapshot as an MDS dataset (``streaming.StreamingDataset(local=dest)``
    reads it): uncompressed shards of at most ``size_limit`` bytes and ``index.json``.
    Columns: int as ``int``, float as ``float64``, str, bytes, numpy arrays (and torch
    tensors, which MDS has no encoding for: they read back as numpy arrays) as ``ndarray``,
    numpy scalars as their dtype's encoding, bool, None, lists and dicts as ``json``.
    Every sample needs the fields of the first, each of one type (or of
    types ``json`` holds: that field is then written as ``json``)."""
    storage = _target(dest, storage_options)
    limit = parse_size(size_limit)
    return _widening(storage, lambda as_json: _mds(snap, storage, limit, progress, as_json))


def _mds(
    snap: Snapshot, storage: Storage, limit: int, progress: ProgressArg, as_json: frozenset[str]
) -> Export:
    with Progress.of(progress).stage("export mds", len(snap), "samples") as stage:
        out = _Writer(storage, snap, "mds", stage)
        shards: list[dict[str, Any]] = []
        pending: list[bytes] = []
        held = 0
        config: dict[str, Any] | None = None

        def flush() -> None:
            nonlocal pending, held
            assert config is not None
            name = f"shard.{len(shards):05d}.mds"
            data = peer_mds.encode_shard(config, pending)
            out.write(name, data)
            raw = {"basename": name, "bytes": len(data), "hashes": {}}
            shards.append({**config, "raw_data": raw, "samples": len(pending), "zip_data": None})
            pending, held = [], 0

        count = 0
        for _number, names, kinds, sample in _typed(
            snap, stage, peer_mds.encoding_of, peer_mds.IN_JSON, "MDS", as_json
        ):
            if config is None:
                order = sorted(range(len(names)), key=lambda i: names[i])
                config = peer_mds.shard_config(
                    [names[i] for i in order], [kinds[i] for i in order], limit
                )
            data = peer_mds.encode_sample(config, sample)
            if pending and held + len(data) + 4 > limit:
                flush()
            pending.append(data)
            held += len(data) + 4
            count += 1
        if pending:
            flush()
        out.write("index.json", peer_mds.index_json(shards))
    return out.result(count)


def export_parquet(
    snap: Snapshot,
    dest: str | os.PathLike[str],
    *,
    fields: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: ProgressArg = True,
) -> Export:
    """Write the snapshot as Parquet files, one per chunk (``part-00000.parquet`` ...), all
    of one schema (``pyarrow.dataset.dataset(dest)`` reads them as one table): columns and
    types as ``Snapshot.to_arrow`` gives them (docs/arrow.md). ``fields``: only those."""
    from ..format import arrow

    storage = _target(dest, storage_options)
    chunks = snap.chunk_refs()
    with Progress.of(progress).stage("export parquet", len(chunks), "chunks") as stage:
        out = _Writer(storage, snap, "parquet", stage)
        schemas = []
        for number, table in enumerate(snap.chunk_tables(fields)):
            out.write(f"part-{number:05d}.parquet", arrow.parquet_bytes(table))
            schemas.append(table.schema)
            stage.update(1)
        # A chunk where a field is all nulls (or absent) types it differently: rewrite those
        # files in the schema of the whole, so that readers see one table.
        whole = arrow.unify(schemas) if schemas else None
        differ = {n for n, s in enumerate(schemas) if not s.equals(whole)}
        if differ:
            for number, table in enumerate(snap.chunk_tables(fields)):
                if number in differ:
                    data = arrow.parquet_bytes(arrow.cast(table, whole))
                    out.write(f"part-{number:05d}.parquet", data)
    return out.result(len(snap))


__all__ = ["Export", "export_litdata", "export_mds", "export_parquet"]
