"""Fixtures: one real moto S3 server process for the session, and a store URI per backend."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class S3Server:
    endpoint: str

    @property
    def options(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint,
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def new_bucket(self) -> str:
        import boto3  # moto's own dependency

        name = f"b-{uuid.uuid4().hex[:16]}"
        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server as a separate process speaking HTTP on loopback."""
    port = _free_port()
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or "moto_server"
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.05)
    try:
        yield S3Server(endpoint)
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass
class Backend:
    """Where a test's store lives: a URI plus the storage options to reach it."""

    name: str
    uri: str
    storage_options: dict[str, Any] | None = field(default=None)

    def kwargs(self) -> dict[str, Any]:
        return {"storage_options": self.storage_options} if self.storage_options else {}


BACKENDS = ["local", "memory", "s3"]


def make_backend(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    if name == "local":
        return Backend("local", str(tmp_path / "store"))
    if name == "memory":
        return Backend("memory", f"memory://{uuid.uuid4().hex}")
    server: S3Server = request.getfixturevalue("s3_server")
    return Backend("s3", f"s3://{server.new_bucket()}/datasets/store", server.options)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path, request)


@pytest.fixture(params=["local", "s3"])
def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Backends that several processes can share."""
    return make_backend(request.param, tmp_path, request)


# -- soak options, a second S3 server (ministack) ---------------------------------------------

MINISTACK = "ministack==1.5.33"  # pins botocore 1.43.106: it gets a virtualenv of its own


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=20.0,
        help="how long tests/test_soak.py runs on each backend (default 20; hours by hand)",
    )
    parser.addoption("--soak-seed", type=int, default=None, help="seed of the soak's kills")
    parser.addoption(
        "--powerloss-samples",
        type=int,
        default=6,
        help="samples per append in tests/test_powerloss.py (default 6; hundreds by hand)",
    )
    parser.addoption(
        "--fuzz-examples",
        type=int,
        default=12,
        help="examples per kind of document in tests/test_fuzz.py (default 12; 2000 by hand)",
    )
    parser.addoption(
        "--fuzz-seed", type=int, default=None, help="random fuzz examples from this seed"
    )


def _ministack_venv() -> Path:
    """A virtualenv with ministack, made once and kept in .tox (reused while it is whole)."""
    import fcntl

    root = Path(__file__).resolve().parent.parent / ".tox"
    venv = root / MINISTACK.replace("==", "-")
    root.mkdir(exist_ok=True)
    # Several test runs may start at once on one machine: one builds, the others wait.
    with open(root / "ministack.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "ready").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", MINISTACK],
                check=True,
                timeout=600,
            )
            (venv / "ready").write_text(MINISTACK)
    return venv


def _wait_until_up(url: str, proc: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{name} did not start") from None
            time.sleep(0.05)


@pytest.fixture(scope="session")
def ministack_server() -> Iterator[S3Server]:
    """ministack's S3 as a separate process on loopback: stricter conditional writes."""
    venv = _ministack_venv()
    port = _free_port()
    env = dict(
        os.environ,
        GATEWAY_PORT=str(port),
        BIND_HOST="127.0.0.1",  # its default is every interface
        SERVICES="s3",
        S3_PERSIST="0",
        LOG_LEVEL="WARNING",
    )
    proc = subprocess.Popen(
        [str(venv / "bin" / "ministack")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    _wait_until_up(f"{endpoint}/_ministack/health", proc, "ministack")
    try:
        yield S3Server(endpoint)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(params=["moto", "ministack"])
def race_server(request: pytest.FixtureRequest) -> S3Server:
    """Each S3 server that the race tests run against."""
    name = "s3_server" if request.param == "moto" else "ministack_server"
    server: S3Server = request.getfixturevalue(name)
    return server


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[Any]:
    """A loopback proxy (tests/proxy.py) in front of the moto server, to lose or delay replies."""
    from .proxy import Proxy

    host, port = s3_server.endpoint.removeprefix("http://").split(":")
    p = Proxy((host, int(port)))
    try:
        yield p
    finally:
        p.close()
