"""``txstore import litdata|mds|parquet SRC DEST`` and ``txstore export parquet|litdata|mds
URI DEST``: bring a dataset in as one commit, or write a version out for another tool.

Unlike the other commands, these do not open one store before running: an import's DEST may
not exist yet (``--mode`` says what to do when it does), and its SRC is not a store.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..interop.imports import import_litdata, import_mds, import_parquet
from ..storage import open_storage
from ..store import open as open_store
from ..store.core import Commit
from ..store.exports import Export, export_litdata, export_mds, export_parquet
from .output import (
    EPILOG,
    EXIT_OK,
    _argument,
    _bytes,
    _commit_json,
    _option_pair,
    _options,
    _print_json,
    _progress,
    _UsageError,
)

_IMPORTERS: dict[str, Callable[..., Commit]] = {
    "litdata": import_litdata,
    "mds": import_mds,
    "parquet": import_parquet,
}
_EXPORTERS: dict[str, Callable[..., Export]] = {
    "parquet": export_parquet,
    "litdata": export_litdata,
    "mds": export_mds,
}


def _flags() -> argparse.ArgumentParser:
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--storage-option",
        action="append",
        default=[],
        type=_argument(_option_pair),
        metavar="KEY=VALUE",
        help="an option of DEST's object store, repeatable (endpoint_url=..., key=...)",
    )
    flags.add_argument(
        "--src-storage-option",
        action="append",
        default=[],
        type=_argument(_option_pair),
        metavar="KEY=VALUE",
        help="an option of SRC's (or URI's) object store, repeatable",
    )
    flags.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    flags.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    flags.add_argument(
        "--progress",
        action="store_true",
        help="progress on stderr even when it is not a terminal (plain lines, 10 s apart)",
    )
    return flags


def add_commands(sub: Any) -> None:
    """Add ``import`` and ``export`` to the command line's subcommands."""
    flags = _flags()
    p = sub.add_parser(
        "import",
        help="import a LitData, MDS or Parquet dataset as one commit",
        description="Import a dataset another tool wrote into the store at DEST as one "
        "commit: a LitData folder (litdata.optimize), a MosaicML MDS folder (MDSWriter), or "
        "Parquet files (a file, a folder or a glob). Images keep their stored bytes; a "
        "pickled column is refused.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", choices=sorted(_IMPORTERS), help="the source's format")
    p.add_argument("src", metavar="SRC", help="the dataset: a path or URI (a glob for parquet)")
    p.add_argument("dest", metavar="DEST", help="the store: a path or URI")
    p.add_argument(
        "--mode",
        choices=["append", "overwrite"],
        default=None,
        help="when DEST is a store: add a version (append) or commit one holding only these "
        "samples (overwrite); without it an existing store is refused",
    )
    p.add_argument("--num-workers", type=int, default=None, help="default: one per two cores")
    p.add_argument("-m", "--message", default=None, help="the commit message")
    p.add_argument("--txn-id", default=None, help="an id that makes a retried import commit once")
    for action in flags._actions:
        p._add_action(action)
    p.set_defaults(plain=_cmd_import)

    p = sub.add_parser(
        "export",
        help="write a version as Parquet, LitData or MDS files",
        description="Write a version of the store at URI to the new or empty folder DEST in "
        "another tool's format: Parquet files, a LitData dataset (litdata.StreamingDataset "
        "reads it) or an MDS dataset (streaming.StreamingDataset reads it).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", choices=sorted(_EXPORTERS), help="the format to write")
    p.add_argument("uri", metavar="URI", help="the store")
    p.add_argument("dest", metavar="DEST", help="the folder to write: a path or URI")
    p.add_argument("--version", default=None, metavar="VERSION", help="default: the latest")
    for action in flags._actions:
        p._add_action(action)
    p.set_defaults(plain=_cmd_export)


def _opts(pairs: list[str], uri: str) -> dict[str, Any] | None:
    if pairs and "://" not in uri:
        raise _UsageError(f"storage options only apply to remote stores, not {uri!r}")
    return _options(pairs, uri)


def _cmd_import(args: argparse.Namespace) -> int:
    dest_options = _opts(args.storage_option, args.dest)
    src_options = _opts(args.src_storage_option, args.src)
    try:
        open_storage(args.dest, dest_options)
    except ValueError as e:
        raise _UsageError(str(e)) from None
    commit = _IMPORTERS[args.kind](
        args.src,
        args.dest,
        mode=args.mode,
        num_workers=args.num_workers,
        storage_options=dest_options,
        src_storage_options=src_options,
        message=args.message,
        txn_id=args.txn_id,
        progress=_progress(args),
    )
    if args.json:
        _print_json(_commit_json(commit))
    else:
        print(
            f"version {commit.version}: {commit.num_samples:+,} samples from {args.kind} "
            f"{args.src} ({commit.total_samples:,} in all)"
        )
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    options = _opts(args.src_storage_option, args.uri)
    dest_options = _opts(args.storage_option, args.dest)
    with open_store(open_storage(args.uri, options)) as store:
        snap = store.snapshot(args.version)
        result = _EXPORTERS[args.kind](
            snap, args.dest, storage_options=dest_options, progress=_progress(args)
        )
    if args.json:
        _print_json(
            {
                "format": result.format,
                "dest": result.uri,
                "version": result.version,
                "num_samples": result.num_samples,
                "files": result.files,
                "bytes": result.bytes,
            }
        )
    else:
        print(
            f"version {result.version}: {result.num_samples:,} samples as {result.format} in "
            f"{result.uri} ({len(result.files):,} files, {_bytes(result.bytes)})"
        )
    return EXIT_OK
