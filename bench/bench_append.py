"""Append throughput of txstore side by side with LitData, MosaicML Streaming and a plain file.

One process runs every contender, one after another, on the same pre-generated samples, each
into a fresh directory on the same filesystem. Only sample generation is left out of the
timings. Every contender's output is fsynced after its write (timed separately), so that all
totals are durable totals, like the plain file's write + fsync.

    python bench/bench_append.py [--quick] [--json out.json]
    python bench/bench_append.py --commit-latency [--quick] [--json out.json]

See bench/README.md for the setup.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from txbench.measure import Contender, Result, importable, measure, round_robin, warm_up
from txbench.output import (
    find,
    finish_report,
    fmt,
    new_report,
    print_notes,
    print_write_table,
    rate_of,
    ratio,
)
from txbench.peers import (
    count_litdata,
    count_mds,
    import_litdata,
    import_mds_writer,
    import_txstore,
    no_imports,
    require_litdata_bytes_layout,
    run_litdata_optimize,
    tiny_sample,
    write_litdata_binarywriter,
    write_mds,
    write_plain_file,
    write_txstore_default,
    write_txstore_uncompressed,
)
from txbench.system import default_workdir, machine_info, print_machine, set_settle, settle_s
from txbench.workloads import (
    WORKLOADS,
    Sample,
    Workload,
    iter_samples,
    make_sample,
    make_samples,
    random_payloads,
    scaled,
    selected,
)

# --------------------------------------------------------------------------- contenders

#: What a writer gets: the workload's pre-built samples.
Job = tuple[Sequence[Sample], Workload]
WriteFn = Callable[[Path, Sequence[Sample], Workload], str]

_OPTIMIZE_SAMPLES: Sequence[Sample] = ()


def _optimize_item(index: int) -> Sample:
    """optimize()'s fn: the forked worker inherits the samples, so only indices travel."""
    return _OPTIMIZE_SAMPLES[index]


def write_litdata_optimize(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    global _OPTIMIZE_SAMPLES
    _OPTIMIZE_SAMPLES = samples
    try:
        run_litdata_optimize(out, _optimize_item, range(len(samples)))
    finally:
        _OPTIMIZE_SAMPLES = ()
    return "uncompressed, 1 worker (fork), includes fixed cost"


def writer(
    key: str,
    label: str,
    write: WriteFn,
    prepare: Callable[[], Any],
    counter: Callable[[Path], int] | None = None,
) -> Contender[Job]:
    return Contender(key, label, lambda out, job: write(out, *job), prepare, counter)


CONTENDERS = (
    writer("plain", "plain file (write+fsync)", write_plain_file, no_imports),
    writer("txstore", "txstore append (zstd)", write_txstore_default, import_txstore),
    writer("txstore-raw", "txstore append (none)", write_txstore_uncompressed, import_txstore),
    writer("mds", "MDSWriter", write_mds, import_mds_writer, count_mds),
    writer(
        "litdata-writer",
        "LitData BinaryWriter",
        write_litdata_binarywriter,
        import_litdata,
        count_litdata,
    ),
    writer(
        "litdata-optimize",
        "LitData optimize()",
        write_litdata_optimize,
        import_litdata,
        count_litdata,
    ),
)


# --------------------------------------------------------------------------- measurement


def measure_write(
    contender: Contender[Job], workload: Workload, samples: Sequence[Sample], workdir: Path
) -> Result:
    result = Result(contender.label, workload.name, len(samples), workload.payload_bytes)
    prefix = f"{contender.key}-{workload.name}-"
    return measure(contender, (samples, workload), result, workdir, prefix, fsync_run_dir=True)


def measure_optimize_fixed_cost(workdir: Path, start_method: str) -> float | None:
    """optimize() on one tiny sample: its per-call fixed cost (worker start-up, merge)."""
    run_dir = Path(tempfile.mkdtemp(prefix="litdata-fixed-", dir=workdir))
    try:
        start = time.perf_counter()
        run_litdata_optimize(run_dir / "out", tiny_sample, [0], start_method=start_method)
        return time.perf_counter() - start
    except Exception:
        traceback.print_exc()
        return None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def run_workload(
    workload: Workload, contenders: Sequence[Contender[Job]], workdir: Path, repeat: int
) -> list[Result]:
    start = time.perf_counter()
    samples = make_samples(workload)
    generation_s = time.perf_counter() - start
    print(f"\n{workload.describe()}: payload generated in {generation_s:.1f} s (not timed)")
    warm_up(samples, workload, workdir)
    return round_robin(contenders, repeat, lambda c: measure_write(c, workload, samples, workdir))


def skipped_results(workload: Workload, missing: dict[str, str]) -> list[Result]:
    return [
        Result(label, workload.name, workload.num_samples, workload.payload_bytes, note=note)
        for label, note in missing.items()
    ]


# --------------------------------------------------------------------------- reporting


def txstore_vs_mds(results: Sequence[Result]) -> list[dict[str, Any]]:
    rows = []
    mds_label = "MDSWriter"
    for workload in sorted({r.workload for r in results}):
        mds_rate = rate_of(find(results, mds_label, workload))
        for label in (c.label for c in CONTENDERS if c.key.startswith("txstore")):
            value = ratio(rate_of(find(results, label, workload)), mds_rate)
            rows.append({"workload": workload, "txstore": label, "ratio": value})
    return rows


def print_vs_mds(rows: Sequence[dict[str, Any]]) -> None:
    print("\ntxstore throughput / MDSWriter throughput (same run; >1 means txstore is faster):")
    for row in rows:
        print(f"  {row['workload']}  {row['txstore']:<24} {fmt(row['ratio'], '.3f')}")


# --------------------------------------------------------------------------- commit latency


REFERENCE_VERSIONS = 10


def quantile_ms(latencies_ms: Sequence[float], q: int) -> float:
    """The q-th decile (q=5: median, q=9: p90)."""
    if q == 5:
        return statistics.median(latencies_ms)
    return statistics.quantiles(latencies_ms, n=10, method="inclusive")[q - 1]


@dataclass
class LatencyPoint:
    """Appends at one store size, interleaved with appends to a fresh ~10-version store."""

    target_versions: int
    version_before: int
    version_after: int
    latencies_ms: list[float] = field(repr=False)
    reference_ms: list[float] = field(repr=False)
    #: User and system CPU time of the same appends (every thread of the process): user time
    #: is txstore's own work, system time the kernel's (the file system), and neither holds
    #: the waits for the disk that wall time also holds.
    user_ms: list[float] = field(repr=False, default_factory=list)
    sys_ms: list[float] = field(repr=False, default_factory=list)
    reference_user_ms: list[float] = field(repr=False, default_factory=list)
    reference_sys_ms: list[float] = field(repr=False, default_factory=list)
    chunks: int = 0  # chunk references in the store's latest version

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            median_ms=quantile_ms(self.latencies_ms, 5),
            p90_ms=quantile_ms(self.latencies_ms, 9),
            reference_median_ms=quantile_ms(self.reference_ms, 5),
            reference_p90_ms=quantile_ms(self.reference_ms, 9),
        )
        data["vs_reference"] = data["median_ms"] / data["reference_median_ms"]
        if self.user_ms and self.reference_user_ms:
            # Means: the kernel accounts CPU time in ticks, so single figures are coarse.
            for key in ("user_ms", "sys_ms", "reference_user_ms", "reference_sys_ms"):
                data[key.replace("_ms", "_mean_ms")] = statistics.fmean(getattr(self, key))
            data["user_vs_reference"] = data["user_mean_ms"] / data["reference_user_mean_ms"]
            data["sys_vs_reference"] = data["sys_mean_ms"] / data["reference_sys_mean_ms"]
        return data


class OneSampleFeed:
    """Hands out one fresh 2 KiB sample per call, from a pre-generated pool."""

    def __init__(self, count: int) -> None:
        workload = WORKLOADS[0]
        payloads = random_payloads(count, workload.payload_size)
        self._samples = [make_sample(workload, i, p) for i, p in enumerate(payloads)]
        self._next = 0

    def next_batch(self) -> list[Sample]:
        sample = self._samples[self._next % len(self._samples)]
        self._next += 1
        return [sample]


def timed_append(store: Any, feed: OneSampleFeed) -> tuple[int, float, float, float]:
    """(version, wall, user CPU, system CPU seconds) of a one-sample append."""
    batch = feed.next_batch()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    commit = store.append(iter_samples(batch))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return int(commit.version), wall, user, system


def build_history(
    store: Any, feed: OneSampleFeed, version: int, target: int, chunks_per_version: int
) -> tuple[int, int]:
    """Versions until the store has `target`; returns (version, versions made).

    The first is a real one-sample append; each later one commits `chunks_per_version`
    references to that first chunk (through the store context's ``append_chunks``: a staged
    part may not name a chunk twice). The metadata (segments, manifests) grows exactly as if
    each were a new chunk, without writing and fsyncing 100,000 files to build the history;
    the timed appends are real appends of one new chunk each."""
    made = 0
    if version == 0:
        version, *_ = timed_append(store, feed)
        made += 1
    (template,) = store.snapshot(1).chunk_refs()
    chunks = (template,) * chunks_per_version
    while version < target:
        start = store.snapshot().manifest
        version = store._ctx.append_chunks(chunks, start=start, message="history").manifest.version
        made += 1
    return version, made


def reference_store(run_dir: Path, name: str, feed: OneSampleFeed, chunks_per_version: int) -> Any:
    import txstore

    store = txstore.create(str(run_dir / name))
    build_history(store, feed, 0, REFERENCE_VERSIONS, chunks_per_version)
    return store


def commit_latency(
    workdir: Path, sizes: Sequence[int], per_size: int, chunks_per_version: int
) -> dict[str, Any]:
    import txstore

    feed = OneSampleFeed(sizes[-1] + per_size * len(sizes) + 16)
    run_dir = Path(tempfile.mkdtemp(prefix="txstore-latency-", dir=workdir))
    try:
        store = txstore.create(str(run_dir / "store"))
        version, build_s, build_appends = 0, 0.0, 0
        points = []
        for target in sizes:
            start = time.perf_counter()
            version, appends = build_history(store, feed, version, target, chunks_per_version)
            build_s += time.perf_counter() - start
            build_appends += appends
            reference = reference_store(run_dir, f"reference-{target}", feed, chunks_per_version)
            point = measure_latency_point(store, reference, feed, version, target, per_size)
            point.chunks = len(store.snapshot().chunks())
            version = point.version_after
            points.append(point)
            print_latency_point(point, build_s, build_appends)
        summary = latency_summary(points, build_s, build_appends)
        summary["chunks_per_version"] = chunks_per_version
        return summary
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def measure_latency_point(
    store: Any, reference: Any, feed: OneSampleFeed, version: int, target: int, per_size: int
) -> LatencyPoint:
    """``per_size`` appends to each store in pairs, which one goes first drawn at random
    (seeded): the second append of a pair meets the disk after the first one's fsyncs, so a
    fixed order would charge one store for the other's writeback."""
    point = LatencyPoint(target, version, version, [], [])
    order = random.Random(target)
    for _ in range(per_size):
        pair = [(store, point.latencies_ms, point.user_ms, point.sys_ms)]
        pair.append(
            (reference, point.reference_ms, point.reference_user_ms, point.reference_sys_ms)
        )
        order.shuffle(pair)
        for which, wall_ms, user_ms, sys_ms in pair:
            got, wall, user, system = timed_append(which, feed)
            wall_ms.append(wall * 1000)
            user_ms.append(user * 1000)
            sys_ms.append(system * 1000)
            if which is store:
                point.version_after = got
    return point


def print_latency_point(point: LatencyPoint, build_s: float, build_appends: int) -> None:
    data = point.to_json()
    print(
        f"  at {point.version_before:>6} versions ({point.chunks:,} chunks): "
        f"median {data['median_ms']:6.2f} ms, "
        f"p90 {data['p90_ms']:6.2f} ms; reference store at ~{REFERENCE_VERSIONS}: "
        f"median {data['reference_median_ms']:6.2f} ms; mean user/system CPU "
        f"{data['user_mean_ms']:.2f}/{data['sys_mean_ms']:.2f} ms, reference "
        f"{data['reference_user_mean_ms']:.2f}/{data['reference_sys_mean_ms']:.2f} ms "
        f"(history so far: {build_appends} versions in {build_s:.1f} s)",
        flush=True,
    )


def latency_summary(
    points: Sequence[LatencyPoint], build_s: float, build_appends: int
) -> dict[str, Any]:
    rows = [p.to_json() for p in points]
    first, last = rows[0], rows[-1]
    return {
        "build_appends": build_appends,
        "build_s": build_s,
        "build_appends_per_s": build_appends / build_s if build_s else None,
        "points": rows,
        "ratio_label": f"latency@{last['target_versions']} / latency@{first['target_versions']}",
        "median_ratio": last["median_ms"] / first["median_ms"],
        "p90_ratio": last["p90_ms"] / first["p90_ms"],
        "interleaved_ratio": last["vs_reference"],
        "user_interleaved_ratio": last.get("user_vs_reference"),
        "sys_interleaved_ratio": last.get("sys_vs_reference"),
    }


def print_latency_table(summary: dict[str, Any]) -> None:
    header = (
        "| versions | chunks | median ms | p90 ms | ref median ms | ref p90 ms | vs ref "
        "| user ms | sys ms | ref user ms | ref sys ms |"
    )
    print("\n" + header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for p in summary["points"]:
        print(
            f"| {p['version_before']:>8} | {p['chunks']:>6} | {p['median_ms']:9.2f} "
            f"| {p['p90_ms']:6.2f} "
            f"| {p['reference_median_ms']:13.2f} | {p['reference_p90_ms']:10.2f} "
            f"| {p['vs_reference']:6.2f} | {p['user_mean_ms']:7.2f} | {p['sys_mean_ms']:6.2f} "
            f"| {p['reference_user_mean_ms']:11.2f} | {p['reference_sys_mean_ms']:10.2f} |"
        )
    worst = max(summary["median_ratio"], summary["interleaved_ratio"])
    verdict = "OK" if worst <= 1.5 else "ABOVE TARGET"
    print(
        f"\n{summary['ratio_label']}: median {summary['median_ratio']:.2f}x, "
        f"p90 {summary['p90_ratio']:.2f}x; against the interleaved ~{REFERENCE_VERSIONS}-version "
        f"store: {summary['interleaved_ratio']:.2f}x (target: within 1.5x -> {verdict}); "
        f"CPU time against it: user {fmt(summary['user_interleaved_ratio'], '.2f')}x, "
        f"system {fmt(summary['sys_interleaved_ratio'], '.2f')}x"
    )
    print(
        f"history build: {summary['build_appends']} versions of "
        f"{summary['chunks_per_version']} chunks in {summary['build_s']:.1f} s "
        f"({fmt(summary['build_appends_per_s'], '.0f')} versions/s)"
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10x smaller workloads (smoke run)")
    parser.add_argument("--json", type=Path, help="write all results to this JSON file")
    parser.add_argument(
        "--workdir", type=Path, default=default_workdir(), help="where temp dirs go (same disk)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per contender; median kept")
    parser.add_argument(
        "--settle", type=float, default=settle_s(), help="s to wait before each run (default 0)"
    )
    parser.add_argument(
        "--contenders",
        default=",".join(c.key for c in CONTENDERS),
        help="comma-separated subset of: " + ", ".join(c.key for c in CONTENDERS),
    )
    parser.add_argument("--workloads", default="W1,W2", help="comma-separated subset of W1,W2")
    parser.add_argument(
        "--commit-latency",
        action="store_true",
        help="instead: one-sample append latency at 10..10,000 versions, 100,000 chunks (txstore)",
    )
    parser.add_argument("--latency-samples", type=int, default=50, help="appends timed per size")
    parser.add_argument(
        "--history-chunks",
        type=int,
        default=10,
        help="chunks each version of the history adds (10: 100,000 chunks at 10,000 versions)",
    )
    return parser.parse_args(argv)


def run_throughput(args: argparse.Namespace, report: dict[str, Any]) -> None:
    contenders, missing = importable(selected(args.contenders, CONTENDERS, "key"))
    if any(c.key.startswith("litdata") for c in contenders):
        require_litdata_bytes_layout()
    workloads = [scaled(w, args.quick) for w in selected(args.workloads, WORKLOADS, "name")]
    print("payload: distinct os.urandom bytes per sample, pre-generated; generation not timed")
    print("each total = contender's write + fsync of every file it left (peers do not fsync)")
    results: list[Result] = []
    for workload in workloads:
        results += run_workload(workload, contenders, args.workdir, args.repeat)
        results += skipped_results(workload, missing)
    if any(c.key == "litdata-optimize" for c in contenders):
        report["litdata_optimize_fixed_s"] = report_optimize_fixed_cost(args.workdir)
    print_write_table(results, CONTENDERS[0].label)
    print_notes(results)
    vs_mds = txstore_vs_mds(results)
    print_vs_mds(vs_mds)
    report["results"] = [r.to_json() for r in results]
    report["txstore_vs_mds"] = vs_mds


def report_optimize_fixed_cost(workdir: Path) -> dict[str, float | None]:
    costs = {method: measure_optimize_fixed_cost(workdir, method) for method in ("fork", "spawn")}
    print(
        f"\nLitData optimize() fixed cost, one tiny sample, 1 worker: "
        f"{fmt(costs['fork'], '.2f')} s with fork (used above), "
        f"{fmt(costs['spawn'], '.2f')} s with spawn (its default outside notebooks)"
    )
    return costs


def run_latency(args: argparse.Namespace, report: dict[str, Any]) -> None:
    sizes = [10, 100, 1_000] if args.quick else [10, 100, 1_000, 10_000]
    print(
        f"\ncommit latency: one-sample appends, {args.latency_samples} timed at each of {sizes} "
        f"versions, each version of the history adding {args.history_chunks} chunks"
    )
    summary = commit_latency(args.workdir, sizes, args.latency_samples, args.history_chunks)
    print_latency_table(summary)
    report["commit_latency"] = summary


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    set_settle(args.settle)
    info = machine_info(args.workdir)
    print_machine(info)
    part = "commit-latency" if args.commit_latency else "throughput"
    report = new_report("bench_append", info, args.quick, part=part, repeat=args.repeat)
    if args.commit_latency:
        run_latency(args, report)
    else:
        run_throughput(args, report)
    finish_report(report, args.json, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
