"""Contenders and their timed runs: fsync-inclusive totals, round robin, medians, checks."""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from txbench.peers import no_imports, write_plain_file
from txbench.system import fsync_tree, settle, tree_bytes
from txbench.workloads import MB, Sample, Workload

T = TypeVar("T")
In = TypeVar("In")


@dataclass(frozen=True)
class Contender(Generic[In]):
    """One system, configured one way: ``run(out, job)`` writes ``job`` into ``out`` and
    returns a note; ``counter(out)``, when given, counts the samples its index lists."""

    key: str
    label: str
    run: Callable[[Path, In], str]
    prepare: Callable[[], Any] = no_imports
    counter: Callable[[Path], int] | None = None
    family: str = ""  # txstore, txstore-zstd, litdata, mds, plain: who is compared with whom
    processes: int = 1


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


def check_count(contender: Contender[Any], out: Path, expected: int) -> str:
    """'' if the contender's index lists ``expected`` samples (or it has no counter)."""
    if contender.counter is None:
        return ""
    found = contender.counter(out)
    return "" if found == expected else f"; COUNT MISMATCH: index says {found}, expected {expected}"


def check_complete(count: int, id_sum: int, num_samples: int) -> str:
    """Every sample exactly once: the count and the sum of ids match."""
    n = num_samples
    if count == n and id_sum == n * (n - 1) // 2:
        return "ok"
    return f"MISMATCH: {count} samples, id sum {id_sum} (expected {n}, {n * (n - 1) // 2})"


def is_unsupported_keyword(exc: BaseException) -> bool:
    return isinstance(exc, TypeError) and "unexpected keyword" in str(exc)


def timed_run(
    contender: Contender[In],
    out: Path,
    job: In,
    result: Result,
    expected: int,
    fsync_root: Path | None = None,
) -> None:
    """Settle, run, fsync every file and folder under ``fsync_root`` (default ``out``), each
    timed; fill ``result``. ``expected``: the samples the output should hold."""
    settle()
    start = time.perf_counter()
    note = contender.run(out, job)
    result.write_s = time.perf_counter() - start
    start = time.perf_counter()
    fsync_tree(fsync_root or out)
    result.fsync_s = time.perf_counter() - start
    result.disk_bytes = tree_bytes(out)
    result.note = note + check_count(contender, out, expected)


def measure(
    contender: Contender[In],
    job: In,
    result: Result,
    workdir: Path,
    prefix: str,
    base: Path | None = None,
    expected: int | None = None,
    fsync_run_dir: bool = False,
) -> Result:
    """One timed run into a fresh folder under ``workdir``, removed afterwards.

    ``base``: an existing dataset, copied (not timed) to the output first, to append to.
    ``fsync_run_dir``: fsync the folder holding the output too, not only the output.
    An error is recorded in the result with its traceback; a keyword the installed version
    does not take marks the contender as skipped.
    """
    run_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))
    out = run_dir / "out"
    try:
        if base is not None:
            shutil.copytree(base, out)
        fsync_root = run_dir if fsync_run_dir else out
        count = result.num_samples if expected is None else expected
        timed_run(contender, out, job, result, count, fsync_root)
    except Exception as exc:
        if is_unsupported_keyword(exc):
            result.note = f"skipped: {exc}"
        else:
            result.error = traceback.format_exc()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def median_result(results: list[Result]) -> Result:
    """The run with the median total; an error in any run is reported instead."""
    failed = [r for r in results if r.error or r.total_s is None]
    if failed:
        return failed[0]
    totals = sorted(r.total_s or 0.0 for r in results)
    chosen = sorted(results, key=lambda r: r.total_s or 0.0)[len(results) // 2]
    return replace(chosen, run_totals_s=totals)


def shuffled(items: Sequence[T], turn: int) -> list[T]:
    """``items`` in the order of repeat ``turn``: seeded, so a run can be repeated, and
    different each repeat, so that no contender always follows the same one (a writer that
    always ran right after the plain file was measured markedly slower than alone)."""
    return random.Random(turn).sample(list(items), len(items))


def round_robin(
    contenders: Sequence[Contender[In]],
    repeat: int,
    run_once: Callable[[Contender[In]], Result],
    shuffle: bool = True,
    digits: str = ".2f",
) -> list[Result]:
    """Every contender once per repeat (each repeat in its own seeded order when ``shuffle``),
    so drift hits every contender alike; then each one's median run."""
    runs: dict[str, list[Result]] = {c.key: [] for c in contenders}
    for turn in range(repeat):
        order = shuffled(contenders, turn) if shuffle else list(contenders)
        for contender in order:
            result = run_once(contender)
            runs[contender.key].append(result)
            total = "-" if result.total_s is None else format(result.total_s, digits)
            print(f"  [{turn + 1}/{repeat}] {contender.label:<32} {total} s", flush=True)
    results = [median_result(runs[c.key]) for c in contenders]
    for result in results:
        if result.error:
            print(f"ERROR in {result.contender}:\n{result.error}", file=sys.stderr)
    return results


def importable(
    contenders: Sequence[Contender[In]],
) -> tuple[list[Contender[In]], dict[str, str]]:
    """Import every contender's package before any timing; drop those not installed."""
    ready, missing = [], {}
    for contender in contenders:
        try:
            contender.prepare()
            ready.append(contender)
        except ModuleNotFoundError as exc:
            missing[contender.label] = f"skipped: {exc}"
    return ready, missing


def warm_up(samples: Sequence[Sample], workload: Workload, workdir: Path) -> None:
    """An untimed plain-file write of ``samples``: warms the page cache and the disk path."""
    plain: Contender[Sequence[Sample]] = Contender(
        "plain", "plain file (warm-up)", lambda out, job: write_plain_file(out, job, workload)
    )
    result = Result(plain.label, workload.name, len(samples), workload.payload_bytes)
    measure(plain, samples, result, workdir, f"warmup-{workload.name}-", fsync_run_dir=True)
