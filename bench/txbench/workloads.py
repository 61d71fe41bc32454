"""The two workloads and the pre-generated random payloads every contender consumes."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

T = TypeVar("T")

Sample = dict[str, Any]

MB = 1_000_000
CHUNK_BYTES = 64 * 2**20
POOL_BLOCK_BYTES = 64 * 2**20
QUICK_FACTOR = 10


@dataclass(frozen=True)
class Workload:
    name: str
    num_samples: int
    payload_field: str
    payload_size: int
    with_label: bool

    @property
    def payload_bytes(self) -> int:
        return self.num_samples * self.payload_size

    @property
    def mds_columns(self) -> dict[str, str]:
        columns = {"id": "int", self.payload_field: "bytes"}
        if self.with_label:
            columns["label"] = "int"
        return columns

    def describe(self) -> str:
        fields = f"id: int, {self.payload_field}: {self.payload_size} B bytes"
        if self.with_label:
            fields += ", label: int"
        return f"{self.name}: {self.num_samples:,} samples of {{{fields}}}"


WORKLOADS = (
    Workload("W1", 200_000, "tokens", 2 * 1024, with_label=False),
    Workload("W2", 20_000, "jpeg", 100 * 1024, with_label=True),
)


def scaled(workload: Workload, quick: bool) -> Workload:
    """``--quick``: the workload with 10x fewer samples."""
    if not quick:
        return workload
    return replace(workload, num_samples=workload.num_samples // QUICK_FACTOR)


def selected(names: str, items: Sequence[T], attr: str) -> list[T]:
    """The items whose ``attr`` is in the comma-separated ``names``, in their own order."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = set(wanted) - {getattr(i, attr) for i in items}
    if unknown:
        raise SystemExit(f"unknown: {', '.join(sorted(unknown))}")
    return [i for i in items if getattr(i, attr) in wanted]


def random_payloads(count: int, size: int) -> Iterator[bytes]:
    """Distinct random payloads, sliced out of 64 MiB os.urandom blocks."""
    per_block = max(1, POOL_BLOCK_BYTES // size)
    for start in range(0, count, per_block):
        n = min(per_block, count - start)
        block = os.urandom(n * size)
        for k in range(n):
            yield block[k * size : (k + 1) * size]


class Pool:
    """Distinct random payloads, sliced on demand out of 64 MiB os.urandom blocks."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self.per_block = max(1, POOL_BLOCK_BYTES // size)
        blocks = -(-count // self.per_block)
        self.blocks = [os.urandom(self.per_block * size) for _ in range(blocks)]

    def payload(self, index: int) -> bytes:
        block, k = divmod(index, self.per_block)
        return self.blocks[block][k * self.size : (k + 1) * self.size]


def make_sample(workload: Workload, index: int, payload: bytes) -> Sample:
    sample: Sample = {"id": index, workload.payload_field: payload}
    if workload.with_label:
        sample["label"] = index % 1000
    return sample


def make_samples(workload: Workload) -> list[Sample]:
    payloads = random_payloads(workload.num_samples, workload.payload_size)
    return [make_sample(workload, i, p) for i, p in enumerate(payloads)]


def iter_samples(samples: Sequence[Sample]) -> Iterator[Sample]:
    """What every writer consumes: a generator over pre-built samples."""
    yield from samples
