"""Sample values <-> MessagePack bytes, with typed extensions for arrays and tensors.

A sample is a dict with str keys. Each value is encoded on its own (so a reader can decode one
field of one sample); containers nest plain values. numpy and torch are optional and imported
only when a value of theirs is met.
"""

from __future__ import annotations

import math
import operator
import struct
import threading
from functools import lru_cache
from itertools import repeat
from typing import Any

import msgspec

from ..errors import CorruptError, EncodeError, UnsupportedFormatError

# MessagePack extension codes (documented in docs/format.md).
EXT_ABSENT = 0  # the sample has no value for this column
EXT_NDARRAY = 1  # numpy.ndarray
EXT_TENSOR = 2  # torch.Tensor
EXT_NPSCALAR = 3  # numpy scalar (np.float32(1.0) and friends)

MAX_DEPTH = 32
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
#: The most bytes one MessagePack str, bin or ext holds (its length is a u32); a frame's
#: offsets of values are u32 too.
MAX_VALUE_BYTES = 2**32 - 1
#: The most data an array or tensor value holds: its payload also has a small header.
MAX_ARRAY_BYTES = MAX_VALUE_BYTES - 4096
MAX_NDIM = 64  # numpy's limit
_PLAIN = frozenset({type(None), bool, float, str, bytes})
_HEADER = struct.Struct("<I")
#: The torch dtypes a tensor value may have (names without ``torch.``): those with a fixed
#: element size that ``frombuffer`` reads back; shell, packed and quantized dtypes are not.
TORCH_DTYPES = frozenset(
    {
        "bool",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex32",
        "complex64",
        "complex128",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    }
)


class Absent:
    """Marks a column slot for a sample that does not have that key."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Absent()


def _array_payload(header: list[Any], data: bytes) -> bytes:
    head = msgspec.msgpack.encode(header)
    return _HEADER.pack(len(head)) + head + data


_Shape = list[int]
_array_header = msgspec.msgpack.Decoder(tuple[str, _Shape])
_scalar_header = msgspec.msgpack.Decoder(tuple[str])


def _split_payload(
    payload: memoryview, header: msgspec.msgpack.Decoder[Any], what: str
) -> tuple[Any, memoryview]:
    if len(payload) < _HEADER.size:
        raise CorruptError(f"a truncated {what} value ({len(payload)} bytes)")
    (n,) = _HEADER.unpack_from(payload)
    if 4 + n > len(payload):
        raise CorruptError(f"a truncated {what} value (header of {n} bytes)")
    try:
        return header.decode(payload[4 : 4 + n]), payload[4 + n :]
    except msgspec.DecodeError as e:
        raise CorruptError(f"a {what} value with a bad header: {e}") from None


def _check_shape(shape: list[int], itemsize: int, raw: memoryview, what: str) -> tuple[int, ...]:
    if len(shape) > MAX_NDIM or min(shape, default=0) < 0:
        raise CorruptError(f"a {what} value of shape {shape}")
    if math.prod(shape) * itemsize != len(raw):
        raise CorruptError(f"a {what} value of shape {shape} with {len(raw)} bytes of data")
    return tuple(shape)


@lru_cache(maxsize=256)
def _numpy_dtype(name: str) -> Any:
    """The numpy dtype a value names, if it is one the writer writes (``dtype.str`` of a
    bool, integer, float or complex dtype); else CorruptError."""
    import numpy as np

    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError, SyntaxError):
        dtype = None
    if (
        dtype is None
        or dtype.str != name
        or dtype.kind not in "biufc"
        or dtype.hasobject
        or dtype.fields is not None
        or dtype.subdtype is not None
    ):
        raise CorruptError(f"an array value of dtype {name!r} (not one txstore writes)")
    return dtype


def _torch_dtype(torch: Any, name: str) -> Any:
    dtype = getattr(torch, name, None) if name in TORCH_DTYPES else None
    if not isinstance(dtype, torch.dtype):
        raise CorruptError(f"a tensor value of dtype {name!r} (not one txstore writes)")
    return dtype


def _enc_hook(obj: Any) -> msgspec.msgpack.Ext:
    module = type(obj).__module__
    if module == "numpy":
        import numpy as np

        if isinstance(obj, np.ndarray):
            # tobytes() is C order whatever the layout; ascontiguousarray would make 0-d 1-d.
            return msgspec.msgpack.Ext(
                EXT_NDARRAY, _array_payload([obj.dtype.str, list(obj.shape)], obj.tobytes())
            )
        if isinstance(obj, np.generic):
            return msgspec.msgpack.Ext(EXT_NPSCALAR, _array_payload([obj.dtype.str], obj.tobytes()))
    if module.startswith("torch"):
        import torch

        from .tensors import tensor_bytes

        if isinstance(obj, torch.Tensor):
            # Conjugate and negative views are flags on shared memory: their values, stored.
            t = obj.detach().cpu().resolve_conj().resolve_neg()
            dtype = str(t.dtype).removeprefix("torch.")
            payload = _array_payload([dtype, list(t.shape)], tensor_bytes(t))
            return msgspec.msgpack.Ext(EXT_TENSOR, payload)
    raise TypeError(f"unsupported type {type(obj).__qualname__}")


def _ext_hook(code: int, data: memoryview) -> Any:
    """A value of an extension type; the ABSENT marker is refused here (a value never holds
    it: only a sparse frame's top level does, which ``_sparse_hook`` decodes)."""
    return _ext_value(code, data, False)


def _ext_hook_views(code: int, data: memoryview) -> Any:
    """As ``_ext_hook``, numpy arrays as read-only views of the input instead of copies."""
    return _ext_value(code, data, True)


def _ext_value(code: int, data: memoryview, views: bool) -> Any:
    if code == EXT_ABSENT:
        raise CorruptError("an absent marker where a value belongs")
    if code == EXT_NDARRAY:
        import numpy as np

        (name, shape), raw = _split_payload(data, _array_header, "numpy array")
        dtype = _numpy_dtype(name)
        shape = _check_shape(shape, dtype.itemsize, raw, "numpy array")
        array = np.frombuffer(raw, dtype=dtype).reshape(shape)
        if not views:
            return array.copy()
        # ``data`` is a view of the decoder's input (a mapped chunk, or a frame's decompressed
        # bytes): read-only, so that no caller writes through it into a buffer it shares.
        array.flags.writeable = False
        return array
    if code == EXT_NPSCALAR:
        import numpy as np

        (name,), raw = _split_payload(data, _scalar_header, "numpy scalar")
        dtype = _numpy_dtype(name)
        _check_shape([], dtype.itemsize, raw, "numpy scalar")
        return np.frombuffer(raw, dtype=dtype)[0]
    if code == EXT_TENSOR:
        try:
            import torch
        except ImportError as e:
            raise UnsupportedFormatError(
                "this sample holds a torch tensor; install torch (txstore[torch]) to read it"
            ) from e
        from .tensors import tensor_from_bytes

        (name, shape), raw = _split_payload(data, _array_header, "tensor")
        torch_dtype = _torch_dtype(torch, name)
        return tensor_from_bytes(
            raw, torch_dtype, _check_shape(shape, torch_dtype.itemsize, raw, "tensor")
        )
    raise UnsupportedFormatError(f"unknown MessagePack extension code {code}")


class _Counter(threading.local):
    absent = 0


#: ABSENT markers decoded by this thread: a sparse frame's values hold as many at their top
#: level as its decoding met, or one was inside a value.
_absent = _Counter()


def _sparse_hook(code: int, data: memoryview) -> Any:
    if code == EXT_ABSENT:
        _absent.absent += 1
        return ABSENT
    return _ext_value(code, data, False)


def _sparse_hook_views(code: int, data: memoryview) -> Any:
    if code == EXT_ABSENT:
        _absent.absent += 1
        return ABSENT
    return _ext_value(code, data, True)


ABSENT_BYTES = msgspec.msgpack.encode(msgspec.msgpack.Ext(EXT_ABSENT, b""))


def _numeric_array_error(value: Any) -> str | None:
    """Why an array-like value cannot be stored, or None when it can."""
    module = type(value).__module__
    if module == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray | np.generic):
            kind = value.dtype.kind
            if kind not in "biufc" or value.dtype.hasobject:
                return f"numpy dtype {value.dtype} is not numeric or bool"
            if value.nbytes > MAX_ARRAY_BYTES:
                return _too_large(value.nbytes)
            return None
    if module.startswith("torch"):
        import torch

        if isinstance(value, torch.Tensor):
            if value.layout is not torch.strided or value.is_quantized or value.is_nested:
                return "sparse, quantized and nested tensors are not supported"
            if value.is_meta:
                return "a meta tensor has no data to store"
            name = str(value.dtype).removeprefix("torch.")
            if name not in TORCH_DTYPES:
                return f"tensor dtype {name} is not supported"
            if value.numel() * value.element_size() > MAX_ARRAY_BYTES:
                return _too_large(value.numel() * value.element_size())
            return None
    return f"unsupported type {type(value).__module__}.{type(value).__qualname__}"


def _too_large(nbytes: int) -> str:
    return f"a value of {nbytes} bytes; the format holds at most {MAX_VALUE_BYTES} bytes a value"


def _check(value: Any, depth: int) -> str | None:
    """Why ``value`` cannot be stored exactly, or None when it can."""
    kind = type(value)
    if kind in _PLAIN:
        return None
    if kind is int:
        return None if INT_MIN <= value <= INT_MAX else f"int {value} does not fit in 64 bits"
    if depth >= MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if kind is list:
        for item in value:
            why = _check(item, depth + 1)
            if why:
                return why
        return None
    if kind is dict:
        for k, item in value.items():
            if type(k) is not str:
                return f"nested dict key {k!r} is not a str"
            why = _check(item, depth + 1)
            if why:
                return why
        return None
    if kind is tuple:
        return "tuples do not round-trip; use a list"
    return _numeric_array_error(value)


class ValueEncoder:
    """Encodes one value at a time; not thread-safe (one per writer)."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
        #: Encodes a ``str`` or an ``int`` in [INT_MIN, INT_MAX] with no checks: a writer's
        #: fast path for the commonest small values.
        self.encode_plain = self._encoder.encode

    def encode(self, value: Any, *, position: int, key: str) -> bytes:
        kind = type(value)
        if kind is int:
            if INT_MIN <= value <= INT_MAX:
                return self._encoder.encode(value)
        elif kind in _PLAIN:
            return self._encoder.encode(value)
        why = _check(value, 1)
        if why:
            raise EncodeError(f"sample {position}, key {key!r}: {why}")
        try:
            return self._encoder.encode(value)
        except UnicodeEncodeError:
            raise  # the builder names it
        except (ValueError, OverflowError, RuntimeError, NotImplementedError) as e:
            # What the checks above cannot see (a str or bytes over 4 GiB inside a list, a
            # tensor torch cannot copy out): still the caller's value, refused.
            raise EncodeError(f"sample {position}, key {key!r}: {type(e).__name__}: {e}") from e


class ValueDecoder:
    """Decodes values written by ValueEncoder; thread-safe."""

    def __init__(self) -> None:
        self._decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
        self._sparse: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(ext_hook=_sparse_hook)
        # For zero-copy reads: MessagePack bin values as read-only views of the input, and
        # numpy arrays as read-only arrays over it.
        self._view = msgspec.msgpack.Decoder(memoryview)
        self._views = msgspec.msgpack.Decoder(list[memoryview])
        self._array_views: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
            ext_hook=_ext_hook_views
        )
        self._sparse_views: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
            ext_hook=_sparse_hook_views
        )
        #: ``decode_list(data)`` without views: the msgspec call itself, for the decoding loop.
        self.decode_list_plain = self._decoder.decode

    def decode(self, data: bytes | memoryview, *, views: bool = False) -> Any:
        """One value; with ``views`` a ``bytes`` value comes back as a view of ``data`` and
        numpy arrays as read-only arrays over it."""
        if views:
            try:
                return self._view.decode(data)
            except msgspec.ValidationError:
                return self._array_views.decode(data)  # not bytes
        return self._decoder.decode(data)

    def decode_list(self, data: bytes | memoryview, *, views: bool = False) -> list[Any]:
        """A MessagePack array of values; with ``views``, numpy arrays as read-only arrays
        over ``data`` and, when the values are all ``bytes``, those as views of it."""
        if views and len(data) > 1:
            # Only when the first value is bin: a column of ids or labels is not worth a typed
            # decode that fails (an exception per frame). Inline: this runs for every frame.
            skip = _ARRAY_HEADER_BYTES.get(data[0])
            if skip is not None and len(data) > skip and data[skip] in _BIN_TYPES:
                try:
                    return self._views.decode(data)
                except msgspec.ValidationError:
                    pass  # some are not bytes (or absent): decoded as usual
        values: list[Any] = (self._array_views if views else self._decoder).decode(data)
        return values

    def decode_sparse(self, data: bytes | memoryview, *, views: bool = False) -> Any:
        """A sparse frame's MessagePack array of values, ABSENT where a sample has none;
        CorruptError if an ABSENT marker is inside a value. ``views`` as for ``decode``."""
        before = _absent.absent
        values = (self._sparse_views if views else self._sparse).decode(data)
        # ``is``, not ``list.count``: an array's ``==`` is elementwise.
        if type(values) is list and _absent.absent - before != sum(
            map(operator.is_, values, repeat(ABSENT))
        ):
            raise CorruptError("an absent marker inside a value")
        return values


#: The first byte of a MessagePack array header: how many bytes the header takes.
_ARRAY_HEADER_BYTES = {**{0x90 | n: 1 for n in range(16)}, 0xDC: 3, 0xDD: 5}
_BIN_TYPES = frozenset((0xC4, 0xC5, 0xC6))
