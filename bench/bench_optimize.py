"""One-call conversion: txstore's optimize() side by side with LitData's and MosaicML's.

One process runs every contender, one after another, round robin, on the same
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from txbench.measure import Contender, Result, measure, round_robin, warm_up
from txbench.output import (
    finish_report,
    fmt,
    new_report,
    print_notes,
    print_write_table,
    rate_of,
    ratio,
)
from txbench.peers import (
    PLAIN_BUFFER_BYTES,
    count_litdata,
    count_mds,
    count_txstore,
    import_litdata,
    import_mds_writer,
    import_txstore,
    require_litdata_bytes_layout,
    run_litdata_optimize,
    tiny_sample,
)
from txbench.system import (
    default_workdir,
    fsync_tree,
    machine_info,
    print_machine,
    set_settle,
    settle_s,
)
from txbench.workloads import (
    CHUNK_BYTES,
    WORKLOADS,
    Pool,
    Sample,
    Workload,
    make_sample,
    make_samples,
    scaled,
    selected,
)

PLAIN_LABEL = "plain file (write+fsync)"
APPEND_FRACTION = 100  # the small append is 1/100 of W1
TARGET_VS_LITDATA = 4.0
TARGET_VS_MDS = 1.0
TARGET_APPEND_S = 1.0


# --------------------------------------------------------------------------- the function


# What build_sample reads; forked workers (txstore, LitData, MosaicML partitions) inherit it.
_WORKLOAD: Workload | None = None
_POOL: Pool | None = None


def set_job(workload: Workload, pool: Pool) -> None:
    global _WORKLOAD, _POOL
    _WORKLOAD, _POOL = workload, pool


def build_sample(index: int) -> Sample:
    """The ``fn`` every contender calls: one input index -> one sample dict."""
    assert _WORKLOAD is not None and _POOL is not None
    return make_sample(_WORKLOAD, index, _POOL.payload(index))


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
    run_litdata_optimize(out, fn, inputs, workers, mode, start_method)
    return f"uncompressed, {start_method}"


def mds_partition(out: str, columns: dict[str, str], inputs: Sequence[int]) -> None:
    mds_writer = import_mds_writer()
    with mds_writer(out=out, columns=columns, compression=None, size_limit=CHUNK_BYTES) as w:
        for index in inputs:
            w.write(build_sample(index))


def merge_mds_partitions(out: Path) -> None:
    import_mds_writer()  # stubs streaming.vision when torchvision is absent
    from streaming.base.util import merge_index

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
    with open(path, "wb", buffering=PLAIN_BUFFER_BYTES) as f:
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


def contender(
    key: str,
    label: str,
    family: str,
    processes: int,
    run: RunFn,
    counter: Callable[[Path], int] | None = None,
) -> Contender[Sequence[int]]:
    """A contender fed the input indices; ``family`` and ``processes`` say who compares with
    whom (txstore with the peer of as many processes)."""
    return Contender(key, label, run, counter=counter, family=family, processes=processes)


def with_workers(n: int, run: Callable[[Path, Sequence[int], int], str]) -> RunFn:
    """``run`` with its worker count bound to ``n`` now, not when called."""
    return lambda out, inputs: run(out, inputs, n)


def throughput_contenders() -> list[Contender[Sequence[int]]]:
    out = [
        contender("plain", PLAIN_LABEL, "plain", 1, run_plain),
        contender(
            "plain-2",
            "plain files, 2p (write+fsync)",
            "plain",
            2,
            with_workers(2, run_plain_processes),
        ),
    ]
    for n in (1, 2):
        out += [
            contender(
                f"txstore-{n}",
                f"txstore optimize raw, {n}w",
                "txstore",
                n,
                with_workers(
                    n, lambda o, i, w: run_txstore(o, i, w, None, None) + ", compression=None"
                ),
            ),
            contender(
                f"txstore-zstd-{n}",
                f"txstore optimize zstd, {n}w",
                "txstore-zstd",
                n,
                with_workers(n, lambda o, i, w: run_txstore(o, i, w, "zstd", None) + ", zstd"),
            ),
            contender(
                f"litdata-{n}",
                f"LitData optimize, {n}w",
                "litdata",
                n,
                with_workers(n, lambda o, i, w: run_litdata(o, i, w, None)),
                count_litdata,
            ),
            contender(
                f"mds-{n}",
                f"MDSWriter, {n}p",
                "mds",
                n,
                with_workers(n, run_mds),
                count_mds,
            ),
        ]
    return out


# --------------------------------------------------------------------------- measurement


def measure_call(
    contender: Contender[Sequence[int]],
    workload: Workload,
    inputs: Sequence[int],
    workdir: Path,
) -> Result:
    result = Result(contender.label, workload.name, len(inputs), workload.payload_bytes)
    return measure(contender, inputs, result, workdir, f"opt-{contender.key}-{workload.name}-")


def run_workload(
    workload: Workload, contenders: Sequence[Contender[Sequence[int]]], workdir: Path, repeat: int
) -> list[Result]:
    start = time.perf_counter()
    set_job(workload, Pool(workload.num_samples, workload.payload_size))
    print(
        f"\n{workload.describe()}: pool generated in {time.perf_counter() - start:.1f} s "
        "(not timed)",
        flush=True,
    )
    inputs = list(range(workload.num_samples))
    warm_up(make_samples(replace(workload, num_samples=2000)), workload, workdir)
    return round_robin(contenders, repeat, lambda c: measure_call(c, workload, inputs, workdir))


# --------------------------------------------------------------------------- small append


def append_contenders() -> list[Contender[Sequence[int]]]:
    return [
        contender(
            "txstore-append-1",
            "txstore optimize append, 1w",
            "txstore",
            1,
            lambda o, i: run_txstore(o, i, 1, None, "append"),
            count_txstore,
        ),
        contender(
            "txstore-append-2",
            "txstore optimize append, 2w",
            "txstore",
            2,
            lambda o, i: run_txstore(o, i, 2, None, "append"),
            count_txstore,
        ),
        contender(
            "litdata-append-1",
            "LitData optimize append, 1w",
            "litdata",
            1,
            lambda o, i: run_litdata(o, i, 1, "append"),
            count_litdata,
        ),
        contender(
            "litdata-append-2",
            "LitData optimize append, 2w",
            "litdata",
            2,
            lambda o, i: run_litdata(o, i, 2, "append"),
            count_litdata,
        ),
        contender(
            "mds-append-1",
            "MDS new partition + merge_index",
            "mds",
            1,
            mds_append,
            count_mds,
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
    fsync_tree(base_dir)
    return bases


def measure_append(
    contender: Contender[Sequence[int]],
    base: Path,
    inputs: Sequence[int],
    total: int,
    workdir: Path,
) -> Result:
    """Append ``inputs`` to a fresh copy of ``base`` (the copy is not timed)."""
    payload = len(inputs) * (_WORKLOAD.payload_size if _WORKLOAD else 0)
    result = Result(contender.label, "W1+1%", len(inputs), payload)
    return measure(contender, inputs, result, workdir, f"opt-{contender.key}-", base, total)


def run_append(
    workload: Workload, contenders: Sequence[Contender[Sequence[int]]], workdir: Path, repeat: int
) -> list[Result]:
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
        return round_robin(
            contenders,
            repeat,
            lambda c: measure_append(c, bases[c.family], added, total, workdir),
            shuffle=False,
            digits=".3f",
        )
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)


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


def ratios(
    results: Sequence[Result], contenders: Sequence[Contender[Sequence[int]]]
) -> list[dict[str, Any]]:
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
                value = ratio(ours.samples_per_s, rate_of(theirs))
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
            f"| {fmt(row['ratio'], '6.2f')} | {target} | {met:<3} |"
        )


def print_append_verdict(results: Sequence[Result]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        if r.contender.startswith("txstore"):
            met = r.total_s is not None and r.total_s < TARGET_APPEND_S
            rows.append({"contender": r.contender, "total_s": r.total_s, "met": met})
            print(
                f"  {r.contender}: {fmt(r.total_s, '.3f')} s "
                f"(target: well under {TARGET_APPEND_S:.0f} s -> {'yes' if met else 'NO'})"
            )
    return rows


# --------------------------------------------------------------------------- profiling


def profile_txstore(workload: Workload, workdir: Path, top: int) -> None:
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
        "--settle", type=float, default=settle_s(), help="s to wait before each run (default 0)"
    )
    parser.add_argument(
        "--workdir", type=Path, default=default_workdir(), help="where temp dirs go (same disk)"
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
        contenders = selected(args.contenders, contenders, "key")
    workloads = [scaled(w, args.quick) for w in selected(args.workloads, WORKLOADS, "name")]
    results: list[Result] = []
    for workload in workloads:
        results += run_workload(workload, contenders, args.workdir, args.repeat)
    print_write_table(
        results,
        PLAIN_LABEL,
        "throughput (median of the repeats; total = call + fsync of its output)",
    )
    print_notes(results)
    rows = ratios(results, contenders)
    print_ratios(rows)
    report["throughput"] = [r.to_json() for r in results]
    report["ratios"] = rows


def run_small_append(args: argparse.Namespace, report: dict[str, Any]) -> None:
    workload = scaled(WORKLOADS[0], args.quick)
    contenders = append_contenders()
    results = run_append(workload, contenders, args.workdir, args.repeat)
    print_write_table(
        results,
        PLAIN_LABEL,
        "small append (median; the copy of the existing dataset is not timed)",
        ".3f",
    )
    print_notes(results)
    costs = litdata_fixed_costs(args.workdir)
    print(
        f"\nLitData optimize() fixed cost, one tiny sample, 1 worker: "
        f"{fmt(costs['fork'], '.2f')} s with fork (used above), "
        f"{fmt(costs['spawn'], '.2f')} s with spawn (its default outside notebooks)"
    )
    report["append"] = [r.to_json() for r in results]
    report["append_verdict"] = print_append_verdict(results)
    report["litdata_optimize_fixed_s"] = costs


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    set_settle(args.settle)
    logging.disable(logging.WARNING)  # MosaicML's "directory exists" and temp-folder notices
    info = machine_info(args.workdir)
    print_machine(info)
    report = new_report("bench_optimize", info, args.quick, repeat=args.repeat)
    require_litdata_bytes_layout()
    import_txstore()
    import_litdata()
    import_mds_writer()
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
        for workload in selected(args.workloads, WORKLOADS, "name"):
            profile_txstore(scaled(workload, args.quick), args.workdir, 25)
    finish_report(report, args.json, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
