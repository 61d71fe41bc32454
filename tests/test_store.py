"""The public API on every backend: round trips, isolation, history, bad input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import txstore
from txstore.errors import (
    EncodeError,
    StoreExistsError,
    StoreNotFoundError,
    TxstoreError,
    VersionNotFoundError,
)

from .conftest import Backend

torch = pytest.importorskip("torch")


def _create(backend: Backend, **kw: Any) -> txstore.Store:
    return txstore.create(backend.uri, **backend.kwargs(), **kw)


def _equal(a: Any, b: Any) -> bool:
    """Exact equality, including type, dtype and shape of arrays and tensors."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def every_value_kind() -> list[dict[str, Any]]:
    return [
        {"none": None, "t": True, "f": False, "i": 0, "neg": -(2**63), "big": 2**64 - 1},
        {"float": 1.5, "nan": float("nan"), "inf": -math.inf, "str": "héllo ✓", "empty": ""},
        {"bytes": b"\x00\xff" * 100, "nobytes": b"", "list": [1, "a", None, [2.5, b"x"]]},
        {"dict": {"a": {"b": [1, {"c": None}]}}, "emptylist": [], "emptydict": {}},
        {"i8": np.arange(-5, 5, dtype=np.int8), "u64": np.array([2**64 - 1], dtype=np.uint64)},
        {"f16": np.linspace(0, 1, 7, dtype=np.float16), "bool": np.array([True, False])},
        {"c128": np.array([1 + 2j, -3j]), "be": np.arange(6, dtype=">i4").reshape(2, 3)},
        {"zero_d": np.array(3.25), "empty": np.zeros((0, 4), dtype=np.float32)},
        {"fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4))},
        {"npscalar": np.float32(2.5), "npint": np.int64(-7), "npbool": np.bool_(True)},
        {"tensor": torch.arange(12, dtype=torch.float32).reshape(3, 4)},
        {"bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16), "t0": torch.tensor(5)},
        {"tempty": torch.zeros(0, 3, dtype=torch.int16), "tbool": torch.tensor([True])},
        {},
        {"only_here": "sparse keys"},
    ]


@pytest.mark.s3  # bytes through the S3 client
def test_every_value_kind_round_trips(backend: Backend) -> None:
    store = _create(backend)
    samples = every_value_kind()
    store.append(samples)
    snap = txstore.open(backend.uri, **backend.kwargs()).snapshot()
    assert len(snap) == len(samples)
    for i, expected in enumerate(samples):
        assert _equal(snap[i], expected), (i, snap[i], expected)
    for got, expected in zip(snap, samples, strict=True):  # streaming path
        assert _equal(got, expected), (got, expected)


def test_zero_copy_gives_top_level_bytes_as_views_and_the_rest_as_ever(
    backend: Backend,
) -> None:
    store = _create(backend, block_bytes=4096)
    samples = every_value_kind()
    blobs = [{"i": i, "blob": bytes([i]) * (3000 + i), "tag": b"t%d" % i} for i in range(40)]
    # A column of bytes with a hole, and one whose values are bytes in one block, str in another.
    mixed = [{"blob": b"x" * 5000}, {"i": 99}, {"blob": "text"}, {"blob": b""}]
    store.append([*samples, *blobs, *mixed])
    snap = txstore.open(backend.uri, **backend.kwargs()).snapshot().zero_copy()
    assert snap.is_zero_copy and snap.select(["blob"], missing="skip").is_zero_copy
    expected = [*samples, *blobs, *mixed]

    def as_copies(sample: dict[str, Any]) -> dict[str, Any]:
        for key, value in sample.items():
            if type(value) is memoryview:
                assert value.readonly
                sample[key] = bytes(value)
        return sample

    streamed, indexed = list(snap), [snap[i] for i in range(len(snap))]
    for got in (streamed, indexed):
        assert all(_equal(as_copies(a), b) for a, b in zip(got, expected, strict=True))
    views = [type(s["blob"]) for s in snap[len(samples) :] if "blob" in s]
    assert views.count(memoryview) == 42 and views.count(str) == 1
    assert type(snap[2]["list"][3][1]) is bytes  # nested bytes are copies
    tags = snap.select(["tag"], missing="skip")  # only the blobs have one
    assert type(tags[len(samples)]["tag"]) is memoryview
    projected = list(tags)  # read as ranges
    assert [bytes(s["tag"]) for s in projected] == [b["tag"] for b in blobs]
    assert all(type(s["tag"]) is memoryview for s in projected)
    assert type(store.snapshot()[len(samples)]["blob"]) is bytes  # not asked for


@pytest.mark.parametrize("block_bytes", [None, 1])  # all 40 samples in one block; one each
def test_zero_copy_gives_views_in_blocks_with_absent_and_mixed_values(
    backend: Backend, block_bytes: int | None
) -> None:
    store = _create(backend) if block_bytes is None else _create(backend, block_bytes=block_bytes)
    samples: list[dict[str, Any]] = []
    for i in range(40):
        sample: dict[str, Any] = {"mixed": b"m%d" % i if i % 3 else None}
        if i % 5:
            sample["blob"] = bytes([i]) * 50
        samples.append(sample)
    store.append(samples)
    snap = store.snapshot().zero_copy()
    for got in (list(snap), [snap[i] for i in range(40)]):  # streamed and indexed alike
        for sample, expected in zip(got, samples, strict=True):
            assert sample.keys() == expected.keys()
            for key, value in expected.items():
                if value is None:
                    assert sample[key] is None
                else:
                    assert type(sample[key]) is memoryview and bytes(sample[key]) == value


def test_decoded_arrays_are_writable(backend: Backend) -> None:
    store = _create(backend)
    store.append([{"a": np.zeros(3)}])
    arr = store.snapshot()[0]["a"]
    arr[0] = 1.0
    assert arr[0] == 1.0


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ({"id": 1, "obj": object()}, r"sample 2, key 'obj'.*object"),
        ({1: "x"}, r"sample 2: key 1 is not a str"),
        ({"nested": {"ok": {2: 3}}}, r"sample 2, key 'nested'.*key 2"),
        ({"t": (1, 2)}, r"sample 2, key 't'.*tuple"),
        ({"huge": 2**70}, r"sample 2, key 'huge'.*64 bits"),
        ({"arr": np.array(["a", "b"])}, r"sample 2, key 'arr'.*not numeric"),
        ({"arr": np.array([object()])}, r"sample 2, key 'arr'"),
        ("not a dict", r"sample 2: expected a dict"),
        (
            {"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
            r"sample 2, key 'deep'.*deeper",
        ),
        ({"set": {1, 2}}, r"sample 2, key 'set'"),
        ({"ba": bytearray(b"x")}, r"sample 2, key 'ba'"),
        ({"s": "lone \ud800 surrogate"}, r"sample 2, key 's'.*UTF-8"),
        ({"n": ["ok", {"k": "\udfff"}]}, r"sample 2, key 'n'.*UTF-8"),
        ({"\ud800": 1}, r"sample 2: key '\\ud800' is not valid UTF-8"),
    ],
)
def test_unencodable_sample_names_it_and_changes_nothing(
    backend: Backend, bad: Any, pattern: str
) -> None:
    store = _create(backend, chunk_bytes=1024)
    store.append([{"id": 0, "pad": b"x" * 600}])
    before_files = sorted(f.key for f in store.storage.list(""))

    def samples() -> Any:
        yield {"id": 0, "pad": b"y" * 600}
        yield {"id": 1, "pad": b"z" * 600}  # fills a chunk, which gets written
        yield bad
        yield {"id": 3}

    with pytest.raises(EncodeError, match=pattern):
        store.append(samples())
    assert store.version == 1
    assert len(store.snapshot()) == 1
    after_files = sorted(f.key for f in store.storage.list("") if ".lock" not in f.key)
    assert after_files == [k for k in before_files if ".lock" not in k]


def test_snapshot_isolation(backend: Backend) -> None:
    store = _create(backend)
    store.append([{"i": i} for i in range(10)])
    pinned = store.snapshot()
    store.append([{"i": i} for i in range(10, 15)])
    assert len(pinned) == 10 and pinned.version == 1
    assert [s["i"] for s in pinned] == list(range(10))
    latest = store.snapshot()
    assert len(latest) == 15 and [s["i"] for s in latest][-1] == 14
    assert [s["i"] for s in store.snapshot(1)] == list(range(10))
    assert len(store.snapshot(0)) == 0


def test_sequence_protocol(backend: Backend) -> None:
    store = _create(backend, chunk_bytes=4096, block_bytes=512)
    n = 2000
    store.append({"i": i, "pad": bytes(i % 50)} for i in range(n))
    snap = store.snapshot()
    assert len(snap) == n
    assert len(snap.chunks()) > 5  # the small chunk size really split the data
    for i in [0, 1, 511, 999, n - 1, -1, -n]:
        assert snap[i]["i"] == (i % n)
    assert [s["i"] for s in snap[10:20:3]] == [10, 13, 16, 19]
    for i in [n, -n - 1, 10**9]:
        with pytest.raises(IndexError):
            snap[i]
    assert [s["i"] for s in snap] == list(range(n))


def test_appends_across_commits_keep_order(backend: Backend) -> None:
    store = _create(backend, chunk_bytes=2048)
    expected: list[int] = []
    for c in range(12):
        batch = list(range(c * 37, c * 37 + 1 + c * 5))
        store.append({"v": v, "pad": b"p" * 100} for v in batch)
        expected += batch
    snap = store.snapshot()
    assert [s["v"] for s in snap] == expected
    assert [snap[i]["v"] for i in range(len(snap))] == expected


def test_log_is_newest_first(backend: Backend) -> None:
    store = _create(backend)
    store.append([{"a": 1}], message="one")
    store.append([{"a": 2}, {"a": 3}], message="two")
    log = store.log()
    assert [c.version for c in log] == [2, 1, 0]
    assert [c.num_samples for c in log] == [2, 1, 0]
    assert [c.total_samples for c in log] == [3, 1, 0]
    assert [c.message for c in log][:2] == ["two", "one"]
    assert log[0].timestamp >= log[1].timestamp
    assert [c.version for c in store.log(limit=2)] == [2, 1]
    for bad in (-1, "2", 1.5, True):  # -1 gave an empty history, "2" a TypeError
        with pytest.raises(ValueError, match="limit"):
            store.log(limit=bad)


def test_indices_and_counts_of_the_wrong_type_are_named(tmp_path: Any) -> None:
    """As a list does: an index that is not an integer is a TypeError saying so (1.5 and "a"
    failed deep inside the chunk lookup), a numpy integer is an index."""
    store = txstore.create(str(tmp_path / "s"))
    store.append([{"id": i} for i in range(5)])
    store.append([{"id": 5}])
    snap = store.snapshot()
    assert snap[np.int64(3)] == {"id": 3}
    for bad in (1.5, "a", None):
        with pytest.raises(TypeError, match="snapshot indices must be integers or slices"):
            snap[bad]  # type: ignore[index]
    with pytest.raises(TypeError, match="snapshot indices must be integers or slices"):
        snap.take([0, "a"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="keep_last must be a whole number"):
        store.expire(keep_last="1")  # type: ignore[arg-type]
    with pytest.raises(txstore.EncodeError, match="samples must be an iterable of dicts"):
        store.append(5)  # type: ignore[arg-type]
    # A str is not a list of names: drop_fields("id") went on to look for a field "i".
    for call in (snap.select, store.drop_fields, lambda f: store.add_fields(dict, f)):
        for bad in ("id", 5):
            with pytest.raises(TypeError, match="fields must be a list of field names"):
                call(bad)


def test_create_and_open_errors(backend: Backend) -> None:
    with pytest.raises(StoreNotFoundError):
        txstore.open(backend.uri, **backend.kwargs())
    _create(backend)
    with pytest.raises(StoreExistsError):
        _create(backend)
    store = txstore.open(backend.uri, **backend.kwargs())
    assert len(store.snapshot()) == 0
    with pytest.raises(VersionNotFoundError, match="version 7"):
        store.snapshot(7)
    with pytest.raises(VersionNotFoundError):
        store.snapshot(-1)
    assert issubclass(VersionNotFoundError, TxstoreError)


def test_empty_append_commits_a_version(backend: Backend) -> None:
    store = _create(backend)
    commit = store.append([])
    assert commit.version == 1 and commit.num_samples == 0
    assert len(store.snapshot()) == 0


def test_chunk_size_is_respected(backend: Backend) -> None:
    store = _create(backend, chunk_bytes="64KiB", compression=None)
    store.append({"b": bytes(1000)} for _ in range(1000))
    chunks = store.snapshot().chunk_refs()
    sizes = [c.size for c in chunks]
    assert all(s < 64 * 1024 + 8 * 1024 for s in sizes), sizes
    assert all(s > 60 * 1024 for s in sizes[:-1]), sizes


def test_a_writer_keeps_what_it_took_before_an_error(backend: Backend) -> None:
    """The writer takes samples in lists: those taken before the source raised, or before a
    sample it refused, are written all the same, and positions carry on from them."""
    store = _create(backend)

    def source() -> Any:
        yield from ({"i": i} for i in range(300))
        raise RuntimeError("the source failed")

    with store.transaction() as txn:
        writer = txn.writer()
        with pytest.raises(RuntimeError, match="the source failed"):
            writer.write(source())
        refused = [{"i": 300 + j} for j in range(5)] + [{"i": 2**64}, {"i": -1}]
        with pytest.raises(EncodeError, match="sample 305, key 'i'"):
            writer.write(refused)
        writer.write({"i": i} for i in range(305, 310))
        with pytest.raises(EncodeError, match="sample 310, key 'i'"):
            writer.write([{"i": 2**64}])
        part = writer.finish()
        assert part.num_samples == 310
        txn.add(part)
    assert [sample["i"] for sample in store.snapshot()] == list(range(310))


def test_a_source_may_reuse_its_dict_and_go_on_after_a_refusal(backend: Backend) -> None:
    """An iterator is taken one sample at a time, each added before the next is taken."""
    store = _create(backend)

    def reusing() -> Any:
        sample: dict[str, Any] = {}
        for i in range(600):
            sample["i"] = 2**64 if i == 300 else i
            yield sample

    with store.transaction() as txn:
        writer = txn.writer()
        source = reusing()
        with pytest.raises(EncodeError, match="sample 300, key 'i'"):
            writer.write(source)
        writer.write(source)  # on from just past the refused sample
        txn.add(writer.finish())
    assert [sample["i"] for sample in store.snapshot()] == [*range(300), *range(301, 600)]


def test_chunks_of_a_list_stay_near_chunk_bytes_when_samples_grow(backend: Backend) -> None:
    store = _create(backend, chunk_bytes="1MiB", compression=None)
    store.append([{"b": bytes(100)}] * 3000 + [{"b": bytes(100_000)}] * 40)
    sizes = [chunk.size for chunk in store.snapshot().chunks()]
    assert max(sizes) < 2**20 + 110_000, sizes


def test_each_chunk_is_recorded_with_the_digest_of_its_stored_bytes(backend: Backend) -> None:
    import xxhash

    from txstore.storage import open_storage

    store = _create(backend, chunk_bytes="64KiB", compression=None)
    store.append({"i": i, "b": bytes([i % 256]) * 1000} for i in range(300))
    raw = open_storage(backend.uri, backend.storage_options)
    chunks = store.snapshot().chunk_refs()
    assert len(chunks) > 3
    for chunk in chunks:
        data = raw.read(chunk.path)
        assert chunk.digest == f"{xxhash.xxh3_64_intdigest(data[: chunk.footer_offset]):016x}"


def test_compression_shrinks_compressible_data(backend: Backend) -> None:
    text = ("the quick brown fox " * 200).encode()
    raw = _create(
        Backend(backend.name, backend.uri + "-raw", backend.storage_options), compression=None
    )
    packed = _create(backend)
    for store in (raw, packed):
        store.append({"t": text} for _ in range(200))
    raw_size = sum(c.size for c in raw.snapshot().chunks())
    packed_size = sum(c.size for c in packed.snapshot().chunks())
    assert packed_size * 10 < raw_size
    assert packed.snapshot()[123]["t"] == text


def test_txn_id_commits_once(backend: Backend) -> None:
    store = _create(backend)
    first = store.append([{"a": 1}], txn_id="shard-1")
    store.append([{"a": 2}])
    again = store.append([{"a": 1}], txn_id="shard-1")
    assert again.version == first.version == 1
    assert len(store.snapshot()) == 2
    assert store.version == 2


def test_append_streams_without_holding_the_data(tmp_path: Any) -> None:
    import tracemalloc

    store = txstore.create(str(tmp_path / "s"), chunk_bytes="4MiB")
    total = 160 * 2**20

    def samples() -> Any:
        for i in range(total // 65536):
            yield {"i": i, "blob": i.to_bytes(8, "little") * 8192}  # 64 KiB, fresh each time

    tracemalloc.start()
    store.append(samples())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(store.snapshot()) == total // 65536
    assert peak < 8 * 4 * 2**20, f"peak {peak / 2**20:.0f} MiB for a {total / 2**20:.0f} MiB append"
