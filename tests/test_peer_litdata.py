"""LitData's own chunk layout read a column at a time (``Layout.classic_batch``) against the
item reader (``Layout.samples``), on chunks built here byte by byte as LitData lays them out
(``[n][n + 1 offsets][items]``, an item a u32 size per leaf then the leaves), whole and
damaged: the columns either give exactly the item reader's samples or are not used."""

from __future__ import annotations

import json
import struct
from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings

from txstore.errors import TxstoreError
from txstore.format import peer_litdata
from txstore.format.columnar import decoded

FORMATS = ["int", "float", "bool", "str", "bytes", "jpeg"]
KEYS = ["id", "x", "ok", "name", "blob", "img"]


def _config() -> dict[str, Any]:
    return {"data_format": FORMATS, "data_spec": peer_litdata.dict_spec(KEYS)}


def _leaves(row: tuple[int, float, bool, str, bytes, bytes]) -> list[bytes]:
    i, x, ok, name, blob, img = row
    return [
        struct.pack("<q", i),
        struct.pack("<d", x),
        bytes([ok]),
        name.encode(),
        blob,
        img,
    ]


def _chunk(rows: list[tuple[int, float, bool, str, bytes, bytes]]) -> bytes:
    items = []
    for row in rows:
        leaves = _leaves(row)
        items.append(struct.pack(f"<{len(leaves)}I", *map(len, leaves)) + b"".join(leaves))
    header = 4 + 4 * (len(rows) + 1)
    offsets = [header]
    for item in items:
        offsets.append(offsets[-1] + len(item))
    return struct.pack(f"<I{len(offsets)}I", len(rows), *offsets) + b"".join(items)


_rows = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
        st.booleans(),
        st.text(max_size=6),
        st.binary(max_size=12),
        st.binary(max_size=12),
    ),
    min_size=1,
    max_size=12,
)


def _columns(layout: peer_litdata.Layout, data: bytes, n: int) -> list[dict[str, Any]] | None:
    batch = layout.classic_batch(data, n)
    if batch is None:
        return None
    columns = [decoded(c) for c in batch.columns]
    return [dict(zip(batch.names, values, strict=True)) for values in zip(*columns, strict=True)]


@settings(max_examples=80, deadline=None)
@given(rows=_rows)
def test_a_whole_chunk_reads_the_same_both_ways(
    rows: list[tuple[int, float, bool, str, bytes, bytes]],
) -> None:
    layout = peer_litdata.Layout(_config(), "index.json")
    data = _chunk(rows)
    want = [dict(zip(KEYS, row, strict=True)) for row in rows]
    assert list(layout.samples(data, len(rows), "chunk")) == want
    assert _columns(layout, data, len(rows)) == want


@settings(max_examples=200, deadline=None)
@given(rows=_rows, at=st.integers(0, 10_000), byte=st.integers(0, 255), cut=st.booleans())
def test_a_damaged_chunk_is_read_as_the_item_reader_reads_it_or_not_at_all(
    rows: list[tuple[int, float, bool, str, bytes, bytes]], at: int, byte: int, cut: bool
) -> None:
    layout = peer_litdata.Layout(_config(), "index.json")
    data = bytearray(_chunk(rows))
    at %= len(data)
    if cut:
        del data[at:]
    else:
        data[at] = byte
    try:
        items: list[dict[str, Any]] | None = list(layout.samples(bytes(data), len(rows), "chunk"))
    except TxstoreError:
        items = None
    got = _columns(layout, bytes(data), len(rows))
    if items is None:
        assert got is None
    elif got is not None:
        assert _exact(got) == _exact(items)


def _exact(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Floats by their bytes: a damaged one may be a NaN, unequal to itself."""
    return [
        {k: struct.pack("<d", v) if isinstance(v, float) else v for k, v in row.items()}
        for row in rows
    ]


def test_samples_of_other_leaves_are_not_read_as_columns() -> None:
    # A nested dict, a numpy leaf: the item reader's, not the columns'.
    nested = {"data_format": ["int", "int"], "data_spec": json.dumps([1, {
        "type": "builtins.dict", "context": json.dumps(["a", "m"]), "children_spec": [
            {"type": None, "context": None, "children_spec": []},
            {"type": "builtins.dict", "context": json.dumps(["n"]), "children_spec": [
                {"type": None, "context": None, "children_spec": []}]}]}])}  # fmt: skip
    assert peer_litdata.Layout(nested, "x").classic_batch(b"\0" * 64, 1) is None
    numpy = {"data_format": ["int", "numpy"], "data_spec": peer_litdata.dict_spec(["a", "v"])}
    assert peer_litdata.Layout(numpy, "x").classic_batch(b"\0" * 64, 1) is None
