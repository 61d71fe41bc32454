"""Entry points run in child processes by the race and crash tests."""

from __future__ import annotations

import json
import sys

import txstore
from txstore.storage import open_storage

from .faults import FaultyStorage


def batch(tag: str, n: int) -> list[dict[str, object]]:
    return [{"tag": tag, "i": i, "pad": bytes(64)} for i in range(n)]


def append_many(uri: str, options: dict[str, object], writer: int, count: int) -> None:
    store = txstore.open(uri, storage_options=options or None)
    for i in range(count):
        commit = store.append(batch(f"w{writer}-{i}", 3), message=f"w{writer}-{i}")
        print(json.dumps({"tag": f"w{writer}-{i}", "version": commit.version}), flush=True)


def append_with_fault(
    uri: str, options: dict[str, object], tag: str, fail_at: int, mode: str
) -> None:
    storage = FaultyStorage(open_storage(uri, options or None), fail_at=fail_at, mode=mode)
    store = txstore.open(storage)
    try:
        commit = store.append(batch(tag, 5), txn_id=tag)
    except txstore.TxstoreError as e:
        print(json.dumps({"error": type(e).__name__, "calls": len(storage.calls)}), flush=True)
        return
    print(json.dumps({"version": commit.version, "calls": len(storage.calls)}), flush=True)


if __name__ == "__main__":
    command, uri, options_json, *rest = sys.argv[1:]
    options = json.loads(options_json)
    if command == "append-many":
        append_many(uri, options, int(rest[0]), int(rest[1]))
    elif command == "append-with-fault":
        append_with_fault(uri, options, rest[0], int(rest[1]), rest[2])
    else:
        raise SystemExit(f"unknown command {command}")
