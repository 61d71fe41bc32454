"""How StreamingDataLoader ships batches from its workers: small tensors inline.

A standard DataLoader moves every tensor of a batch through shared memory: the worker creates
a segment and the main process fetches its file descriptor over a socket, about a millisecond
per tensor. For a batch's small tensors (ids, labels) that is most of the loader's cost: a
2-worker loader over in-memory samples moved 127,000 samples/s with an id tensor per batch
and 709,000 with the same ids sent as bytes (docs/benchmarks.md). So a worker sends tensors
up to ``INLINE_TENSOR_BYTES`` as their bytes, and the main process rebuilds them; larger
tensors keep the shared-memory path, which copies nothing.

The other way round for lists of large ``bytes`` (a batch of JPEGs): pickled, 6 MB a batch
went through the pipe in four copies; one shared-memory buffer per list takes two, and the
2-worker W2 loader went from 1.08 to 1.54 times LitData's.
"""

from __future__ import annotations

from typing import Any

import torch

#: Tensors up to this size travel pickled with the batch; larger ones through shared memory.
INLINE_TENSOR_BYTES = 256 * 1024
#: A list of ``bytes`` larger than this in all travels as one shared-memory buffer instead of
#: pickled through the worker's pipe (two copies less, and no pipe to push 6 MB a batch into).
SHARED_BYTES_MIN = 1 << 20


class InlineTensor:
    """A CPU tensor's bytes, dtype and shape: what crosses the worker's pipe."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        self.dtype = tensor.dtype
        self.shape = tuple(tensor.shape)

    def __getstate__(self) -> tuple[bytes, torch.dtype, tuple[int, ...]]:
        return self.data, self.dtype, self.shape

    def __setstate__(self, state: tuple[bytes, torch.dtype, tuple[int, ...]]) -> None:
        self.data, self.dtype, self.shape = state

    def tensor(self) -> torch.Tensor:
        if not self.data:
            return torch.empty(self.shape, dtype=self.dtype)
        raw = torch.frombuffer(bytearray(self.data), dtype=torch.uint8)
        return raw.view(self.dtype).reshape(self.shape)


class SharedBytes:
    """A list of ``bytes`` copied into one shared-memory buffer, with where each one ends."""

    __slots__ = ("buffer", "ends")

    def __init__(self, items: list[bytes], total: int) -> None:
        self.buffer = torch.empty(total, dtype=torch.uint8)
        self.buffer.share_memory_()  # type: ignore[no-untyped-call]  # filled in place
        view = self.buffer.numpy().data
        self.ends: list[int] = []
        start = 0
        for item in items:
            end = start + len(item)
            view[start:end] = item
            self.ends.append(end)
            start = end

    def __getstate__(self) -> tuple[torch.Tensor, list[int]]:
        return self.buffer, self.ends

    def __setstate__(self, state: tuple[torch.Tensor, list[int]]) -> None:
        self.buffer, self.ends = state

    def items(self) -> list[bytes]:
        view = self.buffer.numpy().data
        starts = [0, *self.ends[:-1]]
        return [bytes(view[start:end]) for start, end in zip(starts, self.ends, strict=True)]


def _shareable(items: list[Any]) -> int:
    """The total size of a list of bytes worth sharing, or 0."""
    if len(items) < 2 or any(type(item) is not bytes for item in items):
        return 0
    total = sum(map(len, items))
    return total if total >= SHARED_BYTES_MIN else 0


def _inlinable(value: torch.Tensor) -> bool:
    return (
        value.device.type == "cpu"
        and value.layout == torch.strided
        and not value.requires_grad
        and not value.is_quantized
        and not value.is_complex()  # untried here: complex tensors keep the usual path
        and value.element_size() * value.numel() <= INLINE_TENSOR_BYTES
    )


def pack(batch: Any) -> Any:
    """The batch with its small tensors replaced by InlineTensor (dicts, lists, tuples)."""
    kind = type(batch)
    if kind is torch.Tensor:
        return InlineTensor(batch) if _inlinable(batch) else batch
    if kind is dict:
        return {key: pack(value) for key, value in batch.items()}
    if kind is list:
        total = _shareable(batch)
        return SharedBytes(batch, total) if total else [pack(value) for value in batch]
    if kind is tuple:
        return tuple(pack(value) for value in batch)
    return batch


def unpack(batch: Any, pin: bool) -> Any:
    """The inverse of ``pack``; ``pin`` pins the rebuilt tensors (pin_memory=True)."""
    kind = type(batch)
    if kind is InlineTensor:
        tensor = batch.tensor()
        return tensor.pin_memory() if pin else tensor
    if kind is SharedBytes:
        return batch.items()
    if kind is dict:
        return {key: unpack(value, pin) for key, value in batch.items()}
    if kind is list:
        return [unpack(value, pin) for value in batch]
    if kind is tuple:
        return tuple(unpack(value, pin) for value in batch)
    return batch
