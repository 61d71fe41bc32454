"""Token windows for language-model pretraining: txstore against LitData's TokensLoader.

Documents of random lengths (uniform in [MIN_DOC_TOKENS, MAX_DOC_TOKENS]) of random int32
tokens below a GPT-2-sized vocabulary are generated once (not timed) and written by each
system (not timed): txstore ``append`` of ``{"tokens": array}`` with its default zstd and with
``compression=None``; LitData ``optimize(fn, inputs, item_loader=TokensLoader(),
chunk_bytes=64 MiB)`` over the same arrays (uncompressed, as its TokensLoader reads them);
and txstore zstd with each document's length beside it (``{"tokens": array, "num_tokens":
n}``), read with ``lengths_field="num_tokens"`` (no counting pass at open).

Then each reading, in a fresh child process with a warm page cache, round robin over
``--repeat``, median: one epoch of windows of ``--block-size`` tokens through a DataLoader with
``--workers`` workers and ``--batch-size`` windows a batch, shuffle off and on:

- txstore: ``TokenStreamingDataLoader(TokenStreamingDataset(path, block_size=B,
  shuffle=...))``;
- LitData: ``StreamingDataLoader(StreamingDataset(path, item_loader=TokensLoader(B),
  shuffle=...))``.

tokens/s = windows delivered x B / the seconds from the loader's first ``iter`` to its last
batch. Opening the dataset is timed apart (txstore's counts every document's tokens: a read of
the field) and also given with the epoch. Every window's tokens are summed in the main
process, and the sum checked against the same windows cut from a numpy concatenation (txstore:
windows over all the tokens; LitData: each chunk's, as its TokensLoader cuts them).

    python bench/bench_tokens.py [--quick] [--repeat N] [--json out.json]

See bench/README.md for the setup.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from txbench.output import finish_report, fmt, markdown_table, new_report
from txbench.system import (
    TXSTORE_SRC_ENV,
    default_workdir,
    frozen_txstore,
    machine_info,
    print_machine,
    use_frozen_txstore,
    warm_files,
)
from txbench.workloads import CHUNK_BYTES, QUICK_FACTOR

NUM_TOKENS = 100_000_000
MIN_DOC_TOKENS, MAX_DOC_TOKENS = 50, 4000
VOCAB = 50_257
SEED = 42
TARGET = 2.0  # txstore's tokens/s over LitData's, 2 workers
SYSTEMS = {
    "txstore": "txstore TokenStreamingDataset (zstd)",
    "txstore-raw": "txstore TokenStreamingDataset (none)",
    "txstore-len": "txstore TokenStreamingDataset (zstd, lengths_field)",
    "litdata": "LitData TokensLoader",
}


# --------------------------------------------------------------------------- the documents


def documents(num_tokens: int) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(SEED)
    lengths = rng.integers(
        MIN_DOC_TOKENS, MAX_DOC_TOKENS + 1, size=2 * num_tokens // MIN_DOC_TOKENS
    )
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), num_tokens)) + 1]
    flat = rng.integers(0, VOCAB, size=int(lengths.sum()), dtype=np.int32)
    return np.split(flat, np.cumsum(lengths)[:-1])


_DOCS: list[Any] = []  # inherited by LitData's forked workers


def _litdata_doc(index: int) -> Any:
    yield _DOCS[index]


def write_all(workdir: Path, docs: list[Any]) -> dict[str, Any]:
    from litdata import optimize  # type: ignore[import-not-found, import-untyped, unused-ignore]
    from litdata.streaming.item_loader import TokensLoader  # type: ignore[import-not-found, import-untyped, unused-ignore]

    import txstore

    written: dict[str, Any] = {}
    variants: list[tuple[str, dict[str, Any], bool]] = [
        ("txstore", {}, False),
        ("txstore-raw", {"compression": None}, False),
        ("txstore-len", {}, True),
    ]
    for name, kwargs, lengths in variants:
        start = time.perf_counter()
        store = txstore.create(str(workdir / name), **kwargs)
        if lengths:  # each document's length beside it, as LitData's index keeps each chunk's
            store.append({"tokens": doc, "num_tokens": len(doc)} for doc in docs)
        else:
            store.append({"tokens": doc} for doc in docs)
        written[name] = {"write_s": time.perf_counter() - start, "bytes": _size(workdir / name)}
    _DOCS[:] = docs
    start = time.perf_counter()
    optimize(
        fn=_litdata_doc,
        inputs=list(range(len(docs))),
        output_dir=str(workdir / "litdata"),
        chunk_bytes=CHUNK_BYTES,
        item_loader=TokensLoader(),
        num_workers=1,
        start_method="fork",
        keep_data_ordered=True,
        verbose=False,
    )
    written["litdata"] = {
        "write_s": time.perf_counter() - start,
        "bytes": _size(workdir / "litdata"),
    }
    return written


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def expected_sums(workdir: Path, docs: list[Any], block: int) -> dict[str, tuple[int, int]]:
    """(windows, sum of their tokens) that each system's epoch must deliver."""
    import numpy as np

    flat = np.concatenate(docs).astype(np.int64)
    whole = len(flat) // block
    ours = (whole, int(flat[: whole * block].sum()))
    index = json.loads((workdir / "litdata" / "index.json").read_text())
    windows = total = start = 0
    for chunk in index["chunks"]:  # LitData cuts each chunk's tokens, leaving its tail
        dim = int(chunk["dim"])
        n = dim // block
        windows += n
        total += int(flat[start : start + n * block].sum())
        start += dim
    return {"txstore": ours, "txstore-raw": ours, "txstore-len": ours, "litdata": (windows, total)}


# --------------------------------------------------------------------------- one reading


def child_main(task: dict[str, Any]) -> dict[str, Any]:
    import torch

    system, path, block = task["system"], task["path"], task["block"]
    # Imports are not timed: opening is.
    if system.startswith("txstore"):
        from txstore.torch import TokenStreamingDataLoader, TokenStreamingDataset

        lengths = "num_tokens" if system == "txstore-len" else None
        start = time.perf_counter()
        ds: Any = TokenStreamingDataset(
            path, block_size=block, lengths_field=lengths, shuffle=task["shuffle"], seed=SEED
        )
        opened = time.perf_counter()
        loader: Any = TokenStreamingDataLoader(
            ds, batch_size=task["batch"], num_workers=task["workers"]
        )
    else:
        from litdata import StreamingDataLoader, StreamingDataset  # type: ignore[import-not-found, import-untyped, unused-ignore]
        from litdata.streaming.item_loader import TokensLoader  # type: ignore[import-not-found, import-untyped, unused-ignore]

        start = time.perf_counter()
        ds = StreamingDataset(
            path, item_loader=TokensLoader(block_size=block), shuffle=task["shuffle"], seed=SEED
        )
        opened = time.perf_counter()
        loader = StreamingDataLoader(ds, batch_size=task["batch"], num_workers=task["workers"])
    windows = total = 0
    first_batch = None
    began = time.perf_counter()
    for batch in loader:
        if first_batch is None:
            first_batch = time.perf_counter() - began
        if batch.shape[1:] != (block,):
            raise AssertionError(f"a batch of shape {tuple(batch.shape)}")
        windows += batch.shape[0]
        total += int(batch.to(torch.int64).sum())
    end = time.perf_counter()
    return {
        "open_s": opened - start,
        "epoch_s": end - began,
        "first_batch_s": first_batch,
        "windows": windows,
        "token_sum": total,
    }


def run_child(task: dict[str, Any], workdir: Path) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(dir=workdir, suffix=".json", delete=False) as f:
        result_path = f.name
    try:
        command = [sys.executable, __file__, "--child", json.dumps(task), "--result", result_path]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return {"error": f"child exited {done.returncode}"}
        return dict(json.loads(Path(result_path).read_text()))
    finally:
        os.unlink(result_path)


# --------------------------------------------------------------------------- the run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_FACTOR}x fewer tokens")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=2049)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workdir", type=Path, default=default_workdir())
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.environ.get(TXSTORE_SRC_ENV):
        use_frozen_txstore(os.environ[TXSTORE_SRC_ENV])
    if args.child:
        Path(args.result).write_text(json.dumps(child_main(json.loads(args.child))))
        return 0
    with frozen_txstore(args.workdir, "bench-tokens-src-") as digest:
        run_bench(args, digest)
    return 0


def run_bench(args: argparse.Namespace, txstore_digest: str) -> None:
    started = time.perf_counter()
    info = machine_info(args.workdir) | {"txstore_frozen_sha256": txstore_digest}
    print_machine(info)
    systems = [s for s in args.systems.split(",") if s]
    num_tokens = NUM_TOKENS // QUICK_FACTOR if args.quick else NUM_TOKENS
    data = Path(tempfile.mkdtemp(prefix="bench-tokens-", dir=args.workdir))
    try:
        docs = documents(num_tokens)
        print(f"\n{len(docs):,} documents, {sum(len(d) for d in docs):,} int32 tokens")
        written = write_all(data, docs)
        for name, w in written.items():
            print(f"  wrote {name}: {w['bytes'] / 1e6:,.1f} MB in {w['write_s']:.1f} s")
        expected = expected_sums(data, docs, args.block_size)
        del docs
        runs: dict[tuple[str, bool], list[dict[str, Any]]] = {}
        for turn in range(args.repeat):
            for shuffle in (False, True):
                for system in systems if turn % 2 == 0 else systems[::-1]:
                    path = data / system
                    warm_files(p for p in path.rglob("*") if p.is_file())
                    task = {
                        "system": system,
                        "path": str(path),
                        "block": args.block_size,
                        "batch": args.batch_size,
                        "workers": args.workers,
                        "shuffle": shuffle,
                    }
                    result = run_child(task, args.workdir)
                    if "error" not in result:
                        got = (result["windows"], result["token_sum"])
                        if got != expected[system]:
                            result["error"] = f"delivered {got}, expected {expected[system]}"
                        else:
                            result["tokens_per_s"] = got[0] * args.block_size / result["epoch_s"]
                    runs.setdefault((system, shuffle), []).append(result)
                    print(f"  {system:<12} shuffle={shuffle!s:<5} {_line(result)}")
    finally:
        shutil.rmtree(data, ignore_errors=True)
    results = [_median(system, shuffle, rs) for (system, shuffle), rs in runs.items()]
    ratios = _ratios(results)
    _print(results, ratios)
    report = new_report(
        "bench_tokens",
        info,
        args.quick,
        repeat=args.repeat,
        settings={
            "num_tokens": num_tokens,
            "block_size": args.block_size,
            "batch_size": args.batch_size,
            "workers": args.workers,
            "doc_tokens": [MIN_DOC_TOKENS, MAX_DOC_TOKENS],
        },
        written=written,
        results=results,
        ratios=ratios,
    )
    finish_report(report, args.json, started)


def _line(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"ERROR {result['error']}"
    return (
        f"open {result['open_s']:.2f} s, epoch {result['epoch_s']:.2f} s, "
        f"{result['tokens_per_s'] / 1e6:,.1f} M tokens/s"
    )


def _median(system: str, shuffle: bool, runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {
        "contender": SYSTEMS[system],
        "system": system,
        "shuffle": shuffle,
        "runs": runs,
    }
    if not good:
        out["error"] = runs[0].get("error") if runs else "no run"
        return out
    for key in ("open_s", "epoch_s", "first_batch_s", "tokens_per_s"):
        out[key] = statistics.median(r[key] for r in good)
    windows, block_tokens = good[0]["windows"], good[0]["tokens_per_s"] * good[0]["epoch_s"]
    out["windows"] = windows
    # With the open: what a run that opens the dataset and reads one epoch sees.
    out["tokens_per_s_with_open"] = statistics.median(
        block_tokens / (r["open_s"] + r["epoch_s"]) for r in good
    )
    return out


def _ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["system"], r["shuffle"]): r for r in results}
    out = []
    for (system, shuffle), r in sorted(by.items()):
        peer = by.get(("litdata", shuffle))
        if not system.startswith("txstore") or peer is None:
            continue
        if "error" in r or "error" in peer:
            continue
        ratio = r["tokens_per_s"] / peer["tokens_per_s"]
        with_open = r["tokens_per_s_with_open"] / peer["tokens_per_s_with_open"]
        out.append(
            {
                "txstore": r["contender"],
                "peer": peer["contender"],
                "shuffle": shuffle,
                "ratio": ratio,
                "ratio_with_open": with_open,
                "target": TARGET,
                "met": ratio >= TARGET,
            }
        )
    return out


def _print(results: list[dict[str, Any]], ratios: list[dict[str, Any]]) -> None:
    headers = ["contender", "shuffle", "open s", "epoch s", "first batch s", "M tokens/s"]
    headers += ["M tokens/s with open", "runs (epoch s)"]
    rows = []
    for r in results:
        runs = " / ".join(f"{x['epoch_s']:.2f}" for x in r["runs"] if "epoch_s" in x)
        if "error" in r:
            rows.append([r["contender"], str(r["shuffle"]), "ERROR", "", "", "", "", runs])
            continue
        rows.append(
            [
                r["contender"],
                str(r["shuffle"]),
                fmt(r["open_s"], ".2f"),
                fmt(r["epoch_s"], ".2f"),
                fmt(r["first_batch_s"], ".3f"),
                fmt(r["tokens_per_s"] / 1e6, ",.1f"),
                fmt(r["tokens_per_s_with_open"] / 1e6, ",.1f"),
                runs,
            ]
        )
    print()
    print("\n".join(markdown_table(headers, rows)))
    rows = [
        [
            r["txstore"],
            str(r["shuffle"]),
            f"{r['ratio']:.2f}x",
            f"{r['ratio_with_open']:.2f}x",
            f">= {r['target']:g}x",
            "met" if r["met"] else "NOT MET",
        ]
        for r in ratios
    ]
    print()
    headers = ["txstore / LitData", "shuffle", "epoch", "with open", "target", ""]
    print("\n".join(markdown_table(headers, rows)))


if __name__ == "__main__":
    sys.exit(main())
