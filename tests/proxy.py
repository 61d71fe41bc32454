"""A loopback HTTP/1.1 proxy that loses or delays an S3 server's replies, for network tests.

It sits between s3fs and the server (both on 127.0.0.1) and forwards whole messages. For the
k-th request, or those a predicate picks, it can

- **drop** the reply: the server has processed the request (committed a PUT) and answered,
  but the proxy closes the client's connection instead of passing the answer on;
- **delay** the reply: hold the server's answer longer than the client waits for it;
- **lose** the request: close the client's connection without passing it on;
- **strip** request headers (``strip``, lower-case names; every request): with the
  conditional headers gone, the server below is one that ignores conditions;
- deliver the request **late**: keep it from the server until the client, having given up on
  it, reads the same key; deliver it then, before passing on that answer. So the client's
  read-back misses a write that lands right after, as a slow server can do.

Each connection gets two threads (requests one way, replies the other); every socket has a
timeout and the accept loop polls a stop flag, so nothing outlives ``close()`` for long.
"""

from __future__ import annotations

import contextlib
import queue
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

_IO_TIMEOUT = 30.0  # seconds a proxy thread waits on a silent socket before giving up
_MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Request:
    number: int  # 1, 2, ... in arrival order since the last reset
    method: str
    path: str
    range: str = ""  # the Range header, if any


@dataclass
class Rule:
    """What to do with the replies to requests that ``match``, at most ``times`` times."""

    match: Callable[[Request], bool]
    action: str  # "drop", "delay", "lose", "late" or "cut" (half the reply's body, then close)
    times: int = 1
    delay: float = 0.0
    held: tuple[str, bytes] | None = None  # "late": the object and bytes of the held request


_GCS_OBJECT = re.compile(
    r"^(?:/download|/upload)?/storage/v1/b/(?P<bucket>[^/]+)/o(?:/(?P<name>.+))?$"
)


def object_of(path: str) -> str:
    """What object a request is about, to pair a held write with the read of it: its path,
    but for GCS's JSON API (an upload names the object in its query, a read in its path) the
    bucket and the object's name."""
    parts = urlsplit(path)
    found = _GCS_OBJECT.match(parts.path)
    if found is None:
        return path
    name = found.group("name") or parse_qs(parts.query).get("name", [""])[0]
    return f"gcs:{found.group('bucket')}/{unquote(name)}" if name else path


@dataclass(frozen=True)
class _Release:
    """The fate of the request after which a held one is delivered."""

    held: bytes


class _Reader:
    """Reads whole HTTP/1.1 messages (head and raw body) from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError("peer closed mid-message")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError("peer closed mid-line")
        end = self.buf.index(b"\r\n") + 2
        return self._take(end)

    def head(self) -> tuple[bytes, str, dict[str, str]] | None:
        """(raw head, first line, lower-cased headers), or None at a clean end of stream."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > _MAX_HEAD:
                raise ConnectionError("message head too large")
            if not self._fill():
                if self.buf:
                    raise ConnectionError("peer closed mid-head")
                return None
        raw = self._take(self.buf.index(b"\r\n\r\n") + 4)
        first, *lines = raw.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return raw, first, headers

    def body(self, headers: dict[str, str], has_body: bool) -> bytes:
        if not has_body:
            return b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._chunked()
        return self._take(int(headers.get("content-length", "0")))

    def _chunked(self) -> bytes:
        out = []
        while True:
            size_line = self._line()
            out.append(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    line = self._line()
                    out.append(line)
                    if line == b"\r\n":
                        return b"".join(out)
            out.append(self._take(size + 2))


@dataclass
class Proxy:
    upstream: tuple[str, int]
    rules: list[Rule] = field(default_factory=list)
    seen: list[Request] = field(default_factory=list)
    #: (method, path, body bytes) of each reply passed on to the client, in order.
    replied: list[tuple[str, str, int]] = field(default_factory=list)
    #: When each request arrived and when its reply was passed on (monotonic seconds), by
    #: request number: what ``round_trips`` orders them by.
    arrived: dict[int, float] = field(default_factory=dict)
    answered: dict[int, float] = field(default_factory=dict)
    strip: frozenset[str] = frozenset()  # request headers removed before forwarding

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self, *rules: Rule) -> None:
        """New rules; request numbers count from 1 again."""
        with self._lock:
            self.rules = list(rules)
            self.seen = []
            self.replied = []
            self.arrived = {}
            self.answered = {}

    def round_trips(self) -> int:
        """The longest chain of requests each sent after the reply to the one before it
        was passed on: how many round trips the client waited, one after another. (Delay
        every reply a little for a clear answer: requests sent together then all arrive
        before any reply leaves.)"""
        with self._lock:
            arrived, answered = dict(self.arrived), dict(self.answered)
        depth: dict[int, int] = {}
        for number in sorted(arrived, key=arrived.__getitem__):
            before = [depth[q] for q in depth if answered.get(q, float("inf")) <= arrived[number]]
            depth[number] = 1 + max(before, default=0)
        return max(depth.values(), default=0)

    def disarm(self) -> None:
        """No more faults; what was seen stays readable."""
        with self._lock:
            self.rules = []

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            server = socket.create_connection(self.upstream, timeout=_IO_TIMEOUT)
            client.settimeout(_IO_TIMEOUT)
            # A request's head and body go as two sends: without this, Nagle's algorithm
            # holds the body until the head's delayed ACK, some 40 ms per upload.
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            fates: queue.Queue[tuple[str, Rule | None]] = queue.Queue()
            for target in (self._requests, self._replies):
                threading.Thread(target=target, args=(client, server, fates), daemon=True).start()

    def _fate(self, method: str, path: str, span: str = "") -> tuple[int, Rule | _Release | None]:
        with self._lock:
            request = Request(len(self.seen) + 1, method, path, span)
            self.seen.append(request)
            self.arrived[request.number] = time.monotonic()
            number = request.number
            for rule in self.rules:
                reads = method in ("GET", "HEAD")
                if reads and rule.held is not None and rule.held[0] == object_of(path):
                    held, rule.held = rule.held[1], None
                    return number, _Release(held)
            for rule in self.rules:
                if rule.times > 0 and rule.match(request):
                    rule.times -= 1
                    return number, rule
        return number, None

    def _requests(self, client: socket.socket, server: socket.socket, fates: queue.Queue) -> None:
        reader = _Reader(client)
        try:
            while (message := reader.head()) is not None:
                raw, first, headers = message
                method, path, _ = first.split(" ", 2)
                number, fate = self._fate(method, path, headers.get("range", ""))
                if isinstance(fate, Rule) and fate.action == "late":
                    self._hold(fate, client, reader, message, path)
                    continue  # no answer comes: the client times out
                if isinstance(fate, Rule) and fate.action == "lose":
                    return  # the server never hears of it
                fates.put((method, path, number, fate))  # before the server can answer
                # The head goes first: with "Expect: 100-continue" the client sends its body
                # only after the server's interim reply.
                server.sendall(_without(raw, self.strip) if self.strip else raw)
                server.sendall(reader.body(headers, has_body=True))
        except OSError:
            pass
        finally:
            _close(client, server)

    def _hold(
        self,
        rule: Rule,
        client: socket.socket,
        reader: _Reader,
        message: tuple[bytes, str, dict[str, str]],
        path: str,
    ) -> None:
        raw, _, headers = message
        if headers.get("expect", "").lower() == "100-continue":
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # or the body never comes
        body = reader.body(headers, has_body=True)
        with self._lock:
            rule.held = (object_of(path), raw + body)

    def _deliver(self, request: bytes) -> None:
        """Send a held request to the server on a connection of its own; drop the answer."""
        with socket.create_connection(self.upstream, timeout=_IO_TIMEOUT) as sock:
            sock.sendall(request)
            reader = _Reader(sock)
            while (message := reader.head()) is not None:
                _, first, headers = message
                if int(first.split(" ", 2)[1]) >= 200:
                    reader.body(headers, has_body=True)
                    return

    def _replies(self, client: socket.socket, server: socket.socket, fates: queue.Queue) -> None:
        reader = _Reader(server)
        try:
            while (message := reader.head()) is not None:
                raw, first, headers = message
                status = int(first.split(" ", 2)[1])
                if status < 200:  # 100 Continue: an interim reply, not the answer
                    client.sendall(raw)
                    continue
                method, path, number, rule = fates.get(timeout=_IO_TIMEOUT)
                no_body = method == "HEAD" or status in (204, 304)
                body = reader.body(headers, has_body=not no_body)
                if isinstance(rule, _Release):  # the write lands before the client hears
                    self._deliver(rule.held)
                elif rule is not None and rule.action == "drop":
                    return  # the server answered; the client never hears it
                elif rule is not None and rule.action == "cut":
                    client.sendall(raw + body[: len(body) // 2])
                    return  # the connection breaks mid-reply
                elif rule is not None and rule.action == "delay":
                    time.sleep(rule.delay)  # bounded: the rule's delay, once per reply
                with self._lock:  # before the client can see it, and so send the next
                    self.replied.append((method, path, len(body)))
                    self.answered[number] = time.monotonic()
                client.sendall(raw + body)
        except (OSError, queue.Empty):
            pass
        finally:
            _close(client, server)


def _without(head: bytes, names: frozenset[str]) -> bytes:
    """A request head without the header lines of ``names`` (lower-case)."""
    lines = head.split(b"\r\n")
    kept = [
        line
        for i, line in enumerate(lines)
        if i == 0 or line.partition(b":")[0].strip().decode("latin-1").lower() not in names
    ]
    return b"\r\n".join(kept)


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
