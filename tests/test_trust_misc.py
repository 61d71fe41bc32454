"""Smaller trust rules: what a caller may ask that would write a record no reader accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

import txstore
from txstore.format import manifest as fmt
from txstore.format.manifest import LeaseRecord


@pytest.mark.parametrize("ttl", ["10000w", 1e300, float("inf")])
def test_a_lease_longer_than_a_year_is_refused_before_anything_is_written(
    tmp_path: Path, ttl: object
) -> None:
    store = txstore.create(str(tmp_path / "store"))
    store.append([{"id": 1}])
    with pytest.raises(ValueError, match="tag it"):
        store.lease(ttl=ttl)  # type: ignore[arg-type]
    assert store.leases() == []  # no record was written that would read back as damage


def test_a_year_long_lease_reads_back(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "store"))
    store.append([{"id": 1}])
    with store.lease(ttl="52w") as lease:
        (info,) = store.leases()
        assert info.id == lease.id and info.active
        data = store.storage.read(f"refs/leases/{lease.id}.json")
        assert fmt.decode(data, LeaseRecord, "lease").version == 1
