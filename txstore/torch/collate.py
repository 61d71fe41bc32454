"""StreamingDataLoader's default collate: torch's ``default_collate``, except for the columns
of a batch of dict samples that it can make with fewer copies.

A column of numpy arrays of one dtype and shape is stacked straight from the values the
dataset read, which in a loader's workers are read-only views of the chunks: each value is
copied once, into the batch. A column of ``bytes`` (or of views of them) stays a list, as
torch's collate keeps it. Everything else goes through torch's collate, with any view among
it copied first, so that no view of a chunk outlives the batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate as torch_collate
from torch.utils.data import get_worker_info

#: A stacked column at least this large leaves a worker through its shared buffers (see
#: ``transport.SHARED_BYTES_MIN``); a smaller one becomes a tensor in the worker.
STACK_SHARED_MIN = 1 << 20


class StackedArrays:
    """A column of same-shaped numpy arrays, to be stacked into the batch where it lands: a
    worker's shared buffer (``transport.pack``), or a tensor of its own."""

    __slots__ = ("arrays", "dtype", "shape")

    def __init__(self, arrays: list[np.ndarray[Any, Any]]) -> None:
        self.arrays = arrays
        self.dtype = arrays[0].dtype
        self.shape = (len(arrays), *arrays[0].shape)

    @property
    def nbytes(self) -> int:
        return int(self.dtype.itemsize * np.prod(self.shape, dtype=np.int64))

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(np.stack(self.arrays))


def collate(batch: Any) -> Any:
    """A batch of samples as ``torch.utils.data.default_collate`` makes it (the same types,
    shapes and values), with array columns copied once and no chunk view left in it."""
    if type(batch) is list and batch and all(type(sample) is dict for sample in batch):
        return {key: _column([sample[key] for sample in batch]) for key in batch[0]}
    return torch_collate(owned(batch))


def _column(values: list[Any]) -> Any:
    first = values[0]
    if type(first) is np.ndarray and _stackable(first.dtype):
        dtype, shape = first.dtype, first.shape
        if all(type(v) is np.ndarray and v.dtype == dtype and v.shape == shape for v in values):
            stacked = StackedArrays(values)
            if get_worker_info() is not None and stacked.nbytes >= STACK_SHARED_MIN:
                return stacked
            return stacked.tensor()
    if all(type(v) is bytes or type(v) is memoryview for v in values):
        # In a worker, views go to the shared buffer (or become bytes) as the batch leaves;
        # here, in the process that trains, they become bytes now (``bytes`` of a bytes is
        # itself).
        return values if get_worker_info() is not None else [bytes(v) for v in values]
    return torch_collate(owned(values))


def _stackable(dtype: np.dtype[Any]) -> bool:
    """Whether torch has a dtype of the same values (torch's collate refuses the others)."""
    return dtype.kind in "biufc" and dtype.isnative


def owned(value: Any) -> Any:
    """``value`` with every read-only array and every view in it (a zero-copy read's) copied:
    what torch's collate may turn into tensors without sharing a chunk's memory."""
    kind = type(value)
    if kind is np.ndarray:
        return value if value.flags.writeable else value.copy()
    if kind is memoryview:
        return bytes(value)
    if kind is dict:
        return {k: owned(v) for k, v in value.items()}
    if kind is list:
        return [owned(v) for v in value]
    if kind is tuple:
        return tuple(owned(v) for v in value)
    return value
