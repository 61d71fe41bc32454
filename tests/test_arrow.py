"""Columnar appends and reads: Arrow tables, record batches, data frames, dicts of columns."""

from __future__ import annotations

import logging
import random
import uuid
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given as hypothesis_given
from hypothesis import settings

import txstore
from txstore.errors import EncodeError

pa = pytest.importorskip("pyarrow")
pd = pytest.importorskip("pandas")

N = 700


def _store(tmp_path: Path, **settings: Any) -> txstore.Store:
    # Small chunks and blocks: many blocks and chunks, so boundaries are crossed.
    return txstore.create(str(tmp_path / "s"), chunk_bytes=16384, block_bytes=1024, **settings)


def _every_type(n: int) -> Any:
    """A table with a column of every mapped Arrow type, nulls in most."""
    rng = np.random.default_rng(1)
    ints = {
        f"i_{t}": pa.array(rng.integers(lo, hi, n, endpoint=True).astype(t))
        for t, lo, hi in [
            ("int8", -128, 127),
            ("int16", -(2**15), 2**15 - 1),
            ("int32", -(2**31), 2**31 - 1),
            ("int64", -(2**63), 2**63 - 1),
            ("uint8", 0, 255),
            ("uint16", 0, 2**16 - 1),
            ("uint32", 0, 2**32 - 1),
        ]
    }
    ints["i_uint64"] = pa.array([2**64 - 1 - i for i in range(n)], pa.uint64())
    ints["i_small"] = pa.array([i % 100 - 32 for i in range(n)], pa.int64())
    text = [f"t{i}" * (i % 50) for i in range(n)]
    blobs = [bytes([i % 256]) * (i % 300) for i in range(n)]
    nullable = [None if i % 7 == 3 else i for i in range(n)]
    return pa.table(
        {
            **ints,
            "f16": pa.array(rng.random(n).astype(np.float16)),
            "f32": pa.array(rng.random(n).astype(np.float32)),
            "f64": pa.array(rng.random(n) * 1e300),
            "bool": pa.array([i % 3 == 0 for i in range(n)]),
            "str": pa.array(text, pa.string()),
            "lstr": pa.array(text, pa.large_string()),
            "utf8": pa.array(["é✓" * (i % 5) for i in range(n)]),
            "bin": pa.array(blobs, pa.binary()),
            "lbin": pa.array(blobs, pa.large_binary()),
            "fbin": pa.array([bytes([i % 256]) * 4 for i in range(n)], pa.binary(4)),
            "list": pa.array([list(range(i % 5)) for i in range(n)], pa.list_(pa.int32())),
            "llist": pa.array([[f"x{i}"] * (i % 3) for i in range(n)], pa.large_list(pa.string())),
            "emb": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(n * 4).astype(np.float32)), 4
            ),
            "img": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.integers(0, 255, n * 6, np.uint8)), 3
                ),
                2,
            ),
            "strs3": pa.FixedSizeListArray.from_arrays(
                pa.array([f"s{i}" for i in range(n * 3)]), 3
            ),
            "struct": pa.array(
                [{"a": i, "b": f"b{i}", "c": [1.5] * (i % 2)} for i in range(n)],
                pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.list_(pa.float64()))]),
            ),
            "null": pa.nulls(n),
            "n_int": pa.array(nullable, pa.int16()),
            "n_float": pa.array([None if v is None else v / 4 for v in nullable], pa.float32()),
            "n_str": pa.array([None if v is None else str(v) for v in nullable]),
            "n_bin": pa.array([None if v is None else b"x" * v for v in nullable]),
            "n_bool": pa.array([None if v is None else v % 2 == 0 for v in nullable]),
            "n_list": pa.array([None if v is None else [v] for v in nullable]),
            "n_struct": pa.array([None if v is None else {"v": v} for v in nullable]),
            "n_emb": pa.FixedSizeListArray.from_arrays(
                pa.array(np.arange(n * 2, dtype=np.float64)),
                2,
                mask=pa.array([v is None for v in nullable]),
            ),
            "dict": pa.array([f"c{i % 4}" for i in range(n)]).dictionary_encode(),
            "map": pa.array(
                [[("k", i), ("j", 2 * i)] for i in range(n)], pa.map_(pa.string(), pa.int64())
            ),
        }
    )


def _expected(table: Any, i: int) -> dict[str, Any]:
    """Sample ``i`` as the mapping says it reads back, from the table's Python values."""
    out = {}
    for name in table.column_names:
        column = table.column(name)
        value = column[i].as_py()
        t = column.type
        if pa.types.is_dictionary(t):
            value = column[i].as_py()
        if pa.types.is_map(t) and value is not None:
            value = dict(value)
        if name in ("emb", "n_emb") and value is not None:
            value = np.array(value, dtype=t.value_type.to_pandas_dtype())
        if name == "img":
            value = np.array(value, dtype=np.uint8)
        if pa.types.is_float16(t):
            value = float(value)
        out[name] = value
    return out


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return (
            isinstance(got, np.ndarray)
            and got.dtype == want.dtype
            and got.shape == want.shape
            and np.array_equal(got, want)
        )
    return type(got) is type(want) and got == want


def test_every_mapped_type_round_trips(tmp_path: Path) -> None:
    table = _every_type(N)
    store = _store(tmp_path)
    store.append(table)
    snap = store.snapshot()
    assert len(snap) == N and len(snap.chunks()) > 3
    for i in range(N):
        got, want = snap[i], _expected(table, i)
        assert set(got) == set(want)
        for name in want:
            assert _same(got[name], want[name]), (i, name, got[name], want[name])
    # and back to Arrow in the table's own schema: the same table
    # and back to Arrow in the table's own schema: the same table (a dictionary column reads
    # back as its values, a map as a struct)
    kept = table.drop_columns(["dict", "map"])
    assert snap.to_arrow(schema=kept.schema).equals(kept)


@pytest.mark.parametrize(
    "column",
    [
        pa.array([1, 2], pa.timestamp("s")),
        pa.array([1, 2], pa.date32()),
        pa.array([1, 2], pa.duration("ms")),
        pa.array([1, 2], pa.time32("s")),
        pa.array([1, 2], pa.decimal128(5, 2)),
    ],
)
def test_unmapped_types_are_refused_naming_the_column(tmp_path: Path, column: Any) -> None:
    store = _store(tmp_path)
    table = pa.table({"ok": [1, 2], "when": column})
    with pytest.raises(EncodeError, match=r"column 'when'.*" + str(column.type).split("[")[0][:6]):
        store.append(table)
    assert store.version == 0 and len(store.snapshot()) == 0


def test_views_and_arrows_own_tensors_read_back_as_their_values(tmp_path: Path) -> None:
    """list_view and large_list_view (in order, overlapping, sliced, nulls, a last empty
    list, which pyarrow's own cast to a list gets wrong), string_view, binary_view and the
    fixed_shape_tensor extension read back as the values they hold."""
    store = _store(tmp_path)
    rows = [[1, 2], None, [3], [], [4, 5, 6], []]
    views = {
        "lv": pa.array(rows, pa.list_view(pa.int64())),
        "llv": pa.array([None if r is None else [f"s{v}" for v in r] for r in rows],
                        pa.large_list_view(pa.string())),
        "sv": pa.array(["a", None, "bc", "", "déf", "g"], pa.string_view()),
        "bv": pa.array([b"a", None, b"", b"\x00\xff", b"xyz", b"q"], pa.binary_view()),
    }  # fmt: skip
    store.append(pa.table(views))
    store.append(pa.table({name: column.slice(2) for name, column in views.items()}))
    # views that overlap and run backwards in their values: rows [9], [7, 8, 9], [8, 9]
    overlapping = pa.ListViewArray.from_arrays(
        pa.array([2, 0, 1], pa.int32()), pa.array([1, 3, 2], pa.int32()), pa.array([7, 8, 9])
    )
    store.append(pa.table({"lv": overlapping}))
    tensor = pa.fixed_shape_tensor(pa.float32(), (2, 3))
    flat = np.arange(12, dtype=np.float32)
    storage = pa.FixedSizeListArray.from_arrays(pa.array(flat), 6)
    store.append(pa.table({"t": pa.ExtensionArray.from_storage(tensor, storage)}))
    got = store.snapshot()[:]
    want_lv = rows + rows[2:] + [[9], [7, 8, 9], [8, 9]]
    assert [s.get("lv") for s in got[:13]] == want_lv
    want_sv = ["a", None, "bc", "", "déf", "g"]
    assert [s.get("sv") for s in got[:10]] == want_sv + want_sv[2:]
    assert [s.get("llv") for s in got[:6]] == [
        None if r is None else [f"s{v}" for v in r] for r in rows
    ]
    assert [s.get("bv") for s in got[6:10]] == [b"", b"\x00\xff", b"xyz", b"q"]
    for k, s in enumerate(got[13:]):
        assert s["t"].dtype == np.float32 and s["t"].shape == (2, 3)
        assert np.array_equal(s["t"], flat[6 * k : 6 * k + 6].reshape(2, 3))
    assert len(got) == 15


def test_run_end_encoded_bool8_and_json_columns_read_back_as_their_values(tmp_path: Path) -> None:
    pc = pytest.importorskip("pyarrow.compute")
    store = _store(tmp_path)
    ree = pc.run_end_encode(pa.array([3, 3, None, 7, 7, 7]))
    bool8 = pa.ExtensionArray.from_storage(pa.bool8(), pa.array([1, 0, None, -2, 0, 1], pa.int8()))
    text = ['{"a": 1}', "[1, 2]", None, "null", '"s"', "3.5"]
    json = pa.ExtensionArray.from_storage(pa.json_(), pa.array(text))
    store.append(pa.table({"ree": ree, "b8": bool8, "json": json}))
    got = store.snapshot()[:]
    assert [s.get("ree") for s in got] == [3, 3, None, 7, 7, 7]
    assert [s.get("b8") for s in got] == [True, False, None, True, False, True]
    assert [s.get("json") for s in got] == text


def test_other_extension_and_union_types_are_refused_naming_the_column(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with pytest.raises(EncodeError, match=r"column 'u'.*uuid"):
        store.append(pa.table({"u": pa.array([b"0123456789abcdef"], pa.uuid())}))
    union = pa.UnionArray.from_sparse(
        pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["a", "b"])]
    )
    with pytest.raises(EncodeError, match=r"column 'either'.*union"):
        store.append(pa.table({"either": union}))
    assert store.version == 0


def test_refusals_inside_nested_types_name_the_path(tmp_path: Path) -> None:
    store = _store(tmp_path)
    inner = pa.array([{"at": 1}], pa.struct([("at", pa.timestamp("s"))]))
    with pytest.raises(EncodeError, match=r"'meta\.at'"):
        store.append(pa.table({"meta": inner}))
    with pytest.raises(EncodeError, match="maps with string keys"):
        store.append(pa.table({"m": pa.array([[(1, 2)]], pa.map_(pa.int32(), pa.int32()))}))
    with pytest.raises(EncodeError, match="a null inside an array"):
        store.append(pa.table({"e": pa.FixedSizeListArray.from_arrays(pa.array([1.0, None]), 2)}))
    with pytest.raises(EncodeError, match="appear more than once"):
        store.append(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]))
    assert store.version == 0


def _w1(n: int) -> list[dict[str, Any]]:
    rng = random.Random(5)
    return [{"id": i, "tokens": rng.randbytes(rng.randrange(0, 600))} for i in range(n)]


def test_dict_path_and_every_columnar_input_give_the_same_samples(tmp_path: Path) -> None:
    samples = [
        {**s, "score": s["id"] / 3, "label": f"l{s['id'] % 9}", "ok": s["id"] % 2 == 0}
        for s in _w1(N)
    ]
    columns = {k: [s[k] for s in samples] for k in samples[0]}
    table = pa.table(columns)
    inputs = {
        "table": table,
        "batch": table.to_batches()[0] if table.num_rows else table,
        "batches": iter(table.to_batches(max_chunksize=97)),
        "batch list": table.to_batches(max_chunksize=200),
        "frame": pd.DataFrame(columns),
        "dict of lists": columns,
        "dict of numpy": {
            "id": np.array(columns["id"]),
            "tokens": columns["tokens"],
            "score": np.array(columns["score"]),
            "label": columns["label"],
            "ok": np.array(columns["ok"]),
        },
    }
    reference = _store(tmp_path / "ref")
    reference.append(samples)
    want = list(reference.snapshot())
    for what, given in inputs.items():
        store = _store(tmp_path / what.replace(" ", "_"))
        store.append(given)
        got = list(store.snapshot())
        assert got == want, what
        for g, w in zip(got, want, strict=True):
            assert [type(v) for v in g.values()] == [type(v) for v in w.values()], what


def test_numpy_columns_of_more_dimensions_give_arrays(tmp_path: Path) -> None:
    store = _store(tmp_path)
    emb = np.arange(N * 6, dtype=np.float16).reshape(N, 2, 3)
    store.append({"emb": emb, "big": np.arange(N, dtype=">i4"), "u": np.arange(N, dtype=np.uint64)})
    snap = store.snapshot()
    for i in (0, 1, N - 1):
        assert _same(snap[i]["emb"], emb[i])
        assert snap[i]["big"] == i and type(snap[i]["big"]) is int
        assert snap[i]["u"] == i and type(snap[i]["u"]) is int


def test_a_dict_that_is_not_columns_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with pytest.raises(EncodeError, match=r"dict of columns.*'a' is a int"):
        store.append({"a": 1})
    with pytest.raises(EncodeError, match="differ in length"):
        store.append({"a": [1, 2], "b": [1]})
    with pytest.raises(EncodeError, match=r"sample 1, key 'a'.*tuples"):
        store.append({"a": [1, (2,)]})
    assert store.version == 0


def test_staged_writers_and_optimize_take_tables(tmp_path: Path) -> None:
    store = _store(tmp_path)
    table = pa.table({"id": list(range(N)), "x": [str(i) for i in range(N)]})
    with store.transaction() as txn:
        writer = txn.writer()
        writer.write(table.slice(0, 300))
        writer.write({"id": list(range(300, N)), "x": [str(i) for i in range(300, N)]})
        txn.add(writer.finish())
    assert [s["id"] for s in store.snapshot()] == list(range(N))
    out = str(tmp_path / "opt")
    txstore.optimize(lambda k: table.slice(k * 100, 100), range(7), out, progress=False)
    assert list(txstore.open(out).snapshot()) == [{"id": i, "x": str(i)} for i in range(N)]


def test_to_batches_take_and_to_arrow_give_the_samples_written(tmp_path: Path) -> None:
    store = _store(tmp_path)
    samples = [
        {"id": i, "tokens": t["tokens"], **({"label": f"l{i}"} if i % 3 else {})}
        for i, t in enumerate(_w1(N))
    ]
    store.append(samples)  # the dict path, with a field some samples lack
    snap = store.snapshot()
    batches = list(snap.to_batches(batch_size=128))
    assert [b.num_rows for b in batches] == [128] * (N // 128) + [N % 128]
    rows = [r for b in batches for r in b.to_pylist()]
    assert rows == [
        {"id": s["id"], "tokens": s["tokens"], "label": s.get("label")} for s in samples
    ]
    ids = [b.column("id").to_pylist() for b in snap.to_batches(["id"])]
    assert [i for part in ids for i in part] == list(range(N))
    assert len(ids) == len(snap.chunks())
    table = snap.to_arrow(["tokens", "id"])
    assert table.column("tokens").to_pylist() == [s["tokens"] for s in samples]
    assert table.schema.field("id").type == pa.int64()
    rng = random.Random(2)
    picks = [rng.randrange(-N, N) for _ in range(64)]
    taken = snap.take(picks, fields=["id", "label"])
    assert taken.column("id").to_pylist() == [samples[i]["id"] for i in picks]
    assert taken.column("label").to_pylist() == [samples[i].get("label") for i in picks]
    with pytest.raises(IndexError):
        snap.take([N])


def test_take_reads_each_block_once_and_gives_every_value_as_snap_i_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _store(tmp_path)
    samples = [{"id": i, "tokens": bytes([i % 256]) * (40 + i % 9)} for i in range(N)]
    store.append(samples)
    # Field files, of a field a third of the samples lack.
    store.add_fields(lambda s: {"half": s["id"] // 2} if s["id"] % 3 else {}, ["half"])
    snap = store.snapshot()
    assert any(c.field_files for c in snap.chunk_refs())
    rng = random.Random(5)
    # Runs within one block, repeats, negatives, and scattered picks, in no order.
    picks = [*range(100, 120), 7, 7, -1, -N, *(rng.randrange(-N, N) for _ in range(40))]
    rng.shuffle(picks)
    with caplog.at_level(logging.DEBUG, logger="txstore.store.snapshot"):
        every = snap.take(picks)
    reads = [r.getMessage() for r in caplog.records if r.getMessage().endswith("for take)")]
    # Each block of each file read once: no range twice, and fewer reads than picks (the run
    # of 20 lies in a few blocks, 7 is picked twice).
    assert reads and len(reads) == len(set(reads))
    files = 1 + len(snap.chunk_refs()[0].field_files)
    assert len(reads) < files * len(picks)
    assert every.column("id").to_pylist() == [samples[i]["id"] for i in picks]
    assert every.column("tokens").to_pylist() == [samples[i]["tokens"] for i in picks]
    half = [samples[i]["id"] // 2 if samples[i]["id"] % 3 else None for i in picks]
    assert every.column("half").to_pylist() == half
    assert every.to_pylist() == [
        {"id": snap[i]["id"], "tokens": snap[i]["tokens"], "half": snap[i].get("half")}
        for i in picks
    ]
    only = snap.take(picks, fields=["half"])
    assert only.column_names == ["half"]
    assert only.column("half").to_pylist() == half
    assert snap.take([]).num_rows == 0


def test_take_of_a_damaged_block_raises_and_names_the_chunk(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.append([{"id": i, "tokens": bytes([i % 256]) * 200} for i in range(N)])
    snap = store.snapshot()
    chunk = snap.chunk_refs()[0]
    path = tmp_path / "s" / chunk.path
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside a frame of the first chunk, before its footer
    path.write_bytes(bytes(data))
    fresh = txstore.open(str(tmp_path / "s")).snapshot()
    with pytest.raises(txstore.ChecksumError, match=chunk.path):
        fresh.take(list(range(chunk.num_samples)))


def test_arrays_read_back_as_fixed_size_lists(tmp_path: Path) -> None:
    store = _store(tmp_path)
    arrays = [np.arange(6, dtype=np.int16).reshape(2, 3) + i for i in range(N)]
    store.append([{"a": a, "r": np.arange(i % 4)} for i, a in enumerate(arrays)])
    table = store.snapshot().to_arrow()
    assert table.schema.field("a").type == pa.list_(pa.list_(pa.int16(), 3), 2)
    got = np.array(table.column("a").to_pylist(), dtype=np.int16)
    assert np.array_equal(got, np.stack(arrays))
    assert table.column("r").to_pylist() == [list(range(i % 4)) for i in range(N)]


def test_values_of_one_encoded_size_read_back_exactly(tmp_path: Path) -> None:
    # Columns whose values all encode to one size are read by copying each value's bytes
    # after its header: a block whose values are unevenly spaced (sizes 39 and 41 beside
    # 40) or whose header differs (an int32 array among float32 ones of the same size) must
    # not be cut at the wrong place or reinterpreted.
    store = _store(tmp_path)
    n = 300
    blobs = [bytes([i % 251]) * 40 for i in range(n)]
    blobs[250], blobs[251] = b"a" * 39, b"b" * 41
    arrays = [np.arange(4, dtype=np.float32) + i / 2 for i in range(n)]
    arrays[270] = np.arange(4, dtype=np.int32) * 1000
    texts = ["é" * 10 if i % 2 else "a" * 20 for i in range(n)]  # 20 bytes each
    wide = [np.arange(3, dtype=">f8") * i for i in range(n)]
    store.append(
        [
            {"blob": b, "arr": a, "text": t, "wide": w}
            for b, a, t, w in zip(blobs, arrays, texts, wide, strict=True)
        ]
    )
    snap = store.snapshot()
    assert len(snap.chunk_refs()) > 1
    table = snap.to_arrow()
    assert table.column("blob").to_pylist() == blobs
    assert table.column("text").to_pylist() == texts
    got = np.array(table.column("arr").to_pylist(), dtype=np.float64)
    assert np.array_equal(got, np.stack(arrays).astype(np.float64))
    assert table.schema.field("wide").type == pa.list_(pa.float64(), 3)
    assert np.array_equal(np.array(table.column("wide").to_pylist()), np.stack(wide))
    even = store.snapshot(store.append([{"blob": b"c" * 40}] * 50).version)
    tail = even.to_arrow(["blob"]).column("blob").to_pylist()
    assert tail == [*blobs, *[b"c" * 40] * 50]


def test_a_frame_whose_offsets_point_outside_its_values_is_corrupt() -> None:
    import msgspec

    from txstore.errors import CorruptError
    from txstore.format.arrow import column_array
    from txstore.format.values import ValueDecoder

    def frame(values: list[Any], offsets: list[int]) -> memoryview:
        body = b"".join(msgspec.msgpack.encode(v) for v in values)
        return memoryview(body + np.array(offsets, dtype="<u4").tobytes())

    decoder = ValueDecoder()
    good = [(3, frame([1, 300, -2], [0, 1, 4]), False), (2, frame([7, 8], [0, 1]), False)]
    assert column_array(good, "x", decoder).to_pylist() == [1, 300, -2, 7, 8]
    past_the_end = [good[0], (2, frame([7, 8], [0, 9]), False)]
    with pytest.raises(CorruptError, match="offset table"):
        column_array(past_the_end, "x", decoder)
    backwards = [(3, frame([1, 300, -2], [0, 4, 1]), False)]
    with pytest.raises(CorruptError, match="offset table"):
        column_array(backwards, "x", decoder)


def test_a_checked_chunk_whose_offset_table_disagrees_is_not_misread(tmp_path: Path) -> None:
    """A chunk read whole is checked once against its digest, and its frames are then read
    without their own checksums. Where a frame's offset table disagrees with its values (a
    buggy writer, its digest made to agree), the values of one size are not cut where the
    table says: the column is read from the values themselves."""
    from tests.fuzzing import reseal_data_file
    from txstore.format.chunk import parse_footer

    root = tmp_path / "s"
    store = txstore.create(str(root), compression=None, block_bytes=1024)
    blobs = [bytes([i]) * 64 for i in range(100)]
    store.append([{"id": i, "blob": b} for i, b in enumerate(blobs)])
    (chunk,) = store.snapshot().chunk_refs()
    path = root / chunk.path
    data = bytearray(path.read_bytes())
    layout = parse_footer(bytes(data[chunk.footer_offset :]), "test", chunk.footer_offset)
    blob = layout.columns.index("blob")
    (frame,) = [f for f in layout.footer.blocks[1].frames if f.column == blob]
    table = frame.offset + frame.length - 4 * layout.block_samples(1)
    first = int.from_bytes(data[table : table + 4], "little")
    data[table : table + 4] = (first + 1).to_bytes(4, "little")  # the first value one byte on
    path.write_bytes(bytes(data))
    reseal_data_file(root, chunk.path)
    assert txstore.open(str(root)).snapshot().to_arrow().column("blob").to_pylist() == blobs


def test_values_of_two_sizes_averaging_to_one_read_back(tmp_path: Path) -> None:
    # "" and "ab" encode to 1 and 3 bytes: a block of them looks like values of 2 bytes.
    store = _store(tmp_path)
    texts = ["" if i % 2 else "ab" for i in range(40)]
    blobs = [b"" if i % 2 else b"xy" for i in range(40)]
    store.append([{"t": t, "b": b} for t, b in zip(texts, blobs, strict=True)])
    table = store.snapshot().to_arrow()
    assert table.column("t").to_pylist() == texts
    assert table.column("b").to_pylist() == blobs


@settings(max_examples=60, deadline=None)
@hypothesis_given(
    kind=st.sampled_from(["bytes", "str", "array"]),
    sizes=st.lists(st.sampled_from([0, 1, 2, 3, 40]), min_size=1, max_size=120),
    block_bytes=st.sampled_from([64, 256, 4096]),
)
def test_columns_of_few_sizes_read_back_as_written(
    kind: str, sizes: list[int], block_bytes: int
) -> None:
    # Sizes that often coincide, in blocks of a few values: whichever way a column is
    # read (one copy for values of one size, or the general path), the values come back.
    def value(i: int, size: int) -> Any:
        if kind == "bytes":
            return bytes([i % 256]) * size
        if kind == "str":
            return "é" * (size // 2) + "a" * (size % 2)
        return np.full(size or 1, i, dtype=np.int16)  # Arrow has no lists of size 0

    values = [value(i, size) for i, size in enumerate(sizes)]
    name = f"memory://arrow-sizes-{uuid.uuid4().hex}"
    store = txstore.create(name, chunk_bytes=4 * block_bytes, block_bytes=block_bytes)
    store.append([{"v": v} for v in values])
    got = store.snapshot().to_arrow().column("v").to_pylist()
    if kind == "array":
        assert [list(g) for g in got] == [v.tolist() for v in values]
    else:
        assert got == values


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_values_of_one_size_read_back_across_frames_at_uneven_distances(
    tmp_path: Path, compression: str | None
) -> None:
    # Values of one size are copied out of their frames with numpy: a neighbour column whose
    # frames change size, blocks of other sizes, compressed frames among raw ones and field
    # selection must not shift a value.
    rng = np.random.default_rng(11)
    n = 3000
    tokens = [bytes([i % 7]) * 100 if (i // 200) % 2 else rng.bytes(100) for i in range(n)]
    other = [b"v" * (int(rng.integers(0, 9)) if i < n // 2 else 3) for i in range(n)]
    table = pa.table({"tok": pa.array(tokens, pa.binary()), "var": pa.array(other)})
    store = txstore.create(
        str(tmp_path / "s"), chunk_bytes=200_000, block_bytes=5000, compression=compression
    )
    store.append(iter(table.to_batches(max_chunksize=333)))
    snap = store.snapshot()
    assert snap.to_arrow().column("tok").to_pylist() == tokens
    assert snap.to_arrow(["tok"]).column("tok").to_pylist() == tokens
    assert snap.to_arrow().column("var").to_pylist() == other


def test_runs_of_blocks_are_the_blocks_rows_in_order() -> None:
    # A chunk's blocks of one column, read as runs: consecutive blocks of as many rows, each
    # as far from the one before, make one strided view; any other block starts a new run.
    from txstore.format.arrow.chunks import _runs

    size = 3
    data = np.arange(400, dtype=np.uint8)
    starts = [10, 20, 30, 40, 47, 60, 73, 86, 99, 112, 200, 205]
    rows = [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]
    expected = np.concatenate(
        [data[s : s + r * size].reshape(r, size) for s, r in zip(starts, rows, strict=True)]
    )
    runs = _runs(data, np.array(starts), np.array(rows), size)
    # A block whose step from the one before differs starts a run; the next joins it only at
    # that same step (so a block after a break may stand alone).
    assert [run.shape[:-1] for run in runs] == [(4, 2), (2,), (5, 2), (1,), (1,)]
    got = np.concatenate([run.reshape(-1, size) for run in runs])
    assert np.array_equal(got, expected)
    # A block at the same place as the one before (a step of 0) is not read as a run.
    again = _runs(data, np.array([10, 10, 30]), np.array([1, 1, 1]), size)
    assert np.array_equal(np.concatenate([r.reshape(-1, size) for r in again])[:, 0], [10, 10, 30])


def test_a_value_of_another_header_inside_a_run_of_blocks_is_read_as_itself(
    tmp_path: Path,
) -> None:
    # Many blocks of equal layout are checked and copied as one run: one value of the same
    # size but another header (int32 among float32 arrays) in the middle of such a run must
    # not be read as a float32 array, and ints whose width changes break the runs.
    from txstore.format.chunk import parse_footer

    store = txstore.create(str(tmp_path / "s"), compression=None, block_bytes=64)
    n = 400
    arrays = [np.arange(4, dtype=np.float32) + i for i in range(n)]
    arrays[201] = np.arange(4, dtype=np.int32) * 1000
    store.append([{"id": i * 97, "arr": a} for i, a in enumerate(arrays)])
    snap = store.snapshot()
    (chunk,) = snap.chunk_refs()
    data = (tmp_path / "s" / chunk.path).read_bytes()
    layout = parse_footer(data[chunk.footer_offset :], "test", chunk.footer_offset)
    assert len(layout.footer.blocks) >= 100  # blocks of a few samples: long runs
    table = snap.to_arrow()
    assert table.column("id").to_pylist() == [i * 97 for i in range(n)]
    got = table.column("arr").to_pylist()
    # Read as float32 bytes, the int32 value would be tiny floats, not 0, 1000, 2000, 3000.
    assert [list(v) for v in got] == [a.tolist() for a in arrays]


def test_ints_and_floats_of_one_width_read_back_as_int64_and_float64(tmp_path: Path) -> None:
    # A column of ints (or floats) that all take one MessagePack width is read with one copy
    # of their bytes: each width, signed and not, gives the values as int64 (float64), and
    # uint64 past int64 is left to pyarrow as before.
    n = 500
    columns = {
        "i8": np.arange(n, dtype=np.int64) % 200 - 100,
        "i16": np.arange(n, dtype=np.int64) * 60 - 15_000,
        "i32": np.arange(n, dtype=np.int64) * -4_000_000,
        "i64": np.arange(n, dtype=np.int64) * -(2**50),
        "u8": np.arange(n, dtype=np.uint64) % 100 + 128,
        "u32": np.arange(n, dtype=np.uint64) + 2**31,
        "u64": np.arange(n, dtype=np.uint64) + 2**63,
        "f32": (np.arange(n, dtype=np.float32) / 3).astype(np.float32),
        "f64": np.arange(n, dtype=np.float64) / 7 - 1e300,
    }
    store = _store(tmp_path)
    store.append(columns)
    table = store.snapshot().to_arrow()
    for name, values in columns.items():
        got = table.column(name)
        if name == "u64":
            assert got.type == pa.uint64()
        else:
            assert got.type == (pa.float64() if name[0] == "f" else pa.int64()), name
        assert got.to_pylist() == [v.item() for v in values], name


def test_row_batches_read_back_as_the_rows_of_many_small_record_batches() -> None:
    # LitData's Arrow rows come in record batches of 256: joined into one column batch before
    # they are encoded, they must still give every row, in order, as to_pylist does.
    from txstore.format import arrow, columnar

    rows = [{"id": i, "text": f"t{i} ✓", "blob": bytes([i % 251]) * (i % 9)} for i in range(1000)]
    table = pa.Table.from_pylist(rows)
    table = pa.Table.from_batches(table.to_batches(max_chunksize=256))
    assert len(table.to_batches()) == 4
    batches = arrow.row_batches(table)
    assert batches is not None and len(batches) == 1  # joined
    got = [
        dict(zip(b.names, values, strict=True))
        for b in batches
        for values in zip(*(columnar.decoded(c) for c in b.columns), strict=True)
    ]
    assert got == table.to_pylist() == rows
