"""Generate docs/benchmarks.md and its plots from the benchmarks' JSON reports.

    python bench/report.py bench/results/*.json [--out docs/benchmarks.md] [--img docs/img]

Each input is the ``--json`` output of one script (bench_append.py, its --commit-latency part,
bench_optimize.py, bench_read.py, bench_fields.py, bench_remote.py, bench_tokens.py,
bench_scale.py, bench_arrow.py, bench_import.py, bench_writers.py); the script that wrote it
is in its ``script`` field. A section appears for every kind of report given (several reports
of one kind: see ``generate``); the plots need matplotlib (in the bench venv, never a txstore
dependency).
"""

# ruff: noqa: RUF001, RUF002  (the report writes the multiplication sign on purpose)

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from txbench.output import fmt, markdown_table

Report = dict[str, Any]
Row = dict[str, Any]

REPO = Path(__file__).resolve().parents[1]
SYSTEMS = ("txstore", "LitData", "MosaicML", "plain file", "memory")
COLORS = {
    "txstore": "#1f77b4",
    "LitData": "#ff7f0e",
    "MosaicML": "#2ca02c",
    "plain file": "#7f7f7f",
    "memory": "#bcbd22",
    "floor": "#d62728",
}


def system_of(label: str) -> str:
    """Which system a contender's label names."""
    if label.startswith("txstore"):
        return "txstore"
    if label.startswith("LitData"):
        return "LitData"
    if label.startswith(("MDS", "MosaicML")):
        return "MosaicML"
    if label.startswith("plain"):
        return "plain file"
    if label.startswith("floor"):
        return "floor"
    return "memory"


def faster(ours: float | None, theirs: float | None, higher_is_better: bool) -> float | None:
    """How many times better txstore's figure is than ``theirs`` (>1: txstore better)."""
    if ours is None or theirs is None or not ours or not theirs:
        return None
    return ours / theirs if higher_is_better else theirs / ours


def x(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec) + "×"


def load(reports: Sequence[Report]) -> str:
    """The load averages (1 min) at the start and end of the runs that made ``reports``."""
    parts = []
    for r in reports:
        m = r["machine"]
        start, end = m.get("load_at_start"), m.get("load_at_end")
        if start and end:
            parts.append(f"{start[0]:.1f} → {end[0]:.1f}")
    return ", ".join(parts) or "not recorded"


def run_line(reports: Sequence[Report]) -> str:
    """When, with what arguments, how long and under what load the reports were made."""
    out = []
    for r in reports:
        m = r["machine"]
        args = " ".join(r.get("argv", [])) or "(defaults)"
        minutes = r.get("run_s", 0) / 60
        out.append(
            f"`{r['script']}.py {strip_paths(args)}`: started {m.get('started', '?')}, "
            f"{minutes:.0f} min, {r.get('repeat', '?')} repeats, load average (1 min) "
            f"{load([r])}, txstore `{m.get('txstore_revision', '?')}`"
        )
    return "\n".join(f"- {line}" for line in out)


def strip_paths(args: str) -> str:
    """The arguments without the JSON output path (which says nothing about the run)."""
    words = args.split()
    kept = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if w == "--json":
            skip = True
            continue
        kept.append(w)
    return " ".join(kept)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(markdown_table(headers, rows))


# --------------------------------------------------------------------------- plots


class Plots:
    """Writes PNGs into ``folder``; ``links`` maps a plot's name to its Markdown image."""

    def __init__(self, folder: Path, doc: Path) -> None:
        self.folder = folder
        self.doc = doc
        self.links: dict[str, str] = {}
        try:
            import matplotlib  # type: ignore[import-not-found, unused-ignore]

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

            self.plt: Any = plt
        except ImportError:
            print("matplotlib not installed: no plots", file=sys.stderr)
            self.plt = None

    def save(self, name: str, alt: str, draw: Callable[[Any], Any]) -> str:
        if self.plt is None:
            return ""
        self.folder.mkdir(parents=True, exist_ok=True)
        fig = draw(self.plt)
        path = self.folder / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        self.plt.close(fig)
        rel = os.path.relpath(path.resolve(), self.doc.resolve().parent)
        return f"![{alt}]({Path(rel).as_posix()})"


def bar_panels(
    plt: Any,
    panels: Sequence[tuple[str, Sequence[tuple[str, float | None]]]],
    xlabel: str,
    ncols: int = 2,
    log: bool = False,
) -> Any:
    """One horizontal bar chart per panel: (title, [(label, value)]), bars coloured by system."""
    nrows = -(-len(panels) // ncols)
    tallest = max(len(bars) for _, bars in panels)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(6.2 * ncols, 0.42 * tallest * nrows + 1.2 * nrows), squeeze=False
    )
    for ax, (title, bars) in zip(axes.flat, panels, strict=False):
        labels = [label for label, _ in bars][::-1]
        values = [value or 0.0 for _, value in bars][::-1]
        colors = [COLORS[system_of(label)] for label in labels]
        ax.barh(labels, values, color=colors)
        top = max(values) if values else 1.0
        for i, v in enumerate(values):
            text = "-" if not v else (f"{v:,.0f}" if v >= 100 else f"{v:,.2g}")
            ax.text(v * (1.02 if log else 1) + (0 if log else top * 0.01), i, text, va="center")
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(xlabel)
        if log:
            ax.set_xscale("log")
        else:
            ax.set_xlim(0, top * 1.22)
        ax.tick_params(axis="y", labelsize=9)
        ax.grid(axis="x", alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- method


def method_section(reports: Sequence[Report]) -> str:
    m = reports[0]["machine"]
    pk = m.get("packages", {})
    loads = [r["machine"].get("load_at_start", [0])[0] for r in reports] + [
        r["machine"].get("load_at_end", [0])[0] for r in reports
    ]
    return f"""## Method

- **Same run, round robin, medians.** Every system runs in the same run as its peers, one
  after another, round robin over the repeats; the write benchmarks put each repeat in its own
  seeded random order, so that no contender always follows the same one. Each figure is the
  median of its repeats (read: field by field); the tables give every repeat next to it.
  Ratios are within one run: they are what to compare, not absolute figures.
- **Same data.** Payloads are distinct random bytes (`os.urandom`), generated before any
  timing: incompressible, and generation is not measured. Every system gets the same samples
  (W1: 200,000 × `{{id, tokens: 2 KiB}}`; W2: 20,000 × `{{id, jpeg: 100 KiB, label}}`). MB is
  10^6 bytes of payload.
- **Durable writes.** A write's total is the call plus an fsync of every file and folder it
  left, timed apart (txstore fsyncs by itself; LitData and MosaicML do not). The plain file
  (the payload bytes written to one file, then fsync) is the disk's limit.
- **Uncompressed peers.** LitData and MosaicML write uncompressed (LitData's zstd needs
  pyarrow, which it does not declare); txstore is measured uncompressed and with its default
  zstd, which stores these random payloads raw.
- **Reads.** Each read measurement runs in a fresh child process; every reader touches the
  same bytes (one byte of each 4 KiB page of each payload), so zero-copy readers pay for the
  pages they hand out. *Warm*: every file read just before; *cold*: the page cache dropped
  after the dataset is opened. One `collate_fn` for every DataLoader. Every sample's id is
  checked (each delivered once; the right one at `ds[i]`).
- **The machine.** {m.get("nproc")} vCPUs ({m.get("cpu")}), {m.get("memory_gib") or 0:.0f} GiB,
  Linux VM ({m.get("platform")}), {m.get("workdir_fs")}; CPython {m.get("python")}, torch
  {pk.get("torch")}, litdata {pk.get("litdata")}, mosaicml-streaming
  {pk.get("mosaicml-streaming")}.
- **Noise.** The machine is shared with other work: the load average (1 min) ran from
  {min(loads):.1f} to {max(loads):.1f} on {m.get("nproc")} cores during these runs. Repeats of
  one contender can differ by 2× or more under such load; read the spread of the repeats, and
  trust ratios within a run over absolute figures. The VM also hands unused memory back to its
  host, so a run can fall into a faster or a slower group.

How each figure was made:

{run_line(reports)}
"""


# --------------------------------------------------------------------------- writes


def write_rows(results: Sequence[Row], workload: str) -> list[Row]:
    return [r for r in results if r["workload"] == workload]


def processes_of(label: str) -> int:
    """The process count a contender's label gives (", 2w", ", 2p"), 1 if none."""
    found = re.search(r"\b(\d+)[wp]\b", label)
    return int(found.group(1)) if found else 1


def write_table(
    results: Sequence[Row], peer_labels: dict[str, str] | None = None, by_processes: bool = False
) -> str:
    """A write table: rate, × plain, txstore's speed-up over this row, and the repeats.

    ``peer_labels``: the txstore rows to compare with, by label, and their short names.
    ``by_processes``: compare with the txstore row of that name and as many processes (the
    names are then label prefixes, e.g. "txstore optimize raw").
    """
    plain = next((r for r in results if system_of(r["contender"]) == "plain file"), None)
    names = peer_labels or {}
    headers = ["system", "total s", "samples/s", "MB/s", "× plain"]
    headers += [f"{short} ÷ this" for short in names.values()]
    headers.append("runs (total s)")

    def ours(name: str, row: Row) -> Row | None:
        for r in results:
            if by_processes:
                if r["contender"].startswith(name) and processes_of(r["contender"]) == processes_of(
                    row["contender"]
                ):
                    return r
            elif r["contender"] == name:
                return r
        return None

    rows = []
    for r in results:
        rate = r.get("samples_per_s")
        if r.get("error") or rate is None:
            rows.append([r["contender"], "ERROR" if r.get("error") else r.get("note", "-")])
            rows[-1] += [""] * (len(headers) - 2)
            continue
        row = [
            r["contender"],
            fmt(r["total_s"], ".2f" if r["total_s"] >= 1 else ".3f"),
            fmt(rate, ",.0f"),
            fmt(r["mb_per_s"], ",.0f"),
            x(faster(rate, None if plain is None else plain["samples_per_s"], True)),
        ]
        for name in names:
            t = ours(name, r)
            row.append(x(faster(None if t is None else t["samples_per_s"], rate, True)))
        row.append(" / ".join(f"{v:.2f}" for v in r.get("run_totals_s", [])))
        rows.append(row)
    return table(headers, rows)


def append_section(report: Report, plots: Plots) -> str:
    results = report["results"]
    workloads = sorted({r["workload"] for r in results})
    short = {"txstore append (zstd)": "txstore zstd", "txstore append (none)": "txstore raw"}
    parts = [
        "## Append: writing a dataset\n",
        "`bench_append.py`: each system writes the workload from a generator into a fresh "
        "folder, in one process; txstore `create(path).append(samples)`, MosaicML `MDSWriter`, "
        "LitData `BinaryWriter` (its in-process writer) and `optimize()` (1 worker, fork, "
        "which includes its fixed cost per call). The columns `txstore … ÷ this` give how many "
        "times txstore's throughput is that row's (above 1: txstore faster).\n",
    ]
    for w in workloads:
        parts.append(f"**{w}**\n\n" + write_table(write_rows(results, w), short) + "\n")
    fixed = report.get("litdata_optimize_fixed_s") or {}
    if fixed:
        parts.append(
            f"LitData `optimize()` on one tiny sample (its fixed cost per call): "
            f"{fmt(fixed.get('fork'), '.2f')} s with fork, {fmt(fixed.get('spawn'), '.2f')} s "
            "with spawn, its default outside notebooks.\n"
        )
    panels = [
        (
            f"append {w}",
            [(r["contender"], r.get("mb_per_s")) for r in write_rows(results, w)],
        )
        for w in workloads
    ]
    link = plots.save(
        "write-throughput",
        "write throughput by system",
        lambda plt: bar_panels(plt, panels, "MB/s of payload (durable)"),
    )
    return "\n".join(parts) + (f"\n{link}\n" if link else "")


def optimize_section(report: Report, plots: Plots) -> str:
    results = report.get("throughput", [])
    workloads = sorted({r["workload"] for r in results})
    parts = [
        "## Conversion: `optimize()` from a function and inputs\n",
        "`bench_optimize.py`: every system calls the same `fn(i)` (a slice of a pre-generated "
        "pool) over the same indices; txstore `txstore.ingest.optimize(num_workers=1|2)` raw "
        "and zstd, LitData `optimize(num_workers=1|2)`, MosaicML `MDSWriter` in process or in "
        "2 forked processes writing a partition each, then `merge_index`; `plain` / `plain-2`: "
        "1 or 2 processes writing the payloads to files of their own, then fsync. "
        "`txstore … ÷ this`: txstore's samples/s with as many processes over that row's.\n",
    ]
    for w in workloads:
        rows = write_rows(results, w)
        names = {
            "txstore optimize raw": "txstore raw",
            "txstore optimize zstd": "txstore zstd",
        }
        parts.append(f"**{w}**\n\n" + write_table(rows, names, by_processes=True) + "\n")
    ratio_rows = [
        [
            r["workload"],
            r["txstore"],
            r["peer"],
            x(r["ratio"]),
            "-" if r["target"] is None else f"≥ {r['target']:g}",
            "-" if r["met"] is None else ("met" if r["met"] else "**not met**"),
        ]
        for r in report.get("ratios", [])
        if r["target"] is not None
    ]
    if ratio_rows:
        parts.append(
            "Targets, txstore ÷ peer (samples/s, same number of processes):\n\n"
            + table(["wl", "txstore", "peer", "ratio", "target", ""], ratio_rows)
            + "\n"
        )
    append = report.get("append", [])
    if append:
        parts.append(
            "**Small append**: 1% of W1 (2,000 samples) onto a copy of an existing "
            "200,000-sample dataset (the copy not timed); MosaicML writes a new partition and "
            "re-merges its index.\n\n"
            + write_table(
                append,
                {
                    "txstore optimize append, 1w": "txstore 1w",
                    "txstore optimize append, 2w": "txstore 2w",
                },
            )
            + "\n"
        )
    fixed = report.get("litdata_optimize_fixed_s") or {}
    if fixed:
        parts.append(
            f"LitData `optimize()` fixed cost per call: {fmt(fixed.get('fork'), '.2f')} s "
            f"(fork), {fmt(fixed.get('spawn'), '.2f')} s (spawn).\n"
        )
    panels = [
        (
            f"optimize {w}",
            [(r["contender"], r.get("mb_per_s")) for r in write_rows(results, w)],
        )
        for w in workloads
    ]
    if panels:
        link = plots.save(
            "optimize-throughput",
            "optimize throughput by system",
            lambda plt: bar_panels(plt, panels, "MB/s of payload (durable)"),
        )
        parts.append(link + "\n" if link else "")
    return "\n".join(parts)


def latency_section(report: Report, plots: Plots) -> str:
    s = report["commit_latency"]
    rows = [
        [
            f"{p['version_before']:,}",
            f"{p['chunks']:,}",
            f"{p['median_ms']:.2f}",
            f"{p['p90_ms']:.2f}",
            f"{p['reference_median_ms']:.2f}",
            x(p["vs_reference"]),
        ]
        + (
            [x(p["user_vs_reference"]), x(p["sys_vs_reference"])]
            if "user_vs_reference" in p
            else []
        )
        for p in s["points"]
    ]
    headers = ["versions", "chunks", "median ms", "p90 ms", "reference median ms", "÷ reference"]
    if "user_vs_reference" in s["points"][0]:
        headers += ["user CPU ÷ reference", "system CPU ÷ reference"]
    text = f"""## Commit latency against history length

`bench_append.py --commit-latency`: one-sample appends ({len(s["points"][0]["latencies_ms"])}
timed at each size) to a store grown to each number of versions, each version of the history
adding {s["chunks_per_version"]} chunk references. Each timed append is interleaved with one to
a fresh store of about 10 versions (the reference): drift on a busy machine hits both alike.

{table(headers, rows)}

{s["ratio_label"]}: median {s["median_ratio"]:.2f}×, p90 {s["p90_ratio"]:.2f}×; against the
interleaved reference {s["interleaved_ratio"]:.2f}× (target: within 1.5×). The history of
{s["build_appends"]:,} versions was built in {s["build_s"]:.0f} s.
"""

    def draw(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(7, 4))
        versions = [p["version_before"] for p in s["points"]]
        for key, label, style in (
            ("median_ms", "median", "o-"),
            ("p90_ms", "p90", "s--"),
            ("reference_median_ms", "reference store (~10 versions), median", "^:"),
        ):
            ax.plot(versions, [p[key] for p in s["points"]], style, label=label)
        ax.set_xscale("log")
        ax.set_ylim(0, max(p["p90_ms"] for p in s["points"]) * 1.25)
        ax.set_xlabel("versions in the store (log)")
        ax.set_ylabel("one-sample append, ms")
        ax.set_title("txstore commit latency against history length")
        ax.grid(alpha=0.3)
        ax.legend()
        return fig

    link = plots.save("commit-latency", "commit latency against history length", draw)
    return text + (f"\n{link}\n" if link else "")


SCALE_FIGURES = (
    ("commit_ms", "commit"),
    ("open_locate_ms", "open + [i]"),
    ("txn_lookup_ms", "txn_id lookup"),
    ("txn_lookup_again_ms", "same lookup again"),
    ("open_locate_again_ms", "same open again"),
    ("log20_ms", "log(20)"),
    ("time_travel_ms", "old v [i]"),
    ("time_travel_again_ms", "same old v again"),
    ("expire_ms", "expire 1%"),
    ("vacuum_incr_ms", "vacuum incremental"),
    ("vacuum_ms", "vacuum exact"),
    ("verify_ms", "verify quick"),
)
#: bench_scale's figures measured beside a floor (the least any reader of the files does).
SCALE_FLOORED = (
    ("open_locate_ms", "open + [i]"),
    ("txn_lookup_ms", "txn_id lookup"),
    ("log20_ms", "log(20)"),
    ("time_travel_ms", "old v [i]"),
)
#: The targets at the longest history: (ratio key, what, at most).
SCALE_TARGETS = (
    ("commit_ms", "commit", 1.5),
    ("open_locate_ms", "open + [i]", 1.5),
    ("txn_lookup_ms", "txn_id lookup", 1.5),
    ("log20_ms", "log(20)", 1.5),
    ("time_travel_ms", "old v [i]", 1.5),
    (
        "maintenance_vs_base",
        "expire + incremental vacuum of 1%, per expired version, ÷ the same at 10,000",
        2.0,
    ),
)


def scale_floors(report: Report) -> str:
    """The floored figures against their floors, and each target at the longest history
    with its verdict: met, bounded by the floor (met once the floor's own growth is taken
    out), or not met."""
    floored = [e for e in report["ratios"] if e.get("open_locate_ms_floor") is not None]
    if not floored:
        return ""
    rows_by = {(r["backend"], r["versions"], r.get("run")): r for r in report["rows"]}
    headers = ["backend", "versions", "run"]
    for _, label in SCALE_FLOORED:
        headers += [f"{label} ms", "floor ms", "×", "floor ×", "less floor ×"]
    rows = []
    for e in sorted(floored, key=lambda e: (e["backend"], e["versions"])):
        r = rows_by[(e["backend"], e["versions"], e.get("run"))]
        cells = [e["backend"], f"{e['versions']:,}", str(e.get("run", "-"))]
        for key, _ in SCALE_FLOORED:
            floor = r.get(key.removesuffix("_ms") + "_floor_ms")
            cells += [
                f"{r[key]['median']:.3f}",
                "-" if floor is None else f"{floor['median']:.3f}",
                x(e.get(key)),
                x(e.get(f"{key}_floor")),
                x(e.get(f"{key}_less_floor")),
            ]
        rows.append(cells)

    def floor_below(entry: Row, key: str) -> bool:
        """Whether the floor took no longer than the figure, at both lengths compared, within
        the figure's own spread (its median at most the figure's 90th percentile: a floor and
        a figure doing the same requests differ by noise alone): one that took longer is no
        floor."""
        floor = key.removesuffix("_ms") + "_floor_ms"
        shortest = min(
            (
                r
                for r in report["rows"]
                if r["backend"] == entry["backend"] and r.get("run") == entry.get("run")
            ),
            key=lambda r: r["versions"],
        )
        rows = [rows_by[(entry["backend"], entry["versions"], entry.get("run"))], shortest]
        return all(r[floor]["median"] <= r[key]["p90"] for r in rows)

    verdicts = []
    for backend in sorted({e["backend"] for e in floored}):
        for key, what, limit in SCALE_TARGETS:
            having = [e for e in floored if e["backend"] == backend and e.get(key) is not None]
            if not having:
                continue
            # The longest history; of two runs with it, the later.
            last = max(having, key=lambda e: (e["versions"], e.get("run", 0)))
            value = last[key]
            less = last.get(f"{key}_less_floor")
            if value <= limit:
                verdict = "met"
            elif less is not None and less <= limit and floor_below(last, key):
                verdict = f"bounded by the floor ({x(less)} with its growth taken out)"
            else:
                verdict = "**not met**"
            run = str(last.get("run", "-"))
            verdicts.append(
                [backend, f"{last['versions']:,}", run, what, x(value), f"≤ {limit}×", verdict]
            )
    return f"""
Floors (`*_floor_ms`, the least any reader of these files does: the same kind of request on
random targets of its own, read with the backend's plain `read` and decoded only as far as
needed, no checks): `×` is the figure against its own at the shortest history in the same
run, `floor ×` the floor's, `less floor ×` the figure with the floor's growth taken out
((figure − (floor − floor at the shortest)) ÷ figure at the shortest): what txstore itself
adds as the history grows. A target missed is bounded by the floor when it is met with the
floor's growth taken out, and the floor is one: its median no longer than the figure's 90th
percentile at both lengths (a floor doing the same requests as the figure differs from it by
noise alone; one clearly slower is no floor).

{table(headers, rows)}

Targets at the longest history of the runs with floors:

{table(["backend", "versions", "run", "figure", "ratio", "target", ""], verdicts)}
"""


def scale_section(report: Report, plots: Plots) -> str:
    rows_in = report["rows"]
    runs = report.get("runs", [report])
    tagged = len(runs) > 1  # rows of several runs (merged_scale): each says which
    backends = sorted({r["backend"] for r in rows_in})
    headers = ["backend", "versions"] + (["run"] if tagged else []) + ["chunks", "manifest B"]
    headers += [f"{label} ms" for _, label in SCALE_FIGURES] + ["commit ÷ ref"]
    rows = []
    for r in sorted(rows_in, key=lambda r: (r["backend"], r["versions"], r.get("run", 0))):
        cells = [r["backend"], f"{r['versions']:,}"] + ([str(r["run"])] if tagged else [])
        cells += [f"{r['chunks']:,}", f"{r['manifest_bytes']:,}"]
        for key, _ in SCALE_FIGURES:
            value = r.get(key)
            cells.append("-" if value is None else f"{value['median']:.2f}")
        cells.append(x(r["commit_ms"]["median"] / r["commit_reference_ms"]["median"]))
        rows.append(cells)
    ratio_rows = [
        [e["backend"], f"{e['versions']:,}"]
        + ([str(e["run"])] if tagged else [])
        + [x(e.get(key)) for key, _ in SCALE_FIGURES]
        for e in sorted(report["ratios"], key=lambda e: (e["backend"], e["versions"]))
    ]
    ratio_headers = ["backend", "versions"] + (["run"] if tagged else [])
    ratio_headers += [label for _, label in SCALE_FIGURES]
    repeats = ", ".join(str(r.get("repeat")) for r in runs)
    which = ""
    if tagged:
        which = "\n\nRuns (`run` in the tables):\n\n" + "\n".join(
            f"{n}. `bench_scale.py {strip_paths(' '.join(r.get('argv', [])))}`, txstore "
            f"`{r['machine'].get('txstore_revision', '?')}`, started "
            f"{r['machine'].get('started', '?')}"
            for n, r in enumerate(runs, start=1)
        )
    text = f"""## Metadata at scale: operations against history length

`bench_scale.py`: stores of each history length, every version adding
{report["chunks_per_version"]} chunk references, on {", ".join(backends)} (`s3`: a moto_server
process on this machine, every request a local round trip). Medians of {repeats} runs
(expire, vacuum and verify: one run each); the commit is a one-sample append, each interleaved
with one to a fresh 10-version store on the same backend (`commit ÷ ref`: machine noise hits
both alike). `vacuum incremental` (`vacuum(incremental=True)`) runs after the expire, its
state made by a first run before the timed commits (that first run reads the history once),
so it compares the versions committed since; `vacuum exact` (the default `vacuum()`) runs
after it. 1% of a longer history is more versions (10,000 at 10^6, 100 at 10^4), each leaving
its own files to delete: the maintenance target compares expire + incremental vacuum per
expired version. How the history is built is in the script's docstring.{which}

{table(headers, rows)}

Against the same backend's figure at the shortest history in the same run (the targets:
commit, open, lookup, log and time travel within 1.5×):

{table(ratio_headers, ratio_rows)}
"""

    def sizes(backend: str) -> list[Row]:
        """One row per history length for the plot: the run with the most rows, then the
        others' lengths it lacks."""
        base = max(runs, key=lambda r: len(r["rows"]))
        mine = {r["versions"]: r for r in base["rows"] if r["backend"] == backend}
        for r in rows_in:
            if r["backend"] == backend:
                mine.setdefault(r["versions"], r)
        return [mine[v] for v in sorted(mine)]

    def draw(plt: Any) -> Any:
        fig, axes = plt.subplots(1, len(backends), figsize=(6 * len(backends), 4.5), squeeze=False)
        for ax, backend in zip(axes[0], backends, strict=True):
            mine = sizes(backend)
            versions = [r["versions"] for r in mine]
            for key, label in SCALE_FIGURES:
                values = [r[key]["median"] if r.get(key) else None for r in mine]
                points = [(v, y) for v, y in zip(versions, values, strict=True) if y]
                if points:
                    ax.plot(*zip(*points, strict=True), "o-", label=label)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("versions in the store (log)")
            ax.set_ylabel("ms (log)")
            ax.set_title(f"txstore metadata at scale: {backend}")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=8)
        return fig

    link = plots.save("scale", "operations against history length", draw)
    return text + scale_floors(report) + (f"\n{link}\n" if link else "")


# --------------------------------------------------------------------------- reads


READ_TASKS = (
    ("seq", "sequential iteration, one process", "samples_per_s"),
    ("dl", "DataLoader, batch 64", "samples_per_s"),
    ("ra", "random access `ds[i]`", "p50_us"),
)
TXSTORE_READER = {"seq": "tx-ds", "dl": "tx-ds", "ra": "tx-ds"}


def read_results(report: Report, workers: int | None = 2) -> list[Row]:
    return [r for r in report["results"] if workers is None or r.get("workers", 2) == workers]


def read_table(rows: Sequence[Row]) -> str:
    """One workload: every task, cache state and reader; txstore's advantage over each."""
    headers = ["task", "cache", "reader", "samples/s", "MB/s", "p50 µs", "p90 µs", "p99 µs"]
    headers += ["max µs"]
    headers += ["1st batch s", "peak RSS MB", "peak anon MB", "txstore ÷ this", "runs"]
    out = []
    for task, _title, primary in READ_TASKS:
        for cache in ("warm", "cold"):
            here = [r for r in rows if r["task"] == task and r["cache"] == cache]
            ours = next((r for r in here if r["variant"] == TXSTORE_READER[task]), None)
            for r in here:
                m = r["median"]
                if "error" in m:
                    out.append([task, cache, r["label"], "ERROR"] + [""] * (len(headers) - 4))
                    continue
                ratio = None
                if ours is not None and "error" not in ours["median"]:
                    ratio = faster(ours["median"][primary], m[primary], primary != "p50_us")
                check = "" if m.get("check") == "ok" else f" ({m.get('check')})"
                spread = "/".join(format(v, ".0f") for v in m.get("spread", []))
                out.append(
                    [
                        task,
                        cache,
                        r["label"] + check,
                        fmt(m.get("samples_per_s"), ",.0f") if task != "ra" else "",
                        fmt(m.get("mb_per_s"), ",.0f") if task != "ra" else "",
                        fmt(m.get("p50_us"), ",.1f"),
                        fmt(m.get("p90_us"), ",.1f"),
                        fmt(m.get("p99_us"), ",.1f"),
                        fmt(m.get("max_us"), ",.0f"),
                        fmt(m.get("first_batch_s"), ".2f"),
                        fmt(m.get("peak_rss_mb"), ",.0f"),
                        fmt(m.get("peak_anon_mb"), ",.0f"),
                        x(ratio),
                        spread,
                    ]
                )
    return table(headers, out)


def read_section(report: Report, workers_report: Report | None, plots: Plots) -> str:
    rows = read_results(report)
    workloads = sorted({r["workload"] for r in rows})
    parts = [
        "## Reading\n",
        "`bench_read.py`: txstore `StreamingDataset` (also `zero_copy=True`) and `Snapshot`, "
        "LitData `StreamingDataset` / `StreamingDataLoader` (`ds[i]` with its default "
        "`batch_decode` and with `batch_decode=0`, its fast path), MosaicML `StreamingDataset` "
        "behind a torch `DataLoader`; the in-memory row is the same DataLoader over samples "
        "already in memory, the ceiling that worker start, collate and the pipe leave. "
        "The floor rows read the same payloads from one plain file, doing the least a reader "
        "must: copy each payload out of a map (an unchecked copying reader), hash it with "
        "xxh3 (a reader that checks what it hands out as a view), both (one that checks and "
        "copies, as txstore's default), or for `ds[i]` one pread of the sample, or a pread "
        "and hash of the 64 KiB block around it (txstore's default block). "
        "DataLoader: 2 workers, batch 64, samples/s over the whole epoch (worker start "
        "included). `txstore ÷ this`: how many times better txstore's `StreamingDataset` is "
        "(samples/s for seq and DataLoader, p50 latency for `ds[i]`; above 1: txstore better). "
        "Peak RSS sums the process and its workers (each one's VmHWM); it counts the pages of "
        "files a reader maps, which txstore does for the chunks it reads whole (a random "
        "`ds[i]` of a block of 32 KiB or more preads it), while a reader that copies them "
        "with `read` keeps the same pages in the page cache uncounted. Peak "
        "anon is the largest sum of the processes' anonymous memory (`RssAnon`) at one time: "
        "what the readers allocate, alike for every reader. Both are read from `/proc` every "
        "20 ms, except for `ds[i]`, where they are read before and after the timed accesses "
        "(a sampling thread took the GIL from the loop it timed).\n",
    ]
    for w in workloads:
        parts.append(f"**{w}**\n\n" + read_table([r for r in rows if r["workload"] == w]) + "\n")
    targets = [
        [
            t["target"],
            t["workload"],
            t["cache"],
            fmt(t["ratio"], ".3f"),
            read_verdict(t),
            fmt(t.get("floor_ratio"), ".3f"),
        ]
        for t in report.get("targets", [])
    ]
    if targets:
        parts.append(
            "Targets (ratio = txstore ÷ peer; for p99 ≤ 2× p50, txstore's p99 ÷ its own p50; "
            "for the 5 ms bound, the slowest access ÷ 5 ms). *Floor's ratio*: the same "
            "figure for the floor named by the target (a checked copy for the default "
            "reader, a checked view for zero_copy, a pread and hash of the 64 KiB block for "
            "`ds[i]`, a bare pread for the tail); a miss is *bounded* when the floor misses "
            "too and txstore does no better than the floor, so that no reader doing that work "
            "meets the target on this machine:\n\n"
            + table(["target", "wl", "cache", "ratio", "", "floor's ratio"], targets)
            + "\n"
        )
    panels = []
    for w in workloads:
        for task in ("seq", "dl"):
            bars = []
            for r in rows:
                if r["workload"] == w and r["task"] == task and "error" not in r["median"]:
                    bars.append((f"{r['label']} ({r['cache']})", r["median"].get("mb_per_s")))
            panels.append((f"{w}: {dict((t, n) for t, n, _ in READ_TASKS)[task]}", bars))
    link = plots.save(
        "read-throughput",
        "read throughput by system",
        lambda plt: bar_panels(plt, panels, "MB/s of payload touched"),
    )
    parts.append(link + "\n" if link else "")
    ra = []
    for w in workloads:
        bars = []
        for r in rows:
            if r["workload"] == w and r["task"] == "ra" and "error" not in r["median"]:
                bars.append((f"{r['label']} ({r['cache']})", r["median"].get("p50_us")))
        ra.append((f"{w}: ds[i] p50 latency", bars))
    link = plots.save(
        "random-access",
        "random access latency by system",
        lambda plt: bar_panels(plt, ra, "p50 µs (log; shorter is better)", log=True),
    )
    parts.append(link + "\n" if link else "")
    if workers_report is not None:
        parts.append(workers_section(workers_report, plots))
    return "\n".join(parts)


def read_verdict(row: Row) -> str:
    if row["met"] is None:
        return "-"
    if row["met"]:
        return "met"
    return "**not met**, bounded by the floor" if row.get("bounded") else "**not met**"


def workers_section(report: Report, plots: Plots) -> str:
    rows = [r for r in read_results(report, None) if r["task"] == "dl"]
    workloads = sorted({r["workload"] for r in rows})
    counts = sorted({r.get("workers", 2) for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    label = {r["variant"]: r["label"].split(",")[0] for r in rows}
    cache = rows[0]["cache"] if rows else "warm"
    table_rows = []
    for w in workloads:
        for v in variants:
            cells = [w, label[v]]
            for n in counts:
                found = next(
                    (
                        r
                        for r in rows
                        if r["workload"] == w and r["variant"] == v and r.get("workers", 2) == n
                    ),
                    None,
                )
                m = found["median"] if found else {}
                cells.append(fmt(m.get("samples_per_s"), ",.0f"))
            table_rows.append(cells)
    headers = ["wl", "loader", *(f"{n} workers" for n in counts)]
    text = (
        f"**DataLoader samples/s against the number of workers** ({cache} page cache, "
        f"`bench_read.py --tasks dl --workers {','.join(map(str, counts))}`; 0 workers reads "
        "in the main process):\n\n" + table(headers, table_rows) + "\n"
    )

    def draw(plt: Any) -> Any:
        fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
        for ax, w in zip(axes.flat, workloads, strict=True):
            for v in variants:
                points = sorted(
                    (r.get("workers", 2), r["median"].get("samples_per_s"))
                    for r in rows
                    if r["workload"] == w and r["variant"] == v and "error" not in r["median"]
                )
                if points:
                    xs, ys = zip(*points, strict=True)
                    color = COLORS[system_of(label[v])]
                    ax.plot(xs, ys, "o-", label=label[v], color=color)
            ax.set_xticks(counts)
            ax.set_xlabel("DataLoader workers")
            ax.set_ylabel("samples/s")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{w}: DataLoader throughput ({cache})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        return fig

    link = plots.save("dataloader-workers", "DataLoader throughput against workers", draw)
    return text + (f"\n{link}\n" if link else "")


# --------------------------------------------------------------------------- fields


def fields_section(report: Report) -> str:
    mb = 1e6
    store = sum(report["store_bytes"].values())
    adds = [
        [
            str(a["workers"]),
            f"{a['wall_s']:.2f}",
            f"{a['written_total'] / mb:,.0f}",
            f"{a['written'].get('chunks/*.chunk', 0) / mb:,.0f}",
            f"{a['written_total'] / store:.3f}",
            " / ".join(f"{t:.2f}" for t in a["runs_s"]),
        ]
        for a in report["add_fields"]
    ]
    n = report["reads"][0]["samples"] if report.get("reads") else 0
    parts = [
        "## Adding a field, reading some fields (txstore only)\n",
        f"`bench_fields.py`: a store of {n or 200_000:,} samples `{{id, caption: 64-char str, "
        "a: 1 KiB, b: 1 KiB, c: 2 KiB}}` "
        f"({store / mb:,.0f} MB); `add_fields(store, fn, ['latent'], num_workers=0 | 2)` adds "
        "a 4 KiB field, each run on a fresh copy. No chunk is rewritten: what is written is the "
        "new field's file and metadata.\n",
        table(
            ["workers", "wall s", "written MB", "chunks rewritten MB", "÷ store", "runs (s)"],
            adds,
        )
        + "\n",
    ]
    reads = report.get("reads", [])
    if reads:
        full = {(r["case"], r["reader"]): r for r in reads if r["fields"] == "all"}
        rows = []
        for r in reads:
            f = full[(r["case"], r["reader"])]
            rows.append(
                [
                    r["case"],
                    r["reader"],
                    r["fields"],
                    f"{r['ideal_bytes'] / f['ideal_bytes']:.3f}",
                    f"{r['counted_bytes'] / f['counted_bytes']:.3f}",
                    fmt(r["cold_read_bytes"] / f["cold_read_bytes"], ".3f")
                    if f["cold_read_bytes"]
                    else "-",
                    fmt(r["warm_s"], ".2f"),
                    fmt(r["cold_s"], ".2f"),
                    fmt(faster(r["warm_s"], f["warm_s"], False), ".2f"),
                ]
            )
        parts.append(
            "Reading some fields of every sample, as fractions of the full read of the same "
            "version and reader: the ideal (the fields' share of the stored frames), the bytes "
            "the storage returned, the bytes read from the disk (cold cache); and the time "
            "(`speed-up` = full read's warm time ÷ this one's).\n\n"
            + table(
                [
                    "version",
                    "reader",
                    "fields",
                    "ideal",
                    "returned",
                    "disk (cold)",
                    "warm s",
                    "cold s",
                    "speed-up",
                ],
                rows,
            )
            + "\n"
        )
    return "\n".join(parts)


# --------------------------------------------------------------------------- remote


REMOTE_NAMES = {"txstore": "txstore", "litdata": "LitData", "mds": "MosaicML"}
REMOTE_TASKS = {
    "open": "open (len)",
    "cold": "cold epoch, 1 process",
    "dl": "cold epoch, 2-worker DataLoader",
    "warm": "warm epoch (cache filled)",
    "shuffle": "shuffled cold epoch",
    "quarter": "cold epoch, cache = ¼ dataset",
    "append": "epoch after a 10% append",
    "ra": "`ds[i]`, cold",
}


def fields_vs_lance_section(report: Report) -> str:
    rows = [
        [r["system"], f"{r['median_s']:.4f}", f"{report['samples'] / r['median_s']:,.0f}",
         x(r["vs_lance"])]
        for r in report["add_field_from_id"]
    ]  # fmt: skip
    target = report["target"]
    return "\n".join([
        "## Adding a field computed from `id`, against Lance's `add_columns`\n",
        f"`bench_fields.py --vs-lance`: W1, {report['samples']:,} samples; a field `id * 2` "
        f"computed in batches of {report['batch_size']:,} rows from `id` alone (txstore "
        "`add_fields(inputs=['id'], batch_size=...)`, Lance `add_columns(read_columns=['id'])`), "
        "each run on a fresh copy, every file each left fsynced. Medians of the repeats.\n",
        table(["system", "median s", "samples/s", "÷ Lance"], rows) + "\n",
        f"Target ≥ {target['ratio']}× Lance: {'met' if target['met'] else 'not met'} "
        f"({target['got']:.2f}×).\n",
        *_read_id_lines(report),
        run_line([report]) + "\n",
    ])  # fmt: skip


def _read_id_lines(report: Report) -> list[str]:
    """What bounds the add: reading id alone, and the floor of one pread per id frame."""
    reads = report.get("read_id")
    if not reads:
        return []
    rows = [[r["read"], f"{r['median_s'] * 1e3:.2f}"] for r in reads]
    floor = next(r["median_s"] for r in reads if r["read"].startswith("one pread"))
    lance = next(r["median_s"] for r in report["add_field_from_id"] if "lance" in r["system"])
    where = (
        "pieces of its own of up to 4096 values (a column stored apart, docs/format.md §7.6)"
        if report.get("id_apart")
        else "frames, one per block of about 64 KiB (a block holds every field of its samples)"
    )
    return [
        f"Reading `id` alone, warm. In txstore's chunks `id` sits in {report['id_frames']:,} "
        f"{where}, so any reader of it reads that many ranges of the files; a pread of each, "
        f"and nothing else, takes {floor / lance:.0%} of Lance's whole `add_columns`:\n",
        table(["read", "median ms"], rows) + "\n",
    ]


ARROW_TARGETS = {
    "batches / dicts": (">=", 2.0),
    "batches / lance-2.0": (">=", 1.2),
    "scan txstore / lance-2.0 (speed)": (">=", 1.5),
    "take(64) / 64 x snap[i] (time)": ("<=", 0.5),
}


def _arrow_bound(name: str, ratios: dict[str, float]) -> float | None:
    """The best a target's ratio could be, from the floors measured in the same run: txstore
    writing as fast as the floor, against Lance's write and against its own dict path; a take
    that only reads and checks each row's block, against 64 snap[i]. None where the run has
    no floor for it."""
    if name == "batches / lance-2.0" and "lance-2.0 / floor (speed)" in ratios:
        return 1 / ratios["lance-2.0 / floor (speed)"]
    if name == "batches / dicts" and "txstore-batches / floor (speed)" in ratios:
        return ratios[name] / ratios["txstore-batches / floor (speed)"]
    if name == "take(64) / 64 x snap[i] (time)":
        return ratios.get("floor / 64 x snap[i] (time)")
    return None


def arrow_section(report: Report) -> str:
    n = report.get("workload", "W1")
    writes = [[name, f"{seconds:.2f}"] for name, seconds in report["write_s"].items()]
    scans = [[name, f"{seconds:.3f}"] for name, seconds in report["scan_s"].items()]
    takes = [[name, f"{seconds * 1e3:.2f}"] for name, seconds in report["take_s"].items()]
    ratios = []
    given = report["ratios"]
    for name, value in given.items():
        sign, target = ARROW_TARGETS.get(name, ("", None))
        met = (
            ""
            if target is None
            else ("met" if (value >= target if sign == ">=" else value <= target) else "not met")
        )
        bound = _arrow_bound(name, given)
        if met == "not met" and bound is not None and target is not None:
            # The floor alone misses the target: no writer or reader of this format meets it.
            reach = bound <= target if sign == ">=" else bound >= target
            if reach:
                met = f"bounded: {bound:.2f} at the floor"
        ratios.append([name, f"{value:.2f}", "" if target is None else f"{sign} {target}", met])
    return "\n".join([
        "## Arrow in and out (txstore and Lance)\n",
        f"`bench_arrow.py`, {n}: txstore's `append` of record batches against its `append` of "
        "dicts and Lance's `write_dataset` of the same table (Arrow conversion before the "
        "timer for both; every total includes an fsync of the files each left); a warm scan "
        "into record batches; `take` of 64 random rows against 64 `snap[i]` and Lance's "
        "`take`. Medians of the repeats. Two floors in the same run: a durable write of the "
        "table's own buffers (64 MiB files, fsync), and 64 preads of a 64 KiB block of "
        "txstore's chunks each checked with XXH3 (what reading one row costs in this format, "
        "whose blocks are 64 KiB); a target the floor itself misses is bounded.\n",
        table(["write (durable)", "s"], writes) + "\n",
        table(["scan, warm", "s"], scans) + "\n",
        table(["64 random rows", "ms"], takes) + "\n",
        table(["ratio", "value", "target", ""], ratios) + "\n",
        run_line([report]) + "\n",
    ])  # fmt: skip


def ray_section(report: Report) -> str:
    n = report["rows"]
    rows = [
        [way, name, f"{seconds:.2f}", f"{n / seconds:,.0f}"]
        for way, times in (("write", report["write_s"]), ("read", report["read_s"]))
        for name, seconds in times.items()
    ]
    given = report["ratios"]
    verdicts = []
    for way in ("write", "read"):
        value = given[f"{way} rows/s, txstore / rows"]
        best = given[f"{way} rows/s, floor / rows"]
        if value >= 3:
            verdict = "met"
        elif best < 3:
            verdict = f"bounded: {best:.2f} at the floor"
        else:
            verdict = "not met"
        verdicts.append([way, f"{value:.2f}", f"{best:.2f}", ">= 3", verdict])
    return "\n".join([
        "## Ray Data: the datasink and datasource\n",
        f"`bench_ray.py`, {report.get('workload', 'W1')} ({n:,} rows of Arrow blocks, "
        f"{report.get('blocks', 16)} blocks), a local Ray with 2 CPUs: txstore's "
        "`TxstoreDatasink` (a commit, chunks fsynced) and `TxstoreDatasource` (every batch "
        "consumed) against the row-by-row faces they replaced (`rows`, txstore `c262782`, "
        "kept in the script), medians of the repeats. Floors in the same run: `ray alone` "
        "(a sink that only takes its blocks, a source that makes blocks of the same size "
        "without reading), `disk alone` (the blocks' bytes written and fsynced, no Ray) "
        "and, where measured, `ray + disk` (a sink that writes and fsyncs the bytes of the "
        "blocks Ray gives it); both sinks are given as many blocks a task as txstore's "
        "sink asks (two chunks' worth); a write takes "
        "at least the longest of these, a read at least Ray's. Each write's output is "
        "deleted before the next, after an untimed write of as many bytes, so that each "
        "finds the blocks the one before it freed (on the bench VM, writes to blocks never "
        "written before took about 3x as long), and the reads read one store written "
        "once.\n",
        table(["way", "face", "s", "rows/s"], rows) + "\n",
        table(["way", "txstore ÷ rows", "floor ÷ rows", "target", ""], verdicts) + "\n",
        run_line([report]) + "\n",
    ])  # fmt: skip


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n:,} B"


def import_section(reports: Sequence[Report]) -> str:
    rows = [
        [
            r["contender"],
            _size(r.get("blob_bytes", 100 * 1024)),
            f"{r['samples']:,}",
            f"{r['bytes'] / 1e6:,.0f}",
            f"{r['MB_per_s']:,.0f}",
            x(r["vs_plain_copy"]),
        ]
        for report in reports
        for r in report["results"]
    ]
    return "\n".join([
        "## Importing LitData, MDS and Parquet datasets\n",
        "`bench_import.py`: samples `{id: int, blob: random bytes}` (100 KiB, and with "
        "`--blob 2048` 2 KiB: 512 MB of blobs either way) written by "
        "`litdata.optimize`, `streaming.MDSWriter` and `pyarrow.parquet` (4 files, row "
        "groups of about 25 MB, uncompressed), imported into a new uncompressed store. "
        "Each is measured against a plain durable copy of its source's files "
        "(`shutil.copyfile`, a copy in the kernel, and fsync) in the same "
        "run, best of the repeats; Lance's `write_dataset` from the same Parquet files beside "
        "them.\n",
        table(["contender", "blob", "samples", "source MB", "MB/s", "÷ plain copy"], rows)
        + "\n",
        run_line(list(reports)) + "\n",
    ])  # fmt: skip


def reconcile_section(report: Report) -> str:
    rows = report["rows"]

    runs = report.get("runs", [report])

    def rate(r: Row | None) -> str:
        if r is None:
            return "-"
        mark = f" ({r['run']})" if len(runs) > 1 else ""
        if r["check"] != "ok":
            return "stalled" + mark
        return f"{r['samples_per_s']['median']:,.0f}{mark}"

    touches = list(report["touches"])
    seq: dict[tuple[str, str], dict[str, Row]] = {}
    for r in rows:
        if r["task"] == "seq" and r["epoch"] == 1:
            seq.setdefault((r["layout"], r["mode"]), {})[r["touch"]] = r
    seq_rows = [
        [f"{layout}, {mode}", *(rate(by.get(t)) for t in touches)]
        for (layout, mode), by in seq.items()
    ]
    collates = list(report["collates"])
    dl: dict[tuple[str, str], dict[str, Row]] = {}
    for r in rows:
        if r["task"] == "dl":
            dl.setdefault((r["layout"], r["mode"]), {})[r["collate"]] = r
    dl_rows = [
        [f"{layout}, {loader}", *(rate(by.get(c)) for c in collates)]
        for (layout, loader), by in dl.items()
    ]
    w = report["workload"]
    return "\n".join([
        "## Why harnesses disagree on W2\n",
        f"`reconcile_w2.py` (bench/README.md says why): {w['num_samples']:,} samples of "
        f"{w['payload_size'] // 1024} KiB, warm page cache, each figure a fresh process, "
        "median samples/s of the repeats. LitData written three ways: `lit-bytes` (jpeg as "
        "bytes, no pyarrow), `lit-numpy` (jpeg as a numpy array), `lit-arrow` (bytes with "
        "pyarrow importable, which makes LitData write its Arrow layout); txstore two: "
        "`txstore` (jpeg as bytes) and `txstore-numpy` (as a numpy array)."
        + (
            " A figure's (n) names the run it comes from (listed below, oldest first): a later "
            "run of some layouts and tasks, with its peers, replaces those rows."
            if len(runs) > 1
            else ""
        )
        + "\n",
        "Sequential epoch (first epoch), by what each sample's jpeg is touched with: "
        + "; ".join(f"{k}: {v}" for k, v in report["touches"].items()) + ".\n",
        table(["layout, mode", *touches], seq_rows) + "\n",
        "2-worker DataLoader, batch 64, by collate: "
        + "; ".join(f"{k}: {v}" for k, v in report["collates"].items())
        + " (stalled: no batch within the cap).\n",
        table(["layout, loader", *collates], dl_rows) + "\n",
        run_line(runs) + "\n",
    ])  # fmt: skip


WRITER_MODES = {
    "appends": "each writer `append`s",
    "staged": "one staged commit per round of N parts",
    "staged-reuse": "staged, each writer's client kept",
}


def writers_section(report: Report) -> str:
    rows_in = sorted(
        report["rows"], key=lambda r: (list(WRITER_MODES).index(r["mode"]), r["writers"])
    )
    settings = report.get("settings", {})
    cores = rows_in[0]["cpu"]["cores"] if rows_in else "?"
    headers = ["mode", "N", "commits/s", "per writer", "samples/s", "× 1 writer"]
    headers += ["p50 ms", "p99 ms", "attempts", "retried", "S3 calls", "ms/call", "busy cores"]
    rows = []
    for r in rows_in:
        calls = sum(r["requests_per_commit"].values())
        appends = r["mode"] == "appends"
        per_call = r["latency_ms"]["mean"] / calls if appends and calls else None
        retried = r["attempts"].get("retried_share")
        rows.append([
            r["mode"],
            str(r["writers"]),
            f"{r['commits_per_s']:.1f}",
            f"{r['commits_per_s'] / r['writers']:.2f}" if appends else "-",
            f"{r['samples_per_s']:.1f}",
            x(r.get("x_one_writer_samples")),
            f"{r['latency_ms']['p50']:.0f}",
            f"{r['latency_ms']['p99']:.0f}",
            f"{r['attempts']['mean']:.2f} (max {r['attempts']['max']})",
            "-" if retried is None else f"{100 * retried:.0f}%",
            f"{calls:.1f}",
            fmt(per_call, ".1f"),
            f"{r['cpu']['busy_cores']:.2f}",
        ])  # fmt: skip
    kinds = sorted({k for r in rows_in for k in r["requests_per_commit"]})
    call_rows = [
        [r["mode"], str(r["writers"])]
        + [fmt(r["requests_per_commit"].get(k), ".2f") for k in kinds]
        for r in rows_in
    ]
    cpu_rows = []
    for r in rows_in:
        calls = sum(r["requests_per_commit"].values()) * r["commits"]
        cpu = r["cpu"]
        cpu_rows.append(
            [r["mode"], str(r["writers"])]
            + [f"{cpu[k] / r['window_s']:.2f}" for k in ("server_s", "writers_s", "coordinator_s")]
            + [f"{calls / r['window_s']:.0f}"]
            + [fmt(1000 * cpu["server_s"] / calls if calls else None, ".1f")]
            + [fmt(1000 * (cpu["writers_s"] + cpu["coordinator_s"]) / calls if calls else None,
                   ".1f")]
        )  # fmt: skip
    staged = [r for r in rows_in if "phases_ms_p50" in r]
    phase_rows = [
        [r["mode"], str(r["writers"])]
        + [f"{r['phases_ms_p50'][k]:.0f}" for k in ("parts", "one_part_write", "add", "commit")]
        for r in staged
    ]
    appends = [r for r in rows_in if r["mode"] == "appends"]
    summary = ""
    if appends:
        best = max(appends, key=lambda r: r["commits_per_s"])
        last = appends[-1]
        summary = (
            f"Appending writers peak at N = {best['writers']} ({best['commits_per_s']:.1f} "
            f"commits/s, {x(best.get('x_one_writer_commits'))} one writer's); at N = "
            f"{last['writers']} they make {last['commits_per_s']:.1f} commits/s "
            f"({x(last.get('x_one_writer_commits'))}), a commit taking "
            f"{last['attempts']['mean']:.2f} tries on average (at most "
            f"{last['attempts']['max']}) and {sum(last['requests_per_commit'].values()):.1f} S3 "
            f"calls, against {sum(appends[0]['requests_per_commit'].values()):.1f} alone."
        )
    duration = settings.get("duration_s", "?")
    return "\n".join([
        "## Many writers on one S3 store\n",
        f"`bench_writers.py`: N writer processes (spawned) commit to one store in a moto_server "
        f"process on this {cores}-core machine (no network latency added), for {duration} s a "
        f"run, each commit {settings.get('samples', 1)} sample of "
        f"{settings.get('sample_bytes', 1024)} B. *appends*: each writer calls "
        "`store.append` in a loop (optimistic concurrency: a lost race rebases and tries "
        "again; `attempts` is `Commit.attempts`). *staged*: a coordinator opens "
        "`store.transaction()` per round, the N writers each write a part through "
        "`StagedWriter(handle)` and hand it back as JSON, the coordinator `add`s them (reading "
        "each chunk back) and commits once; rounds follow one another. *staged-reuse*: the "
        "same, each writer giving the storage of its first transaction's writer to the next "
        "(`StagedWriter(handle, storage=...)`; without it each handle opens a new storage, "
        "which shares the process's s3fs client). S3 calls are "
        "counted in every process at s3fs's `_call_s3`; `× 1 writer` is samples/s against "
        "one appending writer; `ms/call` is the mean commit latency over its calls; busy "
        "cores is the CPU time of the server, the writers and the coordinator over the run "
        f"(all of them share the {cores} cores).\n",
        table(headers, rows) + "\n",
        summary + "\n" if summary else "",
        "S3 calls per commit (per round for the staged modes, the writers' and the "
        "coordinator's together), by operation and object:\n",
        table(["mode", "N", *kinds], call_rows) + "\n",
        "CPU, in cores busy over the run; the S3 calls the server answered per second; CPU "
        "milliseconds per S3 call (the server's; the writers' and coordinator's, which sign, "
        "send and parse):\n",
        table(["mode", "N", "moto", "writers", "coordinator", "S3 calls/s", "moto ms/call",
               "client ms/call"], cpu_rows) + "\n",
        ("Staged rounds, p50 of each phase (ms): the writers' parts (from the handle sent to "
         "the last part back), one writer's part alone, the coordinator's `add`s, the "
         "commit:\n") if phase_rows else "",
        table(["mode", "N", "parts", "one part", "add", "commit"], phase_rows) + "\n"
        if phase_rows else "",
        run_line([report]) + "\n",
    ])  # fmt: skip


def _remote(report: Report) -> dict[tuple[str, float, str, str, str], Row]:
    """The medians by (where, latency, workload, task, system); a run that read other samples
    than it should have (its check failed) is no figure."""
    return {
        (r["kind"], r["latency_ms"], r["workload"], r["task"], r["system"]): r["median"]
        for r in report["results"]
        if r["median"].get("check", "ok") == "ok"
    }


def _best_peer(
    results: dict[tuple[str, float, str, str, str], Row],
    key: tuple[str, float, str, str],
    value: str,
    higher: bool,
) -> float | None:
    peers = [results.get((*key, s), {}).get(value) for s in ("litdata", "mds")]
    found = [p for p in peers if isinstance(p, int | float) and p]
    if not found:
        return None
    return max(found) if higher else min(found)


#: The share of the machine's cores busy at which a missed samples/s target counts as bounded.
BUSY = 0.9


def _busy(r: Row) -> float | None:
    """Cores busy through a run: the client's, proxy's and server's CPU seconds ÷ its wall;
    None for a run whose client CPU counted its imports too (``cpu_window`` absent)."""
    if r.get("cpu_window") != "task" or not r["seconds"]:
        return None
    cpu = r["client_cpu_s"] + r["proxy_cpu_s"] + r["server_cpu_s"]
    return float(cpu / r["seconds"])


def _remote_verdict(
    t: Row, results: dict[tuple[str, float, str, str, str], Row], cores: int
) -> str:
    """met, missed, or (a samples/s target) bounded by the machine's CPU."""
    if t["met"]:
        return "met"
    task = "dl" if "DataLoader" in t["what"] else "cold"
    r = results.get((t["kind"], t["latency_ms"], t["workload"], task, "txstore"))
    busy = _busy(r) if r and "samples/s" in t["what"] else None
    if busy is not None and busy >= BUSY * cores:
        return f"**missed**, bounded by CPU ({busy:.2f} cores)"
    return "**missed**"


def _remote_cell(task: str, r: Row | None) -> str:
    if r is None:
        return "-"
    if "error" in r:
        return f"failed: {r.get('reason', 'see the JSON')}"
    if task == "open":
        return f"{r['seconds']:.2f} s, {r['requests']} req ({r['round_trips']} seq.)"
    if task == "ra":
        return (
            f"p50 {r['p50_ms']:.1f} / p99 {r['p99_ms']:.0f} ms, {r['requests_per_access']:.2f} req"
        )
    first = r.get("first_s")
    return (
        f"{r['samples_per_s']:,.0f}/s, first {fmt(first, '.2f')} s, "
        f"{r['bytes_x_dataset']:.2f}× data, {r['requests']} req, {r['peak_connections']} conn"
    )


def remote_section(report: Report, plots: Plots) -> str:
    st = report["settings"]
    results = _remote(report)
    workloads = {w["name"]: w for w in report["workloads"]}
    described = "; ".join(
        f"{name}: {w['num_samples']:,} × {w['payload_size'] // 1024} KiB"
        for name, w in workloads.items()
    )
    total = f", all connections together {st['total_mbps']:g} MB/s" if st["total_mbps"] else ""
    parts = [
        "## Streaming from an object store\n",
        f"`bench_remote.py`: a local S3 server ({st.get('server', 'moto')}) behind a shaping "
        "proxy that adds "
        f"{st['latency_ms']:g} ms to the first byte of every answer and caps each connection at "
        f"{st['conn_mbps']:g} MB/s{total}, counting requests and bytes. Each system wrote "
        f"{described} to its own prefix (its default 64 MiB chunks); every measurement is a "
        f"fresh process with an empty cache (warm: a cache a previous process filled), median "
        f"of {st['repeat']}; the clock starts once the process has imported torch, the "
        "system's package and its object-store client. `× data`: bytes the proxy passed ÷ the "
        "dataset's bytes. "
        "`conn`: most connections open at once. Ratios are txstore ÷ the faster peer.\n",
    ]
    base = st["latency_ms"]
    for wl in workloads:
        rows = []
        for task, title in REMOTE_TASKS.items():
            cells = [
                _remote_cell(task, results.get(("s3", base, wl, task, s))) for s in REMOTE_NAMES
            ]
            if all(c == "-" for c in cells):
                continue
            rows.append([title, *cells])
        if rows:
            parts.append(f"### {wl}, S3, {base:g} ms\n")
            parts.append(table(["measurement", *REMOTE_NAMES.values()], rows) + "\n")
    latencies = sorted({k[1] for k in results if k[0] == "s3"})
    if len(latencies) > 1:
        rows = []
        for wl in workloads:
            for task in ("cold", "dl"):
                for ms in latencies:
                    ours = results.get(("s3", ms, wl, task, "txstore"), {}).get("samples_per_s")
                    best = _best_peer(results, ("s3", ms, wl, task), "samples_per_s", True)
                    rows.append([wl, REMOTE_TASKS[task], f"{ms:g} ms", fmt(ours, ",.0f"),
                                 fmt(best, ",.0f"), x(faster(ours, best, True))])  # fmt: skip
        parts.append("### Samples/s against latency\n")
        parts.append(
            table(["wl", "measurement", "latency", "txstore", "faster peer", "ratio"], rows) + "\n"
        )

        def draw(plt: Any) -> Any:
            fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), squeeze=False)
            for ax, wl in zip(axes.flat, workloads, strict=False):
                for system, name in REMOTE_NAMES.items():
                    for task, style in (("cold", "-"), ("dl", "--")):
                        ys = [results.get(("s3", ms, wl, task, system), {}).get("samples_per_s")
                              for ms in latencies]  # fmt: skip
                        ax.plot(latencies, [y or 0 for y in ys], style, marker="o",
                                color=COLORS[name], label=f"{name} {task}")  # fmt: skip
                ax.set_title(f"{wl}: cold epoch (solid: 1 process, dashed: 2 workers)", fontsize=10)
                ax.set_xlabel("first-byte latency, ms")
                ax.set_ylabel("samples/s")
                ax.grid(alpha=0.3)
            axes.flat[0].legend(fontsize=8)
            fig.tight_layout()
            return fig

        parts.append(plots.save("remote-latency", "samples/s against latency", draw) + "\n")
    others = sorted({k[0] for k in results if k[0] != "s3"})
    if others:
        rows = []
        for kind in others:
            for wl in workloads:
                for task in ("open", "cold", "dl", "ra"):
                    r = results.get((kind, base, wl, task, "txstore"))
                    if r is not None:
                        rows.append([kind, wl, REMOTE_TASKS[task], _remote_cell(task, r)])
        parts.append(f"### txstore on the GCS and Azure emulators, {base:g} ms\n")
        parts.append(
            "fake-gcs-server and Azurite behind the same proxy: txstore alone (the peers' "
            "readers were not set up against these emulators).\n\n"
            + table(["where", "wl", "measurement", "txstore"], rows)
            + "\n"
        )
    cores = report["machine"].get("usable_cpus") or report["machine"].get("nproc") or 1
    targets = report.get("targets", [])
    if targets:
        rows = [
            [
                f"{t['kind']} {t['latency_ms']:g} ms",
                t["workload"],
                t["what"],
                f"{t['txstore']:.3g}",
                fmt(t["best_peer"], ".3g"),
                x(t["ratio"]),
                t["target"],
                _remote_verdict(t, results, cores),
            ]
            for t in targets
        ]
        parts.append("### Targets\n")
        parts.append(
            "A missed samples/s target is *bounded* when the client, the proxy and the server "
            f"together kept the machine's {cores} cores at least {BUSY:.0%} busy through "
            "txstore's run (CPU seconds ÷ wall seconds, in brackets): the server and the "
            "proxy, which a real object store does not put on the reader's machine, then take "
            "cores the reader would use.\n\n"
            + table(
                ["where", "wl", "figure", "txstore", "faster peer", "ratio", "target", ""], rows
            )
            + "\n"
        )
    rows = []
    for (kind, ms, wl, task, system), r in sorted(results.items()):
        if kind != "s3" or task not in ("cold", "dl") or "error" in r:
            continue
        rows.append([f"{ms:g} ms", wl, REMOTE_TASKS[task], REMOTE_NAMES[system],
                     f"{r['seconds']:.1f}", f"{r['client_cpu_s']:.1f}",
                     fmt(r.get("client_sys_s"), ".1f"), f"{r['proxy_cpu_s']:.1f}",
                     f"{r['server_cpu_s']:.1f}", fmt(_busy(r), ".2f"), str(r["peak_connections"]),
                     str(r["peak_in_flight"])])  # fmt: skip
    if rows:
        parts.append("### What bounds each run\n")
        parts.append(
            "Wall time against CPU seconds (client: the reading process and its workers, and of "
            "that the kernel's time for them: receiving, writing the cache, page faults; proxy; "
            "server; cores: all three ÷ wall), and the most connections and requests in flight "
            f"at once. A run whose cores figure is close to the machine's {cores} is bound by "
            "CPU; one with few requests in flight, by round trips and the per-connection "
            "cap.\n\n"
            + table(
                [
                    "latency",
                    "wl",
                    "measurement",
                    "system",
                    "wall s",
                    "client cpu s",
                    "of it kernel",
                    "proxy cpu s",
                    "server cpu s",
                    "cores",
                    "conn",
                    "in flight",
                ],
                rows,
            )
            + "\n"
        )
    return "\n".join(parts)


def tokens_section(report: Report) -> str:
    st = report["settings"]
    quick = " (`--quick`: 10× fewer tokens)" if report.get("quick") else ""
    rows = []
    for r in report["results"]:
        if r.get("error"):
            rows.append([r["contender"], str(r["shuffle"]), "ERROR", "", "", "", "", ""])
            continue
        runs = " / ".join(f"{x['epoch_s']:.2f}" for x in r["runs"] if "epoch_s" in x)
        rows.append(
            [
                r["contender"],
                "yes" if r["shuffle"] else "no",
                f"{r['open_s']:.2f}",
                f"{r['epoch_s']:.2f}",
                f"{r['first_batch_s']:.3f}",
                f"{r['tokens_per_s'] / 1e6:,.1f}",
                f"{r['tokens_per_s_with_open'] / 1e6:,.1f}",
                runs,
            ]
        )
    ratios = [
        [
            r["txstore"],
            "yes" if r["shuffle"] else "no",
            x(r["ratio"]),
            x(r["ratio_with_open"]),
            f"≥ {r['target']:g}",
            "met" if r["met"] else "**not met**",
        ]
        for r in report.get("ratios", [])
    ]
    parts = [
        "## Token windows for language-model pretraining\n",
        f"`bench_tokens.py`{quick}: {st['num_tokens']:,} random int32 tokens in documents of "
        f"{st['doc_tokens'][0]:,} to {st['doc_tokens'][1]:,} tokens, windows of "
        f"{st['block_size']:,} tokens, {st['batch_size']} a batch, {st['workers']} DataLoader "
        "workers, warm page cache, each reading a fresh process. txstore "
        "`TokenStreamingDataLoader(TokenStreamingDataset(path, block_size=...))` against "
        "LitData `StreamingDataLoader(StreamingDataset(path, item_loader=TokensLoader(...)))` "
        "over the same tokens (`optimize(..., item_loader=TokensLoader())`, uncompressed). "
        "`open`: making the dataset (txstore counts every document's tokens there, unless "
        "`lengths_field` names a field that holds them; LitData defers its setup to the first "
        "iteration); tokens/s over the epoch, and over open + epoch.\n",
        table(
            [
                "system",
                "shuffle",
                "open s",
                "epoch s",
                "first batch s",
                "M tokens/s",
                "with open",
                "runs (epoch s)",
            ],
            rows,
        )
        + "\n",
    ]
    if ratios:
        parts.append(
            "txstore ÷ LitData, tokens/s:\n\n"
            + table(["txstore", "shuffle", "epoch", "with open", "target", ""], ratios)
            + "\n"
        )
    return "\n".join(parts)


# --------------------------------------------------------------------------- main


def kind(report: Report) -> str:
    script = report.get("script", "")
    if script == "bench_append":
        return "latency" if "commit_latency" in report else "append"
    if script == "bench_read":
        workers = {r.get("workers", 2) for r in report.get("results", [])}
        return "read-workers" if len(workers) > 1 else "read"
    return str(script).removeprefix("bench_")


def tasks_of(report: Report) -> set[str]:
    return {r["task"] for r in report.get("results", [])}


def merged_read(reports: Sequence[Report]) -> tuple[Report, list[Report]]:
    """One read report from the newest run of every task and the newest one of all tasks
    before it: a rerun of some tasks (``--tasks ra``) replaces their rows, comparisons and
    targets, each run with its peers in it. Also the runs the figures come from."""
    ordered = sorted(reports, key=lambda r: r["machine"].get("started", ""))
    full = max(len(tasks_of(r)) for r in ordered)
    base_at = max(i for i, r in enumerate(ordered) if len(tasks_of(r)) == full)
    merged = dict(ordered[base_at])
    runs = [ordered[base_at]]
    for later in ordered[base_at + 1 :]:
        tasks = tasks_of(later)

        def keep(
            rows: list[Row], key: Callable[[Row], tuple[Any, ...]], new: list[Row]
        ) -> list[Row]:
            fresh = {key(r): r for r in new if r.get("ratio") is not None}
            return [fresh.pop(key(r), r) for r in rows] + list(fresh.values())

        merged["results"] = [r for r in merged["results"] if r["task"] not in tasks] + later[
            "results"
        ]
        merged["comparisons"] = keep(
            merged.get("comparisons", []),
            lambda r: (r["workload"], r["cache"], r["metric"], r["peer"]),
            later.get("comparisons", []),
        )
        merged["targets"] = keep(
            merged.get("targets", []),
            lambda r: (r["target"], r["workload"], r["cache"]),
            later.get("targets", []),
        )
        runs.append(later)
    return merged, runs


def merged_remote(reports: Sequence[Report]) -> tuple[Report, list[Report]]:
    """One remote report: the newest run's results replace those of the same measurement
    (where, latency, workload, task, system) in the runs before it, and its target rows
    those of the same where, workload and figure (a run's ratios are to the peers in that
    run). The settings are the run with the most results, whose latency is the base one.
    Also the runs, oldest first."""
    ordered = sorted(reports, key=lambda r: r["machine"].get("started", ""))
    base = max(ordered, key=lambda r: len(r["results"]))
    merged = dict(base)
    results: dict[tuple[Any, ...], Row] = {}
    targets: dict[tuple[Any, ...], Row] = {}
    for report in ordered:
        for row in report["results"]:
            key = (row["kind"], row["latency_ms"], row["workload"], row["task"], row["system"])
            results[key] = row
        for row in report.get("targets", []):
            targets[(row["kind"], row["latency_ms"], row["workload"], row["what"])] = row
    merged["results"] = list(results.values())
    merged["targets"] = list(targets.values())
    return merged, list(ordered)


def merged_scale(reports: Sequence[Report]) -> tuple[Report, list[Report]]:
    """One scale report from several runs (a run of every size on both backends, another of
    the longest history alone): every row and ratio kept, tagged with its run (numbered
    oldest first), since each run's ratios are to its own shortest history. The settings
    are those of the run with the most rows. Also the runs, oldest first."""
    ordered = sorted(reports, key=lambda r: r["machine"].get("started", ""))
    merged = dict(max(ordered, key=lambda r: len(r["rows"])))
    merged["rows"] = [
        row | {"run": n} for n, report in enumerate(ordered, start=1) for row in report["rows"]
    ]
    merged["ratios"] = [
        row | {"run": n} for n, report in enumerate(ordered, start=1) for row in report["ratios"]
    ]
    merged["runs"] = ordered
    return merged, list(ordered)


def merged_reconcile(reports: Sequence[Report]) -> tuple[Report, list[Report]]:
    """One reconcile_w2 report: the newest run's rows replace those of the same measurement
    in the runs before it (a run of some layouts or tasks, each with its peers in it), each
    row tagged with the run it comes from. Also the runs, oldest first."""
    ordered = sorted(reports, key=lambda r: r["machine"].get("started", ""))
    merged = dict(ordered[0])
    found: dict[tuple[Any, ...], Row] = {}
    for number, report in enumerate(ordered, start=1):
        for row in report["rows"]:
            key = (row["task"], row["layout"], row["mode"], row["touch"], row["collate"])
            found[(*key, row["epoch"])] = row | {"run": number}
    merged["rows"] = list(found.values())
    merged["runs"] = ordered
    return merged, list(ordered)


def generate(reports: Sequence[Report], plots: Plots, inputs: Sequence[Path]) -> str:
    by_kind: dict[str, Report] = {}
    for r in reports:
        by_kind[kind(r)] = r  # the last one given of each kind
    used = list(by_kind.values())
    reads = [r for r in reports if kind(r) == "read"]
    if len(reads) > 1:
        by_kind["read"], runs = merged_read(reads)
        used = [r for r in used if kind(r) != "read"] + runs
    remotes = [r for r in reports if kind(r) == "remote"]
    if len(remotes) > 1:
        by_kind["remote"], runs = merged_remote(remotes)
        used = [r for r in used if kind(r) != "remote"] + runs
    scales = [r for r in reports if kind(r) == "scale"]
    if len(scales) > 1:
        by_kind["scale"], runs = merged_scale(scales)
        used = [r for r in used if kind(r) != "scale"] + runs
    imports = [r for r in reports if kind(r) == "import"]  # one a blob size
    if len(imports) > 1:
        used = [r for r in used if kind(r) != "import"] + imports
    reconciles = [r for r in reports if kind(r) == "reconcile_w2"]
    if len(reconciles) > 1:
        by_kind["reconcile_w2"], runs = merged_reconcile(reconciles)
        used = [r for r in used if kind(r) != "reconcile_w2"] + runs
    sources = ", ".join(f"`{p.as_posix()}`" for p in inputs)
    parts = [
        "# Benchmarks\n",
        "txstore side by side with LitData and MosaicML Streaming on the same samples, in the "
        "same run. Generated by `bench/report.py` from the JSON the benchmarks wrote "
        f"({sources}); the scripts, their setup and every option are in `bench/README.md`. "
        "To regenerate:\n",
        "```\n../bench-venv/bin/python bench/report.py bench/results/*.json\n```\n",
        method_section(used),
    ]
    if "append" in by_kind:
        parts.append(append_section(by_kind["append"], plots))
    if "latency" in by_kind:
        parts.append(latency_section(by_kind["latency"], plots))
    if "scale" in by_kind:
        parts.append(scale_section(by_kind["scale"], plots))
    if "optimize" in by_kind:
        parts.append(optimize_section(by_kind["optimize"], plots))
    if "read" in by_kind:
        parts.append(read_section(by_kind["read"], by_kind.get("read-workers"), plots))
    elif "read-workers" in by_kind:
        parts.append(workers_section(by_kind["read-workers"], plots))
    if "fields" in by_kind:
        parts.append(fields_section(by_kind["fields"]))
    if "fields_vs_lance" in by_kind:
        parts.append(fields_vs_lance_section(by_kind["fields_vs_lance"]))
    if "arrow" in by_kind:
        parts.append(arrow_section(by_kind["arrow"]))
    if imports:
        parts.append(import_section(imports))
    if "ray" in by_kind:
        parts.append(ray_section(by_kind["ray"]))
    if "remote" in by_kind:
        parts.append(remote_section(by_kind["remote"], plots))
    if "tokens" in by_kind:
        parts.append(tokens_section(by_kind["tokens"]))
    if "writers" in by_kind:
        parts.append(writers_section(by_kind["writers"]))
    if "reconcile_w2" in by_kind:
        parts.append(reconcile_section(by_kind["reconcile_w2"]))
    text = "\n".join(p.rstrip() + "\n" for p in parts if p)
    return text.replace("\n\n\n", "\n\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("reports", nargs="+", type=Path, help="JSON reports of the benchmarks")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--img", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args(argv)
    reports = []
    for path in args.reports:
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{path}: not a benchmark report: {exc}") from None
    inputs = [Path(os.path.relpath(p.resolve(), REPO)) for p in args.reports]
    text = generate(reports, Plots(args.img, args.out), inputs)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
