"""The one home of the tests' child processes: ``python -m tests.workers COMMAND ...``.

Parents start them with ``spawn`` (or ``run``, which waits and parses the JSON lines). Every
child appends ``invariants.txn_samples``, so ``invariants.read_history`` checks what they left.

- ``append-many URI OPTIONS WRITER COUNT``: COUNT appends of 3 samples, tags ``w<WRITER>-<i>``,
  one ``{"tag", "version"}`` line each (test_concurrency.py, test_torch.py).
- ``append-with-fault URI OPTIONS TAG FAIL_AT MODE``: one append through ``FaultyStorage``
  (test_crash.py: a ``kill_*`` mode SIGKILLs the process itself at that storage call).
- ``append-loop URI OPTIONS NAME COUNT``: appends of 4 samples with random padding, reporting
  conflicts instead of failing (test_ops_concurrency.py).
- ``serve URI OPTIONS [blind-put]``: reads one JSON command per line on stdin, answers one
  JSON line on stdout. A parent drives several of these in lockstep, so their requests start
  together (test_txn_race.py); ``blind-put`` is a deliberately broken backend (test_teeth.py).
- ``soak-writer`` / ``soak-reader``: the roles of test_soak.py, logging JSON events to stdout
  (a file the parent reads after the process exits or is SIGKILLed).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import txstore
from txstore.errors import AlreadyExistsError
from txstore.storage import Storage, open_storage

from .invariants import txn_samples

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``txstore ARGS`` through the real entry point, in an interpreter of its own (stdin
    empty and not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "txstore.cli", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``code`` (dedented) run by a fresh interpreter from the repository's root."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spawn(*args: str, **popen: Any) -> subprocess.Popen[str]:
    """Start ``python -m tests.workers ARGS`` from the repository root (text pipes by default)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.workers", *args], cwd=REPO, text=True, **popen
    )


def run(*args: str, timeout: float = 180) -> list[dict[str, Any]]:
    """Run a worker to its end (a SIGKILL of itself included); its JSON lines, parsed."""
    proc = spawn(*args)
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode not in (0, -9):
        raise AssertionError(f"worker failed ({proc.returncode}): {err[-3000:]}")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def emit(record: dict[str, Any]) -> None:
    # One short write per line: a SIGKILL leaves whole lines behind, never half a record.
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def append_many(uri: str, options: dict[str, Any], writer: int, count: int) -> None:
    store = txstore.open(uri, storage_options=options or None)
    for i in range(count):
        tag = f"w{writer}-{i}"
        commit = store.append(txn_samples(tag, 3), message=tag)
        emit({"tag": tag, "version": commit.version})


def append_with_fault(uri: str, options: dict[str, Any], tag: str, fail_at: int, mode: str) -> None:
    from .faults import FaultyStorage

    storage = FaultyStorage(open_storage(uri, options or None), fail_at=fail_at, mode=mode)
    store = txstore.open(storage)
    try:
        commit = store.append(txn_samples(tag, 5), txn_id=tag)
    except txstore.TxstoreError as e:
        emit({"error": type(e).__name__, "calls": len(storage.calls)})
        return
    emit({"version": commit.version, "calls": len(storage.calls)})


def append_loop(uri: str, options: dict[str, Any], name: str, count: int) -> None:
    """Append ``count`` small batches, one JSON line per outcome (committed or conflict)."""
    store = txstore.open(uri, storage_options=options or None)
    emit({"started": True})
    for i in range(count):
        tag = f"{name}-{i}"
        samples = [dict(s, pad=os.urandom(200)) for s in txn_samples(tag, 4)]
        try:
            commit = store.append(samples, message=tag)
        except txstore.ConflictError as e:
            emit({"tag": tag, "conflict": str(e)})
            continue
        emit({"tag": tag, "version": commit.version})


def _serve_one(store: txstore.Store, storage: Storage, cmd: dict[str, Any]) -> dict[str, Any]:
    if cmd["op"] == "put":
        try:
            storage.put_if_absent(cmd["key"], cmd["data"].encode())
            return {"won": True}
        except AlreadyExistsError:
            return {"won": False}
    samples = [dict(s, w=cmd.get("w")) for s in txn_samples(cmd["tag"], cmd["n"])]
    try:
        commit = store.append(samples, txn_id=cmd["tag"] if cmd.get("txn") else None)
    except txstore.TxstoreError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {"version": commit.version, "commit_id": commit.commit_id}


def serve(uri: str, options: dict[str, Any], variant: str = "") -> None:
    storage = open_storage(uri, options or None)
    if variant == "blind-put":  # a deliberately broken backend, for test_teeth.py
        from .broken import BlindPut

        storage = BlindPut(storage)
    store = txstore.Store(storage)
    emit({"ready": True})
    for line in sys.stdin:
        emit(_serve_one(store, storage, json.loads(line)))


def soak_writer(uri: str, options: dict[str, Any], args: dict[str, Any]) -> None:
    """Append until the deadline; first settle the transaction a killed predecessor left.

    Every transaction uses its tag as txn_id, as a preemptible job retried from the top
    would: the retry of an append that landed before the kill must return its version.
    """
    rng = random.Random(args["seed"])
    store = txstore.open(uri, storage_options=options or None)
    emit({"ev": "up"})  # the parent kills only writers past start-up: kills land in appends
    pending = args.get("pending")  # [tag, n] started by the killed incarnation, not acked
    i = errors = 0
    while pending is not None or time.monotonic_ns() < args["deadline"]:
        if pending is None:
            pending = [f"w{args['writer']}.{args['incarnation']}.{i}", rng.randint(1, 4)]
            i += 1
            emit({"ev": "start", "tag": pending[0], "n": pending[1], "t": time.monotonic_ns()})
        tag, n = pending
        try:
            commit = store.append(txn_samples(tag, n), txn_id=tag)
        except txstore.TxstoreError as e:  # not a violation by itself; retried, counted
            emit({"ev": "error", "tag": tag, "error": f"{type(e).__name__}: {e}"})
            errors += 1
            if errors > 20:
                raise SystemExit(f"giving up on {tag}: {e}") from e
            time.sleep(0.05)
            continue
        errors = 0
        emit({"ev": "ack", "tag": tag, "version": commit.version, "t": time.monotonic_ns()})
        pending = None
        time.sleep(rng.uniform(0, args["pause"]))


def _read_once(store: txstore.Store, rng: random.Random) -> int:
    """Resolve the latest version and read from it; raise if what it holds is inconsistent."""
    version = store.version
    snap = store.snapshot(version)
    if len(snap) != snap.manifest.num_samples:
        raise AssertionError(f"v{version}: {len(snap)} samples of {snap.manifest.num_samples}")
    if version:
        last = snap[-1]
        if last["tag"] != snap.manifest.txn_id or last["i"] != last["n"] - 1:
            raise AssertionError(f"v{version} ends with {last['tag']}#{last['i']}")
        snap[rng.randrange(len(snap))]  # a random sample decodes and passes its checksum
    return version


def soak_reader(uri: str, options: dict[str, Any], args: dict[str, Any]) -> None:
    rng = random.Random(args["seed"])
    store = txstore.open(uri, storage_options=options or None)
    while time.monotonic_ns() < args["deadline"]:
        if rng.random() < 0.1:  # a fresh Store: no cached manifests or segments
            store = txstore.open(uri, storage_options=options or None)
        start = time.monotonic_ns()
        try:
            version = _read_once(store, rng)
        except Exception as e:  # any failure of a reader is a violation: report, go on
            emit({"ev": "read", "error": f"{type(e).__name__}: {e}", "t0": start, "v": -1})
            continue
        emit({"ev": "read", "v": version, "t0": start, "t1": time.monotonic_ns()})
        time.sleep(rng.uniform(0, args["pause"]))


if __name__ == "__main__":
    command, uri, options_json, *rest = sys.argv[1:]
    options = json.loads(options_json)
    if command == "append-many":
        append_many(uri, options, int(rest[0]), int(rest[1]))
    elif command == "append-with-fault":
        append_with_fault(uri, options, rest[0], int(rest[1]), rest[2])
    elif command == "append-loop":
        append_loop(uri, options, rest[0], int(rest[1]))
    elif command == "serve":
        serve(uri, options, *rest)
    elif command == "soak-writer":
        soak_writer(uri, options, json.loads(rest[0]))
    elif command == "soak-reader":
        soak_reader(uri, options, json.loads(rest[0]))
    else:
        raise SystemExit(f"unknown command {command}")
