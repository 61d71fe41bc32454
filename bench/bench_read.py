"""Read speed of txstore side by side with LitData and MosaicML Streaming.

Each workload is written once per contender (not timed); then every
measurement runs in a fresh child process, round robin over the contenders, with the page cache
warm (every file of the dataset read just before) and cold (caches dropped after the dataset is
opened, just before the timed part):

- sequential iteration in one process;
- a DataLoader with 2 workers and batch 64: samples/s over the epoch, time to first batch;
- random access ``ds[i]``: p50, p90, p99 and the slowest latency over the same random indices
  for everyone;
- peak memory of the process and its DataLoader workers.

    python bench/bench_read.py [--quick] [--json out.json]

See bench/README.md for the setup and the fairness rules.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import gc
import json
import os
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from txbench.measure import check_complete
from txbench.output import finish_report, fmt, markdown_table, new_report, ratio
from txbench.peers import (
    import_mds_writer,
    require_litdata_bytes_layout,
    txstore_append,
    write_litdata_binarywriter,
    write_mds,
)
from txbench.system import (
    TXSTORE_SRC_ENV,
    dataset_files,
    default_workdir,
    drop_page_cache,
    frozen_txstore,
    fsync_tree,
    machine_info,
    print_machine,
    use_frozen_txstore,
    warm_files,
)
from txbench.workloads import (
    CHUNK_BYTES,
    MB,
    WORKLOADS,
    Sample,
    Workload,
    make_samples,
    scaled,
    selected,
)

PAGE = 4096
BATCH_SIZE = 64
NUM_WORKERS = 2
RANDOM_INDICES = 5_000
QUICK_RANDOM_INDICES = 1_000
INDEX_SEED = 1234
ORDER_SEED = 5678
RSS_INTERVAL_S = 0.02
CHILD_TIMEOUT_S = 3600
STORES = ("txstore", "litdata", "mds", "memory", "floor")
#: The block a checked random read must read and hash at the least: txstore's default.
FLOOR_BLOCK = 64 * 1024
CACHES = ("warm", "cold")


# --------------------------------------------------------------------------- what is measured


@dataclass(frozen=True)
class Variant:
    """One thing timed: a task (seq, dl, ra) on one contender's dataset, opened one way."""

    key: str
    task: str
    store: str
    label: str


VARIANTS = (
    Variant("tx-ds", "seq", "txstore", "txstore StreamingDataset"),
    Variant("tx-snap", "seq", "txstore", "txstore Snapshot"),
    Variant("tx-zc", "seq", "txstore", "txstore StreamingDataset zero_copy"),
    Variant("lit", "seq", "litdata", "LitData StreamingDataset"),
    Variant("mds", "seq", "mds", "MosaicML StreamingDataset"),
    # Floors: the least any reader of the same bytes does, from one plain file of payloads.
    Variant("floor-copy", "seq", "floor", "floor: copy each payload"),
    Variant("floor-hash", "seq", "floor", "floor: xxh3 each payload (a checked view)"),
    Variant("floor-hashcopy", "seq", "floor", "floor: xxh3 + copy (a checked copy)"),
    Variant("tx-ds", "dl", "txstore", "txstore StreamingDataLoader"),
    Variant("lit", "dl", "litdata", "LitData StreamingDataLoader"),
    Variant("mds", "dl", "mds", "MosaicML + torch DataLoader"),
    Variant("mem", "dl", "memory", "in-memory samples (loader ceiling)"),
    Variant("tx-ds", "ra", "txstore", "txstore StreamingDataset[i]"),
    Variant("tx-snap", "ra", "txstore", "txstore Snapshot[i]"),
    Variant("lit", "ra", "litdata", "LitData ds[i] (default batch_decode)"),
    Variant("lit-bd0", "ra", "litdata", "LitData ds[i] batch_decode=0"),
    Variant("mds", "ra", "mds", "MosaicML ds[i]"),
    Variant("floor-pread", "ra", "floor", "floor: pread the sample"),
    Variant("floor-block", "ra", "floor", "floor: pread + xxh3 its 64 KiB block"),
)
TASK_TITLES = {
    "seq": "sequential iteration, one process",
    "dl": f"DataLoader, {NUM_WORKERS} workers, batch {BATCH_SIZE}",
    "ra": "random access ds[i]",
}
PRIMARY = {"seq": "samples_per_s", "dl": "samples_per_s", "ra": "p50_us"}


#: Results are listed in the order of VARIANTS, whatever order they ran in.
RUN_ORDER = {(v.task, v.key): i for i, v in enumerate(VARIANTS)}


def find_variant(task: str, key: str) -> Variant:
    return next(v for v in VARIANTS if v.task == task and v.key == key)


def touch(value: bytes | memoryview) -> int:
    """Read one byte of every 4 KiB page of a payload; return its length.

    The same for every contender: txstore and MosaicML hand out ``bytes`` (already copied),
    LitData zero-copy ``memoryview``s over an mmap, whose pages are only read when touched.
    """
    bytes(value[::PAGE])
    return len(value)


class PayloadCollate:
    """The collate_fn every loader gets: ids as a tensor, payloads as a list of ``bytes``.

    ``bytes(v)`` is free for ``bytes`` (txstore, MosaicML) and copies LitData's memoryviews,
    which cannot leave a worker otherwise. (LitData's default collate turns each memoryview
    into a list of one tensor per byte position: under 100 samples/s.)
    """

    def __init__(self, payload_field: str) -> None:
        self.payload_field = payload_field

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        key = self.payload_field
        return {
            "id": torch.tensor([int(s["id"]) for s in samples]),
            key: [bytes(s[key]) for s in samples],
        }


# --------------------------------------------------------------------------- page cache


def resident_fraction(paths: Sequence[Path]) -> float | None:
    """The share of the files' pages in the page cache (mmap + mincore), None if unknown."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        # mmap(addr, length, prot, flags, fd, offset)
        libc.mmap.argtypes = (
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        )
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    except (OSError, AttributeError):
        return None
    total = resident = 0
    for path in paths:
        counted = _resident_pages(libc, path)
        if counted is None:
            return None
        total, resident = total + counted[0], resident + counted[1]
    return resident / total if total else None


def _resident_pages(libc: Any, path: Path) -> tuple[int, int] | None:
    size = path.stat().st_size
    if not size:
        return 0, 0
    pages = -(-size // PAGE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(addr, size, vec) != 0:
                return None
            return pages, sum(b & 1 for b in vec.raw)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- memory


def _process_tree(pid: int) -> list[int]:
    """pid and all its descendants, from /proc/<pid>/task/<tid>/children."""
    pids, i = [pid], 0
    while i < len(pids):
        task_dir = f"/proc/{pids[i]}/task"
        i += 1
        try:
            tids = os.listdir(task_dir)
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"{task_dir}/{tid}/children") as f:
                    pids += [int(p) for p in f.read().split()]
            except OSError:
                continue
    return pids


def _memory_kib(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and VmHWM (peak RSS since exec) of one process in KiB; {} once gone."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name = line.split(":", 1)[0]
                if name in ("VmRSS", "RssAnon", "VmHWM"):
                    found[name] = int(line.split()[1])
    except OSError:
        pass
    return found


class MemorySampler:
    """Samples the memory of this process and its descendants (DataLoader workers).

    ``peak_hwm_kib``: the sum over processes of each one's VmHWM, its peak RSS since exec.
    ``peak_anon_kib``: the largest simultaneous sum of RssAnon. Forked workers count pages
    they share with their parent (torch, ...), alike for every contender.

    ``interval_s=None``: no sampling thread, only a sample at the start and one at the end.
    For timed single accesses: the thread's wake-ups took the GIL from the loop it measured
    and tripled its p99 (W1 ``snap[i]``: p99 52-92 µs with the thread, 40-46 without; the
    p50, 16-17 µs, alike). A process without workers needs no more: VmHWM is a peak already.
    """

    def __init__(self, interval_s: float | None = RSS_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.hwm_kib: dict[int, int] = {}
        self.peak_anon_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    @property
    def peak_hwm_kib(self) -> int:
        return sum(self.hwm_kib.values())

    def sample(self) -> None:
        anon = 0
        for pid in _process_tree(os.getpid()):
            found = _memory_kib(pid)
            if found:
                self.hwm_kib[pid] = max(self.hwm_kib.get(pid, 0), found.get("VmHWM", 0))
                anon += found.get("RssAnon", 0)
        self.peak_anon_kib = max(self.peak_anon_kib, anon)

    def _run(self) -> None:
        assert self.interval_s is not None
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        if self.interval_s is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()


def rss_now_mb() -> float:
    return _memory_kib(os.getpid()).get("VmRSS", 0) * 1024 / MB


# --------------------------------------------------------------------------- child: open


@dataclass(frozen=True)
class Task:
    """One measurement, run in a child process."""

    task: str
    variant: str
    workload: Workload
    path: str
    cache: str
    num_indices: int
    profile: str | None = None
    workers: int = NUM_WORKERS  # DataLoader workers (dl only)

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data)

    @staticmethod
    def from_json(text: str) -> Task:
        data = json.loads(text)
        data["workload"] = Workload(**data["workload"])
        return Task(**data)


def import_torch() -> None:
    """Every child imports torch first, so that baseline memory is alike."""
    import torch  # noqa: F401


def open_txstore(task: Task) -> Any:
    if task.variant == "tx-snap":
        import txstore

        return txstore.open(task.path).snapshot()
    from txstore.torch import StreamingDataset

    return StreamingDataset(task.path, shuffle=False, zero_copy=task.variant == "tx-zc")


def open_litdata(task: Task) -> Any:
    from litdata import StreamingDataset

    if task.variant == "lit-bd0":
        return StreamingDataset(task.path, batch_decode=0)
    return StreamingDataset(task.path)


def open_mds(task: Task) -> Any:
    import_mds_writer()  # stubs streaming.vision when torchvision is absent
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return StreamingDataset(local=task.path, batch_size=BATCH_SIZE, shuffle=False)


def open_memory(task: Task) -> Any:
    """The workload's samples, generated in this process (not timed), as an IterableDataset.

    A reference, not a contender: what the same DataLoader delivers when reading costs
    nothing, i.e. the ceiling that worker start, collate, pickling and the pipe leave.
    """
    from torch.utils.data import IterableDataset, get_worker_info

    samples = make_samples(task.workload)

    class InMemory(IterableDataset[Sample]):
        def __iter__(self) -> Iterator[Sample]:
            info = get_worker_info()
            worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
            share = -(-len(samples) // workers)
            return iter(samples[worker * share : (worker + 1) * share])

    return InMemory()


class Floor:
    """The workload's payloads in one plain file, read the least way a reader can hand
    them out (``mode``): the machine's limit for each reader, in the same run.

    seq: over maps of the file (``CHUNK_BYTES`` each), ``copy`` copies each payload into
    ``bytes`` (an unchecked copying reader), ``hash`` hashes it and hands out the view (a
    checked zero-copy reader), ``hashcopy`` both (a checked copying reader). ra: ``pread``
    reads the sample's own bytes, ``block`` reads and hashes the ``FLOOR_BLOCK`` around it
    and copies the sample out.
    """

    def __init__(self, path: Path, workload: Workload, mode: str) -> None:
        import xxhash

        self.size, self.count, self.mode = workload.payload_size, workload.num_samples, mode
        self.key = workload.payload_field
        self.hash = xxhash.xxh3_64_intdigest
        self.fd = os.open(path / FLOOR_FILE, os.O_RDONLY)
        self.length = os.fstat(self.fd).st_size

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Sample]:
        import mmap

        size, key, digest = self.size, self.key, self.hash
        # A map per CHUNK_BYTES of payloads, dropped once read, as readers of chunks do: one
        # map of the whole file pins every page read in this process.
        per_map = max(1, CHUNK_BYTES // size)
        for first in range(0, self.count, per_map):
            start = first * size
            offset = start - start % mmap.ALLOCATIONGRANULARITY
            length = min(per_map, self.count - first) * size + start - offset
            mapped = mmap.mmap(self.fd, length, access=mmap.ACCESS_READ, offset=offset)
            mapped.madvise(mmap.MADV_WILLNEED)  # as txstore does for a chunk it reads whole
            view = memoryview(mapped)
            at = start - offset
            for i in range(first, min(first + per_map, self.count)):
                value = view[at : at + size]
                at += size
                if self.mode != "copy":
                    digest(value)
                yield {"id": i, key: value if self.mode == "hash" else bytes(value)}
            del view, mapped  # unmapped once the last value handed out is dropped

    def __getitem__(self, i: int) -> Sample:
        start = i * self.size
        if self.mode == "pread":
            return {"id": i, self.key: os.pread(self.fd, self.size, start)}
        first = start // FLOOR_BLOCK * FLOOR_BLOCK
        end = max(first + FLOOR_BLOCK, start + self.size)
        block = os.pread(self.fd, min(end, self.length) - first, first)
        self.hash(block)
        return {"id": i, self.key: block[start - first : start - first + self.size]}


def open_floor(task: Task) -> Any:
    return Floor(Path(task.path), task.workload, task.variant.removeprefix("floor-"))


OPENERS: dict[str, Callable[[Task], Any]] = {
    "txstore": open_txstore,
    "litdata": open_litdata,
    "mds": open_mds,
    "memory": open_memory,
    "floor": open_floor,
}


def make_loader(store: str, dataset: Any, payload_field: str, workers: int) -> Any:
    kwargs: dict[str, Any] = {
        "batch_size": BATCH_SIZE,
        "num_workers": workers,
        "collate_fn": PayloadCollate(payload_field),
    }
    if store == "txstore":
        from txstore.torch import StreamingDataLoader

        return StreamingDataLoader(dataset, **kwargs)
    if store == "litdata":
        from litdata import StreamingDataLoader as LitDataLoader

        return LitDataLoader(dataset, **kwargs)
    from torch.utils.data import DataLoader

    return DataLoader(dataset, **kwargs)


# --------------------------------------------------------------------------- child: measure


def measure_sequential(dataset: Any, workload: Workload) -> dict[str, Any]:
    key = workload.payload_field
    count = id_sum = nbytes = 0
    start = time.perf_counter()
    for sample in dataset:
        count += 1
        id_sum += int(sample["id"])
        nbytes += touch(sample[key])
    elapsed = time.perf_counter() - start
    return throughput(count, nbytes, elapsed) | {
        "check": check_complete(count, id_sum, workload.num_samples)
    }


def measure_loader(task: Task, dataset: Any, store: str) -> dict[str, Any]:
    key = task.workload.payload_field
    count = id_sum = nbytes = 0
    first_batch_s = None
    start = time.perf_counter()
    loader = make_loader(store, dataset, key, task.workers)
    for batch in loader:
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - start
        count += len(batch[key])
        id_sum += int(batch["id"].sum())
        nbytes += sum(touch(v) for v in batch[key])
    elapsed = time.perf_counter() - start
    del loader
    gc.collect()
    result = throughput(count, nbytes, elapsed)
    return result | {
        "first_batch_s": first_batch_s,
        "check": check_complete(count, id_sum, task.workload.num_samples),
    }


def throughput(count: int, nbytes: int, elapsed: float) -> dict[str, Any]:
    return {
        "samples": count,
        "seconds": elapsed,
        "samples_per_s": count / elapsed if elapsed else None,
        "mb_per_s": nbytes / elapsed / MB if elapsed else None,
    }


def random_indices(num_samples: int, count: int) -> list[int]:
    """The same indices for every contender."""
    return random.Random(INDEX_SEED).sample(range(num_samples), min(count, num_samples))


def untimed_index(indices: Sequence[int]) -> int:
    """The first index that is not timed: the warm-up access."""
    timed = set(indices)
    return next(i for i in range(len(timed) + 1) if i not in timed)


def measure_random(dataset: Any, workload: Workload, indices: Sequence[int]) -> dict[str, Any]:
    key = workload.payload_field
    latencies_us: list[float] = []
    wrong = 0
    clock = time.perf_counter_ns
    for i in indices:
        start = clock()
        sample = dataset[i]
        touch(sample[key])
        latencies_us.append((clock() - start) / 1000)
        wrong += int(sample["id"]) != i
    centiles = statistics.quantiles(latencies_us, n=100, method="inclusive")
    return {
        "samples": len(indices),
        "p50_us": statistics.median(latencies_us),
        "p90_us": centiles[89],
        "p99_us": centiles[98],
        "max_us": max(latencies_us),
        "mean_us": statistics.fmean(latencies_us),
        "check": "ok" if not wrong else f"MISMATCH: {wrong} samples with the wrong id",
    }


def run_timed(task: Task, dataset: Any, store: str, indices: Sequence[int]) -> dict[str, Any]:
    if task.task == "seq":
        return measure_sequential(dataset, task.workload)
    if task.task == "dl":
        return measure_loader(task, dataset, store)
    return measure_random(dataset, task.workload, indices)


def profiled(task: Task, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run fn under cProfile when asked; the stats go to task.profile (+ a text summary)."""
    if not task.profile:
        return fn()
    profiler = cProfile.Profile()
    result = profiler.runcall(fn)
    profiler.dump_stats(task.profile)
    with open(task.profile + ".txt", "w") as out:
        stats = pstats.Stats(profiler, stream=out).strip_dirs()
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(25)
    return result


def txstore_file() -> str | None:
    module = sys.modules.get("txstore")
    return None if module is None else str(module.__file__)


def child_main(task: Task) -> dict[str, Any]:
    import_torch()
    variant = find_variant(task.task, task.variant)
    files = dataset_files(Path(task.path))
    indices = random_indices(task.workload.num_samples, task.num_indices)
    dataset = OPENERS[variant.store](task)
    if task.task == "ra":
        dataset[untimed_index(indices)]  # opens files and indexes
    info: dict[str, Any] = {"cache": task.cache}
    if task.cache == "cold":
        info["drop_method"] = drop_page_cache(files)
        info["resident_after_drop"] = resident_fraction(files)
    gc.collect()
    base_mb = rss_now_mb()
    # Random access runs in this process alone: its latencies are timed without a thread.
    interval = None if task.task == "ra" else RSS_INTERVAL_S
    with MemorySampler(interval) as sampler:
        result = profiled(task, lambda: run_timed(task, dataset, variant.store, indices))
    return (
        info
        | result
        | {
            "txstore_file": txstore_file(),
            "base_rss_mb": base_mb,
            "peak_rss_mb": sampler.peak_hwm_kib * 1024 / MB,
            "peak_anon_mb": sampler.peak_anon_kib * 1024 / MB,
            "processes": len(sampler.hwm_kib),
        }
    )


# --------------------------------------------------------------------------- parent: datasets


def write_txstore(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    note = txstore_append(out, samples, chunk_bytes=CHUNK_BYTES)
    return note + ", default compression (zstd; random payloads stored raw)"


FLOOR_FILE = "payloads.bin"


def write_floor(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    out.mkdir(parents=True)
    with open(out / FLOOR_FILE, "wb") as f:
        for sample in samples:
            f.write(sample[workload.payload_field])
    return "the payloads, one after another in one file"


WRITERS: dict[str, Callable[[Path, Sequence[Sample], Workload], str]] = {
    "txstore": write_txstore,
    "litdata": write_litdata_binarywriter,
    "mds": write_mds,
    "floor": write_floor,
}


@dataclass
class Dataset:
    store: str
    path: Path
    files: list[Path]
    write_s: float
    disk_bytes: int
    note: str


def write_datasets(workload: Workload, stores: Sequence[str], run_dir: Path) -> dict[str, Dataset]:
    start = time.perf_counter()
    samples = make_samples(workload)
    print(f"\n{workload.describe()}: generated in {time.perf_counter() - start:.1f} s")
    datasets = {}
    for store in stores:
        out = run_dir / f"{store}-{workload.name}"
        if store == "memory":  # generated by the child itself
            datasets[store] = Dataset(store, out, [], 0.0, 0, "in the child's memory")
            continue
        start = time.perf_counter()
        note = WRITERS[store](out, samples, workload)
        fsync_tree(out)
        elapsed = time.perf_counter() - start
        files = dataset_files(out)
        size = sum(p.stat().st_size for p in files)
        datasets[store] = Dataset(store, out, files, elapsed, size, note)
        print(f"  wrote {store:<8} {size / MB:8.1f} MB in {elapsed:6.1f} s (not measured): {note}")
    del samples
    gc.collect()
    return datasets


# --------------------------------------------------------------------------- parent: runs


def run_child(task: Task, timeout_s: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    command = [sys.executable, __file__, "--child", task.to_json(), "--result", result_path]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        text = Path(result_path).read_text()
        if done.returncode != 0 or not text:
            return {"error": f"exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-6000:]}"}
        result: dict[str, Any] = json.loads(text)
        return result
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    finally:
        Path(result_path).unlink(missing_ok=True)


@dataclass(frozen=True)
class RunKey:
    workload: str
    cache: str
    task: str
    variant: str
    workers: int = NUM_WORKERS  # DataLoader workers; the default for the other tasks

    def label(self) -> str:
        label = find_variant(self.task, self.variant).label
        return label if self.workers == NUM_WORKERS else f"{label}, {self.workers} workers"


def profile_path(args: argparse.Namespace, key: RunKey, repeat: int) -> str | None:
    if not args.profile or not key.variant.startswith("tx"):
        return None
    args.profile.mkdir(parents=True, exist_ok=True)
    name = f"{key.workload}-{key.cache}-{key.task}-{key.variant}-{key.workers}-{repeat}.prof"
    return str(args.profile / name)


def run_rounds(
    workload: Workload,
    datasets: dict[str, Dataset],
    variants: Sequence[Variant],
    args: argparse.Namespace,
) -> dict[RunKey, list[dict[str, Any]]]:
    """Round robin: each repeat runs every cache state, task and contender once, the
    contenders of a task in a seeded random order of the repeat's own, so that none always
    follows the same one (a run after one that freed gigabytes meets memory the VM has
    handed back to its host, which is slow to touch again)."""
    runs: dict[RunKey, list[dict[str, Any]]] = {}
    for repeat in range(args.repeat):
        for cache in args.caches:
            order = random.Random(f"{ORDER_SEED}/{workload.name}/{cache}/{repeat}")
            for task in dict.fromkeys(v.task for v in variants):
                keys = [
                    RunKey(workload.name, cache, v.task, v.key, workers)
                    for v in variants
                    if v.task == task
                    for workers in (args.workers if v.task == "dl" else [NUM_WORKERS])
                ]
                order.shuffle(keys)
                for key in keys:
                    store = find_variant(key.task, key.variant).store
                    result = run_one(workload, datasets[store], key, args, repeat)
                    runs.setdefault(key, []).append(result)
    return dict(
        sorted(
            runs.items(),
            key=lambda item: (
                args.caches.index(item[0].cache),
                RUN_ORDER[item[0].task, item[0].variant],
                item[0].workers,
            ),
        )
    )


def run_one(
    workload: Workload,
    dataset: Dataset,
    key: RunKey,
    args: argparse.Namespace,
    repeat: int,
) -> dict[str, Any]:
    if key.cache == "warm":
        warm_files(dataset.files)
    task = Task(
        key.task,
        key.variant,
        workload,
        str(dataset.path),
        key.cache,
        args.indices,
        profile_path(args, key, repeat),
        key.workers,
    )
    result = run_child(task, args.timeout)
    print(
        f"  [{repeat + 1}/{args.repeat}] {workload.name} {key.cache:<4} {key.task:<3} "
        f"{key.label():<40} {summary_of(key.task, result)}",
        flush=True,
    )
    if "error" in result:
        print(result["error"], file=sys.stderr)
    return result


def summary_of(task: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return "ERROR"
    check = "" if result.get("check") == "ok" else f"  {result.get('check')}"
    if task == "ra":
        return (
            f"p50 {result['p50_us']:8.1f} us  p90 {result['p90_us']:8.1f} us  "
            f"p99 {result['p99_us']:8.1f} us  max {result['max_us']:8.1f} us{check}"
        )
    line = f"{result['samples_per_s']:10,.0f} samples/s {result['mb_per_s']:8.1f} MB/s"
    if task == "dl":
        line += f"  first batch {fmt(result['first_batch_s'], '.3f')} s"
    return line + f"  peak {result['peak_rss_mb']:.0f} MB{check}"


# --------------------------------------------------------------------------- aggregation


NUMERIC_FIELDS = (
    "samples_per_s",
    "mb_per_s",
    "first_batch_s",
    "p50_us",
    "p90_us",
    "p99_us",
    "max_us",
    "mean_us",
    "base_rss_mb",
    "peak_rss_mb",
    "peak_anon_mb",
    "resident_after_drop",
)


def median_of(runs: Sequence[dict[str, Any]], task: str) -> dict[str, Any]:
    """Each field's median over the repeats; an error or failed check is reported instead."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return {"error": failed[0]["error"], "runs": len(runs)}
    merged: dict[str, Any] = {
        "check": next((r["check"] for r in runs if r.get("check") != "ok"), "ok"),
        "drop_method": runs[0].get("drop_method"),
        "spread": sorted(r[PRIMARY[task]] for r in runs),
    }
    for name in NUMERIC_FIELDS:
        values = [r[name] for r in runs if r.get(name) is not None]
        merged[name] = statistics.median(values) if values else None
    return merged


def aggregate(runs: dict[RunKey, list[dict[str, Any]]]) -> dict[RunKey, dict[str, Any]]:
    return {key: median_of(results, key.task) for key, results in runs.items()}


# --------------------------------------------------------------------------- ratios, targets


@dataclass(frozen=True)
class Comparison:
    """txstore's figure over a peer's, for one metric; ``better`` says which way is good."""

    metric: str
    field: str
    task: str
    ours: str
    theirs: str
    better: str  # "higher" or "lower"


COMPARISONS = (
    Comparison("seq samples/s", "samples_per_s", "seq", "tx-ds", "lit", "higher"),
    Comparison("seq samples/s", "samples_per_s", "seq", "tx-ds", "mds", "higher"),
    Comparison("seq samples/s (Snapshot)", "samples_per_s", "seq", "tx-snap", "lit", "higher"),
    Comparison("seq samples/s (Snapshot)", "samples_per_s", "seq", "tx-snap", "mds", "higher"),
    Comparison("seq samples/s (zero_copy)", "samples_per_s", "seq", "tx-zc", "lit", "higher"),
    Comparison("seq samples/s (zero_copy)", "samples_per_s", "seq", "tx-zc", "mds", "higher"),
    Comparison("DataLoader samples/s", "samples_per_s", "dl", "tx-ds", "lit", "higher"),
    Comparison("DataLoader samples/s", "samples_per_s", "dl", "tx-ds", "mds", "higher"),
    Comparison("DataLoader samples/s", "samples_per_s", "dl", "tx-ds", "mem", "higher"),
    Comparison("DataLoader samples/s (LitData)", "samples_per_s", "dl", "lit", "mem", "higher"),
    Comparison("time to first batch", "first_batch_s", "dl", "tx-ds", "lit", "lower"),
    Comparison("time to first batch", "first_batch_s", "dl", "tx-ds", "mds", "lower"),
    Comparison("DataLoader peak RSS", "peak_rss_mb", "dl", "tx-ds", "lit", "lower"),
    Comparison("DataLoader peak RSS", "peak_rss_mb", "dl", "tx-ds", "mds", "lower"),
    Comparison("ds[i] p50", "p50_us", "ra", "tx-ds", "lit", "lower"),
    Comparison("ds[i] p50 (vs batch_decode=0)", "p50_us", "ra", "tx-ds", "lit-bd0", "lower"),
    Comparison("ds[i] p50", "p50_us", "ra", "tx-ds", "mds", "lower"),
    Comparison("ds[i] p90", "p90_us", "ra", "tx-ds", "lit", "lower"),
    Comparison("ds[i] p90", "p90_us", "ra", "tx-ds", "mds", "lower"),
    Comparison("ds[i] p99", "p99_us", "ra", "tx-ds", "lit", "lower"),
    Comparison("ds[i] p99", "p99_us", "ra", "tx-ds", "mds", "lower"),
    Comparison("Snapshot[i] p50", "p50_us", "ra", "tx-snap", "lit", "lower"),
    Comparison("Snapshot[i] p50", "p50_us", "ra", "tx-snap", "mds", "lower"),
)


@dataclass(frozen=True)
class Target:
    """txstore's ``field`` over the peer's (``theirs``; its ``their_field``, by default the
    same) must be >= (higher) or <= (lower) ``bound``; without a peer, over ``scale``.

    With a ``floor`` (a Floor variant of the same task), a miss is *bounded* when the floor's
    figure misses as well and txstore's is no better than the floor's: no reader doing that
    much work reaches the target on this machine (for a peer of txstore's own variant, the
    floor's own two fields are compared).
    """

    name: str
    workloads: tuple[str, ...]
    field: str
    task: str
    theirs: str | None
    bound: float
    better: str
    ours: str = "tx-ds"
    floor: str | None = None
    their_field: str | None = None
    scale: float = 1.0
    caches: tuple[str, ...] = CACHES


BOTH = ("W1", "W2")
TARGETS = (
    Target("seq >= 2x LitData samples/s", ("W1",), "samples_per_s", "seq", "lit", 2.0, "higher"),
    *(
        Target(name, BOTH, "samples_per_s", "seq", "lit", 1.5, "higher", ours=ours, floor=floor)
        for name, ours, floor in (
            ("seq >= 1.5x LitData samples/s", "tx-ds", "floor-hashcopy"),
            # both hand out views, as LitData does by default
            ("seq zero_copy >= 1.5x LitData samples/s", "tx-zc", "floor-hash"),
        )
    ),
    Target(
        "DataLoader >= 2x LitData StreamingDataLoader",
        BOTH,
        "samples_per_s",
        "dl",
        "lit",
        2.0,
        "higher",
    ),
    Target("first batch <= LitData's", BOTH, "first_batch_s", "dl", "lit", 1.0, "lower"),
    Target(
        "ds[i] p50 <= MosaicML's", BOTH, "p50_us", "ra", "mds", 1.0, "lower", floor="floor-block"
    ),
    Target("ds[i] p50 <= 1/10 LitData default", BOTH, "p50_us", "ra", "lit", 0.1, "lower"),
    Target(
        "ds[i] p99 <= MosaicML's", BOTH, "p99_us", "ra", "mds", 1.0, "lower", floor="floor-block"
    ),
    Target(
        "Snapshot[i] p99 <= 2x its p50",
        BOTH,
        "p99_us",
        "ra",
        "tx-snap",
        2.0,
        "lower",
        ours="tx-snap",
        floor="floor-pread",
        their_field="p50_us",
        caches=("warm",),
    ),
    Target(
        "Snapshot[i] max <= 5 ms",
        BOTH,
        "max_us",
        "ra",
        None,
        1.0,
        "lower",
        ours="tx-snap",
        scale=5000.0,
        caches=("warm",),
    ),
    Target("seq peak RSS <= LitData's", BOTH, "peak_rss_mb", "seq", "lit", 1.0, "lower"),
    Target("DataLoader peak RSS <= LitData's", BOTH, "peak_rss_mb", "dl", "lit", 1.0, "lower"),
    Target("ds[i] peak RSS <= LitData's", BOTH, "peak_rss_mb", "ra", "lit", 1.0, "lower"),
)


def value_of(
    medians: dict[RunKey, dict[str, Any]],
    workload: str,
    cache: str,
    task: str,
    variant: str,
    f: str,
) -> float | None:
    found = medians.get(RunKey(workload, cache, task, variant))
    return None if found is None else found.get(f)


def comparison_rows(
    medians: dict[RunKey, dict[str, Any]], workloads: Sequence[str], caches: Sequence[str]
) -> list[dict[str, Any]]:
    rows = []
    for workload in workloads:
        for cache in caches:
            for c in COMPARISONS:
                ours = value_of(medians, workload, cache, c.task, c.ours, c.field)
                theirs = value_of(medians, workload, cache, c.task, c.theirs, c.field)
                rows.append(
                    {
                        "workload": workload,
                        "cache": cache,
                        "metric": c.metric,
                        "peer": find_variant(c.task, c.theirs).label,
                        "ratio": ratio(ours, theirs),
                        "better": c.better,
                    }
                )
    return rows


def passes(t: Target, value: float) -> bool:
    return value >= t.bound if t.better == "higher" else value <= t.bound


def bounded(t: Target, value: float | None, floor: float | None) -> bool:
    """Whether a miss is the floor's: the floor misses too, and txstore does not beat it (a
    reader that does, with threads or less work, shows the floor is not the limit)."""
    if value is None or floor is None or passes(t, value) or passes(t, floor):
        return False
    return floor >= value if t.better == "higher" else floor <= value


def target_ratio(
    medians: dict[RunKey, dict[str, Any]], t: Target, workload: str, cache: str, ours: str
) -> tuple[float | None, bool]:
    """(``ours``'s figure over the target's reference, whether anything was measured)."""
    mine = value_of(medians, workload, cache, t.task, ours, t.field)
    if t.theirs is None:
        return (None if mine is None else mine / t.scale), mine is not None
    peer = ours if t.theirs == t.ours else t.theirs
    theirs = value_of(medians, workload, cache, t.task, peer, t.their_field or t.field)
    return ratio(mine, theirs), mine is not None or theirs is not None


def target_rows(
    medians: dict[RunKey, dict[str, Any]], workloads: Sequence[str], caches: Sequence[str]
) -> list[dict[str, Any]]:
    rows = []
    for t in TARGETS:
        for workload in (w for w in workloads if w in t.workloads):
            for cache in (c for c in caches if c in t.caches):
                value, measured = target_ratio(medians, t, workload, cache, t.ours)
                if not measured:
                    continue  # not measured in this run
                met = None if value is None else passes(t, value)
                floor = None
                if t.floor is not None:
                    floor = target_ratio(medians, t, workload, cache, t.floor)[0]
                rows.append(
                    {
                        "target": t.name,
                        "workload": workload,
                        "cache": cache,
                        "ratio": value,
                        "bound": t.bound,
                        "met": met,
                        "floor": None if t.floor is None else find_variant(t.task, t.floor).label,
                        "floor_ratio": floor,
                        "bounded": bounded(t, value, floor),
                    }
                )
    return rows


# --------------------------------------------------------------------------- printing


def spread_text(values: Sequence[float], spec: str) -> str:
    return "/".join(format(v, spec) for v in values)


def throughput_rows(medians: dict[RunKey, dict[str, Any]], keys: Sequence[RunKey]) -> list[Any]:
    rows = []
    for key in keys:
        m = medians[key]
        label = key.label()
        if "error" in m:
            rows.append([key.workload, key.cache, label, "ERROR", "", "", "", "", ""])
            continue
        rows.append(
            [
                key.workload,
                key.cache,
                label,
                fmt(m["samples_per_s"], ",.0f"),
                fmt(m["mb_per_s"], ",.0f"),
                fmt(m["first_batch_s"], ".3f"),
                fmt(m["peak_rss_mb"], ",.0f"),
                fmt(m["peak_anon_mb"], ",.0f"),
                spread_text(m["spread"], ".0f") + ("" if m["check"] == "ok" else " " + m["check"]),
            ]
        )
    return rows


def latency_rows(medians: dict[RunKey, dict[str, Any]], keys: Sequence[RunKey]) -> list[Any]:
    rows = []
    for key in keys:
        m = medians[key]
        label = key.label()
        if "error" in m:
            rows.append([key.workload, key.cache, label, "ERROR", "", "", "", "", ""])
            continue
        rows.append(
            [
                key.workload,
                key.cache,
                label,
                fmt(m["p50_us"], ",.1f"),
                fmt(m["p90_us"], ",.1f"),
                fmt(m["p99_us"], ",.1f"),
                fmt(m["max_us"], ",.0f"),
                fmt(m["mean_us"], ",.1f"),
                spread_text(m["spread"], ".1f") + ("" if m["check"] == "ok" else " " + m["check"]),
            ]
        )
    return rows


def print_results(medians: dict[RunKey, dict[str, Any]]) -> None:
    keys = list(medians)
    throughput_headers = [
        "wl",
        "cache",
        "contender",
        "samples/s",
        "MB/s",
        "1st batch s",
        "peak RSS MB",
        "peak anon MB",
        "runs (samples/s)",
    ]
    for task in ("seq", "dl"):
        chosen = [k for k in keys if k.task == task]
        if chosen:
            print(f"\n{TASK_TITLES[task]}:\n")
            rows = throughput_rows(medians, chosen)
            print("\n".join(markdown_table(throughput_headers, rows)))
    chosen = [k for k in keys if k.task == "ra"]
    if chosen:
        print(f"\n{TASK_TITLES['ra']}:\n")
        headers = ["wl", "cache", "contender", "p50 us", "p90 us", "p99 us", "max us", "mean us"]
        headers.append("runs (p50 us)")
        print("\n".join(markdown_table(headers, latency_rows(medians, chosen))))


def print_comparisons(rows: Sequence[dict[str, Any]]) -> None:
    print(
        "\ntxstore / peer, same run (higher is better for samples/s, lower for the rest; "
        "the in-memory rows compare with the loader's ceiling):\n"
    )
    table = [
        [
            r["workload"],
            r["cache"],
            r["metric"],
            r["peer"],
            fmt(r["ratio"], ".2f"),
            "txstore better" if is_better(r) else ("peer better" if r["ratio"] else "-"),
        ]
        for r in rows
    ]
    headers = ["wl", "cache", "metric", "peer", "txstore/peer", ""]
    print("\n".join(markdown_table(headers, table)))


def is_better(row: dict[str, Any]) -> bool:
    value = row["ratio"]
    if value is None:
        return False
    return bool(value > 1 if row["better"] == "higher" else value < 1)


def print_targets(rows: Sequence[dict[str, Any]]) -> None:
    print("\ntargets (txstore StreamingDataset; ratio = txstore / peer):\n")
    table = [
        [
            r["target"],
            r["workload"],
            r["cache"],
            fmt(r["ratio"], ".3f"),
            verdict(r),
            fmt(r.get("floor_ratio"), ".3f"),
        ]
        for r in rows
    ]
    headers = ["target", "wl", "cache", "ratio", "verdict", "floor's ratio"]
    print("\n".join(markdown_table(headers, table)))


def verdict(row: dict[str, Any]) -> str:
    if row["met"] is None:
        return "?"
    if row["met"]:
        return "met"
    return "NOT MET, bounded by the floor" if row.get("bounded") else "NOT MET"


def print_cold_check(medians: dict[RunKey, dict[str, Any]]) -> None:
    cold = [m for k, m in medians.items() if k.cache == "cold" and "error" not in m]
    if not cold:
        return
    methods = sorted({str(m.get("drop_method")) for m in cold})
    resident = [m["resident_after_drop"] for m in cold if m["resident_after_drop"] is not None]
    worst = fmt(max(resident) if resident else None, ".1%")
    print(
        f"\ncold runs: page cache dropped by {', '.join(methods)}; dataset pages still "
        f"resident right after the drop: at most {worst} (median of repeats, mincore)"
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10x smaller workloads (smoke run)")
    parser.add_argument("--json", type=Path, help="write all results to this JSON file")
    parser.add_argument(
        "--workdir", type=Path, default=default_workdir(), help="where datasets go (same disk)"
    )
    parser.add_argument(
        "--repeat", type=int, help="runs per measurement, round robin; default 3 (--quick: 1)"
    )
    parser.add_argument("--workloads", default="W1,W2", help="comma-separated subset of W1,W2")
    parser.add_argument("--cache", default="warm,cold", help="warm,cold or one of them")
    parser.add_argument(
        "--stores", default=",".join(STORES), help="comma-separated subset of " + ",".join(STORES)
    )
    parser.add_argument(
        "--tasks",
        default="seq,dl,ra",
        help="comma-separated subset of seq (sequential), dl (DataLoader), ra (random access)",
    )
    parser.add_argument("--indices", type=int, help="random indices for ds[i]; default 5,000")
    parser.add_argument(
        "--workers",
        default=str(NUM_WORKERS),
        help=f"comma-separated DataLoader worker counts for dl; default {NUM_WORKERS} (the "
        "comparisons and targets use that count)",
    )
    parser.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S, help="per child, s")
    parser.add_argument("--profile", type=Path, help="cProfile txstore's runs into this folder")
    parser.add_argument("--keep", action="store_true", help="keep the written datasets")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.indices is None:
        args.indices = QUICK_RANDOM_INDICES if args.quick else RANDOM_INDICES
    args.caches = split_choices(args.cache, CACHES)
    try:
        args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"--workers: not a list of integers: {args.workers!r}") from None
    if not args.workers or min(args.workers) < 0:
        raise SystemExit(f"--workers: give worker counts >= 0, not {args.workers!r}")
    return args


def split_choices(text: str, allowed: Sequence[str]) -> list[str]:
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = set(chosen) - set(allowed)
    if unknown:
        raise SystemExit(f"unknown: {', '.join(sorted(unknown))}; choose from {allowed}")
    return chosen


def selected_variants(args: argparse.Namespace) -> list[Variant]:
    stores = split_choices(args.stores, STORES)
    tasks = split_choices(args.tasks, tuple(TASK_TITLES))
    return [v for task in tasks for v in VARIANTS if v.task == task and v.store in stores]


def run_workload(
    workload: Workload, variants: Sequence[Variant], args: argparse.Namespace
) -> tuple[dict[RunKey, list[dict[str, Any]]], dict[str, Any]]:
    stores = sorted({v.store for v in variants}, key=STORES.index)
    run_dir = Path(tempfile.mkdtemp(prefix=f"bench-read-{workload.name}-", dir=args.workdir))
    try:
        datasets = write_datasets(workload, stores, run_dir)
        written = {
            s: {"write_s": d.write_s, "disk_bytes": d.disk_bytes, "note": d.note}
            for s, d in datasets.items()
        }
        return run_rounds(workload, datasets, variants, args), written
    finally:
        if args.keep:
            print(f"  datasets kept in {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


def describe_method(args: argparse.Namespace) -> None:
    print(
        f"each measurement: a fresh child process (imports torch, opens the dataset), "
        f"{args.repeat} repeat(s), round robin, medians field by field\n"
        f"payload touched: len() + one byte of every {PAGE} B page of the bytes field "
        f"(bytes(v[::{PAGE}])), for every contender alike\n"
        f"warm: every file of the dataset read just before; cold: page cache dropped after "
        f"the dataset is opened, right before the timed part\n"
        f"DataLoader: {'/'.join(map(str, args.workers))} workers, batch {BATCH_SIZE}, one "
        "shared collate_fn "
        f"(ids -> tensor, payloads -> list of bytes); samples/s over the whole epoch, "
        f"worker start included\n"
        f"ds[i]: {args.indices:,} random indices (seed {INDEX_SEED}), the same for everyone, "
        f"after one untimed access\n"
        f"peak RSS: sum of VmHWM (peak RSS since exec) of the process and its workers; "
        f"peak anon: largest sum of RssAnon over them; /proc sampled every "
        f"{RSS_INTERVAL_S * 1000:.0f} ms (getrusage would report the launcher's RSS, "
        f"which ru_maxrss keeps across exec)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.environ.get(TXSTORE_SRC_ENV):
        use_frozen_txstore(os.environ[TXSTORE_SRC_ENV])
    if args.child:
        result = child_main(Task.from_json(args.child))
        Path(args.result).write_text(json.dumps(result))
        return 0
    with frozen_txstore(args.workdir, "bench-read-src-") as digest:
        run_bench(args, digest)
    return 0


def run_bench(args: argparse.Namespace, txstore_digest: str) -> None:
    started = time.perf_counter()
    info = machine_info(args.workdir) | {"txstore_frozen_sha256": txstore_digest}
    print_machine(info)
    print(
        f"txstore copied at start (sha256 of its .py files {txstore_digest}): every child "
        "imports that copy"
    )
    describe_method(args)
    variants = selected_variants(args)
    if any(v.store == "litdata" for v in variants):
        require_litdata_bytes_layout()
    workloads = [scaled(w, args.quick) for w in selected(args.workloads, WORKLOADS, "name")]
    runs: dict[RunKey, list[dict[str, Any]]] = {}
    written: dict[str, Any] = {}
    for workload in workloads:
        workload_runs, written[workload.name] = run_workload(workload, variants, args)
        runs.update(workload_runs)
    medians = aggregate(runs)
    names = [w.name for w in workloads]
    comparisons = comparison_rows(medians, names, args.caches)
    targets = target_rows(medians, names, args.caches)
    print_results(medians)
    print_cold_check(medians)
    print_comparisons(comparisons)
    print_targets(targets)
    report = json_report(args, info, written, runs, medians, comparisons, targets)
    finish_report(report, args.json, started)


def json_report(
    args: argparse.Namespace,
    info: dict[str, Any],
    written: dict[str, Any],
    runs: dict[RunKey, list[dict[str, Any]]],
    medians: dict[RunKey, dict[str, Any]],
    comparisons: list[dict[str, Any]],
    targets: list[dict[str, Any]],
) -> dict[str, Any]:
    return new_report(
        "bench_read",
        info,
        args.quick,
        repeat=args.repeat,
        written=written,
        results=[
            asdict(key) | {"label": key.label(), "median": m, "runs": runs[key]}
            for key, m in medians.items()
        ],
        comparisons=comparisons,
        targets=targets,
    )


if __name__ == "__main__":
    sys.exit(main())
