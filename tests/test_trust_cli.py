"""The command line and the refs it reads: forged refs are damage (exit 3), never bad usage;
no traceback when the reader of stdout leaves, at exit, or without torch; plain progress lines
off a terminal; the version; errors that say what exists."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import txstore
from txstore.cli import output

from .conftest import Backend
from .test_cli import ok, run
from .test_operations import make
from .workers import REPO, python


def forge(path: Path, **fields: Any) -> None:
    """Rewrite fields of a stored JSON document in place (a damaged or hostile copy)."""
    doc = json.loads(path.read_bytes())
    doc.update(fields)
    path.write_text(json.dumps(doc))


# -- refs read from storage are checked ------------------------------------------------------


def test_a_tag_that_names_another_tag_is_damage(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = make(backend, appends=3)
    store.tag("x", 1)
    key = "refs/tags/x.json"
    forge(tmp_path / "store" / key, name="other/../x")

    with pytest.raises(txstore.CorruptError, match=re.escape(key)):
        store.tags()
    with pytest.raises(txstore.CorruptError, match=re.escape(key)):
        store.tag_info("x")
    with pytest.raises(txstore.CorruptError, match=re.escape(key)):
        store.vacuum(grace=0, dry_run=True)

    uri = backend.uri
    for args in (
        ["tags", uri],
        ["show", uri, "x"],
        ["vacuum", uri, "--dry-run"],
        ["expire", uri, "--keep-last", "1", "--dry-run"],
        ["verify", uri],
    ):
        proc = run(*args)
        assert proc.returncode == 3, (args, proc.stdout, proc.stderr)
        assert key in proc.stdout + proc.stderr, args
        assert "Traceback" not in proc.stderr, args
    assert "other/../x" not in run("tags", uri).stdout  # never listed as a tag

    # Exit code 2 stays for what the arguments get wrong.
    for args in (
        ["rollback", uri, "3", "--yes"],  # the latest already
        ["expire", uri, "--keep-last", "0", "--yes"],
        ["expire", uri, "--older-than", "soon", "--yes"],
        ["untag", uri, "../x", "--yes"],
        ["log", "ftp://somewhere/x"],
    ):
        proc = run(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert txstore.open(uri).version == 3


def test_a_tag_named_by_digits_is_damage(tmp_path: Path) -> None:
    """A digits-only name reads as a version number: txstore never writes one."""
    backend = Backend("local", str(tmp_path / "store"))
    store = make(backend, appends=2)
    store.tag("x", 1)
    stored = tmp_path / "store" / "refs" / "tags"
    (stored / "123.json").write_bytes((stored / "x.json").read_bytes())
    forge(stored / "123.json", name="123")
    with pytest.raises(txstore.CorruptError, match=re.escape("refs/tags/123.json")):
        store.tags()
    proc = run("vacuum", backend.uri, "--dry-run")
    assert proc.returncode == 3 and "refs/tags/123.json" in proc.stderr, proc.stderr


def test_stored_times_out_of_range_are_reported_not_raised(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = make(backend, appends=2)
    store.tag("x", 1)
    root = tmp_path / "store"
    lease = store.lease(1, ttl=3600)
    lease_file = root / "refs" / "leases" / f"{lease.id}.json"
    lease_doc = lease_file.read_bytes()
    lease.release()  # stops its renewal, which would rewrite the forged copy
    forge(root / "refs" / "tags" / "x.json", timestamp=1e20)
    proc = run("tags", backend.uri)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "refs/tags/x.json" in proc.stderr and "Traceback" not in proc.stderr

    (root / "refs" / "tags" / "x.json").unlink()
    lease_file.write_bytes(lease_doc)
    forge(lease_file, expires_at=1e20)
    proc = run("leases", backend.uri)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert f"refs/leases/{lease.id}.json" in proc.stderr and "Traceback" not in proc.stderr
    lease_file.unlink()

    # A version expired "at" an impossible time: the error about it still reads.
    store.expire(keep_last=1)
    forge(root / "refs" / "retention.json", expired=[{"first": 0, "last": 1, "expired_at": 1e20}])
    with pytest.raises(txstore.TxstoreError):
        txstore.open(backend.uri).snapshot(0)
    proc = run("cat", backend.uri, "0", "--version", "0")
    assert proc.returncode in (1, 3) and "Traceback" not in proc.stderr, proc.stderr


def test_when_never_raises() -> None:
    late = datetime.max.replace(tzinfo=timezone(-timedelta(hours=1)))  # past year 9999 in UTC
    with pytest.raises(OverflowError):
        late.astimezone(timezone.utc)
    assert "9999" in output._when(late)


# -- the process around the command ------------------------------------------------------------


def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """``txstore ls URI | head -1``: a listing bigger than a pipe holds, read one line."""
    uri = str(tmp_path / "store")
    store = txstore.create(uri, chunk_bytes=1, block_bytes=1)  # a chunk per sample
    store.append([{"i": i} for i in range(2000)])
    for _ in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-m", "txstore.cli", "ls", uri],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        proc.stderr.close()
        code = proc.wait(timeout=120)
        assert first.split() == [b"path", b"samples", b"bytes"]
        assert err == b"", err.decode()
        assert code == output.EXIT_BROKEN_PIPE


def test_version_option() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert ok("--version") == f"txstore {project['version']}\n"


def test_no_complaint_at_interpreter_exit(tmp_path: Path) -> None:
    """A store still open when the interpreter exits, freed only after txstore's modules are
    torn down: nothing may be printed."""
    make(Backend("local", str(tmp_path / "store")), appends=2)
    proc = python(
        f"""
        import os
        import txstore
        store = txstore.open({str(tmp_path / "store")!r})
        assert len(list(store.snapshot())) == 20
        # Held by a module that outlives txstore's at exit (as a registry, a cache or a
        # handler in a library imported first would hold it), and never closed.
        os.kept_store = store
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_a_missing_version_names_the_latest(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = make(backend, appends=2)
    with pytest.raises(txstore.VersionNotFoundError, match=r"version 99 .*\(latest is 2\)"):
        store.snapshot(99)
    with pytest.raises(txstore.VersionNotFoundError, match=r"\(latest is 2\)"):
        store.diff(1, 7)
    proc = run("show", backend.uri, "99")
    assert proc.returncode == 1 and "(latest is 2)" in proc.stderr, proc.stderr


# -- progress ---------------------------------------------------------------------------------


def test_cli_progress_into_a_log(tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    make(backend, appends=5)
    compact = run("compact", backend.uri, "--yes", "--progress")
    assert compact.returncode == 0, compact.stderr
    assert "\r" not in compact.stderr
    assert compact.stderr.splitlines()[-1].startswith("compacting: 50/50 ")
    vacuum = run("vacuum", backend.uri, "--dry-run", "--progress")
    assert vacuum.returncode == 0, vacuum.stderr
    assert "\r" not in vacuum.stderr
    stages = [line.partition(":")[0] for line in vacuum.stderr.splitlines()]
    assert {"reading manifests", "reading segments"} <= set(stages)
    assert "reading manifests: 7/7 " in vacuum.stderr  # versions 0-6, the final count
    quiet = run("vacuum", backend.uri, "--dry-run", "--progress", "-q")
    assert quiet.returncode == 0 and quiet.stderr == ""


# -- dependencies -----------------------------------------------------------------------------


def test_numpy_is_a_dependency() -> None:
    """Arrays are a core value type: ``txstore cat`` and the getting-started example need it."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(d.replace(" ", "").startswith("numpy>=") for d in project["dependencies"])


def test_streaming_dataset_without_torch_says_what_to_install(tmp_path: Path) -> None:
    make(Backend("local", str(tmp_path / "store")), appends=1)
    proc = python(
        f"""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import txstore
        assert len(txstore.open({str(tmp_path / "store")!r}).snapshot()) == 10
        for name in ("StreamingDataset", "StreamingDataLoader"):
            try:
                getattr(txstore, name)
            except ImportError as e:
                print(name, e)
            else:
                raise SystemExit(name + " imported without torch")
        """
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["StreamingDataset", "StreamingDataLoader"]
    assert all("txstore[torch]" in line for line in lines), lines
