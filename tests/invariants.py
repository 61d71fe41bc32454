"""Invariants of a store's history, shared by the race, model, network, soak and teeth tests.

The checks return violations (strings) instead of asserting, so that tests of the tests
(test_teeth.py) can show that a deliberately broken store is caught by the very same code.

Convention: a transaction ``tag`` appends ``txn_samples(tag, n)``, whose samples carry the tag,
their index and their count, and uses the tag as its ``txn_id`` (or no txn_id at all). So the
samples a version adds say which transaction made it and whether all of it is there.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import txstore


def txn_samples(tag: str, n: int, pad: int = 32) -> list[dict[str, Any]]:
    return [{"tag": tag, "i": i, "n": n, "pad": bytes(pad)} for i in range(n)]


@dataclass(frozen=True)
class Ack:
    """An append that returned: its transaction, the version it reported, and when.

    ``start`` is when its first attempt began (a retry after a crash keeps the first start),
    ``end`` when it returned; both ``time.monotonic_ns()``, which is one clock for every
    process of the machine.
    """

    tag: str
    version: int
    start: int = 0
    end: int = 0


@dataclass(frozen=True)
class Read:
    """A reader's look at the latest version (``error`` set if the read failed)."""

    reader: str
    version: int
    start: int
    end: int
    error: str | None = None


@dataclass
class History:
    latest: int = -1
    #: per version: the transaction whose samples it added (None for version 0)
    tags: list[str | None] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # the latest version's
    violations: list[str] = field(default_factory=list)

    def version_of(self, tag: str) -> int | None:
        return self.tags.index(tag) if tag in self.tags else None


def _added_txn(v: int, added: Sequence[dict[str, Any]], out: list[str]) -> str | None:
    """The one transaction whose samples version ``v`` added, or None (with a violation)."""
    if not added:
        out.append(f"version {v} adds no samples")
        return None
    tag = added[0].get("tag")
    n = added[0].get("n")
    expected = [(tag, i, n) for i in range(n if isinstance(n, int) else 0)]
    got = [(s.get("tag"), s.get("i"), s.get("n")) for s in added]
    if got != expected:
        tags = sorted({str(s.get("tag")) for s in added})
        out.append(f"version {v} is not exactly one whole transaction: tags {tags[:5]}")
        return None
    return str(tag)


def read_history(store: txstore.Store, first: int = 0) -> History:
    """Read every version; check each is its parent plus exactly one whole transaction.

    With ``first``, versions before it are taken as checked already (their tags are None):
    incremental checks of a long history read only its new part.
    """
    h = History()
    try:
        h.latest = store.version
        base = store.snapshot(first - 1) if first else None
        skip = len(base) if base is not None else 0
        h.samples = store.snapshot(h.latest)[skip:]  # every chunk read, every checksum
        previous = [c.path for c in base.chunks()] if base is not None else []
    except txstore.TxstoreError as e:
        h.violations.append(f"cannot read the latest version: {type(e).__name__}: {e}")
        return h
    h.tags = [None] * first
    for v in range(first, h.latest + 1):
        try:
            snap = store.snapshot(v)
            paths = [c.path for c in snap.chunks()]
        except txstore.TxstoreError as e:  # a gap, a damaged manifest or segment
            h.violations.append(f"version {v}: {type(e).__name__}: {e}")
            h.tags.append(None)
            continue
        m = snap.manifest
        if v and m.parent != v - 1:
            h.violations.append(f"version {v} names parent {m.parent}")
        if paths[: len(previous)] != previous:
            h.violations.append(f"version {v} does not extend its parent's chunks")
        added = h.samples[len(snap) - m.added_samples - skip : len(snap) - skip]
        tag = _added_txn(v, added, h.violations) if v else None
        if tag is not None and m.txn_id not in (None, tag):
            h.violations.append(f"version {v} has txn_id {m.txn_id!r} but samples of {tag!r}")
        h.tags.append(tag)
        previous = paths
    for tag, count in Counter(t for t in h.tags if t is not None).items():
        if count > 1:
            versions = [v for v, t in enumerate(h.tags) if t == tag]
            h.violations.append(f"transaction {tag!r} committed {count} times: {versions}")
    return h


def check_acks(h: History, acks: Iterable[Ack]) -> list[str]:
    """Every acknowledged append is at the version it reported (all reports of a tag agree)."""
    out = []
    for ack in acks:
        if not 0 < ack.version < len(h.tags) or h.tags[ack.version] != ack.tag:
            found = h.version_of(ack.tag)
            out.append(f"{ack.tag!r} was acknowledged at version {ack.version}, is at {found}")
    return out


def check_real_time_order(acks: Sequence[Ack]) -> list[str]:
    """If A returned before B started, then v(A) < v(B) (linearizability of appends)."""
    by_end = sorted(acks, key=lambda a: a.end)
    ends = [a.end for a in by_end]
    best: list[Ack] = []  # best[i]: the ack of highest version among by_end[: i + 1]
    for a in by_end:
        best.append(a if not best or a.version > best[-1].version else best[-1])
    out = []
    for b in acks:
        done = bisect.bisect_left(ends, b.start)  # acks that returned before b started
        if done and best[done - 1].version >= b.version and best[done - 1].tag != b.tag:
            a = best[done - 1]
            out.append(f"{a.tag!r} (v{a.version}) returned before {b.tag!r} (v{b.version}) began")
    return out


def check_reads(acks: Sequence[Ack], reads: Sequence[Read], latest: int) -> list[str]:
    """Reads never fail, never go backwards, and see every append that returned before them."""
    out = [f"reader {r.reader} failed: {r.error}" for r in reads if r.error is not None]
    ok = [r for r in reads if r.error is None]
    by_end = sorted(acks, key=lambda a: a.end)
    ends = [a.end for a in by_end]
    highest: list[int] = []
    for a in by_end:
        highest.append(max(a.version, highest[-1] if highest else 0))
    last_seen: dict[str, int] = {}
    for r in sorted(ok, key=lambda r: r.start):
        done = bisect.bisect_left(ends, r.start)
        if done and highest[done - 1] > r.version:
            out.append(f"a read at v{r.version} began after v{highest[done - 1]} was acknowledged")
        if r.version < last_seen.get(r.reader, 0):
            out.append(f"reader {r.reader} went back from v{last_seen[r.reader]} to v{r.version}")
        if r.version > latest:
            out.append(f"reader {r.reader} saw v{r.version} beyond the latest v{latest}")
        last_seen[r.reader] = max(r.version, last_seen.get(r.reader, 0))
    return out


def violations(
    store: txstore.Store, acks: Sequence[Ack] = (), reads: Sequence[Read] = (), first: int = 0
) -> tuple[History, list[str]]:
    """Every check at once: the history, and what is wrong with it (empty when all is well).

    ``first``: as for ``read_history``; ``acks`` must then be of versions from ``first`` on.
    """
    h = read_history(store, first)
    found = [*h.violations, *check_acks(h, acks)]
    if any(a.end for a in acks):
        found += check_real_time_order(acks)
    found += check_reads(acks, reads, h.latest)
    return h, found
