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

pytest_plugins = ["tests.emulators"]


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


def make_backend(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    if name == "local":
        return Backend("local", str(tmp_path / "store"))
    if name == "memory":
        return Backend("memory", f"memory://{uuid.uuid4().hex}")
    server: S3Server = request.getfixturevalue("s3_server")
    return Backend("s3", f"s3://{server.new_bucket()}/datasets/store", server.options)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Store logic runs on memory and local disk; a test marked ``s3`` runs on S3 (moto) too.

    The storage contract itself is checked on every backend by tests/storage_suite.py, so
    a store-level test goes through S3 only where S3's own semantics are what it is about.
    """
    s3 = ["s3"] if metafunc.definition.get_closest_marker("s3") else []
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", ["local", "memory", *s3], indirect=True)
    if "shared_backend" in metafunc.fixturenames:
        metafunc.parametrize("shared_backend", ["local", *s3], indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Where the test's store lives (see ``pytest_generate_tests``)."""
    return make_backend(request.param, tmp_path, request)


@pytest.fixture
def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Backends that several processes can share."""
    return make_backend(request.param, tmp_path, request)


# -- options of the long tests, a second S3 server (ministack) ------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=300.0,
        help="how long the slow soak of tests/test_soak.py runs on each backend (default 300)",
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
    # a dev dependency, installed beside pytest (pyproject.toml)
    exe = shutil.which("ministack", path=os.path.dirname(sys.executable)) or "ministack"
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
        [exe],
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
