"""One-call conversion: txstore's optimize() side by side with LitData's and MosaicML's.

Issue 6, item 4. One process runs every contender, one after another, round robin, on the same
inputs (integer indices) and the same function, which builds each sample from a pre-generated
random pool: generation is cheap and costs every contender the same. Each output is fsynced
after the call (timed separately), so every total is a durable total.

- throughput: ``txstore.optimize`` with 1 and 2 workers (uncompressed and zstd), LitData
  ``optimize()`` with 1 and 2 workers (uncompressed), MosaicML ``MDSWriter`` in 1 process and in
  2 processes writing a partition each, then ``merge_index``;
- small append: 1% of W1 onto an existing 200,000-sample dataset, txstore ``mode="append"``
  against LitData ``optimize(mode="append")`` and a new MosaicML partition + ``merge_index``.

    python bench/bench_optimize.py [--quick] [--repeat N] [--json out.json]

See bench/README.md for the setup.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import multiprocessing
import os
import pstats
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import bench_append as ba

MB = ba.MB
CHUNK_BYTES = ba.CHUNK_BYTES
APPEND_FRACTION = 100  # the small append is 1/100 of W1
TARGET_VS_LITDATA = 4.0
TARGET_VS_MDS = 1.0
TARGET_APPEND_S = 1.0
Sample = dict[str, Any]


# --------------------------------------------------------------------------- the function


class Pool:
    """Distinct random payloads, sliced on demand out of 64 MiB os.urandom blocks."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self.per_block = max(1, ba.POOL_BLOCK_BYTES // size)
        blocks = -(-count // self.per_block)
        self.blocks = [os.urandom(self.per_block * size) for _ in range(blocks)]

    def payload(self, index: int) -> bytes:
        block, k = divmod(index, self.per_block)
        return self.blocks[block][k * self.size : (k + 1) * self.size]


# What build_sample reads; forked workers (txstore, LitData, MosaicML partitions) inherit it.
_WORKLOAD: ba.Workload | None = None
_POOL: Pool | None = None


def set_job(workload: ba.Workload, pool: Pool) -> None:
    global _WORKLOAD, _POOL
    _WORKLOAD, _POOL = workload, pool


def build_sample(index: int) -> Sample:
    """The ``fn`` every contender calls: one input index -> one sample dict."""
    assert _WORKLOAD is not None and _POOL is not None
    return ba.make_sample(_WORKLOAD, index, _POOL.payload(index))


def tiny_sample(index: int) -> Sample:
    return {"id": index, "tokens": b"x"}


# --------------------------------------------------------------------------- contenders


def run_txstore(
    out: Path, inputs: Sequence[int], workers: int, compression: str | None, mode: str | None
) -> str:
    from txstore.store.ingest import optimize

    commit = optimize(
        build_sample,
        inputs,
        str(out),
        num_workers=workers,
        chunk_bytes="64MB",
        mode=mode,
        compression=compression,
        progress=False,
    )
    if commit.num_samples != len(inputs):
        raise AssertionError(f"commit.num_samples={commit.num_samples}, gave {len(inputs)}")
    return f"version {commit.version}"


def run_litdata(
    out: Path,
    inputs: Sequence[int],
    workers: int,
    mode: str | None,
    fn: Callable[[int], Sample] = build_sample,
    start_method: str = "fork",
) -> str:
    from litdata import optimize  # type: ignore[import-not-found]

    previous = multiprocessing.get_start_method(allow_none=True)
    try:
        optimize(
            fn=fn,
            inputs=list(inputs),
            output_dir=str(out),
            chunk_bytes=CHUNK_BYTES,
            compression=None,
            num_workers=workers,
            start_method=start_method,
            keep_data_ordered=True,
            mode=mode,
            verbose=False,
        )
    finally:
        # optimize() forces the process-wide start method; put it back.
        multiprocessing.set_start_method(previous, force=True)
    return f"uncompressed, {start_method}"


def mds_partition(out: str, columns: dict[str, str], inputs: Sequence[int]) -> None:
    mds_writer = ba.import_mds_writer()
    with mds_writer(out=out, columns=columns, compression=None, size_limit=CHUNK_BYTES) as w:
        for index in inputs:
            w.write(build_sample(index))


def merge_mds_partitions(out: Path) -> None:
    from streaming.base.util import merge_index  # type: ignore[import-not-found]

    merge_index(str(out), keep_local=True)


def shares(inputs: Sequence[int], workers: int) -> list[Sequence[int]]:
    """The inputs cut into ``workers`` contiguous shares, in order."""
    return [
        inputs[w * len(inputs) // workers : (w + 1) * len(inputs) // workers]
        for w in range(workers)
    ]


def run_forked(target: Callable[..., None], jobs: Sequence[tuple[Any, ...]], what: str) -> None:
    """One forked process per job (``target(*job)``), all at once; raise if any failed."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=job) for job in jobs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"{what} processes exited with {failed}")


def run_mds_processes(out: Path, inputs: Sequence[int], workers: int, first_part: int) -> None:
    """``workers`` forked processes, each writing partition part_NNNNN of the inputs."""
    assert _WORKLOAD is not None
    columns = _WORKLOAD.mds_columns
    jobs = [
        (str(out / f"part_{first_part + w:05d}"), columns, share)
        for w, share in enumerate(shares(inputs, workers))
    ]
    run_forked(mds_partition, jobs, "MDS partition")


def run_mds(out: Path, inputs: Sequence[int], workers: int) -> str:
    assert _WORKLOAD is not None
    if workers == 1:
        mds_partition(str(out), _WORKLOAD.mds_columns, inputs)
        return "uncompressed, in process"
    out.mkdir(parents=True)
    run_mds_processes(out, inputs, workers, 0)
    merge_mds_partitions(out)
    return f"uncompressed, {workers} forked partitions + merge_index"


def _plain_part(path: Path, inputs: Sequence[int]) -> None:
    """fn's payload bytes into one file (1 MiB buffer), then fsync."""
    assert _WORKLOAD is not None
    key = _WORKLOAD.payload_field
    with open(path, "wb", buffering=ba.PLAIN_BUFFER_BYTES) as f:
        for index in inputs:
            f.write(build_sample(index)[key])
        f.flush()
        os.fsync(f.fileno())


def run_plain(out: Path, inputs: Sequence[int]) -> str:
    """The physical limit for one writer."""
    out.mkdir(parents=True)
    _plain_part(out / "payload.bin", inputs)
    return "payload bytes only, one file, write + fsync"


def run_plain_processes(out: Path, inputs: Sequence[int], workers: int) -> str:
    """The limit for ``workers`` processes: each writes its share of the payloads to a file
    of its own and fsyncs it (the disk may take more than one writer's stream)."""
    out.mkdir(parents=True)
    jobs = [(out / f"payload-{w}.bin", share) for w, share in enumerate(shares(inputs, workers))]
    run_forked(_plain_part, jobs, "plain writer")
    return f"payload bytes only, {workers} forked processes, a file each, write + fsync"


RunFn = Callable[[Path, Sequence[int]], str]


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    family: str  # txstore, txstore-zstd, litdata, mds
    processes: int
    run: RunFn
    counter: Callable[[Path], int] | None = None


def with_workers(n: int, run: Callable[[Path, Sequence[int], int], str]) -> RunFn:
    """``run`` with its worker count bound to ``n`` now, not when called."""
    return lambda out, inputs: run(out, inputs, n)


def throughput_contenders() -> list[Contender]:
    out = [
        Contender("plain", "plain file (write+fsync)", "plain", 1, run_plain),
        Contender(
            "plain-2",
            "plain files, 2p (write+fsync)",
            "plain",
            2,
            with_workers(2, run_plain_processes),
        ),
    ]
    for n in (1, 2):
        out += [
            Contender(
                f"txstore-{n}",
                f"txstore optimize raw, {n}w",
                "txstore",
                n,
                with_workers(
                    n, lambda o, i, w: run_txstore(o, i, w, None, None) + ", compression=None"
                ),
            ),
            Contender(
                f"txstore-zstd-{n}",
                f"txstore optimize zstd, {n}w",
                "txstore-zstd",
                n,
                with_workers(n, lambda o, i, w: run_txstore(o, i, w, "zstd", None) + ", zstd"),
            ),
            Contender(
                f"litdata-{n}",
                f"LitData optimize, {n}w",
                "litdata",
                n,
                with_workers(n, lambda o, i, w: run_litdata(o, i, w, None)),
                ba.count_litdata,
            ),
            Contender(
                f"mds-{n}",
                f"MDSWriter, {n}p",
                "mds",
                n,
                with_workers(n, run_mds),
                ba.count_mds,
            ),
        ]
    return out


# --------------------------------------------------------------------------- measurement


def timed_run(
    contender: Contender, out: Path, inputs: Sequence[int], result: ba.Result, expected: int
) -> None:
    """Run, fsync the output, fill ``result``; ``expected``: samples the output should hold."""
    ba.settle()
    start = time.perf_counter()
    note = contender.run(out, inputs)
    result.write_s = time.perf_counter() - start
    start = time.perf_counter()
    ba.fsync_tree(out)
    result.fsync_s = time.perf_counter() - start
    result.disk_bytes = ba.tree_bytes(out)
    result.note = note + check_count(contender, out, expected)


def check_count(contender: Contender, out: Path, expected: int) -> str:
    if contender.counter is None:
        return ""
    found = contender.counter(out)
    return "" if found == expected else f"; COUNT MISMATCH: index says {found}, expected {expected}"


def measure(
    contender: Contender, workload: ba.Workload, inputs: Sequence[int], workdir: Path
) -> ba.Result:
    result = ba.Result(contender.label, workload.name, len(inputs), workload.payload_bytes)
    run_dir = Path(tempfile.mkdtemp(prefix=f"opt-{contender.key}-{workload.name}-", dir=workdir))
    try:
        timed_run(contender, run_dir / "out", inputs, result, len(inputs))
    except Exception:
        result.error = traceback.format_exc()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def run_workload(
    workload: ba.Workload, contenders: Sequence[Contender], workdir: Path, repeat: int
) -> list[ba.Result]:
    start = time.perf_counter()
    set_job(workload, Pool(workload.num_samples, workload.payload_size))
    print(
        f"\n{workload.describe()}: pool generated in {time.perf_counter() - start:.1f} s "
        "(not timed)",
        flush=True,
    )
    inputs = list(range(workload.num_samples))
    ba.measure(
        ba.CONTENDERS[0], workload, ba.make_samples(replace(workload, num_samples=2000)), workdir
    )  # untimed warm-up of the disk path
    runs: dict[str, list[ba.Result]] = {c.key: [] for c in contenders}
    for r in range(repeat):  # round robin, so drift hits every contender alike
        for contender in ba.shuffled(contenders, r):
            runs[contender.key].append(measure(contender, workload, inputs, workdir))
            print(
                f"  [{r + 1}/{repeat}] {contender.label:<28} "
                f"{ba.fmt(runs[contender.key][-1].total_s, '.2f')} s",
                flush=True,
            )
    results = [ba.median_result(runs[c.key]) for c in contenders]
    for result in results:
        if result.error:
            print(f"ERROR in {result.contender}:\n{result.error}", file=sys.stderr)
    return results


# --------------------------------------------------------------------------- small append


def append_contenders() -> list[Contender]:
    return [
        Contender(
            "txstore-append-1",
            "txstore optimize append, 1w",
            "txstore",
            1,
            lambda o, i: run_txstore(o, i, 1, None, "append"),
        ),
        Contender(
            "txstore-append-2",
            "txstore optimize append, 2w",
            "txstore",
            2,
            lambda o, i: run_txstore(o, i, 2, None, "append"),
        ),
        Contender(
            "litdata-append-1",
            "LitData optimize append, 1w",
            "litdata",
            1,
            lambda o, i: run_litdata(o, i, 1, "append"),
            ba.count_litdata,
        ),
        Contender(
            "litdata-append-2",
            "LitData optimize append, 2w",
            "litdata",
            2,
            lambda o, i: run_litdata(o, i, 2, "append"),
            ba.count_litdata,
        ),
        Contender(
            "mds-append-1",
            "MDS new partition + merge_index",
            "mds",
            1,
            mds_append,
            ba.count_mds,
        ),
    ]


def mds_append(out: Path, inputs: Sequence[int]) -> str:
    """MDSWriter cannot append: write one more partition, then merge every index."""
    parts = sorted(p for p in out.iterdir() if p.name.startswith("part_"))
    run_mds_processes(out, inputs, 1, len(parts))
    (out / "index.json").unlink()  # merge_index refuses to replace it
    merge_mds_partitions(out)
    return "one new partition (1 forked process) + merge_index"


def build_append_bases(base_dir: Path, inputs: Sequence[int]) -> dict[str, Path]:
    """The existing datasets appended to, one per family (not timed)."""
    bases = {"txstore": base_dir / "txstore", "litdata": base_dir / "litdata"}
    run_txstore(bases["txstore"], inputs, 2, None, None)
    run_litdata(bases["litdata"], inputs, 2, None)
    bases["mds"] = base_dir / "mds"
    bases["mds"].mkdir()
    run_mds_processes(bases["mds"], inputs, 1, 0)
    merge_mds_partitions(bases["mds"])
    ba.fsync_tree(base_dir)
    return bases


def measure_append(
    contender: Contender, base: Path, inputs: Sequence[int], total: int, workdir: Path
) -> ba.Result:
    """Append ``inputs`` to a fresh copy of ``base`` (the copy is not timed)."""
    payload = len(inputs) * (_WORKLOAD.payload_size if _WORKLOAD else 0)
    result = ba.Result(contender.label, "W1+1%", len(inputs), payload)
    run_dir = Path(tempfile.mkdtemp(prefix=f"opt-{contender.key}-", dir=workdir))
    try:
        out = run_dir / "out"
        shutil.copytree(base, out)
        timed_run(contender, out, inputs, result, total)
        if contender.family == "txstore":
            result.note += check_txstore_count(out, total)
    except Exception:
        result.error = traceback.format_exc()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def check_txstore_count(out: Path, expected: int) -> str:
    import txstore

    found = len(txstore.open(str(out)).snapshot())
    return "" if found == expected else f"; COUNT MISMATCH: {found}, expected {expected}"


def run_append(
    workload: ba.Workload, contenders: Sequence[Contender], workdir: Path, repeat: int
) -> list[ba.Result]:
    set_job(
        workload,
        Pool(
            workload.num_samples * (APPEND_FRACTION + 1) // APPEND_FRACTION, workload.payload_size
        ),
    )
    base_inputs = list(range(workload.num_samples))
    added = list(range(workload.num_samples, workload.num_samples + len(base_inputs) // 100))
    total = len(base_inputs) + len(added)
    print(
        f"\nsmall append: {len(added):,} samples onto {len(base_inputs):,} ({workload.name})",
        flush=True,
    )
    base_dir = Path(tempfile.mkdtemp(prefix="opt-append-bases-", dir=workdir))
    try:
        start = time.perf_counter()
        bases = build_append_bases(base_dir, base_inputs)
        print(f"  existing datasets built in {time.perf_counter() - start:.1f} s (not timed)")
        runs: dict[str, list[ba.Result]] = {c.key: [] for c in contenders}
        for r in range(repeat):
            for c in contenders:
                runs[c.key].append(measure_append(c, bases[c.family], added, total, workdir))
                print(
                    f"  [{r + 1}/{repeat}] {c.label:<32} "
                    f"{ba.fmt(runs[c.key][-1].total_s, '.3f')} s",
                    flush=True,
                )
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)
    results = [ba.median_result(runs[c.key]) for c in contenders]
    for result in results:
        if result.error:
            print(f"ERROR in {result.contender}:\n{result.error}", file=sys.stderr)
    return results


def litdata_fixed_costs(workdir: Path) -> dict[str, float | None]:
    """LitData optimize() on one tiny sample, 1 worker: its fixed cost per call."""
    costs: dict[str, float | None] = {}
    for method in ("fork", "spawn"):
        run_dir = Path(tempfile.mkdtemp(prefix="opt-litdata-fixed-", dir=workdir))
        try:
            start = time.perf_counter()
            run_litdata(run_dir / "out", [0], 1, None, tiny_sample, method)
            costs[method] = time.perf_counter() - start
        except Exception:
            traceback.print_exc()
            costs[method] = None
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    return costs


# --------------------------------------------------------------------------- reporting


def print_table(results: Sequence[ba.Result], title: str, digits: str = "8.2f") -> None:
    print(f"\n{title}")
    header = (
        f"| {'contender':<32} | {'wl':<5} | {'write s':>8} | {'fsync s':>7} | {'total s':>8} "
        f"| {'samples/s':>10} | {'MB/s':>7} | {'disk MB':>8} | x plain | runs (total s) |"
    )
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for r in results:
        disk = None if r.disk_bytes is None else r.disk_bytes / MB
        plain = ba.rate_of(ba.find(results, "plain file (write+fsync)", r.workload))
        vs_plain = ba.ratio(r.samples_per_s, plain)
        spread = ", ".join(format(t, digits.lstrip("0123456789")) for t in r.run_totals_s)
        print(
            f"| {r.contender:<32} | {r.workload:<5} | {ba.fmt(r.write_s, digits)} "
            f"| {ba.fmt(r.fsync_s, '7.3f')} | {ba.fmt(r.total_s, digits)} "
            f"| {ba.fmt(r.samples_per_s, '10,.0f')} | {ba.fmt(r.mb_per_s, '7.1f')} "
            f"| {ba.fmt(disk, '8.1f')} | {ba.fmt(vs_plain, '7.3f')} | {spread or '-'} |"
        )


def print_notes(results: Sequence[ba.Result]) -> None:
    for r in results:
        status = "ERROR (traceback above)" if r.error else r.note
        print(f"  {r.workload} {r.contender:<32} {status}")


def ratios(results: Sequence[ba.Result], contenders: Sequence[Contender]) -> list[dict[str, Any]]:
    """txstore's samples/s over each peer's, same workload and same number of processes."""
    by_key = {c.label: c for c in contenders}
    rows = []
    for workload in sorted({r.workload for r in results}):
        here = [r for r in results if r.workload == workload and r.contender in by_key]
        for ours in (r for r in here if by_key[r.contender].family.startswith("txstore")):
            # Against the plain files of as many processes: the disk's own limit, no target.
            peers = (("litdata", TARGET_VS_LITDATA), ("mds", TARGET_VS_MDS), ("plain", None))
            for peer, target in peers:
                theirs = next(
                    (
                        r
                        for r in here
                        if by_key[r.contender].family == peer
                        and by_key[r.contender].processes == by_key[ours.contender].processes
                    ),
                    None,
                )
                value = ba.ratio(ours.samples_per_s, ba.rate_of(theirs))
                rows.append(
                    {
                        "workload": workload,
                        "txstore": ours.contender,
                        "peer": theirs.contender if theirs else peer,
                        "ratio": value,
                        "target": target,
                        "met": None if value is None or target is None else value >= target,
                    }
                )
    return rows


def print_ratios(rows: Sequence[dict[str, Any]]) -> None:
    print("\ntxstore samples/s / peer samples/s (same run, same number of processes):")
    header = f"| wl | {'txstore':<28} | {'peer':<30} | ratio  | target | met |"
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for row in rows:
        met = "-" if row["met"] is None else ("yes" if row["met"] else "NO")
        target = "  -   " if row["target"] is None else f">= {row['target']:<3}"
        print(
            f"| {row['workload']} | {row['txstore']:<28} | {row['peer']:<30} "
            f"| {ba.fmt(row['ratio'], '6.2f')} | {target} | {met:<3} |"
        )


def print_append_verdict(results: Sequence[ba.Result]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        if r.contender.startswith("txstore"):
            met = r.total_s is not None and r.total_s < TARGET_APPEND_S
            rows.append({"contender": r.contender, "total_s": r.total_s, "met": met})
            print(
                f"  {r.contender}: {ba.fmt(r.total_s, '.3f')} s "
                f"(target: well under {TARGET_APPEND_S:.0f} s -> {'yes' if met else 'NO'})"
            )
    return rows


# --------------------------------------------------------------------------- profiling


def profile_txstore(workload: ba.Workload, workdir: Path, top: int) -> None:
    """cProfile of txstore optimize, 1 worker (in process, so the profile sees the work)."""
    set_job(workload, Pool(workload.num_samples, workload.payload_size))
    run_dir = Path(tempfile.mkdtemp(prefix="opt-profile-", dir=workdir))
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        run_txstore(run_dir / "out", list(range(workload.num_samples)), 1, None, None)
        profiler.disable()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"\ncProfile: txstore optimize, 1 worker, compression=None, {workload.describe()}")
    stats = pstats.Stats(profiler, stream=sys.stdout).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10x smaller workloads (smoke run)")
    parser.add_argument("--json", type=Path, help="write all results to this JSON file")
    parser.add_argument("--repeat", type=int, default=3, help="runs per contender; median kept")
    parser.add_argument(
        "--settle", type=float, default=ba.SETTLE_S, help="s to wait before each run (default 0)"
    )
    parser.add_argument(
        "--workdir", type=Path, default=ba.default_workdir(), help="where temp dirs go (same disk)"
    )
    parser.add_argument("--workloads", default="W1,W2", help="comma-separated subset of W1,W2")
    parser.add_argument(
        "--contenders",
        default="",
        help="comma-separated subset of: " + ", ".join(c.key for c in throughput_contenders()),
    )
    parser.add_argument("--skip-throughput", action="store_true", help="only the small append")
    parser.add_argument("--skip-append", action="store_true", help="only the throughput part")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile txstore optimize (1 worker, in process) per workload",
    )
    return parser.parse_args(argv)


def run_throughput(args: argparse.Namespace, report: dict[str, Any]) -> None:
    contenders = throughput_contenders()
    if args.contenders:
        contenders = ba.selected(args.contenders, contenders, "key")
    workloads = [
        ba.scaled(w, args.quick) for w in ba.selected(args.workloads, ba.WORKLOADS, "name")
    ]
    results: list[ba.Result] = []
    for workload in workloads:
        results += run_workload(workload, contenders, args.workdir, args.repeat)
    print_table(results, "throughput (median of the repeats; total = call + fsync of its output)")
    print_notes(results)
    rows = ratios(results, contenders)
    print_ratios(rows)
    report["throughput"] = [r.to_json() for r in results]
    report["ratios"] = rows


def run_small_append(args: argparse.Namespace, report: dict[str, Any]) -> None:
    workload = ba.scaled(ba.WORKLOADS[0], args.quick)
    contenders = append_contenders()
    results = run_append(workload, contenders, args.workdir, args.repeat)
    print_table(
        results, "small append (median; the copy of the existing dataset is not timed)", "8.3f"
    )
    print_notes(results)
    costs = litdata_fixed_costs(args.workdir)
    print(
        f"\nLitData optimize() fixed cost, one tiny sample, 1 worker: "
        f"{ba.fmt(costs['fork'], '.2f')} s with fork (used above), "
        f"{ba.fmt(costs['spawn'], '.2f')} s with spawn (its default outside notebooks)"
    )
    report["append"] = [r.to_json() for r in results]
    report["append_verdict"] = print_append_verdict(results)
    report["litdata_optimize_fixed_s"] = costs


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ba.SETTLE_S = args.settle
    logging.disable(logging.WARNING)  # MosaicML's "directory exists" and temp-folder notices
    info = ba.machine_info(args.workdir)
    ba.print_machine(info)
    report: dict[str, Any] = {"machine": info, "quick": args.quick, "argv": sys.argv[1:]}
    ba.import_txstore()
    ba.import_litdata()
    ba.import_mds_writer()
    print(
        "inputs: integer indices; fn builds {id, payload[, label]} from a pre-generated "
        "os.urandom pool"
    )
    print("peers uncompressed (LitData's zstd needs pyarrow, undeclared); txstore raw and zstd")
    if not args.skip_throughput:
        run_throughput(args, report)
    if not args.skip_append:
        run_small_append(args, report)
    if args.profile:
        for workload in ba.selected(args.workloads, ba.WORKLOADS, "name"):
            profile_txstore(ba.scaled(workload, args.quick), args.workdir, 25)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
