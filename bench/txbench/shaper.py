"""A shaping HTTP/1.1 proxy on loopback: what a remote object store costs, added to a local one.

For every request it forwards, it holds the request for ``latency`` seconds first (HTTP/1.1
clients wait for each answer before sending the next request on a connection, so this adds
``latency`` to the time to the answer's first byte), and it paces each connection's answers
to ``conn_mbps`` (and, optionally, all answers together to ``total_mbps``). It counts requests
(by method), answer bytes, connections and the most requests in flight at once.

Run as its own process (``python -m txbench.shaper`` or ``Shaper`` below), so that its work
does not share the measured client's interpreter. A control port answers one line per
connection: ``stats`` (JSON counters), ``reset`` (counters to zero, then the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txbench.system import free_port, process_cpu_s, stop

_READ = 256 * 1024
_MAX_HEAD = 64 * 1024


@dataclass
class Counters:
    requests: dict[str, int] = field(default_factory=dict)
    bytes_down: int = 0  # answer bytes, server to client (heads included)
    bytes_up: int = 0  # request bytes, client to server
    connections: int = 0  # opened since the last reset
    open_now: int = 0
    peak_open: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    # Requests sent while no other was waiting for its answer: the round trips a client made
    # one after another (for a sequential client, every request).
    sequential: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "total_requests": sum(self.requests.values()),
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "connections": self.connections,
            "peak_open": self.peak_open,
            "peak_in_flight": self.peak_in_flight,
            "sequential_round_trips": self.sequential,
        }


class Bucket:
    """A token bucket: ``take(n)`` waits until ``n`` bytes fit under ``rate`` bytes/s.
    A burst of at most 50 ms of the rate, so a connection cannot save up idle time."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.burst = rate * 0.05
        self.tokens = self.burst
        self.stamp = time.monotonic()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


class ShapingProxy:
    def __init__(
        self, upstream: tuple[str, int], latency: float, conn_mbps: float, total_mbps: float
    ) -> None:
        self.upstream = upstream
        self.latency = latency
        self.conn_rate = conn_mbps * 1e6
        self.total = Bucket(total_mbps * 1e6)
        self.counters = Counters()

    async def serve(self, port: int, control_port: int) -> None:
        server = await asyncio.start_server(self._client, "127.0.0.1", port)
        control = await asyncio.start_server(self._control, "127.0.0.1", control_port)
        async with server, control:
            await asyncio.gather(server.serve_forever(), control.serve_forever())

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode().strip()
        if line == "reset":
            stats = self.counters.to_json()
            open_now, in_flight = self.counters.open_now, self.counters.in_flight
            self.counters = Counters(open_now=open_now, peak_open=open_now, in_flight=in_flight)
        else:
            stats = self.counters.to_json()
        writer.write(json.dumps(stats).encode() + b"\n")
        await writer.drain()
        writer.close()

    async def _client(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        c = self.counters
        c.connections += 1
        c.open_now += 1
        c.peak_open = max(c.peak_open, c.open_now)
        try:
            sreader, swriter = await asyncio.open_connection(*self.upstream, limit=_READ)
        except OSError:
            cwriter.close()
            c.open_now -= 1
            return
        answers: asyncio.Queue[None] = asyncio.Queue()
        up = asyncio.create_task(self._requests(creader, swriter, answers))
        down = asyncio.create_task(self._answers(sreader, cwriter, answers))
        with contextlib.suppress(Exception):
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for w in (swriter, cwriter):
            with contextlib.suppress(Exception):
                w.close()
        self.counters.open_now -= 1
        self.counters.in_flight = max(0, self.counters.in_flight - answers.qsize())

    async def _requests(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        answers: asyncio.Queue[None],
    ) -> None:
        """Request heads are parsed (to count them and find the next one); bodies pass on."""
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                return
            first, _, rest = head.decode("latin-1").partition("\r\n")
            method = first.split(" ", 1)[0]
            headers = {}
            for line in rest.split("\r\n"):
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            c = self.counters
            c.requests[method] = c.requests.get(method, 0) + 1
            c.sequential += c.in_flight == 0
            c.in_flight += 1
            c.peak_in_flight = max(c.peak_in_flight, c.in_flight)
            answers.put_nowait(None)
            if self.latency:
                await asyncio.sleep(self.latency)
            writer.write(head)
            c.bytes_up += len(head)
            if "chunked" in headers.get("transfer-encoding", "").lower():
                await self._chunked(reader, writer)
            else:
                left = int(headers.get("content-length", "0") or 0)
                while left > 0:
                    data = await reader.read(min(left, _READ))
                    if not data:
                        return
                    left -= len(data)
                    c.bytes_up += len(data)
                    writer.write(data)
                    await writer.drain()
            await writer.drain()

    async def _chunked(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            writer.write(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    writer.write(line)
                writer.write(line)
                return
            writer.write(await reader.readexactly(size + 2))
            await writer.drain()

    async def _answers(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        answers: asyncio.Queue[None],
    ) -> None:
        """Answers pass on as bytes, paced; a request counts as in flight until the first
        bytes after it was sent come back (a close enough mark of its answer)."""
        bucket = Bucket(self.conn_rate)
        c_pending = 0
        while True:
            data = await reader.read(_READ)
            if not data:
                return
            while not answers.empty():
                answers.get_nowait()
                c_pending += 1
            if c_pending:
                self.counters.in_flight -= c_pending
                c_pending = 0
            await bucket.take(len(data))
            await self.total.take(len(data))
            self.counters.bytes_down += len(data)
            writer.write(data)
            await writer.drain()


class Shaper:
    """The proxy in a child process: ``endpoint`` for clients, ``stats()``/``reset()``."""

    def __init__(
        self,
        upstream: str,
        latency_ms: float = 20.0,
        conn_mbps: float = 100.0,
        total_mbps: float = 0.0,
    ) -> None:
        self.port, self.control_port = free_port(), free_port()
        host, _, port = upstream.removeprefix("http://").partition(":")
        here = Path(__file__).resolve().parent.parent
        self.settings = {"latency_ms": latency_ms, "conn_mbps": conn_mbps, "total_mbps": total_mbps}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "txbench.shaper", f"{host}:{port}", str(self.port),
             str(self.control_port), "--latency-ms", str(latency_ms),
             "--conn-mbps", str(conn_mbps), "--total-mbps", str(total_mbps)],
            cwd=here, env={**os.environ, "PYTHONPATH": str(here)},
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                self._ask("stats")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the shaping proxy did not start") from None
                time.sleep(0.05)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ask(self, what: str) -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", self.control_port), timeout=10) as s:
            s.sendall(what.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                more = s.recv(65536)
                if not more:
                    break
                data += more
        result: dict[str, Any] = json.loads(data)
        return result

    def stats(self) -> dict[str, Any]:
        return self._ask("stats")

    def reset(self) -> dict[str, Any]:
        return self._ask("reset")

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def close(self) -> None:
        stop(self.proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("upstream", help="host:port of the server")
    parser.add_argument("port", type=int)
    parser.add_argument("control_port", type=int)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--conn-mbps", type=float, default=100.0)
    parser.add_argument("--total-mbps", type=float, default=0.0, help="0: no total cap")
    args = parser.parse_args()
    host, _, port = args.upstream.partition(":")
    proxy = ShapingProxy((host, int(port)), args.latency_ms / 1000, args.conn_mbps, args.total_mbps)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(proxy.serve(args.port, args.control_port))


if __name__ == "__main__":
    main()
