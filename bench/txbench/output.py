"""Tables and the JSON report."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from txbench.measure import Result
from txbench.system import format_load
from txbench.workloads import MB


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


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [
        line(r) for r in rows
    ]


def print_write_table(
    results: Sequence[Result], plain_label: str, title: str = "", digits: str = ".2f"
) -> None:
    """One row per contender and workload: write, fsync, total, rates, size, x plain, runs."""
    headers = ["contender", "wl", "write s", "fsync s", "total s", "samples/s", "MB/s"]
    headers += ["disk MB", "x plain", "runs (total s)"]
    rows = []
    for r in results:
        vs_plain = ratio(r.samples_per_s, rate_of(find(results, plain_label, r.workload)))
        disk = None if r.disk_bytes is None else r.disk_bytes / MB
        rows.append(
            [
                r.contender,
                r.workload,
                fmt(r.write_s, digits),
                fmt(r.fsync_s, ".3f"),
                fmt(r.total_s, digits),
                fmt(r.samples_per_s, ",.0f"),
                fmt(r.mb_per_s, ".1f"),
                fmt(disk, ".1f"),
                fmt(vs_plain, ".3f"),
                ", ".join(format(t, digits) for t in r.run_totals_s) or "-",
            ]
        )
    print(f"\n{title}" if title else "")
    print("\n".join(markdown_table(headers, rows)))


def print_notes(results: Sequence[Result]) -> None:
    print()
    for r in results:
        status = "ERROR (traceback above)" if r.error else r.note
        print(f"  {r.workload} {r.contender:<32} {status}")


def new_report(script: str, info: dict[str, Any], quick: bool, **extra: Any) -> dict[str, Any]:
    """The JSON report's head: which script, the machine, the arguments."""
    return {"script": script, "machine": info, "quick": quick, "argv": sys.argv[1:], **extra}


def finish_report(report: dict[str, Any], path: Path | None, started: float) -> None:
    """Record the load average at the end and the run time; write the report if asked."""
    report["machine"]["load_at_end"] = list(os.getloadavg())
    report["run_s"] = time.perf_counter() - started
    print(f"\nload average at end: {format_load(report['machine']['load_at_end'])}")
    print(f"run time: {report['run_s']:.0f} s")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"results written to {path}")
