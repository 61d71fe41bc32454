"""LazyFS for the power-loss tests: find the build, mount it over a folder, cut the power.

LazyFS is a FUSE file system with a page cache of its own: what was written but not fsynced
lives only there until ``lazyfs::clear-cache`` drops it, as a power cut would. Its source is
vendored beside the repository (``shared/vendor/lazyfs``); ``tests/powerloss/setup.sh``, run
by tox before the tests, installs FUSE and builds it into ``.tox/lazyfs``, or writes there why
it could not (``unavailable``), which the tests give as their skip reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / ".tox" / "lazyfs"
BINARY = BUILD / "lazyfs" / "build" / "lazyfs"

_MAX_COMMAND = 100  # its FIFO's read buffer: a longer command is cut, silently
_CONFIG = """\
[faults]
fifo_path="{fifo}"
[cache]
apply_eviction=false
[cache.simple]
custom_size="64mb"
blocks_per_page=1
[filesystem]
log_all_operations=false
logfile="{log}"
"""


def unavailable() -> str | None:
    """Why LazyFS cannot run here (what is missing), or None."""
    why = BUILD / "unavailable"
    if why.exists():
        return f"LazyFS is unavailable: {why.read_text().strip()} (from tests/powerloss/setup.sh)"
    if not BINARY.exists():
        return f"LazyFS is not built: no {BINARY}; run tests/powerloss/setup.sh (tox runs it)"
    if not os.path.exists("/dev/fuse"):
        return "LazyFS cannot mount: no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return "LazyFS cannot be unmounted: no fusermount3 (Debian package fuse3)"
    return None


class LazyFS:
    """LazyFS mounted at ``mnt`` over the real folder ``root``, run by this process."""

    def __init__(self, workdir: Path) -> None:
        self.root = workdir / "root"
        self.mnt = workdir / "mnt"
        self.fifo = workdir / "faults.fifo"
        self.log = workdir / "lazyfs.log"
        self.config = workdir / "lazyfs.toml"
        self.output = workdir / "lazyfs.out"
        self.proc: subprocess.Popen[bytes] | None = None
        for folder in (self.root, self.mnt):
            folder.mkdir(parents=True, exist_ok=True)
        self.config.write_text(_CONFIG.format(fifo=self.fifo, log=self.log))

    def mount(self) -> None:
        assert self.proc is None, "mounted already"
        start = self._log_size()
        with open(self.output, "ab") as out:
            # In the foreground, so the process is ours to wait for and to kill. The config's
            # path is relative: LazyFS ignores a --config-path that contains "-o" (any case),
            # as pytest's temporary folders do ("pytest-of-root").
            options = ["-o", "modules=subdir", "-o", f"subdir={self.root}", "-f"]
            self.proc = subprocess.Popen(
                [str(BINARY), str(self.mnt), "--config-path", self.config.name, *options],
                cwd=self.config.parent,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_for(lambda: os.path.ismount(self.mnt), "the mount")
            self._wait_for_log("waiting for fault commands", start)
        except BaseException:
            self.unmount()
            raise

    def unmount(self) -> None:
        """Unmount and stop LazyFS (dropping what was not fsynced), also after a crash."""
        proc, self.proc = self.proc, None
        if _mounted(self.mnt):
            done = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True)
            if done.returncode != 0:  # busy or broken: detach it at least
                subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)
        if proc is not None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def abandon(self) -> None:
        """Kill LazyFS first, then unmount: for a LazyFS that stopped answering, whose mount
        even a stat would wait on (killed, it leaves a mount that answers ENOTCONN)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
        self.unmount()
        # A new LazyFS starts its log afresh: the old one is kept beside it, to read.
        with contextlib.suppress(FileNotFoundError):
            self.log.replace(self.log.with_suffix(".abandoned.log"))

    def clear_cache(self) -> None:
        """Cut the power: drop every write that was not fsynced."""
        self.command("lazyfs::clear-cache", "cache is cleared.")

    def crash_at(
        self, timing: str, op: str, *, from_rgx: str | None = None, to_rgx: str | None = None
    ) -> None:
        """Make LazyFS kill itself, losing its unsynced data, at the next ``op`` (fsync, link,
        rename, unlink, write, ...) on a path that matches; ``timing`` is before or after it.
        The client then sees ENOTCONN; ``unmount`` cleans up."""
        parts = [f"lazyfs::crash::timing={timing}::op={op}"]
        parts += [f"from_rgx={from_rgx}"] if from_rgx is not None else []
        parts += [f"to_rgx={to_rgx}"] if to_rgx is not None else []
        self.command("::".join(parts), "received: VALID crash fault")

    def crashed(self, timeout: float = 10) -> bool:
        """Whether LazyFS has died (waiting for it a while: its client may see the mount go
        away just before the process is gone)."""
        if self.proc is None:
            return False
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def command(self, line: str, answer: str) -> None:
        """Send ``line`` to LazyFS's FIFO and wait for ``answer`` in its log."""
        data = f"{line}\n".encode()
        if len(data) > _MAX_COMMAND:
            raise ValueError(f"LazyFS reads {_MAX_COMMAND} bytes of a command at most: {line}")
        start = self._log_size()
        fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO if LazyFS is not there
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._wait_for_log(answer, start)

    def _log_size(self) -> int:
        with contextlib.suppress(FileNotFoundError):
            return self.log.stat().st_size
        return 0

    def _wait_for_log(self, text: str, start: int) -> None:
        def found() -> bool:
            with contextlib.suppress(FileNotFoundError), open(self.log, "rb") as f:
                f.seek(start)
                return text.encode() in f.read()
            return False

        self._wait_for(found, repr(text))

    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not ready():
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"LazyFS stopped while waiting for {what}: {self._tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"LazyFS: no {what} after 30 s: {self._tail()}")
            time.sleep(0.01)

    def _tail(self) -> str:
        text = ""
        for path in (self.output, self.log):
            with contextlib.suppress(FileNotFoundError):
                text += path.read_text(errors="replace")[-1500:]
        return text


def _mounted(path: Path) -> bool:
    """Whether something is mounted at ``path``, from the mount table: a stat of the mount
    would wait on a LazyFS that stopped answering (a dead one answers ENOTCONN)."""
    where = os.path.abspath(path)
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4].replace("\\040", " ") == where for line in table if line.strip())
