"""Import from and export to LitData, MosaicML MDS and Parquet, on datasets the real tools
write (litdata.optimize, streaming.MDSWriter, pyarrow.parquet) and read back with their own
readers. Every sample is compared with the values the test made itself."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
import sys
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import txstore
from txstore.cli import main as cli

litdata = pytest.importorskip("litdata")
torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pads = pytest.importorskip("pyarrow.dataset")


def _streaming() -> Any:
    # `import streaming` imports its vision datasets, which need torchvision (not installed:
    # its wheels drag in a CUDA torch); only those classes are lost.
    try:
        import torchvision  # noqa: F401
    except ImportError:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    return pytest.importorskip("streaming")


N = 24


def _pixels(i: int, size: tuple[int, int] = (5, 4)) -> np.ndarray[Any, Any]:
    w, h = size
    return ((np.arange(h * w * 3).reshape(h, w, 3) * (i + 1)) % 251).astype(np.uint8)


def _image_file(folder: Path, i: int, fmt: str) -> Path:
    path = folder / f"img{i}.{fmt.lower()}"
    Image.fromarray(_pixels(i)).save(path, format=fmt)
    return path


# -- LitData ---------------------------------------------------------------------------

# litdata.optimize runs fn in spawned processes: the images it opens are made first, in
# this folder (set by the fixture before optimize is called, read back through the env).
_IMAGES = "TXSTORE_TEST_IMAGES"


def litdata_sample(i: int) -> dict[str, Any]:
    """A sample with a leaf for each LitData serializer under test; JPEG and PNG as images
    opened from files (LitData stores a JPEG file's bytes; a PNG image's raw pixels)."""
    folder = Path(os.environ[_IMAGES])
    return {
        "i": i * 1_000_003 - 7,
        "f": i / 7,
        "s": f"caption {i} ✓",
        "b": bytes(range(i % 7)) * 3,
        "flag": i % 3 == 0,
        "vec": np.arange(i % 5 + 1, dtype=np.int16) - i,
        "grid": np.arange(6, dtype=np.float32).reshape(2, 3) * i,
        "t": torch.arange(6, dtype=torch.float64).reshape(3, 2) + i,
        "tv": torch.arange(4, dtype=torch.int32) * i,
        "jpg": Image.open(folder / f"img{i}.jpeg"),
        "png": Image.open(folder / f"img{i}.png"),
        "meta": {"n": i, "name": f"m{i}"},
    }


def litdata_expected(i: int, folder: Path) -> dict[str, Any]:
    out = litdata_sample(i)
    out["jpg"] = (folder / f"img{i}.jpeg").read_bytes()  # the file's bytes, as stored
    out["png"] = _pixels(i)  # raw pixels, as LitData's pil serializer keeps them
    return out


def litdata_plain(i: int) -> dict[str, Any]:
    """Plain values only: LitData stores such rows as an Arrow IPC file after the items."""
    return {"id": i, "text": f"t{i}", "blob": bytes([i]) * 5, "tags": [f"a{i}", "b"],
            "ok": i % 2 == 0, "x": i / 4}  # fmt: skip


def litdata_large(i: int) -> dict[str, Any]:
    """Plain values, large ones among them (kept as Arrow rows, their bytes referred to)."""
    return {"id": i, "blob": bytes([i % 251]) * (16_000 + 997 * i), "note": f"n{i} ✓"}


def litdata_classic(i: int) -> dict[str, Any]:
    """Plain values and a JPEG file: LitData keeps such items in its own layout (a JPEG is
    no Arrow row), one size per leaf, then the leaves."""
    folder = Path(os.environ[_IMAGES])
    jpg = Image.open(folder / f"img{i}.jpeg")
    return {"id": i * 1_000_003 - 7, "x": i / 3, "ok": i % 2 == 0, "name": f"n{i} ✓",
            "blob": bytes([i % 251]) * (i % 50), "jpg": jpg}  # fmt: skip


def litdata_classic_expected(i: int, folder: Path) -> dict[str, Any]:
    out = litdata_classic(i)
    out["jpg"] = (folder / f"img{i}.jpeg").read_bytes()
    return out


def litdata_image_files(i: int) -> dict[str, Any]:
    """Images handed over as ``litdata.Image`` of a file: LitData's ``image`` serializer
    stores the file's bytes (``image:png``, ``image:jpeg``)."""
    folder = Path(os.environ[_IMAGES])
    return {"id": i, "png": litdata.Image(path=str(folder / f"img{i}.png")),
            "jpg": litdata.Image(path=str(folder / f"img{i}.jpeg"))}  # fmt: skip


def litdata_pickled(i: int) -> dict[str, Any]:
    return {"i": i, "odd": {i, i + 1}}  # a set: LitData pickles it


def _equal(got: Any, want: Any, where: str) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), where
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert np.array_equal(got, want), where
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(got, want), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (where, got, want)
        for k in want:
            _equal(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            _equal(g, w, f"{where}[{k}]")
    else:
        if isinstance(got, memoryview):  # LitData's reader hands bytes out as views
            got = bytes(got)
        assert type(got) is type(want) and got == want, (where, got, want)


def _same_samples(got: Any, want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for n, w in enumerate(want):
        _equal(got[n], w, f"sample {n}")


@pytest.fixture(scope="module", autouse=True)
def _start_method_kept() -> Any:
    # litdata.optimize sets the process-wide multiprocessing start method to spawn; left so,
    # every later DataLoader in this test process would start its workers from scratch.
    before = multiprocessing.get_start_method(allow_none=True)
    yield
    if multiprocessing.get_start_method(allow_none=True) != before:
        multiprocessing.set_start_method(before, force=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for i in range(N):
        _image_file(folder, i, "JPEG")
        _image_file(folder, i, "PNG")
    os.environ[_IMAGES] = str(folder)
    return folder


@pytest.fixture(scope="module")
def litdata_dir(tmp_path_factory: pytest.TempPathFactory, images: Path) -> Path:
    out = tmp_path_factory.mktemp("litdata") / "ds"
    litdata.optimize(
        fn=litdata_sample, inputs=list(range(N)), output_dir=str(out), chunk_bytes="2KB",
        num_workers=1,
    )  # fmt: skip
    return out


def test_litdata_import_gives_every_sample(litdata_dir: Path, images: Path, tmp_path: Path):
    config = json.loads((litdata_dir / "index.json").read_text())["config"]
    # the serializers under test are the ones LitData chose
    assert {"int", "float", "str", "bytes", "bool", "numpy", "tensor", "jpeg", "pil"} <= {
        f.split(":")[0] for f in config["data_format"]
    }
    assert any(f.startswith("no_header_numpy") for f in config["data_format"])
    assert any(f.startswith("no_header_tensor") for f in config["data_format"])
    assert len(json.loads((litdata_dir / "index.json").read_text())["chunks"]) > 2
    commit = txstore.import_litdata(litdata_dir, str(tmp_path / "st"), num_workers=2,
                                    progress=False)  # fmt: skip
    assert commit.version == 1 and commit.num_samples == N
    snap = txstore.open(str(tmp_path / "st")).snapshot()
    _same_samples(snap, [litdata_expected(i, images) for i in range(N)])
    assert commit.message is not None and "litdata" in commit.message


def test_litdata_compressed_chunks(tmp_path: Path, images: Path):
    pytest.importorskip("zstd")  # LitData's own zstd writer
    out = tmp_path / "zds"
    litdata.optimize(
        fn=litdata_sample, inputs=list(range(6)), output_dir=str(out), chunk_bytes="4KB",
        num_workers=1, compression="zstd",
    )  # fmt: skip
    assert json.loads((out / "index.json").read_text())["config"]["compression"]
    txstore.import_litdata(out, str(tmp_path / "st"), num_workers=1, progress=False)
    snap = txstore.open(str(tmp_path / "st")).snapshot()
    _same_samples(snap, [litdata_expected(i, images) for i in range(6)])


def test_litdata_rows_in_an_arrow_footer(tmp_path: Path):
    want = [litdata_plain(i) for i in range(40)]
    for compression in (None, "zstd"):
        out = tmp_path / f"ds-{compression}"
        litdata.optimize(fn=litdata_plain, inputs=list(range(40)), output_dir=str(out),
                         chunk_bytes="1KB", num_workers=1, compression=compression)  # fmt: skip
        first = sorted(out.glob("chunk-*.bin"))[0].read_bytes()
        assert first.endswith(b"LDARW01\0")  # the layout under test
        dest = str(tmp_path / f"st-{compression}")
        txstore.import_litdata(out, dest, num_workers=1, progress=False)
        _same_samples(txstore.open(dest).snapshot(), want)
        _same_samples(litdata.StreamingDataset(str(out)), want)  # what LitData itself reads


def test_litdata_arrow_rows_come_in_as_columns_with_their_values(tmp_path: Path):
    """Chunks of Arrow rows are read a column at a time, over the file's bytes (large values
    copied once, into the store's chunks): the samples are those LitData reads."""
    from txstore.format import peer_litdata

    want = [litdata_large(i) for i in range(30)]
    out = tmp_path / "ds"
    litdata.optimize(fn=litdata_large, inputs=list(range(30)), output_dir=str(out),
                     chunk_bytes="200KB", num_workers=1)  # fmt: skip
    index = json.loads((out / "index.json").read_text())
    assert len(index["chunks"]) > 2
    layout = peer_litdata.Layout(index["config"], "x")
    for entry in index["chunks"]:
        data = (out / entry["filename"]).read_bytes()
        batches = layout.batches(data, entry["chunk_size"], "x")
        assert batches is not None  # the path under test
        rows = list(layout.samples(data, entry["chunk_size"], "x"))
        from txstore.format.columnar import decoded

        got = [
            dict(zip(b.names, values, strict=True))
            for b in batches
            for values in zip(*(decoded(c) for c in b.columns), strict=True)
        ]
        assert got == rows
    for workers in (1, 2):
        dest = str(tmp_path / f"st{workers}")
        txstore.import_litdata(out, dest, num_workers=workers, chunk_bytes="100KB",
                               progress=False)  # fmt: skip
        _same_samples(txstore.open(dest).snapshot(), want)
    _same_samples(litdata.StreamingDataset(str(out)), want)


def test_litdata_arrow_rows_with_a_bad_string_are_corrupt(tmp_path: Path):
    """The Arrow rows are checked whole (offsets, UTF-8) before they are read: a string made
    invalid UTF-8 raised UnicodeDecodeError from inside pyarrow."""
    out = tmp_path / "ds"
    litdata.optimize(fn=litdata_plain, inputs=list(range(40)), output_dir=str(out),
                     chunk_bytes="1KB", num_workers=1)  # fmt: skip
    first = sorted(out.glob("chunk-*.bin"))[0]
    data = first.read_bytes()
    at = data.index(b"t0")  # the text of sample 0, in the Arrow rows
    first.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
    with pytest.raises(txstore.TxstoreError, match=r"bad Arrow IPC block.*Invalid UTF8"):
        txstore.import_litdata(out, str(tmp_path / "st"), num_workers=1, progress=False)


def test_litdata_items_of_plain_values_and_files_come_in_as_columns(tmp_path: Path, images: Path):
    """Chunks in LitData's own layout whose leaves are ints, floats, bools, strs, bytes and
    files are read a column at a time (``classic_batch``): the same samples, item by item,
    as the reader of items gives, and as the test wrote them."""
    from txstore.format import peer_litdata
    from txstore.format.columnar import decoded

    out = tmp_path / "ds"
    litdata.optimize(fn=litdata_classic, inputs=list(range(N)), output_dir=str(out),
                     chunk_bytes="4KB", num_workers=1)  # fmt: skip
    index = json.loads((out / "index.json").read_text())
    kinds = {f.split(":")[0] for f in index["config"]["data_format"]}
    assert kinds == {"int", "float", "bool", "str", "bytes", "jpeg"}
    assert len(index["chunks"]) > 2
    layout = peer_litdata.Layout(index["config"], "x")
    for entry in index["chunks"]:
        data = (out / entry["filename"]).read_bytes()
        assert not data.endswith(b"LDARW01\0")  # LitData's own layout: the one under test
        batch = layout.classic_batch(data, entry["chunk_size"])
        assert batch is not None
        rows = list(layout.samples(data, entry["chunk_size"], "x"))
        columns = [decoded(c) for c in batch.columns]
        got = [dict(zip(batch.names, values, strict=True)) for values in zip(*columns, strict=True)]
        assert got == rows
    want = [litdata_classic_expected(i, images) for i in range(N)]
    for workers in (1, 2):
        dest = str(tmp_path / f"st{workers}")
        txstore.import_litdata(out, dest, num_workers=workers, progress=False)
        _same_samples(txstore.open(dest).snapshot(), want)


def test_litdata_image_files_come_in_as_their_bytes(tmp_path: Path, images: Path):
    out = tmp_path / "ds"
    litdata.optimize(fn=litdata_image_files, inputs=list(range(N)), output_dir=str(out),
                     chunk_bytes="4KB", num_workers=1)  # fmt: skip
    formats = json.loads((out / "index.json").read_text())["config"]["data_format"]
    assert {f for f in formats if f.startswith("image:")} == {"image:png", "image:jpeg"}
    txstore.import_litdata(out, str(tmp_path / "st"), num_workers=1, progress=False)
    want = [{"id": i, "png": (images / f"img{i}.png").read_bytes(),
             "jpg": (images / f"img{i}.jpeg").read_bytes()} for i in range(N)]  # fmt: skip
    _same_samples(txstore.open(str(tmp_path / "st")).snapshot(), want)


def test_litdata_items_with_a_bad_string_are_corrupt(tmp_path: Path, images: Path):
    """A string that is not UTF-8 in an item of LitData's own layout: the columns are not
    read from that chunk, and its items name what is wrong; nothing is committed."""
    from txstore.format import peer_litdata

    out = tmp_path / "ds"
    litdata.optimize(fn=litdata_classic, inputs=list(range(4)), output_dir=str(out),
                     chunk_bytes="1MB", num_workers=1)  # fmt: skip
    (first,) = sorted(out.glob("chunk-*.bin"))
    data = first.read_bytes()
    at = data.index("n2 ✓".encode())
    bad = data[:at] + b"\xff" + data[at + 1 :]
    first.write_bytes(bad)
    layout = peer_litdata.Layout(json.loads((out / "index.json").read_text())["config"], "x")
    assert layout.classic_batch(bad, 4) is None
    named = r"chunk-0-0.bin, item 2: .*field 'name'.*bad str"
    with pytest.raises(txstore.TxstoreError, match=named):
        txstore.import_litdata(out, str(tmp_path / "st"), num_workers=1, progress=False)
    assert not (tmp_path / "st").exists()


def test_litdata_pickle_is_refused_naming_the_field(tmp_path: Path):
    out = tmp_path / "pds"
    litdata.optimize(fn=litdata_pickled, inputs=list(range(3)), output_dir=str(out),
                     chunk_bytes="1MB", num_workers=1)  # fmt: skip
    with pytest.raises(txstore.EncodeError, match=r"field 'odd'.*pickle"):
        txstore.import_litdata(out, str(tmp_path / "st"), progress=False)
    assert not (tmp_path / "st").exists()  # nothing was made


def _copy_into(folder: Path, uri: str, options: dict[str, Any] | None = None) -> None:
    from txstore.storage import open_storage

    storage = open_storage(uri, options)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            storage.write(path.relative_to(folder).as_posix(), path.read_bytes())


def test_litdata_import_from_an_object_store(litdata_dir: Path, images: Path, tmp_path: Path,
                                             s3_server: Any):  # fmt: skip
    src = f"s3://{s3_server.new_bucket()}/litdata/ds"
    _copy_into(litdata_dir, src, s3_server.options)
    txstore.import_litdata(src, str(tmp_path / "st"), src_storage_options=s3_server.options,
                           num_workers=2, progress=False)  # fmt: skip
    snap = txstore.open(str(tmp_path / "st")).snapshot()
    _same_samples(snap, [litdata_expected(i, images) for i in range(N)])


def _copy_out(uri: str, options: dict[str, Any] | None, folder: Path) -> None:
    from txstore.storage import open_storage

    storage = open_storage(uri, options)
    for info in storage.list(""):
        target = folder / info.key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(storage.read(info.key))


def test_mds_import_from_and_exports_to_an_object_store(
    mds_dir: Path, images: Path, tmp_path: Path, s3_server: Any
):
    """An MDS dataset in S3 imported into a store in S3; the store exported to S3 as MDS and
    as LitData, each folder read by the peer's own reader (copied down: the readers' own S3
    settings are not under test)."""
    bucket = s3_server.new_bucket()
    src, dest = f"s3://{bucket}/mds/ds", f"s3://{bucket}/stores/st"
    _copy_into(mds_dir, src, s3_server.options)
    options = s3_server.options
    txstore.import_mds(src, dest, src_storage_options=options, storage_options=options,
                       num_workers=2, progress=False)  # fmt: skip
    snap = txstore.open(dest, storage_options=s3_server.options).snapshot()
    _same_samples(snap, _mds_rows(images, N)[1])
    plain = snap.select(["int", "s", "b", "jpg"])
    plain.export_mds(f"s3://{bucket}/out/mds", storage_options=s3_server.options,
                     size_limit=4096, progress=False)  # fmt: skip
    plain.export_litdata(f"s3://{bucket}/out/lit", storage_options=s3_server.options,
                         chunk_bytes=4096, progress=False)  # fmt: skip
    _copy_out(f"s3://{bucket}/out/mds", s3_server.options, tmp_path / "mds")
    _copy_out(f"s3://{bucket}/out/lit", s3_server.options, tmp_path / "lit")
    want = [dict(s) for s in plain]
    theirs = _streaming().StreamingDataset(local=str(tmp_path / "mds"), batch_size=1)
    _same_samples([theirs[i] for i in range(len(theirs))], want)
    _same_samples(list(litdata.StreamingDataset(str(tmp_path / "lit"))), want)


def test_imports_from_gcs_and_azure(
    litdata_dir: Path, mds_dir: Path, images: Path, tmp_path: Path, gcs_server: Any,
    azurite_server: Any,
):  # fmt: skip
    """Each importer reads through the storage layer: Parquet files from GCS and an MDS
    dataset from Azure (emulators as real servers, their own clients), LitData from each."""
    rows = _parquet_files(tmp_path / "pq")
    gcs = f"gs://{gcs_server.new_bucket()}"
    az = f"az://{azurite_server.new_container()}"
    _copy_into(tmp_path / "pq", f"{gcs}/pq", gcs_server.options)
    _copy_into(mds_dir, f"{az}/mds", azurite_server.options)
    _copy_into(litdata_dir, f"{gcs}/lit", gcs_server.options)
    _copy_into(litdata_dir, f"{az}/lit", azurite_server.options)
    txstore.import_parquet(f"{gcs}/pq/part-*.parquet", str(tmp_path / "a"),
                           src_storage_options=gcs_server.options, progress=False)  # fmt: skip
    _same_samples(txstore.open(str(tmp_path / "a")).snapshot(), rows)
    txstore.import_mds(f"{az}/mds", str(tmp_path / "b"),
                       src_storage_options=azurite_server.options, progress=False)  # fmt: skip
    _same_samples(txstore.open(str(tmp_path / "b")).snapshot(), _mds_rows(images, N)[1])
    want = [litdata_expected(i, images) for i in range(N)]
    for name, uri, options in (("c", f"{gcs}/lit", gcs_server.options),
                               ("d", f"{az}/lit", azurite_server.options)):  # fmt: skip
        txstore.import_litdata(uri, str(tmp_path / name), src_storage_options=options,
                               num_workers=2, progress=False)  # fmt: skip
        _same_samples(txstore.open(str(tmp_path / name)).snapshot(), want)


def test_import_modes_are_optimizes(litdata_dir: Path, images: Path, tmp_path: Path):
    dest = str(tmp_path / "st")
    want = [litdata_expected(i, images) for i in range(N)]
    txstore.import_litdata(litdata_dir, dest, num_workers=1, progress=False)
    with pytest.raises(txstore.StoreExistsError):
        txstore.import_litdata(litdata_dir, dest, num_workers=1, progress=False)
    txstore.import_litdata(litdata_dir, dest, mode="append", num_workers=1, progress=False)
    store = txstore.open(dest)
    assert store.version == 2
    _same_samples(store.snapshot(), want + want)
    txstore.import_litdata(litdata_dir, dest, mode="overwrite", num_workers=1, progress=False)
    _same_samples(txstore.open(dest).snapshot(), want)
    assert len(txstore.open(dest).snapshot(2)) == 2 * N  # older versions stay


def test_litdata_export_reads_back_in_litdata(tmp_path: Path):
    rows = [
        {
            "id": i,
            "x": i / 3,
            "name": f"n{i}",
            "blob": bytes([i]) * i,
            "ok": i % 2 == 1,
            "arr": np.arange(i + 1, dtype=np.uint16),
            "img": np.full((2, 3, 3), i, np.uint8),
            "t": torch.full((2, 2), i, dtype=torch.bfloat16),
            "tags": [f"t{i}", "x"],
            "meta": {"w": i, "scores": [0.5, i / 2], "none": None},
        }
        for i in range(40)
    ]
    store = txstore.create(str(tmp_path / "st"), chunk_bytes=4096)
    store.append(rows)
    result = store.snapshot().export_litdata(str(tmp_path / "out"), chunk_bytes="2KB",
                                             progress=False)  # fmt: skip
    assert result.num_samples == 40 and len(result.files) > 2
    ds = litdata.StreamingDataset(str(tmp_path / "out"))
    _same_samples(ds, rows)
    # and back in: the same samples again
    txstore.import_litdata(tmp_path / "out", str(tmp_path / "again"), progress=False)
    _same_samples(txstore.open(str(tmp_path / "again")).snapshot(), rows)


def test_litdata_export_refuses_what_it_cannot_write(tmp_path: Path):
    store = txstore.create(str(tmp_path / "st"))
    store.append([{"a": 1}, {"a": b"one"}])
    with pytest.raises(txstore.EncodeError, match=r"sample 1, field 'a'"):
        store.snapshot().export_litdata(str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    with pytest.raises(txstore.AlreadyExistsError, match="holds files"):
        store.snapshot().export_litdata(str(tmp_path / "out"), progress=False)


@pytest.mark.parametrize("kind", ["litdata", "mds"])
def test_a_field_of_values_two_encodings_hold_is_exported_as_json(kind: str, tmp_path: Path):
    """A field whose first value is None (or an int) and later ones floats (or strs) has no
    one native encoding, but the peer's json holds them all: the export starts again with
    that field as json, and the peer's own reader gives every value back."""
    rows = [
        {"id": i, "score": None if i % 4 == 0 else i / 2, "tag": i if i % 3 else f"s{i}"}
        for i in range(30)
    ]
    store = txstore.create(str(tmp_path / "st"))
    store.append(rows)
    out = tmp_path / "out"
    seen: list[tuple[str, int, int]] = []
    if kind == "litdata":
        store.snapshot().export_litdata(
            str(out), chunk_bytes=256, progress=lambda *a: seen.append(a)
        )
        got = list(litdata.StreamingDataset(str(out)))
    else:
        store.snapshot().export_mds(str(out), size_limit=256, progress=lambda *a: seen.append(a))
        theirs = _streaming().StreamingDataset(local=str(out), batch_size=1)
        got = [theirs[i] for i in range(len(theirs))]
    _same_samples(got, rows)
    assert seen[-1][1:] == (30, 30)
    assert "json" in (out / "index.json").read_text()


# -- MDS -------------------------------------------------------------------------------

MDS_COLUMNS = {
    "int": "int",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "s": "str",
    "b": "bytes",
    "j": "json",
    "nd": "ndarray",
    "nd_fixed": "ndarray:float32:2,3",
    "jpg": "jpeg",
    "png": "png",
    "pil": "pil",
    "si": "str_int",
    "sf": "str_float",
    "jarr": "jpeg_array",
    "jlist": "list[jpeg]",
}


def _mds_rows(images: Path, n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What MDSWriter is given, and what an import must give back."""
    written, expected = [], []
    for i in range(n):
        jpeg_path = images / f"img{i}.jpeg"
        png_bytes = (images / f"img{i}.png").read_bytes()
        jpeg_bytes = jpeg_path.read_bytes()
        values: dict[str, Any] = {
            "int": -(2**40) + i,
            "u8": np.uint8(250 + i % 5),
            "u16": np.uint16(60000 + i),
            "u32": np.uint32(4_000_000_000 + i),
            "u64": np.uint64(2**63 + i),
            "i8": np.int8(-100 + i),
            "i16": np.int16(-30000 + i),
            "i32": np.int32(-(2**31) + i),
            "i64": np.int64(-(2**62) + i),
            "f16": np.float16(i / 4),
            "f32": np.float32(i / 3),
            "f64": np.float64(i / 7),
            "s": f"text {i} ü",
            "b": bytes([i, 0, 255]),
            "j": {"k": [i, None, True, "x"], "f": i / 8},
            "nd": np.arange(i % 4 + 1, dtype=np.int64).reshape(-1, 1) * i,
            "nd_fixed": np.full((2, 3), i, np.float32),
            "si": 10**15 + i,
            "sf": i / 9,
        }
        written.append({
            **values,
            "jpg": Image.open(jpeg_path),  # MDS stores a JPEG file's bytes
            "png": Image.open(images / f"img{i}.png"),  # MDS encodes it anew, with PIL
            "pil": Image.fromarray(_pixels(i)),
            "jarr": [jpeg_bytes, png_bytes],
            "jlist": [Image.open(jpeg_path)],
        })  # fmt: skip
        expected.append({
            **values,
            "jpg": jpeg_bytes,
            "png": _png(images / f"img{i}.png"),
            "pil": _pixels(i),
            "jarr": [jpeg_bytes, png_bytes],
            "jlist": [jpeg_bytes],
        })  # fmt: skip
    return written, expected


def _png(path: Path) -> bytes:
    """The bytes MDS's png encoding stores for an image: PIL's PNG of it."""
    out = io.BytesIO()
    Image.open(path).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def mds_dir(tmp_path_factory: pytest.TempPathFactory, images: Path) -> Path:
    streaming = _streaming()
    out = tmp_path_factory.mktemp("mds") / "ds"
    written, _ = _mds_rows(images, N)
    with streaming.MDSWriter(out=str(out), columns=MDS_COLUMNS, size_limit=4096) as writer:
        for row in written:
            writer.write(row)
    return out


def test_mds_import_gives_every_sample(mds_dir: Path, images: Path, tmp_path: Path):
    assert len(json.loads((mds_dir / "index.json").read_text())["shards"]) > 2
    commit = txstore.import_mds(mds_dir, str(tmp_path / "st"), num_workers=2, progress=False)
    assert commit.num_samples == N
    _, expected = _mds_rows(images, N)
    _same_samples(txstore.open(str(tmp_path / "st")).snapshot(), expected)


def test_an_mds_dataset_imported_exports_back_readable_by_mds(mds_dir: Path, tmp_path: Path):
    """MDSWriter's dataset, imported, then exported: MDS's own reader gives the store's
    samples back (images come in as their files' bytes, and go out as bytes). A column of
    lists of bytes has no MDS encoding that reads back equal: refused, naming it."""
    streaming = _streaming()
    txstore.import_mds(mds_dir, str(tmp_path / "st"), progress=False)
    snap = txstore.open(str(tmp_path / "st")).snapshot()
    with pytest.raises(txstore.EncodeError, match=r"'jarr'|'jlist'"):
        snap.export_mds(str(tmp_path / "all"), progress=False)
    assert not (tmp_path / "all").exists() or not any((tmp_path / "all").iterdir())
    fields = [f for f in snap[0] if f not in ("jarr", "jlist")]
    out = tmp_path / "out"
    snap.select(fields).export_mds(str(out), size_limit=4096, progress=False)
    theirs = streaming.StreamingDataset(local=str(out), batch_size=1)
    got = [theirs[i] for i in range(len(theirs))]
    assert len(json.loads((out / "index.json").read_text())["shards"]) > 2
    want = [{k: s[k] for k in fields} for s in snap]
    for g, w in zip(got, want, strict=True):  # MDS's float64 reads back as numpy.float64
        for k, value in w.items():
            if type(value) is float:
                assert type(g[k]) is np.float64
                g[k] = float(g[k])
    _same_samples(got, want)


def test_mds_list_encodings_and_a_dtype_only_ndarray_import(tmp_path: Path, images: Path):
    """MDSWriter's list[png], list[pil], jpegarray (jpeg_array's other name) and an ndarray
    of a dtype alone (its shape per sample) come in as lists of PNG bytes, of pixel arrays,
    of the bytes given, and arrays."""
    streaming = _streaming()
    columns = {"id": "int", "pngs": "list[png]", "pils": "list[pil]", "ja": "jpegarray",
               "nd": "ndarray:uint16"}  # fmt: skip
    written, want = [], []
    for i in range(12):
        jpeg = (images / f"img{i % N}.jpeg").read_bytes()
        nd = np.arange(i + 1, dtype=np.uint16).reshape(1, -1) * 300
        written.append({"id": i, "pngs": [Image.open(images / f"img{i % N}.png")] * (i % 3 + 1),
                        "pils": [Image.fromarray(_pixels(i)), Image.fromarray(_pixels(i + 1))],
                        "ja": [jpeg], "nd": nd})  # fmt: skip
        want.append({"id": i, "pngs": [_png(images / f"img{i % N}.png")] * (i % 3 + 1),
                     "pils": [_pixels(i), _pixels(i + 1)], "ja": [jpeg], "nd": nd})  # fmt: skip
    out = tmp_path / "ds"
    with streaming.MDSWriter(out=str(out), columns=columns, size_limit=8192) as writer:
        for row in written:
            writer.write(row)
    txstore.import_mds(out, str(tmp_path / "st"), num_workers=1, progress=False)
    _same_samples(txstore.open(str(tmp_path / "st")).snapshot(), want)


def test_mds_compressed_shards(tmp_path: Path, images: Path):
    streaming = _streaming()
    written, expected = _mds_rows(images, 8)
    for algo in ("zstd:5", "gz"):
        out = tmp_path / algo.replace(":", "")
        with streaming.MDSWriter(out=str(out), columns=MDS_COLUMNS, compression=algo,
                                 size_limit=8192) as writer:  # fmt: skip
            for row in written:
                writer.write(row)
        dest = str(tmp_path / f"st-{algo.replace(':', '')}")
        txstore.import_mds(out, dest, num_workers=1, progress=False)
        _same_samples(txstore.open(dest).snapshot(), expected)


def test_mds_shards_of_ints_bytes_and_strs_come_in_as_columns(tmp_path: Path, images: Path):
    """Shards whose columns are all int, bytes, str, jpeg or png are read a column at a time
    over the file's bytes; the samples are those MDS's own reader gives."""
    from txstore.format import peer_mds
    from txstore.format.columnar import decoded

    streaming = _streaming()
    columns = {"id": "int", "blob": "bytes", "text": "str", "jpg": "jpeg", "png": "png"}
    jpeg = (images / "img0.jpeg").read_bytes()
    want = [
        {"blob": bytes([i]) * (i * 3000), "id": -(2**40) + i, "jpg": jpeg,
         "png": _png(images / f"img{i % N}.png"), "text": f"ü {i}" * (i % 4)}
        for i in range(40)
    ]  # fmt: skip
    out = tmp_path / "ds"
    with streaming.MDSWriter(out=str(out), columns=columns, size_limit=300_000) as writer:
        for i, row in enumerate(want):
            writer.write({**row, "jpg": Image.open(images / "img0.jpeg"),
                          "png": Image.open(images / f"img{i % N}.png")})  # fmt: skip
    shards = json.loads((out / "index.json").read_text())["shards"]
    assert len(shards) > 2
    for shard in shards:
        data = (out / shard["raw_data"]["basename"]).read_bytes()
        batch = peer_mds.shard_batch(shard, data, "x")
        assert batch is not None  # the path under test
        got = [
            dict(zip(batch.names, values, strict=True))
            for values in zip(*(decoded(c) for c in batch.columns), strict=True)
        ]
        assert got == list(peer_mds.shard_samples(shard, data, "x"))
    for workers in (1, 2):
        dest = str(tmp_path / f"st{workers}")
        txstore.import_mds(out, dest, num_workers=workers, progress=False)
        _same_samples(txstore.open(dest).snapshot(), want)
    # MDS's own reader (which decodes the images) gives the same ids, bytes and strs.
    theirs = streaming.StreamingDataset(local=str(out), batch_size=1)
    keys = ("id", "blob", "text")
    assert [{k: s[k] for k in keys} for s in theirs] == [{k: w[k] for k in keys} for w in want]


def test_mds_pickle_and_decimal_are_refused_naming_the_column(tmp_path: Path):
    from decimal import Decimal

    streaming = _streaming()
    for column, encoding, value in (("obj", "pkl", {"a": 1}), ("d", "str_decimal", Decimal(1))):
        out = tmp_path / encoding
        with streaming.MDSWriter(out=str(out), columns={"x": "int", column: encoding}) as w:
            w.write({"x": 1, column: value})
        with pytest.raises(txstore.EncodeError, match=f"column '{column}'"):
            txstore.import_mds(out, str(tmp_path / f"st-{encoding}"), progress=False)


def test_mds_export_reads_back_in_streaming(tmp_path: Path):
    streaming = _streaming()
    rows = [
        {
            "id": i,
            "x": i / 3,
            "name": f"n{i}",
            "blob": bytes([i]) * (i + 1),
            "ok": i % 2 == 1,
            "arr": np.arange(i + 1, dtype=np.uint16).reshape(1, -1),
            "small": np.int8(-i),
            "half": np.float16(i / 2),
            "meta": {"w": i, "scores": [0.5, i / 2], "none": None},
        }
        for i in range(40)
    ]
    store = txstore.create(str(tmp_path / "st"), chunk_bytes=4096)
    store.append(rows)
    result = store.snapshot().export_mds(str(tmp_path / "out"), size_limit=1024, progress=False)
    assert result.num_samples == 40 and len(result.files) > 2
    ds = streaming.StreamingDataset(local=str(tmp_path / "out"), batch_size=1)
    got = [ds[i] for i in range(len(ds))]
    # MDS's float64 reads back as numpy.float64 (a float of the same value)
    for g in got:
        assert isinstance(g["x"], np.float64)
        g["x"] = float(g["x"])
    _same_samples(got, rows)
    txstore.import_mds(tmp_path / "out", str(tmp_path / "again"), progress=False)
    back = txstore.open(str(tmp_path / "again")).snapshot()
    assert [float(s["x"]) for s in back] == [r["x"] for r in rows]


# -- Parquet ---------------------------------------------------------------------------


def _parquet_rows(start: int, n: int) -> dict[str, list[Any]]:
    return {
        "id": list(range(start, start + n)),
        "text": [f"row {i}" for i in range(start, start + n)],
        "score": [None if i % 5 == 0 else i / 2 for i in range(start, start + n)],
        "tags": [[f"t{i}"] * (i % 3) for i in range(start, start + n)],
        "blob": [bytes([i % 256]) * 4 for i in range(start, start + n)],
    }


def _parquet_files(folder: Path) -> list[dict[str, Any]]:
    folder.mkdir()
    rows: list[dict[str, Any]] = []
    for part, start in enumerate((0, 30, 70)):
        n = 30 if part < 2 else 25
        cols = _parquet_rows(start, n)
        pq.write_table(pa.table(cols), folder / f"part-{part}.parquet", row_group_size=8)
        rows += [{k: cols[k][j] for k in cols} for j in range(n)]
    (folder / "notes.txt").write_text("not parquet")
    return rows


def test_parquet_import_glob_folder_and_columns(tmp_path: Path):
    rows = _parquet_files(tmp_path / "pq")
    txstore.import_parquet(str(tmp_path / "pq" / "part-*.parquet"), str(tmp_path / "a"),
                           num_workers=2, progress=False)  # fmt: skip
    _same_samples(txstore.open(str(tmp_path / "a")).snapshot(), rows)
    txstore.import_parquet(str(tmp_path / "pq"), str(tmp_path / "b"), columns=["id", "text"],
                           progress=False)  # fmt: skip
    snap = txstore.open(str(tmp_path / "b")).snapshot()
    _same_samples(snap, [{"id": r["id"], "text": r["text"]} for r in rows])
    one = tmp_path / "pq" / "part-1.parquet"
    txstore.import_parquet([one, one], str(tmp_path / "c"), progress=False)
    assert [s["id"] for s in txstore.open(str(tmp_path / "c")).snapshot()] == 2 * list(
        range(30, 60)
    )
    with pytest.raises(txstore.NotFoundError):
        txstore.import_parquet(str(tmp_path / "pq" / "*.nothing"), str(tmp_path / "d"))


def _threads_seen() -> tuple[list[set[str]], Any]:
    """A progress callback that notes the names of the threads alive at each report."""
    seen: list[set[str]] = []

    def progress(stage: str, done: int, total: int | None) -> None:
        seen.append({t.name for t in threading.enumerate()})

    return seen, progress


def _reads_ahead(seen: list[set[str]]) -> bool:
    return any(n.startswith("txstore-read-ahead") for names in seen for n in names)


def test_parquet_import_from_an_object_store_reads_ranges(tmp_path: Path, s3_server: Any):
    # Not files on this machine: the row groups are read through ranged reads of the storage,
    # the next one while the last one is written.
    rows = _parquet_files(tmp_path / "pq")
    src = f"s3://{s3_server.new_bucket()}/pq"
    _copy_into(tmp_path / "pq", src, s3_server.options)
    remote, progress = _threads_seen()
    txstore.import_parquet(src + "/part-*.parquet", str(tmp_path / "a"),
                           src_storage_options=s3_server.options, num_workers=1,
                           progress=progress)  # fmt: skip
    _same_samples(txstore.open(str(tmp_path / "a")).snapshot(), rows)
    assert _reads_ahead(remote)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_a_local_import_reads_ahead_only_with_a_core_to_spare(tmp_path: Path):
    # A worker keeps two cores busy (encoding, writing): from local disk the next row group
    # is read meanwhile only when the process may run on at least two cores per worker.
    rows = _parquet_files(tmp_path / "pq")
    cores = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(cores)})  # one core: none to spare
        one, progress = _threads_seen()
        txstore.import_parquet(str(tmp_path / "pq"), str(tmp_path / "a"), num_workers=1,
                               progress=progress)  # fmt: skip
    finally:
        os.sched_setaffinity(0, cores)
    _same_samples(txstore.open(str(tmp_path / "a")).snapshot(), rows)
    assert one and not _reads_ahead(one)
    if len(cores) < 2:
        pytest.skip("one core: a spare one cannot be shown")
    two, progress = _threads_seen()
    txstore.import_parquet(str(tmp_path / "pq"), str(tmp_path / "b"), num_workers=1,
                           progress=progress)  # fmt: skip
    _same_samples(txstore.open(str(tmp_path / "b")).snapshot(), rows)
    assert _reads_ahead(two)


def test_parquet_export_reads_back_in_pyarrow(tmp_path: Path):
    store = txstore.create(str(tmp_path / "st"), chunk_bytes=2048)
    rows = [{"id": i, "text": f"r{i}", **({"score": i / 2} if i > 50 else {})} for i in range(90)]
    for start in (0, 30, 60):  # a chunk each; the first two without "score"
        store.append(rows[start : start + 30])
    assert len(store.snapshot().chunk_refs()) == 3
    result = store.snapshot().export_parquet(str(tmp_path / "out"), progress=False)
    assert result.num_samples == 90
    table = pads.dataset(str(tmp_path / "out"), format="parquet").to_table()
    # one table of every row, in order: the files sort by name
    assert table.column_names == ["id", "text", "score"]
    assert table.to_pylist() == [{"score": None, **r} for r in rows]


def test_parquet_export_of_arrays_bytes_and_nested_values_reads_back(tmp_path: Path):
    """Arrays of one shape (fixed-size lists), bytes, lists and dicts go out as Arrow types
    (docs/arrow.md) that pyarrow reads back to the same values; an export of one field
    holds that column alone."""
    rows = [
        {"id": i, "blob": bytes([i]) * (i % 5), "emb": np.full((2, 3), i / 4, np.float32),
         "tags": [f"t{i}"] * (i % 3), "meta": {"w": i, "name": f"n{i}"}}
        for i in range(40)
    ]  # fmt: skip
    store = txstore.create(str(tmp_path / "st"), chunk_bytes=1024)
    store.append(rows)
    store.snapshot().export_parquet(str(tmp_path / "out"), progress=False)
    table = pads.dataset(str(tmp_path / "out"), format="parquet").to_table()
    assert pa.types.is_fixed_size_list(table.schema.field("emb").type)
    for got, want in zip(table.to_pylist(), rows, strict=True):
        emb = np.array(got.pop("emb"), np.float32).reshape(2, 3)
        assert np.array_equal(emb, want["emb"])
        assert got == {k: v for k, v in want.items() if k != "emb"}
    store.snapshot().export_parquet(str(tmp_path / "ids"), fields=["id"], progress=False)
    ids = pads.dataset(str(tmp_path / "ids"), format="parquet").to_table()
    assert ids.column_names == ["id"] and ids.column("id").to_pylist() == list(range(40))


def test_mds_export_of_tensors_and_missing_values_reads_back(tmp_path: Path):
    """Torch tensors go out as MDS ndarrays (MDS has no tensor encoding) of the same dtype,
    shape and values; a field with values and Nones as json."""
    streaming = _streaming()
    rows = [{"id": i, "t": torch.arange(i + 1, dtype=torch.int32).reshape(1, -1),
             "maybe": None if i % 2 else [i, "x"]} for i in range(20)]  # fmt: skip
    store = txstore.create(str(tmp_path / "st"))
    store.append(rows)
    store.snapshot().export_mds(str(tmp_path / "out"), size_limit=512, progress=False)
    theirs = streaming.StreamingDataset(local=str(tmp_path / "out"), batch_size=1)
    got = [theirs[i] for i in range(len(theirs))]
    assert len(got) == 20
    for g, r in zip(got, rows, strict=True):
        assert g["id"] == r["id"] and g["maybe"] == r["maybe"]
        assert isinstance(g["t"], np.ndarray) and np.array_equal(g["t"], r["t"].numpy())
        assert g["t"].dtype == np.int32 and g["t"].shape == tuple(r["t"].shape)


# -- the command line ------------------------------------------------------------------


def test_cli_import_and_export(litdata_dir: Path, mds_dir: Path, images: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]):  # fmt: skip
    dest = str(tmp_path / "st")
    assert cli(["import", "litdata", str(litdata_dir), dest, "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 1 and out["num_samples"] == N
    assert cli(["import", "litdata", str(litdata_dir), dest, "-q"]) == 1  # exists: refused
    assert "mode" in capsys.readouterr().err
    assert cli(["import", "mds", str(mds_dir), str(tmp_path / "m"), "-q"]) == 0
    assert "+24 samples" in capsys.readouterr().out
    assert cli(["export", "litdata", dest, str(tmp_path / "out"), "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_samples"] == N and "index.json" in out["files"]
    got = txstore.open(dest).snapshot()
    ds = litdata.StreamingDataset(str(tmp_path / "out"))
    _same_samples(ds, [got[i] for i in range(N)])
    assert cli(["export", "mds", dest, str(tmp_path / "m2"), "--version", "1", "-q"]) == 0
    assert cli(["import", "parquet", str(tmp_path / "nothing-*.parquet"), dest, "-q"]) == 1
    assert "no file matches" in capsys.readouterr().err
    assert cli(["import", "litdata", str(litdata_dir), dest, "--mode", "append", "-q",
                "--storage-option", "key=x"]) == 2  # fmt: skip


def test_import_progress_counts_files(litdata_dir: Path, tmp_path: Path):
    seen: list[tuple[str, int, int]] = []
    txstore.import_litdata(litdata_dir, str(tmp_path / "st"), num_workers=1,
                           progress=lambda *a: seen.append(a))  # fmt: skip
    chunks = len(json.loads((litdata_dir / "index.json").read_text())["chunks"])
    assert seen[0] == ("import litdata", 0, chunks)
    assert seen[-1] == ("import litdata", chunks, chunks)


def test_raw_pil_modes(tmp_path: Path):
    from txstore.format.peer_mds import pixels_of

    def raw(img: Any) -> bytes:
        w, h = img.size
        mode = img.mode.encode()
        return np.array([w, h, len(mode)], np.uint32).tobytes() + mode + img.tobytes()

    gray = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert np.array_equal(pixels_of(raw(Image.fromarray(gray)), "x"), gray)
    bits = np.array([[1, 0, 1, 1, 0, 0, 0, 1, 1], [0] * 9], dtype=bool)
    assert np.array_equal(pixels_of(raw(Image.fromarray(bits)), "x"), bits)
    floats = np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(pixels_of(raw(Image.fromarray(floats, mode="F")), "x"), floats)
    with pytest.raises(txstore.EncodeError, match="mode 'CMYK'"):
        pixels_of(raw(Image.new("CMYK", (2, 2))), "column 'pil'")
    with pytest.raises(txstore.CorruptError):
        pixels_of(raw(Image.fromarray(gray))[:-1], "x")


def test_an_index_naming_a_file_outside_its_folder_is_refused(
    litdata_dir: Path, mds_dir: Path, tmp_path: Path
):
    """A dataset's index is foreign input: a file name in it that leads out of the dataset's
    folder (here to a valid chunk beside it) is refused before anything is read."""
    for kind, source, key in (("litdata", litdata_dir, "chunks"), ("mds", mds_dir, "shards")):
        ds, outside = tmp_path / kind / "ds", tmp_path / kind / "outside"
        shutil.copytree(source, ds)
        outside.mkdir()
        index = json.loads((ds / "index.json").read_text())
        entry = index[key][0]
        name = entry["filename"] if kind == "litdata" else entry["raw_data"]["basename"]
        (ds / name).rename(outside / name)
        if kind == "litdata":
            entry["filename"] = f"../outside/{name}"
        else:
            entry["raw_data"]["basename"] = f"../outside/{name}"
        (ds / "index.json").write_text(json.dumps(index))
        importer = txstore.import_litdata if kind == "litdata" else txstore.import_mds
        dest = tmp_path / kind / "st"
        with pytest.raises(txstore.CorruptError, match=r"unsafe path '\.\./outside/"):
            importer(ds, str(dest), num_workers=1, progress=False)
        assert not (dest / "versions").exists() or not list((dest / "versions").iterdir())


def _first_fixed(shard: dict[str, Any]) -> int:
    return next(k for k, size in enumerate(shard["column_sizes"]) if size == 8)


def _each_shard(edit: Any) -> Any:
    return lambda index: [edit(shard) for shard in index["shards"]]


HOSTILE_INDEXES = [
    ("litdata", lambda ix: ix["chunks"][0].update(chunk_size="18"), r"chunk_size '18' is not"),
    ("litdata", lambda ix: ix["chunks"][0].update(filename=5), r"filename 5 or chunk_size"),
    (
        "litdata",
        lambda ix: ix["config"].update(data_format=[5] * len(ix["config"]["data_format"])),
        r"data_format is not a list of serializer names",
    ),
    ("mds", lambda ix: ix["shards"][0].update(samples="15"), r"samples '15' is not a count"),
    ("mds", lambda ix: ix["shards"][0]["raw_data"].update(basename=5), r"file name 5 is not"),
    (
        "mds",
        _each_shard(lambda sh: sh["column_encodings"].__setitem__(0, 5)),
        r"column name or encoding is not a str",
    ),
    # Two that were imported: a value silently lost, and every value shifted.
    (
        "mds",
        _each_shard(lambda sh: sh["column_names"].__setitem__(1, sh["column_names"][0])),
        r"a column name appears twice",
    ),
    (
        "mds",
        _each_shard(lambda sh: sh["column_sizes"].__setitem__(_first_fixed(sh), 4)),
        r"column 'f64' of encoding 'float64' takes 8 bytes, the index says 4",
    ),
]


@pytest.mark.parametrize(("kind", "edit", "message"), HOSTILE_INDEXES)
def test_a_hostile_index_is_refused_and_nothing_committed(
    kind: str, edit: Any, message: str, litdata_dir: Path, mds_dir: Path, tmp_path: Path
):
    ds = tmp_path / "ds"
    shutil.copytree(litdata_dir if kind == "litdata" else mds_dir, ds)
    index = json.loads((ds / "index.json").read_text())
    edit(index)
    (ds / "index.json").write_text(json.dumps(index))
    importer = txstore.import_litdata if kind == "litdata" else txstore.import_mds
    with pytest.raises(txstore.TxstoreError, match=message):
        importer(ds, str(tmp_path / "st"), num_workers=1, progress=False)
    assert not (tmp_path / "st" / "versions").exists()


def test_an_mds_sample_longer_than_its_columns_is_corrupt():
    """Bytes left after a sample's columns mean the index's sizes are not the file's."""
    from txstore.format import peer_mds

    def shard_bytes(sample: bytes) -> bytes:  # one sample: [n][2 offsets][sample]
        return b"".join(x.to_bytes(4, "little") for x in (1, 12, 12 + len(sample))) + sample

    shard = {"column_names": ["a"], "column_encodings": ["bytes"], "column_sizes": [None],
             "samples": 1}  # fmt: skip
    size = (2).to_bytes(4, "little")
    assert list(peer_mds.shard_samples(shard, shard_bytes(size + b"ab"), "x")) == [{"a": b"ab"}]
    # The column reader reads the same, and leaves a shard it finds unsound to the other,
    # which names what is wrong: bytes left over, a str that is not UTF-8.
    from txstore.format.columnar import decoded

    batch = peer_mds.shard_batch(shard, shard_bytes(size + b"ab"), "x")
    assert batch is not None and decoded(batch.columns[0]) == [b"ab"]
    assert peer_mds.shard_batch(shard, shard_bytes(size + b"abzz"), "x") is None
    with pytest.raises(txstore.CorruptError, match="sample 0 has 2 bytes after its columns"):
        list(peer_mds.shard_samples(shard, shard_bytes(size + b"abzz"), "x"))
    # An int column whose bytes run past the sample (and the file): left to shard_samples,
    # which names it, never read past the end.
    ints = {**shard, "column_names": ["a", "n"], "column_encodings": ["bytes", "int"],
            "column_sizes": [None, 8]}  # fmt: skip
    short = shard_bytes((3).to_bytes(4, "little") + b"abc" + b"\x01\x02")
    assert peer_mds.shard_batch(ints, short, "x") is None
    with pytest.raises(txstore.CorruptError, match=r"sample 0, column 'n' runs past"):
        list(peer_mds.shard_samples(ints, short, "x"))
    text = {**shard, "column_encodings": ["str"]}
    assert peer_mds.shard_batch(text, shard_bytes(size + b"\xc3("), "x") is None
    with pytest.raises(txstore.CorruptError, match=r"sample 0, column 'a'.*utf-8"):
        list(peer_mds.shard_samples(text, shard_bytes(size + b"\xc3("), "x"))


def test_bad_index_is_named(tmp_path: Path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "index.json").write_text("{not json")
    with pytest.raises(txstore.CorruptError, match=r"index\.json"):
        txstore.import_litdata(tmp_path / "ds", str(tmp_path / "a"), progress=False)
    with pytest.raises(txstore.CorruptError, match=r"index\.json"):
        txstore.import_mds(tmp_path / "ds", str(tmp_path / "a"), progress=False)
    with pytest.raises(txstore.NotFoundError, match=r"index\.json"):
        txstore.import_mds(tmp_path / "nowhere", str(tmp_path / "a"), progress=False)


def test_hugging_face_dataset_appends_through_its_arrow_table():
    datasets = pytest.importorskip("datasets")
    columns = {
        "id": list(range(50)),
        "text": [f"t{i}" for i in range(50)],
        "emb": [[i / 2, i / 4] for i in range(50)],
    }
    ds = datasets.Dataset.from_dict(columns)
    store = txstore.create("memory://hf-" + os.urandom(4).hex())
    store.append(ds.data.table)  # the Arrow table under the dataset: a column at a time
    want = [{k: columns[k][i] for k in columns} for i in range(50)]
    _same_samples(store.snapshot(), want)


def test_default_workers_are_no_more_than_the_source_has_chunks_worth(tmp_path):
    # Each worker ends with a part-filled chunk the parent re-packs: a source smaller than
    # a chunk is read by one process whatever the cores.
    from txstore.interop.imports import _workers

    dest = str(tmp_path / "st")
    mib = 1024 * 1024
    assert _workers(None, 10, 10 * mib, "64MiB", dest, None) == 1
    # A worker keeps two cores busy (encoding, and writing its chunks): one per two cores.
    cores = os.cpu_count() or 1
    assert _workers(None, 10, 3 * 64 * mib, "64MiB", dest, None) == max(1, min(cores // 2, 3))
    assert _workers(None, 10, 0, "64MiB", dest, None) == 1
    assert _workers(4, 10, 0, "64MiB", dest, None) == 4
    assert _workers(None, 10, 10**12, "64MiB", "memory://x", None) == 1


@pytest.mark.parametrize("kind", ["mds", "parquet"])
def test_mds_and_parquet_imports_take_modes_and_report_progress(
    kind: str, mds_dir: Path, images: Path, tmp_path: Path
):
    """The modes and progress of ``optimize``, as ``import_litdata`` has them: a store that
    exists is refused, appended to or overwritten (older versions kept); progress counts
    shards, or Parquet row groups, from none to all."""
    if kind == "mds":
        src: Any = mds_dir
        run = txstore.import_mds
        want = _mds_rows(images, N)[1]
        units = len(json.loads((mds_dir / "index.json").read_text())["shards"])
        stage = "import mds"
    else:
        want = _parquet_files(tmp_path / "pq")
        src = str(tmp_path / "pq" / "part-*.parquet")
        run = txstore.import_parquet
        units = sum(pq.ParquetFile(p).num_row_groups for p in (tmp_path / "pq").glob("*.parquet"))
        stage = "import parquet"
    dest = str(tmp_path / "st")
    seen: list[tuple[str, int, int]] = []
    run(src, dest, num_workers=1, progress=lambda *a: seen.append(a))
    assert units > 2 and seen[0] == (stage, 0, units) and seen[-1] == (stage, units, units)
    with pytest.raises(txstore.StoreExistsError):
        run(src, dest, num_workers=1, progress=False)
    run(src, dest, mode="append", num_workers=2, progress=False)
    _same_samples(txstore.open(dest).snapshot(), want + want)
    run(src, dest, mode="overwrite", num_workers=1, progress=False)
    store = txstore.open(dest)
    assert store.version == 3
    _same_samples(store.snapshot(), want)
    assert len(store.snapshot(2)) == 2 * len(want)


def test_cli_imports_parquet_in_each_mode_and_exports_parquet_and_mds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """``txstore import parquet`` with ``--mode append`` and ``overwrite``, progress on
    stderr with ``--progress``, then ``txstore export parquet`` and ``mds`` read back by
    pyarrow and MDS's own reader."""
    streaming = _streaming()
    rows = _parquet_files(tmp_path / "pq")
    src, dest = str(tmp_path / "pq" / "part-*.parquet"), str(tmp_path / "st")
    assert cli(["import", "parquet", src, dest, "--progress", "--num-workers", "1"]) == 0
    captured = capsys.readouterr()
    assert "import parquet" in captured.err and f"+{len(rows)} samples" in captured.out
    assert cli(["import", "parquet", src, dest, "--mode", "append", "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 2 and out["num_samples"] == len(rows)  # added
    assert out["total_samples"] == 2 * len(rows)
    _same_samples(txstore.open(dest).snapshot(), rows + rows)
    assert cli(["import", "parquet", src, dest, "--mode", "overwrite", "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 3 and out["total_samples"] == len(rows)
    _same_samples(txstore.open(dest).snapshot(), rows)
    # out again: Parquet files pyarrow reads, an MDS dataset MDS reads
    assert cli(["export", "parquet", dest, str(tmp_path / "outpq"), "--json", "-q"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert files and all(f.endswith(".parquet") for f in files)
    back = pq.read_table(str(tmp_path / "outpq")).sort_by("id").to_pylist()
    _same_samples(back, rows)
    assert cli(["export", "mds", dest, str(tmp_path / "outmds"), "--version", "1", "-q"]) == 0
    theirs = streaming.StreamingDataset(local=str(tmp_path / "outmds"), batch_size=1)
    got = [theirs[i] for i in range(len(theirs))]
    for g in got:  # MDS's float64 reads back as numpy.float64; its missing values as None
        if g["score"] is not None:
            g["score"] = float(g["score"])
    _same_samples(got, rows)
