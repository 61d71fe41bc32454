"""Commands that only read a store."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from ..store.core import Store
from ..store.history import Diff
from ..store.views import FieldSchema, Schema
from .output import (
    EXIT_DAMAGED,
    EXIT_OK,
    _bytes,
    _commit_json,
    _print_json,
    _progress,
    _table,
    _when,
)


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
    commit = store.commit_info(args.ref)
    v = commit.version
    expired = v in store.expired_versions()
    info: dict[str, Any] = {
        **_commit_json(commit),
        "parent": commit.parent,
        "source_version": commit.source_version,
        "expired": expired,
        "tags": [t.name for t in store.tags().values() if t.version == v],
        "leases": [
            {"id": lease.id, "expires_at": lease.expires_at.isoformat(), "owner": lease.owner}
            for lease in store.leases()
            if lease.version == v and lease.active
        ],
        "config": dataclasses.asdict(store.config),
    }
    schema = None
    if not expired:
        snap = store.snapshot(v)
        chunks = snap.chunks()
        info["segments"] = len(snap.manifest.segments)
        info["chunks"] = len(chunks)
        info["bytes"] = sum(c.total_size for c in chunks)
        schema = snap.schema()
        info["fields"] = schema.to_dict()["fields"]
    if args.json:
        _print_json(info)
        return EXIT_OK
    print(f"version {v}  ({commit.operation}, commit {commit.commit_id})")
    print(f"date:       {_when(commit.timestamp)} UTC")
    if commit.parent is not None:
        print(f"parent:     {commit.parent}")
    if commit.source_version is not None:
        print(f"source:     version {commit.source_version}")
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
    if schema is not None:
        _print_schema(schema)
    return EXIT_OK


def _runs(ranges: Sequence[tuple[int, int]], limit: int = 4) -> str:
    """Runs of samples as people read them: "0-7,999, 8,500-8,999" (the first few)."""
    shown = [f"{a:,}" if b == a + 1 else f"{a:,}-{b - 1:,}" for a, b in ranges[:limit]]
    if len(ranges) > limit:
        shown.append(f"... ({len(ranges):,} runs)")
    return ", ".join(shown)


def _versions(field: FieldSchema) -> str:
    said = [f"v{a}" if a == b else f"v{a}-{b}" for a, b in field.versions]
    if field.partly:
        said.append("in part " + ", ".join(f"v{v}" for v in field.partly))
    return ", ".join(said)


def _print_schema(schema: Schema) -> None:
    if not schema.fields:
        print("fields:     none")
        return
    print("fields:")
    rows = [
        [
            f.name,
            f.type,
            f"{f.count:,}",
            "all" if f.complete else _runs(f.ranges),
            _versions(f),
        ]
        for f in schema.fields
    ]
    cells = [["  name", "type", "samples", "which", "appended by"]] + [
        ["  " + r[0], *r[1:]] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(5)]
    for row in cells:
        print(
            "  ".join(
                c.rjust(w) if i == 2 else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )


def _cmd_info(store: Store, args: argparse.Namespace) -> int:
    snap = store.snapshot(args.version)
    chunks = snap.chunks()
    schema = snap.schema()
    info: dict[str, Any] = {
        "uri": store.uri,
        "version": snap.version,
        "samples": len(snap),
        "chunks": len(chunks),
        "bytes": sum(c.size for c in chunks),
        "segments": len(snap.manifest.segments),
        "config": dataclasses.asdict(snap.config),
    }
    if args.json:
        _print_json({**info, "fields": schema.to_dict()["fields"]})
        return EXIT_OK
    for key, value in info.items():
        print(f"{key:>9}: {value:,}" if isinstance(value, int) else f"{key:>9}: {value}")
    _print_schema(schema)
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


_READ = {
    "quick": "metadata and footers only: chunk contents were NOT read (run without --quick "
    "to read them)",
    "contents": "every byte of every data file read and checked against its checksums; "
    "samples not decoded (--deep decodes them)",
    "deep": "every byte of every data file read and checked, every sample decoded",
}


def _cmd_verify(store: Store, args: argparse.Namespace) -> int:
    report = store.verify(quick=args.quick, deep=args.deep, progress=_progress(args))
    if args.json:
        _print_json(
            {
                "ok": report.ok,
                "level": report.level,
                "contents_checked": report.contents_checked,
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
        print(f"read: {_READ[report.level]}")
        print(
            f"unreferenced files (vacuum reclaims them): {len(report.orphans):,}, "
            f"{_bytes(report.orphan_bytes)}"
        )
        if report.ok and report.contents_checked:
            print("ok: no damage found")
        elif report.ok:
            print("ok: no damage found in the metadata (chunk contents not read)")
        else:
            print(f"DAMAGED: {len(report.problems)} problem(s)")
            for p in report.problems:
                print(f"  {p.key}: {p.message}")
    return EXIT_OK if report.ok else EXIT_DAMAGED
