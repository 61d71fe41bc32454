"""The ``txstore`` command line: inspect and operate a store from a shell or a script.

Human tables by default, ``--json`` for scripts, a progress line on stderr for long work when
stderr is a terminal, and a prompt (or ``--yes``) before anything destructive. Exit codes are
listed in ``EPILOG``.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from . import open as open_store
from .errors import ConflictError, TxstoreError
from .history import Commit, Diff
from .maintenance import Progress
from .progress import Progress as ProgressLine
from .store import Store
from .units import format_duration

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DAMAGED, EXIT_CONFLICT, EXIT_NOT_CONFIRMED = 0, 1, 2, 3, 4, 5

EXAMPLES = """\
examples:
  txstore log data/captions
  txstore tag data/captions paper-v1 12 -m "the numbers in the paper"
  txstore rollback data/captions 9 -m "drop the bad crawl" --yes
  txstore expire data/captions --keep-last 20 --older-than 30d --yes
  txstore vacuum data/captions --dry-run
  txstore verify s3://bucket/captions --storage-option endpoint_url=http://127.0.0.1:9000

"""

EPILOG = """\
exit codes:
  0  success
  1  error (store or version not found, damaged data, storage failure)
  2  bad usage
  3  verify found damage
  4  conflict: someone committed meanwhile and nothing was changed; look, then retry
  5  not confirmed: a destructive command was declined, or had no --yes without a terminal

VERSION arguments take a version number or a tag name.
"""


class _NotConfirmed(Exception):
    pass


# -- output helpers ---------------------------------------------------------------------------


def _options(pairs: list[str]) -> dict[str, Any] | None:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--storage-option takes key=value, got {pair!r}")
        if key == "endpoint_url":  # s3fs wants the endpoint inside client_kwargs
            options.setdefault("client_kwargs", {})["endpoint_url"] = value
        elif key == "region_name":
            options.setdefault("client_kwargs", {})["region_name"] = value
        else:
            options[key] = value
    return options or None


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: str = "") -> None:
    """A plain text table; columns whose header is in ``right`` are right-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        parts = [
            c.rjust(w) if headers[i] in right.split(",") else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(parts).rstrip())


def _when(ts: datetime) -> str:
    return f"{ts.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S}"


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _commit_json(c: Commit) -> dict[str, Any]:
    return {
        "version": c.version,
        "timestamp": c.timestamp.isoformat(),
        "operation": c.operation,
        "num_samples": c.num_samples,
        "total_samples": c.total_samples,
        "message": c.message,
        "txn_id": c.txn_id,
        "commit_id": c.commit_id,
    }


def _progress(args: argparse.Namespace) -> Progress:
    """A progress callback drawing one stderr line per stage, only on a terminal."""
    enabled = sys.stderr.isatty() and not args.quiet
    current: list[ProgressLine] = []

    def report(stage: str, done: int, total: int) -> None:
        if not enabled:
            return
        if not current or current[0].label != stage:
            if current:
                current.pop().close()
            current.append(ProgressLine(stage, total, unit="", enabled=True))
        line = current[0]
        line.update(done - line.done)
        if done >= total:
            current.pop().close()

    return report


def _confirm(args: argparse.Namespace, question: str) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise _NotConfirmed(f"{question}\nrefusing without --yes (stdin is not a terminal)")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise _NotConfirmed("not confirmed; nothing was changed")


# -- reading commands -------------------------------------------------------------------------


def _cmd_log(store: Store, args: argparse.Namespace) -> int:
    commits = store.log(limit=args.limit)
    expired = store.expired_versions()
    tags: dict[int, list[str]] = {}
    for tag in store.tags().values():
        tags.setdefault(tag.version, []).append(tag.name)
    if args.json:
        _print_json(
            [
                {
                    **_commit_json(c),
                    "expired": c.version in expired,
                    "tags": tags.get(c.version, []),
                }
                for c in commits
            ]
        )
        return EXIT_OK
    rows = [
        [
            c.version,
            _when(c.timestamp),
            c.operation,
            f"{c.num_samples:+,}" if c.operation != "create" else "",
            f"{c.total_samples:,}",
            " ".join(
                [
                    *(f"tag:{t}" for t in tags.get(c.version, [])),
                    *(["expired"] if c.version in expired else []),
                ]
            ),
            c.message or "",
        ]
        for c in commits
    ]
    _table(
        ["version", "time (UTC)", "operation", "added", "total", "refs", "message"],
        rows,
        "version,added,total",
    )
    return EXIT_OK


def _cmd_show(store: Store, args: argparse.Namespace) -> int:
    manifest = store.manifest(args.ref)
    v = manifest.version
    commit = Commit.from_manifest(manifest)
    expired = v in store.expired_versions()
    info: dict[str, Any] = {
        **_commit_json(commit),
        "parent": manifest.parent,
        "source_version": manifest.source_version,
        "expired": expired,
        "tags": [t.name for t in store.tags().values() if t.version == v],
        "leases": [
            {"id": lease.id, "expires_at": lease.expires_at.isoformat(), "owner": lease.owner}
            for lease in store.leases()
            if lease.version == v and lease.active
        ],
        "segments": len(manifest.segments),
        "config": {f: getattr(manifest.config, f) for f in manifest.config.__struct_fields__},
    }
    if not expired:
        chunks = store.snapshot(v).chunks()
        info["chunks"] = len(chunks)
        info["bytes"] = sum(c.size + sum(f.size for f in c.field_files) for c in chunks)
    if args.json:
        _print_json(info)
        return EXIT_OK
    print(f"version {v}  ({commit.operation}, commit {commit.commit_id})")
    print(f"date:       {_when(commit.timestamp)} UTC")
    if manifest.parent is not None:
        print(f"parent:     {manifest.parent}")
    if manifest.source_version is not None:
        print(f"source:     version {manifest.source_version}")
    print(f"samples:    {commit.total_samples:,} ({commit.num_samples:+,})")
    if commit.txn_id:
        print(f"txn_id:     {commit.txn_id}")
    if commit.message:
        print(f"message:    {commit.message}")
    if info["tags"]:
        print(f"tags:       {', '.join(info['tags'])}")
    for lease in info["leases"]:
        print(f"lease:      {lease['id'][:8]} until {lease['expires_at']} ({lease['owner']})")
    if expired:
        print("state:      expired (open it through a tag or lease, or pick a newer version)")
    else:
        print(
            f"files:      {info['chunks']:,} chunks, {_bytes(info['bytes'])}, "
            f"{info['segments']} segments"
        )
    return EXIT_OK


def _cmd_info(store: Store, args: argparse.Namespace) -> int:
    snap = store.snapshot(args.version)
    chunks = snap.chunks()
    info = {
        "uri": store.uri,
        "version": snap.version,
        "samples": len(snap),
        "chunks": len(chunks),
        "bytes": sum(c.size for c in chunks),
        "segments": len(snap.manifest.segments),
        "config": {
            f: getattr(snap.manifest.config, f) for f in snap.manifest.config.__struct_fields__
        },
    }
    if args.json:
        _print_json(info)
        return EXIT_OK
    for key, value in info.items():
        print(f"{key:>9}: {value:,}" if isinstance(value, int) else f"{key:>9}: {value}")
    return EXIT_OK


def _cmd_ls(store: Store, args: argparse.Namespace) -> int:
    snap = store.snapshot(args.version)
    chunks = snap.chunks()
    if args.json:
        _print_json(
            [
                {
                    "path": c.path,
                    "samples": c.num_samples,
                    "bytes": c.size,
                    "field_files": [{"path": f.path, "bytes": f.size} for f in c.field_files],
                }
                for c in chunks
            ]
        )
        return EXIT_OK
    rows: list[list[str]] = []
    total = 0
    for chunk in chunks:
        rows.append([chunk.path, f"{chunk.num_samples:,}", f"{chunk.size:,}"])
        rows += [[f"  + {f.path}", "", f"{f.size:,}"] for f in chunk.field_files]
        total += chunk.size + sum(f.size for f in chunk.field_files)
    _table(["path", "samples", "bytes"], rows, "samples,bytes")
    print(
        f"version {snap.version}: {len(snap):,} samples in {len(chunks):,} chunks, {_bytes(total)}"
    )
    return EXIT_OK


def _cmd_cat(store: Store, args: argparse.Namespace) -> int:
    sample = store.snapshot(args.version)[args.index]
    if args.json:
        _print_json({k: _jsonable(v) for k, v in sample.items()})
        return EXIT_OK
    for key, value in sample.items():
        print(f"{key}: {_describe(value)}")
    return EXIT_OK


def _describe(value: Any) -> str:
    if isinstance(value, bytes):
        return f"<{len(value):,} bytes> {value[:24]!r}{'...' if len(value) > 24 else ''}"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"<{type(value).__name__} {dtype} {tuple(shape)}>"
    text = repr(value)
    return text if len(text) < 200 else text[:200] + "..."


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return _describe(value)


def _diff_json(d: Diff) -> dict[str, Any]:
    def ranges(rs: Sequence[Any]) -> list[dict[str, Any]]:
        return [
            {"start": r.start, "stop": r.stop, "version": r.version, "txn_id": r.txn_id} for r in rs
        ]

    return {
        "a": d.a,
        "b": d.b,
        "common": d.common,
        "num_added": d.num_added,
        "num_removed": d.num_removed,
        "added": ranges(d.added),
        "removed": ranges(d.removed),
        "commits": [_commit_json(c) for c in d.commits],
    }


def _cmd_diff(store: Store, args: argparse.Namespace) -> int:
    d = store.diff(args.a, args.b)
    if args.json:
        _print_json(_diff_json(d))
        return EXIT_OK
    print(f"version {d.a} -> version {d.b}: +{d.num_added:,} samples, -{d.num_removed:,} samples")
    print(f"(both start with the samples of version {d.common})")
    if d.commits:
        print("\ncommits:")
        _table(
            ["version", "time (UTC)", "operation", "added", "message"],
            [
                [c.version, _when(c.timestamp), c.operation, f"{c.num_samples:+,}", c.message or ""]
                for c in d.commits
            ],
            "version,added",
        )
    for title, ranges, version in (("added", d.added, d.b), ("removed", d.removed, d.a)):
        if ranges:
            print(f"\n{title} (sample indices of version {version}):")
            _table(
                ["samples", "count", "appended by", "txn_id"],
                [
                    [
                        f"[{r.start:,}, {r.stop:,})",
                        f"{len(r):,}",
                        f"version {r.version}",
                        r.txn_id or "",
                    ]
                    for r in ranges
                ],
                "count",
            )
    return EXIT_OK


def _cmd_tags(store: Store, args: argparse.Namespace) -> int:
    tags = list(store.tags().values())
    if args.json:
        _print_json([{**t.__dict__, "created": t.created.isoformat()} for t in tags])
        return EXIT_OK
    _table(
        ["tag", "version", "created (UTC)", "message"],
        [[t.name, t.version, _when(t.created), t.message or ""] for t in tags],
        "version",
    )
    return EXIT_OK


def _cmd_leases(store: Store, args: argparse.Namespace) -> int:
    leases = store.leases()
    if args.json:
        _print_json(
            [
                {
                    **lease.__dict__,
                    "created": lease.created.isoformat(),
                    "expires_at": lease.expires_at.isoformat(),
                }
                for lease in leases
            ]
        )
        return EXIT_OK
    _table(
        ["lease", "version", "expires (UTC)", "state", "owner"],
        [
            [
                lease.id[:12],
                lease.version,
                _when(lease.expires_at),
                "active" if lease.active else "lapsed",
                lease.owner,
            ]
            for lease in leases
        ],
        "version",
    )
    return EXIT_OK


def _cmd_verify(store: Store, args: argparse.Namespace) -> int:
    report = store.verify(deep=args.deep, progress=_progress(args))
    if args.json:
        _print_json(
            {
                "ok": report.ok,
                "latest": report.latest,
                "versions": report.versions,
                "segments": report.segments,
                "files": report.files,
                "bytes": report.bytes,
                "samples": report.samples,
                "deep": report.deep,
                "problems": [p.__dict__ for p in report.problems],
                "orphans": [{"key": f.key, "bytes": f.size} for f in report.orphans],
                "orphan_bytes": report.orphan_bytes,
            }
        )
    else:
        what = f", {report.samples:,} samples decoded" if report.samples is not None else ""
        print(
            f"checked {report.versions:,} unexpired versions (latest {report.latest}): "
            f"{report.segments:,} segments, {report.files:,} data files, "
            f"{_bytes(report.bytes)}{what}"
        )
        print(
            f"unreferenced files (vacuum reclaims them): {len(report.orphans):,}, "
            f"{_bytes(report.orphan_bytes)}"
        )
        if report.ok:
            print("ok: no damage found")
        else:
            print(f"DAMAGED: {len(report.problems)} problem(s)")
            for p in report.problems:
                print(f"  {p.key}: {p.message}")
    return EXIT_OK if report.ok else EXIT_DAMAGED


# -- commands that change the store -----------------------------------------------------------


def _cmd_tag(store: Store, args: argparse.Namespace) -> int:
    tag = store.tag(args.name, args.ref, message=args.message, force=args.force)
    if args.json:
        _print_json({**tag.__dict__, "created": tag.created.isoformat()})
    else:
        print(f"tagged version {tag.version} as {tag.name!r}")
    return EXIT_OK


def _cmd_untag(store: Store, args: argparse.Namespace) -> int:
    current = store.tag_info(args.name)
    _confirm(
        args, f"Delete tag {args.name!r} (version {current.version})? The version may then expire."
    )
    tag = store.untag(args.name)
    if args.json:
        _print_json({"deleted": tag.name, "version": tag.version})
    else:
        print(f"deleted tag {tag.name!r} (was version {tag.version})")
    return EXIT_OK


def _cmd_rollback(store: Store, args: argparse.Namespace) -> int:
    latest = store.manifest()
    target = store.manifest(args.ref)
    if target.version in store.expired_versions():
        store.snapshot(target.version)  # raises VersionExpiredError with the details
    _confirm(
        args,
        f"Roll {store.uri} back from version {latest.version} ({latest.num_samples:,} samples) "
        f"to the content of version {target.version} ({target.num_samples:,} samples)?",
    )
    commit = store.rollback(target.version, message=args.message, expected_version=latest.version)
    if args.json:
        _print_json(_commit_json(commit))
    else:
        print(
            f"version {commit.version}: the samples of version {target.version} "
            f"({commit.total_samples:,}, {commit.num_samples:+,})"
        )
    return EXIT_OK


def _cmd_expire(store: Store, args: argparse.Namespace) -> int:
    if args.keep_last is None and args.older_than is None:
        raise ValueError("expire needs --keep-last, --older-than or both")
    plan = store.expire(keep_last=args.keep_last, older_than=args.older_than, dry_run=True)
    report = plan
    if plan.expired and not args.dry_run:
        _confirm(
            args,
            f"Expire {len(plan.expired):,} version(s) of {store.uri} ({_ranges(plan.expired)})?",
        )
        report = store.expire(keep_last=args.keep_last, older_than=args.older_than)
    if args.json:
        _print_json(
            {
                "expired": report.expired,
                "protected": report.protected,
                "latest": report.latest,
                "dry_run": args.dry_run,
            }
        )
        return EXIT_OK
    verb = "would expire" if args.dry_run else "expired"
    print(f"{verb} {len(report.expired):,} version(s): {_ranges(report.expired) or 'none'}")
    for v, keys in sorted(report.protected.items()):
        print(f"  kept version {v}: {', '.join(keys)}")
    if report.expired and not args.dry_run:
        print("nothing is deleted until `txstore vacuum`")
    return EXIT_OK


def _ranges(versions: Sequence[int]) -> str:
    parts: list[str] = []
    start = prev = None
    for v in [*versions, None]:
        if v is not None and prev is not None and v == prev + 1:
            prev = v
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = v
    return ", ".join(parts)


def _cmd_vacuum(store: Store, args: argparse.Namespace) -> int:
    progress = _progress(args)
    if args.yes and not args.dry_run:  # no question to ask: one pass, not a plan and a run
        report = store.vacuum(grace=args.grace, progress=progress)
    else:
        report = store.vacuum(grace=args.grace, dry_run=True, progress=progress)
    if report.dry_run and report.files and not args.dry_run:
        _confirm(
            args,
            f"Delete {len(report.files):,} file(s), {_bytes(report.bytes)}, from {store.uri} "
            f"(files older than {format_duration(report.grace)} that no kept version needs)?",
        )
        report = store.vacuum(grace=args.grace, progress=progress)
    now = time.time()
    if args.json:
        _print_json(
            {
                "dry_run": report.dry_run,
                "grace_seconds": report.grace,
                "files": [{"key": f.key, "bytes": f.size, "mtime": f.mtime} for f in report.files],
                "count": len(report.files),
                "bytes": report.bytes,
                "kept_versions": report.kept_versions,
                "expired_versions": report.expired_versions,
            }
        )
        return EXIT_OK
    if report.dry_run and report.files:
        _table(
            ["file", "bytes", "age"],
            [
                [f.key, f"{f.size:,}", format_duration(round(max(0.0, now - f.mtime)))]
                for f in report.files
            ],
            "bytes,age",
        )
    verb = "would delete" if report.dry_run else "deleted"
    what = f"{verb} {len(report.files):,} file(s)" if report.files else "nothing to delete"
    print(
        f"{what}, {_bytes(report.bytes)} "
        f"(grace {format_duration(report.grace)}; {report.kept_versions:,} versions kept, "
        f"{report.expired_versions:,} expired)"
    )
    return EXIT_OK


def _cmd_compact(store: Store, args: argparse.Namespace) -> int:
    plan = store.compact(dry_run=True)
    result = plan
    if plan.runs and not args.dry_run:
        _confirm(
            args,
            f"Rewrite {sum(r.chunks for r in plan.runs):,} undersized chunks "
            f"({_bytes(plan.bytes_rewritten)}, {plan.samples_rewritten:,} samples) of version "
            f"{plan.source} into about {sum(r.target_chunks for r in plan.runs):,}?",
        )
        result = store.compact(message=args.message, progress=_progress(args))
    if args.json:
        _print_json(
            {
                "dry_run": args.dry_run,
                "source": result.source,
                "commit": _commit_json(result.commit) if result.commit else None,
                "chunks_before": result.chunks_before,
                "chunks_after": result.chunks_after,
                "bytes_rewritten": result.bytes_rewritten,
                "samples_rewritten": result.samples_rewritten,
            }
        )
        return EXIT_OK
    if not result.runs:
        print(f"nothing to compact: version {result.source} has no runs of undersized chunks")
    elif result.commit is None:
        print(
            f"would rewrite {_bytes(result.bytes_rewritten)} "
            f"({result.samples_rewritten:,} samples): "
            f"{result.chunks_before:,} chunks -> about {result.chunks_after:,}"
        )
    else:
        print(
            f"version {result.commit.version}: {result.chunks_before:,} chunks -> "
            f"{result.chunks_after:,} (version {result.source}'s samples, same order)"
        )
    return EXIT_OK


# -- the parser -------------------------------------------------------------------------------


Command = Callable[[Store, argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txstore",
        description="Inspect and operate txstore datasets (local paths, s3://, memory://).",
        epilog=EXAMPLES + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("uri", metavar="URI", help="the store: a path or s3://bucket/prefix")
    common.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec/s3fs option, repeatable: endpoint_url=http://host:9000, key=..., "
        "secret=..., region_name=...",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr")
    confirm = argparse.ArgumentParser(add_help=False)
    confirm.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")

    def add(
        name: str, run: Command, summary: str, *parents: argparse.ArgumentParser, details: str = ""
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            parents=[common, *parents],
            help=summary,
            description=textwrap.fill(f"{summary[0].upper()}{summary[1:]}. {details}", 88),
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(run=run)
        return p

    p = add("log", _cmd_log, "the commit history, newest first")
    p.add_argument("--limit", type=int, default=None, help="show at most N commits")
    p = add("show", _cmd_show, "one commit in detail: operation, samples, tags, leases, files")
    p.add_argument("ref", metavar="VERSION", help="a version number or tag")
    p = add("info", _cmd_info, "size and settings of a version")
    p.add_argument("--version", default=None, metavar="VERSION", help="default: the latest")
    p = add("ls", _cmd_ls, "the chunk files of a version, with samples and bytes")
    p.add_argument("--version", default=None, metavar="VERSION", help="default: the latest")
    p = add("cat", _cmd_cat, "print one sample")
    p.add_argument("index", type=int, help="sample index (negative counts from the end)")
    p.add_argument("--version", default=None, metavar="VERSION", help="default: the latest")
    p = add(
        "diff",
        _cmd_diff,
        "the commits between two versions and the samples added and removed",
        details="Samples are given as index ranges, with the append (and txn_id) that added them.",
    )
    p.add_argument("a", metavar="A", help="the version to compare from")
    p.add_argument("b", metavar="B", help="the version to compare to")
    add("tags", _cmd_tags, "list tags")
    p = add(
        "tag",
        _cmd_tag,
        "name a version; a tagged version never expires",
        details="An existing tag is moved only with --force.",
    )
    p.add_argument("name", help="letters, digits, '_', '.', '-'; not all digits")
    p.add_argument("ref", metavar="VERSION", nargs="?", default=None, help="default: the latest")
    p.add_argument("-m", "--message", default=None, help="why this version matters")
    p.add_argument("--force", action="store_true", help="move the tag if it exists")
    p = add("untag", _cmd_untag, "delete a tag", confirm)
    p.add_argument("name")
    add("leases", _cmd_leases, "list leases (running jobs' pins on versions)")
    p = add(
        "rollback",
        _cmd_rollback,
        "commit a new version with the samples of an earlier one",
        confirm,
        details="History stays: later versions remain readable. Fails with exit code 4 if "
        "anything is committed between the prompt and the rollback.",
    )
    p.add_argument("ref", metavar="VERSION", help="the version (or tag) whose samples to restore")
    p.add_argument("-m", "--message", default=None, help="why (shown in the log)")
    p = add(
        "expire",
        _cmd_expire,
        "mark old versions expired (deletes nothing; vacuum does)",
        confirm,
        details="The latest, tagged and leased versions never expire. With both options, a "
        "version must meet both.",
    )
    p.add_argument(
        "--keep-last", type=int, default=None, metavar="N", help="keep the newest N versions"
    )
    p.add_argument(
        "--older-than",
        default=None,
        metavar="AGE",
        help="expire only versions older than AGE (30d, 12h)",
    )
    p.add_argument("--dry-run", action="store_true", help="show what would expire")
    p = add(
        "vacuum",
        _cmd_vacuum,
        "delete files that no kept version needs",
        confirm,
        details="Only files older than the grace period go, so writers still at work and "
        "readers of just-expired versions are safe. Safe while others append.",
    )
    p.add_argument(
        "--grace", default="7d", metavar="AGE", help="default 7d; must exceed your longest append"
    )
    p.add_argument("--dry-run", action="store_true", help="list the files and bytes that would go")
    p = add(
        "compact",
        _cmd_compact,
        "rewrite runs of undersized chunks into full ones, as a new version",
        confirm,
        details="Same samples, same order; appends committed meanwhile are kept.",
    )
    p.add_argument("-m", "--message", default=None, help="the commit message")
    p.add_argument("--dry-run", action="store_true", help="show what would be rewritten")
    p = add(
        "verify",
        _cmd_verify,
        "check every file unexpired versions need: present, size, checksums",
        details="Exit code 3 if anything is damaged. Also counts unreferenced files.",
    )
    p.add_argument("--deep", action="store_true", help="also decode every sample")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with open_store(args.uri, storage_options=_options(args.storage_option)) as store:
            code: int = args.run(store, args)
        return code
    except _NotConfirmed as e:
        print(f"txstore: {e}", file=sys.stderr)
        return EXIT_NOT_CONFIRMED
    except ConflictError as e:
        print(f"txstore: conflict: {e}", file=sys.stderr)
        return EXIT_CONFLICT
    except ValueError as e:  # bad arguments found past the parser (a size, a name)
        print(f"txstore: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (TxstoreError, IndexError) as e:
        print(f"txstore: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("txstore: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
