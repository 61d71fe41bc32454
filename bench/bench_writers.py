"""Many writers on one S3 store: commits/s from 1 to 8 writer processes, appends and staged.

A moto_server process is the S3 store (``txbench/servers.py``); every run gets a fresh store
under one bucket. Writers are real processes (``multiprocessing``, spawn), started and warmed
up (txstore imported, the store opened, one untimed commit) before a common start time; each
run lasts ``--duration`` seconds (default 10; ``--quick``: 3, and N in 1, 2, 4).

- ``appends``: each of N writers calls ``store.append([sample])`` in a loop. Every commit's
  latency, ``Commit.attempts`` (tries of the commit loop: 1 when nothing raced it) and the S3
  requests it made are recorded. The total commits/s, per writer, p50/p99 latency, mean
  attempts, and the ratio to one writer are reported.
- ``staged``: one coordinator (this process) opens ``store.transaction()`` per round and sends
  its handle (JSON) to the N writers; each writes its sample(s) through
  ``StagedWriter(handle)`` and hands its ``StagedPart`` back as JSON; the coordinator ``add``s
  every part (which reads each chunk back) and commits once. Rounds follow one another: one
  commit per round of N parts. Samples/s and commits/s are reported.
- ``staged-reuse``: as ``staged``, but each writer process keeps the storage of its first
  writer and gives it to every later one (``StagedWriter(handle, storage=...)``).
  ``StagedWriter(handle)`` alone opens a new storage per transaction, which shares the
  process's s3fs client (same options); this shows what the storage object itself costs.

S3 requests are counted in each process at s3fs's one door to the S3 API (its ``_call_s3``,
wrapped here, not in txstore): by operation and by kind of object (manifest, HEAD, chunk,
segment, txn marker). ``--count-http`` also routes every request through the counting proxy of
``txbench/shaper.py`` (no latency, no bandwidth cap) and reports what it saw on the wire.

CPU: the server's, the writers' and the coordinator's CPU seconds over the run, against the
machine's cores: on a 2-core machine, more than 2 busy processes (N writers plus moto) share
the cores, and a rate that stops growing says as much about CPU as about the protocol.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from txbench.output import finish_report, fmt, markdown_table, new_report
from txbench.servers import S3Server, start_moto
from txbench.shaper import Shaper
from txbench.system import default_workdir, machine_info, print_machine

MODES = ("appends", "staged", "staged-reuse")
WRITERS = (1, 2, 4, 8)
QUICK_WRITERS = (1, 2, 4)
DURATION_S = 10.0
QUICK_DURATION_S = 3.0
START_DELAY_S = 0.3  # from "all ready" to the common start: every writer is waiting by then
CHILD_TIMEOUT_S = 120.0
PACKAGES = ("txstore", "s3fs", "aiobotocore", "botocore", "fsspec", "moto", "msgspec")


# --------------------------------------------------------------------------- in the writers


def make_samples(writer: int, seq: int, count: int, size: int) -> list[dict[str, Any]]:
    return [
        {"writer": writer, "seq": seq, "i": i, "payload": os.urandom(size)} for i in range(count)
    ]


def object_kind(key: str, prefix: str) -> str:
    rel = key.removeprefix(prefix + "/") if prefix else key
    if rel.startswith("versions/"):
        return "manifest"
    head, sep, _ = rel.partition("/")
    return head if sep else rel  # HEAD, or a top-level object


class RequestCounter:
    """Counts the S3 API calls one txstore S3Storage makes, as ``<op> <kind>``: every call
    of s3fs goes through ``S3FileSystem._call_s3`` (``call_s3`` is its sync face), wrapped
    here on the instance. Calls, not HTTP attempts: botocore's own retries are not seen."""

    def __init__(self, storage: Any) -> None:
        from fsspec.asyn import sync_wrapper

        self.counts: Counter[str] = Counter()
        fs = storage._fs
        prefix = storage._prefix
        original = fs._call_s3

        async def counted(method: str, *args: Any, **kwargs: Any) -> Any:
            op = {"get_object": "GET", "put_object": "PUT", "head_object": "HEAD"}.get(
                method, method
            )
            if method == "put_object" and "IfNoneMatch" in kwargs:
                op = "PUT-if-absent"
            elif method == "put_object" and "IfMatch" in kwargs:
                op = "PUT-if-match"
            self.counts[f"{op} {object_kind(str(kwargs.get('Key', '')), prefix)}"] += 1
            return await original(method, *args, **kwargs)

        fs._call_s3 = counted
        fs.call_s3 = sync_wrapper(counted, obj=fs)

    def snapshot(self) -> Counter[str]:
        return Counter(self.counts)


def wait_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.05))


def append_writer(spec: dict[str, Any], start: Any, out: Any) -> None:
    """One writer of ``appends``: warm up, wait for the start, append until the end."""
    import txstore
    from txstore.errors import TxstoreError

    i = spec["writer"]
    store = txstore.open(spec["uri"], storage_options=spec["options"])
    counter = RequestCounter(store._ctx.storage)
    store.append(make_samples(i, -1, spec["samples"], spec["sample_bytes"]))  # warm-up
    out.put(("ready", i))
    start.wait(CHILD_TIMEOUT_S)
    t0 = spec["t0_box"].value
    wait_until(t0)
    end = t0 + spec["duration"]
    commits: list[dict[str, Any]] = []
    errors: list[str] = []
    cpu0 = time.process_time()
    seq = 0
    while time.time() < end:
        samples = make_samples(i, seq, spec["samples"], spec["sample_bytes"])
        before = counter.snapshot()
        began = time.time()
        t = time.perf_counter()
        try:
            commit = store.append(samples)
        except TxstoreError as e:
            errors.append(f"{type(e).__name__}: {e}")
            continue
        latency = time.perf_counter() - t
        commits.append(
            {
                "start": began - t0,
                "latency_s": latency,
                "attempts": commit.attempts,
                "version": commit.version,
                "requests": dict(counter.snapshot() - before),
            }
        )
        seq += 1
    out.put(
        (
            "done",
            i,
            {
                "commits": commits,
                "errors": errors,
                "cpu_s": time.process_time() - cpu0,
                "end": time.time() - t0,
            },
        )
    )


def staged_writer(spec: dict[str, Any], inbox: Any, out: Any) -> None:
    """One writer of ``staged``: for every handle it is sent, one part, sent back as JSON."""
    import txstore  # noqa: F401  (imported before "ready", as the appends writers do)
    from txstore.format.staged import TransactionHandle
    from txstore.store.staging import StagedWriter

    i = spec["writer"]
    kept = None  # staged-reuse: the storage of the first writer, given to every later one
    counters: dict[int, RequestCounter] = {}
    out.put(("ready", i))
    cpu0: float | None = None
    seq = 0
    while True:
        message = inbox.get(timeout=CHILD_TIMEOUT_S)
        if message is None:
            break
        measured, handle_json = message
        if measured and cpu0 is None:
            cpu0 = time.process_time()
        t = time.perf_counter()
        writer = StagedWriter(TransactionHandle.from_json(handle_json), storage=kept)
        storage = writer.storage
        if spec["reuse_client"]:
            kept = storage
        # One counter a client: stores opened with the same options share one (s3.py).
        client = id(getattr(storage, "_fs"))  # noqa: B009 (an S3Storage's; Storage has none)
        if client not in counters:
            counters = {client: RequestCounter(storage)}
        counter = counters[client]
        before = counter.snapshot()
        writer.write(make_samples(i, seq, spec["samples"], spec["sample_bytes"]))
        part = writer.finish()
        seq += 1
        requests = dict(counter.snapshot() - before)
        info = {"write_s": time.perf_counter() - t, "requests": requests}
        out.put(("part", i, part.to_json(), info))
    cpu = time.process_time() - cpu0 if cpu0 is not None else 0.0
    out.put(("done", i, {"cpu_s": cpu}))


# --------------------------------------------------------------------------- the runs


def stop_all(procs: Sequence[Any]) -> None:
    """Join each writer process, killing one that has not ended within 30 s."""
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def per_op(counters: Sequence[dict[str, int]], per: int) -> dict[str, float]:
    total: Counter[str] = Counter()
    for c in counters:
        total.update(c)
    return {k: v / per for k, v in sorted(total.items())} if per else {}


def collect(out: Any, n: int, kind: str, procs: Sequence[Any]) -> dict[int, Any]:
    got: dict[int, Any] = {}
    while len(got) < n:
        try:
            message = out.get(timeout=CHILD_TIMEOUT_S)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            raise SystemExit(f"writers did not answer ({kind}); exit codes {dead}") from None
        if message[0] != kind:
            raise SystemExit(f"expected {kind!r} from a writer, got {message[0]!r}")
        got[message[1]] = message[2] if len(message) == 3 else message[2:]
    return got


class Run:
    """What every run shares: the server, the store, CPU accounting, the optional proxy."""

    def __init__(self, server: S3Server, proxy: Shaper | None, mode: str, n: int) -> None:
        import txstore

        self.server, self.proxy = server, proxy
        self.uri = server.uri(f"{mode}-n{n}-{uuid.uuid4().hex[:8]}")
        self.options = server.options(proxy.endpoint if proxy else None)
        txstore.create(self.uri, storage_options=self.options)

    def begin(self) -> None:
        if self.proxy is not None:
            self.proxy.reset()
        self.server_cpu0 = self.server.cpu_s()
        self.proxy_cpu0 = self.proxy.cpu_s() if self.proxy else 0.0
        self.cpu0 = time.process_time()

    def end(self, row: dict[str, Any], window_s: float, writers_cpu_s: float) -> None:
        server_cpu = self.server.cpu_s() - self.server_cpu0
        own_cpu = time.process_time() - self.cpu0
        proxy_cpu = (self.proxy.cpu_s() - self.proxy_cpu0) if self.proxy else 0.0
        cores = os.cpu_count() or 1
        row["cpu"] = {
            "server_s": server_cpu,
            "writers_s": writers_cpu_s,
            "coordinator_s": own_cpu,
            "proxy_s": proxy_cpu,
            "busy_cores": (server_cpu + writers_cpu_s + own_cpu + proxy_cpu) / window_s,
            "cores": cores,
        }
        if self.proxy is not None:
            stats = self.proxy.stats()
            commits = row["commits"]
            row["http"] = stats
            row["http_per_commit"] = stats["total_requests"] / commits if commits else None

    def check(self, expected_versions: int) -> int:
        import txstore

        version = txstore.open(self.uri, storage_options=self.server.options()).version
        if version != expected_versions:
            print(f"  WARNING: the store is at version {version}, {expected_versions} expected")
        return version


def run_appends(
    server: S3Server, proxy: Shaper | None, n: int, args: argparse.Namespace
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    run = Run(server, proxy, "appends", n)
    start, out, t0_box = ctx.Event(), ctx.Queue(), ctx.Value("d", 0.0)
    spec = {"uri": run.uri, "options": run.options, "samples": args.samples,
            "sample_bytes": args.sample_bytes, "duration": args.duration,
            "t0_box": t0_box}  # fmt: skip
    procs = [
        ctx.Process(target=append_writer, args=({**spec, "writer": i}, start, out))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    try:
        collect(out, n, "ready", procs)
        t0 = time.time() + START_DELAY_S
        t0_box.value = t0
        run.begin()
        start.set()
        done = collect(out, n, "done", procs)
    finally:
        stop_all(procs)
    window = max(d["end"] for d in done.values())
    row = summarize_appends(n, done, window, args)
    run.end(row, window, sum(d["cpu_s"] for d in done.values()))
    row["final_version"] = run.check(n + row["commits"])  # a warm-up and the commits
    return row


def summarize_appends(
    n: int, done: dict[int, Any], window: float, args: argparse.Namespace
) -> dict[str, Any]:
    commits = [c for d in done.values() for c in d["commits"]]
    latencies = [c["latency_s"] for c in commits]
    attempts = [c["attempts"] for c in commits]
    per_writer = [len(d["commits"]) / window for _, d in sorted(done.items())]
    return {
        "mode": "appends",
        "writers": n,
        "window_s": window,
        "commits": len(commits),
        "samples": len(commits) * args.samples,
        "commits_per_s": len(commits) / window,
        "samples_per_s": len(commits) * args.samples / window,
        "per_writer_commits_per_s": per_writer,
        "latency_ms": {
            "p50": 1000 * (percentile(latencies, 50) or 0),
            "p99": 1000 * (percentile(latencies, 99) or 0),
            "mean": 1000 * statistics.fmean(latencies) if latencies else None,
        },
        "attempts": {
            "mean": statistics.fmean(attempts) if attempts else None,
            "max": max(attempts, default=None),
            "retried_share": sum(a > 1 for a in attempts) / len(attempts) if attempts else None,
            "histogram": dict(sorted(Counter(attempts).items())),
        },
        "requests_per_commit": per_op([c["requests"] for c in commits], len(commits)),
        "requests_per_commit_by_attempts": {
            str(a): sum(sum(c["requests"].values()) for c in commits if c["attempts"] == a) / count
            for a, count in sorted(Counter(attempts).items())
        },
        "errors": [e for d in done.values() for e in d["errors"]],
    }


def run_staged(
    server: S3Server, proxy: Shaper | None, n: int, args: argparse.Namespace, mode: str
) -> dict[str, Any]:
    import txstore
    from txstore.format.staged import StagedPart

    ctx = mp.get_context("spawn")
    run = Run(server, proxy, mode, n)
    out = ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(n)]
    spec = {"samples": args.samples, "sample_bytes": args.sample_bytes,
            "reuse_client": mode == "staged-reuse"}  # fmt: skip
    procs = [
        ctx.Process(target=staged_writer, args=({**spec, "writer": i}, inboxes[i], out))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    store = txstore.open(run.uri, storage_options=run.options)
    counter = RequestCounter(store._ctx.storage)
    rounds: list[dict[str, Any]] = []

    def one_round(measured: bool) -> dict[str, Any]:
        before = counter.snapshot()
        t = time.perf_counter()
        txn = store.transaction()
        handle = txn.handle.to_json()
        for inbox in inboxes:
            inbox.put((measured, handle))
        got = collect(out, n, "part", procs)
        t_parts = time.perf_counter()
        for i in sorted(got):
            txn.add(StagedPart.from_json(got[i][0]))
        t_add = time.perf_counter()
        commit = txn.commit()
        t_commit = time.perf_counter()
        return {
            "round_s": t_commit - t,
            "parts_s": t_parts - t,
            "add_s": t_add - t_parts,
            "commit_s": t_commit - t_add,
            "write_s": [got[i][1]["write_s"] for i in sorted(got)],
            "attempts": commit.attempts,
            "coordinator_requests": dict(counter.snapshot() - before),
            "writer_requests": per_op([got[i][1]["requests"] for i in got], 1),
        }

    try:
        collect(out, n, "ready", procs)
        one_round(measured=False)  # warm-up: the coordinator's connections, the writers' code
        run.begin()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.duration:
            rounds.append(one_round(measured=True))
        window = time.perf_counter() - t0
        for inbox in inboxes:
            inbox.put(None)
        done = collect(out, n, "done", procs)
    finally:
        stop_all(procs)
    row = summarize_staged(mode, n, rounds, window, args)
    run.end(row, window, sum(d["cpu_s"] for d in done.values()))
    row["final_version"] = run.check(1 + len(rounds))  # the warm-up round and the rounds
    return row


def summarize_staged(
    mode: str, n: int, rounds: list[dict[str, Any]], window: float, args: argparse.Namespace
) -> dict[str, Any]:
    def ms(key: str, q: float) -> float:
        return 1000 * (percentile([r[key] for r in rounds], q) or 0)

    writes = [w for r in rounds for w in r["write_s"]]
    coordinator = per_op([r["coordinator_requests"] for r in rounds], len(rounds))
    writers = per_op([r["writer_requests"] for r in rounds], len(rounds))
    both: Counter[str] = Counter()
    for d in (coordinator, writers):
        both.update(d)
    return {
        "mode": mode,
        "writers": n,
        "window_s": window,
        "commits": len(rounds),
        "samples": len(rounds) * n * args.samples,
        "commits_per_s": len(rounds) / window,
        "samples_per_s": len(rounds) * n * args.samples / window,
        "latency_ms": {
            "p50": ms("round_s", 50),
            "p99": ms("round_s", 99),
            "mean": 1000 * statistics.fmean(r["round_s"] for r in rounds),
        },
        "phases_ms_p50": {
            "parts": ms("parts_s", 50),
            "one_part_write": 1000 * (percentile(writes, 50) or 0),
            "add": ms("add_s", 50),
            "commit": ms("commit_s", 50),
        },
        "attempts": {
            "mean": statistics.fmean(r["attempts"] for r in rounds),
            "max": max(r["attempts"] for r in rounds),
        },
        "requests_per_commit": dict(sorted(both.items())),
        "coordinator_requests_per_commit": coordinator,
        "writer_requests_per_commit": writers,
        "errors": [],
    }


# --------------------------------------------------------------------------- output


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row against one appending writer: commits/s and samples/s."""
    one = next((r for r in rows if r["mode"] == "appends" and r["writers"] == 1), None)
    for r in rows:
        r["x_one_writer_commits"] = r["commits_per_s"] / one["commits_per_s"] if one else None
        r["x_one_writer_samples"] = r["samples_per_s"] / one["samples_per_s"] if one else None


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    headers = ["mode", "N", "commits/s", "per writer", "samples/s", "p50 ms", "p99 ms"]
    headers += ["attempts", "max", "req/commit", "x1 commits", "x1 samples", "busy cores"]
    table = []
    for r in rows:
        per_writer = r["commits_per_s"] / r["writers"] if r["mode"] == "appends" else None
        table.append(
            [
                r["mode"],
                str(r["writers"]),
                fmt(r["commits_per_s"], ".1f"),
                fmt(per_writer, ".1f"),
                fmt(r["samples_per_s"], ".1f"),
                fmt(r["latency_ms"]["p50"], ".1f"),
                fmt(r["latency_ms"]["p99"], ".1f"),
                fmt(r["attempts"]["mean"], ".2f"),
                str(r["attempts"]["max"]),
                fmt(sum(r["requests_per_commit"].values()), ".1f"),
                fmt(r.get("x_one_writer_commits"), ".2f"),
                fmt(r.get("x_one_writer_samples"), ".2f"),
                fmt(r["cpu"]["busy_cores"], ".2f"),
            ]
        )
    print()
    print("\n".join(markdown_table(headers, table)))


def print_row(r: dict[str, Any]) -> None:
    cpu = r["cpu"]
    print(
        f"  {r['mode']} N={r['writers']}: {r['commits']} commits in {r['window_s']:.1f} s = "
        f"{r['commits_per_s']:.1f}/s ({r['samples_per_s']:.1f} samples/s), p50 "
        f"{r['latency_ms']['p50']:.1f} ms p99 {r['latency_ms']['p99']:.1f} ms, attempts "
        f"{r['attempts']['mean']:.2f} (max {r['attempts']['max']}); CPU s: server "
        f"{cpu['server_s']:.1f} writers {cpu['writers_s']:.1f} coordinator "
        f"{cpu['coordinator_s']:.1f} proxy {cpu['proxy_s']:.1f} = {cpu['busy_cores']:.2f} "
        f"of {cpu['cores']} cores",
        flush=True,
    )
    requests = ", ".join(f"{k} {v:.2f}" for k, v in r["requests_per_commit"].items())
    print(f"    S3 calls per commit: {requests}")
    if r["mode"] == "appends":
        by = ", ".join(f"{a}: {v:.1f}" for a, v in r["requests_per_commit_by_attempts"].items())
        print(f"    S3 calls per commit by attempts: {by}; histogram {r['attempts']['histogram']}")
    else:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases_ms_p50"].items())
        print(f"    p50 of the round's phases (ms): {phases}")
    if r.get("http_per_commit") is not None:
        print(f"    on the wire (proxy): {r['http_per_commit']:.2f} requests per commit, "
              f"{r['http']['requests']}")  # fmt: skip
    if r["errors"]:
        print(f"    {len(r['errors'])} errors, the first: {r['errors'][0]}")


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 s runs, N in 1, 2, 4")
    parser.add_argument("--writers", help="comma-separated writer counts (default 1,2,4,8)")
    parser.add_argument("--modes", default=",".join(MODES), help="appends,staged")
    parser.add_argument("--duration", type=float, help="seconds per run (default 10; quick 3)")
    parser.add_argument("--samples", type=int, default=1, help="samples per append or part")
    parser.add_argument("--sample-bytes", type=int, default=1024, help="payload per sample")
    parser.add_argument(
        "--count-http", action="store_true", help="also count requests on the wire (proxy)"
    )
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = QUICK_DURATION_S if args.quick else DURATION_S
    if args.writers:
        args.writer_counts = [int(w) for w in args.writers.split(",")]
    else:
        args.writer_counts = list(QUICK_WRITERS if args.quick else WRITERS)
    args.mode_list = [m for m in args.modes.split(",") if m]
    for m in args.mode_list:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; use {','.join(MODES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    info = machine_info(default_workdir(), PACKAGES)
    print_machine(info)
    report = new_report("bench_writers", info, args.quick, repeat=1)
    report["settings"] = {"duration_s": args.duration, "samples": args.samples,
                          "sample_bytes": args.sample_bytes, "count_http": args.count_http,
                          "writers": args.writer_counts, "modes": args.mode_list,
                          "server": "moto"}  # fmt: skip
    print(
        f"\n{args.duration:g} s runs, N writers in {args.writer_counts}, modes "
        f"{args.mode_list}, {args.samples} sample(s) of {args.sample_bytes} B per append or "
        f"part, moto_server{' behind the counting proxy' if args.count_http else ''}"
    )
    server = start_moto()
    proxy = Shaper(server.endpoint, 0.0, 0.0) if args.count_http else None
    rows: list[dict[str, Any]] = []
    try:
        for mode in args.mode_list:
            for n in args.writer_counts:
                if mode == "appends":
                    row = run_appends(server, proxy, n, args)
                else:
                    row = run_staged(server, proxy, n, args, mode)
                print_row(row)
                rows.append(row)
    finally:
        if proxy is not None:
            proxy.close()
        server.close()
    add_ratios(rows)
    print_table(rows)
    report["rows"] = rows
    finish_report(report, args.json, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
