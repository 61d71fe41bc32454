"""The ``txstore`` command line: most commands in this process through ``cli.main`` (the code
the entry point runs, without an interpreter started for each), and through the real entry point
in subprocesses where the process is the point: exit codes, a terminal's prompt."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import subprocess
import sys
from typing import Any, NamedTuple

import pytest

import txstore
from txstore import cli

from .conftest import Backend
from .test_operations import make, reopen
from .workers import REPO, run_cli

COMMANDS = [
    "log",
    "show",
    "info",
    "ls",
    "cat",
    "diff",
    "tags",
    "tag",
    "untag",
    "leases",
    "rollback",
    "expire",
    "vacuum",
    "compact",
    "verify",
]


class Result(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run(*args: str) -> Result:
    """``txstore ARGS`` in this process, stdin empty and not a terminal (as under a pipe)."""
    out, err = io.StringIO(), io.StringIO()
    stdin, sys.stdin = sys.stdin, io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.stdin = stdin
    return Result(code, out.getvalue(), err.getvalue())


def ok(*args: str) -> str:
    proc = run(*args)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


def as_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json"))


def options(backend: Backend) -> list[str]:
    """The backend's storage options as the command line takes them."""
    opts = backend.storage_options or {}
    out = []
    for key, value in opts.items():
        if key == "client_kwargs":
            out += [f"{k}={v}" for k, v in value.items()]
        else:
            out.append(f"{key}={value}")
    return [arg for pair in out for arg in ("--storage-option", pair)]


def test_help_reads_well(capsys: pytest.CaptureFixture[str]) -> None:
    top = run_cli("--help").stdout
    for command in COMMANDS:
        assert f"\n    {command} " in top, command
    assert "exit codes" in top and "3  damage: verify found some" in top
    for command in COMMANDS:  # in-process: the same parser, without 15 interpreters
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: txstore {command} ")
        assert "--storage-option KEY=VALUE" in text and "exit codes" in text
    assert run_cli("frobnicate", "x").returncode == 2
    assert run_cli("log").returncode == 2  # no store given


def test_on_s3_with_storage_options(s3_server: Any) -> None:
    """The options reach s3fs: a few commands against the moto server."""
    backend = Backend("s3", f"s3://{s3_server.new_bucket()}/cli", s3_server.options)
    make(backend, appends=3)
    uri, opts = backend.uri, options(backend)
    assert "--storage-option" in opts and "endpoint_url=http://127.0.0.1" in " ".join(opts)
    assert [c["version"] for c in as_json("log", uri, *opts)] == [3, 2, 1, 0]
    assert as_json("rollback", uri, "1", "--yes", *opts)["version"] == 4
    assert as_json("expire", uri, "--keep-last", "1", "--yes", *opts)["expired"] == [0, 1, 2, 3]
    dry = as_json("vacuum", uri, "--grace", "0", "--dry-run", *opts)
    assert dry["count"] > 0 and dry["bytes"] == sum(f["bytes"] for f in dry["files"])
    assert as_json("verify", uri, *opts)["ok"]


def test_operations_from_the_shell(tmp_path: Any) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    store = make(backend, appends=5)
    uri, opts = backend.uri, options(backend)

    log = as_json("log", uri, *opts)
    assert [c["version"] for c in log] == [5, 4, 3, 2, 1, 0]
    assert {c["attempts"] for c in log} == {None}  # the history does not record them
    assert ok("tag", uri, "paper", "2", "-m", "the numbers", *opts).startswith("tagged version 2")
    assert run("tag", uri, "paper", "3", *opts).returncode == 1  # exists: --force to move
    assert as_json("tags", uri, *opts)[0]["version"] == 2
    shown = as_json("show", uri, "paper", *opts)
    assert (shown["version"], shown["tags"], shown["operation"]) == (2, ["paper"], "append")

    refused = run("rollback", uri, "3", *opts)  # no --yes, no terminal
    assert refused.returncode == 5 and "--yes" in refused.stderr
    assert reopen(backend).version == 5
    rolled = as_json("rollback", uri, "3", "--yes", "-m", "drop 4-5", *opts)
    assert (rolled["version"], rolled["operation"], rolled["total_samples"]) == (6, "rollback", 30)
    assert rolled["attempts"] == 1  # no writer raced it
    diff = as_json("diff", uri, "5", "6", *opts)
    assert [(r["start"], r["stop"]) for r in diff["removed"]] == [(30, 40), (40, 50)]
    assert diff["num_added"] == 0 and diff["common"] == 3
    assert "-20 samples" in ok("diff", uri, "5", "6", *opts)

    planned = as_json("expire", uri, "--keep-last", "1", "--dry-run", *opts)
    assert planned["expired"] == [0, 1, 3, 4, 5] and "2" in planned["protected"]
    assert reopen(backend).expired_versions() == set()
    assert as_json("expire", uri, "--keep-last", "1", "--yes", *opts)["expired"] == [0, 1, 3, 4, 5]
    assert "expired" in ok("show", uri, "4", *opts)
    assert run("cat", uri, "0", "--version", "4", *opts).returncode == 1

    files_before = {f.key for f in store.storage.list("")}
    dry = as_json("vacuum", uri, "--grace", "0s", "--dry-run", *opts)
    assert dry["count"] == len(dry["files"]) > 0
    assert dry["bytes"] == sum(f["bytes"] for f in dry["files"])
    assert {f.key for f in store.storage.list("")} == files_before
    text = ok("vacuum", uri, "--grace", "0", "--dry-run", *opts)
    assert "would delete" in text and dry["files"][0]["key"] in text
    done = as_json("vacuum", uri, "--grace", "0", "--yes", *opts)
    assert {f["key"] for f in done["files"]} == {f["key"] for f in dry["files"]}

    compacted = as_json("compact", uri, "--yes", "-m", "tidy", *opts)
    assert compacted["commit"]["operation"] == "compact" and compacted["chunks_after"] == 1
    report = as_json("verify", uri, "--deep", *opts)
    assert report["ok"] and report["samples"] > 0 and report["problems"] == []
    assert as_json("info", uri, "--version", "paper", *opts)["samples"] == 20
    assert as_json("cat", uri, "-1", *opts)["i"] == 9
    listed = as_json("ls", uri, *opts)
    assert len(listed) == 1 and listed[0]["samples"] == 30
    assert run("untag", uri, "paper", *opts).returncode == 5
    assert "deleted tag" in ok("untag", uri, "paper", "--yes", *opts)
    assert as_json("tags", uri, *opts) == []


def test_errors_and_exit_codes(tmp_path: Any) -> None:
    missing = run_cli("log", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "no txstore store" in missing.stderr
    backend = Backend("local", str(tmp_path / "store"))
    store = make(backend, appends=2)
    uri = backend.uri
    assert run("expire", uri).returncode == 2  # needs --keep-last or --older-than
    assert run("tag", uri, "../etc").returncode == 2
    assert run("vacuum", uri, "--grace", "soon").returncode == 2
    assert run("show", uri, "99").returncode == 1
    assert run("log", uri, "--storage-option", "novalue").returncode == 2
    assert run("log", uri, "--limit", "-5").returncode == 2  # it printed an empty log
    assert "nothing to compact" not in ok("compact", uri, "--dry-run")

    chunk = store.snapshot().chunks()[0].path
    store.storage.delete(chunk)
    damaged = run_cli("verify", uri)
    assert damaged.returncode == 3
    assert "DAMAGED" in damaged.stdout and chunk in damaged.stdout
    assert json.loads(run("verify", uri, "--json").stdout)["ok"] is False


def test_conflict_exit_code(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    make(backend, appends=2)

    def racing(self: txstore.Store, *args: Any, **kwargs: Any) -> Any:
        raise txstore.ConflictError("version 3 landed first")

    monkeypatch.setattr(txstore.Store, "rollback", racing)
    assert cli.main(["rollback", backend.uri, "1", "--yes"]) == cli.EXIT_CONFLICT


def test_prompt_on_a_terminal(tmp_path: Any) -> None:
    backend = Backend("local", str(tmp_path / "store"))
    make(backend, appends=3)
    for answer, code, version in ((b"n\n", 5, 3), (b"y\n", 0, 4)):
        leader, follower = pty.openpty()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "txstore.cli", "rollback", backend.uri, "1"],
                cwd=REPO,
                stdin=follower,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            os.write(leader, answer)
            out, err = proc.communicate(timeout=120)
        finally:
            os.close(leader)
            os.close(follower)
        assert proc.returncode == code, (out, err)
        assert "Roll" in err and "[y/N]" in err
        assert reopen(backend).version == version
