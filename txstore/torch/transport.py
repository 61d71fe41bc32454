"""How StreamingDataLoader ships batches from its workers: small tensors inline.

A standard DataLoader moves every tensor of a batch through shared memory: the worker creates
a segment and the main process fetches its file descriptor over a socket, about a millisecond
per tensor. For a batch's small tensors (ids, labels) that is most of the loader's cost,
several times what sending the same ids as bytes costs. So a worker sends tensors
up to ``INLINE_TENSOR_BYTES`` as their bytes, and the main process rebuilds them; larger
tensors keep the shared-memory path, which copies nothing.

A stacked column of arrays (``collate.StackedArrays``: images, latents) is copied once, by
the worker, into such a buffer, and the batch's tensor is made over the main process's mapping
of it: the buffer stays the batch's until no tensor uses it (``_Lease``), so a training step
reads the very pages the worker wrote, with no new segment and no copy in between.

The other way round for lists of large ``bytes`` (a batch of JPEGs): pickled, 6 MB a batch
went through the pipe in four copies. Instead each worker copies them into a shared-memory
buffer it keeps and reuses (BytesPool), and the main process copies them out of its mapping of
that buffer (Receiver): two copies, no new segment, no page faults and no descriptor passing
once the buffers exist. The 2-worker W2 loader went from 1.08 to 1.54 times LitData's with a
new segment per batch, and to 3.9 times with reused ones (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import threading
from collections.abc import Callable
from multiprocessing import resource_sharer
from typing import Any

import numpy as np
import torch

from ..format.tensors import tensor_bytes, tensor_from_bytes
from .collate import StackedArrays

#: Tensors up to this size travel pickled with the batch; larger ones through shared memory.
INLINE_TENSOR_BYTES = 256 * 1024
#: A list of ``bytes`` larger than this in all travels as one shared-memory buffer instead of
#: pickled through the worker's pipe (two copies less, and no pipe to push 6 MB a batch into).
SHARED_BYTES_MIN = 1 << 20


class InlineTensor:
    """A CPU tensor's bytes, dtype and shape: what crosses the worker's pipe."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.data = tensor_bytes(tensor)
        self.dtype = tensor.dtype
        self.shape = tuple(tensor.shape)

    def __getstate__(self) -> tuple[bytes, torch.dtype, tuple[int, ...]]:
        return self.data, self.dtype, self.shape

    def __setstate__(self, state: tuple[bytes, torch.dtype, tuple[int, ...]]) -> None:
        self.data, self.dtype, self.shape = state

    def tensor(self) -> torch.Tensor:
        return tensor_from_bytes(self.data, self.dtype, self.shape)


class SharedBytes:
    """A list of ``bytes`` in a shared-memory buffer, with where each one ends.

    The buffer is one of a worker's BytesPool slots. Its first byte says whether the main
    process has copied the items out (FREE) or not yet (BUSY). A slot crosses the pipe only
    the first time (``buffer``: a ``SlotFd``, which the main process opens by the path of the
    worker's descriptor); later batches in it send just the slot's name, which saves mapping
    fresh pages on both sides.
    """

    __slots__ = ("buffer", "ends", "generation", "key")

    def __init__(
        self, buffer: Crossing | None, ends: list[int], key: tuple[str, int], generation: int
    ) -> None:
        self.buffer, self.ends, self.key, self.generation = buffer, ends, key, generation

    def __getstate__(self) -> tuple[Any, ...]:
        return self.buffer, self.ends, self.key, self.generation

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.buffer, self.ends, self.key, self.generation = state


class WorkerStart:
    """A loader's ``worker_init_fn``: starts the worker's descriptor sharing on a thread of
    its own (``share_early``), then calls the user's function, if any."""

    def __init__(self, user: Callable[[int], Any] | None) -> None:
        self.user = user

    def __call__(self, worker_id: int) -> None:
        threading.Thread(target=share_early, name="txstore-share", daemon=True).start()
        if self.user is not None:
            self.user(worker_id)


def share_early() -> None:
    """Start this process's sharing of descriptors, and wait until it answers.

    A worker offers descriptors through multiprocessing's resource sharer (torch's way for a
    batch's tensors in shared memory; ``SlotFd``'s copy of a slot's), whose listening thread
    starts when the first one is offered: inside the worker's first batch, where the start
    waited some 7 ms for the worker's GIL (W2, 2 workers). Offering and taking back a pipe's
    end here, at the worker's start and beside its first reads, leaves the thread running
    and nothing shared.
    """
    read, write = os.pipe()
    try:
        os.close(resource_sharer.DupFd(read).detach())
    except OSError:
        pass  # the batches' own sharing fails then too, and says why
    finally:
        os.close(read)
        os.close(write)


_HEADER = 64  # the FREE/BUSY byte, padded to a cache line
_FREE, _BUSY = 0, 1
#: Slots per worker: a worker has at most prefetch_factor batches in flight (2 by default);
#: when every slot is still busy it adds one, up to this many, then uses one-off buffers.
MAX_POOL_SLOTS = 8


class SharedArray:
    """A stacked column of numpy arrays (``collate.StackedArrays``) in a shared-memory buffer,
    as SharedBytes holds a list of bytes: its dtype and shape say how to read it back."""

    __slots__ = ("buffer", "dtype", "generation", "key", "shape")

    def __init__(
        self,
        buffer: Crossing | None,
        dtype: str,
        shape: tuple[int, ...],
        key: tuple[str, int],
        generation: int,
    ) -> None:
        self.buffer, self.dtype, self.shape, self.key = buffer, dtype, shape, key
        self.generation = generation

    def __getstate__(self) -> tuple[Any, ...]:
        return self.buffer, self.dtype, self.shape, self.key, self.generation

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.buffer, self.dtype, self.shape, self.key, self.generation = state


class SlotFd:
    """A worker's pool slot as the main process first opens it: by the path of the worker's
    descriptor, ``/proc/<pid>/fd/<fd>``, with no round trip to the worker.

    torch's own way takes the descriptor from the worker through multiprocessing's resource
    sharer, whose thread in the worker must get a core and the worker's GIL while the worker
    makes its next batches: the first W2 batch waited 8-21 ms for it. Where the path cannot
    be opened (another process's descriptors are the owner's and its ancestors' to open, as
    the kernel's ptrace rules decide), the resource sharer hands the descriptor over, as
    torch would; where it can, the main process takes it back from the sharer later, on a
    thread of its own, so that the worker holds no copy of it.
    """

    __slots__ = ("fd", "pid", "shared", "size")

    def __init__(self, pid: int, fd: int, size: int, shared: Any) -> None:
        self.pid, self.fd, self.size, self.shared = pid, fd, size, shared

    @classmethod
    def of(cls, buffer: torch.Tensor) -> SlotFd | None:
        """How to open ``buffer`` (in shared memory, of a pool slot the worker keeps open for
        as long as the main process may open it), or None where only torch's way will do."""
        if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":  # type: ignore[no-untyped-call]
            return None
        share_fd = getattr(buffer.untyped_storage(), "_share_fd_cpu_", None)
        if share_fd is None:
            return None
        fd, size = share_fd()
        return cls(os.getpid(), fd, size, resource_sharer.DupFd(fd))

    def __reduce__(self) -> tuple[Any, ...]:
        # Opened as it is unpickled: a worker lives at least until the main process has
        # taken all it sent (a batch kept to be yielded in order would be too late).
        return open_slot, (self.pid, self.fd, self.size, self.shared)


def open_slot(pid: int, fd: int, size: int, shared: Any) -> memoryview:
    """A worker's slot (``SlotFd``), mapped in this process (the main one)."""
    if not all(type(n) is int and n >= 0 for n in (pid, fd, size)):  # they name a path
        raise ValueError(f"a worker sent {pid!r}, {fd!r}, {size!r} as a shared batch buffer")
    try:
        own = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        own = shared.detach()
    else:
        threading.Thread(target=_forget, args=(shared,), daemon=True).start()
    try:
        found = os.fstat(own).st_size
        if found < size:  # not the slot it was sent as
            raise RuntimeError(
                f"shared batch buffer {pid}:{fd} holds {found} bytes, the worker sent it as {size}"
            )
        return memoryview(mmap.mmap(own, size))
    finally:
        os.close(own)


def _forget(shared: Any) -> None:
    """Take a descriptor offered by a worker back from it, and close it."""
    with contextlib.suppress(OSError, EOFError):  # the worker has gone, and what it offered
        os.close(shared.detach())


#: What a slot crosses to the main process as, the first time: by its descriptor's path
#: (arriving as a view of it), or (torch's way) as a tensor in shared memory.
Crossing = SlotFd | memoryview | torch.Tensor


class BytesPool:
    """A worker's shared-memory buffers, reused for its batches' lists of bytes and stacked
    arrays."""

    def __init__(self) -> None:
        self.token = os.urandom(8).hex()  # names this pool; worker pids can be reused
        self.buffers: list[torch.Tensor] = []
        self.views: list[memoryview] = []
        self.generations: list[int] = []
        self.next = 0

    def _slot(self, size: int) -> tuple[int, bool]:
        """A free slot of at least ``size`` bytes, and whether its tensor is new."""
        count = len(self.buffers)
        for step in range(count):
            slot = (self.next + step) % count
            if self.views[slot][0] == _FREE:
                self.next = (slot + 1) % count
                if self.buffers[slot].numel() >= size:
                    return slot, False
                self.buffers[slot] = _new_buffer(size)
                self.views[slot] = self.buffers[slot].numpy().data
                self.generations[slot] += 1
                return slot, True
        if count == MAX_POOL_SLOTS:
            return -1, True
        self.buffers.append(_new_buffer(size))
        self.views.append(self.buffers[-1].numpy().data)
        self.generations.append(0)
        return count, True

    def _take(self, size: int) -> tuple[Crossing | None, memoryview, tuple[str, int], int]:
        """A buffer of at least ``size`` bytes marked busy: (what the main process opens it
        by, if it has not seen it; a view of it; its key; its generation)."""
        slot, fresh = self._slot(size)
        crossing: Crossing
        if slot >= 0:
            buffer, view, generation = self.buffers[slot], self.views[slot], self.generations[slot]
            crossing = SlotFd.of(buffer) or buffer
        else:  # every slot busy: a one-off buffer, dropped here once sent (torch's way)
            buffer = _new_buffer(size)
            view, generation = buffer.numpy().data, 0
            crossing = buffer
        view[0] = _BUSY
        return (crossing if fresh else None), view, (self.token, slot), generation

    def place(self, items: list[bytes | memoryview], total: int) -> SharedBytes:
        buffer, view, key, generation = self._take(_HEADER + total)
        ends: list[int] = []
        start = _HEADER
        for item in items:
            end = start + len(item)
            view[start:end] = item
            ends.append(end)
            start = end
        return SharedBytes(buffer, ends, key, generation)

    def stack(self, column: StackedArrays) -> SharedArray:
        """``column``'s arrays copied one after another into a buffer: the only copy of them
        between the chunk and the batch."""
        buffer, view, key, generation = self._take(_HEADER + column.nbytes)
        out = np.frombuffer(view, column.dtype, math.prod(column.shape), _HEADER)
        np.stack(column.arrays, out=out.reshape(column.shape))
        return SharedArray(buffer, column.dtype.str, column.shape, key, generation)


def _new_buffer(size: int) -> torch.Tensor:
    # Round up so that batches of slightly varying size keep their slot.
    size += size // 8
    # Made in shared memory at once: ``share_memory_`` on a new tensor allocates it, then
    # copies it into a new segment (a worker's first W2 batch waited ~4 ms more for its slot).
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # not in this torch: the public way
        buffer = torch.empty(size, dtype=torch.uint8)
        buffer.share_memory_()  # type: ignore[no-untyped-call]
        return buffer
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(size))


class Receiver:
    """The main process's side of the workers' pools: the slots it has mapped."""

    def __init__(self) -> None:
        self.kept: dict[tuple[str, int], tuple[int, memoryview]] = {}

    def _buffer(self, shared: SharedBytes | SharedArray) -> memoryview:
        crossing = shared.buffer
        if crossing is not None:
            view = crossing if isinstance(crossing, memoryview) else _view(crossing)
            if shared.key[1] >= 0:
                self.kept[shared.key] = shared.generation, view
            return view
        generation, view = self.kept[shared.key]
        if generation != shared.generation:  # the protocol above rules this out
            raise RuntimeError(f"shared batch buffer {shared.key} is out of date")
        return view

    def items(self, shared: SharedBytes) -> list[bytes]:
        view = self._buffer(shared)
        starts = [_HEADER, *shared.ends[:-1]]
        items = [bytes(view[start:end]) for start, end in zip(starts, shared.ends, strict=True)]
        view[0] = _FREE  # after the copies: the worker may now refill it
        return items

    def array(self, shared: SharedArray, pin: bool) -> torch.Tensor:
        """The stacked column as a tensor: over the worker's buffer itself, which stays the
        batch's until no tensor uses it (then the worker may refill it); with ``pin``, a
        pinned copy, and the buffer is free at once."""
        view = self._buffer(shared)
        dtype = np.dtype(shared.dtype)
        source = np.frombuffer(view, dtype, math.prod(shared.shape), _HEADER)
        if pin:
            dtype_of = torch.from_numpy(source[:0]).dtype
            out = torch.empty(shared.shape, dtype=dtype_of, pin_memory=True)
            out.numpy().reshape(-1)[:] = source
            view[0] = _FREE
            return out
        return torch.from_numpy(np.asarray(_Lease(source.reshape(shared.shape), view)))


def _view(crossing: SlotFd | torch.Tensor) -> memoryview:
    if isinstance(crossing, SlotFd):  # not pickled: a loader without workers
        return open_slot(crossing.pid, crossing.fd, crossing.size, crossing.shared)
    return crossing.numpy().data


class _Lease:
    """A batch's hold on a worker's buffer: numpy keeps it as the base of the array a batch
    tensor is made over, and torch keeps that array for as long as the tensor's storage lives
    (slices and views included); when the last goes, the buffer is marked free."""

    def __init__(self, array: np.ndarray[Any, Any], buffer: memoryview) -> None:
        self.__array_interface__ = array.__array_interface__
        self._array = array  # keeps the mapping alive
        self._buffer = buffer

    def __del__(self) -> None:
        self._buffer[0] = _FREE


def _is_bytes_like(item: Any) -> bool:
    """``bytes``, or a flat view of bytes (from a zero-copy snapshot; it arrives as bytes)."""
    kind = type(item)
    return kind is bytes or (kind is memoryview and item.itemsize == 1 and item.c_contiguous)


def _shareable(items: list[Any]) -> int:
    """The total size of a list of bytes worth sharing, or 0."""
    if len(items) < 2 or not all(map(_is_bytes_like, items)):
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
        and not value.is_neg()  # a negative view has no bytes of its own to send
        and value.element_size() * value.numel() <= INLINE_TENSOR_BYTES
    )


def pack(batch: Any, pool: BytesPool) -> Any:
    """The batch with its small tensors replaced by InlineTensor and its lists of large
    ``bytes`` by SharedBytes (in dicts, lists and tuples)."""
    kind = type(batch)
    if kind is torch.Tensor:
        return InlineTensor(batch) if _inlinable(batch) else batch
    if kind is dict:
        return {key: pack(value, pool) for key, value in batch.items()}
    if kind is list:
        total = _shareable(batch)
        return pool.place(batch, total) if total else [pack(value, pool) for value in batch]
    if kind is tuple:
        return tuple(pack(value, pool) for value in batch)
    if kind is memoryview:  # from a zero-copy snapshot: cannot be pickled
        return bytes(batch)
    if kind is StackedArrays:
        return pool.stack(batch)
    return batch


def unpack(batch: Any, pin: bool, receiver: Receiver) -> Any:
    """The inverse of ``pack``; ``pin`` pins the rebuilt tensors (pin_memory=True).

    Batches of one worker must be unpacked in the order it packed them (a DataLoader yields
    them so), since a slot is refilled once the main process has read it."""
    kind = type(batch)
    if kind is InlineTensor:
        tensor = batch.tensor()
        return tensor.pin_memory() if pin else tensor
    if kind is SharedBytes:
        return receiver.items(batch)
    if kind is SharedArray:
        return receiver.array(batch, pin)
    if kind is dict:
        return {key: unpack(value, pin, receiver) for key, value in batch.items()}
    if kind is list:
        return [unpack(value, pin, receiver) for value in batch]
    if kind is tuple:
        return tuple(unpack(value, pin, receiver) for value in batch)
    return batch
