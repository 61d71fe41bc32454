"""Parquet and Arrow IPC files, read and written through pyarrow (the importers', the
exporters' and LitData's Arrow chunks)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ...errors import CorruptError, EncodeError


def parquet_row_groups(file: Any, where: str) -> int:
    """How many row groups a Parquet file (a local path or a seekable binary file object)
    has."""
    return len(_parquet_fragment(file, where).split_by_row_group())


def parquet_row_group(file: Any, number: int, columns: list[str] | None, where: str) -> pa.Table:
    """Row group ``number`` of a Parquet file as a table (``columns``: only those),
    read through ``pyarrow.dataset``: only that group's pages (of those columns) are read."""
    fragment = _parquet_fragment(file, where).split_by_row_group()[number]
    try:
        return fragment.to_table(columns=columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptError(f"{where}, row group {number}: {e}") from e
    except KeyError as e:
        raise EncodeError(f"{where}: no column {e} (columns=...)") from e


def _parquet_fragment(file: Any, where: str) -> Any:
    """``file``: a local path (read by Arrow's own file system, several times faster than
    through a Python file object) or a seekable binary file object."""
    import pyarrow.dataset as ds
    from pyarrow import fs as arrow_fs

    try:
        if isinstance(file, str):
            local = arrow_fs.LocalFileSystem(use_mmap=True)
            fragment = ds.ParquetFileFormat().make_fragment(file, filesystem=local)
        else:
            fragment = ds.ParquetFileFormat().make_fragment(pa.PythonFile(file, mode="r"))
        fragment.ensure_complete_metadata()
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptError(f"{where}: not a Parquet file: {e}") from e
    return fragment


def ipc_table(data: bytes | memoryview, where: str) -> pa.Table:
    """An Arrow IPC file (or stream), checked whole: its buffers are views of ``data``."""
    source = pa.py_buffer(data)
    try:
        if bytes(data[:6]) == b"ARROW1":
            table = pa.ipc.open_file(source).read_all()
        else:
            table = pa.ipc.open_stream(source).read_all()
        # Offsets within their buffers, strings UTF-8: to_pylist and the column encoders
        # trust both (a bad offset raised SystemError, a bad string UnicodeDecodeError).
        table.validate(full=True)
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptError(f"{where}: a bad Arrow IPC block: {e}") from e
    return table


def ipc_rows(data: bytes | memoryview, where: str) -> list[dict[str, Any]]:
    """The rows of an Arrow IPC file (or stream) as dicts, as ``to_pylist`` gives them."""
    rows: list[dict[str, Any]] = ipc_table(data, where).to_pylist()
    return rows


def parquet_bytes(table: Any) -> bytes:
    """A table as one Parquet file's bytes."""
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    out: bytes = sink.getvalue().to_pybytes()
    return out
