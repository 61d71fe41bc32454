"""Why two harnesses rank LitData and txstore differently on W2 (20,000 x 100 KiB, warm).

One run measures, side by side, each system's sequential epoch and its 2-worker DataLoader
epoch (batch 64) across the factors that differ between harnesses:

- LitData's layout: ``lit-bytes`` (``jpeg`` as ``bytes``: LitData's bytes serializer, which
  hands out memoryviews over its mmap), ``lit-numpy`` (``jpeg`` as a 1-D uint8 array),
  ``lit-arrow`` (``jpeg`` as ``bytes``, pyarrow importable when writing and reading, which
  makes LitData store dict rows as an Arrow footer); each with the default ``batch_decode``
  and ``batch_decode=0``;
- txstore: ``StreamingDataset(store.snapshot())`` and with ``zero_copy=True``, with ``jpeg``
  as ``bytes`` (``txstore``) and as a 1-D uint8 array (``txstore-numpy``, beside
  ``lit-numpy``);
- MosaicML Streaming (MDS), as a reference;
- what an epoch touches: ``len(sample["jpeg"])`` only, one byte of every 4 KiB page (what
  bench_read.py does), or every byte (an xxh3 hash of the value);
- sequential epochs: the first and the second one in the same process;
- DataLoader: each system's loader (LitData's and txstore's StreamingDataLoader, torch's
  DataLoader for txstore and MosaicML) with the default collate, a collate to a list of
  ``bytes``, and a collate to one stacked uint8 tensor.

Every measurement runs in a fresh child process with the dataset's files read just before
(warm page cache), in a seeded shuffled order per repeat; each figure is the median of the
repeats. pyarrow is importable only in the children of the ``lit-arrow`` layout, from
``--arrow-site`` (``pip install --no-deps --target DIR pyarrow``).

    python bench/reconcile_w2.py --arrow-site DIR [--quick] [--repeat N] [--json out.json]
        [--layouts txstore,txstore-numpy,...] [--tasks seq,dl]  (--arrow-site: for lit-arrow)

A run of some layouts or tasks replaces those rows of an earlier full run in bench/report.py.

See bench/README.md, "Why harnesses disagree on W2".
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from txbench.measure import check_complete, shuffled
from txbench.output import finish_report, fmt, markdown_table, new_report, ratio
from txbench.peers import import_mds_writer, txstore_append, write_litdata_binarywriter, write_mds
from txbench.system import (
    TXSTORE_SRC_ENV,
    dataset_files,
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
)

PAGE = 4096
BATCH_SIZE = 64
NUM_WORKERS = 2
SEQ_EPOCHS = 2
DEFAULT_WORKDIR = Path("/tmp/reconcile")
CHILD_TIMEOUT_S = 600.0
EPOCH_CAP_S = 20.0  # an epoch still running after this stops: its rate is over what it did
QUICK_EPOCH_CAP_S = 10.0
STALL_S = 10.0  # a loader with no batch this long past the cap is given up
PACKAGES = ("txstore", "litdata", "mosaicml-streaming", "torch", "numpy", "xxhash")

# --------------------------------------------------------------------------- what is measured

#: layout -> (system, how it is written)
LAYOUTS = {
    "txstore": ("txstore", "txstore_append, default compression (random payloads stored raw)"),
    "txstore-numpy": ("txstore", "txstore_append, jpeg as a 1-D uint8 numpy array, as txstore"),
    "lit-bytes": ("litdata", "BinaryWriter, jpeg as bytes, no pyarrow, uncompressed"),
    "lit-numpy": ("litdata", "BinaryWriter, jpeg as a 1-D uint8 numpy array, uncompressed"),
    "lit-arrow": ("litdata", "BinaryWriter, jpeg as bytes, pyarrow importable, uncompressed"),
    "mds": ("mds", "MDSWriter, uncompressed"),
}
TOUCHES = ("len", "page", "all")
TOUCH_TITLES = {
    "len": "len(v) only",
    "page": "one byte per 4 KiB page (bench_read.py)",
    "all": "every byte (xxh3 of v)",
}
COLLATES = ("default", "bytes", "stack")
COLLATE_TITLES = {
    "default": "the loader's default collate",
    "bytes": "ids -> tensor, jpeg -> list of bytes(v)",
    "stack": "ids -> tensor, jpeg -> one stacked uint8 tensor",
}


@dataclass(frozen=True)
class Measurement:
    """One thing timed in a child: ``task`` seq (epochs in one process) or dl (one epoch)."""

    task: str
    layout: str
    mode: str  # seq: default, batch_decode=0, zero_copy; dl: the loader
    touch: str  # seq: len, page, all; dl: the collate

    @property
    def system(self) -> str:
        return LAYOUTS[self.layout][0]

    def label(self) -> str:
        return f"{self.task} {self.layout} {self.mode} {self.touch}"


def measurements(
    layouts: Sequence[str] = tuple(LAYOUTS), tasks: Sequence[str] = ("seq", "dl")
) -> list[Measurement]:
    seq_modes = {
        "txstore": ("default", "zero_copy"),
        "txstore-numpy": ("default", "zero_copy"),
        "lit-bytes": ("default", "batch_decode=0"),
        "lit-numpy": ("default", "batch_decode=0"),
        "lit-arrow": ("default", "batch_decode=0"),
        "mds": ("default",),
    }
    loaders = {
        "txstore": ("torch DataLoader", "StreamingDataLoader"),
        "txstore-numpy": ("torch DataLoader", "StreamingDataLoader"),
        "lit-bytes": ("StreamingDataLoader",),
        "lit-numpy": ("StreamingDataLoader",),
        "lit-arrow": ("StreamingDataLoader",),
        "mds": ("torch DataLoader",),
    }
    found = [
        Measurement("seq", layout, mode, touch)
        for layout, modes in seq_modes.items()
        for mode in modes
        for touch in TOUCHES
    ]
    found += [
        Measurement("dl", layout, loader, collate)
        for layout, names in loaders.items()
        for loader in names
        for collate in COLLATES
    ]
    return [m for m in found if m.layout in layouts and m.task in tasks]


# --------------------------------------------------------------------------- child: touching


def touch_len(value: Any) -> int:
    return len(value)


def touch_page(value: Any) -> int:
    """bench_read.py's touch: one byte of every 4 KiB page, then len()."""
    bytes(value[::PAGE])
    return len(value)


def touch_all(value: Any) -> int:
    """Every byte read: an xxh3 hash of the buffer (bytes, memoryview or numpy array)."""
    import xxhash

    xxhash.xxh3_64_intdigest(value)
    return len(value)


TOUCH_FNS: dict[str, Callable[[Any], int]] = {
    "len": touch_len,
    "page": touch_page,
    "all": touch_all,
}


class BytesCollate:
    """ids to a tensor, payloads to a list of ``bytes`` (a copy of views and arrays)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        return {
            "id": torch.tensor([int(s["id"]) for s in samples]),
            self.key: [bytes(s[self.key]) for s in samples],
        }


class StackCollate:
    """ids to a tensor, payloads to one (batch, size) uint8 tensor (one copy of each)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        import numpy as np
        import torch

        rows = [np.frombuffer(s[self.key], dtype=np.uint8) for s in samples]
        return {
            "id": torch.tensor([int(s["id"]) for s in samples]),
            self.key: torch.from_numpy(np.stack(rows)),
        }


def collate_fn(name: str, key: str) -> Any:
    if name == "bytes":
        return BytesCollate(key)
    if name == "stack":
        return StackCollate(key)
    return None


def payload_bytes(value: Any) -> int:
    """The bytes a batch's payload holds, whatever the collate made of it."""
    import torch

    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, list | tuple):
        return sum(payload_bytes(v) for v in value)
    return len(value)


# --------------------------------------------------------------------------- child: open


@dataclass(frozen=True)
class Task:
    measurement: Measurement
    workload: Workload
    path: str
    arrow_site: str | None
    epochs: int
    cap_s: float

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> Task:
        data = json.loads(text)
        data["measurement"] = Measurement(**data["measurement"])
        data["workload"] = Workload(**data["workload"])
        return Task(**data)


def open_dataset(task: Task) -> Any:
    m = task.measurement
    if m.system == "txstore":
        import txstore
        from txstore.torch import StreamingDataset

        return StreamingDataset(txstore.open(task.path).snapshot(), zero_copy=m.mode == "zero_copy")
    if m.system == "litdata":
        from litdata import StreamingDataset as LitDataset

        if m.mode == "batch_decode=0":
            return LitDataset(task.path, batch_decode=0)
        return LitDataset(task.path)
    import_mds_writer()  # stubs streaming.vision when torchvision is absent
    from streaming import StreamingDataset as MDSDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return MDSDataset(local=task.path, batch_size=BATCH_SIZE, shuffle=False)


def make_loader(task: Task, dataset: Any) -> Any:
    m = task.measurement
    kwargs: dict[str, Any] = {"batch_size": BATCH_SIZE, "num_workers": NUM_WORKERS}
    collate = collate_fn(m.touch, task.workload.payload_field)
    if collate is not None:
        kwargs["collate_fn"] = collate
    if m.mode == "StreamingDataLoader" and m.system == "txstore":
        from txstore.torch import StreamingDataLoader

        return StreamingDataLoader(dataset, **kwargs)
    if m.mode == "StreamingDataLoader":
        from litdata import StreamingDataLoader as LitDataLoader

        return LitDataLoader(dataset, **kwargs)
    from torch.utils.data import DataLoader

    return DataLoader(dataset, **kwargs)


# --------------------------------------------------------------------------- child: measure


def epoch_result(
    count: int, id_sum: int, nbytes: int, elapsed: float, task: Task, capped: bool
) -> dict[str, Any]:
    n = task.workload.num_samples
    check = f"capped at {task.cap_s:.0f} s after {count:,} samples" if capped else ""
    return {
        "samples": count,
        "seconds": elapsed,
        "samples_per_s": count / elapsed if elapsed else None,
        "mb_per_s": nbytes / elapsed / MB if elapsed else None,
        "capped": capped,
        "check": check or check_complete(count, id_sum, n),
    }


def sequential_epoch(task: Task, dataset: Any) -> dict[str, Any]:
    key = task.workload.payload_field
    touch = TOUCH_FNS[task.measurement.touch]
    count = id_sum = nbytes = 0
    capped = False
    clock = time.perf_counter
    start = clock()
    deadline = start + task.cap_s
    for sample in dataset:
        count += 1
        id_sum += int(sample["id"])
        nbytes += touch(sample[key])
        if not count % BATCH_SIZE and clock() > deadline:
            capped = True
            break
    return epoch_result(count, id_sum, nbytes, clock() - start, task, capped)


def kill_children() -> None:
    """SIGKILL this process's child processes (its DataLoader workers)."""
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/children") as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            continue
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def loader_epoch(
    task: Task, dataset: Any, give_up: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """One DataLoader epoch. A loader that delivers no batch for ``STALL_S`` past the cap
    (LitData's default collate over memoryviews) is given up: ``give_up`` gets the epoch so
    far, and the workers are killed."""
    key = task.workload.payload_field
    progress = {"count": 0, "id_sum": 0, "nbytes": 0}
    first_batch_s: float | None = None
    start = time.perf_counter()
    deadline = start + task.cap_s

    def stalled() -> None:
        elapsed = time.perf_counter() - start
        epoch = epoch_result(
            progress["count"], progress["id_sum"], progress["nbytes"], elapsed, task, True
        )
        epoch["check"] += f", stalled: no batch for {STALL_S:.0f} s past the cap"
        kill_children()
        give_up(epoch | {"first_batch_s": first_batch_s})

    watchdog = threading.Timer(task.cap_s + STALL_S, stalled)
    watchdog.daemon = True
    watchdog.start()
    capped = False
    loader = make_loader(task, dataset)
    for batch in loader:
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - start
        progress["count"] += len(batch["id"])
        progress["id_sum"] += int(batch["id"].sum())
        progress["nbytes"] += payload_bytes(batch[key])
        if time.perf_counter() > deadline:
            capped = True
            break
    elapsed = time.perf_counter() - start
    watchdog.cancel()
    del loader
    gc.collect()
    count, id_sum, nbytes = progress["count"], progress["id_sum"], progress["nbytes"]
    return epoch_result(count, id_sum, nbytes, elapsed, task, capped) | {
        "first_batch_s": first_batch_s,
    }


def value_type(dataset: Any, task: Task) -> str:
    """The type of the payload a sample carries (read before the timed part, untimed)."""
    sample = next(iter(dataset))
    return type(sample[task.workload.payload_field]).__name__


def child_main(task: Task, result_path: Path) -> dict[str, Any]:
    import torch  # noqa: F401  (every child imports torch first, as the loaders need it)

    info: dict[str, Any] = {
        "pyarrow_importable": importlib.util.find_spec("pyarrow") is not None,
        "payload_type": None,
    }
    if info["pyarrow_importable"] != (task.arrow_site is not None):
        raise RuntimeError(f"pyarrow importable: {info['pyarrow_importable']}, for {task}")
    dataset = open_dataset(task)
    if task.measurement.task == "dl":

        def give_up(epoch: dict[str, Any]) -> None:
            result_path.write_text(json.dumps(info | {"epochs": [epoch]}))
            os._exit(0)

        return info | {"epochs": [loader_epoch(task, dataset, give_up)]}
    epochs = [sequential_epoch(task, dataset) for _ in range(task.epochs)]
    # After the timed epochs: a fresh iteration would count as an epoch of the dataset.
    info["payload_type"] = value_type(dataset, task)
    return info | {"epochs": epochs}


# --------------------------------------------------------------------------- child: write


def write_litdata_numpy(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    import numpy as np
    from litdata.streaming.writer import BinaryWriter

    key = workload.payload_field
    writer = BinaryWriter(str(out), chunk_bytes=CHUNK_BYTES, compression=None)
    for index, sample in enumerate(samples):
        writer[index] = sample | {key: np.frombuffer(sample[key], dtype=np.uint8)}
    writer.done()
    writer.merge()
    return "uncompressed, in process"


def arrow_footer_note(out: Path) -> str:
    """Whether LitData's chunks end with its Arrow row footer (pyarrow was importable)."""
    from litdata.streaming import item_loader

    magic = getattr(item_loader, "_ARROW_FOOTER_MAGIC", None)
    chunks = sorted(out.glob("*.bin"))
    if magic is None or not chunks:
        return "Arrow footer: unknown"
    with open(chunks[0], "rb") as f:
        f.seek(-len(magic), os.SEEK_END)
        tail = f.read()
    return "chunks end with LitData's Arrow row footer" if tail == magic else "no Arrow footer"


def write_child(layout: str, out: Path, workload: Workload) -> str:
    """Write one layout (in its own process, so that only lit-arrow sees pyarrow)."""
    samples = make_samples(workload)
    if layout == "txstore":
        return txstore_append(out, samples, chunk_bytes=CHUNK_BYTES)
    if layout == "mds":
        return write_mds(out, samples, workload)
    if layout == "lit-numpy":
        return write_litdata_numpy(out, samples, workload)
    if layout == "txstore-numpy":
        import numpy as np

        key = workload.payload_field
        arrays = [s | {key: np.frombuffer(s[key], dtype=np.uint8)} for s in samples]
        return txstore_append(out, arrays, chunk_bytes=CHUNK_BYTES)
    note = write_litdata_binarywriter(out, samples, workload)
    if layout == "lit-arrow":
        note += "; " + arrow_footer_note(out)
    return note


# --------------------------------------------------------------------------- parent


@dataclass
class Dataset:
    layout: str
    path: Path
    files: list[Path]
    disk_bytes: int
    note: str


def run_python(args: Sequence[str], timeout_s: float) -> tuple[dict[str, Any] | None, str]:
    """Run this script with ``args`` + ``--result FILE``; (its JSON result, error text)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    command = [sys.executable, __file__, *args, "--result", result_path]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        text = Path(result_path).read_text()
        if done.returncode != 0 or not text:
            return None, f"exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        return json.loads(text), ""
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f} s"
    finally:
        Path(result_path).unlink(missing_ok=True)


def arrow_args(layout: str, args: argparse.Namespace) -> list[str]:
    return ["--arrow-site", str(args.arrow_site)] if layout == "lit-arrow" else []


def write_datasets(workload: Workload, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    datasets: dict[str, Dataset] = {}
    for layout in args.layouts:
        out = run_dir / layout
        start = time.perf_counter()
        write = ["--write", layout, "--out", str(out), "--workload", json.dumps(asdict(workload))]
        result, error = run_python(write + arrow_args(layout, args), args.timeout)
        if result is None:
            raise SystemExit(f"writing {layout} failed: {error}")
        fsync_tree(out)
        files = dataset_files(out)
        size = sum(p.stat().st_size for p in files)
        note = f"{LAYOUTS[layout][1]}: {result['note']}"
        datasets[layout] = Dataset(layout, out, files, size, note)
        elapsed = time.perf_counter() - start
        print(f"  wrote {layout:<9} {size / MB:8.1f} MB in {elapsed:5.1f} s (not timed): {note}")
    return datasets


def run_one(
    m: Measurement, workload: Workload, data: Dataset, args: argparse.Namespace
) -> dict[str, Any]:
    warm_files(data.files)
    task = Task(
        m,
        workload,
        str(data.path),
        str(args.arrow_site) if m.layout == "lit-arrow" else None,
        args.epochs,
        args.cap,
    )
    extra = ["--arrow-site", str(args.arrow_site)] if task.arrow_site else []
    result, error = run_python(["--child", task.to_json(), *extra], args.timeout)
    return result if result is not None else {"error": error}


def summary(result: dict[str, Any]) -> str:
    if "error" in result:
        return "ERROR"
    parts = []
    for e in result["epochs"]:
        check = "" if e["check"] == "ok" else f" ({e['check']})"
        parts.append(f"{fmt(e['samples_per_s'], ',.0f')}/s{check}")
    return "  ".join(parts)


Runs = dict[Measurement, list[dict[str, Any]]]


def run_rounds(
    workload: Workload,
    datasets: dict[str, Dataset],
    args: argparse.Namespace,
    after_repeat: Callable[[Runs, int], None],
) -> Runs:
    """Every measurement once per repeat, each repeat in its own seeded order;
    ``after_repeat(runs, done)`` after each repeat (the partial report)."""
    chosen = measurements(args.layouts, args.tasks)
    runs: Runs = {m: [] for m in chosen}
    for turn in range(args.repeat):
        for m in shuffled(chosen, turn):
            result = run_one(m, workload, datasets[m.layout], args)
            runs[m].append(result)
            print(f"  [{turn + 1}/{args.repeat}] {m.label():<48} {summary(result)}", flush=True)
            if "error" in result:
                print(result["error"], file=sys.stderr)
        after_repeat(runs, turn + 1)
    return runs


def rows_of(runs: Runs) -> list[dict[str, Any]]:
    """One row per measurement and epoch: every repeat's samples/s and their median."""
    rows = []
    for m, results in runs.items():
        epochs = max((len(r["epochs"]) for r in results if "epochs" in r), default=1)
        for epoch in range(epochs):
            found = [r["epochs"][epoch] for r in results if "epochs" in r]
            errors = [r["error"] for r in results if "error" in r]
            rates = [e["samples_per_s"] for e in found if e["samples_per_s"] is not None]
            checks = sorted({e["check"] for e in found if e["check"] != "ok"})
            types = sorted({str(r.get("payload_type")) for r in results if r.get("payload_type")})
            rows.append(
                {
                    "task": m.task,
                    "system": m.system,
                    "layout": m.layout,
                    "mode": m.mode,
                    "touch": m.touch if m.task == "seq" else "len (after the collate)",
                    "collate": m.touch if m.task == "dl" else None,
                    "epoch": epoch + 1,
                    "samples_per_s": {
                        "runs": rates,
                        "median": statistics.median(rates) if rates else None,
                    },
                    "mb_per_s_median": median_or_none([e["mb_per_s"] for e in found]),
                    "first_batch_s_median": median_or_none([e.get("first_batch_s") for e in found]),
                    "payload_type": ", ".join(types) or None,
                    "pyarrow_importable": any(r.get("pyarrow_importable") for r in results),
                    "check": "; ".join(checks) or ("ok" if found else "no run"),
                    "errors": errors,
                }
            )
    return rows


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def reference_rate(rows: Sequence[dict[str, Any]], row: dict[str, Any]) -> float | None:
    """txstore's figure to compare a row with: seq, the default dataset with the same touch
    and epoch; dl, txstore's StreamingDataLoader with the same collate."""
    if row["task"] == "seq":
        want = {"layout": "txstore", "mode": "default", "touch": row["touch"]}
    else:
        want = {"layout": "txstore", "mode": "StreamingDataLoader", "collate": row["collate"]}
    want |= {"task": row["task"], "epoch": row["epoch"]}
    for r in rows:
        if all(r[k] == v for k, v in want.items()):
            median: float | None = r["samples_per_s"]["median"]
            return median
    return None


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    headers = ["task", "layout", "mode", "touch / collate", "ep", "samples/s", "x txstore"]
    headers += ["MB/s", "value", "runs (samples/s)"]
    table = []
    for r in rows:
        rate = r["samples_per_s"]["median"]
        runs = "/".join(format(v, ".0f") for v in r["samples_per_s"]["runs"]) or "-"
        if r["check"] != "ok":
            runs += f" ({r['check']})"
        if r["errors"]:
            runs += f" ({len(r['errors'])} errors)"
        table.append(
            [
                r["task"],
                r["layout"],
                r["mode"],
                r["touch"] if r["task"] == "seq" else f"collate {r['collate']}",
                str(r["epoch"]),
                fmt(rate, ",.0f"),
                fmt(ratio(rate, reference_rate(rows, r)), ".2f"),
                fmt(r["mb_per_s_median"], ",.0f"),
                r["payload_type"] or "-",
                runs,
            ]
        )
    print(
        "\nmedians (x txstore: over txstore's default StreamingDataset with the same touch and "
        "epoch; for dl, over txstore's StreamingDataLoader with the same collate):\n"
    )
    print("\n".join(markdown_table(headers, table)))


def describe_method(workload: Workload, args: argparse.Namespace) -> None:
    touches = "; ".join(f"{k}: {v}" for k, v in TOUCH_TITLES.items())
    collates = "; ".join(f"{k}: {v}" for k, v in COLLATE_TITLES.items())
    print(
        f"{workload.describe()}, warm page cache (every file of the dataset read just before "
        f"each child)\n"
        f"each measurement: a fresh child process, {args.repeat} repeat(s), each repeat in its "
        f"own seeded order; medians\n"
        f"seq: {args.epochs} epochs in one process, each timed; touch = {touches}\n"
        f"dl: {NUM_WORKERS} workers, batch {BATCH_SIZE}, one epoch, worker start included; "
        f"collate = {collates}\n"
        f"an epoch still running after {args.cap:.0f} s stops there: its rate is over the "
        "samples it delivered (marked 'capped')"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2,000 samples, 1 repeat")
    parser.add_argument("--repeat", type=int, help="repeats of every measurement (default 3)")
    parser.add_argument("--json", type=Path, help="write the rows to this JSON file")
    parser.add_argument(
        "--workdir", type=Path, default=DEFAULT_WORKDIR, help="where the datasets go"
    )
    parser.add_argument(
        "--arrow-site",
        type=Path,
        help="a folder holding pyarrow (pip install --no-deps --target DIR pyarrow), put on "
        "sys.path only in the lit-arrow layout's processes",
    )
    parser.add_argument(
        "--layouts",
        default=",".join(LAYOUTS),
        help=f"the layouts to write and read, comma-separated (default: all: {','.join(LAYOUTS)})",
    )
    parser.add_argument(
        "--tasks", default="seq,dl", help="seq (epochs in one process), dl (DataLoader), or both"
    )
    parser.add_argument("--epochs", type=int, default=SEQ_EPOCHS, help="seq epochs per child")
    parser.add_argument("--cap", type=float, help="seconds after which an epoch stops")
    parser.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S, help="per child, s")
    parser.add_argument("--keep", action="store_true", help="keep the written datasets")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--write", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.layouts = [name for name in args.layouts.split(",") if name]
    unknown = sorted(set(args.layouts) - set(LAYOUTS))
    if unknown or not args.layouts:
        parser.error(f"--layouts: unknown {unknown}; choose from {', '.join(LAYOUTS)}")
    args.tasks = [name for name in args.tasks.split(",") if name]
    if not args.tasks or not set(args.tasks) <= {"seq", "dl"}:
        parser.error(f"--tasks: {args.tasks}: choose seq, dl or both")
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.cap is None:
        args.cap = QUICK_EPOCH_CAP_S if args.quick else EPOCH_CAP_S
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.environ.get(TXSTORE_SRC_ENV):
        use_frozen_txstore(os.environ[TXSTORE_SRC_ENV])
    if (args.child or args.write) and args.arrow_site:
        sys.path.insert(0, str(args.arrow_site))
    if args.child:
        result = child_main(Task.from_json(args.child), Path(args.result))
        Path(args.result).write_text(json.dumps(result))
        return 0
    if args.write:
        workload = Workload(**json.loads(args.workload))
        note = write_child(args.write, Path(args.out), workload)
        Path(args.result).write_text(json.dumps({"note": note}))
        return 0
    wants_arrow = "lit-arrow" in args.layouts
    if wants_arrow and (args.arrow_site is None or not (args.arrow_site / "pyarrow").is_dir()):
        raise SystemExit("--arrow-site: give a folder holding pyarrow (see --help)")
    if importlib.util.find_spec("pyarrow") is not None:
        raise SystemExit("pyarrow is importable here: only the lit-arrow layout may see it")
    args.workdir.mkdir(parents=True, exist_ok=True)
    with frozen_txstore(args.workdir, "reconcile-src-") as digest:
        run_bench(args, digest)
    return 0


def run_bench(args: argparse.Namespace, digest: str) -> None:
    started = time.perf_counter()
    info = machine_info(args.workdir, PACKAGES) | {"txstore_frozen_sha256": digest}
    print_machine(info)
    workload = scaled(next(w for w in WORKLOADS if w.name == "W2"), args.quick)
    describe_method(workload, args)
    report = new_report(
        "reconcile_w2",
        info,
        args.quick,
        repeat=args.repeat,
        workload=asdict(workload),
        epochs=args.epochs,
        epoch_cap_s=args.cap,
        touches=TOUCH_TITLES,
        collates=COLLATE_TITLES,
    )

    def partial(runs: Runs, done: int) -> None:
        """The report so far, rewritten after each repeat (a run cut short keeps it)."""
        if args.json is None or done == args.repeat:
            return
        args.json.parent.mkdir(parents=True, exist_ok=True)
        partial_report = report | {"partial": f"{done} of {args.repeat} repeats"}
        args.json.write_text(json.dumps(partial_report | {"rows": rows_of(runs)}, indent=2))
        print(f"  partial report ({done} of {args.repeat} repeats) written to {args.json}")

    run_dir = Path(tempfile.mkdtemp(prefix="reconcile-w2-", dir=args.workdir))
    try:
        datasets = write_datasets(workload, run_dir, args)
        report["datasets"] = {
            d.layout: {"disk_bytes": d.disk_bytes, "note": d.note} for d in datasets.values()
        }
        runs = run_rounds(workload, datasets, args, partial)
    finally:
        if args.keep:
            print(f"  datasets kept in {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    rows = rows_of(runs)
    print_table(rows)
    finish_report(report | {"rows": rows}, args.json, started)


if __name__ == "__main__":
    sys.exit(main())
