"""Append throughput of txstore side by side with LitData, MosaicML Streaming and a plain file.

Issue 2. One process runs every contender, one after another, on the same pre-generated
samples, each into a fresh directory on the same filesystem. Only sample generation is left
out of the timings. Every contender's output is fsynced after its write (timed separately), so
that all totals are durable totals, like the plain file's write + fsync.

    python bench/bench_append.py [--quick] [--json out.json]
    python bench/bench_append.py --commit-latency [--quick] [--json out.json]

See bench/README.md for the setup.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

Sample = dict[str, Any]

MB = 1_000_000
CHUNK_BYTES = 64 * 2**20
POOL_BLOCK_BYTES = 64 * 2**20
PLAIN_BUFFER_BYTES = 2**20  # faster here than unbuffered or a 64 MiB buffer
QUICK_FACTOR = 10
PEER_PACKAGES = (
    "txstore",
    "litdata",
    "mosaicml-streaming",
    "torch",
    "numpy",
    "zstandard",
    "msgspec",
    "fsspec",
)


# --------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Workload:
    name: str
    num_samples: int
    payload_field: str
    payload_size: int
    with_label: bool

    @property
    def payload_bytes(self) -> int:
        return self.num_samples * self.payload_size

    @property
    def mds_columns(self) -> dict[str, str]:
        columns = {"id": "int", self.payload_field: "bytes"}
        if self.with_label:
            columns["label"] = "int"
        return columns

    def describe(self) -> str:
        fields = f"id: int, {self.payload_field}: {self.payload_size} B bytes"
        if self.with_label:
            fields += ", label: int"
        return f"{self.name}: {self.num_samples:,} samples of {{{fields}}}"


WORKLOADS = (
    Workload("W1", 200_000, "tokens", 2 * 1024, with_label=False),
    Workload("W2", 20_000, "jpeg", 100 * 1024, with_label=True),
)


def random_payloads(count: int, size: int) -> Iterator[bytes]:
    """Distinct random payloads, sliced out of 64 MiB os.urandom blocks."""
    per_block = max(1, POOL_BLOCK_BYTES // size)
    for start in range(0, count, per_block):
        n = min(per_block, count - start)
        block = os.urandom(n * size)
        for k in range(n):
            yield block[k * size : (k + 1) * size]


def make_sample(workload: Workload, index: int, payload: bytes) -> Sample:
    sample: Sample = {"id": index, workload.payload_field: payload}
    if workload.with_label:
        sample["label"] = index % 1000
    return sample


def make_samples(workload: Workload) -> list[Sample]:
    payloads = random_payloads(workload.num_samples, workload.payload_size)
    return [make_sample(workload, i, p) for i, p in enumerate(payloads)]


def iter_samples(samples: Sequence[Sample]) -> Iterator[Sample]:
    """What every contender consumes: a generator over pre-built samples."""
    yield from samples


# --------------------------------------------------------------------------- filesystem


def fsync_tree(root: Path) -> None:
    """Fsync every file under root, then every directory, deepest first."""
    dirs: list[str] = []
    for dirpath, _dirnames, filenames in os.walk(root):
        dirs.append(dirpath)
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for dirpath in reversed(dirs):
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def default_workdir() -> Path:
    """The parent of the repository: the same disk as the repo, not a tmpfs."""
    return Path(__file__).resolve().parents[2]


def filesystem_of(path: Path) -> str:
    best = ("", "?")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            device, mountpoint, fstype = line.split()[:3]
            is_prefix = str(path).startswith(mountpoint.rstrip("/") + "/")
            if (str(path) == mountpoint or is_prefix) and len(mountpoint) >= len(best[0]):
                best = (mountpoint, f"{device} ({fstype}) on {mountpoint}")
    return best[1]


# --------------------------------------------------------------------------- contenders


def write_plain_file(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    out.mkdir(parents=True)
    key = workload.payload_field
    with open(out / "payload.bin", "wb", buffering=PLAIN_BUFFER_BYTES) as f:
        for sample in iter_samples(samples):
            f.write(sample[key])
        f.flush()
        os.fsync(f.fileno())
    return "payload bytes only, one file, write + fsync"


def _txstore_append(out: Path, samples: Sequence[Sample], **create_kwargs: Any) -> str:
    import txstore

    store = txstore.create(str(out), **create_kwargs)
    commit = store.append(iter_samples(samples))
    if commit.num_samples != len(samples):
        raise AssertionError(f"commit.num_samples={commit.num_samples}, wrote {len(samples)}")
    return f"version {commit.version}"


def write_txstore_default(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    return _txstore_append(out, samples) + ", default compression (zstd)"


def write_txstore_uncompressed(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    return _txstore_append(out, samples, compression=None) + ", compression=None"


def write_litdata_binarywriter(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    from litdata.streaming.writer import BinaryWriter  # type: ignore[import-not-found]

    writer = BinaryWriter(str(out), chunk_bytes=CHUNK_BYTES, compression=None)
    for index, sample in enumerate(iter_samples(samples)):
        writer[index] = sample
    writer.done()
    writer.merge()
    return "uncompressed, in process"


_OPTIMIZE_SAMPLES: Sequence[Sample] = ()


def _optimize_item(index: int) -> Sample:
    """optimize()'s fn: the forked worker inherits the samples, so only indices travel."""
    return _OPTIMIZE_SAMPLES[index]


def _optimize_tiny_item(index: int) -> Sample:
    return {"id": index, "tokens": b"x"}


def run_litdata_optimize(
    out: Path, fn: Callable[[int], Sample], count: int, start_method: str
) -> None:
    from litdata import optimize  # type: ignore[import-not-found]

    previous_method = multiprocessing.get_start_method(allow_none=True)
    try:
        optimize(
            fn=fn,
            inputs=list(range(count)),
            output_dir=str(out),
            chunk_bytes=CHUNK_BYTES,
            compression=None,
            num_workers=1,
            start_method=start_method,
            keep_data_ordered=True,
            verbose=False,
        )
    finally:
        # optimize() forces the process-wide start method; put it back.
        multiprocessing.set_start_method(previous_method, force=True)


def write_litdata_optimize(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    global _OPTIMIZE_SAMPLES
    _OPTIMIZE_SAMPLES = samples
    try:
        run_litdata_optimize(out, _optimize_item, len(samples), "fork")
    finally:
        _OPTIMIZE_SAMPLES = ()
    return "uncompressed, 1 worker (fork), includes fixed cost"


def import_mds_writer() -> Any:
    """streaming imports streaming.vision, which needs torchvision: stub it when absent."""
    if importlib.util.find_spec("torchvision") is None:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    from streaming import MDSWriter  # type: ignore[import-not-found]

    return MDSWriter


def write_mds(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    mds_writer = import_mds_writer()
    with mds_writer(
        out=str(out), columns=workload.mds_columns, compression=None, size_limit=CHUNK_BYTES
    ) as writer:
        for sample in iter_samples(samples):
            writer.write(sample)
    return "uncompressed"


WriteFn = Callable[[Path, Sequence[Sample], Workload], str]


def no_imports() -> None:
    """The plain file needs nothing imported."""


def import_txstore() -> None:
    import txstore  # noqa: F401


def import_litdata() -> None:
    from litdata import optimize  # noqa: F401
    from litdata.streaming.writer import BinaryWriter  # noqa: F401


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    write: WriteFn
    prepare: Callable[[], Any]
    counter: Callable[[Path], int] | None = None


def count_mds(out: Path) -> int:
    index = json.loads((out / "index.json").read_text())
    return sum(int(shard["samples"]) for shard in index["shards"])


def count_litdata(out: Path) -> int:
    index = json.loads((out / "index.json").read_text())
    return sum(int(chunk["chunk_size"]) for chunk in index["chunks"])


CONTENDERS = (
    Contender("plain", "plain file (write+fsync)", write_plain_file, no_imports),
    Contender("txstore", "txstore append (zstd)", write_txstore_default, import_txstore),
    Contender("txstore-raw", "txstore append (none)", write_txstore_uncompressed, import_txstore),
    Contender("mds", "MDSWriter", write_mds, import_mds_writer, count_mds),
    Contender(
        "litdata-writer",
        "LitData BinaryWriter",
        write_litdata_binarywriter,
        import_litdata,
        count_litdata,
    ),
    Contender(
        "litdata-optimize",
        "LitData optimize()",
        write_litdata_optimize,
        import_litdata,
        count_litdata,
    ),
)


# --------------------------------------------------------------------------- measurement


@dataclass
class Result:
    contender: str
    workload: str
    num_samples: int
    payload_bytes: int
    write_s: float | None = None
    fsync_s: float | None = None
    disk_bytes: int | None = None
    note: str = ""
    error: str | None = None
    run_totals_s: list[float] = field(default_factory=list)  # every repeat, for the spread

    @property
    def total_s(self) -> float | None:
        if self.write_s is None or self.fsync_s is None:
            return None
        return self.write_s + self.fsync_s

    @property
    def samples_per_s(self) -> float | None:
        total = self.total_s
        return None if not total else self.num_samples / total

    @property
    def mb_per_s(self) -> float | None:
        total = self.total_s
        return None if not total else self.payload_bytes / total / MB

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(total_s=self.total_s, samples_per_s=self.samples_per_s, mb_per_s=self.mb_per_s)
        return data


def is_unsupported_keyword(exc: BaseException) -> bool:
    return isinstance(exc, TypeError) and "unexpected keyword" in str(exc)


def measure(
    contender: Contender, workload: Workload, samples: Sequence[Sample], workdir: Path
) -> Result:
    result = Result(contender.label, workload.name, len(samples), workload.payload_bytes)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{contender.key}-{workload.name}-", dir=workdir))
    out = run_dir / "out"
    settle()
    try:
        start = time.perf_counter()
        note = contender.write(out, samples, workload)
        result.write_s = time.perf_counter() - start
        start = time.perf_counter()
        fsync_tree(run_dir)
        result.fsync_s = time.perf_counter() - start
        result.disk_bytes = tree_bytes(out)
        result.note = note + check_count(contender, out, len(samples))
    except Exception as exc:
        if is_unsupported_keyword(exc):
            result.note = f"skipped: {exc}"
        else:
            result.error = traceback.format_exc()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def check_count(contender: Contender, out: Path, expected: int) -> str:
    if contender.counter is None:
        return ""
    found = contender.counter(out)
    return "" if found == expected else f"; COUNT MISMATCH: index says {found}, wrote {expected}"


def median_result(results: list[Result]) -> Result:
    """The run with the median total; an error in any run is reported instead."""
    failed = [r for r in results if r.error or r.total_s is None]
    if failed:
        return failed[0]
    totals = sorted(r.total_s or 0.0 for r in results)
    chosen = sorted(results, key=lambda r: r.total_s or 0.0)[len(results) // 2]
    return replace(chosen, run_totals_s=totals)


def measure_optimize_fixed_cost(workdir: Path, start_method: str) -> float | None:
    """optimize() on one tiny sample: its per-call fixed cost (worker start-up, merge)."""
    run_dir = Path(tempfile.mkdtemp(prefix="litdata-fixed-", dir=workdir))
    try:
        start = time.perf_counter()
        run_litdata_optimize(run_dir / "out", _optimize_tiny_item, 1, start_method)
        return time.perf_counter() - start
    except Exception:
        traceback.print_exc()
        return None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def importable(contenders: Sequence[Contender]) -> tuple[list[Contender], dict[str, str]]:
    """Import every contender's package before any timing; drop those not installed."""
    ready, missing = [], {}
    for contender in contenders:
        try:
            contender.prepare()
            ready.append(contender)
        except ModuleNotFoundError as exc:
            missing[contender.label] = f"skipped: {exc}"
    return ready, missing


def shuffled(items: Sequence[T], turn: int) -> list[T]:
    """``items`` in the order of repeat ``turn``: seeded, so a run can be repeated, and
    different each repeat, so that no contender always follows the same one (on the bench VM
    the writer that always ran right after the plain file took 1.9 s, alone 1.3 s)."""
    return random.Random(turn).sample(list(items), len(items))


#: Seconds to wait after the previous run's files were deleted and synced, before the next
#: run starts (``--settle``; default 0, as before session 4). The bench VM hands freed memory
#: back to its host after about 2 s; with 3 s, txstore's W2 appends got slower (1.49 and
#: 2.03 s against 1.32 and 1.31 s) and the plain file did not (1.20 against 1.18 s).
SETTLE_S = 0.0


def settle() -> None:
    os.sync()
    time.sleep(SETTLE_S)
    gc.collect()


def run_workload(
    workload: Workload, contenders: Sequence[Contender], workdir: Path, repeat: int
) -> list[Result]:
    start = time.perf_counter()
    samples = make_samples(workload)
    generation_s = time.perf_counter() - start
    print(f"\n{workload.describe()}: payload generated in {generation_s:.1f} s (not timed)")
    measure(CONTENDERS[0], workload, samples, workdir)  # untimed warm-up of the page cache
    runs: dict[str, list[Result]] = {c.label: [] for c in contenders}
    for turn in range(repeat):  # round robin, so drift hits every contender alike
        for contender in shuffled(contenders, turn):
            runs[contender.label].append(measure(contender, workload, samples, workdir))
    results = [median_result(runs[c.label]) for c in contenders]
    for result in results:
        spread = ", ".join(f"{t:.2f}" for t in result.run_totals_s)
        print(f"  {result.contender:<28} {fmt(result.total_s, '.2f')} s  (runs: {spread})")
        if result.error:
            print(result.error, file=sys.stderr)
    return results


def skipped_results(workload: Workload, missing: dict[str, str]) -> list[Result]:
    return [
        Result(label, workload.name, workload.num_samples, workload.payload_bytes, note=note)
        for label, note in missing.items()
    ]


# --------------------------------------------------------------------------- reporting


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def find(results: Iterable[Result], label: str, workload: str) -> Result | None:
    return next((r for r in results if r.contender == label and r.workload == workload), None)


def rate_of(result: Result | None) -> float | None:
    return None if result is None else result.samples_per_s


def print_throughput_table(results: Sequence[Result]) -> None:
    plain = CONTENDERS[0].label
    header = (
        f"| {'contender':<28} | wl | {'write s':>8} | {'fsync s':>7} | {'total s':>8} "
        f"| {'samples/s':>10} | {'MB/s':>7} | {'disk MB':>8} | {'x plain':>7} |"
    )
    print("\n" + header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for r in results:
        vs_plain = ratio(r.samples_per_s, rate_of(find(results, plain, r.workload)))
        disk = None if r.disk_bytes is None else r.disk_bytes / MB
        print(
            f"| {r.contender:<28} | {r.workload} | {fmt(r.write_s, '8.2f')} "
            f"| {fmt(r.fsync_s, '7.2f')} | {fmt(r.total_s, '8.2f')} "
            f"| {fmt(r.samples_per_s, '10,.0f')} | {fmt(r.mb_per_s, '7.1f')} "
            f"| {fmt(disk, '8.1f')} | {fmt(vs_plain, '7.3f')} |"
        )


def print_notes(results: Sequence[Result]) -> None:
    print()
    for r in results:
        status = "ERROR (traceback above)" if r.error else r.note
        print(f"  {r.workload} {r.contender:<28} {status}")


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


def source_revision() -> str:
    """The commit of the checkout this script sits in, '+dirty' if txstore/ has changes."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--", "txstore") else "")


def machine_info(workdir: Path) -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in PEER_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "workdir": str(workdir),
        "workdir_fs": filesystem_of(workdir),
        "tmp_fs": filesystem_of(Path(tempfile.gettempdir())),
        "packages": versions,
        "txstore_revision": source_revision(),
    }


def print_machine(info: dict[str, Any]) -> None:
    print(f"machine: nproc={info['nproc']} usable={info['usable_cpus']} {info['platform']}")
    print(f"python:  {info['implementation']} {info['python']}")
    print(f"workdir: {info['workdir']} on {info['workdir_fs']} (tmp: {info['tmp_fs']})")
    packages = ", ".join(f"{k} {v or 'not installed'}" for k, v in info["packages"].items())
    print(f"packages: {packages}")
    print(f"txstore source: {info['txstore_revision']}")


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


def timed_append(store: Any, feed: OneSampleFeed) -> tuple[int, float]:
    batch = feed.next_batch()
    start = time.perf_counter()
    commit = store.append(iter_samples(batch))
    return int(commit.version), time.perf_counter() - start


def build_history(
    store: Any, feed: OneSampleFeed, version: int, target: int, chunks_per_version: int
) -> tuple[int, int]:
    """Versions until the store has `target`; returns (version, versions made).

    The first is a real one-sample append; each later one commits `chunks_per_version`
    references to that first chunk (through ``commit_chunks``: a staged part may not name a
    chunk twice). The metadata (segments, manifests) grows exactly as if each were a new
    chunk, without writing and fsyncing 100,000 files to build the history; the timed appends
    are real appends of one new chunk each."""
    made = 0
    if version == 0:
        version, _ = timed_append(store, feed)
        made += 1
    (template,) = store.snapshot(1).chunk_refs()
    chunks = (template,) * chunks_per_version
    while version < target:
        start = store.snapshot().manifest
        version = store.commit_chunks(chunks, start=start, message="history").manifest.version
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
    latencies, reference_latencies = [], []
    version_before = version
    for _ in range(per_size):
        version, seconds = timed_append(store, feed)
        latencies.append(seconds * 1000)
        _, seconds = timed_append(reference, feed)
        reference_latencies.append(seconds * 1000)
    return LatencyPoint(target, version_before, version, latencies, reference_latencies)


def print_latency_point(point: LatencyPoint, build_s: float, build_appends: int) -> None:
    data = point.to_json()
    print(
        f"  at {point.version_before:>6} versions ({point.chunks:,} chunks): "
        f"median {data['median_ms']:6.2f} ms, "
        f"p90 {data['p90_ms']:6.2f} ms; reference store at ~{REFERENCE_VERSIONS}: "
        f"median {data['reference_median_ms']:6.2f} ms "
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
    }


def print_latency_table(summary: dict[str, Any]) -> None:
    header = "| versions | chunks | median ms | p90 ms | ref median ms | ref p90 ms | vs ref |"
    print("\n" + header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for p in summary["points"]:
        print(
            f"| {p['version_before']:>8} | {p['chunks']:>6} | {p['median_ms']:9.2f} "
            f"| {p['p90_ms']:6.2f} "
            f"| {p['reference_median_ms']:13.2f} | {p['reference_p90_ms']:10.2f} "
            f"| {p['vs_reference']:6.2f} |"
        )
    worst = max(summary["median_ratio"], summary["interleaved_ratio"])
    verdict = "OK" if worst <= 1.5 else "ABOVE TARGET"
    print(
        f"\n{summary['ratio_label']}: median {summary['median_ratio']:.2f}x, "
        f"p90 {summary['p90_ratio']:.2f}x; against the interleaved ~{REFERENCE_VERSIONS}-version "
        f"store: {summary['interleaved_ratio']:.2f}x (target: within 1.5x -> {verdict})"
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
        "--settle", type=float, default=SETTLE_S, help="s to wait before each run (default 0)"
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


def selected(names: str, items: Sequence[Any], attr: str) -> list[Any]:
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = set(wanted) - {getattr(i, attr) for i in items}
    if unknown:
        raise SystemExit(f"unknown: {', '.join(sorted(unknown))}")
    return [i for i in items if getattr(i, attr) in wanted]


def scaled(workload: Workload, quick: bool) -> Workload:
    if not quick:
        return workload
    return replace(workload, num_samples=workload.num_samples // QUICK_FACTOR)


def run_throughput(args: argparse.Namespace, report: dict[str, Any]) -> None:
    contenders, missing = importable(selected(args.contenders, CONTENDERS, "key"))
    workloads = [scaled(w, args.quick) for w in selected(args.workloads, WORKLOADS, "name")]
    print("payload: distinct os.urandom bytes per sample, pre-generated; generation not timed")
    print("each total = contender's write + fsync of every file it left (peers do not fsync)")
    results: list[Result] = []
    for workload in workloads:
        results += run_workload(workload, contenders, args.workdir, args.repeat)
        results += skipped_results(workload, missing)
    if any(c.key == "litdata-optimize" for c in contenders):
        report["litdata_optimize_fixed_s"] = report_optimize_fixed_cost(args.workdir)
    print_throughput_table(results)
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
    args = parse_args(argv)
    global SETTLE_S
    SETTLE_S = args.settle
    info = machine_info(args.workdir)
    print_machine(info)
    report: dict[str, Any] = {"machine": info, "quick": args.quick, "argv": sys.argv[1:]}
    if args.commit_latency:
        run_latency(args, report)
    else:
        run_throughput(args, report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
