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


def test_a_document_with_invalid_utf8_in_a_string_is_corrupt(tmp_path: Path) -> None:
    """The envelope decodes (its fields hold no such string); the typed decode must not
    escape as msgspec's own error."""
    store = txstore.create(str(tmp_path / "store"))
    store.append([{"id": 1}], message="hello")
    key = "versions/index.v1.json"
    data = store.storage.read(key)
    store.storage.write(key, data.replace(b'"hello"', b'"\xff\xfe"'))
    for read in (
        lambda: txstore.open(store.uri).snapshot(1),
        lambda: txstore.open(store.uri).log(),
    ):
        with pytest.raises(txstore.CorruptError, match=r"index\.v1\.json"):
            read()
    report = txstore.open(store.uri).verify()
    assert any(p.key == key for p in report.problems)


@pytest.mark.parametrize("compression", ["zstd", None])
def test_deep_verify_checks_offset_tables_of_every_kind_of_value(
    tmp_path: Path, compression: str | None
) -> None:
    """A deep verify reads each frame's offset table (a reader of one sample uses nothing
    else): every kind of value the writer makes passes, and a table pointing one value at
    another's bytes, sealed with a valid checksum, is reported."""
    import os

    import numpy as np

    from txstore.format.chunk import parse_footer
    from txstore.format.frames import check_offset_tables, offset_table_error

    store = txstore.create(
        str(tmp_path / "store"), chunk_bytes=200_000, block_bytes=4096, compression=compression
    )
    rows = []
    for i in range(2000):
        row = {
            "id": i,
            "neg": -i,
            "big": 2**40 + i,
            "f": i * 0.5,
            "s": "x" * (i % 50),
            "same": os.urandom(16),
            "v": os.urandom(i % 300),
            "arr": np.arange(i % 7, dtype=np.float32),
            "nest": {"a": [1, {"b": None}], "c": True},
        }
        if i % 3 == 0:
            row["sparse"] = "y"
        rows.append(row)
    store.append(rows)
    store.append([{"id": 1, "img": os.urandom(150_000)}])  # a block of one sample
    store.add_fields(lambda s: {"lat": np.zeros(3)}, ["lat"])
    assert store.verify(deep=True).ok
    chunk = store.snapshot().chunk_refs()[0]
    data = bytearray(store.storage.read(chunk.path))
    layout = parse_footer(bytes(data[chunk.footer_offset :]), chunk.path, chunk.footer_offset)
    check_offset_tables(bytes(data), layout)
    # Offset tables of raw frames, found by the table check itself: swap two entries.
    block = layout.footer.blocks[0]
    n = block.num_samples
    plain = [f for f in block.frames if f.codec == 0 and layout.columns[f.column] == "v"]
    if not plain:
        pytest.skip("no raw frame to forge in this layout")
    frame = plain[0]
    raw = memoryview(bytes(data[frame.offset : frame.offset + frame.length]))
    assert offset_table_error(raw, n) == ""
    table = frame.offset + frame.length - 4 * n
    data[table : table + 4], data[table + 4 : table + 8] = (
        data[table + 4 : table + 8],
        data[table : table + 4],
    )
    forged = memoryview(bytes(data[frame.offset : frame.offset + frame.length]))
    assert "gives value 0" in offset_table_error(forged, n)
