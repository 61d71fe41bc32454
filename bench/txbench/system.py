"""The filesystem, the page cache and the machine: fsync, sizes, cache drops, machine info."""

from __future__ import annotations

import compileall
import contextlib
import gc
import hashlib
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

#: The repository this package sits in (bench/txbench/ -> the checkout).
REPO = Path(__file__).resolve().parents[2]

#: Children import the frozen copy of txstore named by this variable (``freeze_txstore``).
TXSTORE_SRC_ENV = "BENCH_TXSTORE_SRC"

PACKAGES = (
    "txstore",
    "litdata",
    "mosaicml-streaming",
    "torch",
    "numpy",
    "zstandard",
    "msgspec",
    "fsspec",
)


def default_workdir() -> Path:
    """The parent of the repository: the same disk as the repo, not a tmpfs."""
    return REPO.parent


# --------------------------------------------------------------------------- files


def fsync_tree(root: Path) -> None:
    """Fsync every file under root, then every directory, deepest first."""
    dirs: list[str] = []
    for dirpath, _dirnames, filenames in os.walk(root):
        dirs.append(dirpath)
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for dirpath in reversed(dirs):
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_table_bytes(table: Any, out: Path) -> None:
    """A floor for writing an Arrow table: its buffers' bytes as they are, in new files of
    64 MiB under ``out`` written in 1 MiB calls (the caller fsyncs them: ``fsync_tree``)."""
    out.mkdir()
    piece, step = 64 << 20, 1 << 20
    views = [memoryview(b) for c in table.columns for a in c.chunks for b in a.buffers() if b]
    fd, number, written = -1, 0, piece
    for view in views:
        for at in range(0, len(view), step):
            if written >= piece:
                if fd >= 0:
                    os.close(fd)
                fd = os.open(out / f"{number}.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                number, written = number + 1, 0
            written += os.write(fd, view[at : at + step])
    if fd >= 0:
        os.close(fd)


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def dataset_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def warm_files(paths: Iterable[Path]) -> None:
    """Read every file once, so that it is in the page cache."""
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 * 2**20):
                pass


def evict_files(paths: Iterable[Path]) -> None:
    """posix_fadvise(DONTNEED) on every file: clean pages leave the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drop_page_cache(paths: Sequence[Path]) -> str:
    """Drop the page cache: all of it if we may (root), else the files' pages (fadvise)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        evict_files(paths)
        return "fadvise"


# --------------------------------------------------------------------------- between runs

_settle_s = 0.0


def set_settle(seconds: float) -> None:
    """``--settle``: seconds to wait before each run (default 0). The bench VM hands freed
    memory back to its host after about 2 s; waiting that long slowed some writers and not
    others, so the default is not to wait."""
    global _settle_s
    _settle_s = seconds


def settle_s() -> float:
    return _settle_s


def settle() -> None:
    """Before every measurement: flush dirty pages, wait ``--settle`` s, collect garbage."""
    os.sync()
    time.sleep(_settle_s)
    gc.collect()


# --------------------------------------------------------------------------- the machine


def filesystem_of(path: Path) -> str:
    best = ("", "?")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            device, mountpoint, fstype = line.split()[:3]
            is_prefix = str(path).startswith(mountpoint.rstrip("/") + "/")
            if (str(path) == mountpoint or is_prefix) and len(mountpoint) >= len(best[0]):
                best = (mountpoint, f"{device} ({fstype}) on {mountpoint}")
    return best[1]


def source_revision() -> str:
    """The commit of the checkout, '+dirty' if txstore/ has changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--", "txstore") else "")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def compile_package(folder: Path) -> None:
    """Write the bytecode of a package's modules, as pip does when it installs one. Where
    PYTHONDONTWRITEBYTECODE is set (these machines), a txstore imported from a checkout is
    otherwise compiled again by every process, 0.16 s of its start-up here, while the
    peers' installed packages come compiled."""
    compileall.compile_dir(str(folder), quiet=1)


def machine_info(workdir: Path, packages: Sequence[str] = PACKAGES) -> dict[str, Any]:
    compile_package(REPO / "txstore")
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu": cpu_model(),
        "memory_gib": memory_gib(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "workdir": str(workdir),
        "workdir_fs": filesystem_of(workdir),
        "tmp_fs": filesystem_of(Path(tempfile.gettempdir())),
        "packages": versions,
        "txstore_revision": source_revision(),
        "load_at_start": list(os.getloadavg()),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def format_load(load: Sequence[float]) -> str:
    return " ".join(f"{x:.2f}" for x in load) + f" (1, 5, 15 min; {os.cpu_count()} CPUs)"


def print_machine(info: dict[str, Any]) -> None:
    print(f"machine: nproc={info['nproc']} usable={info['usable_cpus']} {info['platform']}")
    print(f"cpu:     {info['cpu']}, {info['memory_gib'] or 0:.1f} GiB")
    print(f"python:  {info['implementation']} {info['python']}")
    print(f"workdir: {info['workdir']} on {info['workdir_fs']} (tmp: {info['tmp_fs']})")
    packages = ", ".join(f"{k} {v or 'not installed'}" for k, v in info["packages"].items())
    print(f"packages: {packages}")
    print(f"txstore source: {info['txstore_revision']}")
    print(f"load average at start: {format_load(info['load_at_start'])}")


# --------------------------------------------------------------------------- frozen source


def freeze_txstore(into: Path) -> str:
    """Copy txstore/ as it is now into ``into``; return a digest of its .py files.

    The checkout is shared and edited while a run lasts tens of minutes; every child imports
    this copy (``use_frozen_txstore``), so one run measures one version of the code.
    """
    shutil.copytree(
        REPO / "txstore", into / "txstore", ignore=shutil.ignore_patterns("__pycache__")
    )
    compile_package(into / "txstore")
    digest = hashlib.sha256()
    for path in sorted((into / "txstore").rglob("*.py")):
        digest.update(path.relative_to(into).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def use_frozen_txstore(src: str) -> None:
    """Import txstore from ``src``, ahead of an editable install's finder (which may point at
    another checkout)."""
    sys.meta_path[:] = [
        f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")
    ]
    sys.path.insert(0, src)


@contextlib.contextmanager
def frozen_txstore(workdir: Path, prefix: str) -> Iterator[str]:
    """For the length of the block, this process and its children (through
    ``TXSTORE_SRC_ENV``) import a copy of txstore made now; yields the copy's digest."""
    src = Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))
    try:
        digest = freeze_txstore(src)
        os.environ[TXSTORE_SRC_ENV] = str(src)
        use_frozen_txstore(str(src))
        yield digest
    finally:
        shutil.rmtree(src, ignore_errors=True)


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
