"""How each system is imported, written and counted: txstore, LitData, MosaicML, a plain file.

Peers are benchmark-only dependencies; each is imported inside the function that needs it, so
a script runs (and reports the contender as skipped) without it.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from txbench.workloads import CHUNK_BYTES, Sample, Workload, iter_samples

PLAIN_BUFFER_BYTES = 2**20  # faster here than unbuffered or a 64 MiB buffer


# --------------------------------------------------------------------------- imports


def no_imports() -> None:
    """The plain file needs nothing imported."""


def import_txstore() -> None:
    import txstore  # noqa: F401


def require_litdata_bytes_layout() -> None:
    """Refuse to measure LitData where pyarrow is importable: LitData then writes and reads
    its Arrow row layout, several times slower to read than the bytes layout these
    benchmarks compare against (bench/README.md, "Why harnesses disagree"). Only
    ``reconcile_w2.py`` measures that layout, in processes of their own."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is not None:
        raise SystemExit(
            "pyarrow is importable in this environment, so LitData would use its Arrow "
            "layout: run without LitData, or keep pyarrow out of the venv (install it with "
            "pip --target into a folder of its own and put that on PYTHONPATH only for "
            "bench_arrow.py, bench_import.py and bench_fields.py --vs-lance)"
        )


def import_litdata() -> None:
    from litdata import optimize  # noqa: F401
    from litdata.streaming.writer import (  # noqa: F401
        BinaryWriter,
    )


def import_mds_writer() -> Any:
    """streaming imports streaming.vision, which needs torchvision: stub it when absent."""
    if importlib.util.find_spec("torchvision") is None:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    from streaming import MDSWriter

    return MDSWriter


# --------------------------------------------------------------------------- writers


def write_plain_file(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    out.mkdir(parents=True)
    key = workload.payload_field
    with open(out / "payload.bin", "wb", buffering=PLAIN_BUFFER_BYTES) as f:
        for sample in iter_samples(samples):
            f.write(sample[key])
        f.flush()
        os.fsync(f.fileno())
    return "payload bytes only, one file, write + fsync"


def txstore_append(out: Path, samples: Sequence[Sample], **create_kwargs: Any) -> str:
    """``txstore.create(out, **create_kwargs).append(samples)``, checked."""
    import txstore

    store = txstore.create(str(out), **create_kwargs)
    commit = store.append(iter_samples(samples))
    if commit.num_samples != len(samples):
        raise AssertionError(f"commit.num_samples={commit.num_samples}, wrote {len(samples)}")
    return f"version {commit.version}"


def write_txstore_default(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    return txstore_append(out, samples) + ", default compression (zstd)"


def write_txstore_uncompressed(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    return txstore_append(out, samples, compression=None) + ", compression=None"


def write_litdata_binarywriter(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(out), chunk_bytes=CHUNK_BYTES, compression=None)
    for index, sample in enumerate(iter_samples(samples)):
        writer[index] = sample
    writer.done()
    writer.merge()
    return "uncompressed, in process"


def run_litdata_optimize(
    out: Path,
    fn: Callable[[int], Sample],
    inputs: Sequence[int],
    workers: int = 1,
    mode: str | None = None,
    start_method: str = "fork",
) -> None:
    """LitData ``optimize()``, uncompressed, 64 MiB chunks, ordered."""
    from litdata import optimize

    previous_method = multiprocessing.get_start_method(allow_none=True)
    kwargs: dict[str, Any] = {} if mode is None else {"mode": mode}
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
            verbose=False,
            **kwargs,
        )
    finally:
        # optimize() forces the process-wide start method; put it back.
        multiprocessing.set_start_method(previous_method, force=True)


def tiny_sample(index: int) -> Sample:
    return {"id": index, "tokens": b"x"}


def write_mds(out: Path, samples: Sequence[Sample], workload: Workload) -> str:
    mds_writer = import_mds_writer()
    with mds_writer(
        out=str(out), columns=workload.mds_columns, compression=None, size_limit=CHUNK_BYTES
    ) as writer:
        for sample in iter_samples(samples):
            writer.write(sample)
    return "uncompressed"


# --------------------------------------------------------------------------- counters


def count_mds(out: Path) -> int:
    """Samples that a MosaicML dataset's index lists."""
    index = json.loads((out / "index.json").read_text())
    return sum(int(shard["samples"]) for shard in index["shards"])


def count_litdata(out: Path) -> int:
    """Samples that a LitData dataset's index lists."""
    index = json.loads((out / "index.json").read_text())
    return sum(int(chunk["chunk_size"]) for chunk in index["chunks"])


def count_txstore(out: Path) -> int:
    """Samples in a txstore store's latest version."""
    import txstore

    return len(txstore.open(str(out)).snapshot())
