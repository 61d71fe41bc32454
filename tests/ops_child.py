"""Entry points run in child processes by the operations tests (tests/test_ops_concurrency.py)."""

from __future__ import annotations

import json
import os
import sys

import txstore


def batch(tag: str, n: int) -> list[dict[str, object]]:
    return [{"tag": tag, "i": i, "pad": os.urandom(200)} for i in range(n)]


def append_loop(uri: str, options: dict[str, object], name: str, count: int) -> None:
    """Append ``count`` small batches, one JSON line per outcome (committed or conflict)."""
    store = txstore.open(uri, storage_options=options or None)
    print(json.dumps({"started": True}), flush=True)
    for i in range(count):
        tag = f"{name}-{i}"
        try:
            commit = store.append(batch(tag, 4), message=tag)
        except txstore.ConflictError as e:
            print(json.dumps({"tag": tag, "conflict": str(e)}), flush=True)
            continue
        print(json.dumps({"tag": tag, "version": commit.version}), flush=True)


if __name__ == "__main__":
    command, uri, options_json, *rest = sys.argv[1:]
    if command == "append-loop":
        append_loop(uri, json.loads(options_json), rest[0], int(rest[1]))
    else:
        raise SystemExit(f"unknown command {command}")
