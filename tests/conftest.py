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
