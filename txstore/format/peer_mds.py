"""MosaicML Streaming's MDS format (``streaming.MDSWriter``), read and written without it.

Pure bytes to values and back, no I/O: ``txstore.interop`` reads the files through the
storage layer and hands their bytes here.

A dataset is a folder with ``index.json`` (``{"version": 2, "shards": [...]}``) and shard
files. Each shard entry names its columns (sorted by name), their encodings and, for those of
fixed size, their sizes; its file (``raw_data``, or ``zip_data`` when compressed). A shard
file is ``[n: u32][offsets: (n + 1) x u32][the shard's config as JSON][samples]``, offsets
counted from the file's start; a sample is a u32 size for each column without a fixed size,
then every column's bytes in column order. Integers are little-endian.

A column's value is what MDS's own reader gives, but for images: ``jpeg`` and ``png`` columns
(and ``jpeg_array``, ``list[jpeg]``, ``list[png]``) keep their encoded bytes, never decoded or
re-encoded; ``pil`` (raw pixels) becomes a numpy array of its pixels (``pixels_of``), the one
exact form. ``pkl`` (pickle) and ``str_decimal`` are refused: txstore never unpickles, and has
no decimal value.
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

_U32 = struct.Struct("<I")

#: What a file name in a peer's index may not lead out of (``manifest.check_path``).
DATASET_FOLDER = "the dataset's folder"

#: MDS's ndarray value dtypes by the byte it writes for them.
NDARRAY_DTYPES = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
_NDARRAY_CODES = {name: code for code, name in NDARRAY_DTYPES.items()}
_SHAPE_DTYPES = ("<u1", "<u2", "<u4", "<u8")

#: The fixed-size numeric encodings: read as the numpy scalar MDS's reader gives.
SCALARS = {
    "uint8": "<u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "int8": "<i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
}

#: Encodings txstore cannot import exactly, and why.
REFUSED = {
    "pkl": "it is pickle, which txstore never unpickles (it runs code)",
    "str_decimal": "txstore has no decimal value",
}

#: PIL modes whose raw pixels map exactly onto a numpy array: (dtype, bands per pixel).
PIL_MODES = {
    "L": ("u1", 1),
    "LA": ("u1", 2),
    "RGB": ("u1", 3),
    "RGBA": ("u1", 4),
    "I": ("<i4", 1),
    "I;16": ("<u2", 1),
    "F": ("<f4", 1),
}


def pixels_of(data: bytes | memoryview, where: str) -> np.ndarray[Any, Any]:
    """The pixels of a raw PIL image (``[width: u32][height: u32][mode length: u32][mode]
    [pixels]``, as MDS's ``pil`` and LitData's ``pil`` write it) as a numpy array: height x
    width (x bands when more than one), of the mode's dtype; mode "1" as bools.

    Modes whose pixels an array cannot tell from another's (P with its palette, CMYK,
    YCbCr, LAB, HSV ...) are refused: nothing but PIL would know how to read them back."""
    if len(data) < 12:
        raise CorruptError(f"{where}: a raw PIL image of {len(data)} bytes (no header)")
    width, height, size = struct.unpack_from("<III", data, 0)
    mode = bytes(data[12 : 12 + size]).decode("utf-8", "replace")
    raw = memoryview(data)[12 + size :]
    if mode == "1":
        stride = (width + 7) // 8
        if len(raw) != stride * height:
            raise CorruptError(f"{where}: a {width}x{height} image of mode 1 in {len(raw)} bytes")
        packed = np.frombuffer(raw, np.uint8).reshape(height, stride)
        bits: np.ndarray[Any, Any] = np.unpackbits(packed, axis=1)[:, :width].astype(bool)
        return bits
    if mode not in PIL_MODES:
        raise EncodeError(
            f"{where}: a PIL image of mode {mode!r} has no exact txstore value (modes "
            f"{', '.join(sorted([*PIL_MODES, '1']))} become numpy arrays of their pixels)"
        )
    dtype, bands = PIL_MODES[mode]
    itemsize = np.dtype(dtype).itemsize
    if len(raw) != width * height * bands * itemsize:
        raise CorruptError(f"{where}: a {width}x{height} image of mode {mode} in {len(raw)} bytes")
    shape = (height, width) if bands == 1 else (height, width, bands)
    pixels: np.ndarray[Any, Any] = np.frombuffer(raw, dtype).reshape(shape).copy()
    return pixels


def _list_of(data: memoryview, where: str, with_placeholder: bool) -> list[memoryview]:
    """The items of an MDS list (``[0: u32][n: u32][sizes: n x u32][items]``) or of a
    ``jpeg_array`` (``[n: u32][sizes: n x u32][items]``)."""
    start = 4 if with_placeholder else 0
    if len(data) < start + 4:
        raise CorruptError(f"{where}: a list of {len(data)} bytes")
    (n,) = _U32.unpack_from(data, start)
    head = start + 4 + 4 * n
    if len(data) < head:
        raise CorruptError(f"{where}: a list of {n} items in {len(data)} bytes")
    sizes = struct.unpack_from(f"<{n}I", data, start + 4)
    items, at = [], head
    for size in sizes:
        if at + size > len(data):
            raise CorruptError(f"{where}: a list item past the end of its value")
        items.append(data[at : at + size])
        at += size
    return items


def _ndarray(spec: str, where: str) -> Callable[[memoryview], np.ndarray[Any, Any]]:
    parts = spec.split(":")[1:] if ":" in spec else []
    fixed_dtype = parts[0] if parts else None
    fixed_shape = tuple(int(d) for d in parts[1].split(",")) if len(parts) > 1 else None
    if fixed_dtype is not None and fixed_dtype not in _NDARRAY_CODES:
        raise UnsupportedFormatError(f"{where}: ndarray dtype {fixed_dtype!r} is not MDS's")

    def decode(data: memoryview) -> np.ndarray[Any, Any]:
        at = 0
        try:
            if fixed_dtype is None:
                dtype = NDARRAY_DTYPES[data[0]]
                at = 1
            else:
                dtype = fixed_dtype
            if fixed_shape is None:
                byte = data[at]
                at += 1
                ndim, width = byte >> 2, byte & 3
                nbytes = ndim * (1 << width)
                shape = tuple(
                    int(d) for d in np.frombuffer(data[at : at + nbytes], _SHAPE_DTYPES[width])
                )
                at += nbytes
            else:
                shape = fixed_shape
            values = np.frombuffer(data[at:], np.dtype(dtype).newbyteorder("<"))
            out: np.ndarray[Any, Any] = values.reshape(shape).astype(dtype, copy=True)
            return out
        except (IndexError, KeyError, ValueError) as e:
            raise CorruptError(f"{where}: a bad ndarray value: {e}") from e

    return decode


def decoder(encoding: str, where: str) -> Callable[[memoryview], Any]:
    """The function that turns a column's bytes into its txstore value; refuses what cannot
    be imported exactly, naming ``where`` (the column)."""
    name = encoding.split(":", 1)[0]
    if name in REFUSED:
        raise EncodeError(f"{where}: encoding {encoding!r} cannot be imported: {REFUSED[name]}")
    if name in SCALARS:
        dtype = np.dtype(SCALARS[name])
        return lambda data: np.frombuffer(data, dtype)[0].astype(dtype.newbyteorder("="))
    simple: dict[str, Callable[[memoryview], Any]] = {
        "bytes": bytes,
        "jpeg": bytes,
        "png": bytes,
        "str": lambda data: str(data, "utf-8"),
        "int": lambda data: int.from_bytes(data, "little", signed=True),
        "str_int": lambda data: int(str(data, "utf-8")),
        "str_float": lambda data: float(str(data, "utf-8")),
        "json": lambda data: json.loads(str(data, "utf-8")),
        "pil": lambda data: pixels_of(data, where),
        "jpeg_array": lambda data: [bytes(x) for x in _list_of(data, where, False)],
        "jpegarray": lambda data: [bytes(x) for x in _list_of(data, where, False)],
        "list[jpeg]": lambda data: [bytes(x) for x in _list_of(data, where, True)],
        "list[png]": lambda data: [bytes(x) for x in _list_of(data, where, True)],
        "list[pil]": lambda data: [pixels_of(x, where) for x in _list_of(data, where, True)],
    }
    if name in simple:
        return simple[name]
    if name == "ndarray":
        return _ndarray(encoding, where)
    raise EncodeError(f"{where}: unknown MDS encoding {encoding!r}")


def parse_index(data: bytes, where: str) -> list[dict[str, Any]]:
    """The shard entries of an MDS ``index.json``, checked for what reading them needs."""
    try:
        index = json.loads(data)
        shards = index["shards"]
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptError(f"{where}: not an MDS index ({e})") from e
    if not isinstance(shards, list):
        raise CorruptError(f"{where}: 'shards' is not a list")
    for number, shard in enumerate(shards):
        at = f"{where}, shard {number}"
        if not isinstance(shard, dict) or shard.get("format") != "mds":
            kind = shard.get("format") if isinstance(shard, dict) else shard
            raise UnsupportedFormatError(f"{at}: format {kind!r}; only 'mds' shards are read")
        if shard.get("version") != 2:
            raise UnsupportedFormatError(f"{at}: MDS version {shard.get('version')!r}, not 2")
        for key in ("column_names", "column_encodings", "column_sizes", "samples", "raw_data"):
            if key not in shard:
                raise CorruptError(f"{at}: no {key!r}")
        names, encodings, sizes = (
            shard[k] for k in ("column_names", "column_encodings", "column_sizes")
        )
        if not all(isinstance(x, list) for x in (names, encodings, sizes)):
            raise CorruptError(f"{at}: column names, encodings and sizes are not lists")
        if len({len(names), len(encodings), len(sizes)}) != 1:
            raise CorruptError(f"{at}: column names, encodings and sizes differ in number")
        if not all(isinstance(x, str) for x in (*names, *encodings)):
            raise CorruptError(f"{at}: a column name or encoding is not a str")
        if len(set(names)) != len(names):
            raise CorruptError(f"{at}: a column name appears twice")
        if not all(x is None or (type(x) is int and x >= 0) for x in sizes):
            raise CorruptError(f"{at}: a column size is neither a byte count nor null")
        for name, encoding, size in zip(names, encodings, sizes, strict=True):
            width = _scalar_width(encoding)
            if width is not None and size != width:
                raise CorruptError(
                    f"{at}: column {name!r} of encoding {encoding!r} takes {width} bytes, the "
                    f"index says {size}"
                )
        if type(shard["samples"]) is not int or shard["samples"] < 0:
            raise CorruptError(f"{at}: samples {shard['samples']!r} is not a count")
        try:
            name = shard_file(shard)[0]
        except (KeyError, TypeError) as e:
            raise CorruptError(f"{at}: no file named ({e!r})") from e
        if not isinstance(name, str):
            raise CorruptError(f"{at}: its file name {name!r} is not a str")
        check_path(name, f"{at},", DATASET_FOLDER)
    return shards


def _scalar_width(encoding: str) -> int | None:
    """The bytes a value of a fixed-size numeric encoding takes ("int": 8; None: not one)."""
    dtype = "<i8" if encoding == "int" else SCALARS.get(encoding)
    return None if dtype is None else np.dtype(dtype).itemsize


def shard_file(shard: dict[str, Any]) -> tuple[str, str | None]:
    """The file to read for a shard and the compression it is in (None: raw)."""
    zipped = shard.get("zip_data")
    # The names as the index has them: parse_index refuses one that is not a str.
    if shard.get("compression") and zipped:
        return zipped["basename"], str(shard["compression"])
    return shard["raw_data"]["basename"], None


def decompress(data: bytes | memoryview, compression: str, where: str) -> bytes:
    """A compressed shard's bytes: zstd, gz and bz2 (brotli and snappy are refused)."""
    algo = compression.split(":", 1)[0]
    try:
        if algo == "zstd":
            from .codec import zstd_decompress

            return zstd_decompress(data)
        if algo == "gz":
            import gzip

            return gzip.decompress(data)
        if algo == "bz2":
            import bz2

            return bz2.decompress(data)
    except Exception as e:
        raise CorruptError(f"{where}: cannot {algo}-decompress: {e}") from e
    raise UnsupportedFormatError(
        f"{where}: compression {compression!r} is not read (zstd, gz and bz2 are); "
        "rewrite the dataset uncompressed or in one of those"
    )


def shard_samples(
    shard: dict[str, Any], data: bytes | memoryview, where: str
) -> Iterator[dict[str, Any]]:
    """The samples of one shard file's (decompressed) bytes."""
    names = shard["column_names"]
    encodings = shard["column_encodings"]
    sizes = shard["column_sizes"]
    decoders = [decoder(e, f"{where}, column {n!r}") for n, e in zip(names, encodings, strict=True)]
    view = memoryview(data)
    if len(view) < 4:
        raise CorruptError(f"{where}: {len(view)} bytes, not an MDS shard")
    (n,) = _U32.unpack_from(view, 0)
    if n != shard["samples"] or len(view) < 4 * (n + 2):
        raise CorruptError(f"{where}: {n} samples in the file, {shard['samples']} in the index")
    offsets = struct.unpack_from(f"<{n + 1}I", view, 4)
    variable = [s is None for s in sizes]
    head = 4 * sum(variable)
    for i in range(n):
        begin, end = offsets[i], offsets[i + 1]
        if not begin <= end <= len(view) or end - begin < head:
            raise CorruptError(f"{where}: sample {i} has bad offsets {begin}..{end}")
        sample_sizes = list(struct.unpack_from(f"<{sum(variable)}I", view, begin))
        at = begin + head
        out: dict[str, Any] = {}
        for name, size, decode in zip(names, sizes, decoders, strict=True):
            length = sample_sizes.pop(0) if size is None else size
            if at + length > end:
                raise CorruptError(f"{where}: sample {i}, column {name!r} runs past the sample")
            try:
                out[name] = decode(view[at : at + length])
            except (ValueError, IndexError, KeyError, struct.error) as e:  # UnicodeDecodeError too
                raise CorruptError(f"{where}: sample {i}, column {name!r}: {e}") from e
            at += length
        if at != end:  # sizes that do not match the columns' bytes (as a wrong index makes)
            raise CorruptError(f"{where}: sample {i} has {end - at} bytes after its columns")
        yield out


#: The encodings a shard's columns may have for ``shard_batch`` to read it a column at a time.
_COLUMNAR = {"bytes": False, "jpeg": False, "png": False, "str": True}


def shard_batch(shard: dict[str, Any], data: bytes | memoryview, where: str) -> ColumnBatch | None:
    """The samples of one shard file's (decompressed) bytes as columns, with no Python
    object per value: the same values ``shard_samples`` gives, for shards whose columns are
    all ``int``, ``bytes``, ``jpeg``, ``png`` or ``str``. None for any other shard, and
    for one whose layout is not sound: ``shard_samples`` then reads it, or names what is
    wrong with it. The byte columns are views of ``data``."""
    names, encodings = shard["column_names"], shard["column_encodings"]
    variable = [s is None for s in shard["column_sizes"]]
    # ints of 8 bytes, and the others' values each with its size in the sample's head
    readable = [
        e == "int" if not var else e in _COLUMNAR
        for e, var in zip(encodings, variable, strict=True)
    ]
    if not names or not all(readable):
        return None
    view = memoryview(data)
    n = shard["samples"]
    head = 4 * sum(variable)
    items = item_heads(view, n, head)
    if items is None:
        return None
    buf, begins, ends, sizes = items
    at, v = begins + head, 0
    columns = []
    for encoding, var in zip(encodings, variable, strict=True):
        if not var:
            if bool(np.any(at + 8 > ends)):
                return None
            ints = columnar.gather(buf, at, 8).view("<i8").reshape(n)
            columns.append(columnar.encode_ints(ints))
            at = at + 8
            continue
        lengths = sizes[:, v]
        v += 1
        if bool(np.any(at + lengths > ends)):
            return None
        text = _COLUMNAR[encoding]
        if text and not all_utf8(view, at, lengths):
            return None
        columns.append(columnar.encode_scattered(buf, at, lengths, text))
        at = at + lengths
    if not np.array_equal(at, ends):
        return None
    return ColumnBatch(tuple(names), tuple(columns), n)


def item_heads(view: memoryview, n: int, head: int) -> tuple[Any, Any, Any, Any] | None:
    """A file of ``n`` items laid out as MDS's shards and LitData's chunks are (``[n: u32]
    [offsets: (n + 1) x u32][items]``), each item starting with ``head`` bytes of u32 sizes:
    the file as bytes, where each item begins and ends, and the sizes (a row an item).
    None when it holds no items or its layout is not sound."""
    if n == 0 or len(view) < 4 * (n + 2) or _U32.unpack_from(view, 0)[0] != n:
        return None
    buf = np.frombuffer(view, dtype=np.uint8)
    offsets = np.frombuffer(view, dtype="<u4", count=n + 1, offset=4).astype(np.int64)
    begins, ends = offsets[:-1], offsets[1:]
    if int(offsets.max()) > len(view) or bool(np.any(ends - begins < head)):
        return None
    if not head:
        return buf, begins, ends, np.zeros((n, 0), dtype=np.int64)
    return buf, begins, ends, columnar.gather(buf, begins, head).view("<u4").astype(np.int64)


def all_utf8(view: memoryview, starts: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any]) -> bool:
    """Whether every value ``view[starts[i]:starts[i] + lengths[i]]`` is valid UTF-8."""
    try:
        for a, b in zip(starts.tolist(), (starts + lengths).tolist(), strict=True):
            str(view[a:b], "utf-8")
    except UnicodeDecodeError:
        return False
    return True


# -- writing ---------------------------------------------------------------------------


def _json_safe(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | str):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_json_safe(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_safe(v) for k, v in value.items())
    return False


#: The encodings of values that ``json`` reads back equal too: a field whose values are of
#: two of them (None and floats) is written as ``json``.
IN_JSON = frozenset({"json", "int", "float64", "str"})


def encoding_of(value: Any) -> str | None:
    """The MDS encoding a value is written in (None: it has none that reads back equal)."""
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        return "json" if _json_safe(value) else None
    if isinstance(value, int):
        return "int" if -(2**63) <= value < 2**63 else None
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "str"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, np.ndarray):
        ok = value.dtype.name in _NDARRAY_CODES and value.ndim >= 1 and value.size > 0
        return "ndarray" if ok and value.ndim < 64 else None
    if isinstance(value, np.generic):
        name = value.dtype.name
        return name if name in SCALARS else None
    kind = type(value)
    if kind.__module__ == "torch" and kind.__name__ == "Tensor":
        # MDS has no tensor encoding: an ndarray of the same dtype, shape and elements
        name = str(value.dtype).removeprefix("torch.")
        ok = name in _NDARRAY_CODES and value.dim() >= 1 and value.numel() > 0
        return "ndarray" if ok else None
    return None


def encode_value(encoding: str, value: Any) -> bytes:
    """A value's bytes in its encoding (``encoding_of`` chose it)."""
    if encoding == "json":
        return json.dumps(value).encode()
    if encoding == "int":
        return int(value).to_bytes(8, "little", signed=True)
    if encoding == "float64":
        return struct.pack("<d", value)
    if encoding == "str":
        return str(value).encode()
    if encoding == "bytes":
        return bytes(value)
    if encoding in SCALARS:
        return np.asarray(value).astype(SCALARS[encoding]).tobytes()
    # ndarray of dynamic dtype and shape: [dtype][ndim << 2 | shape width][shape][values]
    if not isinstance(value, np.ndarray):  # a tensor
        value = value.detach().cpu().numpy()
    array = np.ascontiguousarray(value)
    biggest = max(array.shape)
    width = 0 if biggest < 1 << 8 else 1 if biggest < 1 << 16 else 2 if biggest < 1 << 32 else 3
    shape = np.asarray(array.shape, dtype=_SHAPE_DTYPES[width]).tobytes()
    head = bytes([_NDARRAY_CODES[array.dtype.name], (array.ndim << 2) | width])
    return head + shape + array.astype(array.dtype.newbyteorder("<")).tobytes()


def shard_config(names: list[str], encodings: list[str], size_limit: int) -> dict[str, Any]:
    """The configuration MDS records in each shard file and index entry."""
    return {
        "column_encodings": encodings,
        "column_names": names,
        "column_sizes": [8 if e in ("int", "float64") else _fixed(e) for e in encodings],
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": size_limit,
        "version": 2,
    }


def _fixed(encoding: str) -> int | None:
    return np.dtype(SCALARS[encoding]).itemsize if encoding in SCALARS else None


def encode_sample(config: dict[str, Any], sample: dict[str, Any]) -> bytes:
    """One sample's bytes in a shard of ``config``'s columns."""
    sizes, parts = [], []
    for name, encoding, size in zip(
        config["column_names"], config["column_encodings"], config["column_sizes"], strict=True
    ):
        data = encode_value(encoding, sample[name])
        if size is None:
            sizes.append(len(data))
        parts.append(data)
    return struct.pack(f"<{len(sizes)}I", *sizes) + b"".join(parts)


def encode_shard(config: dict[str, Any], samples: list[bytes]) -> bytes:
    """A shard file holding ``samples`` (each from ``encode_sample``)."""
    text = json.dumps(config, sort_keys=True).encode()
    n = len(samples)
    start = 4 + 4 * (n + 1) + len(text)
    offsets = np.cumsum([start, *map(len, samples)], dtype=np.uint64)
    if offsets[-1] >= 2**32:
        raise EncodeError("an MDS shard cannot hold 4 GiB: use a smaller size_limit")
    return _U32.pack(n) + offsets.astype("<u4").tobytes() + text + b"".join(samples)


def index_json(shards: list[dict[str, Any]]) -> bytes:
    return json.dumps({"version": 2, "shards": shards}, sort_keys=True).encode()


__all__ = [
    "decoder",
    "decompress",
    "encode_sample",
    "encode_shard",
    "encoding_of",
    "index_json",
    "parse_index",
    "pixels_of",
    "shard_config",
    "shard_file",
    "shard_samples",
]
