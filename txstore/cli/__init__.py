"""The ``txstore`` command line: inspect and operate a store from a shell or a script.

Human tables by default, ``--json`` for scripts, progress on stderr for long work when
stderr is a terminal (or with ``--progress``), and a prompt (or ``--yes``) before anything
destructive. Exit codes are listed in ``EPILOG``: 2 (bad usage) is only ever about the
arguments given, never about what the store holds.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import textwrap
from collections.abc import Callable, Sequence

from ..errors import ConflictError, CorruptError, TxstoreError
from ..format.units import parse_duration
from ..storage import open_storage
from ..store import open as open_store
from ..store.core import Store
from ..store.refs import check_tag_name
from .interop import add_commands as _add_interop_commands
from .output import (
    EPILOG,
    EXAMPLES,
    EXIT_BROKEN_PIPE,
    EXIT_CONFLICT,
    EXIT_DAMAGED,
    EXIT_ERROR,
    EXIT_NOT_CONFIRMED,
    EXIT_USAGE,
    _argument,
    _at_least_one,
    _NotConfirmed,
    _option_pair,
    _options,
    _UsageError,
)
from .read import (
    _cmd_cat,
    _cmd_diff,
    _cmd_info,
    _cmd_leases,
    _cmd_log,
    _cmd_ls,
    _cmd_show,
    _cmd_tags,
    _cmd_verify,
)
from .write import _cmd_compact, _cmd_expire, _cmd_rollback, _cmd_tag, _cmd_untag, _cmd_vacuum

Command = Callable[[Store, argparse.Namespace], int]

_TAG_NAME = _argument(check_tag_name)
_DURATION = _argument(parse_duration)


def _version() -> str:
    try:
        return importlib.metadata.version("txstore")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (run from a source tree, not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txstore",
        description="Inspect and operate txstore datasets (local paths, s3://, gs://, az://, memory://).",
        epilog=EXAMPLES + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "uri",
        metavar="URI",
        help="the store: a path, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix",
    )
    common.add_argument(
        "--storage-option",
        action="append",
        default=[],
        type=_argument(_option_pair),
        metavar="KEY=VALUE",
        help="an fsspec/s3fs option, repeatable: endpoint_url=http://host:9000, key=..., "
        "secret=..., region_name=...",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    common.add_argument(
        "--progress",
        action="store_true",
        help="progress on stderr even when it is not a terminal (plain lines, 10 s apart)",
    )
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
    p.add_argument("--limit", type=_at_least_one, default=None, help="show at most N commits")
    p = add(
        "show", _cmd_show, "one commit in detail: operation, samples, tags, leases, files, fields"
    )
    p.add_argument("ref", metavar="VERSION", help="a version number or tag")
    p = add("info", _cmd_info, "size, settings and fields of a version")
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
    p.add_argument("name", type=_TAG_NAME, help="letters, digits, '_', '.', '-'; not all digits")
    p.add_argument("ref", metavar="VERSION", nargs="?", default=None, help="default: the latest")
    p.add_argument("-m", "--message", default=None, help="why this version matters")
    p.add_argument("--force", action="store_true", help="move the tag if it exists")
    p = add("untag", _cmd_untag, "delete a tag", confirm)
    p.add_argument("name", type=_TAG_NAME)
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
        "--keep-last",
        type=_at_least_one,
        default=None,
        metavar="N",
        help="keep the newest N versions",
    )
    p.add_argument(
        "--older-than",
        default=None,
        type=_DURATION,
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
        "--grace",
        default="7d",
        type=_DURATION,
        metavar="AGE",
        help="default 7d; must exceed your longest append",
    )
    p.add_argument("--dry-run", action="store_true", help="list the files and bytes that would go")
    p.add_argument(
        "--incremental",
        action="store_true",
        help="only what versions stopped naming since the last incremental vacuum (fast; "
        "never finds abandoned files: run without it now and then)",
    )
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
        "check the chain of versions, the refs, and every file unexpired versions need",
        details="By default every byte of every data file is read and checked against its "
        "checksums; --quick reads only the metadata and each file's footer. Exit code 3 if "
        "anything is damaged. Also counts unreferenced files.",
    )
    level = p.add_mutually_exclusive_group()
    level.add_argument(
        "--quick", action="store_true", help="metadata and footers only: chunk bytes are not read"
    )
    level.add_argument("--deep", action="store_true", help="also decode every sample")
    _add_interop_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # here, where a closed pipe can be handled, not at exit
    except BrokenPipeError:
        # The reader left (``txstore ls X | head -1``): stop quietly, as programs killed by
        # SIGPIPE do, and send what is still buffered nowhere so the flush at exit succeeds.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        plain = getattr(args, "plain", None)
        if plain is not None:  # import and export: no one store to open first
            return int(plain(args))
        try:  # the URI and options are the user's: anything wrong with them is bad usage
            storage = open_storage(args.uri, _options(args.storage_option, args.uri))
        except ValueError as e:
            raise _UsageError(str(e)) from None
        with open_store(storage) as store:
            code: int = args.run(store, args)
        return code
    except _UsageError as e:
        print(f"txstore: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except _NotConfirmed as e:
        print(f"txstore: {e}", file=sys.stderr)
        return EXIT_NOT_CONFIRMED
    except ConflictError as e:
        print(f"txstore: conflict: {e}", file=sys.stderr)
        return EXIT_CONFLICT
    except CorruptError as e:  # damaged or unsafe stored data: the message names the file
        print(f"txstore: damaged: {e}", file=sys.stderr)
        return EXIT_DAMAGED
    # A ValueError or OverflowError past the parser is not about the arguments (those are
    # checked above): it comes from what the store holds, so it is an error, not bad usage.
    except (TxstoreError, ValueError, OverflowError, IndexError) as e:
        print(f"txstore: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("txstore: interrupted", file=sys.stderr)
        return 130
