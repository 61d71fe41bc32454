"""Sample values <-> MessagePack bytes, with typed extensions for arrays and tensors.

A sample is a dict with str keys. Each value is encoded on its own (so a reader can decode one
field of one sample); containers nest plain values. numpy and torch are optional and imported
only when a value of theirs is met.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from ..errors import EncodeError, UnsupportedFormatError

# MessagePack extension codes (documented in docs/format.md).
EXT_ABSENT = 0  # the sample has no value for this column
EXT_NDARRAY = 1  # numpy.ndarray
EXT_TENSOR = 2  # torch.Tensor
EXT_NPSCALAR = 3  # numpy scalar (np.float32(1.0) and friends)

MAX_DEPTH = 32
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
_PLAIN = frozenset({type(None), bool, float, str, bytes})
_HEADER = struct.Struct("<I")


class Absent:
    """Marks a column slot for a sample that does not have that key."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Absent()


def _array_payload(header: list[Any], data: bytes) -> bytes:
    head = msgspec.msgpack.encode(header)
    return _HEADER.pack(len(head)) + head + data


def _split_payload(payload: memoryview) -> tuple[list[Any], memoryview]:
    (n,) = _HEADER.unpack_from(payload)
    header = msgspec.msgpack.decode(payload[4 : 4 + n])
    return header, payload[4 + n :]


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

        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            dtype = str(t.dtype).removeprefix("torch.")
            return msgspec.msgpack.Ext(EXT_TENSOR, _array_payload([dtype, list(t.shape)], raw))
    raise TypeError(f"unsupported type {type(obj).__qualname__}")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == EXT_ABSENT:
        return ABSENT
    if code == EXT_NDARRAY:
        import numpy as np

        (dtype, shape), raw = _split_payload(data)
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(tuple(shape)).copy()
    if code == EXT_NPSCALAR:
        import numpy as np

        (dtype,), raw = _split_payload(data)
        return np.frombuffer(raw, dtype=np.dtype(dtype))[0]
    if code == EXT_TENSOR:
        try:
            import torch
        except ImportError as e:
            raise UnsupportedFormatError(
                "this sample holds a torch tensor; install torch (txstore[torch]) to read it"
            ) from e
        (dtype, shape), raw = _split_payload(data)
        torch_dtype = getattr(torch, dtype)
        if not raw:
            return torch.empty(tuple(shape), dtype=torch_dtype)
        return torch.frombuffer(bytearray(raw), dtype=torch_dtype).reshape(tuple(shape))
    raise UnsupportedFormatError(f"unknown MessagePack extension code {code}")


ABSENT_BYTES = msgspec.msgpack.encode(msgspec.msgpack.Ext(EXT_ABSENT, b""))


def _numeric_array_error(value: Any) -> str | None:
    """Why an array-like value cannot be stored, or None when it can."""
    module = type(value).__module__
    if module == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray | np.generic):
            kind = value.dtype.kind
            if kind in "biufc" and not value.dtype.hasobject:
                return None
            return f"numpy dtype {value.dtype} is not numeric or bool"
    if module.startswith("torch"):
        import torch

        if isinstance(value, torch.Tensor):
            if value.is_sparse or value.is_quantized or value.is_nested:
                return "sparse, quantized and nested tensors are not supported"
            return None
    return f"unsupported type {type(value).__module__}.{type(value).__qualname__}"


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
        return self._encoder.encode(value)


class ValueDecoder:
    """Decodes values written by ValueEncoder; thread-safe."""

    def __init__(self) -> None:
        self._decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
        # For zero-copy reads: MessagePack bin values as read-only views of the input.
        self._view = msgspec.msgpack.Decoder(memoryview)
        self._views = msgspec.msgpack.Decoder(list[memoryview])
        #: ``decode_list(data)`` without views: the msgspec call itself, for the decoding loop.
        self.decode_list_plain = self._decoder.decode

    def decode(self, data: bytes | memoryview, *, views: bool = False) -> Any:
        """One value; with ``views`` a ``bytes`` value comes back as a view of ``data``."""
        if views:
            try:
                return self._view.decode(data)
            except msgspec.ValidationError:
                pass  # not bytes: decoded as usual
        return self._decoder.decode(data)

    def decode_list(self, data: bytes | memoryview, *, views: bool = False) -> list[Any]:
        """A MessagePack array of values; with ``views``, when they are all ``bytes``, as
        views of ``data``."""
        if views and len(data) > 1:
            # Only when the first value is bin: a column of ids or labels is not worth a typed
            # decode that fails (an exception per frame). Inline: this runs for every frame.
            skip = _ARRAY_HEADER_BYTES.get(data[0])
            if skip is not None and len(data) > skip and data[skip] in _BIN_TYPES:
                try:
                    return self._views.decode(data)
                except msgspec.ValidationError:
                    pass  # some are not bytes (or absent): decoded as usual
        values: list[Any] = self._decoder.decode(data)
        return values


#: The first byte of a MessagePack array header: how many bytes the header takes.
_ARRAY_HEADER_BYTES = {**{0x90 | n: 1 for n in range(16)}, 0xDC: 3, 0xDD: 5}
_BIN_TYPES = frozenset((0xC4, 0xC5, 0xC6))
