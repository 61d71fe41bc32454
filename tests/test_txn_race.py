"""Processes racing in lockstep: same txn_id, raw put-if-absent, plain appends.

The S3 races run against ministack only: moto checks and writes a conditional put without a
lock, so under preemption it rarely lets two creates of one key win (it has failed both the
raw put race and the commit race here), which no client can prevent; ministack is strict.
Each child is a ``tests.workers serve`` process; the parent hands every child its request
at the same moment, round after round, so the requests really overlap (a barrier, not a
sleep).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import txstore
from txstore.storage import MemoryStorage, open_storage
from txstore.txn import manifest_key

from .conftest import Backend, S3Server
from .faults import FaultyStorage
from .invariants import Ack, History, txn_samples, violations
from .workers import REPO


class Racers:
    """``n`` serve processes driven in lockstep; killed by a watchdog if they hang."""

    def __init__(self, backend: Backend, n: int, variant: str = "", timeout: float = 300) -> None:
        options = json.dumps(backend.storage_options or {})
        argv = [sys.executable, "-m", "tests.workers", "serve", backend.uri, options, variant]
        self.procs = [
            subprocess.Popen(
                argv,
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]
        self.watchdog = threading.Timer(timeout, self.kill)
        self.watchdog.start()
        assert [self._answer(p) for p in self.procs] == [{"ready": True}] * n

    def _answer(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"a racer died (exit code {proc.wait()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def round(self, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send each child its command at once, then collect every answer."""
        for proc, cmd in zip(self.procs, commands, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(cmd) + "\n")
            proc.stdin.flush()
        return [self._answer(p) for p in self.procs]

    def kill(self) -> None:
        for proc in self.procs:
            proc.kill()

    def close(self) -> None:
        self.watchdog.cancel()
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)


@contextlib.contextmanager
def racing(backend: Backend, n: int, variant: str = "") -> Iterator[Racers]:
    racers = Racers(backend, n, variant)
    try:
        yield racers
    finally:
        racers.close()


@pytest.fixture(params=["local", "ministack"])
def race_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        return Backend("local", str(tmp_path / "store"))
    server: S3Server = request.getfixturevalue("ministack_server")
    return Backend("s3", f"s3://{server.new_bucket()}/store", server.options)


def test_same_txn_id_from_several_processes_lands_once(
    race_backend: Backend, rounds: int = 8
) -> None:
    """Each round, three processes append under one txn_id while a fourth appends plainly."""
    store = txstore.create(race_backend.uri, **race_backend.kwargs())
    acks: list[Ack] = []
    with racing(race_backend, 4) as racers:
        for r in range(rounds):
            same = {"op": "append", "tag": f"same-{r}", "n": 3, "txn": True}
            plain = {"op": "append", "tag": f"plain-{r}", "n": 2, "txn": False, "w": 3}
            answers = racers.round([dict(same, w=w) for w in range(3)] + [plain])
            assert not [a for a in answers if "error" in a], answers
            # All three were told the same commit: the one that landed.
            assert len({(a["version"], a["commit_id"]) for a in answers[:3]}) == 1, answers
            acks += [Ack(f"same-{r}", a["version"]) for a in answers[:3]]
            acks.append(Ack(f"plain-{r}", answers[3]["version"]))
    history, found = violations(store, acks)
    assert found == []
    assert history.latest == 2 * rounds  # one version per txn id, one per plain append
    assert Counter(t for t in history.tags if t) == {a.tag: 1 for a in acks}


def put_race(backend: Backend, rounds: int, racers_n: int = 4) -> None:
    """Rounds of ``racers_n`` processes creating one key at once: one winner, its bytes kept."""
    storage = open_storage(backend.uri, backend.storage_options)
    with racing(backend, racers_n) as racers:
        for r in range(rounds):
            key = f"versions/index.v{r}.json"
            answers = racers.round(
                [{"op": "put", "key": key, "data": f"writer {w}"} for w in range(racers_n)]
            )
            winners = [w for w, a in enumerate(answers) if a["won"]]
            assert len(winners) == 1, f"round {r}: winners {winners}"
            assert storage.read(key) == f"writer {winners[0]}".encode()


def test_racing_put_if_absent_has_one_winner_across_processes(ministack_server: S3Server) -> None:
    server = ministack_server
    put_race(Backend("s3", f"s3://{server.new_bucket()}/raw", server.options), 30)


def lockstep_appends(
    backend: Backend, writers: int, rounds: int, variant: str = ""
) -> tuple[History, list[Ack], list[str]]:
    """Rounds of ``writers`` appends started together (half with txn ids); what went wrong
    (a writer's error included: a broken variant may fail loudly as well as silently)."""
    store = txstore.create(backend.uri, **backend.kwargs())
    acks: list[Ack] = []
    errors: list[str] = []
    with racing(backend, writers, variant) as racers:
        for r in range(rounds):
            tags = [f"w{w}-{r}" for w in range(writers)]
            answers = racers.round(
                [{"op": "append", "tag": t, "n": 2, "txn": w % 2 == 0} for w, t in enumerate(tags)]
            )
            for tag, answer in zip(tags, answers, strict=True):
                if "error" in answer:
                    errors.append(f"{tag}: {answer['error']}")
                else:
                    acks.append(Ack(tag, answer["version"]))
    history, found = violations(store, acks)
    return history, acks, errors + found


def test_lockstep_racing_appends_land_exactly_once(ministack_server: S3Server) -> None:
    """4 processes x 8 appends, each round started together: every one lands once."""
    server = ministack_server
    backend = Backend("s3", f"s3://{server.new_bucket()}/store", server.options)
    writers, rounds = 4, 8  # each round is a 4-way race for one version, then for the next
    history, acks, found = lockstep_appends(backend, writers, rounds)
    assert found == []
    assert history.latest == writers * rounds
    assert sorted(a.version for a in acks) == list(range(1, writers * rounds + 1))


def test_txn_id_lookup_stays_cheap_as_history_grows() -> None:
    """A repeated txn id is found from its marker and the latest manifest: no walk, no list."""
    storage = MemoryStorage()
    store = txstore.create(storage)
    for i in range(1000):
        store.append(txn_samples(f"t{i}", 1), txn_id=f"t{i}")
    spy = FaultyStorage(storage)
    again = txstore.Store(spy).append(txn_samples("t17", 1), txn_id="t17")
    assert again.version == 18 and txstore.Store(storage).version == 1000
    ops = [op for op, _ in spy.calls]
    manifests = {key for op, key in spy.calls if op == "read" and key.startswith("versions/")}
    assert "list" not in ops and "write" not in ops and "put_if_absent" not in ops
    # 1001: the probe past the end (read together with HEAD; it is missing).
    assert manifests <= {manifest_key(18), manifest_key(1000), manifest_key(1001)}, manifests
    assert len(ops) < 15, spy.calls
