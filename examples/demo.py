"""A tour of txstore on a local store: append, pin, time-travel, exactly-once, bad input.

Run: python examples/demo.py [path]   (default ./demo-store, recreated each run)
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any

import txstore


def captions(day: int, n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {
            "id": day * 1_000_000 + i,
            "caption": f"day {day} photo {i}",
            "jpeg": bytes([day, i % 256]) * 2048,
            "label": i % 10,
        }


def main(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    store = txstore.create(path, chunk_bytes="8MB")
    print(f"created {store.uri}")

    for day in (1, 2, 3):
        t = time.perf_counter()
        c = store.append(captions(day, 20_000), message=f"crawl day {day}")
        print(
            f"  v{c.version}: +{c.num_samples} samples ({c.message}) "
            f"in {time.perf_counter() - t:.2f}s"
        )

    pinned = store.snapshot(2)  # what a training run would pin
    store.append(captions(4, 5_000), message="crawl day 4")
    print(f"pinned {pinned}: still {len(pinned)} samples; latest has {len(store.snapshot())}")
    print(f"pinned[-1]['caption'] = {pinned[-1]['caption']!r}")

    t = time.perf_counter()
    n = sum(1 for _ in store.snapshot())
    print(f"streamed {n} samples in {time.perf_counter() - t:.2f}s")

    again = store.append(captions(5, 10), txn_id="crawl-day-5")
    retry = store.append(captions(5, 10), txn_id="crawl-day-5")  # a retried job
    print(
        f"txn crawl-day-5 committed at v{again.version}; the retry returned "
        f"v{retry.version} and wrote nothing"
    )

    try:
        store.append([{"id": 1}, {"id": 2, "when": object()}])
    except txstore.EncodeError as e:
        print(f"refused a bad sample, store unchanged at v{store.version}: {e}")

    bad = store.append(({"id": -i, "caption": "spam"} for i in range(1000)), message="bad crawl")
    undo = store.rollback(bad.version - 1, message="undo the bad crawl")
    print(
        f"rolled back the bad crawl (v{bad.version}) as v{undo.version}: "
        f"{len(store.snapshot())} samples; v{bad.version} is still readable"
    )

    added = store.add_fields(
        lambda s: {"caption_len": len(s["caption"])}, ["caption_len"], message="caption lengths"
    )
    print(
        f"v{added.version} adds 'caption_len' to every sample without rewriting a chunk: "
        f"{store.snapshot()[0]}"[:160]
    )

    print("history, newest first:")
    for commit in store.log():
        print(
            f"  v{commit.version:<3} {commit.timestamp:%H:%M:%S} {commit.operation:<10} "
            f"{commit.num_samples:>+7} {commit.message or ''}"
        )
    print(f"\nthe same from a shell: txstore log {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo-store")
