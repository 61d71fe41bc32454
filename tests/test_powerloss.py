"""Power loss on local disk, on LazyFS: a file system that drops unsynced writes on command.

Each operation (appends, compaction, ``add_fields``, rollback, vacuum) runs in a child process
on a LazyFS mount (tests/powerloss_child.py). The child counts its *steps*, every fsync,
link, rename, replace and unlink, and SIGKILLs itself just before or just after the K-th; the
test then cuts the power (``lazyfs::clear-cache``: every write not fsynced is lost) and checks
the real folder under the mount: the store opens, every append acknowledged before the cut is
there with its samples, the latest version is the operation's whole outcome or none of it, a
deep verify finds no problem (orphans are fine) and the store takes a further append. One
sweep does this for every K, before and after; a second kind of case makes LazyFS itself
crash at the commit point's fsync and link.

What it cannot see: LazyFS sends create, link, rename and unlink straight to the real file
system, so a name is durable at once and a missing fsync of a folder goes unnoticed. It
catches missing or misplaced fsyncs of files and data published before it is durable.

``--powerloss-samples N`` (default 6) makes every append N samples: with a few hundred, an
append writes many chunks and blocks, and the two appends make about a hundred steps (by hand).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import txstore
from txstore.errors import TxstoreError

from .lazyfs import REPO, LazyFS, unavailable
from .powerloss_child import CONFIG, OPS, ROLLBACK_TO, batch, extra, pad

Key = tuple[str, int]


@pytest.fixture
def lazyfs(tmp_path: Path) -> Iterator[LazyFS]:
    """LazyFS mounted over a temporary folder; unmounted at the end, whatever happened."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    fs = LazyFS(tmp_path / "lazyfs")
    fs.mount()
    try:
        yield fs
    finally:
        fs.unmount()


@pytest.fixture
def samples(request: pytest.FixtureRequest) -> int:
    n: int = request.config.getoption("--powerloss-samples")
    return n


@dataclass
class Base:
    """The store an operation starts from, made on the real folder (durable already)."""

    acks: list[tuple[str, int]]  # (tag, version) of each acknowledged append
    keys: list[Key]  # the latest version's samples
    target: list[Key] = field(default_factory=list)  # the rollback's target's samples


CASE_TIMEOUT = 120
BASE_APPENDS = {"append": 2, "compact": 6, "add_fields": 3, "rollback": 3, "vacuum": 4}


def keys(snap: txstore.Snapshot) -> list[Key]:
    return [(s["tag"], s["i"]) for s in snap]


def make_base(root: Path, op: str, samples: int) -> Base:
    store = txstore.create(str(root), **CONFIG)
    acks = []
    for k in range(BASE_APPENDS[op]):
        tag = f"b{k}"
        acks.append((tag, store.append(batch(tag, samples), txn_id=tag).version))
    if op == "vacuum":  # old chunks and segments for vacuum to delete
        assert store.compact().commit is not None
        store.expire(keep_last=1)
    base = Base(acks, keys(store.snapshot()))
    if op == "rollback":
        base.target = keys(store.snapshot(ROLLBACK_TO))
    store.close()
    return base


class FileSystemStuck(Exception):
    """LazyFS stopped answering: a thread of the case waits in the kernel for its answer.

    LazyFS can deadlock on its own locks (seen once in a few hundred cases: a write waiting
    for a file's lock with the cache's lock held, while an fsync and a create wait for the
    cache's lock, and no thread holds the file's lock). Every FUSE request gets an answer
    unless the daemon is stuck, so this is the harness failing, not the store."""


class Children:
    """Runs each case in a child process forked from a server that has imported txstore."""

    def __init__(self, timeout: float = CASE_TIMEOUT) -> None:
        self.timeout = timeout  # for a case's answer
        self.proc = self._start()

    @staticmethod
    def _start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.powerloss_child"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its group holds the cases too: one kill ends them all
        )

    def run(
        self, op: str, root: Path, cut: str, samples: int, variant: str
    ) -> tuple[list[dict[str, Any]], int]:
        """The case's JSON lines, and its exit code (-9: it killed itself at the cut)."""
        if self.proc.poll() is not None:  # killed after a case that did not answer
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([op, str(root), cut, variant, samples]) + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], self.timeout)[0]:
            stuck = self.waiting_for_fuse()
            self.kill()
            if stuck:
                raise FileSystemStuck(f"{op} {cut}: {stuck} wait for LazyFS's answer")
            raise AssertionError(f"{op} {cut}: no answer after {self.timeout} s")
        answer = self.proc.stdout.readline()  # the whole line: it is written at once
        if not answer:
            raise AssertionError(f"the case server died ({self.proc.wait()})")
        done = json.loads(answer)
        return [json.loads(line) for line in done["out"].splitlines()], done["code"]

    def waiting_for_fuse(self) -> str:
        """The threads of the running case blocked in the kernel on a FUSE request (its
        wait channel), named; "" if none (or this kernel does not say)."""
        found = []
        server = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
        with contextlib.suppress(OSError):
            for case in Path(server).read_text().split():
                for task in Path(f"/proc/{case}/task").iterdir():
                    with contextlib.suppress(OSError):
                        if (task / "wchan").read_text().strip() == "request_wait_answer":
                            found.append(f"thread {task.name} of case {case}")
        return ", ".join(found)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


@pytest.fixture(scope="module")
def children() -> Iterator[Children]:
    server = Children()
    try:
        yield server
    finally:
        server.close()


def outcomes(op: str, base: Base, records: list[dict[str, Any]], samples: int) -> list[list[Key]]:
    """The latest versions the cut may leave: before the operation, or its whole outcome."""
    done = any("done" in r for r in records)
    acked = {r["ack"] for r in records if "ack" in r}
    if op == "append":
        a0 = [("a0", i) for i in range(samples)]
        a1 = [("a1", i) for i in range(samples)]
        allowed = [base.keys, base.keys + a0, base.keys + a0 + a1]
        return [o for o in allowed if all((tag, 0) in o for tag in acked)]
    if op == "rollback":
        return [base.target] if done else [base.keys, base.target]
    return [base.keys]  # compaction, add_fields and vacuum keep the samples as they are


def check(
    root: Path, op: str, base: Base, records: list[dict[str, Any]], samples: int
) -> list[str]:
    """What is wrong with the store on the real folder after a power cut."""
    try:
        store = txstore.open(str(root))
        latest = list(store.snapshot())
    except TxstoreError as e:
        return [f"the store does not open and read: {e!r}"]
    problems = []
    expired = store.expired_versions()
    acks = base.acks + [(r["ack"], r["version"]) for r in records if "ack" in r]
    for tag, version in acks:
        if version in expired:  # gone by design (vacuum's base); its samples are in `latest`
            continue
        try:
            got = [s for s in store.snapshot(version) if s["tag"] == tag]
        except TxstoreError as e:
            problems.append(f"acknowledged append {tag} (version {version}): {e!r}")
            continue
        if [(s["i"], s["pad"]) for s in got] != [(s["i"], s["pad"]) for s in batch(tag, samples)]:
            problems.append(f"acknowledged append {tag} (version {version}) lost samples")
    allowed = outcomes(op, base, records, samples)
    if keys(store.snapshot()) not in allowed:
        problems.append(f"the latest version holds {keys(store.snapshot())}, not one of {allowed}")
    if any(s["pad"] != pad(s["tag"], s["i"]) for s in latest):
        problems.append("the latest version has samples with other values")
    if op == "add_fields":
        values = [s.get("extra") for s in latest]
        whole = [extra(s)["extra"] for s in latest]
        done = any("done" in r for r in records)
        if values != whole and (done or values != [None] * len(latest)):
            problems.append(f"add_fields left the field half there: {values}")
    report = store.verify(deep=True)
    problems += [f"verify: {p}" for p in report.problems]
    try:
        store.append(batch("next", 2))
    except TxstoreError as e:
        problems.append(f"the next append fails: {e!r}")
    store.close()
    return problems


def cut_case(
    fs: LazyFS, children: Children, op: str, cut: str, samples: int, variant: str = "good"
) -> tuple[list[str], list[dict[str, Any]]]:
    """Run ``op`` to the cut, cut the power, check the real folder: (problems, child's lines)."""
    name = f"{op}-{variant}-{cut.replace(':', '-')}"
    base = make_base(fs.root / name, op, samples)
    try:
        lines, code = children.run(op, fs.mnt / name, cut, samples, variant)
    except FileSystemStuck as stuck:
        # Once, on a fresh mount and a fresh copy of the base: said, not hidden.
        warnings.warn(f"{stuck}; the case runs again on a fresh LazyFS", stacklevel=1)
        fs.abandon()
        fs.mount()
        name += "-again"
        base = make_base(fs.root / name, op, samples)
        lines, code = children.run(op, fs.mnt / name, cut, samples, variant)
    killed = code == -9
    if not killed and code != 0:
        raise AssertionError(f"{name}: the child failed ({code}): {lines}")
    if cut != "count" and not killed:
        raise AssertionError(f"{name}: the child finished before its cut")
    fs.clear_cache()
    return check(fs.root / name, op, base, lines, samples), lines


def sweep(
    fs: LazyFS,
    children: Children,
    op: str,
    samples: int,
    variant: str = "good",
    *,
    until_caught: bool = False,
) -> dict[str, list[str]]:
    """Cut the power after the whole operation, then before and after each of its steps
    (up to the first cut that finds a problem, with ``until_caught``).

    Returns the problems found at each cut (named ``step K before|after: call path``)."""
    found: dict[str, list[str]] = {}
    problems, lines = cut_case(fs, children, op, "count", samples, variant)
    found["after the operation returned"] = problems
    steps = next(r["steps"] for r in lines if "steps" in r)
    assert steps, f"{op} made no step"
    for k, step in enumerate(steps, start=1):
        for timing in ("before", "after"):
            problems = cut_case(fs, children, op, f"{timing}:{k}", samples, variant)[0]
            found[f"step {k} {timing}: {step}"] = problems
            if problems and until_caught:
                return found
    return found


@pytest.mark.parametrize("op", list(OPS))
def test_power_cut_at_every_step(lazyfs: LazyFS, children: Children, samples: int, op: str) -> None:
    found = sweep(lazyfs, children, op, samples)
    bad = {cut: problems for cut, problems in found.items() if problems}
    assert not bad, f"{op}: {len(bad)} of {len(found)} power cuts broke the store: {bad}"


@pytest.mark.parametrize("timing", ["before", "after"])
@pytest.mark.parametrize("call", ["fsync", "link"])
def test_lazyfs_crash_at_the_commit_point(
    lazyfs: LazyFS, children: Children, samples: int, timing: str, call: str
) -> None:
    """LazyFS kills itself at the second append's manifest (its fsync or its link): the cut
    happens inside the file system, and the writer sees the mount go away."""
    base = make_base(lazyfs.root / "store", "append", samples)
    manifest = rf"index\.v{len(base.acks) + 2}\.json"
    if call == "fsync":  # of the temp file that becomes the manifest
        lazyfs.crash_at(timing, "fsync", from_rgx=rf".*\.tmp\..*\.{manifest}")
    else:  # (LazyFS matches a link's target only when given a source pattern too)
        lazyfs.crash_at(timing, "link", from_rgx=f".*{manifest}", to_rgx=f"/{manifest}")
    lines, _ = children.run("append", lazyfs.mnt / "store", "count", samples, "good")
    assert lazyfs.crashed(), f"LazyFS did not crash: {lines}"
    assert [r["ack"] for r in lines if "ack" in r] == ["a0"], lines
    lazyfs.unmount()
    # The manifest was fsynced before its link, and a link is durable at once (LazyFS).
    committed = (call, timing) == ("link", "after")
    with txstore.open(str(lazyfs.root / "store")) as store:
        assert (("a1", 0) in keys(store.snapshot())) == committed
    assert check(lazyfs.root / "store", "append", base, lines, samples) == []


def test_a_case_whose_lazyfs_stops_answering_runs_again_on_a_fresh_mount(
    lazyfs: LazyFS, samples: int
) -> None:
    """LazyFS stopped (as when it deadlocks): the case's first access waits for its answer,
    the case is killed and runs again, once, on a fresh mount; it is said in a warning."""
    children = Children(timeout=5)
    try:
        assert lazyfs.proc is not None
        os.kill(lazyfs.proc.pid, signal.SIGSTOP)
        with pytest.warns(UserWarning, match="wait for LazyFS's answer.*runs again"):
            problems, lines = cut_case(lazyfs, children, "append", "count", samples)
        assert [r["ack"] for r in lines if "ack" in r] == ["a0", "a1"]
        assert problems == []
    finally:
        children.close()


def test_a_case_that_hangs_by_itself_is_not_run_again(lazyfs: LazyFS, samples: int) -> None:
    """A case that does not answer but waits for no file system (stopped here) fails."""
    children = Children(timeout=3)
    make_base(lazyfs.root / "store", "append", 20 * samples)
    stopped: list[int] = []

    def stop_the_case() -> None:
        listing = Path(f"/proc/{children.proc.pid}/task/{children.proc.pid}/children")
        deadline = time.monotonic() + 10
        while not stopped and time.monotonic() < deadline:
            for pid in listing.read_text().split():
                os.kill(int(pid), signal.SIGSTOP)
                stopped.append(int(pid))

    stopper = threading.Thread(target=stop_the_case)
    try:
        stopper.start()
        with pytest.raises(AssertionError, match="no answer after 3 s"):
            children.run("append", lazyfs.mnt / "store", "count", 20 * samples, "good")
        assert stopped, "the case ended before it could be stopped"
    finally:
        stopper.join()
        children.close()


# -- the check has teeth: broken backends are caught -----------------------------------------


def test_power_cut_catches_files_published_unsynced(
    lazyfs: LazyFS, children: Children, samples: int
) -> None:
    """A backend that never fsyncs a file before linking it: after a cut, acknowledged
    appends are gone (their manifests and chunks are empty files)."""
    problems, lines = cut_case(lazyfs, children, "append", "count", samples, "unsynced")
    assert [r["ack"] for r in lines if "ack" in r] == ["a0", "a1"]
    assert problems, "a power cut after unsynced appends went unnoticed"


def test_power_cut_between_publish_and_fsync_is_caught(
    lazyfs: LazyFS, children: Children, samples: int
) -> None:
    """A backend that fsyncs each file only after publishing it is durable once the call
    returns, so only cuts between the link or replace and the fsync can catch it: the sweep
    must find those."""
    found = sweep(lazyfs, children, "append", samples, "late-sync", until_caught=True)
    assert not found["after the operation returned"]
    caught = [cut for cut, problems in found.items() if problems]
    assert caught, "no power cut caught a file published before it was durable"
    # The first catch: the manifest is linked (so the commit is visible) but still empty.
    assert caught[0].endswith(": link versions/index.v3.json"), caught
