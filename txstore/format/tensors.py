"""A torch tensor's elements <-> bytes: the one place txstore copies a tensor out and back.

The value codec stores tensor values with it, and the torch face's DataLoader transport sends
a batch's small tensors with it between worker and main process. Both need the same thing: a
CPU tensor's elements in C order as ``bytes``, and a writable tensor of a given dtype and shape
rebuilt from such bytes. Imports torch, so only code that has met a tensor imports it.
"""

from __future__ import annotations

import torch


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The elements of a CPU tensor in C order, whatever its strides.

    A conjugate or negative view is a flag on memory it shares: resolve it first (the bytes
    here are the memory's, not the values the flag stands for).
    """
    # Viewed as uint8, every dtype (bfloat16, float8, complex32 ...) has a numpy form.
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def tensor_from_bytes(
    data: bytes | bytearray | memoryview, dtype: torch.dtype, shape: tuple[int, ...]
) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` holding a copy of ``data`` (its own memory, so it is
    writable and outlives ``data``); ``data`` must be exactly that many elements' bytes."""
    if not data:  # frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def tensor_named(
    data: bytes | bytearray | memoryview, dtype: str, shape: tuple[int, ...]
) -> torch.Tensor:
    """As ``tensor_from_bytes``, the dtype given by its name ("float32", "bfloat16"): for
    readers of other tools' files, which name dtypes without importing torch."""
    return tensor_from_bytes(data, getattr(torch, dtype), shape)
