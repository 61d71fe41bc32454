"""An S3 server of our own: moto_server as its own process, a bucket, txstore's options."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from txbench.system import free_port, process_cpu_s, stop

#: moto accepts any credentials; these are the ones every script and test uses.
KEY, SECRET, REGION = "testing", "testing", "us-east-1"


@dataclass
class S3Server:
    """A running moto_server: its process, where it listens, the bucket made in it."""

    proc: subprocess.Popen[bytes]
    endpoint: str
    bucket: str

    def uri(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        """txstore's ``storage_options`` (s3fs's), reaching the server at ``endpoint``
        (by default directly; a proxy's endpoint to go through it)."""
        return {
            "endpoint_url": endpoint or self.endpoint,
            "key": KEY,
            "secret": SECRET,
            "client_kwargs": {"region_name": REGION},
        }

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def close(self) -> None:
        stop(self.proc)


def wait_for(url: str, proc: subprocess.Popen[bytes], name: str, timeout_s: float = 60.0) -> None:
    """Return once ``url`` answers (an HTTP error counts: the server is up); kill ``proc``
    and stop the run if it exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError as e:
            if getattr(e, "code", None):
                return
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"{name} did not start") from None
            time.sleep(0.1)


def start_moto(bucket: str = "bench", timeout_s: float = 60.0) -> S3Server:
    """moto_server (from this interpreter's environment) on a free loopback port, once it
    answers ``/moto-api/``, with ``bucket`` created by boto3."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or "moto_server"
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(endpoint + "/moto-api/", proc, "moto_server", timeout_s)
    import boto3  # type: ignore[import-untyped, unused-ignore]

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name=REGION,
    )
    client.create_bucket(Bucket=bucket)
    return S3Server(proc, endpoint, bucket)
