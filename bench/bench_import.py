"""Importing a LitData and an MDS dataset against a plain copy of the same files.

The datasets are written once by the tools themselves (``litdata.optimize`` twice: with
pyarrow importable, where it stores rows of plain values as Arrow, and in a child process
without, where it keeps its own layout; ``streaming.MDSWriter``; ``pyarrow.parquet`` in 4
files of row groups of about 25 MB):
samples of an int and a random ``bytes`` value (W2: 100 KiB each; ``--blob 2048``: W1's
2 KiB, as many samples as make the same 512 MB). Then, round robin in one run: a plain
copy of the dataset's files (``shutil.copyfile``, which copies in the kernel, then an fsync
of each file and the folder: a durable copy, as txstore's commits are durable),
``txstore.import_litdata`` / ``import_mds`` /
``import_parquet`` into a new uncompressed store with 1 and 2 workers, and Lance's
``write_dataset`` from the same Parquet files (``pyarrow.dataset``, Lance's defaults). The
figure is each import's speed as a fraction of the plain copy of its source.

    python bench/bench_import.py [--quick] [--repeat N] [--blob BYTES] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txbench.output import finish_report, new_report
from txbench.system import machine_info, print_machine

import txstore

BLOB = 100 * 1024


def _sample(i: int, size: int = BLOB) -> dict[str, Any]:
    return {"id": i, "blob": _POOL[i % len(_POOL)][:size]}


_POOL = [os.urandom(BLOB) for _ in range(64)]


def write_litdata(out: Path, n: int, size: int = BLOB) -> None:
    import litdata

    litdata.optimize(fn=functools.partial(_sample, size=size), inputs=list(range(n)),
                     output_dir=str(out), chunk_bytes="64MB", num_workers=1)  # fmt: skip


def write_litdata_own(out: Path, n: int, size: int = BLOB) -> None:
    """``write_litdata`` in a child process that cannot import pyarrow: LitData then keeps
    the items in its own layout (as it does without pyarrow, and did before its Arrow rows),
    the layout of the datasets it wrote so."""
    env = dict(os.environ)
    paths = env.get("PYTHONPATH", "").split(os.pathsep)
    kept = [p for p in paths if p and not (Path(p) / "pyarrow").exists()]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    command = [sys.executable, __file__, "--write-litdata-own", str(out), str(n), str(size)]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    first = sorted(out.glob("chunk-*.bin"))[0].read_bytes()
    if first.endswith(b"LDARW01\0"):
        raise SystemExit("LitData wrote Arrow rows: pyarrow was importable in the child")


def write_mds(out: Path, n: int, size: int = BLOB) -> None:
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"id": "int", "blob": "bytes"}) as writer:
        for i in range(n):
            writer.write(_sample(i, size))


def write_parquet(out: Path, n: int, size: int = BLOB) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir()
    files = 4
    per_file = -(-n // files)
    for f in range(files):
        ids = list(range(f * per_file, min(n, (f + 1) * per_file)))
        blobs = [_sample(i, size)["blob"] for i in ids]
        table = pa.table({"id": pa.array(ids, pa.int64()), "blob": pa.array(blobs, pa.binary())})
        pq.write_table(
            table,
            out / f"part-{f}.parquet",
            row_group_size=max(1, 25_600_000 // size),  # 250 rows of 100 KiB: ~25 MB groups
            compression="none",
            use_dictionary=False,
        )


def _lance_to(src: Path, dest: Path) -> None:
    import lance
    import pyarrow.dataset as pads

    lance.write_dataset(pads.dataset(str(src), format="parquet"), str(dest))


def plain_copy(src: Path, dest: Path) -> None:
    # shutil.copyfile copies in the kernel (sendfile on Linux): no buffer of the whole file
    # in this process, whose first touch of fresh memory cost more than the copy here.
    dest.mkdir()
    for path in sorted(src.iterdir()):
        target = dest / path.name
        shutil.copyfile(path, target)
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(dest, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_to(src: Path, dest: Path) -> None:
    plain_copy(src, dest)


def _import_to(importer: Callable[..., Any], src: Path, workers: int, dest: Path) -> None:
    importer(src, str(dest), num_workers=workers, compression=None, progress=False)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _timed(run: Callable[[Path], None], work: Path) -> float:
    target = work / "out"
    if target.exists():
        shutil.rmtree(target)
    start = time.perf_counter()
    run(target)
    seconds = time.perf_counter() - start
    shutil.rmtree(target)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 samples (100 MB), 2 rounds")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument(
        "--blob", type=int, default=BLOB,
        help="bytes of each sample's blob (the same 512 MB in all: 2048 for 250,000 samples)",
    )  # fmt: skip
    parser.add_argument("--write-litdata-own", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_litdata_own:  # the child of write_litdata_own
        import importlib.util

        if importlib.util.find_spec("pyarrow") is not None:
            raise SystemExit("pyarrow is importable: LitData would write Arrow rows")
        out, count, size = args.write_litdata_own
        write_litdata(Path(out), int(count), int(size))
        return
    started = time.perf_counter()
    n = (1000 if args.quick else 5000) * BLOB // args.blob
    repeat = args.repeat or (2 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        work = Path(tmp)
        packages = ("txstore", "litdata", "mosaicml-streaming", "pyarrow", "pylance")
        info = machine_info(work, packages)
        print_machine(info)
        # LitData writes rows of plain values as Arrow where pyarrow is installed (as here),
        # and in its own layout where it is not: both are measured.
        sources = {
            "litdata": work / "litdata",
            "litdata, own layout": work / "litdata-own",
            "mds": work / "mds",
            "parquet": work / "parquet",
        }
        write_litdata(sources["litdata"], n, args.blob)
        write_litdata_own(sources["litdata, own layout"], n, args.blob)
        write_mds(sources["mds"], n, args.blob)
        write_parquet(sources["parquet"], n, args.blob)
        importers: dict[str, Callable[..., Any]] = {
            "litdata": txstore.import_litdata,
            "litdata, own layout": txstore.import_litdata,
            "mds": txstore.import_mds,
            "parquet": txstore.import_parquet,
        }
        # name -> (the source it reads, what runs it)
        contenders: dict[str, tuple[str, Callable[[Path], None]]] = {}
        for kind, src in sources.items():
            contenders[f"plain copy of {kind} files"] = (kind, functools.partial(_copy_to, src))
            own = kind == "litdata, own layout"
            label = "import_litdata (own layout)" if own else f"import_{kind}"
            for workers in (1, 2):
                importing = functools.partial(_import_to, importers[kind], src, workers)
                contenders[f"{label}, {workers} worker(s)"] = (kind, importing)
        if _has("lance"):
            lance_run = functools.partial(_lance_to, sources["parquet"])
            contenders["lance.write_dataset of parquet files"] = ("parquet", lance_run)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(repeat):
            for name, (_, run) in contenders.items():
                times[name].append(_timed(run, work))
        sizes = {k: sum(p.stat().st_size for p in s.iterdir()) for k, s in sources.items()}
    results = []
    for name, seconds in times.items():
        kind = contenders[name][0]
        best = min(seconds)
        copy = min(times[f"plain copy of {kind} files"])
        results.append({
            "contender": name,
            "samples": n,
            "blob_bytes": args.blob,
            "bytes": sizes[kind],
            "best_seconds": best,
            "median_seconds": statistics.median(seconds),
            "MB_per_s": sizes[kind] / best / 1e6,
            "vs_plain_copy": copy / best,
        })  # fmt: skip
    for r in results:
        print(
            f"{r['contender']:<34} {r['MB_per_s']:8.1f} MB/s  {r['vs_plain_copy']:5.2f}x the "
            "plain copy's speed"
        )
    report = new_report("bench_import", info, args.quick, repeat=repeat, results=results)
    finish_report(report, Path(args.json) if args.json else None, started)


if __name__ == "__main__":
    main()
