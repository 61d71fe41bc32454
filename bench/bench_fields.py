"""Cost of adding a field to existing samples, and of reading some fields only (txstore).

A store of 200,000 samples with five fields {id: int, caption: 64-char str,
a: 1 KiB bytes, b: 1 KiB bytes, c: 2 KiB bytes} is built once (not timed). Then:

- ``add_fields(store, fn, ["latent"], num_workers=0 | 2)`` adds a 4 KiB bytes field, each run on a
  fresh copy of the store: wall time, and the bytes written, by folder (sizes of the files new or
  changed in the store folder), against the store's size and against 200,000 x 4 KiB;
- reading two of five fields (``snapshot.select(["a", "c"])`` and
  ``txstore.torch.StreamingDataset(snapshot, fields=["a", "c"])``) against a full read: bytes
  returned by the storage (a counting wrapper), bytes read by syscalls (/proc/self/io rchar,
  warm page cache) and bytes read from the disk (read_bytes, cold page cache); the same on the
  six-field version, for ["a", "c"] and for ["caption", "latent"] (chunk + field file).

    python bench/bench_fields.py [--quick] [--repeat N] [--json out.json]

``--vs-lance``: instead, on W1 (``{id: int, tokens: 2 KiB bytes}``, 200,000 samples), a field
computed from ``id`` (``id * 2``), reading only ``id``: ``add_fields(fn, ["id2"],
inputs=["id"], batch_size=...)`` (``fn`` given an Arrow RecordBatch, and given a dict of
lists) against Lance's ``add_columns(udf, read_columns=["id"])`` with the same Arrow
function, each on a fresh copy, round robin, median of ``--repeat``; the call and an fsync of
the dataset's folder are timed (txstore fsyncs what it writes; Lance does not). Needs pyarrow
and pylance besides txstore (no torch)::

    python bench/bench_fields.py --vs-lance [--quick] [--repeat N] [--json out.json]

See bench/README.md for the setup.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from txbench.output import finish_report, fmt, new_report
from txbench.system import default_workdir, evict_files, machine_info, print_machine
from txbench.workloads import MB, QUICK_FACTOR, Pool

from txstore.storage import FileInfo, Storage
from txstore.storage.base import Data

NUM_SAMPLES = 200_000
BYTES_FIELDS = {"a": 1024, "b": 1024, "c": 2048}
CAPTION_CHARS = 64
NEW_FIELD = "latent"
NEW_FIELD_BYTES = 4096
WORKER_COUNTS = (0, 2)
MATCH_SLACK = 0.02  # a projection "matches" within 2 points of the full read (footers, metadata)
WRITE_SLACK = 0.05  # add_fields "writes about n x 4 KiB" within 5%
PACKAGES = ("txstore", "torch", "zstandard", "msgspec", "numpy")
Sample = dict[str, Any]


# --------------------------------------------------------------------------- samples


class Pools:
    """Pre-generated random payloads for every field, so building a sample costs a slice."""

    def __init__(self, count: int) -> None:
        self.fields = {name: Pool(count, size) for name, size in BYTES_FIELDS.items()}
        self.captions = Pool(count, CAPTION_CHARS // 2)
        self.latent = Pool(count, NEW_FIELD_BYTES)

    def sample(self, index: int) -> Sample:
        out: Sample = {"id": index, "caption": self.captions.payload(index).hex()}
        for name, pool in self.fields.items():
            out[name] = pool.payload(index)
        return out


_POOLS: Pools | None = None  # inherited by add_fields' forked workers


def latent_of(sample: Sample) -> Sample:
    """add_fields' function: one new 4 KiB value per sample."""
    assert _POOLS is not None
    return {NEW_FIELD: _POOLS.latent.payload(sample["id"])}


def build_store(path: Path, count: int) -> float:
    import txstore

    assert _POOLS is not None
    pools = _POOLS
    start = time.perf_counter()
    store = txstore.create(str(path))  # default config: zstd, 64 MB chunks, 64 KiB blocks
    store.append(pools.sample(i) for i in range(count))
    return time.perf_counter() - start


# --------------------------------------------------------------------------- counting


class CountingStorage(Storage):
    """Delegates every call to ``inner`` and sums the bytes that reads return."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.storage_options = inner.storage_options
        self.range_merge_gap = inner.range_merge_gap
        self.bytes_read = 0
        self.reads = 0

    def _count(self, data: bytes) -> bytes:
        self.bytes_read += len(data)
        self.reads += 1
        return data

    def read(self, key: str) -> bytes:
        return self._count(self.inner.read(key))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self._count(self.inner.read_range(key, start, end))

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        data, token = self.inner.read_with_token(key)
        return self._count(data), token

    def write(self, key: str, data: Data) -> None:
        self.inner.write(key, data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self.inner.put_if_absent(key, data)

    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        self.inner.compare_and_swap(key, data, token)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> Iterator[FileInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def writer_lock(self) -> Any:
        return self.inner.writer_lock()

    def close(self) -> None:
        self.inner.close()


def proc_io() -> dict[str, int]:
    """This process's I/O counters (reaped children included)."""
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f.read().splitlines())}


def io_delta(before: dict[str, int]) -> dict[str, int]:
    after = proc_io()
    return {k: after[k] - before[k] for k in after}


def drop_cache(root: Path) -> None:
    """Evict the store's files from the page cache (they are clean: txstore fsyncs)."""
    evict_files(p for p in root.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- folders


def category(rel: str) -> str:
    if rel.startswith("chunks/"):
        return "chunks/*.fields" if rel.endswith(".fields") else "chunks/*.chunk"
    top = rel.split("/", 1)[0]
    return f"{top}/" if "/" in rel else "other"


CATEGORIES = ("chunks/*.chunk", "chunks/*.fields", "segments/", "versions/", "other")
FileState = tuple[int, int, int]  # size, inode, mtime_ns


def file_states(root: Path) -> dict[str, FileState]:
    states = {}
    for path in root.rglob("*"):
        if path.is_file():
            st = path.stat()
            states[path.relative_to(root).as_posix()] = (st.st_size, st.st_ino, st.st_mtime_ns)
    return states


def by_category(states: dict[str, FileState], keys: Iterable[str]) -> dict[str, int]:
    sums = dict.fromkeys(CATEGORIES, 0)
    for key in keys:
        sums[category(key)] += states[key][0]
    return sums


def written(before: dict[str, FileState], after: dict[str, FileState]) -> dict[str, int]:
    """Bytes of the files that are new or changed (replaced) since ``before``, by folder."""
    return by_category(after, (k for k, s in after.items() if before.get(k) != s))


# --------------------------------------------------------------------------- add_fields


@dataclass
class AddRun:
    workers: int
    wall_s: float
    written: dict[str, int]
    io: dict[str, int]
    version: int


def add_once(
    base: Path, workdir: Path, workers: int, profiler: cProfile.Profile | None = None
) -> AddRun:
    """add_fields on a fresh copy of ``base`` (the copy is not timed, nor profiled)."""
    import txstore

    run_dir = Path(tempfile.mkdtemp(prefix=f"fields-add{workers}-", dir=workdir))
    try:
        path = run_dir / "store"
        shutil.copytree(base, path)
        os.sync()
        before = file_states(path)
        store = txstore.open(str(path))
        gc.collect()
        io_before = proc_io()
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        commit = store.add_fields(latent_of, [NEW_FIELD], num_workers=workers)
        if profiler is not None:
            profiler.disable()
        wall = time.perf_counter() - start
        io = io_delta(io_before)
        check_added(store, commit.version)
        return AddRun(workers, wall, written(before, file_states(path)), io, commit.version)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def check_added(store: Any, version: int) -> None:
    assert _POOLS is not None
    new, old = store.snapshot(version), store.snapshot(version - 1)
    for i in (0, len(new) // 2, len(new) - 1):
        sample = new[i]
        if sample[NEW_FIELD] != _POOLS.latent.payload(sample["id"]) or sample["a"] != old[i]["a"]:
            raise AssertionError(f"sample {i} of version {version} is wrong")
    if NEW_FIELD in old[0]:
        raise AssertionError(f"version {version - 1} has {NEW_FIELD}")


@dataclass
class AddResult:
    workers: int
    wall_s: float
    runs_s: list[float]
    written: dict[str, int]
    store_before: dict[str, int]
    io: dict[str, int]

    @property
    def written_total(self) -> int:
        return sum(self.written.values())

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["written_total"] = self.written_total
        return data


def measure_add_fields(
    base: Path, workdir: Path, repeat: int, store_before: dict[str, int]
) -> list[AddResult]:
    runs: dict[int, list[AddRun]] = {w: [] for w in WORKER_COUNTS}
    for r in range(repeat):  # round robin
        for workers in WORKER_COUNTS:
            run = add_once(base, workdir, workers)
            runs[workers].append(run)
            print(
                f"  [{r + 1}/{repeat}] add_fields num_workers={workers}: {run.wall_s:.2f} s",
                flush=True,
            )
    results = []
    for workers, done in runs.items():
        median = sorted(done, key=lambda run: run.wall_s)[len(done) // 2]
        totals = sorted(sum(run.written.values()) for run in done)
        if totals[-1] - totals[0] > 0:
            print(
                f"  num_workers={workers}: bytes written vary by {totals[-1] - totals[0]} B "
                "between runs (timestamps in the metadata)"
            )
        results.append(
            AddResult(
                workers,
                median.wall_s,
                sorted(run.wall_s for run in done),
                median.written,
                store_before,
                median.io,
            )
        )
    return results


# --------------------------------------------------------------------------- reads


@dataclass(frozen=True)
class ReadCase:
    label: str
    version: int
    fields: tuple[str, ...] | None  # None: every field


@dataclass
class ReadResult:
    case: str
    reader: str
    fields: str
    samples: int = 0
    counted_bytes: int = 0
    counted_reads: int = 0
    warm_s: float | None = None
    warm_rchar: int = 0
    cold_s: float | None = None
    cold_read_bytes: int = 0
    cold_rchar: int = 0
    ideal_bytes: int = 0
    warm_runs_s: list[float] = field(default_factory=list)
    cold_runs_s: list[float] = field(default_factory=list)


def iterate(store: Any, case: ReadCase, reader: str, cache_dir: Path) -> int:
    """Read every sample of the case's version with ``reader``; the number of samples."""
    from txstore.torch import StreamingDataset

    snapshot = store.snapshot(case.version)
    if reader == "snapshot":
        source: Iterable[Sample] = snapshot if case.fields is None else snapshot.select(case.fields)
    else:
        fields = None if case.fields is None else list(case.fields)
        source = StreamingDataset(snapshot, fields=fields, cache_dir=str(cache_dir))
    count = 0
    for sample in source:
        if count == 0 and case.fields is not None and set(sample) != set(case.fields):
            raise AssertionError(f"{reader} returned fields {sorted(sample)}")
        count += 1
    return count


def timed_read(
    path: Path, case: ReadCase, reader: str, cold: bool, workdir: Path
) -> tuple[float, dict[str, int], int]:
    import txstore

    cache_dir = Path(tempfile.mkdtemp(prefix="fields-cache-", dir=workdir))
    try:
        store = txstore.open(str(path))
        store.snapshot(case.version).chunks()  # metadata read before the clock starts
        if cold:
            drop_cache(path)
        gc.collect()
        before = proc_io()
        start = time.perf_counter()
        count = iterate(store, case, reader, cache_dir)
        return time.perf_counter() - start, io_delta(before), count
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def counted_read(path: Path, case: ReadCase, reader: str, workdir: Path) -> tuple[int, int]:
    """(bytes, calls) that reads through the storage return, metadata included."""
    import txstore
    from txstore.storage import open_storage

    counting = CountingStorage(open_storage(str(path)))
    cache_dir = Path(tempfile.mkdtemp(prefix="fields-cache-", dir=workdir))
    try:
        iterate(txstore.open(counting), case, reader, cache_dir)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return counting.bytes_read, counting.reads


def stored_column_bytes(path: Path, version: int) -> dict[str, int]:
    """Bytes of each visible column's frames in the version's files (what a projection needs):
    the blocks' frames, and the pieces of the columns stored apart alone (as ``spans`` gives
    a reader of samples)."""
    import txstore
    from txstore.format.manifest import chunk_files

    store = txstore.open(str(path))
    reader = store.snapshot(version).reader
    sums: dict[str, int] = {}
    for chunk in store.snapshot(version).chunk_refs():
        for src in chunk_files(chunk):
            layout = reader.layout(src, version)
            for _, _, frame in layout.spans(None, pieces=False, hidden=src.hidden):
                name = layout.columns[frame.column]
                sums[name] = sums.get(name, 0) + frame.length
    return sums


READERS = ("snapshot", "torch")


def read_cases() -> list[ReadCase]:
    return [
        ReadCase("v1 (5 fields)", 1, None),
        ReadCase("v1 (5 fields)", 1, ("a", "c")),
        ReadCase("v2 (+latent)", 2, None),
        ReadCase("v2 (+latent)", 2, ("a", "c")),
        ReadCase("v2 (+latent)", 2, ("caption", NEW_FIELD)),
    ]


def measure_reads(path: Path, workdir: Path, repeat: int, count: int) -> list[ReadResult]:
    columns = {v: stored_column_bytes(path, v) for v in (1, 2)}
    results: dict[tuple[int, str], ReadResult] = {}
    for n, case in enumerate(read_cases()):
        for reader in READERS:
            fields = "all" if case.fields is None else ",".join(case.fields)
            res = ReadResult(case.label, reader, fields)
            wanted = columns[case.version] if case.fields is None else case.fields
            res.ideal_bytes = sum(columns[case.version].get(f, 0) for f in wanted)
            res.counted_bytes, res.counted_reads = counted_read(path, case, reader, workdir)
            results[(n, reader)] = res
    for r in range(repeat):  # round robin over cases, readers and cache states
        for cold in (False, True):
            for n, case in enumerate(read_cases()):
                for reader in READERS:
                    record_read(results[(n, reader)], path, case, reader, cold, workdir, count)
        print(f"  [{r + 1}/{repeat}] reads done", flush=True)
    return [finish_read(res) for res in results.values()]


def record_read(
    res: ReadResult, path: Path, case: ReadCase, reader: str, cold: bool, workdir: Path, count: int
) -> None:
    seconds, io, samples = timed_read(path, case, reader, cold, workdir)
    if samples != count:
        raise AssertionError(f"{reader} read {samples} samples, expected {count}")
    res.samples = samples
    if cold:
        res.cold_runs_s.append(seconds)
        res.cold_read_bytes, res.cold_rchar = io["read_bytes"], io["rchar"]
    else:
        res.warm_runs_s.append(seconds)
        res.warm_rchar = io["rchar"]


def finish_read(res: ReadResult) -> ReadResult:
    res.warm_runs_s.sort()
    res.cold_runs_s.sort()
    res.warm_s = statistics.median(res.warm_runs_s) if res.warm_runs_s else None
    res.cold_s = statistics.median(res.cold_runs_s) if res.cold_runs_s else None
    return res


# --------------------------------------------------------------------------- reporting


def mb(n: int | None) -> str:
    return "-" if n is None else f"{n / MB:,.1f}"


def print_store(sizes: dict[str, int], build_s: float, count: int) -> None:
    total = sum(sizes.values())
    print(
        f"\nstore: {count:,} samples, {mb(total)} MB on disk, built in {build_s:.1f} s "
        "(not timed); by folder: " + ", ".join(f"{k} {v:,} B" for k, v in sizes.items())
    )


def print_add_table(results: Sequence[AddResult], count: int) -> list[dict[str, Any]]:
    ideal = count * NEW_FIELD_BYTES
    print(
        f"\nadd_fields(store, fn, ['{NEW_FIELD}']): a {NEW_FIELD_BYTES} B bytes field on "
        f"{count:,} samples; ideal {mb(ideal)} MB (n x 4 KiB); bytes written, by folder:"
    )
    cells = [f"{c} B" for c in CATEGORIES]
    header = "| workers | wall s | " + " | ".join(cells) + " | total MB | / ideal | / store |"
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    verdicts = []
    for r in results:
        store = sum(r.store_before.values())
        parts = " | ".join(
            f"{r.written[c]:>{len(cell)},}" for c, cell in zip(CATEGORIES, cells, strict=True)
        )
        print(
            f"| {r.workers:>7} | {r.wall_s:6.2f} | {parts} | {mb(r.written_total):>8} "
            f"| {r.written_total / ideal:7.3f} | {r.written_total / store:7.3f} |"
        )
        met = r.written_total <= ideal * (1 + WRITE_SLACK) and r.written["chunks/*.chunk"] == 0
        verdicts.append(
            {"workers": r.workers, "written_over_ideal": r.written_total / ideal, "met": met}
        )
    for r in results:
        runs = ", ".join(f"{t:.2f}" for t in r.runs_s)
        print(
            f"  num_workers={r.workers}: runs {runs} s; /proc/self/io (workers included): "
            f"read {mb(r.io['rchar'])} MB (rchar), wrote {mb(r.io['wchar'])} MB (wchar), "
            f"{mb(r.io['write_bytes'])} MB to disk (write_bytes)"
        )
    ok = all(v["met"] for v in verdicts)
    print(
        f"target: about n x 4 KiB plus small metadata, no chunk rewritten "
        f"(within {WRITE_SLACK:.0%}) -> {'yes' if ok else 'NO'}"
    )
    return verdicts


def print_read_table(results: Sequence[ReadResult]) -> list[dict[str, Any]]:
    print(
        "\nreads: bytes moved per read of every sample; fraction = / the full read of the "
        "same version and reader"
    )
    header = (
        "| version | reader | fields | ideal frac | counted MB | frac | rchar MB (warm) | frac "
        "| disk MB (cold) | frac | warm s | cold s |"
    )
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    full = {(r.case, r.reader): r for r in results if r.fields == "all"}
    verdicts = []
    for r in results:
        f = full[(r.case, r.reader)]
        fr = {
            "ideal": r.ideal_bytes / f.ideal_bytes,
            "counted": r.counted_bytes / f.counted_bytes,
            # None when the full read went through a map, which syscalls do not count.
            "rchar": r.warm_rchar / f.warm_rchar if f.warm_rchar * 2 >= f.counted_bytes else None,
            "disk": r.cold_read_bytes / f.cold_read_bytes if f.cold_read_bytes else None,
        }
        print(
            f"| {r.case} | {r.reader} | {r.fields} | {fr['ideal']:.3f} | {mb(r.counted_bytes)} "
            f"| {fr['counted']:.3f} | {mb(r.warm_rchar)} | {fmt(fr['rchar'], '.3f')} "
            f"| {mb(r.cold_read_bytes)} | {fmt(fr['disk'], '.3f')} "
            f"| {fmt(r.warm_s, '.2f')} | {fmt(r.cold_s, '.2f')} |"
        )
        if r.fields != "all":
            verdicts.append(read_verdict(r, fr))
    return verdicts


def read_verdict(r: ReadResult, fractions: dict[str, float | None]) -> dict[str, Any]:
    ideal = fractions["ideal"] or 0.0

    def matches(value: float | None) -> bool | None:
        return None if value is None else value <= ideal + MATCH_SLACK

    return {
        "case": r.case,
        "reader": r.reader,
        "fields": r.fields,
        "fractions": fractions,
        "counted_matches": matches(fractions["counted"]),
        "rchar_matches": matches(fractions["rchar"]),
        "disk_matches": matches(fractions["disk"]),
    }


def print_read_verdicts(verdicts: Sequence[dict[str, Any]]) -> None:
    print(
        f"\ntarget: reading some fields moves a matching fraction of the bytes (within "
        f"{MATCH_SLACK:.0%} of the full read above the ideal fraction):"
    )
    for v in verdicts:
        marks = ", ".join(
            f"{k} {'-' if v[k + '_matches'] is None else ('yes' if v[k + '_matches'] else 'NO')}"
            for k in ("counted", "rchar", "disk")
        )
        print(f"  {v['case']} {v['reader']:<8} {v['fields']:<16} {marks}")
    print(
        "  counted: bytes the storage returned (for 'torch' through the counting wrapper, which "
        "StreamingDataset treats as a remote store: whole files go to its disk cache)"
    )


# --------------------------------------------------------------------------- profiling


def print_profile(label: str, profiler: cProfile.Profile, top: int) -> None:
    print(f"\ncProfile: {label}")
    pstats.Stats(profiler, stream=sys.stdout).strip_dirs().sort_stats("tottime").print_stats(top)


def profile(label: str, call: Callable[[], object], top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    profiler.disable()
    print_profile(label, profiler, top)


def run_profiles(base: Path, workdir: Path) -> None:
    import txstore

    profiler = cProfile.Profile()
    add_once(base, workdir, 0, profiler)
    print_profile("add_fields, num_workers=0 (the call only)", profiler, 25)
    store = txstore.open(str(base))
    case = ReadCase("v1", 1, ("a", "c"))
    for reader in READERS:
        cache = Path(tempfile.mkdtemp(prefix="fields-cache-", dir=workdir))
        try:
            profile(
                f"{reader} read of {case.fields}, v1, warm",
                partial(iterate, store, case, reader, cache),
                20,
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10x fewer samples (smoke run)")
    parser.add_argument("--json", type=Path, help="write all results to this JSON file")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; median kept")
    parser.add_argument(
        "--workdir", type=Path, default=default_workdir(), help="where temp dirs go (same disk)"
    )
    parser.add_argument("--skip-reads", action="store_true", help="only add_fields")
    parser.add_argument("--profile", action="store_true", help="also cProfile add_fields and reads")
    parser.add_argument(
        "--vs-lance", action="store_true", help="only a field from id, against Lance add_columns"
    )
    parser.add_argument(
        "--batch-size", type=int, default=65_536, help="--vs-lance: rows per call of fn"
    )
    return parser.parse_args(argv)


def machine(workdir: Path) -> dict[str, Any]:
    return machine_info(workdir, PACKAGES)


def main(argv: Sequence[str] | None = None) -> int:
    global _POOLS
    started = time.perf_counter()
    args = parse_args(argv)
    if args.vs_lance:
        return vs_lance(args, started)
    import txstore.torch  # noqa: F401  (torch is imported before any timing)

    info = machine(args.workdir)
    print_machine(info)
    report = new_report("bench_fields", info, args.quick, repeat=args.repeat)
    count = NUM_SAMPLES // (QUICK_FACTOR if args.quick else 1)
    start = time.perf_counter()
    _POOLS = Pools(count)
    print(f"payload pools generated in {time.perf_counter() - start:.1f} s (not timed)")
    base_dir = Path(tempfile.mkdtemp(prefix="fields-base-", dir=args.workdir))
    try:
        base = base_dir / "store"
        build_s = build_store(base, count)
        sizes = by_category(file_states(base), file_states(base))
        print_store(sizes, build_s, count)
        adds = measure_add_fields(base, args.workdir, args.repeat, sizes)
        report["store_bytes"] = sizes
        report["add_fields"] = [a.to_json() for a in adds]
        report["add_fields_verdict"] = print_add_table(adds, count)
        if args.profile:
            run_profiles(base, args.workdir)
        if not args.skip_reads:
            run_reads(base, args, report, count)
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)
    finish_report(report, args.json, started)
    return 0


def run_reads(base: Path, args: argparse.Namespace, report: dict[str, Any], count: int) -> None:
    import txstore

    print("\nreads: version 1 = the five fields; version 2 = add_fields(latent) on it (2 workers)")
    txstore.open(str(base)).add_fields(latent_of, [NEW_FIELD], num_workers=2)
    reads = measure_reads(base, args.workdir, args.repeat, count)
    report["reads"] = [asdict(r) for r in reads]
    verdicts = print_read_table(reads)
    print_read_verdicts(verdicts)
    report["read_verdicts"] = verdicts


# --------------------------------------------------------------------------- --vs-lance

W1_PAYLOAD = 2 * 1024
VS_LANCE_TARGET = 1.2  # txstore's add-field rate over Lance's, at least


def _w1_table(count: int) -> Any:
    import pyarrow as pa

    blob = os.urandom(count * W1_PAYLOAD)
    tokens = [blob[i * W1_PAYLOAD : (i + 1) * W1_PAYLOAD] for i in range(count)]
    return pa.table({"id": pa.array(range(count), pa.int64()), "tokens": pa.array(tokens)})


def _copy(base: Path, workdir: Path) -> Path:
    out = Path(tempfile.mkdtemp(prefix="fields-copy-", dir=workdir)) / "ds"
    shutil.copytree(base, out)
    _fsync_tree(out)  # the copy's own writes are not the add's to pay for
    return out


def _fsync_tree(root: Path) -> None:
    for dirpath, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _twice_arrow(batch: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pa.record_batch([pc.multiply(batch.column("id"), 2)], names=["id2"])


def _twice_dict(batch: dict[str, list[Any]]) -> dict[str, Any]:
    return {"id2": [i * 2 for i in batch["id"]]}


def _run_txstore(path: Path, batch_size: int, arrow: bool) -> float:
    import txstore

    store = txstore.open(str(path))
    start = time.perf_counter()
    if arrow:
        store.add_fields(
            _twice_arrow, ["id2"], inputs=["id"], batch_size=batch_size, batch_format="arrow"
        )
    else:
        store.add_fields(_twice_dict, ["id2"], inputs=["id"], batch_size=batch_size)
    _fsync_tree(path)
    return time.perf_counter() - start


def _run_lance(path: Path, batch_size: int) -> float:
    import lance

    dataset = lance.dataset(str(path))
    udf = lance.batch_udf()(_twice_arrow)
    start = time.perf_counter()
    dataset.add_columns(udf, read_columns=["id"], batch_size=batch_size)
    _fsync_tree(path)
    return time.perf_counter() - start


def _check_txstore(path: Path, count: int) -> None:
    import txstore

    snap = txstore.open(str(path)).snapshot()
    got = [s["id2"] for s in snap.select(["id2"])]
    if got != [2 * i for i in range(count)]:
        raise SystemExit(f"txstore: id2 is wrong in {path}")


def _check_lance(path: Path, count: int) -> None:
    import lance

    got = lance.dataset(str(path)).to_table(columns=["id2"]).column("id2").to_pylist()
    if got != [2 * i for i in range(count)]:
        raise SystemExit(f"lance: id2 is wrong in {path}")


def _read_id_txstore(path: Path) -> float:
    """``to_arrow(fields=["id"])`` on a store opened now (footers not yet read)."""
    import txstore

    store = txstore.open(str(path))
    start = time.perf_counter()
    table = store.snapshot().to_arrow(fields=["id"])
    seconds = time.perf_counter() - start
    assert table.num_rows > 0
    return seconds


def _read_id_lance(path: Path) -> float:
    import lance

    start = time.perf_counter()
    table = lance.dataset(str(path)).to_table(columns=["id"])
    seconds = time.perf_counter() - start
    assert table.num_rows > 0
    return seconds


def _id_frames(path: Path) -> tuple[list[tuple[str, list[tuple[int, int]]]], bool]:
    """Each chunk file of the store and the (offset, length) of its id frames; whether id is
    stored apart (in pieces of its own) rather than in every block."""
    import txstore
    from txstore.format.chunk import parse_footer

    snap = txstore.open(str(path)).snapshot()
    out = []
    apart = False
    for chunk in snap.chunk_refs():
        file = path / chunk.path
        with open(file, "rb") as f:  # the footer alone, not the chunk
            f.seek(chunk.footer_offset)
            tail = f.read()
        layout = parse_footer(tail, str(file), chunk.footer_offset)
        column = layout.columns.index("id")
        blocks = layout.footer.blocks
        frames = [(f.offset, f.length) for b in blocks for f in b.frames if f.column == column]
        if column in layout.apart:  # stored apart (docs/format.md §7.6): its pieces
            frames = [(f.offset, f.length) for f in layout.apart[column].frames]
            apart = True
        out.append((str(file), frames))
    return out, apart


def _read_id_frames(frames: list[tuple[str, list[tuple[int, int]]]]) -> float:
    """The floor under any reader of id in this layout: one pread per frame, nothing else."""
    start = time.perf_counter()
    for name, spans in frames:
        fd = os.open(name, os.O_RDONLY)
        try:
            for offset, length in spans:
                os.pread(fd, length, offset)
        finally:
            os.close(fd)
    return time.perf_counter() - start


def vs_lance(args: argparse.Namespace, started: float) -> int:
    import lance

    import txstore

    info = machine_info(args.workdir, ("txstore", "pyarrow", "pylance", "numpy"))
    print_machine(info)
    report = new_report("bench_fields_vs_lance", info, args.quick, repeat=args.repeat)
    count = NUM_SAMPLES // (QUICK_FACTOR if args.quick else 1)
    base_dir = Path(tempfile.mkdtemp(prefix="fields-lance-", dir=args.workdir))
    try:
        table = _w1_table(count)
        bases = {"txstore": base_dir / "txstore", "lance": base_dir / "lance"}
        txstore.create(str(bases["txstore"])).append(table)  # default config
        lance.write_dataset(table, str(bases["lance"]))
        del table
        runs: dict[str, Callable[[Path], float]] = {
            "txstore (Arrow batch)": partial(_run_txstore, batch_size=args.batch_size, arrow=True),
            "txstore (dict of lists)": partial(
                _run_txstore, batch_size=args.batch_size, arrow=False
            ),
            "lance add_columns": partial(_run_lance, batch_size=args.batch_size),
        }
        checks = {"txstore": _check_txstore, "lance": _check_lance}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for turn in range(args.repeat):
            order = list(runs) if turn % 2 == 0 else list(reversed(runs))
            for name in order:
                system = "lance" if name.startswith("lance") else "txstore"
                copy = _copy(bases[system], args.workdir)
                try:
                    gc.collect()
                    times[name].append(runs[name](copy))
                    if turn == 0:
                        checks[system](copy, count)
                finally:
                    shutil.rmtree(copy.parent, ignore_errors=True)
        # Reading id alone, warm: where the add's time goes, and what bounds it.
        frames, id_apart = _id_frames(bases["txstore"])
        reads: dict[str, Callable[[], float]] = {
            "txstore to_arrow(fields=['id'])": partial(_read_id_txstore, bases["txstore"]),
            "lance to_table(columns=['id'])": partial(_read_id_lance, bases["lance"]),
            "one pread per id frame (no decode)": partial(_read_id_frames, frames),
        }
        read_times: dict[str, list[float]] = {name: [] for name in reads}
        for _ in range(args.repeat):
            for name, read in reads.items():
                read_times[name].append(read())
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    lance_s = medians["lance add_columns"]
    print(f"\nW1, {count:,} samples: a field computed from id (id * 2), reading only id")
    print(f"{'':26} {'median s':>9} {'samples/s':>12} {'vs lance':>9}")
    rows = []
    for name, median in medians.items():
        speed = lance_s / median
        print(f"{name:26} {median:9.4f} {count / median:12,.0f} {speed:8.2f}x")
        rows.append({"system": name, "median_s": median, "runs_s": times[name], "vs_lance": speed})
    best = lance_s / medians["txstore (Arrow batch)"]
    verdict = "met" if best >= VS_LANCE_TARGET else "NOT met"
    print(f"target: txstore (same Arrow function) >= {VS_LANCE_TARGET}x Lance's rate: {verdict}")
    print(f"\nreading id alone, warm ({sum(len(f) for _, f in frames):,} id frames in "
          f"{len(frames)} chunks):")  # fmt: skip
    read_rows = []
    for name, seconds in read_times.items():
        median = statistics.median(seconds)
        print(f"{name:36} {median * 1e3:9.2f} ms")
        read_rows.append({"read": name, "median_s": median, "runs_s": seconds})
    report["samples"] = count
    report["batch_size"] = args.batch_size
    report["add_field_from_id"] = rows
    report["id_frames"] = sum(len(f) for _, f in frames)
    report["id_apart"] = id_apart
    report["read_id"] = read_rows
    report["target"] = {"ratio": VS_LANCE_TARGET, "got": best, "met": best >= VS_LANCE_TARGET}
    finish_report(report, args.json, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
