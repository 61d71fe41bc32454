"""Soak: writer processes SIGKILLed at random and restarted while reader processes read.

Afterwards every invariant of tests/invariants.py must hold: versions contiguous, each a whole
transaction; every acknowledged append at the version it reported; no transaction twice; if A
returned before B started then v(A) < v(B); a read that began after A returned sees A; no
reader goes backwards or fails. A restarted writer first retries the transaction its killed
predecessor had in flight, under the same txn_id, as a preemptible job would.

``test_soak_short`` runs in CI for a few seconds per backend; ``test_soak_with_random_sigkills``
is ``slow``, time-boxed by ``--soak-seconds`` per backend: run it by hand with e.g.
``pytest tests/test_soak.py -m slow --soak-seconds 900 -s`` (``--soak-seed`` replays a kill
schedule).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

import txstore

from .conftest import Backend
from .invariants import Ack, Read, violations
from .workers import REPO

WRITERS, READERS = 3, 2


@dataclass(frozen=True)
class Pace:
    """Seconds: at most between two appends, two reads; the range a kill interval is drawn from.

    An append through moto takes ~0.1 s and a process ~0.5 s to start, so S3 is killed less
    often: most kills should land inside appends, not in start-ups.
    """

    writer_pause: float
    reader_pause: float
    kill_every: tuple[float, float]


PACE = {"local": Pace(0.01, 0.02, (0.1, 1.0)), "s3": Pace(0.01, 0.1, (0.3, 2.5))}


@dataclass
class Role:
    """One writer or reader slot; a writer slot gets a new process (incarnation) per kill."""

    name: str
    backend: Backend
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)

    def start(self, command: str, args: dict[str, Any]) -> None:
        out = self.logs / f"{self.name}.{len(self.procs)}.jsonl"
        options = json.dumps(self.backend.storage_options or {})
        argv = [sys.executable, "-m", "tests.workers", command, self.backend.uri, options]
        with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
            proc = subprocess.Popen(
                [*argv, json.dumps(args)],
                cwd=REPO,
                stdout=stdout,
                stderr=stderr,
            )
        self.procs.append(proc)
        self.outputs.append(out)

    @property
    def current(self) -> subprocess.Popen[bytes]:
        return self.procs[-1]

    def events(self, incarnation: int | None = None) -> list[dict[str, Any]]:
        paths = self.outputs if incarnation is None else [self.outputs[incarnation]]
        return [json.loads(line) for p in paths for line in p.read_text().splitlines()]


def pending_after(role: Role, inherited: list[Any] | None) -> list[Any] | None:
    """The [tag, n] the last incarnation started (or inherited) and did not see acknowledged."""
    pending = inherited
    for event in role.events(len(role.procs) - 1):
        if event["ev"] == "start":
            pending = [event["tag"], event["n"]]
        elif event["ev"] == "ack" and pending is not None and event["tag"] == pending[0]:
            pending = None
    return pending


@dataclass
class SoakResult:
    seed: int
    kills: int = 0
    versions: int = 0
    acks: list[Ack] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    writer_errors: int = 0
    settled_after_kill: int = 0  # in flight at a kill, acknowledged by the restarted writer
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"soak seed={self.seed}: kills={self.kills} versions={self.versions} "
            f"acknowledged={len(self.acks)} settled_after_kill={self.settled_after_kill} "
            f"reads={len(self.reads)} writer_errors={self.writer_errors} "
            f"violations={len(self.violations)}"
        )


class Soak:
    def __init__(self, backend: Backend, logs: Path, seconds: float, seed: int) -> None:
        self.backend = backend
        self.pace = PACE[backend.name]
        self.rng = random.Random(seed)
        self.result = SoakResult(seed)
        self.deadline = time.monotonic_ns() + int(seconds * 1e9)
        self.writers = [Role(f"w{i}", backend, logs) for i in range(WRITERS)]
        self.readers = [Role(f"r{i}", backend, logs) for i in range(READERS)]

    def start_writer(self, role: Role, pending: list[Any] | None) -> None:
        writer, incarnation = int(role.name[1:]), len(role.procs)
        args = {"writer": writer, "incarnation": incarnation, "deadline": self.deadline}
        args.update(seed=self.rng.randrange(2**32), pause=self.pace.writer_pause, pending=pending)
        role.start("soak-writer", args)

    def kill_and_restart(self, role: Role, inherited: list[Any] | None) -> list[Any] | None:
        if role.current.poll() is not None:
            return inherited  # it finished: nothing to kill (the deadline has passed)
        if not role.events(len(role.procs) - 1):
            return inherited  # still starting up (seconds on S3): a kill there tests nothing
        os.kill(role.current.pid, signal.SIGKILL)
        role.current.wait()
        self.result.kills += 1
        pending = pending_after(role, inherited)
        self.start_writer(role, pending)
        return pending

    def run(self) -> SoakResult:
        for role in self.writers:
            self.start_writer(role, None)
        reader_deadline = self.deadline + 1_000_000_000  # read on after the last appends
        for i, role in enumerate(self.readers):
            args = {"deadline": reader_deadline, "seed": self.rng.randrange(2**32)}
            role.start("soak-reader", dict(args, pause=self.pace.reader_pause, reader=i))
        inherited: dict[str, list[Any] | None] = {r.name: None for r in self.writers}
        while time.monotonic_ns() < self.deadline:
            time.sleep(self.rng.uniform(*self.pace.kill_every))
            role = self.rng.choice(self.writers)
            inherited[role.name] = self.kill_and_restart(role, inherited[role.name])
        for role in self.writers + self.readers:
            code = role.current.wait(timeout=300)  # bounded: a hung process fails the test
            if code != 0:
                err = role.outputs[-1].with_suffix(".err").read_text()[-2000:]
                self.result.violations.append(f"{role.name} exited with {code}: {err}")
        return self.collect()

    def collect(self) -> SoakResult:
        started: dict[str, int] = {}
        for role in self.writers:
            for incarnation in range(len(role.procs)):
                for e in role.events(incarnation):
                    if e["ev"] == "start":
                        started.setdefault(e["tag"], e["t"])
                    elif e["ev"] == "error":
                        self.result.writer_errors += 1
                    elif e["ev"] == "ack":
                        ack = Ack(e["tag"], e["version"], started[e["tag"]], e["t"])
                        self.result.acks.append(ack)
                        begun_in = e["tag"].split(".")[1]
                        self.result.settled_after_kill += begun_in != str(incarnation)
        self.result.reads = [
            Read(role.name, e["v"], e["t0"], e.get("t1", e["t0"]), e.get("error"))
            for role in self.readers
            for e in role.events()
        ]
        unsettled = set(started) - {a.tag for a in self.result.acks}
        if unsettled:
            self.result.violations.append(f"started, never acknowledged: {sorted(unsettled)}")
        store = txstore.open(self.backend.uri, **self.backend.kwargs())
        history, found = violations(store, self.result.acks, self.result.reads)
        self.result.versions = history.latest
        self.result.violations += found
        return self.result


SHORT_SECONDS = 6.0  # enough for a few kills inside appends on each backend


#: How many times longer a soak runs again, on a fresh store, when a run on a loaded machine
#: ended before its processes did anything (S3 writers can take seconds just to start).
LONGER_RUNS = (1, 4)


def _soak(backend: Backend, tmp_path: Path, seconds: float, seed: int | None) -> None:
    seed = seed if seed is not None else random.randrange(2**32)
    for attempt, factor in enumerate(LONGER_RUNS):
        run = replace(backend, uri=f"{backend.uri}-{attempt}")
        print(f"soak on {run.name}: seed={seed} seconds={seconds * factor}")
        txstore.create(run.uri, **run.kwargs())
        logs = tmp_path / f"logs-{attempt}"
        logs.mkdir()
        result = Soak(run, logs, seconds * factor, seed).run()
        print(result.summary())
        # Every run, however short, must keep every promise.
        assert result.violations == [], f"{result.summary()}: {result.violations[:20]}"
        assert result.versions == len({a.tag for a in result.acks})
        if result.kills > 0 and result.acks and result.reads:
            return
    # No run did what it is for: writers killed, appends acknowledged and read.
    raise AssertionError(f"the soak exercised nothing: {result.summary()}")


@pytest.mark.s3
def test_soak_short(
    shared_backend: Backend, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    _soak(shared_backend, tmp_path, SHORT_SECONDS, request.config.getoption("--soak-seed"))


@pytest.mark.slow
@pytest.mark.s3
def test_soak_with_random_sigkills(
    shared_backend: Backend, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    seconds: float = request.config.getoption("--soak-seconds")
    _soak(shared_backend, tmp_path, seconds, request.config.getoption("--soak-seed"))
