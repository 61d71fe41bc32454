"""Ray Data both ways: txstore's datasink and datasource against the row-by-row ones they
replaced, on a local Ray, in the same run.

W1 (``{"id": int, "tokens": 2 KiB bytes}``) as a Ray dataset of Arrow blocks (made before
the timer) is written with ``write_datasink`` into a new store, one commit, chunks fsynced
as every txstore write is; the store is then read back with ``read_datasource`` and every
batch consumed (``iter_batches(batch_format="pyarrow")``). Each way is timed for:

- ``txstore``: ``txstore.ray.TxstoreDatasink`` / ``TxstoreDatasource`` (blocks in a column
  at a time, one Arrow block per chunk out);
- ``rows``: the same faces as they were before (txstore ``c262782``, kept below): a write
  task appends each block's rows as dicts, a read task builds each block from the chunk's
  samples as dicts.

- floors: ``ray alone``, a sink that only takes its blocks and a source whose tasks make
  blocks of as many rows and bytes without reading anything; ``disk alone``, the table's
  Arrow buffers written to files and fsynced, outside Ray; ``ray + disk``, a sink that does
  that with the blocks Ray gives it. Both sinks are given as many blocks a task as
  txstore's sink asks (two chunks' worth, 128 MiB; Ray ran such tasks one at a time on 2
  CPUs). A write takes at least the longest of the three, a read at least Ray's: the most
  any face could reach here.

The figure is rows/s, and txstore's as a multiple of the row-by-row faces' (target: at
least 3x both ways), with the floor's beside it. Ray runs locally with 2 CPUs
(``ray.init(num_cpus=2)``); every face gets the same blocks and the same parallelism.

    .tox/py/bin/python bench/bench_ray.py [--quick] [--repeat N] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from txbench.output import finish_report, new_report
from txbench.system import (
    default_workdir,
    fsync_tree,
    machine_info,
    print_machine,
    write_table_bytes,
)
from txbench.workloads import CHUNK_BYTES, WORKLOADS, make_samples, scaled

import txstore

# -- the row-by-row faces, as txstore had them before blocks went in and out as Arrow -------


def _row_faces() -> tuple[type, type]:
    from ray.data import Datasink, Datasource, ReadTask
    from ray.data.block import Block, BlockAccessor, BlockMetadata, BlockType

    from txstore.storage import open_storage
    from txstore.store.core import open_or_create
    from txstore.store.snapshot import ChunkReader
    from txstore.store.staging import StagedPart, StagedWriter, TransactionHandle

    def plain(value: Any) -> Any:
        item = getattr(value, "item", None)
        if item is not None and getattr(value, "ndim", None) == 0:
            return item()
        return value

    def rows_of(blocks: Iterable[Block]) -> Iterator[dict[str, Any]]:
        for block in blocks:
            rows: Iterable[Any] = BlockAccessor.for_block(block).iter_rows(public_row_format=True)
            for row in rows:
                yield {key: plain(value) for key, value in row.items()}

    def block_of(samples: Iterable[dict[str, Any]]) -> Block:
        rows = list(samples)
        keys = list(dict.fromkeys(k for row in rows for k in row))
        columns = {k: [row.get(k) for row in rows] for k in keys}
        return BlockAccessor.batch_to_block(columns, block_type=BlockType.ARROW)

    class RowsDatasink(Datasink[str]):
        def __init__(self, uri: str) -> None:
            store = open_or_create(uri)
            self._txn = store.transaction()
            self._handle = self._txn.handle.to_json()

        def __getstate__(self) -> dict[str, Any]:
            return {**self.__dict__, "_txn": None}

        def write(self, blocks: Iterable[Block], ctx: Any) -> str:
            writer = StagedWriter(TransactionHandle.from_json(self._handle))
            writer.write(rows_of(blocks))
            result: str = writer.finish().to_json().decode()
            return result

        def on_write_complete(self, write_result: Any) -> None:
            for part in write_result.write_returns:
                self._txn.add(StagedPart.from_json(part))
            self._txn.commit()

    class RowsDatasource(Datasource):
        def __init__(self, snapshot: Any) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self._snapshot = snapshot

        def estimate_inmemory_data_size(self) -> int:
            return sum(c.size for c in self._snapshot.chunk_refs())

        def get_read_tasks(
            self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
        ) -> list[ReadTask]:
            chunks = self._snapshot.chunk_refs()
            groups = max(1, min(parallelism, len(chunks)))
            uri, version = self._snapshot.storage.uri, self._snapshot.version
            tasks = []
            for g in range(groups):
                mine = chunks[g * len(chunks) // groups : (g + 1) * len(chunks) // groups]

                def read(mine: list[Any] = mine) -> Iterator[Block]:
                    reader = ChunkReader(open_storage(uri))
                    for chunk in mine:
                        fetched = reader.fetch(chunk, version, None)
                        yield block_of(reader.samples(fetched, chunk, version))

                meta = BlockMetadata(
                    num_rows=sum(c.num_samples for c in mine),
                    size_bytes=sum(c.size for c in mine),
                    input_files=None,
                    exec_stats=None,
                )
                tasks.append(ReadTask(read, meta))
            return tasks

    return RowsDatasink, RowsDatasource


def _floor_faces(payload: int) -> tuple[type, type, type]:
    """What Ray itself costs: a sink that takes its blocks and stores nothing, one that
    writes their bytes durably and nothing else, and a source whose tasks yield blocks of as
    many rows and bytes, made without reading anything."""
    import numpy as np
    import pyarrow as pa
    from ray.data import Datasink, Datasource, ReadTask
    from ray.data.block import Block, BlockAccessor, BlockMetadata

    class NullDatasink(Datasink[int]):
        """Takes its blocks and counts their rows: nothing is stored. Given blocks as
        txstore's sink is (as many bytes a task)."""

        def __init__(self, min_bytes: int) -> None:
            self.min_bytes = min_bytes

        @property
        def min_bytes_per_write(self) -> int:
            return self.min_bytes

        def write(self, blocks: Iterable[Block], ctx: Any) -> int:
            return sum(BlockAccessor.for_block(b).num_rows() for b in blocks)

    class DiskDatasink(Datasink[int]):
        """Writes its blocks' Arrow buffers to new files and fsyncs them, given blocks as
        txstore's sink is (as many bytes a task): the disk's work, as Ray schedules it."""

        def __init__(self, folder: str, min_bytes: int) -> None:
            self.folder, self.min_bytes = folder, min_bytes

        @property
        def min_bytes_per_write(self) -> int:
            return self.min_bytes

        def write(self, blocks: Iterable[Block], ctx: Any) -> int:
            table = pa.concat_tables([BlockAccessor.for_block(b).to_arrow() for b in blocks])
            Path(self.folder).mkdir(parents=True, exist_ok=True)
            out = Path(self.folder) / uuid.uuid4().hex
            write_table_bytes(table, out)
            fsync_tree(out)
            return int(table.num_rows)

    class ZeroDatasource(Datasource):
        def __init__(self, counts: list[int]) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self._counts = counts

        def estimate_inmemory_data_size(self) -> int:
            return sum(self._counts) * payload

        def get_read_tasks(
            self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
        ) -> list[ReadTask]:
            counts = self._counts
            groups = max(1, min(parallelism, len(counts)))
            tasks = []
            for g in range(groups):
                mine = counts[g * len(counts) // groups : (g + 1) * len(counts) // groups]

                def read(mine: list[int] = mine) -> Iterator[Block]:
                    for rows in mine:
                        offsets = np.arange(rows + 1, dtype=np.int32) * payload
                        data = pa.allocate_buffer(rows * payload)
                        tokens = pa.Array.from_buffers(
                            pa.binary(), rows, [None, pa.py_buffer(offsets), data]
                        )
                        yield pa.table({"id": np.arange(rows), "tokens": tokens})

                meta = BlockMetadata(
                    num_rows=sum(mine), size_bytes=sum(mine) * payload, input_files=None,
                    exec_stats=None,
                )  # fmt: skip
                tasks.append(ReadTask(read, meta))
            return tasks

    return NullDatasink, DiskDatasink, ZeroDatasource


# -- the run -------------------------------------------------------------------------------


def _consume(ds: Any) -> int:
    return sum(b.num_rows for b in ds.iter_batches(batch_format="pyarrow", batch_size=None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10x fewer samples, 1 repeat")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=16, help="blocks of the Ray dataset")
    parser.add_argument("--workdir", type=Path, default=default_workdir())
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    started = time.perf_counter()
    import pyarrow as pa
    import ray

    from txstore.interop.ray import TASK_CHUNKS, TxstoreDatasink, TxstoreDatasource

    repeat = 1 if args.quick else args.repeat
    workload = scaled(WORKLOADS[0], args.quick)
    info = machine_info(args.workdir, packages=("txstore", "ray", "pyarrow"))
    print_machine(info)
    print(workload.describe())
    samples = make_samples(workload)
    table = pa.table({"id": [s["id"] for s in samples], "tokens": [s["tokens"] for s in samples]})
    del samples
    rows_sink, rows_source = _row_faces()
    null_sink, disk_sink, zero_source = _floor_faces(workload.payload_size)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ds = ray.data.from_arrow(table).repartition(args.blocks).materialize()
        base = Path(tempfile.mkdtemp(prefix="bench-ray-", dir=args.workdir))
        sinks: dict[str, Callable[[str], Any]] = {
            "txstore": lambda uri: TxstoreDatasink(uri),
            "rows": lambda uri: rows_sink(uri),
            "ray alone": lambda uri: null_sink(TASK_CHUNKS * CHUNK_BYTES),
            "ray + disk": lambda uri: disk_sink(uri, TASK_CHUNKS * CHUNK_BYTES),
        }
        sources: dict[str, Callable[[Any], Any]] = {
            "txstore": lambda snap: TxstoreDatasource(snap),
            "rows": lambda snap: rows_source(snap),
            "ray alone": lambda snap: zero_source([c.num_samples for c in snap.chunk_refs()]),
        }
        # The store every read reads, written once, untimed.
        ds.write_datasink(TxstoreDatasink(str(base / "read")))
        read_snap = txstore.open(str(base / "read")).snapshot()
        # As many bytes written and deleted, untimed: the first timed write, too, finds blocks
        # freed by the write before it (see below).
        write_table_bytes(table, base / "warm-up")
        fsync_tree(base / "warm-up")
        shutil.rmtree(base / "warm-up")
        writes: dict[str, list[float]] = {k: [] for k in sinks}
        disk: list[float] = []
        reads: dict[str, list[float]] = {k: [] for k in sources}
        for turn in range(repeat):
            order = list(sinks) if turn % 2 == 0 else list(reversed(sinks))
            for name in order:
                out = base / f"{name}-{turn}"
                # Every write starts with no dirty pages of the ones before: their write-back
                # would otherwise slow this one's fsyncs by as much again, or not, by chance.
                os.sync()
                start = time.perf_counter()
                ds.write_datasink(sinks[name](str(out)))
                writes[name].append(time.perf_counter() - start)
                if name not in ("ray alone", "ray + disk"):
                    snap = txstore.open(str(out)).snapshot()
                    assert len(snap) == workload.num_samples, (name, len(snap))
                # Deleted at once: each write then finds the blocks the one before freed.
                # On this VM's disk, blocks never written before took 3x as long to write
                # (384 MB of plain writes and fsyncs: 0.18 s, then 0.65 s once past 1 GB of
                # fresh ones), so a write that came after others in a turn lost by chance.
                shutil.rmtree(out, ignore_errors=True)
                print(f"  write {name:8} {writes[name][-1]:7.2f} s")
            for name in (n for n in order if n in sources):
                start = time.perf_counter()
                got = _consume(ray.data.read_datasource(sources[name](read_snap)))
                reads[name].append(time.perf_counter() - start)
                assert got == workload.num_samples, (name, got)
                print(f"  read  {name:8} {reads[name][-1]:7.2f} s")
            out = base / f"disk-{turn}"
            os.sync()
            start = time.perf_counter()
            write_table_bytes(table, out)
            fsync_tree(out)
            disk.append(time.perf_counter() - start)
            shutil.rmtree(out)
        shutil.rmtree(base)
    finally:
        ray.shutdown()
    n = workload.num_samples
    write_s = {k: statistics.median(v) for k, v in writes.items()}
    read_s = {k: statistics.median(v) for k, v in reads.items()}
    write_s["disk alone"] = statistics.median(disk)
    # The most a face could reach: a write takes at least as long as Ray takes to hand the
    # blocks over, as the disk takes to store their bytes, and as both take when Ray hands
    # a chunk's worth to each task (as txstore's sink asks); a read as Ray takes to bring
    # blocks of that size to the driver.
    floor_write = max(write_s["ray alone"], write_s["disk alone"], write_s["ray + disk"])
    ratios = {
        "write rows/s, txstore / rows": write_s["rows"] / write_s["txstore"],
        "read rows/s, txstore / rows": read_s["rows"] / read_s["txstore"],
        "write rows/s, floor / rows": write_s["rows"] / floor_write,
        "read rows/s, floor / rows": read_s["rows"] / read_s["ray alone"],
    }
    print("\nrows/s (median):")
    for way, times in (("write", write_s), ("read", read_s)):
        for name, seconds in times.items():
            print(f"  {way:5} {name:8} {n / seconds:12,.0f} rows/s")
    for name, value in ratios.items():
        met = "met" if value >= 3 else "NOT MET"
        verdict = "" if "floor" in name else f"  (target >= 3: {met})"
        print(f"  {name:34} {value:6.2f}{verdict}")
    report = new_report(
        "bench_ray", info, args.quick, workload=workload.name, repeat=repeat, rows=n,
        blocks=args.blocks, write_s=write_s, read_s=read_s, write_repeats=writes,
        read_repeats=reads, ratios=ratios, cpus=os.cpu_count(),
    )  # fmt: skip
    finish_report(report, Path(args.json) if args.json else None, started)


if __name__ == "__main__":
    main()
