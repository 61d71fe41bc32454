"""Writes tests/data/format-1.2-store: a store as format 1.2 writes it, kept so that later
formats are tested to read it (tests/test_format_compat.py says what it holds).

Run from the repository root with the txstore of format 1.2:
    PYTHONPATH=. python tests/data/make_format_1_2_store.py
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import txstore
from tests.test_format_compat import FIRST, SECOND, TXN_ID, double, sample

OUT = Path(__file__).parent / "format-1.2-store"


def main() -> int:
    if OUT.exists():
        shutil.rmtree(OUT)
    # Small chunks and blocks: several chunks, blocks and segments from a few samples.
    store = txstore.create(OUT, chunk_bytes="2KiB", block_bytes="512B")
    store.append((sample(i) for i in range(FIRST)), message="first")
    store.append((sample(i) for i in range(FIRST, FIRST + SECOND)), txn_id=TXN_ID)
    store.tag("second", 2)
    store.add_fields(double, ["double"], inputs=["id"], message="doubled")
    # The backend check's record and the lock files: this machine's, not the format's.
    shutil.rmtree(OUT / "checks", ignore_errors=True)
    for lock in OUT.glob(".*.lock"):
        lock.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
