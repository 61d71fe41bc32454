"""Metadata at scale: txstore's operations against the length of the history.

For each history length (10, 1,000, 10,000, 100,000 versions; 1,000,000 with --million;
--quick stops at 10,000) and each backend (a local directory and memory://; S3 with
``--backends s3``, a moto_server process of its own), a store is built
whose every version adds --chunks-per-version chunk references (10), then these are timed:

- commit: a one-sample ``append`` (a real chunk written and committed), each interleaved with
  one to a fresh store of 10 versions on the same backend (the reference);
- open + locate: ``txstore.open`` then ``snapshot()[i]`` for a random sample ``i``; after
  the time travels, the same targets again (``open_locate_again_ms``), their files now in the
  file system's caches;
- txn lookup: ``append(..., txn_id=...)`` of a transaction committed at a random old version
  (found, nothing written); then the same lookups again on the store opened anew, their files
  now in the file system's caches;
- log: ``log(limit=20)`` on a freshly opened store;
- time travel: ``snapshot(v)[i]`` for a random old version ``v`` and sample ``i`` (store
  opened untimed, so its caches are cold); then the same targets again
  (``time_travel_again_ms``), their files now in the file system's caches;
- expire + vacuum: ``expire`` of the oldest 1% of the versions, then
  ``vacuum(grace=0, incremental=True)`` and then the exact ``vacuum(grace=0)``, each on a
  freshly opened store (one run each). The incremental vacuum's state is made before the
  timed commits (its first run, which reads the whole history, is reported as
  ``vacuum_incr_first_ms``), so the timed run compares the versions committed since and
  deletes what the expired versions alone named; the exact one then finds what is left;
- verify: ``verify(quick=True)`` on a freshly opened store (one run).

Beside open + locate, txn lookup, log and time travel, a floor (``*_floor_ms``): the least
any reader of this layout does for the same kind of request, on targets of its own drawn at
random (so its files are as cold as the timed operation's), each run in turn with one of the
figure's (so that caches warming over the runs warm both alike): read the files with the backend's
plain ``read`` and decode only the fields it needs, no checks. Open: HEAD, a probe for the
version after it (HEAD is a hint), the manifest, the segment files down to a random sample
and its chunk file; time travel: the same from an old version's manifest; lookup: HEAD and the
probe (a transaction at the latest version has no marker yet), the transaction's marker and
its version's manifest; log: HEAD and the probe, then the 20 newest manifests (the same files
``log`` read, so a floor of them read again). What grows with the history in both is the files
(their size, the depth of the segment tree, directories of millions of files a cache cannot
hold), not txstore; ``ratios`` reports each figure's growth with its floor's taken out.

How the history is built, fast and honestly: through the real commit path
(``StoreContext.append_chunks``: segments written and merged by ``Segments``, the manifest by
``txn.rules.next_manifest``, committed by the commit loop with its put-if-absent, txn markers
and HEAD), each version with its own ``txn_id``, on a memory:// store, where that runs at
thousands of versions a second. Version 1 is a real one-sample append; every later version
of the history names its chunk ``--chunks-per-version`` times, so chunk files are not written
and every sample of every version is readable (each reference is to a real one-sample chunk);
the writer's memory of merges already done is cleared before each version, so each writes
segment files of its own (as versions adding their own chunks do) instead of finding the
same merges done and sharing a few files across the whole history.
For the local backend the built store's objects (manifests, segments, txn markers, HEAD,
refs) are then copied byte for byte into a directory, followed by one ``os.sync()``:
the same files the commits would have left, without one fsync per file; for S3, into a prefix
of the bucket, 16 objects at a time. Timed operations run on the real backends with nothing
skipped.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
from txbench.output import finish_report, new_report
from txbench.servers import S3Server, start_moto
from txbench.system import default_workdir, machine_info, print_machine

SIZES = (10, 1_000, 10_000, 100_000)
QUICK_SIZES = (10, 1_000, 10_000)
MILLION = 1_000_000
BACKENDS = ("local", "memory", "s3")
DEFAULT_BACKENDS = ("local", "memory")
REFERENCE_VERSIONS = 10

#: The figures each size reports, in table order: (key, what).
FIGURES = (
    ("commit_ms", "one-sample append"),
    ("open_locate_ms", "open + snapshot()[i]"),
    ("txn_lookup_ms", "txn_id lookup"),
    ("txn_lookup_again_ms", "the same lookups again"),
    ("open_locate_again_ms", "the same opens again"),
    ("log20_ms", "log(limit=20)"),
    ("time_travel_ms", "snapshot(old v)[i]"),
    ("time_travel_again_ms", "the same old versions again"),
    ("expire_ms", "expire oldest 1%"),
    ("vacuum_incr_ms", "incremental vacuum after it"),
    ("vacuum_ms", "exact vacuum after that"),
    ("verify_ms", "verify(quick=True)"),
)
#: The figures measured beside a floor (``<key>_floor_ms``; see the module's docstring).
FLOORED = ("open_locate_ms", "txn_lookup_ms", "log20_ms", "time_travel_ms")


def floor_key(key: str) -> str:
    """The key of a floored figure's floor."""
    return key.removesuffix("_ms") + "_floor_ms"


#: The maintenance target compares 1% expired and vacuumed, per expired version, with the
#: same at this length.
MAINTENANCE_BASE = 10_000


def sample(i: int) -> dict[str, Any]:
    return {"id": i, "tokens": os.urandom(2048)}


def memory_name() -> str:
    return f"bench-scale-{uuid.uuid4().hex}"


def forget_memory(uri: str) -> None:
    """Free a named memory store (they live for the process otherwise)."""
    from txstore.storage import memory

    memory._named.pop(uri.removeprefix("memory://"), None)


def build_history(uri: str, versions: int, chunks_per_version: int) -> tuple[Any, float]:
    """A store at ``uri`` with ``versions`` versions after version 0; returns (store, seconds).
    Version v >= 2 has txn_id ``history-<v>``."""
    import txstore

    start = time.perf_counter()
    store = txstore.create(uri)
    store.append([sample(0)], txn_id="history-1")
    (template,) = store.snapshot(1).chunk_refs()
    chunks = (template,) * chunks_per_version
    ctx = store._ctx
    manifest = store.snapshot().manifest
    for v in range(2, versions + 1):
        # The writer remembers its merges for a rebase to redo them without writing again;
        # here every version adds the same references, so it would find each merge done
        # before and the whole history would share a few segment files. Forgotten, each
        # version writes its own, as versions adding their own chunks do.
        ctx.segments._merged.clear()
        manifest = ctx.append_chunks(chunks, start=manifest, txn_id=f"history-{v}").manifest
        if manifest.version != v:
            raise RuntimeError(f"history build: committed version {manifest.version}, not {v}")
    return store, time.perf_counter() - start


def copy_to_directory(store: Any, root: Path) -> int:
    """Every object of ``store`` written as a file under ``root``; returns the count."""
    storage = store.storage
    count = 0
    for info in storage.list(""):
        path = root.joinpath(*info.key.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(storage.read(info.key))
        count += 1
    os.sync()
    return count


def copy_to_s3(store: Any, uri: str, options: dict[str, Any]) -> int:
    """Every object of ``store`` written under ``uri`` (an S3 prefix); returns the count."""
    from txstore.storage import open_storage

    source, target = store.storage, open_storage(uri, options)
    keys = [info.key for info in source.list("")]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: target.write(key, source.read(key)), keys))
    return len(keys)


class _Ref(msgspec.Struct):
    path: str
    num_samples: int


class _Doc(msgspec.Struct):
    """Only what a reader needs of HEAD, a manifest, a segment file or a txn marker; the
    decoder steps over every other field."""

    type: str
    version: int = 0
    num_samples: int = 0
    segments: list[_Ref] = []
    chunks: list[_Ref] = []


class _Commit(msgspec.Struct):
    """What the history and a transaction lookup need of a manifest (its segments skipped)."""

    type: str
    version: int
    txn_id: str | None = None


_decode = msgspec.json.Decoder(_Doc).decode
_decode_commit = msgspec.json.Decoder(_Commit).decode


def floor_locate(storage: Any, key: str, where: float) -> None:
    """Read the manifest at ``key``, the segment files down to the sample at fraction
    ``where`` of it, and that sample's chunk file, each decoded to the few fields needed."""
    doc = _decode(storage.read(key))
    i = int(where * doc.num_samples)
    refs = doc.segments
    while True:
        for ref in refs:
            if i < ref.num_samples:
                break
            i -= ref.num_samples
        else:
            raise RuntimeError(f"floor: sample past the end of {key}")
        segment = _decode(storage.read(ref.path))
        if segment.type != "segment":
            refs = segment.segments
            continue
        for chunk in segment.chunks:
            if i < chunk.num_samples:
                storage.read(chunk.path)
                return
            i -= chunk.num_samples
        raise RuntimeError(f"floor: sample past the end of {ref.path}")


def floor_latest(storage: Any) -> int:
    """The latest version: HEAD, then a probe past it (HEAD is a hint)."""
    from txstore.txn import manifest_key

    version = _decode(storage.read("HEAD")).version
    if storage.exists(manifest_key(version + 1)):
        raise RuntimeError("floor: HEAD is behind")
    return version


def floor_open(storage: Any, where: float) -> None:
    from txstore.txn import manifest_key

    floor_locate(storage, manifest_key(floor_latest(storage)), where)


def floor_lookup(storage: Any, txn_id: str) -> None:
    """The latest version (a transaction there has no marker yet), the marker, its version."""
    from txstore.txn import manifest_key
    from txstore.txn.log import txn_marker_key

    floor_latest(storage)
    marker = _decode(storage.read(txn_marker_key(txn_id)))
    if _decode_commit(storage.read(manifest_key(marker.version))).txn_id != txn_id:
        raise RuntimeError(f"floor: the marker of {txn_id} names another version")


def floor_log(storage: Any, limit: int) -> None:
    """The latest version, then the manifests of the ``limit`` newest."""
    from txstore.txn import manifest_key

    latest = floor_latest(storage)
    for v in range(latest, max(-1, latest - limit), -1):
        _decode_commit(storage.read(manifest_key(v)))


def paired(
    figure: Callable[[], float], floor: Callable[[], float], repeat: int
) -> tuple[list[float], list[float]]:
    """``repeat`` runs of a figure and of its floor, in turn (each pair in the other order
    than the last): caches that warm over the runs (the directory blocks of a million
    files) warm both alike, where a floor run after all the figure's found them warm."""
    runs: tuple[list[float], list[float]] = ([], [])
    for k in range(repeat):
        for which in (0, 1) if k % 2 == 0 else (1, 0):
            runs[which].append((figure, floor)[which]())
    return runs


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1000, result


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def p90(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[8]


def summary(values: Sequence[float]) -> dict[str, Any]:
    return {"median": median(values), "p90": p90(values), "runs": list(values)}


def measure(
    uri: str,
    reference_uri: str,
    history: int,
    repeat: int,
    rng: random.Random,
    options: dict[str, Any] | None = None,
    scans: bool = True,
) -> dict[str, Any]:
    """The figures on the store at ``uri`` (``history`` versions built, txn ids as above),
    opened with ``options`` (its backend's storage options); ``scans``: the exact vacuum
    and verify too (each reads the whole history)."""
    import txstore
    from txstore.storage import open_storage
    from txstore.store.incremental import state_size
    from txstore.txn import manifest_key

    open_ = partial(txstore.open, storage_options=options)
    store = open_(uri)
    reference = open_(reference_uri)
    store.append([sample(1)])  # untimed: the backend check, first imports
    reference.append([sample(1)])
    out: dict[str, Any] = {}
    # The incremental vacuum's first run reads the whole history once: its state for later.
    ms, first = timed(lambda: open_(uri).vacuum(grace=0, incremental=True))
    if first.files:
        raise RuntimeError(f"the first incremental vacuum deleted {len(first.files)} files")
    out["vacuum_incr_first_ms"] = summary([ms])

    # In pairs, which store goes first drawn at random: see bench_append.py.
    commits: list[float] = []
    references: list[float] = []
    for k in range(repeat):
        pair = [(store, commits), (reference, references)]
        rng.shuffle(pair)
        for which, into in pair:
            into.append(timed(partial(which.append, [sample(k)]))[0])
    out["commit_ms"] = summary(commits)
    out["commit_reference_ms"] = summary(references)

    def sample_at(snap: Any, where: float) -> Any:
        return snap[int(where * len(snap))]

    def open_at(where: float) -> float:
        return timed(lambda: sample_at(open_(uri).snapshot(), where))[0]

    open_targets: list[float] = []

    def open_locate() -> float:
        open_targets.append(rng.random())
        return open_at(open_targets[-1])

    # The floors' targets come from a generator of their own: other files, as cold.
    floor_rng = random.Random(rng.random())
    plain = open_storage(uri, options)
    opens, floors = paired(
        open_locate,
        lambda: timed(partial(floor_open, plain, floor_rng.random()))[0],
        repeat,
    )
    out["open_locate_ms"], out["open_locate_floor_ms"] = summary(opens), summary(floors)

    old_ids = [f"history-{rng.randint(2, history)}" for _ in range(repeat)] if history > 1 else []

    def lookup(txn_id: str) -> float:
        ms, commit = timed(partial(store.append, [sample(0)], txn_id=txn_id))
        if commit.attempts != 0 or commit.txn_id != txn_id:
            raise RuntimeError(f"txn lookup of {txn_id}: committed again ({commit})")
        return ms

    if history > 1:
        floor_ids = [f"history-{floor_rng.randint(2, history)}" for _ in range(repeat)]
        ids, floor_ids_left = iter(old_ids), iter(floor_ids)
        lookups, floors = paired(
            lambda: lookup(next(ids)),
            lambda: timed(partial(floor_lookup, plain, next(floor_ids_left)))[0],
            repeat,
        )
        out["txn_lookup_ms"], out["txn_lookup_floor_ms"] = summary(lookups), summary(floors)
    else:
        out["txn_lookup_ms"] = None
    # The same again through a store opened anew (none of its caches), their files now in
    # the file system's caches: how much of a lookup is the disk (a marker and a manifest
    # among millions of files), not txstore.
    reopened = open_(uri)
    again = [timed(partial(reopened.append, [sample(0)], txn_id=t))[0] for t in old_ids]
    out["txn_lookup_again_ms"] = summary(again) if again else None

    def log20() -> float:
        fresh = open_(uri)
        ms, entries = timed(partial(fresh.log, limit=20))
        if len(entries) != min(20, fresh.version + 1):
            raise RuntimeError(f"log(limit=20) gave {len(entries)} entries")
        return ms

    logs, floors = paired(log20, lambda: timed(partial(floor_log, plain, 20))[0], repeat)
    out["log20_ms"], out["log20_floor_ms"] = summary(logs), summary(floors)

    latest = store.version

    def travel_at(v: int, where: float) -> float:
        fresh = open_(uri)  # untimed: its caches cold
        return timed(lambda: sample_at(fresh.snapshot(v), where))[0]

    travel_targets: list[tuple[int, float]] = []

    def travel() -> float:
        travel_targets.append((rng.randint(1, latest - 1), rng.random()))
        return travel_at(*travel_targets[-1])

    def travel_floor() -> float:
        key = manifest_key(floor_rng.randint(1, latest - 1))
        return timed(partial(floor_locate, plain, key, floor_rng.random()))[0]

    travels, floors = paired(travel, travel_floor, repeat)
    out["time_travel_ms"], out["time_travel_floor_ms"] = summary(travels), summary(floors)

    # Open + [i] and time travel again on the same targets, their files now in the file
    # system's caches (as the lookups above): what of their growth is txstore's, not the
    # disk's, where a cold read among millions of files is what the medians measure.
    out["open_locate_again_ms"] = summary([open_at(w) for w in open_targets])
    out["time_travel_again_ms"] = summary([travel_at(v, w) for v, w in travel_targets])

    # Expire the oldest 1% (at least one version), then vacuum them.
    latest = store.version
    expire_count = max(1, history // 100)
    keep_last = latest + 1 - expire_count
    ms, report = timed(lambda: open_(uri).expire(keep_last=keep_last))
    out["expire_ms"] = summary([ms])
    out["expired_versions"] = len(report.expired)
    ms, vac = timed(lambda: open_(uri).vacuum(grace=0, incremental=True))
    out["vacuum_incr_ms"] = summary([ms])
    out["vacuum_incr_deleted_files"] = len(vac.files)
    out["vacuum_incr_state_files"] = state_size(open_(uri).storage)
    if scans:
        ms, vac = timed(lambda: open_(uri).vacuum(grace=0))
        out["vacuum_ms"] = summary([ms])
        out["vacuum_deleted_files"] = len(vac.files)
        ms, ver = timed(lambda: open_(uri).verify(quick=True))
        if ver.problems:
            raise RuntimeError(f"verify found problems: {ver.problems[:3]}")
        out["verify_ms"] = summary([ms])
        out["verify_versions"] = ver.versions
    out["chunks"] = len(store.snapshot().chunk_refs())
    out["manifest_bytes"] = len(store.storage.read(f"versions/index.v{store.version}.json"))
    out["segments"] = len(store.snapshot().manifest.segments)
    return out


def run_size(
    history: int,
    backends: Sequence[str],
    chunks: int,
    repeat: int,
    workdir: Path,
    seed: int,
    s3: S3Server | None,
    scans: bool = True,
) -> list[dict[str, Any]]:
    rows = []
    built, build_s = build_history(f"memory://{memory_name()}", history, chunks)
    reference, _ = build_history(f"memory://{memory_name()}", REFERENCE_VERSIONS, chunks)
    built_uri, reference_uri = built.uri, reference.uri
    run_dir = Path(tempfile.mkdtemp(prefix="txstore-scale-", dir=workdir))
    try:
        # Copies first, the memory backend's figures next, then the memory stores freed: at
        # 10^6 versions the built store holds some 10 GB that the page cache would otherwise
        # not have for the other backends' files.
        stores: dict[str, tuple[str, str, dict[str, Any] | None, float]] = {}
        for backend in backends:
            start = time.perf_counter()
            where: tuple[str, str, dict[str, Any] | None]
            if backend == "local":
                copy_to_directory(built, run_dir / "store")
                copy_to_directory(reference, run_dir / "reference")
                where = (str(run_dir / "store"), str(run_dir / "reference"), None)
            elif backend == "s3":
                assert s3 is not None
                where = (
                    s3.uri(f"{run_dir.name}/store"),
                    s3.uri(f"{run_dir.name}/ref"),
                    s3.options(),
                )
                copy_to_s3(built, where[0], s3.options())
                copy_to_s3(reference, where[1], s3.options())
            else:
                where = (built.uri, reference.uri, None)
            copy_s = time.perf_counter() - start if backend != "memory" else 0.0
            stores[backend] = (*where, copy_s)
        del built, reference  # the memory stores live on under their names until forgotten
        for backend in sorted(backends, key=lambda b: b != "memory"):
            if backend != "memory":
                forget_memory(built_uri)
                forget_memory(reference_uri)
                gc.collect()
            uri, ref_uri, options, copy_s = stores[backend]
            rng = random.Random(seed + history)
            gc.collect()
            figures = measure(uri, ref_uri, history, repeat, rng, options, scans)
            row = {"backend": backend, "versions": history, "build_s": build_s}
            row.update(copy_s=copy_s, **figures)
            print_row(row)
            rows.append(row)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        forget_memory(built_uri)
        forget_memory(reference_uri)
    return rows


def print_row(row: dict[str, Any]) -> None:
    parts = [f"{row['backend']:>6} {row['versions']:>9,} versions, {row['chunks']:,} chunks:"]
    for key, _ in FIGURES:
        value = row.get(key)
        parts.append(f"{key.removesuffix('_ms')} {value['median']:.2f}" if value else f"{key} -")
    floors = [(k, row.get(floor_key(k))) for k in FLOORED]
    parts += [f"{k.removesuffix('_ms')} floor {f['median']:.2f}" for k, f in floors if f]
    parts.append(f"(ref commit {row['commit_reference_ms']['median']:.2f})")
    parts.append(
        f"vacuum deleted {row['vacuum_incr_deleted_files']} + "
        f"{row.get('vacuum_deleted_files', '-')} files (incremental + exact; its first run "
        f"{row['vacuum_incr_first_ms']['median']:.0f})"
    )
    parts.append(f"manifest {row['manifest_bytes']:,} B, {row['segments']} segments")
    parts.append(f"build {row['build_s']:.1f} s")
    print(" ".join(parts), flush=True)


def ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each figure at each size against the same backend's figure at the smallest size.
    A floored figure also gets its floor's ratio (``<key>_floor``) and its own ratio with
    the floor's growth taken out (``<key>_less_floor``: what txstore adds as the history
    grows); expire + vacuum of 1%, per expired version, gets its ratio to the same at
    ``MAINTENANCE_BASE`` versions, when the run has that length (``maintenance_vs_base``):
    1% of a longer history is more versions, and their cost is meant to be proportional to
    them (per version flat), not to the history."""

    def med(row: dict[str, Any], key: str) -> float | None:
        value = row.get(key)
        return value["median"] if value else None

    def maintenance(row: dict[str, Any]) -> float | None:
        expire, vacuum = med(row, "expire_ms"), med(row, "vacuum_incr_ms")
        expired = int(row.get("expired_versions") or 0)
        if expire is None or vacuum is None or not expired:
            return None
        return (expire + vacuum) / expired

    out = []
    for backend in sorted({r["backend"] for r in rows}):
        mine = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["versions"])
        first = mine[0]
        base = next((r for r in mine if r["versions"] == MAINTENANCE_BASE), None)
        for r in mine[1:]:
            entry: dict[str, Any] = {"backend": backend, "versions": r["versions"]}
            for key, _ in FIGURES:
                a, b = med(r, key), med(first, key)
                entry[key] = a / b if a and b else None
            for key in FLOORED:
                a, b = med(r, key), med(first, key)
                fa, fb = med(r, floor_key(key)), med(first, floor_key(key))
                if a and b and fa and fb:
                    entry[f"{key}_floor"] = fa / fb
                    entry[f"{key}_less_floor"] = (a - (fa - fb)) / b
            if base is not None and r["versions"] > MAINTENANCE_BASE:
                now, then = maintenance(r), maintenance(base)
                if now is not None and then:
                    entry["maintenance_vs_base"] = now / then
            out.append(entry)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="sizes 10, 1,000 and 10,000 only")
    parser.add_argument(
        "--million", action="store_true", help="add 1,000,000 versions (a long build)"
    )
    parser.add_argument("--sizes", help="comma-separated history lengths (instead of the above)")
    parser.add_argument(
        "--backends", default=",".join(DEFAULT_BACKENDS), help="of local, memory, s3 (moto)"
    )
    parser.add_argument(
        "--no-scans",
        action="store_true",
        help="skip the exact vacuum and verify (each reads the whole history: 5 and 15 "
        "minutes at 10^6 versions)",
    )
    parser.add_argument("--chunks-per-version", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per figure")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    parser.add_argument(
        "--workdir", type=Path, default=default_workdir(), help="where the local stores go"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    else:
        sizes = list(QUICK_SIZES if args.quick else SIZES) + ([MILLION] if args.million else [])
    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        if b not in BACKENDS:
            raise SystemExit(f"unknown backend {b!r}; use {','.join(BACKENDS)}")
    info = machine_info(args.workdir)
    print_machine(info)
    report = new_report("bench_scale", info, args.quick, repeat=args.repeat)
    report["chunks_per_version"] = args.chunks_per_version
    print(
        f"\nhistories of {sizes} versions of {args.chunks_per_version} chunks, "
        f"{args.repeat} runs per figure (expire, vacuum, verify: one), backends {backends}"
    )
    rows: list[dict[str, Any]] = []
    s3 = start_moto() if "s3" in backends else None
    try:
        for size in sizes:
            rows += run_size(
                size,
                backends,
                args.chunks_per_version,
                args.repeat,
                args.workdir,
                args.seed,
                s3,
                scans=not args.no_scans,
            )
    finally:
        if s3 is not None:
            s3.close()
    report["rows"] = rows
    report["ratios"] = ratios(rows)
    print("\neach figure's median against the same backend's at the smallest history:")
    for entry in report["ratios"]:
        keys = [k for k, _ in FIGURES]
        keys += [f"{k}_{w}" for k in FLOORED for w in ("floor", "less_floor")]
        keys += ["maintenance_vs_base"]
        cells = " ".join(
            f"{k.removesuffix('_ms').replace('_ms_', ' ')} {entry[k]:.2f}x"
            for k in keys
            if entry.get(k) is not None
        )
        print(f"  {entry['backend']:>6} {entry['versions']:>9,}: {cells}")
    finish_report(report, args.json, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
