"""What a new user hits first: a failed optimize, fn's odd returns, odd dataset arguments and
field names no sample has."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import txstore
from txstore.errors import (
    AlreadyExistsError,
    EncodeError,
    InputError,
    StoreExistsError,
    StoreNotFoundError,
)
from txstore.storage import open_storage
from txstore.store.ingest import optimize

from .conftest import Backend
from .workers import REPO

# -- a failed optimize leaves nothing that blocks its rerun ---------------------------------


def _good(i: int) -> dict[str, Any]:
    return {"id": i, "pad": os.urandom(300)}


def _raises(i: int) -> dict[str, Any]:
    if i == 250:
        raise ValueError("corrupt image")
    return _good(i)


def _unencodable(i: int) -> dict[str, Any]:
    return {"id": i, "bad": object()} if i == 250 else _good(i)


def _everything(backend: Backend) -> list[str]:
    return sorted(f.key for f in open_storage(backend.uri, backend.storage_options).list(""))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fn", [_raises, _unencodable], ids=["raises", "unencodable"])
def test_a_failed_first_optimize_leaves_no_store(backend: Backend, workers: int, fn: Any) -> None:
    if backend.name == "memory" and workers > 1:
        pytest.skip("a memory store lives in one process")
    kwargs: dict[str, Any] = dict(
        num_workers=workers,
        storage_options=backend.storage_options,
        chunk_bytes="16KB",
        progress=False,
    )
    with pytest.raises((InputError, EncodeError), match="input 250 "):
        optimize(fn, range(300), backend.uri, **kwargs)
    with pytest.raises(StoreNotFoundError):
        txstore.open(backend.uri, **backend.kwargs())
    assert _everything(backend) == []  # no manifest, no chunk: nothing was committed
    if backend.name == "local":
        assert not os.path.exists(backend.uri)  # the folder it made is gone too
    commit = optimize(_good, range(300), backend.uri, **kwargs)  # the corrected rerun
    store = txstore.open(backend.uri, **backend.kwargs())
    assert commit.version == store.version == 1
    assert sorted(s["id"] for s in store.snapshot()) == list(range(300))


def test_a_failed_optimize_keeps_the_folder_it_was_given(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError):
        optimize(_raises, range(1000), str(out), chunk_bytes="16KB", progress=False)
    assert out.is_dir() and list(out.iterdir()) == []  # the caller's folder stays, emptied
    assert optimize(_good, range(10), str(out), progress=False).version == 1


KILLED = """
import sys
from txstore.store.ingest import optimize
optimize(lambda i: {"id": i, "pad": bytes(300)}, range(10**8), sys.argv[1],
         chunk_bytes=4096, progress=False)
"""


def test_a_killed_optimize_does_not_block_the_rerun(tmp_path: Path) -> None:
    out = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(out)], cwd=REPO)
    chunks = out / "chunks"
    try:
        while not (chunks.is_dir() and any(p.suffix == ".chunk" for p in chunks.iterdir())):
            assert child.poll() is None, "the writer ended before it was killed"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert optimize(_good, range(10), str(out), progress=False).version == 1
    store = txstore.open(str(out))
    assert sorted(s["id"] for s in store.snapshot()) == list(range(10))


def test_optimize_refuses_a_folder_of_other_files(backend: Backend) -> None:
    storage = open_storage(backend.uri, backend.storage_options)
    storage.write("notes.txt", b"my notes")
    storage.write("data/images.tar", b"\0" * 100)
    before = _everything(backend)
    for workers in (0, 2):
        with pytest.raises(AlreadyExistsError, match=r"holds files and no txstore store") as info:
            optimize(
                _good,
                range(100),
                backend.uri,
                mode="append",
                num_workers=workers,
                storage_options=backend.storage_options,
                progress=False,
            )
        assert not isinstance(info.value, StoreExistsError)
        assert _everything(backend) == before  # nothing written among them
    assert storage.read("notes.txt") == b"my notes"


def test_optimize_refuses_a_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_bytes(b"not a folder")
    with pytest.raises(AlreadyExistsError, match="is a file"):
        optimize(_good, range(10), str(out), progress=False)
    assert out.read_bytes() == b"not a folder"


# -- fn's returns, and unencodable samples, name the input ----------------------------------


@pytest.mark.parametrize(
    ("returned", "shown"),
    [(None, "None"), (5, r"5 \(of type int\)"), ("text", r"'text' \(of type str\)")],
)
def test_fn_returning_no_sample_says_what_it_returned(
    tmp_path: Path, returned: Any, shown: str
) -> None:
    def fn(i: int) -> Any:
        return returned if i == 3 else {"id": i}

    with pytest.raises(InputError, match=rf"fn returned {shown} for input 3 \(3\): .*a dict") as e:
        optimize(fn, range(10), str(tmp_path / "s"), progress=False)
    assert e.value.index == 3
    assert "iterable of dicts" in str(e.value)
    assert "not iterable" not in str(e.value)


def _bad_second_sample_of_13(i: int) -> Iterator[dict[str, Any]]:
    yield {"id": 2 * i}
    yield {"id": 2 * i + 1, "bad": object() if i == 13 else 0}


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unencodable_sample_names_its_input(tmp_path: Path, workers: int) -> None:
    with pytest.raises(EncodeError) as e:
        optimize(
            _bad_second_sample_of_13,
            range(20),
            str(tmp_path / "s"),
            num_workers=workers,
            progress=False,
        )
    assert e.value.index == 13
    # Input 13 is the fourth of the second worker's share: its position there is not shown.
    assert str(e.value).startswith("input 13 (13), its sample 1, key 'bad': unsupported type")
    with pytest.raises(StoreNotFoundError):
        txstore.open(str(tmp_path / "s"))


def test_a_non_dict_sample_names_its_input(tmp_path: Path) -> None:
    with pytest.raises(EncodeError, match=r"^input 4 \(4\), its sample 0: expected a dict") as e:
        optimize(
            lambda i: [i] if i == 4 else [{"id": i}], range(9), str(tmp_path / "s"), progress=False
        )
    assert e.value.index == 4


# -- StreamingDataset and StreamingDataLoader check their arguments at once -----------------

try:
    from txstore.torch import StreamingDataLoader, StreamingDataset
except ImportError:  # the optimize tests above run without torch
    StreamingDataLoader = StreamingDataset = None  # type: ignore[assignment,misc]
needs_torch = pytest.mark.skipif(StreamingDataset is None, reason="needs torch (txstore[torch])")


def _small_store(uri: str) -> txstore.Store:
    store = txstore.create(uri, chunk_bytes=4096)
    store.append({"id": i, "latent_256": bytes(8), "caption": f"c{i}"} for i in range(300))
    return store


@needs_torch
def test_cache_size_as_text_bounds_a_whole_epoch_read_by_two_workers(
    s3_server: Any, tmp_path: Path
) -> None:
    uri, opts = f"s3://{s3_server.new_bucket()}/store", s3_server.options
    store = txstore.create(uri, chunk_bytes="256KB", storage_options=opts)
    store.append({"id": i, "pad": os.urandom(10_000)} for i in range(400))  # 4 MB, 16 chunks
    cache = tmp_path / "cache"
    ds = StreamingDataset(
        uri, storage_options=opts, shuffle=True, cache_dir=str(cache), max_cache_size="2MB"
    )
    assert ds.max_cache_size == 2_000_000
    loader = StreamingDataLoader(ds, batch_size=10, num_workers=2)
    ids = [int(i) for batch in loader for i in batch["id"]]
    assert sorted(ids) == list(range(400))
    # Each worker evicts what it has finished down to the bound; chunks being read stay.
    held = sum(p.stat().st_size for p in (cache / "chunks").iterdir())
    assert held <= 2_000_000 + 2 * 3 * 300_000


@needs_torch
def test_cache_sizes_as_litdata_takes_them(tmp_path: Path) -> None:
    snap = _small_store(str(tmp_path / "s")).snapshot()
    sizes: list[tuple[Any, int]] = [("64MiB", 64 * 2**20), ("100GB", 10**11), (4096, 4096), (0, 0)]
    for size, expected in sizes:
        assert StreamingDataset(snap, max_cache_size=size).max_cache_size == expected


def _f(sample: Any) -> Any:
    return sample


@needs_torch
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"shuffle": "yes"}, TypeError, "shuffle must be True or False, not 'yes'"),
        ({"drop_last": 1}, TypeError, "drop_last must be True or False"),
        ({"zero_copy": "no"}, TypeError, "zero_copy must be True or False"),
        ({"transform": [_f, _f]}, TypeError, "transform must be a function or None"),
        ({"seed": "7"}, TypeError, "seed must be an int, not '7'"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"shuffle_window": "2"}, TypeError, "shuffle_window must be an int"),
        ({"prefetch_chunks": -1}, ValueError, "prefetch_chunks must be at least 0"),
        ({"max_cache_size": "2 parsecs"}, ValueError, "max_cache_size: cannot read '2 parsecs'"),
        ({"max_cache_size": True}, TypeError, "max_cache_size must be bytes"),
        ({"max_cache_size": 2.5e9}, TypeError, "max_cache_size must be bytes"),
        ({"max_cache_size": -5}, ValueError, "size must be positive"),
        ({"fields": "caption"}, TypeError, "fields must be a list of field names"),
        ({"fields": ["id", 3]}, TypeError, "fields must be a list of field names"),
        ({"cache_dir": 5}, TypeError, "cache_dir must be a path"),
        ({"version": "x", "storage_options": "s3"}, TypeError, "storage_options must be a dict"),
    ],
)
def test_dataset_arguments_are_checked_at_construction(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    store = _small_store(str(tmp_path / "s"))
    with pytest.raises(error, match=match):
        StreamingDataset(str(tmp_path / "s"), **kwargs)
    assert store.leases() == []  # refused before anything was made


@needs_torch
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_workers": "2"}, TypeError, "num_workers must be an int"),
        ({"batch_size": "16"}, TypeError, "batch_size must be an int"),
        ({"pin_memory": "yes"}, TypeError, "pin_memory must be True or False"),
        ({"drop_last": None}, TypeError, "drop_last must be True or False"),
        ({"collate_fn": [_f]}, TypeError, "collate_fn must be a function or None"),
        ({"worker_init_fn": 5}, TypeError, "worker_init_fn must be a function or None"),
        ({"timeout": "1"}, TypeError, "timeout must be a number of seconds"),
        ({"shuffle": True}, ValueError, "shuffle=True to the StreamingDataset"),
        ({"no_such": 1}, TypeError, "StreamingDataLoader: got an unexpected keyword"),
    ],
)
def test_loader_arguments_are_checked_at_construction(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    ds = StreamingDataset(_small_store(str(tmp_path / "s")).snapshot())
    with pytest.raises(error, match=match):
        StreamingDataLoader(ds, **kwargs)


@needs_torch
def test_set_epoch_and_set_distributed_take_ints(tmp_path: Path) -> None:
    ds = StreamingDataset(_small_store(str(tmp_path / "s")).snapshot(), shuffle=True)
    with pytest.raises(TypeError, match="epoch must be an int"):
        ds.set_epoch("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="world_size must be an int"):
        ds.set_distributed(0, 2.0)  # type: ignore[arg-type]
    import numpy as np

    ds.set_epoch(np.int64(2))  # type: ignore[arg-type]  # numpy's ints are ints
    assert ds.epoch == 2 and type(ds.epoch) is int


# -- a field no sample has is named, with the fields there are ------------------------------


@needs_torch
def test_a_field_no_sample_has_is_refused_with_close_matches_first(tmp_path: Path) -> None:
    snap = _small_store(str(tmp_path / "s")).snapshot()
    with pytest.raises(txstore.FieldNotFoundError) as e:
        snap.select(["latnet_256", "id"])
    text = str(e.value)
    assert "'latnet_256' (did you mean 'latent_256'?)" in text
    assert text.endswith("its fields: 'latent_256', 'caption', 'id'")  # the close one first
    assert isinstance(e.value, KeyError) and isinstance(e.value, txstore.NotFoundError)
    with pytest.raises(txstore.FieldNotFoundError, match="'latnet_256'"):
        StreamingDataset(snap, fields=["latnet_256"])
    ds = StreamingDataset(snap, fields=["latent_256", "id"])  # the right names read as ever
    loader = StreamingDataLoader(ds, batch_size=30, num_workers=2)
    assert sorted(int(i) for batch in loader for i in batch["id"]) == list(range(300))


def test_a_field_only_later_chunks_have_is_known(tmp_path: Path) -> None:
    store = txstore.create(str(tmp_path / "s"), chunk_bytes=1024)
    store.append({"id": i, "pad": bytes(200)} for i in range(600))  # over a hundred chunks
    store.append([{"id": 600, "late": 1}])
    snap = store.snapshot()
    assert len(snap.chunks()) > 100
    assert list(snap.select(["late"], missing="skip")) == [{"late": 1}]
    assert list(snap.select(["late"], missing=0))[-2:] == [{"late": 0}, {"late": 1}]
    with pytest.raises(txstore.FieldNotFoundError, match=r"'lte' \(did you mean 'late'\?\)"):
        snap.select(["lte"])


def test_added_and_dropped_fields(tmp_path: Path) -> None:

    store = _small_store(str(tmp_path / "s"))
    store.add_fields(lambda s: {"latent_512": s["id"]}, ["latent_512"])
    assert store.snapshot().select(["latent_512"])[7] == {"latent_512": 7}
    store.drop_fields(["latent_512", "caption"])
    snap = store.snapshot()
    for gone in ("latent_512", "caption"):
        with pytest.raises(txstore.FieldNotFoundError, match=rf"'{gone}'"):
            snap.select([gone])
    assert snap.select(["id"])[3] == {"id": 3}
    assert store.snapshot(2).select(["latent_512"])[7] == {"latent_512": 7}  # still there


def _first_run(storage: Any) -> Any:
    return optimize(lambda i: {"id": i}, range(50), storage, chunk_bytes=256, progress=False)


def test_a_storage_fault_at_any_step_of_a_first_optimize_never_blocks_the_rerun(
    tmp_path: Path,
) -> None:
    from .faults import FaultyStorage

    probe = FaultyStorage(open_storage(str(tmp_path / "probe")))
    _first_run(probe)
    steps = len(probe.calls)
    assert steps >= 10
    outcomes = set()
    for mode in ("before", "after"):
        for k in range(1, steps + 1):
            uri = str(tmp_path / f"{mode}-{k}")
            try:
                _first_run(FaultyStorage(open_storage(uri), fail_at=k, mode=mode))
                landed = True
            except txstore.TxstoreError:  # the fault, or what it led to
                landed = False
            outcomes.add(landed)
            rerun = lambda i: {"id": 100 + i}  # noqa: E731
            if landed:
                assert sorted(s["id"] for s in txstore.open(uri).snapshot()) == list(range(50))
                with pytest.raises(StoreExistsError):
                    optimize(rerun, range(5), uri, progress=False)
                continue
            # Nothing committed: the rerun is a first run (at most an empty store was left).
            commit = optimize(rerun, range(5), uri, chunk_bytes=256, progress=False)
            store = txstore.open(uri)
            assert commit.version == store.version == 1
            assert sorted(s["id"] for s in store.snapshot()) == list(range(100, 105))
            assert store.verify(deep=True).ok
    assert outcomes == {True, False}
