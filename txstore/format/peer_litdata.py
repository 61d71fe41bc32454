"""LitData's optimized format (``litdata.optimize``), read and written without LitData.

Pure bytes to values and back, no I/O: ``txstore.interop`` reads the files through the
storage layer and hands their bytes here.

A dataset is a folder with ``index.json`` (``{"chunks": [...], "config": {...}}``) and chunk
files. The config's ``data_spec`` is the samples' structure (a PyTorch pytree spec as JSON:
dicts, lists and tuples down to leaves) and ``data_format`` the serializer of each leaf, in
the order the pytree flattens them. A chunk file is ``[n: u32][offsets: (n + 1) x u32]
[items]``, the whole file zstd-compressed when the config says ``compression: "zstd"``; an
item is a u32 size per leaf, then each leaf's bytes.

A leaf's value is what LitData's own reader gives, but for images and files: ``jpeg``,
``image:*`` and the other file-like serializers keep their stored bytes (LitData decodes
JPEGs into tensors; txstore never decodes or re-encodes them), and ``pil`` (raw pixels)
becomes a numpy array of its pixels (``peer_mds.pixels_of``), the one exact form. Tensors
stay torch tensors (read through ``format/tensors.py``, torch's one place here). ``pickle``
is refused: txstore never unpickles.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import CorruptError, EncodeError, UnsupportedFormatError
from . import columnar
from .columnar import ColumnBatch
from .manifest import check_path
from .peer_mds import DATASET_FOLDER, all_utf8, item_heads, pixels_of

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")

#: LitData's numpy dtypes by index (its ``_NUMPY_DTYPES_MAPPING``; None: no exact value).
NUMPY_DTYPES: list[str | None] = [
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "bool",
    None,  # object
    None,  # bytes
    None,  # str
    None,  # void
]
#: LitData's torch dtypes by index (its ``_TORCH_DTYPES_MAPPING``; aliases share a dtype).
TORCH_DTYPES = [
    "float32",
    "float32",
    "float64",
    "float64",
    "complex64",
    "complex64",
    "complex128",
    "complex128",
    "float16",
    "float16",
    "bfloat16",
    "uint8",
    "int8",
    "int16",
    "int16",
    "int32",
    "int32",
    "int64",
    "int64",
    "bool",
    "uint16",
]
#: The index LitData's writer records for a dtype (the last of its aliases).
_NUMPY_INDEX = {name: i for i, name in enumerate(NUMPY_DTYPES) if name is not None}
_TORCH_INDEX = {name: i for i, name in enumerate(TORCH_DTYPES)}
#: Torch dtypes as numpy reads their bytes (bfloat16 has no numpy dtype: its bytes stay raw).
_TORCH_ITEMSIZE = {
    "float32": 4,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
    "float16": 2,
    "bfloat16": 2,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "uint16": 2,
}

#: Serializers whose stored bytes are a file's (an image, a video, a PDF ...): kept as bytes.
FILE_LIKE = ("jpeg", "image", "file", "video", "audio", "pdf", "tifffile", "tiff", "nifti", "mesh")

#: Serializers whose leaves ``Layout.classic_batch`` reads a column at a time, by kind.
_COLUMNAR = {"int": "int", "float": "float", "bool": "bool", "bytes": "bytes", "str": "str",
             "text": "str"}  # fmt: skip

#: Serializers txstore cannot import exactly, and why.
REFUSED = {
    "pickle": "it is pickle, which txstore never unpickles (it runs code)",
    "graph": "a graph's layout is LitData's own and may hold pickle",
}


# -- the pytree spec -------------------------------------------------------------------


class Spec:
    """A node of the samples' structure: a leaf, or a dict, list or tuple of nodes."""

    def __init__(self, kind: str, keys: list[Any] | None, children: list[Spec]) -> None:
        self.kind, self.keys, self.children = kind, keys, children
        self.leaves: int = 1 if kind == "leaf" else sum(c.leaves for c in children)

    def build(self, leaves: Iterator[Any]) -> Any:
        if self.kind == "leaf":
            return next(leaves)
        values = [c.build(leaves) for c in self.children]
        if self.kind == "dict":
            assert self.keys is not None
            return dict(zip(self.keys, values, strict=True))
        return values  # a list or a tuple: txstore has lists

    def paths(self, prefix: str = "") -> list[str]:
        """The name of each leaf, in flattening order ("label", "meta.size", "0")."""
        if self.kind == "leaf":
            return [prefix or "value"]
        names = self.keys if self.keys is not None else list(range(len(self.children)))
        out: list[str] = []
        for name, child in zip(names, self.children, strict=True):
            out += child.paths(f"{prefix}.{name}" if prefix else str(name))
        return out


_NODES = {
    "builtins.dict": "dict",
    "collections.OrderedDict": "dict",
    "builtins.list": "list",
    "builtins.tuple": "tuple",
}


def _spec(node: Any, where: str) -> Spec:
    if not isinstance(node, dict):
        raise CorruptError(f"{where}: a data_spec node is {node!r:.80}")
    kind = node.get("type")
    children = [_spec(c, where) for c in node.get("children_spec") or []]
    if kind is None:
        return Spec("leaf", None, [])
    if kind not in _NODES:
        raise UnsupportedFormatError(
            f"{where}: samples holding {kind} (a pytree node) are not read; dicts, lists and "
            "tuples are"
        )
    keys = None
    if _NODES[kind] == "dict":
        keys = json.loads(node["context"])
        if not isinstance(keys, list) or len(keys) != len(children):
            raise CorruptError(f"{where}: a dict node's keys do not match its children")
    return Spec(_NODES[kind], keys, children)


def parse_spec(text: str | None, where: str) -> Spec:
    """The structure ``data_spec`` records (``[protocol, node]``, JSON in a string)."""
    if text is None:
        raise CorruptError(f"{where}: the config has no data_spec (no sample was written)")
    try:
        protocol, node = json.loads(text)
    except (ValueError, TypeError) as e:
        raise CorruptError(f"{where}: a bad data_spec: {e}") from e
    if protocol != 1:
        raise UnsupportedFormatError(f"{where}: pytree protocol {protocol!r}, not 1")
    return _spec(node, where)


def dict_spec(keys: list[str]) -> str:
    """The ``data_spec`` of samples that are dicts of these keys, each value one leaf."""
    leaf: dict[str, Any] = {"type": None, "context": None, "children_spec": []}
    node = {
        "type": "builtins.dict",
        "context": json.dumps(keys),
        "children_spec": [leaf] * len(keys),
    }
    return json.dumps([1, node])


# -- leaves ----------------------------------------------------------------------------


def _array(data: memoryview, dtype: str, shape: tuple[int, ...], where: str) -> Any:
    itemsize = np.dtype(dtype).itemsize
    if len(data) != itemsize * math.prod(shape):
        raise CorruptError(f"{where}: {len(data)} bytes for a {dtype} array of shape {shape}")
    return np.frombuffer(data, np.dtype(dtype).newbyteorder("<")).reshape(shape).astype(dtype)


def _numpy(data: memoryview, where: str) -> Any:
    if len(data) < 8:
        raise CorruptError(f"{where}: a numpy value of {len(data)} bytes")
    index, ndim = struct.unpack_from("<II", data, 0)
    dtype = _numpy_dtype(index, where)
    shape = struct.unpack_from(f"<{ndim}I", data, 8)
    return _array(data[8 + 4 * ndim :], dtype, shape, where)


def _numpy_dtype(index: int, where: str) -> str:
    name = NUMPY_DTYPES[index] if 0 <= index < len(NUMPY_DTYPES) else None
    if name is None:
        raise EncodeError(
            f"{where}: numpy dtype number {index} (object, bytes, str or void "
            "arrays) has no exact txstore value"
        )
    return name


def _tensor_dtype(index: int, where: str) -> str:
    if not 0 <= index < len(TORCH_DTYPES):
        raise CorruptError(f"{where}: unknown torch dtype number {index}")
    return TORCH_DTYPES[index]


def _tensor(raw: memoryview, dtype: str, shape: tuple[int, ...], where: str) -> Any:
    from .tensors import tensor_named

    if len(raw) != _TORCH_ITEMSIZE[dtype] * math.prod(shape):
        raise CorruptError(f"{where}: {len(raw)} bytes for a {dtype} tensor of shape {shape}")
    return tensor_named(raw, dtype, shape)


def _tensor_with_header(data: memoryview, where: str) -> Any:
    if len(data) < 8:
        raise CorruptError(f"{where}: a tensor value of {len(data)} bytes")
    index, ndim = struct.unpack_from(">II", data, 0)
    shape = struct.unpack_from(f">{ndim}I", data, 8)
    return _tensor(data[8 + 4 * ndim :], _tensor_dtype(index, where), shape, where)


def _one_dim(itemsize: int, data: memoryview, where: str) -> tuple[int]:
    if len(data) % itemsize:
        raise CorruptError(f"{where}: {len(data)} bytes is no whole number of elements")
    return (len(data) // itemsize,)


def _jpeg_array(data: memoryview, where: str) -> list[bytes]:
    if len(data) < 4:
        raise CorruptError(f"{where}: a JPEG array of {len(data)} bytes")
    (n,) = _U32.unpack_from(data, 0)
    sizes = struct.unpack_from(f"<{n}I", data, 4)
    out, at = [], 4 + 4 * n
    for size in sizes:
        out.append(bytes(data[at : at + size]))
        at += size
    if at != len(data):
        raise CorruptError(f"{where}: a JPEG array's sizes do not add up to its bytes")
    return out


def _utf8(raw: memoryview, at: int) -> tuple[str, int]:
    (n,) = _U32.unpack_from(raw, at)
    return str(raw[at + 4 : at + 4 + n], "utf-8"), at + 4 + n


def _nested(raw: memoryview, at: int) -> tuple[Any, int]:
    """One value of LitData's compact encoding of lists and dicts (its ``json`` leaves)."""
    tag = raw[at]
    if tag in (1, 2, 3, 4, 5, 6, 0):
        (n,) = _U32.unpack_from(raw, at + 1)
        at += 5
        if tag == 0:
            return json.loads(str(raw[at : at + n], "utf-8")), at + n
        if tag == 1:
            items = []
            for _ in range(n):
                text, at = _utf8(raw, at)
                items.append(text)
            return items, at
        if tag in (2, 3):
            kind = "<i8" if tag == 2 else "<f8"
            return np.frombuffer(raw[at : at + 8 * n], kind).tolist(), at + 8 * n
        if tag == 4:
            return [bool(b) for b in raw[at : at + n]], at + n
        if tag == 5:
            mapping: dict[str, Any] = {}
            for _ in range(n):
                key, at = _utf8(raw, at)
                mapping[key], at = _nested(raw, at)
            return mapping, at
        (n_keys,) = _U32.unpack_from(raw, at)
        at += 4
        keys = []
        for _ in range(n_keys):
            key, at = _utf8(raw, at)
            keys.append(key)
        rows: list[dict[str, Any]] = []
        for _ in range(n):
            row: dict[str, Any] = {}
            for key in keys:
                kind_tag = raw[at]
                at += 1
                if kind_tag == 0x10:
                    row[key] = None
                elif kind_tag == 0x11:
                    row[key], at = _utf8(raw, at)
                elif kind_tag in (0x12, 0x13):
                    unpack = _I64 if kind_tag == 0x12 else _F64
                    row[key] = unpack.unpack_from(raw, at)[0]
                    at += 8
                elif kind_tag == 0x14:
                    row[key] = bool(raw[at])
                    at += 1
                else:
                    raise ValueError(f"unknown record tag {kind_tag}")
            rows.append(row)
        return rows, at
    if tag == 7:
        return _utf8(raw, at + 1)
    if tag in (8, 9):
        return (_I64 if tag == 8 else _F64).unpack_from(raw, at + 1)[0], at + 9
    if tag == 10:
        return bool(raw[at + 1]), at + 2
    if tag == 11:
        return None, at + 1
    raise ValueError(f"unknown tag {tag}")


def _json_leaf(data: memoryview, where: str) -> Any:
    try:
        if not data or data[0] > 0x20:  # JSON text, as earlier versions wrote
            return json.loads(str(data, "utf-8"))
        value, end = _nested(data, 0)
    except (ValueError, IndexError, struct.error) as e:
        raise CorruptError(f"{where}: a bad json value: {e}") from e
    if end != len(data):
        raise CorruptError(f"{where}: {len(data) - end} bytes after a json value")
    return value


def leaf_decoder(name: str, where: str) -> Callable[[memoryview], Any]:
    """The function that turns a leaf's bytes into its txstore value, for serializer
    ``name`` (``data_format``'s entry); refuses what cannot be imported exactly."""
    base, _, arg = name.partition(":")
    if base in REFUSED:
        raise EncodeError(f"{where}: serializer {name!r} cannot be imported: {REFUSED[base]}")
    if base in FILE_LIKE:
        return bytes
    fixed: dict[str, Callable[[memoryview], Any]] = {
        "bytes": bytes,
        "str": lambda d: str(d, "utf-8"),
        "text": lambda d: str(d, "utf-8"),
        "bool": lambda d: d[0] != 0,
        "int": lambda d: _I64.unpack(d)[0],
        "float": lambda d: _F64.unpack(d)[0],
        "numpy": lambda d: _numpy(d, where),
        "tensor": lambda d: _tensor_with_header(d, where),
        "pil": lambda d: pixels_of(d, where),
        "jpeg_array": lambda d: _jpeg_array(d, where),
        "json": lambda d: _json_leaf(d, where),
    }
    if base in fixed and not arg:
        decode = fixed[base]

        def checked(data: memoryview) -> Any:
            try:
                return decode(data)
            except (struct.error, IndexError, UnicodeDecodeError) as e:
                raise CorruptError(f"{where}: a bad {name} value: {e}") from e

        return checked
    if base == "no_header_numpy" and arg.isdigit():
        np_dtype = _numpy_dtype(int(arg), where)
        size = np.dtype(np_dtype).itemsize
        return lambda d: _array(d, np_dtype, _one_dim(size, d, where), where)
    if base == "no_header_tensor" and arg.isdigit():
        t_dtype = _tensor_dtype(int(arg), where)
        size = _TORCH_ITEMSIZE[t_dtype]
        return lambda d: _tensor(d, t_dtype, _one_dim(size, d, where), where)
    raise EncodeError(f"{where}: unknown LitData serializer {name!r}")


# -- index and chunks ------------------------------------------------------------------


class Layout:
    """What reading a dataset's chunks needs: their structure and each leaf's decoder."""

    def __init__(self, config: dict[str, Any], where: str) -> None:
        loader = config.get("item_loader", "PyTreeLoader")
        if loader != "PyTreeLoader":
            raise UnsupportedFormatError(
                f"{where}: item_loader {loader!r} is not read (PyTreeLoader, LitData's default, is)"
            )
        if config.get("encryption"):
            raise UnsupportedFormatError(f"{where}: encrypted datasets are not read")
        compression = config.get("compression")
        if compression and not str(compression).startswith("zstd"):
            raise UnsupportedFormatError(f"{where}: compression {compression!r} is not read")
        level = config.get("compression_level") or "chunk"
        if level not in ("chunk", "batch", "sample"):
            raise UnsupportedFormatError(f"{where}: compression_level {level!r} is not read")
        #: how the chunks are compressed: None, or "chunk" (the whole file is zstd), "batch"
        #: (zstd frames of items after a directory) or "sample" (each item a zstd frame)
        self.compression: str | None = level if compression else None
        self.spec = parse_spec(config.get("data_spec"), where)
        formats = config.get("data_format") or []
        if not isinstance(formats, list) or not all(isinstance(f, str) for f in formats):
            raise CorruptError(f"{where}: data_format is not a list of serializer names")
        if len(formats) != self.spec.leaves:
            raise CorruptError(
                f"{where}: {len(formats)} data_format entries for {self.spec.leaves} leaves"
            )
        self.paths = self.spec.paths()
        self.decoders = [
            leaf_decoder(f, f"{where}, field {p!r}")
            for f, p in zip(formats, self.paths, strict=True)
        ]
        top = self.spec.kind
        #: how a sample that is not a dict becomes one: its items as fields "0", "1" ...,
        #: a lone leaf as field "value"
        self.top = top
        self._columnar = _columnar_kinds(self.spec, formats)

    def batches(self, data: bytes | memoryview, num_items: int, where: str) -> list[Any] | None:
        """The rows of a chunk that stores them as Arrow (LitData's footer) as column
        batches (``format.columnar.ColumnBatch``) with the values ``samples`` gives, their
        bytes views of ``data``; None for a chunk without that footer, or whose columns
        would not read back as its rows (``samples`` then reads it)."""
        view = memoryview(data)
        footer = arrow_footer(view) if len(view) >= 4 else None
        if footer is None or _U32.unpack_from(view, 0)[0] != num_items:
            return None
        from .arrow import ipc_table, row_batches

        table = ipc_table(view[footer[0] : footer[1]], where)
        if table.num_rows != num_items:
            rows = table.num_rows
            raise CorruptError(f"{where}: {rows} rows in the Arrow footer, not {num_items}")
        return row_batches(table)

    def classic_batch(self, data: bytes | memoryview, num_items: int) -> ColumnBatch | None:
        """The items of a chunk in LitData's own layout (no Arrow footer) as columns, with no
        Python object per value: the same samples ``samples`` gives, for samples that are a
        dict (or list, or one leaf) of ``int``, ``float``, ``bool``, ``bytes``, ``str`` and
        file-like (``jpeg``, ``image`` ...) leaves. None for any other chunk, and for one whose
        layout is not sound: ``samples`` then reads it, or names what is wrong with it. The
        byte columns are views of ``data``."""
        kinds = self._columnar
        view = memoryview(data)
        n = num_items
        if kinds is None or arrow_footer(view) is not None:
            return None
        head = 4 * len(kinds)  # an item starts with each leaf's size
        items = item_heads(view, n, head)
        if items is None:
            return None
        buf, begins, ends, sizes = items
        at = begins + head
        columns = []
        for k, kind in enumerate(kinds):
            lengths = sizes[:, k]
            if bool(np.any(at + lengths > ends)):
                return None
            if kind in ("int", "float"):
                if bool(np.any(lengths != 8)):
                    return None
                values = columnar.gather(buf, at, 8).view("<i8" if kind == "int" else "<f8")
                encode = columnar.encode_ints if kind == "int" else columnar.encode_floats
                columns.append(encode(values.reshape(n)))
            elif kind == "bool":  # its first byte, as ``samples`` reads it
                if bool(np.any(lengths < 1)):
                    return None
                columns.append(columnar.encode_bools(buf[at] != 0))
            else:
                text = kind == "str"
                if text and not all_utf8(view, at, lengths):
                    return None
                columns.append(columnar.encode_scattered(buf, at, lengths, text))
            at = at + lengths
        if not np.array_equal(at, ends):  # bytes after the leaves: not this layout
            return None
        return ColumnBatch(tuple(self.paths), tuple(columns), n)

    def samples(
        self, data: bytes | memoryview, num_items: int, where: str
    ) -> Iterator[dict[str, Any]]:
        view = memoryview(data)
        if len(view) < 4:
            raise CorruptError(f"{where}: {len(view)} bytes, not a LitData chunk")
        (n,) = _U32.unpack_from(view, 0)
        if n != num_items or len(view) < 4 * (n + 2):
            raise CorruptError(f"{where}: {n} items in the file, {num_items} in the index")
        footer = arrow_footer(view)
        if footer is not None:
            # Rows of plain values (all dicts) are stored as an Arrow IPC file after the
            # items, which are then often left empty; LitData's reader reads the rows there.
            from .arrow import ipc_rows

            rows = ipc_rows(view[footer[0] : footer[1]], where)
            if len(rows) != n:
                raise CorruptError(f"{where}: {len(rows)} rows in the Arrow footer, not {n}")
            yield from rows
            return
        offsets = struct.unpack_from(f"<{n + 1}I", view, 4)
        leaves = len(self.decoders)
        for i in range(n):
            begin, end = offsets[i], offsets[i + 1]
            if not begin + 4 * leaves <= end <= len(view):
                raise CorruptError(f"{where}: item {i} has bad offsets {begin}..{end}")
            sizes = struct.unpack_from(f"<{leaves}I", view, begin)
            at = begin + 4 * leaves
            values = []
            for size, decode in zip(sizes, self.decoders, strict=True):
                if at + size > end:
                    raise CorruptError(f"{where}: item {i} runs past its end")
                try:
                    values.append(decode(view[at : at + size]))
                except CorruptError as e:  # it names the field: this names the chunk
                    raise CorruptError(f"{where}, item {i}: {e}") from e
                at += size
            sample = self.spec.build(iter(values))
            if self.top == "dict":
                yield sample
            elif self.top == "leaf":
                yield {"value": sample}
            else:
                yield {str(k): v for k, v in enumerate(sample)}


def _columnar_kinds(spec: Spec, formats: list[str]) -> list[str] | None:
    """The kind of each leaf (``_COLUMNAR``) where ``Layout.classic_batch`` can read the
    samples a column at a time: one level of leaves (or one leaf), a dict's keys strings,
    every serializer a plain value's or a file's. None otherwise."""
    leaves = [spec] if spec.kind == "leaf" else spec.children
    if not leaves or any(child.kind != "leaf" for child in leaves):
        return None
    if spec.keys is not None and (
        not all(isinstance(key, str) for key in spec.keys) or len(set(spec.keys)) < len(leaves)
    ):
        return None
    kinds = []
    for name in formats:
        base, _, arg = name.partition(":")
        if base in FILE_LIKE:
            kinds.append("bytes")
        elif base in _COLUMNAR and not arg:
            kinds.append(_COLUMNAR[base])
        else:
            return None
    return kinds


_ARROW_FOOTER_MAGIC = b"LDARW01\0"


def arrow_footer(view: memoryview) -> tuple[int, int] | None:
    """Where a chunk's trailing Arrow IPC rows lie (``[ipc][its length: u32][LDARW01\0]``
    at the end of the file), or None when it has none."""
    if len(view) < 12 or bytes(view[-8:]) != _ARROW_FOOTER_MAGIC:
        return None
    (size,) = _U32.unpack_from(view, len(view) - 12)
    start = len(view) - 12 - size
    return (start, start + size) if start >= 0 and size > 0 else None


_FRAMED_MAGIC = b"LDFZ01\0\0"
_FRAMED_PREFIX = struct.Struct("<8sHHIII")  # magic, version, flags, items, rows, frames
_FRAME = struct.Struct("<IIQII")  # first item, items, offset, stored length, raw length


def classic_chunk(
    data: bytes | memoryview, compression: str | None, where: str
) -> bytes | memoryview:
    """A chunk file's bytes as an uncompressed chunk (``[n][offsets][items]``), whichever
    way LitData compressed it (``Layout.compression``)."""
    from .codec import zstd_decompress

    try:
        if compression is None:
            return data
        if compression == "chunk":
            return zstd_decompress(data)
        if compression == "sample":
            view = memoryview(data)
            (n,) = _U32.unpack_from(view, 0)
            offsets = struct.unpack_from(f"<{n + 1}I", view, 4)
            items = [zstd_decompress(view[offsets[i] : offsets[i + 1]]) for i in range(n)]
            return encode_chunk(items)
        view = memoryview(data)
        magic, version, _flags, n, _rows, frames = _FRAMED_PREFIX.unpack_from(view, 0)
        if magic != _FRAMED_MAGIC or version != 1:
            raise CorruptError(f"{where}: not a framed zstd chunk of version 1")
        at = _FRAMED_PREFIX.size
        logical = struct.unpack_from(f"<{n + 1}I", view, at)
        at += 4 * (n + 1)
        body = bytearray()
        for number in range(frames):
            _first, _items, offset, stored, raw = _FRAME.unpack_from(
                view, at + number * _FRAME.size
            )
            part = zstd_decompress(view[offset : offset + stored])
            if len(part) != raw:
                raise CorruptError(f"{where}: frame {number} holds {len(part)} bytes, not {raw}")
            body += part
        if len(body) != logical[-1]:
            raise CorruptError(f"{where}: the frames hold {len(body)} bytes, not {logical[-1]}")
        items = [bytes(body[logical[i] : logical[i + 1]]) for i in range(n)]
        return encode_chunk(items)
    except (struct.error, IndexError) as e:
        raise CorruptError(f"{where}: a truncated {compression}-compressed chunk: {e}") from e
    except CorruptError as e:
        if where in str(e):
            raise
        raise CorruptError(f"{where}: {e}") from e


def parse_index(data: bytes, where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The config and chunk entries of a LitData ``index.json``."""
    try:
        index = json.loads(data)
        config, chunks = index["config"], index["chunks"]
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptError(f"{where}: not a LitData index ({e})") from e
    if not isinstance(config, dict) or not isinstance(chunks, list):
        raise CorruptError(f"{where}: 'config' or 'chunks' has the wrong type")
    for number, chunk in enumerate(chunks):
        if not isinstance(chunk, dict) or "filename" not in chunk or "chunk_size" not in chunk:
            raise CorruptError(f"{where}, chunk {number}: no filename or chunk_size")
        name, size = chunk["filename"], chunk["chunk_size"]
        if not isinstance(name, str) or type(size) is not int or size < 0:
            raise CorruptError(
                f"{where}, chunk {number}: filename {name!r} or chunk_size {size!r} is not a "
                "file name and a count"
            )
        check_path(name, f"{where}, chunk {number},", DATASET_FOLDER)
    return config, chunks


# -- writing ---------------------------------------------------------------------------


#: The serializers of values that a ``json`` leaf reads back equal too: a field whose
#: values are of two of them (None and floats) is written as ``json``.
IN_JSON = frozenset({"json", "bool", "int", "float", "str"})


def format_of(value: Any) -> str | None:
    """The serializer a value is written with (None: none reads back equal)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if -(2**63) <= value < 2**63 else None
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, np.ndarray):
        return "numpy" if value.dtype.name in _NUMPY_INDEX else None
    if value is None or isinstance(value, list | dict):
        return "json" if _nestable(value) else None
    kind = type(value)
    if kind.__module__ == "torch" and kind.__name__ == "Tensor":
        name = str(value.dtype).removeprefix("torch.")
        return "tensor" if name in _TORCH_INDEX else None
    return None


def _nestable(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | str):
        return not isinstance(value, int) or -(2**63) <= value < 2**63
    if isinstance(value, float):
        return True
    if isinstance(value, list):
        if all(isinstance(v, float) for v in value) or all(isinstance(v, str) for v in value):
            return True
        return all(_nestable(v) and _json_text_safe(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _nestable(v) for k, v in value.items())
    return False


def _json_text_safe(value: Any) -> bool:
    """Whether a list item, written as JSON text, reads back equal (no NaN, no infinity)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_json_text_safe(v) for v in value)
    if isinstance(value, dict):
        return all(_json_text_safe(v) for v in value.values())
    return True


def _enc_utf8(text: str) -> bytes:
    raw = text.encode()
    return _U32.pack(len(raw)) + raw


def _encode_nested(value: Any) -> bytes:
    if value is None:
        return b"\x0b"
    if isinstance(value, bool):
        return bytes([10, int(value)])
    if isinstance(value, int):
        return b"\x08" + _I64.pack(value)
    if isinstance(value, float):
        return b"\x09" + _F64.pack(value)
    if isinstance(value, str):
        return b"\x07" + _enc_utf8(value)
    if isinstance(value, dict):
        head = b"\x05" + _U32.pack(len(value))
        return head + b"".join(_enc_utf8(k) + _encode_nested(v) for k, v in value.items())
    n = _U32.pack(len(value))
    if not value or all(isinstance(v, str) for v in value):
        return b"\x01" + n + b"".join(_enc_utf8(v) for v in value)
    if all(isinstance(v, float) for v in value):
        return b"\x03" + n + np.asarray(value, "<f8").tobytes()
    if all(isinstance(v, bool) for v in value):
        return b"\x04" + n + bytes(int(v) for v in value)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return b"\x02" + n + np.asarray(value, "<i8").tobytes()
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return b"\x00" + _U32.pack(len(text)) + text


def encode_leaf(fmt: str, value: Any) -> bytes:
    """A value's bytes for serializer ``fmt`` (``format_of`` chose it)."""
    if fmt == "bool":
        return b"\x01" if value else b"\x00"
    if fmt == "int":
        return _I64.pack(value)
    if fmt == "float":
        return _F64.pack(value)
    if fmt == "str":
        return str(value).encode()
    if fmt == "bytes":
        return bytes(value)
    if fmt == "json":
        return _encode_nested(value)
    if fmt == "numpy":
        array = np.ascontiguousarray(value)
        head = struct.pack(
            f"<II{array.ndim}I", _NUMPY_INDEX[array.dtype.name], array.ndim, *array.shape
        )
        return head + array.astype(array.dtype.newbyteorder("<")).tobytes()
    # a tensor: a big-endian header (dtype number, rank, shape), then its elements
    from .tensors import tensor_bytes

    name = str(value.dtype).removeprefix("torch.")
    shape = tuple(value.shape)
    head = struct.pack(f">II{len(shape)}I", _TORCH_INDEX[name], len(shape), *shape)
    return head + tensor_bytes(value.detach().cpu())


def encode_item(formats: list[str], values: list[Any]) -> bytes:
    """One item of a chunk: the leaves' sizes, then their bytes."""
    parts = [encode_leaf(f, v) for f, v in zip(formats, values, strict=True)]
    return struct.pack(f"<{len(parts)}I", *map(len, parts)) + b"".join(parts)


def encode_chunk(items: list[bytes]) -> bytes:
    n = len(items)
    offsets = np.cumsum([4 + 4 * (n + 1), *map(len, items)], dtype=np.uint64)
    if offsets[-1] >= 2**32:
        raise EncodeError("a LitData chunk cannot hold 4 GiB: use a smaller chunk_bytes")
    return _U32.pack(n) + offsets.astype("<u4").tobytes() + b"".join(items)


def index_json(
    chunks: list[dict[str, Any]], formats: list[str], keys: list[str], chunk_bytes: int
) -> bytes:
    config = {
        "chunk_bytes": chunk_bytes,
        "chunk_size": None,
        "compression": None,
        "compression_batch_size": None,
        "compression_level": None,
        "data_format": formats,
        "data_spec": dict_spec(keys),
        "encryption": None,
        "ipc_compression": None,
        "item_loader": "PyTreeLoader",
        "types": None,
    }
    return json.dumps({"chunks": chunks, "config": config}, sort_keys=True).encode()


__all__ = [
    "Layout",
    "Spec",
    "classic_chunk",
    "dict_spec",
    "encode_chunk",
    "encode_item",
    "encode_leaf",
    "format_of",
    "index_json",
    "leaf_decoder",
    "parse_index",
    "parse_spec",
]
