"""The ``txstore`` command line: look at a store from a shell.

Exit codes: 0 success, 1 a txstore error (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from . import open as open_store
from .errors import TxstoreError
from .store import Commit, Store


def _options(pairs: list[str]) -> dict[str, Any] | None:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--storage-option takes key=value, got {pair!r}")
        if key == "endpoint_url":  # s3fs wants the endpoint inside client_kwargs
            options.setdefault("client_kwargs", {})["endpoint_url"] = value
        else:
            options[key] = value
    return options or None


def _commit_json(c: Commit) -> dict[str, Any]:
    return {
        "version": c.version,
        "timestamp": c.timestamp.isoformat(),
        "operation": c.operation,
        "num_samples": c.num_samples,
        "total_samples": c.total_samples,
        "message": c.message,
        "txn_id": c.txn_id,
    }


def _cmd_log(store: Store, args: argparse.Namespace) -> None:
    commits = store.log(limit=args.limit)
    if args.json:
        print(json.dumps([_commit_json(c) for c in commits], indent=2))
        return
    print(f"{'version':>7}  {'time (UTC)':19}  {'op':9}  {'added':>9}  {'total':>11}  message")
    for c in commits:
        print(
            f"{c.version:>7}  {c.timestamp:%Y-%m-%d %H:%M:%S}  {c.operation:9}  "
            f"{c.num_samples:>9,}  {c.total_samples:>11,}  {c.message or ''}"
        )


def _cmd_info(store: Store, args: argparse.Namespace) -> None:
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
        print(json.dumps(info, indent=2))
        return
    for key, value in info.items():
        print(f"{key:>9}: {value:,}" if isinstance(value, int) else f"{key:>9}: {value}")


def _cmd_show(store: Store, args: argparse.Namespace) -> None:
    sample = store.snapshot(args.version)[args.index]
    if args.json:
        print(json.dumps({k: _jsonable(v) for k, v in sample.items()}, indent=2))
        return
    for key, value in sample.items():
        print(f"{key}: {_describe(value)}")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txstore",
        description="Inspect and operate txstore datasets.",
        epilog="Exit codes: 0 success, 1 txstore error, 2 usage error.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("uri", help="store location: a path, s3://bucket/prefix")
    common.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option, e.g. endpoint_url=http://127.0.0.1:9000",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("log", parents=[common], help="the commit history, newest first")
    p.add_argument("--limit", type=int, default=None, help="show at most N commits")
    p.set_defaults(run=_cmd_log)
    p = sub.add_parser("info", parents=[common], help="size and settings of a version")
    p.add_argument("--version", type=int, default=None, help="default: the latest")
    p.set_defaults(run=_cmd_info)
    p = sub.add_parser("show", parents=[common], help="print one sample")
    p.add_argument("index", type=int, help="sample index (negative counts from the end)")
    p.add_argument("--version", type=int, default=None, help="default: the latest")
    p.set_defaults(run=_cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        store = open_store(args.uri, storage_options=_options(args.storage_option))
        args.run(store, args)
    except (TxstoreError, IndexError) as e:
        print(f"txstore: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
