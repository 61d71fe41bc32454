"""Bring a dataset in: LitData, MosaicML MDS and Parquet into a txstore store, one commit.

Each importer lists the source's files (through txstore's storage layer: a local folder,
``s3://``, ``gs://``, ``az://`` or ``memory://``), then hands them to ``optimize`` as its
inputs: the files are read and converted in parallel worker processes, with a progress bar
counting files, and the samples land as ONE commit with ``optimize``'s ``mode`` (None: a new
store; "append"; "overwrite"). A failure commits nothing.

The peers' files are parsed by pure functions (``txstore/format/peer_litdata.py``,
``peer_mds.py``; Parquet through ``pyarrow.dataset`` in ``format/arrow/files.py``): neither LitData
nor MosaicML Streaming is needed, and nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import os
from collections.abc import Iterable
from typing import Any

from ..errors import NotFoundError, StorageError
from ..format import peer_litdata, peer_mds
from ..format.columnar import ColumnBatch
from ..format.manifest import DEFAULT_CHUNK_BYTES
from ..format.units import parse_size
from ..storage import Storage, open_storage
from ..store.core import Commit
from ..store.ingest import READS_AHEAD, optimize
from ..store.progress import ProgressArg

_opened: dict[tuple[int, str], Storage] = {}


def _source(uri: str, options: dict[str, Any] | None) -> Storage:
    """The source storage in this process: a forked worker opens its own (a client made
    before the fork may hold connections and threads that did not come along)."""
    key = (os.getpid(), uri)
    storage = _opened.get(key)
    if storage is None:
        storage = _opened[key] = open_storage(uri, options)
    return storage


def _reading_ahead(reader: Any, source: Storage, workers: int) -> Any:
    """``reader``, marked for ``optimize`` to call for the next input while the last one's
    samples are written (``ingest.READS_AHEAD``) when its source is remote (that hides a
    round trip and a transfer), or when a core is left for it: each of ``workers`` keeps two
    busy (``_workers``), and a third thread per worker only contends for them
    (import_parquet of 2 KiB values from local disk, 2 cores: 1 worker 0.50-0.52 s reading
    ahead against 0.55-0.59; 2 workers 0.46-0.49 against 0.43-0.45)."""
    setattr(reader, READS_AHEAD, source.is_remote or 2 * workers <= _cores())
    return reader


def _cores() -> int:
    """The cores this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _read(storage: Storage, key: str) -> bytes:
    try:
        return storage.read(key)
    except NotFoundError:
        raise NotFoundError(f"{storage.uri}/{key} does not exist") from None


def _whole(storage: Storage, key: str) -> bytes | memoryview:
    """The whole file, in memory that is never reused: a local file mapped (no copy and no
    fresh memory, where reading a 64 MiB file into fresh memory cost more than converting
    it), another backend's bytes."""
    try:
        return storage.read_buffer(key)
    except NotFoundError:
        raise NotFoundError(f"{storage.uri}/{key} does not exist") from None


def _workers(
    num_workers: int | None,
    inputs: int,
    source_bytes: int,
    chunk_bytes: int | str,
    dest: str,
    options: Any,
) -> int:
    """Worker processes by default: one per two cores (a worker keeps two busy: it encodes
    on one thread while another writes and checksums its chunks, and more workers than that
    only contend for the cores), but no more than there are chunks' worth of source bytes,
    since each worker ends with a part-filled chunk the parent may re-pack (for a small
    dataset that costs more than the parallel reads save)."""
    if num_workers is not None:
        return max(1, num_workers)
    if not open_storage(dest, options).shared_across_processes:
        return 1  # a memory store lives in this process
    chunks_worth = max(1, source_bytes // max(1, parse_size(chunk_bytes)))
    return max(1, min(_cores() // 2, inputs, chunks_worth))


def _bytes(entry: Any, *keys: str) -> int:
    """A size in a source's index entry (``entry[keys[0]][keys[1]]...``), where it may be
    absent or malformed: then 0."""
    for key in keys:
        entry = entry.get(key) if isinstance(entry, dict) else None
    return entry if isinstance(entry, int) and entry > 0 else 0


def _uri(src: str | os.PathLike[str] | Storage) -> tuple[str, dict[str, Any] | None]:
    if isinstance(src, Storage):
        return src.uri, dict(src.storage_options) or None
    return os.fspath(src), None


class _File:
    """An input of an importer's ``optimize``: a file and its index entry, shown by name
    (an error names the input it failed on)."""

    def __init__(self, name: str, entry: Any) -> None:
        self.name, self.entry = name, entry

    def __repr__(self) -> str:
        return self.name


def _stable(batches: list[ColumnBatch]) -> list[ColumnBatch]:
    """Batches over a source file's bytes, which stay as they are until they are written
    (``_whole`` never reuses memory): the writer may copy them straight into its chunks."""
    return [dataclasses.replace(b, stable=True) for b in batches]


class _LitDataChunk:
    """Reads one LitData chunk file into samples (the function ``optimize`` maps): rows
    LitData stored as Arrow, and items of plain values and files in its own layout, as
    column batches over the file's bytes; others as dicts."""

    def __init__(self, uri: str, options: dict[str, Any] | None, config: dict[str, Any]) -> None:
        self.uri, self.options = uri, options
        self.layout = peer_litdata.Layout(config, f"{uri}/index.json")

    def __call__(self, file: _File) -> list[Any]:
        storage = _source(self.uri, self.options)
        name, chunk = file.name, file.entry
        where = f"{self.uri}/{name}"
        raw = _whole(storage, name)
        data = peer_litdata.classic_chunk(raw, self.layout.compression, where)
        count = int(chunk["chunk_size"])
        batches = self.layout.batches(data, count, where)
        if batches is not None:
            return _stable(batches)
        batch = self.layout.classic_batch(data, count)
        if batch is not None:
            return _stable([batch])
        return list(self.layout.samples(data, count, where))


def import_litdata(
    src: str | os.PathLike[str] | Storage,
    dest: str,
    *,
    mode: str | None = None,
    num_workers: int | None = None,
    chunk_bytes: int | str = DEFAULT_CHUNK_BYTES,
    compression: str | None = "zstd",
    storage_options: dict[str, Any] | None = None,
    src_storage_options: dict[str, Any] | None = None,
    message: str | None = None,
    txn_id: str | None = None,
    progress: ProgressArg = True,
) -> Commit:
    """Import the LitData dataset at ``src`` (a folder ``litdata.optimize`` wrote: its
    ``index.json`` and chunks) into the store at ``dest`` as one commit, every sample in
    the dataset's order.

    Values are those LitData's reader gives (ints, floats, str, bytes, bools, numpy arrays,
    torch tensors, lists and dicts), but images stay the bytes LitData stored (``jpeg``,
    ``image:png`` ...), never decoded; raw ``pil`` images become numpy arrays of their
    pixels. A sample that is not a dict becomes one: a tuple's items as fields "0", "1" ...,
    a lone value as field "value". A pickled leaf is refused, naming it.
    ``mode``, ``chunk_bytes``, ``compression``, ``message``, ``txn_id``, ``progress``: as
    ``optimize``'s. ``num_workers``: processes reading chunks (default: one per two cores).
    ``storage_options`` are ``dest``'s, ``src_storage_options`` the source's.
    """
    uri, options = _uri(src)
    options = src_storage_options or options
    storage = _source(uri, options)
    config, chunks = peer_litdata.parse_index(_read(storage, "index.json"), f"{uri}/index.json")
    workers = _workers(
        num_workers,
        len(chunks),
        sum(_bytes(c, "chunk_bytes") for c in chunks),
        chunk_bytes,
        dest,
        storage_options,
    )
    return optimize(
        _reading_ahead(_LitDataChunk(uri, options, config), storage, workers),
        [_File(str(c["filename"]), c) for c in chunks],
        dest,
        num_workers=workers,
        chunk_bytes=chunk_bytes,
        mode=mode,
        compression=compression,
        storage_options=storage_options,
        message=message or f"import litdata {uri} ({len(chunks):,} chunks)",
        txn_id=txn_id,
        progress=progress,
        _stage=("import litdata", "chunks"),
    )


class _MdsShard:
    """Reads one MDS shard file into samples (the function ``optimize`` maps): a shard of
    ints, bytes and strs as one column batch over the file's bytes, others as dicts."""

    def __init__(self, uri: str, options: dict[str, Any] | None) -> None:
        self.uri, self.options = uri, options

    def __call__(self, file: _File) -> list[Any]:
        storage = _source(self.uri, self.options)
        shard = file.entry
        name, compression = peer_mds.shard_file(shard)
        where = f"{self.uri}/{name}"
        data = _whole(storage, name)
        if compression is not None:
            data = peer_mds.decompress(data, compression, where)
        batch = peer_mds.shard_batch(shard, data, where)
        if batch is not None:
            return _stable([batch])
        return list(peer_mds.shard_samples(shard, data, where))


def import_mds(
    src: str | os.PathLike[str] | Storage,
    dest: str,
    *,
    mode: str | None = None,
    num_workers: int | None = None,
    chunk_bytes: int | str = DEFAULT_CHUNK_BYTES,
    compression: str | None = "zstd",
    storage_options: dict[str, Any] | None = None,
    src_storage_options: dict[str, Any] | None = None,
    message: str | None = None,
    txn_id: str | None = None,
    progress: ProgressArg = True,
) -> Commit:
    """Import the MosaicML Streaming (MDS) dataset at ``src`` (a folder ``MDSWriter`` or
    ``merge_index`` wrote) into the store at ``dest`` as one commit, shard by shard in the
    index's order.

    Values are those MDS's reader gives (``int`` as int, ``uint8`` ... ``float64`` as numpy
    scalars of that dtype, ``json`` as its value, ``ndarray`` as numpy arrays, ``str_int``,
    ``str_float``), but ``jpeg`` and ``png`` columns stay their stored bytes, never decoded;
    ``pil`` columns (raw pixels) become numpy arrays of their pixels. ``pkl`` (pickle) and
    ``str_decimal`` columns are refused, naming the column. Shards compressed with zstd, gz
    or bz2 are read. Other arguments: as ``import_litdata``'s.
    """
    uri, options = _uri(src)
    options = src_storage_options or options
    storage = _source(uri, options)
    shards = peer_mds.parse_index(_read(storage, "index.json"), f"{uri}/index.json")
    for number, shard in enumerate(shards):  # refuse a column before anything is read
        for name, encoding in zip(shard["column_names"], shard["column_encodings"], strict=True):
            peer_mds.decoder(encoding, f"{uri}/index.json, shard {number}, column {name!r}")
    workers = _workers(
        num_workers,
        len(shards),
        sum(_bytes(s, "raw_data", "bytes") for s in shards),
        chunk_bytes,
        dest,
        storage_options,
    )
    return optimize(
        _reading_ahead(_MdsShard(uri, options), storage, workers),
        [_File(peer_mds.shard_file(s)[0], s) for s in shards],
        dest,
        num_workers=workers,
        chunk_bytes=chunk_bytes,
        mode=mode,
        compression=compression,
        storage_options=storage_options,
        message=message or f"import mds {uri} ({len(shards):,} shards)",
        txn_id=txn_id,
        progress=progress,
        _stage=("import mds", "shards"),
    )


# -- Parquet ---------------------------------------------------------------------------


class RangedFile(io.RawIOBase):
    """A read-only, seekable file over one object of a storage: each read is a ranged read,
    so a Parquet reader fetches the footer and the pages it needs, never the whole file."""

    def __init__(self, storage: Storage, key: str, size: int) -> None:
        super().__init__()
        self.storage, self.key, self.size, self.position = storage, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self.size, self.position + len(view))
        if end <= self.position:
            return 0
        data = self.storage.read_range(self.key, self.position, end)
        view[: len(data)] = data
        self.position += len(data)
        return len(data)


def _glob_root(pattern: str) -> tuple[str, str | None]:
    """A path or URI split into the folder to list and the pattern under it (None: not a
    pattern)."""
    scheme, sep, rest = pattern.rpartition("://")
    head = f"{scheme}{sep}" if sep else ""
    parts = (rest if sep else pattern).split("/")
    for i, part in enumerate(parts):
        if any(c in part for c in "*?["):
            root = "/".join(parts[:i]) or ("" if head else ".")
            return head + root, "/".join(parts[i:])
    return pattern, None


def parquet_files(
    paths_or_glob: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    storage_options: dict[str, Any] | None = None,
) -> list[tuple[str, str, int]]:
    """The Parquet files named: (folder URI, key under it, size), in order: each path as
    given; a glob pattern's matches, and a folder's ``*.parquet`` files, sorted by name."""
    given = [paths_or_glob] if isinstance(paths_or_glob, str | os.PathLike) else list(paths_or_glob)
    found: list[tuple[str, str, int]] = []
    for item in given:
        text = os.fspath(item)
        root, pattern = _glob_root(text.rstrip("/"))
        if pattern is not None:
            storage = _source(root, storage_options)
            matches = sorted(
                (f.key, f.size) for f in storage.list("") if fnmatch.fnmatchcase(f.key, pattern)
            )
            if not matches:
                raise NotFoundError(f"no file matches {text!r}")
            found += [(root, key, size) for key, size in matches]
            continue
        parent, _, name = root.rpartition("/")
        try:
            files = list(_source(parent or ".", storage_options).list(name)) if name else []
        except StorageError:
            files = []
        exact = [f for f in files if f.key == name]
        if exact:
            found.append((parent or ".", name, exact[0].size))
            continue
        storage = _source(root, storage_options)
        inside = sorted((f.key, f.size) for f in storage.list("") if f.key.endswith(".parquet"))
        if not inside:
            raise NotFoundError(f"{text!r} is neither a Parquet file nor a folder holding some")
        found += [(root, key, size) for key, size in inside]
    return found


def _parquet_file(storage: Storage, key: str, size: int) -> str | RangedFile:
    """A Parquet file to read: its path where it is a file on this machine (Arrow reads it
    itself), else ranged reads through the storage."""
    if storage.local_path is not None:
        return os.path.join(storage.local_path, *key.split("/"))
    return RangedFile(storage, key, size)


class _ParquetRowGroup:
    """Reads one row group of a Parquet file as column batches (the function ``optimize``
    maps), over the table Arrow read, which nothing changes."""

    def __init__(self, options: dict[str, Any] | None, columns: list[str] | None) -> None:
        self.options, self.columns = options, columns

    def __call__(self, file: _File) -> Any:
        from ..format import arrow

        root, key, size, number = file.entry
        source = _parquet_file(_source(root, self.options), key, size)
        table = arrow.parquet_row_group(source, number, self.columns, f"{root}/{key}")
        return _stable(list(arrow.batches(table)))


def import_parquet(
    paths_or_glob: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    dest: str,
    *,
    columns: list[str] | None = None,
    mode: str | None = None,
    num_workers: int | None = None,
    chunk_bytes: int | str = DEFAULT_CHUNK_BYTES,
    compression: str | None = "zstd",
    storage_options: dict[str, Any] | None = None,
    src_storage_options: dict[str, Any] | None = None,
    message: str | None = None,
    txn_id: str | None = None,
    progress: ProgressArg = True,
) -> Commit:
    """Import Parquet files into the store at ``dest`` as one commit: a row is a sample, a
    column a field (Arrow types map as ``store.append`` of a table maps them, docs/arrow.md).

    ``paths_or_glob``: a file, a folder (its ``*.parquet`` files, sorted), a glob pattern
    (``s3://bucket/data/part-*.parquet``) or a list of these; files in that order, each
    file's row groups in order. ``columns``: import only those. Read through
    ``pyarrow.dataset`` with ranged reads, a row group per task across ``num_workers``
    processes (needs the ``arrow`` extra). Other arguments: as ``import_litdata``'s.
    """
    from ..format import arrow

    files = parquet_files(paths_or_glob, src_storage_options)
    groups: list[_File] = []
    for root, key, size in files:
        file = _parquet_file(_source(root, src_storage_options), key, size)
        count = arrow.parquet_row_groups(file, f"{root}/{key}")
        groups += [_File(f"{key}, row group {n}", (root, key, size, n)) for n in range(count)]
    workers = _workers(
        num_workers,
        len(groups),
        sum(size for _, _, size in files),
        chunk_bytes,
        dest,
        storage_options,
    )
    reader = _ParquetRowGroup(src_storage_options, columns)
    if files:  # (one file system for all)
        reader = _reading_ahead(reader, _source(files[0][0], src_storage_options), workers)
    return optimize(
        reader,
        groups,
        dest,
        num_workers=workers,
        chunk_bytes=chunk_bytes,
        mode=mode,
        compression=compression,
        storage_options=storage_options,
        message=message or f"import parquet ({len(files):,} files)",
        txn_id=txn_id,
        progress=progress,
        _stage=("import parquet", "row groups"),
    )


__all__ = ["RangedFile", "import_litdata", "import_mds", "import_parquet", "parquet_files"]
