"""Arrow in and out: txstore's columnar append and reads against its dict path and Lance.

Same run, same samples (W1: ``{"id": int, "tokens": 2 KiB bytes}``), round robin:

- write: txstore ``append`` of record batches, txstore ``append`` of dicts (a generator),
  Lance ``write_dataset`` of the same table (file format 2.0 and its default); the Python to
  Arrow conversion is done before timing for both Arrow writers; every total includes an
  fsync of the files each left (Lance does not fsync itself);
- scan: txstore ``snapshot.to_batches()`` against Lance ``to_batches()``, warm page cache;
- take: txstore ``snapshot.take(64 random indices)`` against 64 ``snapshot[i]`` (and Lance
  ``take``), medians over many draws, each of the two txstore ways first on half of them.

Two floors in the same run: a durable write of the table's own buffers (files of 64 MiB,
fsync), which any writer of these bytes pays; and 64 preads of a 64 KiB block of txstore's
chunks, each checked with XXH3, which a reader of one row per block pays in this format.

    ../bench-venv/bin/python bench/bench_arrow.py --quick
    ../bench-venv/bin/python bench/bench_arrow.py --json bench/results/arrow.json
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from txbench.output import finish_report, new_report
from txbench.system import (
    default_workdir,
    fsync_tree,
    machine_info,
    print_machine,
    write_table_bytes,
)
from txbench.workloads import MB, WORKLOADS, make_samples, scaled

import txstore

try:
    import pyarrow as pa
except ImportError:  # pragma: no cover - the bench venv has it
    pa = None
try:
    import lance
except ImportError:
    lance = None


def _timed(fn: Callable[[], Any], out: Path) -> tuple[float, float]:
    """(call s, fsync s) of one durable write."""
    os.sync()
    gc.collect()
    start = time.perf_counter()
    fn()
    mid = time.perf_counter()
    fsync_tree(out)
    return mid - start, time.perf_counter() - mid


def _scan_lance(dataset: Any) -> int:
    return sum(b.num_rows for b in dataset.to_batches())


def _take_floor(files: list[tuple[int, int]], picks: list[tuple[int, int]]) -> int:
    """The floor of reading 64 random rows from txstore's chunks: per row, one pread of a
    64 KiB block (the writer's block size) and its XXH3 check, nothing else."""
    import xxhash

    total = 0
    for fd_size, at in picks:
        fd, size = files[fd_size]
        block = os.pread(fd, 65536, at % max(1, size - 65536))
        total += xxhash.xxh3_64_intdigest(block) & 1
    return total


def _copy_each(pieces: list[Any], value_bytes: int) -> int:
    copied = 0
    for part in pieces:
        copied += len(part.copy())
    return copied // value_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10x fewer samples, 1 repeat")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--draws", type=int, default=200, help="take(64) draws")
    parser.add_argument("--workdir", type=Path, default=default_workdir())
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    repeat = 1 if args.quick else args.repeat
    workload = scaled(WORKLOADS[0], args.quick)
    info = machine_info(args.workdir, packages=("txstore", "pyarrow", "pylance", "numpy"))
    print_machine(info)
    print(workload.describe())
    samples = make_samples(workload)
    table = pa.table({"id": [s["id"] for s in samples], "tokens": [s["tokens"] for s in samples]})
    batches = table.to_batches(max_chunksize=8192)
    payload_mb = workload.payload_bytes / MB
    base = Path(tempfile.mkdtemp(prefix="bench-arrow-", dir=args.workdir))
    writers: dict[str, Callable[[Path], Any]] = {
        "txstore-batches": lambda out: txstore.create(str(out)).append(iter(batches)),
        "txstore-dicts": lambda out: txstore.create(str(out)).append(s for s in samples),
    }
    writers["floor: write + fsync"] = partial(write_table_bytes, table)
    if lance is not None:
        writers["lance-2.0"] = lambda out: lance.write_dataset(
            table, str(out), data_storage_version="2.0"
        )
        writers["lance-default"] = lambda out: lance.write_dataset(table, str(out))
    totals: dict[str, list[float]] = {k: [] for k in writers}
    for turn in range(repeat):
        order = list(writers)
        random.Random(turn).shuffle(order)
        for name in order:
            out = base / f"{name}-{turn}"
            call, sync = _timed(partial(writers[name], out), out)
            totals[name].append(call + sync)
            print(f"  write {name:16} {call:7.2f} s + fsync {sync:5.2f} s")
            if turn < repeat - 1:
                shutil.rmtree(out)
    report = new_report("bench_arrow", info, args.quick, workload=workload.name, repeat=repeat)
    write = {k: statistics.median(v) for k, v in totals.items()}
    report["write_s"] = write
    report["write_repeats"] = totals
    print("\nwrite, durable totals (median):")
    for name, seconds in write.items():
        print(
            f"  {name:16} {seconds:7.2f} s  {workload.num_samples / seconds:10,.0f} samples/s"
            f"  {payload_mb / seconds:7.1f} MB/s"
        )
    ratios = {
        "batches / dicts": write["txstore-dicts"] / write["txstore-batches"],
    }
    for peer in ("lance-2.0", "lance-default"):
        if peer in write:
            ratios[f"batches / {peer}"] = write[peer] / write["txstore-batches"]
    # How close each writer comes to writing the same bytes durably and nothing else.
    floor = write["floor: write + fsync"]
    for name in ("txstore-batches", "lance-2.0"):
        if name in write:
            ratios[f"{name} / floor (speed)"] = floor / write[name]
    # Reads, of the stores of the last turn, warm.
    last = repeat - 1
    snap = txstore.open(str(base / f"txstore-batches-{last}")).snapshot()
    scans: dict[str, list[float]] = {"txstore": []}
    readers: dict[str, Callable[[], int]] = {
        "txstore": lambda: sum(b.num_rows for b in snap.to_batches()),
    }
    datasets = {}
    if lance is not None:
        for peer in ("lance-2.0", "lance-default"):
            datasets[peer] = lance.dataset(str(base / f"{peer}-{last}"))
            readers[peer] = partial(_scan_lance, datasets[peer])
            scans[peer] = []
    # The floor of a scan that hands out Arrow's contiguous binary buffers: one copy of the
    # values' bytes (txstore stores each value behind its header, so it copies them once),
    # a chunk's worth at a time into new memory, as a scan does.
    values = [np.frombuffer(c.buffers()[2], dtype=np.uint8) for c in table.column("tokens").chunks]
    piece = 64 * 1024 * 1024
    pieces = [v[at : at + piece] for v in values for at in range(0, len(v), piece)]
    readers["one copy of the values"] = partial(_copy_each, pieces, workload.payload_size)
    scans["one copy of the values"] = []
    for name, read in readers.items():
        assert read() == workload.num_samples, name  # warms the page cache too
    for turn in range(repeat):
        order = list(readers)
        random.Random(100 + turn).shuffle(order)
        for name in order:
            gc.collect()
            start = time.perf_counter()
            readers[name]()
            scans[name].append(time.perf_counter() - start)
    scan = {k: statistics.median(v) for k, v in scans.items()}
    report["scan_s"] = scan
    print("\nscan into record batches, warm (median):")
    for name, seconds in scan.items():
        print(f"  {name:16} {seconds:7.3f} s  {payload_mb / seconds:8.1f} MB/s")
    for peer in datasets:
        ratios[f"scan txstore / {peer} (speed)"] = scan[peer] / scan["txstore"]
    ratios["scan txstore / one copy (speed)"] = scan["one copy of the values"] / scan["txstore"]
    rng = random.Random(7)
    draws = [[rng.randrange(len(snap)) for _ in range(64)] for _ in range(args.draws)]
    take_s: list[float] = []
    getitem_s: list[float] = []
    lance_s: list[float] = []
    floor_s: list[float] = []
    chunk_dir = base / f"txstore-batches-{last}" / "chunks"
    chunk_paths = sorted(chunk_dir.glob("*.chunk"))
    files = [(os.open(p, os.O_RDONLY), p.stat().st_size) for p in chunk_paths]
    for k, indices in enumerate(draws):
        # Each way goes first on half the draws: the first to read a block pays for mapping
        # its pages in, and the second would find them mapped.
        got: dict[str, Any] = {}
        for name in ("take", "get") if k % 2 else ("get", "take"):
            start = time.perf_counter()
            got[name] = snap.take(indices) if name == "take" else [snap[i] for i in indices]
            (take_s if name == "take" else getitem_s).append(time.perf_counter() - start)
        assert got["take"].column("id").to_pylist() == [s["id"] for s in got["get"]] == indices
        if "lance-2.0" in datasets:
            start = time.perf_counter()
            datasets["lance-2.0"].take(indices)
            lance_s.append(time.perf_counter() - start)
        picks = [(rng.randrange(len(files)), rng.randrange(1 << 40)) for _ in indices]
        start = time.perf_counter()
        _take_floor(files, picks)
        floor_s.append(time.perf_counter() - start)
    take = {
        "take(64)": statistics.median(take_s),
        "64 x snap[i]": statistics.median(getitem_s),
    }
    if lance_s:
        take["lance-2.0 take(64)"] = statistics.median(lance_s)
    take["floor: 64 x (pread + check a block)"] = statistics.median(floor_s)
    for fd, _size in files:
        os.close(fd)
    report["take_s"] = take
    print("\nrandom rows, 64 at a time (median of draws):")
    for name, seconds in take.items():
        print(f"  {name:20} {seconds * 1e3:8.2f} ms")
    ratios["take(64) / 64 x snap[i] (time)"] = take["take(64)"] / take["64 x snap[i]"]
    ratios["floor / 64 x snap[i] (time)"] = (
        take["floor: 64 x (pread + check a block)"] / take["64 x snap[i]"]
    )
    report["ratios"] = ratios
    print("\nratios:")
    targets = {
        "batches / dicts": 2.0,
        "batches / lance-2.0": 1.2,
        "scan txstore / lance-2.0 (speed)": 1.5,
    }
    for name, value in ratios.items():
        target = targets.get(name)
        if name.startswith("take"):
            verdict = "met" if value <= 0.5 else "NOT MET"
            print(f"  {name:36} {value:6.2f}  (target <= 0.5: {verdict})")
        elif target is not None:
            verdict = "met" if value >= target else "NOT MET"
            print(f"  {name:36} {value:6.2f}  (target >= {target}: {verdict})")
        else:
            print(f"  {name:36} {value:6.2f}")
    shutil.rmtree(base)
    finish_report(report, args.json, started)


if __name__ == "__main__":
    main()
