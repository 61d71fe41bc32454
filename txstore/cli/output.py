"""Output helpers of the command line: tables, JSON, progress, prompts, exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from ..store.history import Commit
from ..store.progress import Progress

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DAMAGED, EXIT_CONFLICT, EXIT_NOT_CONFIRMED = 0, 1, 2, 3, 4, 5
#: What a shell reports for a program killed by SIGPIPE (128 + 13): the reader of stdout left.
EXIT_BROKEN_PIPE = 141

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
  1  error (store, version or tag not found, storage failure)
  2  bad usage (the arguments given)
  3  damage: verify found some, or a command met damaged or unsafe stored data
  4  conflict: someone committed meanwhile and nothing was changed; look, then retry
  5  not confirmed: a destructive command was declined, or had no --yes without a terminal

VERSION arguments take a version number or a tag name.
"""


class _NotConfirmed(Exception):
    pass


class _UsageError(Exception):
    """The arguments given cannot work (exit code 2); never raised for what the store holds."""


def _argument(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type that checks a value with ``check`` (which raises ValueError) and keeps
    the text: argparse then reports the error as bad usage, with the check's message."""

    def parse(text: str) -> str:
        try:
            check(text)
        except (ValueError, TypeError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text

    return parse


def _option_pair(text: str) -> None:
    if "=" not in text:
        raise ValueError(f"--storage-option takes key=value, got {text!r}")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _options(pairs: list[str], uri: str = "s3://") -> dict[str, Any] | None:
    options: dict[str, Any] = {}
    s3 = uri.startswith("s3://")
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise _UsageError(f"--storage-option takes key=value, got {pair!r}")
        if not s3:  # gcsfs and adlfs take every option, endpoint_url too, as it is
            options[key] = value
        elif key == "endpoint_url":  # s3fs wants the endpoint inside client_kwargs
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
    try:
        return f"{ts.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S}"
    except (OverflowError, OSError, ValueError):  # a time stored out of range: show, not fail
        return str(ts)


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
        # tries this process's commit took; null for a commit read back from the history
        "attempts": c.attempts,
    }


def _progress(args: argparse.Namespace) -> Progress:
    """Progress on stderr: a bar on a terminal; with --progress elsewhere too, as plain lines
    (a log, CI); none with --quiet."""
    return Progress(enabled=(sys.stderr.isatty() or args.progress) and not args.quiet)


def _confirm(args: argparse.Namespace, question: str) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise _NotConfirmed(f"{question}\nrefusing without --yes (stdin is not a terminal)")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise _NotConfirmed("not confirmed; nothing was changed")
