"""Helpers of tests/test_fuzz.py: a small store holding every kind of document the store
reads, hostile mutations of each, and the properties every public operation must keep.

A ``Box`` is a folder with the store inside it and sentinel files around it::

    box/victim.txt             "../../victim.txt" seen from the store's root
    box/outside/victim.txt     "../../outside/victim.txt"
    box/mid/victim.txt         "../victim.txt"
    box/mid/sibling/victim.txt "../sibling/victim.txt"
    box/mid/store/             the store

While the operations run, an audit hook (``sys.addaudithook``) records every file that is
opened, listed, created, renamed or deleted: anything in the box but outside the store is a
violation, and so is any write or delete outside the store anywhere else.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import itertools
import json
import os
import random
import re
import shutil
import struct
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import hypothesis.strategies as st
import msgspec
import numpy as np
import xxhash

import txstore
from txstore.errors import TxstoreError, VersionExpiredError
from txstore.format.values import Absent

from . import chunkfiles

STORE = "mid/store"
VICTIMS = ("victim.txt", "outside/victim.txt", "mid/victim.txt", "mid/sibling/victim.txt")
ABS = "<absolute path of box/victim.txt>"  # replaced when a mutation is applied
COMMITTED = "<path of a committed chunk>"
TAG, LEASED, EXPIRED = "keep", 3, (0, 1)
EPOCH = 1_796_000_000.0  # the template's clock (2026-11-30): every run builds the same bytes
FAR = 2_300_000_000.0  # the template's lease expires in 2042
TRAILER = struct.Struct("<II8s")
TRAILER_MAGIC = b"TXSCEND\0"


# -- the template store ----------------------------------------------------------------------


def batch(tag: str, n: int) -> list[dict[str, Any]]:
    """Samples with every kind of value: ints, text, bytes, arrays, scalars, nesting, and a
    column that only some samples have (ABSENT slots)."""
    out = []
    for i in range(n):
        s: dict[str, Any] = {
            "id": f"{tag}-{i}",
            "n": i,
            "blob": bytes([i % 256]) * (20 + i % 7),
            "arr": np.arange(i % 4, dtype="<i4"),
            "f": np.float32(i / 4),
            "nest": {"k": [i, str(i), None]},
        }
        if i % 3 == 0:
            s["opt"] = i * 2
        out.append(s)
    return out


def extra(sample: dict[str, Any]) -> dict[str, Any]:
    return {"extra": sample["n"] * 10}


@dataclass
class Template:
    path: Path  # the store folder, copied into every box
    expected: dict[int, list[dict[str, Any]]]  # what each version was acknowledged to hold
    files: dict[str, list[str]]  # document kind -> keys
    committed_chunks: list[str]


def build_template(path: Path) -> Template:
    """Versions: 0 create, 1-2 appends (2 tagged), 3 add_fields (leased), 4-5 appends, all
    with txn ids; 0 and 1 expired, so a retention record exists.

    Built with a fixed clock and seeded ids, so that every run makes the same bytes: a drawn
    example (file number, byte offset) then hits the same document and byte in every run.
    """
    # torch is imported once here, not inside an example's memory bound: a planted tensor
    # value makes the reader import it.
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401

    ids = random.Random(18)
    ticks = itertools.count()
    with (
        mock.patch("uuid.uuid4", lambda: uuid.UUID(int=ids.getrandbits(128), version=4)),
        mock.patch("time.time", lambda: EPOCH + next(ticks)),
    ):
        return _build_template(path)


def _build_template(path: Path) -> Template:
    store = txstore.create(path, chunk_bytes=1500, block_bytes=300)
    a, b, c, d = batch("a", 12), batch("b", 7), batch("c", 5), batch("d", 3)
    store.append(a, txn_id="t-a")
    store.append(b, txn_id="t-b")
    store.tag(TAG, 2, message="the paper")
    store.add_fields(extra, ["extra"])
    store.append(c, txn_id="t-c")
    store.append(d, txn_id="t-d")
    # A lease record written as a running job's Lease writes it, without its renewing thread.
    from txstore.format import manifest as fmt
    from txstore.format.manifest import LeaseRecord

    m3 = store.commit_info(LEASED)
    record = LeaseRecord(
        version=LEASED, commit_id=m3.commit_id, created=time.time(), expires_at=FAR, owner="fz"
    )
    (path / "refs" / "leases").mkdir(parents=True, exist_ok=True)
    (path / "refs" / "leases" / f"{'ab' * 16}.json").write_bytes(fmt.encode(record))
    report = store.expire(keep_last=2)
    assert sorted(report.expired) == list(EXPIRED), report
    store.close()
    e3 = [{**s, **extra(s)} for s in a + b]
    expected = {0: [], 1: a, 2: a + b, 3: e3, 4: e3 + c, 5: e3 + c + d}
    files: dict[str, list[str]] = {k: [] for k in KINDS}
    for p in sorted(path.rglob("*")):
        if not p.is_file():
            continue
        key = p.relative_to(path).as_posix()
        kind = kind_of(key)
        if kind:
            files[kind].append(key)
    for kind in KINDS:
        assert kind == "staged" or files[kind], f"the template has no {kind}"
    return Template(path, expected, files, files["chunk"])


KINDS = (
    "manifest",
    "segment",
    "chunk",
    "fields",
    "head",
    "tag",
    "lease",
    "retention",
    "txn",
    "staged",
)


def kind_of(key: str) -> str | None:
    if key.startswith("versions/index.v") and key.endswith(".json"):
        return "manifest"
    if key.startswith("segments/") and key.endswith(".json"):
        return "segment"
    if key.startswith("chunks/"):
        return {"chunk": "chunk", "fields": "fields"}.get(key.rpartition(".")[2])
    if key == "HEAD":
        return "head"
    if key.startswith("refs/tags/"):
        return "tag"
    if key.startswith("refs/leases/"):
        return "lease"
    if key == "refs/retention.json":
        return "retention"
    if key.startswith("txns/"):
        return "txn"
    return None


# -- comparing samples -----------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b)
        )
    if isinstance(a, np.generic) or isinstance(b, np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, bytes | memoryview):
        return isinstance(b, bytes | memoryview) and bytes(a) == bytes(b)
    return type(a) is type(b) and a == b


def odd_value(value: Any, depth: int = 0) -> str | None:
    """Why a value read back is not one the format can hold (an internal marker, an array of
    a dtype no writer stores), or None."""
    if isinstance(value, Absent):
        return "the internal ABSENT marker"
    if isinstance(value, np.ndarray | np.generic):
        return None if value.dtype.kind in "biufc" else f"a numpy {value.dtype} value"
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"a key of type {type(k).__name__}"
            why = odd_value(v, depth + 1)
            if why:
                return why
        return None
    if isinstance(value, list):
        for v in value:
            why = odd_value(v, depth + 1)
            if why:
                return why
        return None
    if value is None or type(value) in (bool, int, float, str, bytes, memoryview):
        return None
    if type(value).__module__.startswith("torch"):
        return None
    return f"a value of type {type(value).__module__}.{type(value).__qualname__}"


# -- the box and its watcher -----------------------------------------------------------------


def make_box(box: Path, template: Template) -> Path:
    box.mkdir(parents=True)
    for name in VICTIMS:
        p = box / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"not yours: " + name.encode())
    root = box / STORE
    shutil.copytree(template.path, root, symlinks=True)
    return root


def outside_state(box: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and folder in the box outside the store, with its size and bytes."""
    root = (box / STORE).resolve()
    out: dict[str, tuple[int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(box):
        here = Path(dirpath)
        if here.resolve() == root:
            dirnames[:] = []
            continue
        for d in dirnames:
            if (here / d).resolve() != root:
                out[(here / d).relative_to(box).as_posix() + "/"] = (0, b"")
        for f in filenames:
            data = (here / f).read_bytes()
            out[(here / f).relative_to(box).as_posix()] = (len(data), data)
    return out


def store_keys(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def protected_keys(root: Path, now: float) -> set[str]:
    """Documents no operation may delete: manifests, tags, unexpired leases (a lease that does
    not say when it lapses counts as unexpired), txn markers, the retention record."""
    out = set()
    for key in store_keys(root):
        if key.rpartition("/")[2].startswith(".tmp."):
            continue
        kind = kind_of(key)
        if kind in ("manifest", "tag", "txn", "retention") and key.endswith(".json"):
            out.add(key)
        elif kind == "lease" and key.endswith(".json"):
            try:
                doc = json.loads((root / key).read_bytes())
                lapsed = float(doc["expires_at"]) < now
            except Exception:
                lapsed = False
            if not lapsed:
                out.add(key)
    return out


_WATCH_EVENTS = {
    "open",
    "os.listdir",
    "os.scandir",
    "os.remove",
    "os.rmdir",
    "os.rename",
    "os.link",
    "os.symlink",
    "os.truncate",
    "os.mkdir",
    "os.chmod",
    "os.utime",
    "shutil.rmtree",
    "shutil.move",
    "shutil.copyfile",
}
_READS = {"os.listdir", "os.scandir"}


class Watcher:
    """Records file-system events outside the store while ``active``: in the box, any; elsewhere,
    anything but a read (module imports read files everywhere)."""

    def __init__(self) -> None:
        self.root = ""
        self.box = ""
        self.active = False
        self.seen: list[str] = []
        self._local = threading.local()

    def _inside(self, path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder + os.sep)

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or event not in _WATCH_EVENTS or getattr(self._local, "busy", False):
            return
        self._local.busy = True
        try:
            self._check(event, args)
        finally:
            self._local.busy = False

    def _check(self, event: str, args: tuple[Any, ...]) -> None:
        paths = [a for a in args[:2] if isinstance(a, str | bytes | os.PathLike)]
        if event == "open":
            paths = paths[:1]
            mode, flags = (args[1], args[2]) if len(args) >= 3 else (None, 0)
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) != 0
            )
        else:
            writes = event not in _READS
        for p in paths:
            raw = os.fsdecode(os.fspath(p))
            path = os.path.normpath(os.path.abspath(raw))
            if self._inside(path, self.root):
                continue
            if self._inside(path, self.box) or (
                writes and not path.endswith(".pyc") and "__pycache__" not in path
            ):
                self.seen.append(f"{event} {raw!r} (outside the store root)")


WATCHER = Watcher()
_hook_lock = threading.Lock()
_hooked = False


def install_watcher() -> Watcher:
    global _hooked
    with _hook_lock:
        if not _hooked:
            sys.addaudithook(WATCHER)
            _hooked = True
    return WATCHER


@contextlib.contextmanager
def watching(box: Path) -> Iterator[Watcher]:
    w = install_watcher()
    w.root = os.path.normpath(os.path.abspath(box / STORE))
    w.box = os.path.normpath(os.path.abspath(box))
    w.seen = []
    w.active = True
    try:
        yield w
    finally:
        w.active = False


# -- mutations -------------------------------------------------------------------------------

PATHS = [
    "../victim.txt",
    "../../victim.txt",
    "../sibling/victim.txt",
    "../../outside/victim.txt",
    "chunks/../../victim.txt",
    ABS,
    "/abs",
    "versions/x.chunk",
    "versions/index.v2.json",
    "refs/tags/a.chunk",
    "refs/leases/a.chunk",
    "refs/retention.json",
    "txns/y.chunk",
    "HEAD",
    "chunks//a.chunk",
    "chunks/./a.chunk",
    "s3://other-bucket/chunks/a.chunk",
    "chunks/missing.chunk",
    COMMITTED,
    "",
]
NUMBERS = [
    -1,
    0,
    1,
    2,
    -(2**31),
    2**31,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    10**30,
    -(10**30),
    1e20,
    -1e20,
    1.5,
    1e308,
    float("nan"),
    float("inf"),
    float("-inf"),
]
#: The numbers most likely to break a reader: negative, past 64 bits, past a datetime, not finite.
OUT_OF_RANGE = [-1, 0, 2**63, 2**64, 10**30, 1e20, -1e20, 1e308, float("nan"), float("inf")]
OTHER = [None, True, False, "", "x", "0", "1e20", [], {}, [1], {"a": 1}, [None], "\u0000", "é🙂"]

hostile_values = st.one_of(
    st.sampled_from(NUMBERS),
    st.sampled_from(PATHS),
    st.sampled_from(OTHER),
    st.integers(),
    st.text(max_size=6),
)

# Where a relocated data file is copied to: metadata folders, the root, and outside the root.
PLACES = ["versions/", "refs/tags/", "refs/leases/", "txns/", "refs/", "", "../sibling/"]


def _ext(code: int, header: Any, data: bytes = b"") -> bytes:
    head = msgspec.msgpack.encode(header)
    payload = struct.pack("<I", len(head)) + head + data
    return msgspec.msgpack.encode(msgspec.msgpack.Ext(code, payload))


def _nested(depth: int) -> bytes:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return msgspec.msgpack.encode(value)


#: Values planted into a frame (encoded), each one the format cannot hold or a reader must check.
#: A reader refuses each (its chunk does not read), but for ``LENIENT`` ones, which it may also
#: read as something harmless (an absent field, a deep list).
HOSTILE_FRAME_VALUES: list[tuple[str, bytes]] = [
    ("datetime64 array", _ext(1, ["<M8[ns]", [1]], bytes(8))),
    ("object array", _ext(1, ["|O", [1]], bytes(8))),
    ("void array", _ext(1, ["|V8", [1]], bytes(8))),
    ("bad dtype name", _ext(1, ["float99", [1]], bytes(4))),
    ("negative shape", _ext(1, ["<i4", [-1]])),
    ("huge shape", _ext(1, ["<i4", [2**40, 2**40]])),
    ("shape/data mismatch", _ext(1, ["<i4", [3]], bytes(4))),
    ("header not [dtype, shape]", _ext(1, [1, 2, 3])),
    ("header longer than payload", msgspec.msgpack.encode(msgspec.msgpack.Ext(1, b"\xe8\x03"))),
    ("empty array payload", msgspec.msgpack.encode(msgspec.msgpack.Ext(1, b""))),
    ("torch float99", _ext(2, ["float99", [1]], bytes(4))),
    ("torch numpy-style dtype", _ext(2, ["<i4", [1]], bytes(4))),
    ("short scalar", _ext(3, ["<f8"], bytes(3))),
    ("datetime64 scalar", _ext(3, ["<M8[ns]"], bytes(8))),
    ("ABSENT in a dense frame", msgspec.msgpack.encode(msgspec.msgpack.Ext(0, b""))),
    ("ABSENT with a payload", msgspec.msgpack.encode(msgspec.msgpack.Ext(0, b"x"))),
    ("unknown extension", msgspec.msgpack.encode(msgspec.msgpack.Ext(99, b"abc"))),
    ("nested 40 deep", _nested(40)),
    ("never-used msgpack byte", b"\xc1"),
    ("str32 of 4 GiB", b"\xdb\xff\xff\xff\xff"),
]

LENIENT = {"ABSENT in a dense frame", "ABSENT with a payload", "nested 40 deep"}

JSON_OPS = ["set", "set", "set", "drop", "dup", "swap", "truncate", "flip", "delete", "empty"]
DATA_OPS = [
    "footer-set",
    "footer-set",
    "footer-drop",
    "footer-dup",
    "footer-swap",
    "frame-flip",
    "frame-value",
    "frame-value",
    "truncate",
    "flip",
    "delete",
    "relocate",
]


@dataclass(frozen=True)
class Mutation:
    kind: str
    op: str
    file: int
    node: int
    value: Any
    reseal: bool
    pos: int
    byte: int
    place: str
    frame_value: int
    #: For "set": a value of the node's own type (an out-of-range number for a number, a
    #: hostile path or odd text for a string) instead of ``value``, whatever its type.
    typed: bool
    number: Any
    text: str
    with_head: bool  # "delete": delete HEAD too (readers then search for the latest)
    abort: bool  # "staged": abort the transaction instead of committing it
    stale: bool  # also run verify and vacuum through a Store opened before the damage

    def label(self) -> str:
        return f"{self.kind}/{self.op}"


@st.composite
def mutations(draw: st.DrawFn, kind: str) -> Mutation:
    if kind in ("chunk", "fields"):
        op = draw(st.sampled_from(DATA_OPS))
    elif kind == "staged":
        op = draw(st.sampled_from(["set", "set", "set", "drop", "dup", "swap", "relocate"]))
    elif kind == "segment":
        op = draw(st.sampled_from([*JSON_OPS, "relocate"]))
    else:
        op = draw(st.sampled_from(JSON_OPS))
    return Mutation(
        kind=kind,
        op=op,
        file=draw(st.integers(0, 1000)),
        node=draw(st.integers(0, 10_000)),
        value=draw(hostile_values),
        reseal=draw(st.booleans()),
        pos=draw(st.integers(0, 2**20)),
        byte=draw(st.integers(1, 255)),
        place=draw(st.sampled_from(PLACES)),
        frame_value=draw(st.integers(0, len(HOSTILE_FRAME_VALUES) - 1)),
        typed=draw(st.integers(0, 9)) < 7,
        number=draw(st.sampled_from(OUT_OF_RANGE)),
        text=draw(st.sampled_from([*PATHS, "x", "é🙂", "\u0000", "other/../x", "a" * 300])),
        with_head=draw(st.booleans()),
        abort=draw(st.booleans()),
        stale=draw(st.booleans()),
    )


#: Cases the fuzzer is always run on first (hypothesis' explicit examples), one or more per
#: way the store was seen to lose data, escape its root or crash: (kind, op, file, the node's
#: path in the document, the value, other fields). A file is a key or an index in its kind.
KNOWN: list[tuple[str, str, str | int, tuple[Any, ...] | None, Any, dict[str, Any]]] = [
    ("manifest", "delete", "versions/index.v3.json", None, None, {"with_head": True}),
    ("manifest", "set", "versions/index.v5.json", ("segments",), [], {}),
    ("manifest", "set", "versions/index.v5.json", ("num_samples",), -1, {}),
    ("manifest", "set", "versions/index.v5.json", ("num_samples",), 10**30, {}),
    ("manifest", "set", "versions/index.v5.json", ("timestamp",), 1e20, {}),
    ("segment", "delete", "latest", None, None, {"stale": True}),
    ("segment", "set", "latest", ("chunks", 0, "num_samples"), 1, {"reseal": True}),
    ("chunk", "relocate", 0, None, None, {"place": "versions/"}),
    ("chunk", "relocate", 0, None, None, {"place": "refs/tags/"}),
    ("chunk", "relocate", 0, None, None, {"place": "txns/"}),
    ("chunk", "footer-set", 0, (4, 0, 1, 0, 0), 99, {"reseal": True}),
    ("chunk", "footer-set", 0, (4, 0, 1, 0, 0), -1, {"reseal": True}),
    ("chunk", "footer-set", 0, (3, 1), "id", {"reseal": True}),
    ("chunk", "footer-set", 0, (4, 0, 0), 0, {"reseal": True}),
    ("chunk", "footer-set", 0, (4, 0, 0), -1, {"reseal": True}),
    ("chunk", "frame-value", 0, None, None, {"frame_value": "datetime64 array"}),
    ("chunk", "frame-value", 0, None, None, {"frame_value": "negative shape"}),
    ("chunk", "frame-value", 0, None, None, {"frame_value": "torch float99"}),
    ("chunk", "frame-value", 0, None, None, {"frame_value": "ABSENT in a dense frame"}),
    ("fields", "relocate", 0, None, None, {"place": "refs/leases/"}),
    # A byte of a field file's frame changed and its checksum made valid again: the frame's
    # values no longer decode (verify(deep=True) must find what reads find).
    (
        "fields",
        "frame-flip",
        "chunks/cb14a2ffa1904d8a8b494c35af164bb5.fields",
        None,
        None,
        {"node": 1, "pos": 4, "byte": 34, "reseal": True},
    ),
    # Two frames of a block swapped in the footer and the chunk resealed: every frame still
    # lies inside the file, but a reader of one sample reads a block's frames as one range
    # (verify must refuse what it cannot read).
    (
        "chunk",
        "footer-swap",
        "chunks/3fe3a37b142f4372bd4fdf2326f5d760.chunk",
        (4, 1, 1, 5),
        None,
        {"reseal": True},
    ),
    ("txn", "flip", 0, None, None, {"pos": 121, "byte": 203}),  # invalid UTF-8 in commit_id
    ("manifest", "flip", "versions/index.v4.json", None, None, {"pos": 142, "byte": 142}),
    ("tag", "set", 0, ("timestamp",), 1e20, {}),
    ("tag", "set", 0, ("name",), "other/../x", {}),
    ("lease", "set", 0, ("expires_at",), 1e20, {}),
    ("retention", "set", 0, ("expired", 0, "last"), 5, {}),
    ("retention", "set", 0, ("expired", 0, "last"), 2**62, {}),
    ("retention", "set", 0, ("expired", 0, "expired_at"), 1e20, {}),
    ("staged", "set", 0, ("chunks", 0, "path"), "../victim.txt", {"abort": True}),
    ("staged", "set", 0, ("chunks", 0, "path"), "../victim.txt", {}),
    ("staged", "set", 0, ("chunks", 0, "num_samples"), 7, {}),
    ("staged", "dup", 0, ("chunks", 0), None, {}),
    ("staged", "relocate", 0, None, None, {"place": "versions/"}),
]


def known_id(number: int) -> str:
    kind, op, file, path, value, extra = KNOWN[number]
    where = "/".join(map(str, path)) if path else str(file)
    what = f"={value!r}" if path and op.endswith("set") else ""
    more = "".join(f",{k}={v}" for k, v in extra.items())
    return re.sub(r"[^A-Za-z0-9_.,=/<>+-]", "", f"{kind}-{op}-{where}{what}{more}")[:80]


def known_mutation(template: Template, number: int) -> Mutation:
    """``KNOWN[number]`` as a mutation of this template."""
    kind, op, file, path, value, extra = KNOWN[number]
    keys = template.files[kind]
    if file == "latest":  # the last segment of the latest version
        latest = json.loads((template.path / "versions/index.v5.json").read_bytes())
        file = latest["segments"][-1]["path"]
    index = keys.index(file) if isinstance(file, str) else file
    node = extra.get("node", 0)
    if path is not None:
        if kind == "staged":  # a part as StagedPart.to_json writes it: fields in order
            doc: Any = {"staging_id": "", "chunks": [{"path": "", "num_samples": 0}]}
        elif kind in ("chunk", "fields"):
            doc = _split_chunk((template.path / keys[index]).read_bytes())[1]
        else:
            doc = json.loads((template.path / keys[index]).read_bytes())
        paths = _tree_paths(doc)
        if op.endswith(("dup", "swap")):
            paths = [p for p in paths if _is_list_item(doc, p)]
        node = paths.index(path)
    names = [name for name, _ in HOSTILE_FRAME_VALUES]
    return Mutation(
        kind=kind,
        op=op,
        file=index,
        node=node,
        value=value,
        reseal=extra.get("reseal", False),
        pos=extra.get("pos", 0),
        byte=extra.get("byte", 1),
        place=extra.get("place", ""),
        frame_value=names.index(extra.get("frame_value", names[0])),
        typed=False,
        number=0,
        text="",
        with_head=extra.get("with_head", False),
        abort=extra.get("abort", False),
        stale=extra.get("stale", False),
    )


class NotApplicable(Exception):
    """The drawn mutation does not apply to the drawn document (the example is rejected)."""


def _tree_paths(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for k, v in items:
        out.append((*path, k))
        out.extend(_tree_paths(v, (*path, k)))
    return out


def _resolve(value: Any, box: Path, template: Template, pos: int) -> Any:
    if value == ABS:
        return str(box / "victim.txt")
    if value == COMMITTED:
        return template.committed_chunks[pos % len(template.committed_chunks)]
    return value


def mutate_tree(obj: Any, m: Mutation, value: Any) -> tuple[Any, str]:
    """A copy of ``obj`` with the node ``m.node`` picks set, dropped, duplicated or swapped."""
    obj = copy.deepcopy(obj)
    paths = _tree_paths(obj)
    if m.op.endswith(("dup", "swap")):
        paths = [p for p in paths if _is_list_item(obj, p)]
    if not paths:
        raise NotApplicable
    path = paths[m.node % len(paths)]
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    op = m.op.removeprefix("footer-")
    where = "/".join(map(str, path))
    if op == "set":
        old = parent[last]
        if m.typed and isinstance(old, int | float) and not isinstance(old, bool):
            value = m.number
        elif m.typed and isinstance(old, str):
            value = m.text
        if _same_json(parent[last], value):
            raise NotApplicable
        parent[last] = value
        return obj, f"{where} = {value!r:.60}"
    if op == "drop":
        del parent[last]
        return obj, f"{where} dropped"
    if op == "dup":
        parent.insert(last, copy.deepcopy(parent[last]))
        return obj, f"{where} duplicated"
    if op == "swap":
        other = last + 1 if last + 1 < len(parent) else last - 1
        if other < 0 or _same_json(parent[last], parent[other]):
            raise NotApplicable
        parent[last], parent[other] = parent[other], parent[last]
        return obj, f"{where} swapped with {other}"
    raise AssertionError(op)


def _is_list_item(obj: Any, path: tuple[Any, ...]) -> bool:
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    return isinstance(parent, list)


def _same_json(a: Any, b: Any) -> bool:
    return type(a) is type(b) and json.dumps(a) == json.dumps(b)


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


def crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def _tail_crc(data: bytes, footer_offset: int) -> int:
    return crc(data[footer_offset:])


def _seal_tail(body: bytes, footer: Any) -> bytes:
    """A chunk file of ``body`` (header and frames) and ``footer``, with a valid trailer."""
    try:
        return chunkfiles.seal(body, footer)
    except (OverflowError, TypeError, ValueError) as e:
        raise NotApplicable from e


_split_chunk = chunkfiles.split


def _referrers(root: Path, path: str) -> list[tuple[str, Any]]:
    """The documents (key, decoded) that name ``path``: segments for data files, manifests
    for segments."""
    folder = "versions" if path.startswith("segments/") else "segments"
    out = []
    for p in sorted((root / folder).glob("*.json")):
        if path.startswith("segments/") and not p.name.startswith("index.v"):
            continue
        try:
            doc = json.loads(p.read_bytes())
        except ValueError:
            continue
        if path in p.read_text(errors="replace"):
            out.append((p.relative_to(root).as_posix(), doc))
    return out


def reseal_segment(root: Path, key: str, new_key: str | None = None) -> None:
    """Make every manifest naming segment ``key`` agree with its bytes (and name ``new_key``)."""
    data = (root / (new_key or key)).read_bytes()
    for mkey, doc in _referrers(root, key):
        for ref in doc.get("segments", ()):
            if isinstance(ref, dict) and ref.get("path") == key:
                ref["size"], ref["crc32"] = len(data), crc(data)
                if new_key:
                    ref["path"] = new_key
        (root / mkey).write_bytes(_dump(doc))


def reseal_data_file(root: Path, key: str, new_key: str | None = None) -> None:
    """Make every chunk reference to data file ``key`` agree with its bytes (size, footer
    offset, tail CRC, digest), then the manifests agree with the segments rewritten."""
    data = (root / (new_key or key)).read_bytes()
    try:
        length = TRAILER.unpack_from(data, len(data) - TRAILER.size)[0]
        footer_offset = len(data) - TRAILER.size - length
    except struct.error:
        footer_offset = 0
    for skey, doc in _referrers(root, key):
        for ref in doc.get("chunks", ()):
            targets = [ref] if ref.get("path") == key else []
            targets += [f for f in ref.get("field_files", ()) if f.get("path") == key]
            for t in targets:
                t["size"], t["footer_offset"] = len(data), footer_offset
                t["crc32"] = _tail_crc(data, footer_offset)
                if "digest" in t and t["digest"] is not None:
                    t["digest"] = xxhash.xxh3_64_hexdigest(data[:footer_offset])
                if new_key:
                    t["path"] = new_key
        (root / skey).write_bytes(_dump(doc))
        reseal_segment(root, skey)


def _frames(footer: Any) -> list[tuple[int, int]]:
    """Every frame of a footer tree (``chunkfiles``): (block, frame) for a block's, and
    (-1 - column's place in ``apart``, piece) for a piece of a column stored apart."""
    out = [(b, f) for b, block in enumerate(footer[4]) for f in range(len(block[1]))]
    for a, (_, pieces, _) in enumerate(footer[5] if len(footer) > 5 else ()):
        out += [(-1 - a, p) for p in range(len(pieces))]
    return out


def _frame(footer: Any, b: int, f: int) -> tuple[Any, int]:
    """The frame at (b, f) of ``_frames`` and the samples it holds."""
    if b >= 0:
        return footer[4][b][1][f], footer[4][b][0]
    count, frame = footer[5][-1 - b][1][f]
    return frame, count


def _rebuild(body: bytes, footer: Any, replace: dict[tuple[int, int], bytes]) -> tuple[bytes, Any]:
    """The chunk's frames laid out again (some replaced by new raw frames), offsets fixed."""
    footer = copy.deepcopy(footer)
    out = bytearray(body[:8])
    for b, f in sorted(_frames(footer), key=lambda bf: _frame(footer, *bf)[0][1]):
        frame = _frame(footer, b, f)[0]
        stored = replace.get((b, f))
        if stored is None:
            stored = body[frame[1] : frame[1] + frame[2]]
        else:
            frame[3], frame[4], frame[5] = len(stored), 0, xxhash.xxh3_64_intdigest(stored)
        frame[1], frame[2] = len(out), len(stored)
        out += stored
    return bytes(out), footer


def _plant_value(body: bytes, footer: Any, m: Mutation) -> tuple[bytes, Any, str]:
    frames = _frames(footer)
    if not frames:
        raise NotApplicable
    b, f = frames[m.node % len(frames)]
    frame, n = _frame(footer, b, f)
    stored = body[frame[1] : frame[1] + frame[2]]
    if frame[4] == 1:
        import zstandard

        raw = zstandard.ZstdDecompressor().decompress(stored)
    else:
        raw = stored
    table = len(raw) - 4 * n
    starts = [*struct.unpack_from(f"<{n}I", raw, table), table]
    values = [raw[starts[i] : starts[i + 1]] for i in range(n)]
    name, planted = HOSTILE_FRAME_VALUES[m.frame_value]
    i = m.pos % n
    values[i] = planted
    head = msgspec.msgpack.encode([0] * n)[: -n or None]  # the array header for n values
    new = bytearray(head)
    offsets = []
    for v in values:
        offsets.append(len(new))
        new += v
    new += struct.pack(f"<{n}I", *offsets)
    body2, footer2 = _rebuild(body, footer, {(b, f): bytes(new)})
    where = f"block {b} frame {f}" if b >= 0 else f"apart column {-1 - b} piece {f}"
    return body2, footer2, f"{where} value {i} = {name}"


@dataclass
class Applied:
    label: str  # kind/op
    detail: str
    #: Whether the result claims to be consistent (a forged document, or one with no checksum
    #: over it): reads may then differ from the original in what no reader can check, so only
    #: counts and internal consistency are held to. Otherwise reads equal the originals.
    forged: bool
    #: A planted frame value no reader may hand out: the latest version must not read.
    must_refuse: str | None = None
    #: A forged footer's column names: a sample keeps its number of fields (a renamed column
    #: cannot be told, two columns of one name can).
    key_count: bool = False


def apply(root: Path, box: Path, template: Template, m: Mutation) -> Applied:
    """Apply ``m`` to the store at ``root`` (for "staged", only prepare it)."""
    value = _resolve(m.value, box, template, m.pos)
    m = dataclasses.replace(m, text=_resolve(m.text, box, template, m.pos))
    if m.kind == "staged" or m.op == "none":
        return Applied(m.label(), "", False)
    keys = template.files[m.kind]
    key = keys[m.file % len(keys)]
    p = root / key
    data = p.read_bytes()
    label = f"{m.label()} {re.sub('[0-9a-f]{32,64}', '<id>', key)}"
    if m.op == "delete":
        p.unlink()
        if m.with_head and key != "HEAD":
            (root / "HEAD").unlink()
        return Applied(label, "deleted" + (" with HEAD" if m.with_head else ""), False)
    if m.op == "truncate":
        cut = m.pos % max(1, len(data))
        p.write_bytes(data[:cut])
        return Applied(label, f"cut at {cut} of {len(data)}", False)
    if m.op == "flip":
        at = m.pos % len(data)
        p.write_bytes(data[:at] + bytes([data[at] ^ m.byte]) + data[at + 1 :])
        return Applied(label, f"byte {at} ^= {m.byte}", False)
    if m.op == "empty":
        p.write_bytes(b"{}")
        return Applied(label, "{}", False)
    if m.op == "relocate":
        name = key.rpartition("/")[2]
        new_key = os.path.normpath(m.place + name)
        dest = root / new_key
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest)
        if m.kind == "segment":
            reseal_segment(root, key, new_key)
        else:
            reseal_data_file(root, key, new_key)
        # A copy, so the data is the same: reads must equal the originals (or be refused).
        return Applied(label, f"moved to {new_key}", False)
    if m.kind in ("chunk", "fields"):
        body, footer = _split_chunk(data)
        if m.op == "frame-flip":
            frames = _frames(footer)
            b, f = frames[m.node % len(frames)]
            frame = _frame(footer, b, f)[0]
            at = frame[1] + m.pos % max(1, frame[2])
            body = body[:at] + bytes([body[at] ^ m.byte]) + body[at + 1 :]
            if m.reseal:  # a valid checksum over the flipped byte
                frame[5] = xxhash.xxh3_64_intdigest(body[frame[1] : frame[1] + frame[2]])
            detail = f"frame byte {at} ^= {m.byte}"
        elif m.op == "frame-value":
            body, footer, detail = _plant_value(body, footer, m)
        else:
            footer, detail = mutate_tree(footer, m, value)
        p.write_bytes(_seal_tail(body, footer))
        if m.reseal or m.op == "frame-value":
            reseal_data_file(root, key)
            planted = HOSTILE_FRAME_VALUES[m.frame_value][0] if m.op == "frame-value" else None
            return Applied(
                label,
                detail + " (resealed)",
                True,
                must_refuse=planted if planted not in LENIENT else None,
                key_count=m.op.startswith("footer") and detail.startswith("3"),
            )
        return Applied(label, detail, False)
    doc = json.loads(data)
    new, detail = mutate_tree(doc, m, value)
    p.write_bytes(_dump(new))
    if m.kind == "segment" and m.reseal:
        reseal_segment(root, key)
        return Applied(label, detail + " (resealed)", True)
    # Manifests carry no checksum: any change of theirs is a consistent forgery.
    return Applied(label, detail, m.kind == "manifest")


def mutate_staged(
    part: dict[str, Any], root: Path, box: Path, template: Template, m: Mutation
) -> tuple[dict[str, Any], str]:
    value = _resolve(m.value, box, template, m.pos)
    m = dataclasses.replace(m, text=_resolve(m.text, box, template, m.pos))
    if m.op == "none":
        return part, "an honest part"
    if m.op == "relocate":
        part = copy.deepcopy(part)
        chunk = part["chunks"][m.node % len(part["chunks"])]
        new_key = os.path.normpath(m.place + chunk["path"].rpartition("/")[2])
        dest = root / new_key
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / chunk["path"], dest)
        chunk["path"] = new_key
        return part, f"chunk moved to {new_key}"
    return mutate_tree(part, m, value)


# -- running every operation -----------------------------------------------------------------


@dataclass
class Violation:
    prop: str  # which property: raw-exception, outside-root, deleted, data, count, ...
    op: str
    what: str

    def __str__(self) -> str:
        return f"[{self.prop}] {self.op}: {self.what}"


@dataclass
class Run:
    root: Path
    box: Path
    template: Template
    applied: Applied
    expected: dict[int, list[dict[str, Any]]]
    forged_versions: set[int] = field(default_factory=set)
    violations: list[Violation] = field(default_factory=list)
    protected: set[str] = field(default_factory=set)
    damage_seen: list[str] = field(default_factory=list)  # what reported damage, so far
    current: str = ""  # the operation running

    def fail(self, prop: str, op: str, what: str) -> None:
        self.violations.append(Violation(prop, op, what))

    def call(
        self, op: str, fn: Callable[[], Any], *, allow: tuple[type[BaseException], ...] = ()
    ) -> tuple[bool, Any]:
        """Run one operation: (True, result), or (False, the TxstoreError it raised). Any
        other exception is a violation."""
        self.current = op
        try:
            return True, fn()
        except TxstoreError as e:
            return False, e
        except allow as e:
            return False, e
        except Exception as e:
            self.fail(
                "raw-exception", op, f"{type(e).__module__}.{type(e).__qualname__}: {e!s:.200}"
            )
            return False, e

    def check_protected(self, op: str) -> None:
        gone = sorted(k for k in self.protected if not (self.root / k).exists())
        for k in gone:
            self.fail("deleted", op, f"{k} was deleted")
        self.protected -= set(gone)


@dataclass
class Read:
    ok: bool
    error: BaseException | None = None
    samples: list[dict[str, Any]] | None = None
    version: int | None = None


def read_version(run: Run, store: txstore.Store, ref: int | str | None, op: str) -> Read:
    """Open, len, iterate and index one version, checking they agree with each other."""
    ok, snap = run.call(f"{op} snapshot({ref!r})", lambda: store.snapshot(ref))
    if not ok:
        return Read(False, snap)
    ok, n = run.call(f"{op} len(snapshot({ref!r}))", lambda: len(snap))
    if not ok:
        return Read(False, n)
    if not isinstance(n, int) or n < 0:
        run.fail("count", op, f"len(snapshot({ref!r})) is {n!r}")
        return Read(False, None)
    ok, items = run.call(f"{op} iterate({ref!r})", lambda: list(snap))
    if not ok:
        return Read(False, items)
    if len(items) != n:
        run.fail("count", op, f"snapshot({ref!r}) has len {n} but iterates {len(items)} samples")
    # Every sample by index (a few dozen: cheap), and the last one counted from the end.
    for i in [*range(n), -1] if n else []:
        ok, one = run.call(f"{op} snapshot({ref!r})[{i}]", functools.partial(snap.__getitem__, i))
        if not ok:
            return Read(False, one)
        if i < len(items) and not same(one, items[i]):
            run.fail("index-vs-iter", op, f"snapshot({ref!r})[{i}] differs from the iteration's")
            break
    ok, _ = run.call(f"{op} snapshot({ref!r})[len]", lambda: snap[n], allow=(IndexError,))
    if ok:
        run.fail("index", op, f"snapshot({ref!r})[{n}] (past the end) returned a sample")
    for s in items:
        why = odd_value(s)
        if why:
            run.fail("odd-value", op, f"a sample of snapshot({ref!r}) holds {why}")
            break
    return Read(True, None, items, snap.version)


def check_data(run: Run, read: Read, op: str, ref: int | str | None) -> bool:
    """Whether a read agrees with what was acknowledged; records a violation if not."""
    if not read.ok or read.version is None or read.version not in run.expected:
        return read.ok
    want = run.expected[read.version]
    got = read.samples or []
    forged = run.applied.forged or read.version in run.forged_versions
    if len(got) != len(want):
        run.fail(
            "count",
            op,
            f"v{read.version} ({ref!r}) reads {len(got)} samples, acknowledged {len(want)}",
        )
        return False
    if forged and run.applied.key_count:
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if len(g) != len(w):
                run.fail(
                    "data", op, f"v{read.version} sample {i} has {len(g)} fields, not {len(w)}"
                )
                return False
    if not forged:
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if not same(g, w):
                run.fail(
                    "data",
                    op,
                    f"v{read.version} sample {i}: {_short(g)} was acknowledged as {_short(w)}",
                )
                return False
    return True


def _short(sample: Any) -> str:
    return repr(sample)[:120]


def read_all(run: Run, store: txstore.Store, op: str) -> dict[int, Read]:
    out = {}
    for v in sorted(run.expected):
        r = read_version(run, store, v, op)
        out[v] = r
        if r.ok:
            r.ok = check_data(run, r, op, v)
    return out


def verify(run: Run, store: txstore.Store, op: str, deep: bool) -> bool:
    """Run verify; True if it says no damage. Remember what reported damage."""
    name = f"{op} verify(deep={deep})"
    ok, report = run.call(name, lambda: store.verify(deep=deep))
    if not ok:
        run.damage_seen.append(f"{name} raised {type(report).__name__}")
        return False
    if report.problems:
        run.damage_seen.append(f"{name}: {report.problems[0]}")
        return False
    return True


def unexpired(reads: dict[int, Read]) -> list[int]:
    return [v for v, r in reads.items() if not isinstance(r.error, VersionExpiredError)]


def held_to_verify(run: Run, reads: dict[int, Read], op: str, deep: bool) -> None:
    """After a verify that found nothing: every unexpired version reads back as acknowledged
    (deep), or at least none of its files is missing and the chain has no hole (metadata).
    A version past the last manifest left is not held to this: nothing records it existed."""
    last = max((v for v in run.expected if (run.root / manifest_key(v)).exists()), default=-1)
    for v in unexpired(reads):
        r = reads[v]
        if r.ok or v > last:
            continue
        if deep:
            run.fail(
                "verify-ok-but", op, f"verify(deep=True) says ok; v{v} does not read: {_err(r)}"
            )
        elif isinstance(r.error, txstore.MissingDataError | txstore.VersionNotFoundError):
            run.fail("verify-ok-but", op, f"verify() says ok; v{v}: {_err(r)}")


def manifest_key(version: int) -> str:
    return f"versions/index.v{version}.json"


def _err(r: Read) -> str:
    return f"{type(r.error).__name__}: {r.error!s:.150}" if r.error is not None else "wrong data"


@contextlib.contextmanager
def parser_built_once() -> Iterator[None]:
    """``txstore.cli.main`` with its argument parser built once, not per call (building it
    was half of an example's time); parsing is unchanged."""
    import txstore.cli as cli_module

    build = cli_module.build_parser
    cli_module.build_parser = functools.cache(build)
    try:
        yield
    finally:
        cli_module.build_parser = build


def cli(run: Run, args: list[str], op: str) -> int | None:
    from txstore.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        ok, code = run.call(
            f"cli {' '.join(args)}",
            lambda: main([args[0], str(run.root), *args[1:]]),
            allow=(SystemExit,),
        )
    command = f"txstore {' '.join(args)}"
    if not ok:
        if isinstance(code, SystemExit):
            run.fail(
                "cli", op, f"{command} raised SystemExit({code.code!r}): {err.getvalue()[-99:]}"
            )
        elif isinstance(code, TxstoreError):
            run.fail(
                "cli",
                op,
                f"txstore {' '.join(args)} raised {type(code).__name__} instead of an exit code",
            )
        return None
    if not isinstance(code, int) or isinstance(code, bool):
        run.fail("cli", op, f"txstore {' '.join(args)} returned {code!r}, not an int")
        return None
    if code == 2:  # every argument given here is valid: damage is not bad usage
        run.fail(
            "cli-exit",
            op,
            f"txstore {' '.join(args)} exited 2 (bad usage): {err.getvalue().strip()[-200:]}",
        )
    if "Traceback" in err.getvalue():
        run.fail("cli", op, f"txstore {' '.join(args)} printed a traceback")
    return code


CLI_READS = [
    ["log"],
    ["log", "--json"],
    ["show", "2"],
    ["show", TAG],
    ["info"],
    ["info", "--version", "3"],
    ["ls"],
    ["cat", "0"],
    ["cat", "-1", "--version", TAG],
    ["diff", "2", "5"],
    ["tags"],
    ["tags", "--json"],
    ["leases"],
    ["vacuum", "--dry-run", "--grace", "0s"],
    ["expire", "--dry-run", "--keep-last", "1"],
]


def run_operations(
    run: Run, m: Mutation, stale: txstore.Store | None, staged: Staged | None
) -> None:
    """Every public operation on the mutated store, with the properties after each."""
    root = run.root
    run.protected = protected_keys(root, time.time())
    uri = str(root)

    if staged is not None:
        staged_commit(run, staged, m)

    ok, store = run.call("open", lambda: txstore.open(uri))
    for args in CLI_READS:
        cli(run, args, "cli reads")
    codes = {
        deep: cli(run, ["verify", *(["--deep"] if deep else [])], "cli verify")
        for deep in (False, True)
    }
    if not ok:
        run.damage_seen.append("open failed")
        return
    assert isinstance(store, txstore.Store)
    try:
        _run_api(run, store, stale, codes)
    finally:
        store.close()


def _run_api(
    run: Run, store: txstore.Store, stale: txstore.Store | None, codes: dict[bool, int | None]
) -> None:
    uri = str(run.root)
    kind = run.applied.label.partition("/")[0]
    reads = read_all(run, store, "read")
    latest = read_version(run, store, None, "read latest")
    check_data(run, latest, "read latest", None)
    tagged = read_version(run, store, TAG, "read tag")
    if tagged.ok and tagged.version is not None and tagged.version != 2 and not run.applied.forged:
        run.fail("data", "read tag", f"tag {TAG!r} opens version {tagged.version}, was 2")
    check_data(run, tagged, "read tag", TAG)
    planted = run.applied.must_refuse
    if planted and 5 in reads and reads[5].ok:
        run.fail("accepted", "read", f"a frame value planted as {planted} reads back as data")
    # The latest, tagged and leased versions never expire, whatever the retention record says.
    never_expire = {latest.version} if latest.version is not None else set()
    never_expire |= {2} if kind != "tag" else set()
    never_expire |= {LEASED} if kind != "lease" else set()
    for v in sorted(never_expire & reads.keys()):
        if isinstance(reads[v].error, VersionExpiredError):
            run.fail("expired", "read", f"v{v} (latest, tagged or leased) reads as expired")
    run.call("version", lambda: store.version)
    run.call("log", lambda: [repr(c) for c in store.log()])
    run.call("log(limit=2)", lambda: store.log(limit=2))
    run.call("tags", lambda: [repr(t) for t in store.tags().values()])
    run.call("tag_info", lambda: store.tag_info(TAG))
    run.call("leases", lambda: [repr(x) for x in store.leases()])
    run.call("expired_versions", store.expired_versions)
    for a, b in ((1, 5), (2, 5), (TAG, 4), (5, 2)):
        run.call(f"diff({a!r}, {b!r})", functools.partial(store.diff, a, b))
    for v in sorted(run.expected):
        run.call(f"commit_info({v})", functools.partial(store.commit_info, v))

    plain_ok = verify(run, store, "before vacuum", deep=False)
    deep_ok = verify(run, store, "before vacuum", deep=True)
    if plain_ok:
        held_to_verify(run, reads, "verify", deep=False)
    if deep_ok:
        held_to_verify(run, reads, "verify", deep=True)
    check_cli_verify(run, codes, plain_ok, deep_ok)
    if stale is not None:
        stale_ok = verify(run, stale, "stale store", deep=True)
        if stale_ok and not deep_ok:
            run.fail(
                "stale",
                "stale store verify(deep=True)",
                "a Store opened before the damage says ok; a fresh one finds damage",
            )
        run.call("stale store vacuum", lambda: stale.vacuum(grace=0))
        run.check_protected("stale store vacuum")
    readable = {v for v, r in reads.items() if r.ok}
    # Damage to a document that holds no data never costs a version that cannot expire.
    always = (
        readable & never_expire if kind in ("head", "tag", "lease", "retention", "txn") else set()
    )
    retry_committed(run, "before vacuum")

    run.call("vacuum(dry_run)", lambda: store.vacuum(grace=0, dry_run=True))
    run.check_protected("vacuum(dry_run)")
    run.call("vacuum", lambda: store.vacuum(grace=0))
    run.check_protected("vacuum")
    after_vacuum(run, readable, "vacuum", always)
    retry_committed(run, "after vacuum")

    # An append must land where every later reader sees it, exactly once per txn_id.
    new = batch("z", 4)
    ok, commit = run.call("append", lambda: store.append(new, txn_id="fz-1"))
    run.check_protected("append")
    if ok:
        read_back = check_append(run, commit.version, new)
        ok2, again = run.call("append again", lambda: _append_fresh(uri, new, "fz-1"))
        if ok2 and again.version != commit.version:
            run.fail(
                "txn",
                "append again",
                f"the same txn_id committed twice: versions {commit.version} and {again.version}",
            )
        run.check_protected("append again")
        if read_back:
            readable.add(commit.version)
            never_expire.add(commit.version)
            always.add(commit.version)

    run.call("expire(dry_run)", lambda: store.expire(keep_last=1, dry_run=True))
    run.call("expire", lambda: store.expire(keep_last=1))
    run.check_protected("expire")
    run.call("vacuum after expire", lambda: store.vacuum(grace="0s"))
    run.check_protected("vacuum after expire")
    after_vacuum(run, readable & never_expire, "expire + vacuum", always & never_expire)
    retry_committed(run, "after expire + vacuum")

    cli(run, ["vacuum", "--grace", "0s", "--yes"], "cli vacuum")
    run.check_protected("cli vacuum")
    cli(run, ["expire", "--keep-last", "1", "--yes"], "cli expire")
    run.check_protected("cli expire")
    cli(run, ["verify"], "cli verify at the end")
    after_vacuum(run, readable & never_expire, "cli vacuum", always & never_expire)

    # The commands that write new versions or refs, on whatever the damage left.
    for args in (
        ["tag", "fz-tag"],
        ["compact", "--yes"],
        ["rollback", "2", "--yes"],
        ["untag", "fz-tag", "--yes"],
    ):
        cli(run, args, f"cli {args[0]}")
        run.check_protected(f"cli {args[0]}")
    after_vacuum(run, readable & never_expire, "cli writes", always & never_expire)


def check_cli_verify(
    run: Run, codes: dict[bool, int | None], plain_ok: bool, deep_ok: bool
) -> None:
    """The CLI's verify agrees with the API's: ``--deep`` exactly; the default checks at least
    what ``verify()`` checks and at most what ``verify(deep=True)`` checks."""
    deep, plain = codes.get(True), codes.get(False)
    if deep is not None and (deep == 0) != deep_ok:
        run.fail("cli-exit", "cli verify --deep", f"exited {deep}; the API's deep ok={deep_ok}")
    if plain is not None and plain == 0 and not plain_ok:
        run.fail("cli-exit", "cli verify", "exited 0; the API's verify() found damage")
    if plain is not None and plain != 0 and deep_ok:
        run.fail("cli-exit", "cli verify", f"exited {plain}; the API's verify(deep=True) is ok")


def retry_committed(run: Run, op: str) -> None:
    """A txn_id committed before (version 2's) is found again, never committed twice."""
    if run.damage_seen or run.applied.label.startswith("txn/"):
        return  # a damaged or missing marker, reported: the retry may not find it
    uri = str(run.root)
    ok, before = run.call(f"{op}: version", lambda: _latest(uri))
    ok2, commit = run.call(f"{op}: retry t-b", lambda: _append_fresh(uri, batch("b", 7), "t-b"))
    if ok and ok2 and (commit.version != 2 or _latest(uri) != before):
        run.fail("txn", op, f"txn_id 't-b' (version 2) committed again, as v{commit.version}")


def _latest(uri: str) -> int:
    with txstore.open(uri) as store:
        return store.version


def after_vacuum(run: Run, readable: set[int], op: str, always: set[int] | None = None) -> None:
    """Versions that read back before must still, unless damage was reported before (those
    in ``always``: whatever was reported)."""
    check = readable if not run.damage_seen else readable & (always or set())
    if not check:
        return
    try:
        fresh = txstore.open(str(run.root))
    except Exception as e:
        run.fail("lost", op, f"the store no longer opens after {op}: {_exc(e)}")
        return
    with fresh:
        for v in sorted(check):
            r = read_version(run, fresh, v, f"read after {op}")
            if r.ok and v in run.expected:
                r.ok = check_data(run, r, f"read after {op}", v)
            if not r.ok and not isinstance(r.error, VersionExpiredError):
                run.fail("lost", op, f"v{v} read back before {op}, now: {_err(r)}")


def _append_fresh(uri: str, samples: list[dict[str, Any]], txn_id: str) -> txstore.Commit:
    with txstore.open(uri) as store:
        return store.append(samples, txn_id=txn_id)


def check_append(run: Run, version: int, new: list[dict[str, Any]]) -> bool:
    """An acknowledged append is the latest version for every new reader, and (unless damage
    was reported before: the version holds the older samples too) reads back."""
    parent = version - 1
    try:
        fresh = txstore.open(str(run.root))
    except Exception as e:
        run.fail("lost", "append", f"no store opens after an acknowledged append: {_exc(e)}")
        return False
    with fresh:
        ok, latest = run.call("version after append", lambda: fresh.version)
        if ok and latest != version:
            run.fail("lost", "append", f"append acknowledged as v{version}; the latest is {latest}")
        r = read_version(run, fresh, version, "read the append")
        if not r.ok:
            if not run.damage_seen:
                run.fail("lost", "append", f"append acknowledged as v{version}: {_err(r)}")
            return False
        got = r.samples or []
        tail = got[-len(new) :]
        if len(tail) != len(new) or not all(map(same, tail, new)):
            run.fail("lost", "append", f"version {version} does not end with the samples appended")
            return False
        if parent in run.expected:
            run.expected[version] = run.expected[parent] + new
            if parent in run.forged_versions or run.applied.forged:
                run.forged_versions.add(version)
            return check_data(run, r, "read the append", version)
        return True


def _exc(e: BaseException) -> str:
    return f"{type(e).__name__}: {e!s:.150}"


@dataclass
class Staged:
    """A transaction with a part written by a writer, then mutated as it travels."""

    store: txstore.Store
    txn: Any
    doc: dict[str, Any]
    samples: list[dict[str, Any]]


def prepare_staged(root: Path, box: Path, template: Template, m: Mutation) -> tuple[Staged, str]:
    store = txstore.open(str(root))
    txn = store.transaction(txn_id="fz-staged", message="staged")
    new = batch("s", 6)
    writer = txn.writer()
    writer.write(new)
    part = writer.finish()
    doc, detail = mutate_staged(json.loads(part.to_json()), root, box, template, m)
    return Staged(store, txn, doc, new), detail


def staged_commit(run: Run, staged: Staged, m: Mutation) -> None:
    """Hand the mutated part to the transaction: refused, committed or aborted, never trusted."""
    from txstore.store.staging import StagedPart

    store, txn = staged.store, staged.txn
    ok, hostile = run.call("StagedPart.from_json", lambda: StagedPart.from_json(_dump(staged.doc)))
    if ok:
        ok, _ = run.call("Transaction.add", lambda: txn.add(hostile))
    if ok and not m.abort:
        latest = store.version
        ok, commit = run.call("Transaction.commit", txn.commit)
        run.check_protected("Transaction.commit")
        if ok:
            if commit.version == latest + 1 and latest in run.expected:
                run.expected[commit.version] = run.expected[latest] + staged.samples
                run.forged_versions.add(commit.version)
            # The store was whole: a part it accepted must leave a version that reads back.
            fresh = txstore.open(str(run.root))
            with fresh:
                r = read_version(run, fresh, commit.version, "read the staged commit")
                if r.ok:
                    check_data(run, r, "read the staged commit", commit.version)
                else:
                    run.fail(
                        "accepted",
                        "Transaction.commit",
                        f"a staged part was committed as v{commit.version}, which does not read "
                        f"back: {_err(r)}",
                    )
            return
    run.call("staged: abort", txn.abort)
    run.check_protected("staged: abort")


def check_outside(run: Run, before: dict[str, tuple[int, bytes]], watcher: Watcher) -> None:
    after = outside_state(run.box)
    for key in sorted(before.keys() | after.keys()):
        if key not in after:
            run.fail("outside-root", "all", f"{key} outside the root was deleted")
        elif key not in before:
            run.fail("outside-root", "all", f"{key} was created outside the root")
        elif before[key] != after[key]:
            run.fail("outside-root", "all", f"{key} outside the root was changed")
    for what in dict.fromkeys(watcher.seen):
        run.fail("outside-root", "all", what)


class Hang(BaseException):
    """An example ran past its time (a BaseException: the code under test catches Exception)."""


#: Time and memory an example may take: a hostile number must not make an operation loop or
#: allocate without bound (a range of 2**63 versions, a 10**30-byte frame).
EXAMPLE_SECONDS = 20.0
EXAMPLE_MEMORY = 1 << 30


def _vm_data() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def bounded(run: Run) -> Iterator[None]:
    """Raise ``Hang`` in the operation running when the example's time is up, and make
    allocations past its memory fail (MemoryError, reported as a raw exception)."""
    import resource
    import signal

    main = threading.current_thread() is threading.main_thread()
    if main:

        def alarm(signum: int, frame: Any) -> None:
            raise Hang(f"the example ran past {EXAMPLE_SECONDS:.0f} s of CPU")

        # CPU time, not wall time: SIGALRM is pytest-timeout's, and a loop is what to catch.
        old_handler = signal.signal(signal.SIGVTALRM, alarm)
        signal.setitimer(signal.ITIMER_VIRTUAL, EXAMPLE_SECONDS)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _vm_data() + EXAMPLE_MEMORY
    if sys.platform == "linux" and (hard == resource.RLIM_INFINITY or limit < hard):
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield
    except Hang as e:
        run.fail("hang", run.current, str(e))
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
        if main:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            signal.signal(signal.SIGVTALRM, old_handler)


def warm(store: txstore.Store, expected: dict[int, list[dict[str, Any]]]) -> None:
    """Fill a Store's caches: every unexpired version read once, verified once."""
    for v in expected:
        with contextlib.suppress(VersionExpiredError):
            list(store.snapshot(v))
    store.verify(deep=True)


def run_case(box: Path, template: Template, m: Mutation) -> Run:
    """One example: a fresh copy of the template, the mutation, every operation."""
    root = make_box(box, template)
    stale = None
    if m.stale and m.kind != "staged":
        stale = txstore.open(str(root))
        warm(stale, template.expected)
    applied = apply(root, box, template, m)
    staged = None
    if m.kind == "staged":
        staged, applied.detail = prepare_staged(root, box, template, m)
    run = Run(root, box, template, applied, copy.deepcopy(template.expected))
    before = outside_state(box)
    try:
        with watching(box) as watcher, parser_built_once(), bounded(run):
            run_operations(run, m, stale, staged)
    finally:
        for s in (stale, staged.store if staged else None):
            if s is not None:
                s.close()
    check_outside(run, before, watcher)
    return run
