"""Commands that change a store: each asks first (or takes --yes) when it destroys."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from ..format.units import format_duration
from ..store.core import Store
from .output import (
    EXIT_OK,
    _bytes,
    _commit_json,
    _confirm,
    _print_json,
    _progress,
    _table,
    _UsageError,
)


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
    latest = store.commit_info()
    target = store.commit_info(args.ref)
    if target.version == latest.version:
        raise _UsageError(f"version {target.version} is the latest already: nothing to roll back")
    if target.version in store.expired_versions():
        store.snapshot(target.version)  # raises VersionExpiredError with the details
    _confirm(
        args,
        f"Roll {store.uri} back from version {latest.version} ({latest.total_samples:,} samples) "
        f"to the content of version {target.version} ({target.total_samples:,} samples)?",
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
        raise _UsageError("expire needs --keep-last, --older-than or both")
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
        report = store.vacuum(grace=args.grace, progress=progress, incremental=args.incremental)
    else:
        report = store.vacuum(
            grace=args.grace, dry_run=True, progress=progress, incremental=args.incremental
        )
    if report.dry_run and report.files and not args.dry_run:
        _confirm(
            args,
            f"Delete {len(report.files):,} file(s), {_bytes(report.bytes)}, from {store.uri} "
            f"(files older than {format_duration(report.grace)} that no kept version needs)?",
        )
        report = store.vacuum(grace=args.grace, progress=progress, incremental=args.incremental)
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
