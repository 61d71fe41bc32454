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
from txstore.ingest import optimize
from txstore.storage import open_storage

from .conftest import Backend
from .helpers import REPO

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
    kwargs = dict(
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
    assert out.is_dir()  # made by the caller: left in place
    assert optimize(_good, range(10), str(out), progress=False).version == 1


KILLED = """
import sys
from txstore.ingest import optimize
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
