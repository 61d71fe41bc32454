"""Progress of long operations: a bar with the total and the ETA on a terminal (a real
pseudo-terminal here), plain lines anywhere else, a logger or a callback when asked, and
nothing by default where the operation is quiet by default."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import pytest

import txstore
from txstore import Progress
from txstore.store.progress import QUIET

from .workers import REPO, python

STAGE_LINE = re.compile(r"([a-z ]+): ([\d,]+)/([\d,]+) ([a-z]+) \((\d+)%\)(.*)")


def batch(tag: int, n: int = 10) -> list[dict[str, Any]]:
    # Incompressible padding: chunk sizes follow sample counts.
    return [{"tag": tag, "i": i, "pad": os.urandom(120)} for i in range(n)]


def small_chunks(path: Path, appends: int) -> txstore.Store:
    """One undersized chunk per append (10 samples, about 1.4 KB, into 4 KiB chunks)."""
    store = txstore.create(str(path), chunk_bytes=4096, block_bytes=1024)
    for v in range(appends):
        store.append(batch(v))
    return store


def two_samples(i: int) -> list[dict[str, Any]]:
    return [{"i": i, "half": 0}, {"i": i, "half": 1}]


def lines_of(stream: io.StringIO) -> list[tuple[str, int, int, str, str]]:
    """Each plain line as (stage, done, total, unit, rest); every line must be one."""
    text = stream.getvalue()
    assert "\r" not in text
    out = []
    for line in text.splitlines():
        m = STAGE_LINE.fullmatch(line)
        assert m, f"not a progress line: {line!r}"
        stage, done, total, unit, _, rest = m.groups()
        out.append((stage, int(done.replace(",", "")), int(total.replace(",", "")), unit, rest))
    return out


def finals(stream: io.StringIO) -> dict[str, tuple[int, int, str]]:
    """The last line of each stage: (done, total, unit)."""
    return {stage: (done, total, unit) for stage, done, total, unit, _ in lines_of(stream)}


# -- off a terminal: plain lines -------------------------------------------------------------


def test_optimize_counts_inputs_against_their_total(tmp_path: Path) -> None:
    stream = io.StringIO()
    every_update = Progress(stream, interval=0)
    commit = txstore.optimize(two_samples, range(40), str(tmp_path / "s"), progress=every_update)
    assert commit.total_samples == 80
    got = lines_of(stream)
    assert got[-1][:4] == ("optimize", 40, 40, "inputs")  # inputs, not the 80 samples
    assert got[-1][4].startswith(", ") and ", in " in got[-1][4]
    assert [done for _, done, *_ in got[:-1]] == list(range(1, 40))  # input by input
    assert all(total == 40 and "ETA " in rest for _, _, total, _, rest in got[:-1])


def test_optimize_with_worker_processes_reaches_its_total(tmp_path: Path) -> None:
    stream = io.StringIO()
    txstore.optimize(
        two_samples, range(30), str(tmp_path / "s"), num_workers=2, progress=Progress(stream)
    )
    assert finals(stream)["optimize"] == (30, 30, "inputs")


def test_a_failed_optimize_says_where_it_stopped(tmp_path: Path) -> None:
    def fails_at_7(i: int) -> dict[str, int]:
        if i == 7:
            raise ValueError("bad input")
        return {"i": i}

    stream = io.StringIO()
    with pytest.raises(txstore.InputError):
        txstore.optimize(fails_at_7, range(20), str(tmp_path / "s"), progress=Progress(stream))
    stage, done, total, unit, rest = lines_of(stream)[-1]
    assert (stage, done, total, unit) == ("optimize", 7, 20, "inputs")
    assert ", stopped after " in rest


def test_add_fields_compact_verify_vacuum_report_each_stage_with_its_total(
    tmp_path: Path,
) -> None:
    appends = 6
    store = small_chunks(tmp_path / "store", appends)
    small = {f.key for f in store.storage.list("chunks/")}
    samples = 10 * appends

    stream = io.StringIO()
    store.add_fields(lambda s: {"sq": s["i"] ** 2}, ["sq"], progress=Progress(stream))
    assert finals(stream) == {"computing fields": (samples, samples, "samples")}

    stream = io.StringIO()
    result = store.compact(progress=Progress(stream))
    assert result.commit is not None and result.samples_rewritten > 0
    rewritten = result.samples_rewritten
    assert finals(stream) == {"compacting": (rewritten, rewritten, "samples")}

    store.expire(keep_last=1)
    versions = appends + 3  # create, the appends, add_fields, compact
    stream = io.StringIO()
    report = store.verify(progress=Progress(stream))
    assert report.ok
    seen = finals(stream)
    assert seen["reading every manifest"] == (versions, versions, "manifests")
    assert seen["reading manifests"] == (1, 1, "manifests")  # those of the kept versions
    assert seen["reading contents"][1:] == (report.files, "files")
    assert seen["reading contents"][0] == report.files

    before = {f.key for f in store.storage.list("")}
    stream = io.StringIO()
    store.vacuum(grace=0, progress=Progress(stream, interval=0))
    gone = before - {f.key for f in store.storage.list("")}
    seen = finals(stream)
    assert seen["deleting"] == (len(gone), len(gone), "files")
    assert {k for k in gone if k.endswith(".chunk")} == small  # all rewritten by compact
    # Mid-stage lines carry an ETA; the final line the time taken.
    got = lines_of(stream)
    assert any("ETA " in rest for stage, done, total, _, rest in got if done < total)
    assert all(", in " in rest for stage, done, total, _, rest in got if done == total)


def test_a_short_stage_writes_its_final_line_alone() -> None:
    stream = io.StringIO()
    with Progress(stream, interval=3600).stage("copying", 100_000, "samples") as stage:
        for _ in range(100_000):
            stage.update()
    got = lines_of(stream)
    assert [(stage, done, total) for stage, done, total, *_ in got] == [
        ("copying", 100_000, 100_000)
    ]
    assert got[0][4].startswith(", ") and "samples/s" in got[0][4]


def test_progress_into_a_logger(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = small_chunks(tmp_path / "store", 3)
    caplog.set_level(logging.INFO, logger="txstore.progress")
    store.verify(progress=Progress(logger=logging.getLogger("txstore.progress")))
    said = [r.getMessage() for r in caplog.records if r.name == "txstore.progress"]
    assert "reading manifests: 4/4 manifests (100%)" in [s.partition(", ")[0] for s in said]
    assert all("\r" not in s for s in said)


# -- on a terminal: a tqdm bar ------------------------------------------------------------------


@contextmanager
def terminal(columns: int | None) -> Iterator[tuple[TextIO, Callable[[], str]]]:
    """A pseudo-terminal (sized, or never sized): a stream on its follower end, and what
    reached the leader end once that stream is closed."""
    leader, follower = pty.openpty()
    if columns is not None:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    pieces: list[bytes] = []

    def drain() -> None:  # a pty holds little: read while it is written
        while True:
            try:
                piece = os.read(leader, 65536)
            except OSError:  # EIO once every follower end is closed
                return
            if not piece:
                return
            pieces.append(piece)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    tty = os.fdopen(os.dup(follower), "w", encoding="utf-8")
    os.close(follower)

    def output() -> str:
        tty.close()
        reader.join(30)
        assert not reader.is_alive()
        return b"".join(pieces).decode("utf-8", "replace")

    try:
        yield tty, output
    finally:
        if not tty.closed:
            tty.close()
        reader.join(30)
        os.close(leader)


ETA = re.compile(r"\[\d\d:\d\d<(\d\d:\d\d|\?)")  # tqdm's [elapsed<remaining


def test_a_terminal_shows_a_bar_with_the_total_and_an_eta(tmp_path: Path) -> None:
    with terminal(100) as (tty, output):
        txstore.optimize(two_samples, range(40), str(tmp_path / "s"), progress=Progress(tty))
        store = txstore.open(str(tmp_path / "s"))
        store.verify(progress=Progress(tty))
        text = output()
    assert "\r" in text  # redrawn in place
    bars = [line for part in text.split("\n") for line in part.split("\r") if line.strip()]
    optimize = [b for b in bars if b.startswith("optimize:")]
    assert optimize and "40/40" in optimize[-1] and "100%|" in optimize[-1]
    assert " inputs/s]" in optimize[-1] and ETA.search(optimize[-1])
    manifests = [b for b in bars if b.startswith("reading manifests:")]
    assert manifests and "2/2" in manifests[-1] and ETA.search(manifests[-1])
    assert all(len(b) <= 100 for b in bars)  # fits the terminal's width


def test_a_terminal_that_reports_no_width_still_gets_a_bar(tmp_path: Path) -> None:
    with terminal(None) as (tty, output):
        with Progress(tty).stage("copying", 3, "samples") as stage:
            for _ in range(3):
                stage.update()
        text = output()
    assert "copying: 100%|" in text and "3/3" in text and ETA.search(text)


def test_the_command_draws_bars_on_a_terminal_that_reports_no_size(tmp_path: Path) -> None:
    """stderr itself on a pseudo-terminal never sized, as a container's can be."""
    store = small_chunks(tmp_path / "store", 3)
    leader, follower = pty.openpty()
    pieces: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                piece = os.read(leader, 65536)
            except OSError:
                return
            if not piece:
                return
            pieces.append(piece)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "txstore.cli", "verify", store.uri],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        os.close(follower)
        reader.join(30)
    finally:
        os.close(leader)
    assert proc.returncode == 0 and "no damage found" in proc.stdout
    text = b"".join(pieces).decode("utf-8", "replace")
    assert "\r" in text and "reading contents: 100%|" in text and ETA.search(text), text


# -- defaults, callbacks -----------------------------------------------------------------------


def test_operations_quiet_by_default_stay_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = small_chunks(tmp_path / "store", 4)
    store.add_fields(lambda s: {"sq": s["i"] ** 2}, ["sq"])
    store.compact()
    store.expire(keep_last=1)
    store.verify()
    store.vacuum(grace=0)
    txstore.optimize(two_samples, range(5), str(tmp_path / "quiet"), progress=False)
    assert capsys.readouterr() == ("", "")


def test_optimize_shows_progress_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    txstore.optimize(two_samples, range(5), str(tmp_path / "s"))
    out, err = capsys.readouterr()
    assert out == ""
    assert "\r" not in err  # pytest's capture is no terminal: plain lines
    assert err.splitlines()[-1].startswith("optimize: 5/5 inputs (100%)")


def test_a_callback_hears_every_stage_from_zero_to_its_total(tmp_path: Path) -> None:
    store = small_chunks(tmp_path / "store", 3)
    heard: dict[str, list[tuple[int, int]]] = {}

    def callback(stage: str, done: int, total: int) -> None:
        heard.setdefault(stage, []).append((done, total))

    store.verify(progress=callback)
    stages = {"reading every manifest", "reading manifests", "reading segments", "reading contents"}
    assert stages <= set(heard)
    for calls in heard.values():
        totals = {total for _, total in calls}
        assert len(totals) == 1
        done = [d for d, _ in calls]
        assert done[0] == 0 and done[-1] == totals.pop() and done == sorted(done)
    assert heard["reading manifests"][-1] == (4, 4)


def test_what_progress_takes() -> None:
    assert Progress.of(None) is QUIET and Progress.of(False) is QUIET
    shown = Progress.of(True)
    assert shown.enabled and shown.callback is None
    mine = Progress(io.StringIO())
    assert Progress.of(mine) is mine
    with pytest.raises(TypeError, match="progress must be"):
        Progress.of("yes")  # type: ignore[arg-type]


def test_tqdm_is_loaded_only_to_show_progress(tmp_path: Path) -> None:
    code = (
        "import sys, io, txstore\n"
        f"s = txstore.create({str(tmp_path / 's')!r})\n"
        "s.append([{'i': 1}]); s.verify(); s.vacuum(grace=0)\n"
        "assert 'tqdm' not in sys.modules, 'quiet operations loaded tqdm'\n"
        "s.verify(progress=txstore.Progress(io.StringIO()))\n"
        "assert 'tqdm' in sys.modules\n"
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr


def test_a_reader_loads_no_lock_library_and_builds_no_writer_tables(tmp_path: Path) -> None:
    """Importing txstore to read costs no work only a writer needs: portalocker is imported,
    and the builder's table of bin headers made, when a process first writes."""
    txstore.create(str(tmp_path / "s")).append([{"i": 1, "b": b"x"}])
    code = (
        "import sys, txstore\n"
        "from txstore.format import column_frames\n"
        f"s = txstore.open({str(tmp_path / 's')!r})\n"
        "assert [x['i'] for x in s.snapshot()] == [1]\n"
        "assert 'portalocker' not in sys.modules, 'a reader imported portalocker'\n"
        "assert column_frames.small_bin_headers.cache_info().currsize == 0, 'table made'\n"
        "s.append([{'i': 2, 'b': b'y'}])\n"
        "assert 'portalocker' in sys.modules\n"
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr
