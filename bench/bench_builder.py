"""Micro-benchmark of the chunk builder's fast paths and of ``decode_blocks`` (txstore alone).

Times, with ``timeit`` (the best of ``--repeat`` runs, in this thread's CPU time unless
``--wall``), building one chunk from the same pre-made samples through ``add`` (one call a
sample), ``add_from`` (an iterator) and ``add_many`` (lists, as the writer slices them), and
decoding every block of a chunk with ``decode_blocks`` (each frame checked, or the body checked
before so that no frame is; copies or views). Samples, small and large:

- ``small``: ``{"id": int, "tokens": 64 B bytes}``
- ``text``: ``{"id": int, "text": str of 40 ASCII characters, "score": float}``
- ``W1``: ``{"id": int, "tokens": 2 KiB bytes}``
- ``W2``: ``{"id": int, "jpeg": 100 KiB bytes, "label": int}``

No compression and no storage: this isolates the per-sample Python work that the write and
read benchmarks include. To compare two checkouts (an A/B of a change), load both in one
process and alternate them task by task (A B, B A, ...), from the checkout to measure:

    PYTHONPATH=$PWD python bench/bench_builder.py --against /path/to/other/checkout

Times are the best run's, in ns a sample; the ratios are this/other, of the best runs and the
median of the pairs (each pair ran back to back).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

BATCH = 256  # the writer's slice of a list
SIZES = {"small": 10_000, "text": 10_000, "W1": 5_000, "W2": 300}


def _load(package: str) -> SimpleNamespace:
    """The parts measured, from ``package`` (txstore, or another checkout under its own name:
    its imports are relative, so two versions load side by side)."""
    format_ = f"{package}.format"
    builder = importlib.import_module(f"{format_}.builder")
    chunk = importlib.import_module(f"{format_}.chunk")
    try:  # a checkout from before chunk.py was split keeps its frame reading there
        frames = importlib.import_module(f"{format_}.frames")
    except ModuleNotFoundError:
        frames = chunk
    codec = importlib.import_module(f"{format_}.codec")
    manifest = importlib.import_module(f"{format_}.manifest")
    values = importlib.import_module(f"{format_}.values")
    return SimpleNamespace(
        where=importlib.import_module(package).__file__,
        ChunkBuilder=builder.ChunkBuilder,
        decode_blocks=frames.decode_blocks,
        parse_footer=chunk.parse_footer,
        FrameCompressor=codec.FrameCompressor,
        block_bytes=manifest.DEFAULT_BLOCK_BYTES,
        ValueDecoder=values.ValueDecoder,
    )


def _samples(kind: str, n: int) -> list[dict[str, Any]]:
    if kind == "small":
        blob = os.urandom(64 * n)
        return [{"id": i, "tokens": blob[64 * i : 64 * (i + 1)]} for i in range(n)]
    if kind == "text":
        return [{"id": i, "text": f"{i:08d}" * 5, "score": i / 7} for i in range(n)]
    if kind == "W1":
        blob = os.urandom(2048 * n)
        return [{"id": i, "tokens": blob[2048 * i : 2048 * (i + 1)]} for i in range(n)]
    if kind == "W2":
        blob = os.urandom(102400 * n)
        return [
            {"id": i, "jpeg": blob[102400 * i : 102400 * (i + 1)], "label": i % 1000}
            for i in range(n)
        ]
    raise ValueError(kind)


def _tasks(tx: SimpleNamespace, samples: list[dict[str, Any]]) -> dict[str, Callable[[], Any]]:
    def builder() -> Any:
        return tx.ChunkBuilder(block_bytes=tx.block_bytes, compressor=tx.FrameCompressor(None, 3))

    def by_add() -> Any:
        b = builder()
        add = b.add
        for position, sample in enumerate(samples):
            add(sample, position)
        return b.finish()

    def by_add_from() -> Any:
        b = builder()
        b.add_from(iter(samples), 0, 2**62)
        return b.finish()

    def by_add_many() -> Any:
        b = builder()
        for start in range(0, len(samples), BATCH):
            b.add_many(samples[start : start + BATCH], start, 2**62)
        return b.finish()

    data = b"".join(by_add())
    length = int.from_bytes(data[-16:-12], "little")
    layout = tx.parse_footer(data[len(data) - 16 - length :], "bench chunk")
    decoder = tx.ValueDecoder()
    blocks = len(layout.footer.blocks)

    # ``prechecked``: the chunk's body was checked as a whole, so its frames are not.
    def decoding(views: bool, prechecked: bool) -> Callable[[], Any]:
        def run() -> None:
            parts = [(layout, data, None)]
            for _ in tx.decode_blocks(parts, 0, blocks, decoder, views, (prechecked,)):
                pass

        return run

    return {
        "add": by_add,
        "add_from": by_add_from,
        "add_many": by_add_many,
        "decode": decoding(False, False),
        "decode-prechecked": decoding(False, True),
        "decode-views": decoding(True, False),
        "decode-views-prechecked": decoding(True, True),
    }


def _time(task: Callable[[], Any], number: int, n: int, timer: Callable[[], float]) -> float:
    """ns a sample, of one timeit run of ``number`` loops."""
    return timeit.Timer(task, timer=timer).timeit(number=number) / number / n * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="small,text,W1,W2", help="comma-separated samples")
    parser.add_argument("--repeat", type=int, default=15, help="timed runs a task; min kept")
    parser.add_argument("--number", type=int, default=1, help="loops a timed run")
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout (its folder): each task runs on both, alternating, and the "
        "ratio this/other is reported",
    )
    parser.add_argument(
        "--wall",
        action="store_true",
        help="time with the wall clock, not this thread's CPU time (which other processes on "
        "a busy machine disturb less)",
    )
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    args = parser.parse_args()
    timer = time.perf_counter if args.wall else time.thread_time
    sides = {"this": _load("txstore")}
    if args.against is not None:
        links = tempfile.mkdtemp(prefix="bench-builder-")
        os.symlink((args.against / "txstore").resolve(), os.path.join(links, "txstore_other"))
        sys.path.insert(0, links)
        sides["other"] = _load("txstore_other")
    for name, tx in sides.items():
        print(f"{name}: {tx.where}")
    results: dict[str, dict[str, Any]] = {}
    for kind in args.kinds.split(","):
        samples = _samples(kind, SIZES[kind])
        tasks = {side: _tasks(tx, samples) for side, tx in sides.items()}
        for task in tasks["this"]:
            times: dict[str, list[float]] = {side: [] for side in sides}
            for r in range(args.repeat):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))  # A B, then B A
                for side in order:
                    times[side].append(_time(tasks[side][task], args.number, len(samples), timer))
            row: dict[str, Any] = {side: min(t) for side, t in times.items()}
            row["runs"] = times
            line = f"{kind:>6} {task:<24}" + "".join(f" {side} {row[side]:9.1f}" for side in sides)
            if "other" in sides:
                # The pairs run next to each other: their ratios' median resists load spikes.
                pairs = [a / b for a, b in zip(times["this"], times["other"], strict=True)]
                row["ratio_min"] = row["this"] / row["other"]
                row["ratio_median"] = statistics.median(pairs)
                line += f"  this/other: min {row['ratio_min']:.3f} median {row['ratio_median']:.3f}"
            results[f"{kind}/{task}"] = row
            print(line + "  (ns a sample)", flush=True)
    if args.json:
        where = {side: tx.where for side, tx in sides.items()}
        report = {"script": "bench_builder", "where": where, "results": results}
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
