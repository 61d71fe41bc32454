"""Arrow out: a column's frames (its values as a chunk stores them) as one Arrow array,
with numpy where the values are of one kind, with ``pyarrow`` from Python values where not."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from ...errors import CorruptError, EncodeError, TxstoreError
from ..values import ABSENT

msgspec_errors = (msgspec.DecodeError,)


def _int_bytes(body: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], width: int) -> Any:
    """The ``width`` bytes after each value's tag, as rows."""
    return body[starts[:, None] + np.arange(1, 1 + width)]


#: MessagePack int tags with a payload: (tag, big-endian numpy type).
_INT_TAGS = {
    0xCC: ">u1",
    0xCD: ">u2",
    0xCE: ">u4",
    0xCF: ">u8",
    0xD0: ">i1",
    0xD1: ">i2",
    0xD2: ">i4",
    0xD3: ">i8",
}
_STR_TAGS = {0xD9: 1, 0xDA: 2, 0xDB: 4}
#: The MessagePack tags of ints and floats with a payload, and the payload's numpy type.
_NUMBER_TAGS = {
    **{tag: np.dtype(kind) for tag, kind in _INT_TAGS.items()},
    0xCA: np.dtype(">f4"),
    0xCB: np.dtype(">f8"),
}
_BIN_TAGS = {0xC4: 1, 0xC5: 2, 0xC6: 4}


def _lengths(
    body: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], tags: np.ndarray[Any, Any], kinds: Any
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
    """Header and data lengths of str or bin values (``kinds``: tag -> bytes of length)."""
    hlen = np.ones(len(starts), dtype=np.int64)
    length = np.zeros(len(starts), dtype=np.int64)
    fix = (tags >= 0xA0) & (tags <= 0xBF) if kinds is _STR_TAGS else np.zeros(len(tags), bool)
    length[fix] = tags[fix] & 0x1F
    covered = fix.copy()
    for tag, width in kinds.items():
        rows = tags == tag
        if rows.any():
            raw = _int_bytes(body, starts[rows], width)
            length[rows] = raw.view(f">u{width}").reshape(-1).astype(np.int64)
            hlen[rows] = 1 + width
            covered |= rows
    if not covered.all():
        return None
    return hlen, length


def _fast_array(
    body: np.ndarray[Any, Any],
    starts: np.ndarray[Any, Any],
    ends: np.ndarray[Any, Any],
    decoder: Any,
) -> pa.Array | None:
    """The values of a column with numpy, when they are all ints, floats, bools, strs, bytes
    or numpy arrays of one dtype and shape (with nils as nulls); else None."""
    n = len(starts)
    if n == 0:
        return None
    tags = body[starts]
    valid = tags != 0xC0
    nulls = not valid.all()
    mask = None if not nulls else ~valid
    if nulls:
        if not valid.any():
            return pa.nulls(n)
        starts_v, ends_v, tags_v = starts[valid], ends[valid], tags[valid]
    else:
        starts_v, ends_v, tags_v = starts, ends, tags
    first = int(tags_v[0])

    def full(values: np.ndarray[Any, Any], fill: Any) -> np.ndarray[Any, Any]:
        if not nulls:
            return values
        out = np.full(n, fill, dtype=values.dtype)
        out[valid] = values
        return out

    if first <= 0x7F or first >= 0xE0 or first in _INT_TAGS:
        values = np.zeros(len(starts_v), dtype=np.int64)
        small = (tags_v <= 0x7F) | (tags_v >= 0xE0)
        values[small] = tags_v[small].astype(np.int8)
        covered = small.copy()
        for tag, kind in _INT_TAGS.items():
            rows = tags_v == tag
            if rows.any():
                raw = _int_bytes(body, starts_v[rows], int(kind[2]))
                got = raw.copy().view(kind).reshape(-1)
                if tag == 0xCF and int(got.max()) > 2**63 - 1:
                    return None  # beyond int64: pyarrow chooses
                values[rows] = got.astype(np.int64)
                covered |= rows
        widths = np.where(small, 1, 0)
        for tag, kind in _INT_TAGS.items():
            widths[tags_v == tag] = 1 + int(kind[2])
        if not covered.all() or not (widths == ends_v - starts_v).all():
            return None
        return pa.array(full(values, 0), mask=mask)
    if first in (0xCA, 0xCB):
        values = np.zeros(len(starts_v), dtype=np.float64)
        covered = np.zeros(len(starts_v), dtype=bool)
        for tag, kind in ((0xCA, ">f4"), (0xCB, ">f8")):
            rows = tags_v == tag
            if rows.any():
                width = int(kind[2])
                if not (ends_v[rows] - starts_v[rows] == 1 + width).all():
                    return None
                raw = _int_bytes(body, starts_v[rows], width)
                values[rows] = raw.copy().view(kind).reshape(-1)
                covered |= rows
        if not covered.all():
            return None
        return pa.array(full(values, 0.0), mask=mask)
    if first in (0xC2, 0xC3):
        if not np.isin(tags_v, (0xC2, 0xC3)).all() or not (ends_v - starts_v == 1).all():
            return None
        return pa.array(full(tags_v == 0xC3, False), mask=mask)
    if 0xA0 <= first <= 0xBF or first in _STR_TAGS or first in _BIN_TAGS:
        kinds = _BIN_TAGS if first in _BIN_TAGS else _STR_TAGS
        found = _lengths(body, starts_v, tags_v, kinds)
        if found is None:
            return None
        hlen, length = found
        if not (hlen + length == ends_v - starts_v).all():
            return None
        # The bytes of the values (not of the nils, nor between frames), less headers; values
        # of one length without nils were read by _uniform_array. A value has at least its
        # tag, so starts (and ends) are distinct and one fancy add each marks them.
        marks = np.zeros(len(body) + 1, dtype=np.int64)
        marks[starts] += 1
        marks[ends] -= 1
        keep = np.cumsum(marks[:-1]) > 0
        keep[starts[~valid]] = False
        for k in range(int(hlen.max())):
            rows = hlen > k
            keep[starts_v[rows] + k] = False
        data = body[keep]
        lengths = np.zeros(n, dtype=np.int64)
        lengths[valid] = length
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        large = offsets[-1] > 2**31 - 1
        kind = (
            (pa.large_binary() if large else pa.binary())
            if kinds is _BIN_TAGS
            else (pa.large_string() if large else pa.string())
        )
        bitmap = None if mask is None else pa.array(valid).buffers()[1]
        return pa.Array.from_buffers(
            kind,
            n,
            [
                bitmap,
                pa.py_buffer(offsets.astype(np.int64 if large else np.int32)),
                pa.py_buffer(data),
            ],
            null_count=int(n - valid.sum()),
        )
    if first in (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8) and not nulls:
        sizes = ends - starts
        if not (sizes == sizes[0]).all():
            return None
        one = decoder.decode(body[starts[0] : ends[0]])
        if type(one) is not np.ndarray:
            return None
        prefix = int(sizes[0]) - one.nbytes
        rows = body[starts[:, None] + np.arange(int(sizes[0]))]
        if not (rows[:, :prefix] == rows[0, :prefix]).all():
            return None
        dtype = one.dtype.newbyteorder("=") if one.dtype.byteorder == ">" else one.dtype
        values = np.ascontiguousarray(rows[:, prefix:]).view(one.dtype).astype(dtype)
        return _tensor(values.reshape(-1), (n, *one.shape))
    return None


def _tensor(flat: np.ndarray[Any, Any], shape: tuple[int, ...]) -> pa.Array:
    """``flat`` as rows of shape ``shape[1:]``: (nested) fixed_size_lists."""
    arr: pa.Array = pa.array(flat)
    for size in reversed(shape[1:]):
        arr = pa.FixedSizeListArray.from_arrays(arr, size)
    return arr


def _arrow_value(value: Any) -> Any:
    """A value as pyarrow's converter takes it: arrays and tensors as nested lists."""
    kind = type(value)
    if kind is dict:
        return {k: _arrow_value(v) for k, v in value.items()}
    if kind is list:
        return [_arrow_value(v) for v in value]
    if kind.__module__.startswith("torch"):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def py_array(values: list[Any], name: str) -> pa.Array:
    """Python values (None for a sample without the field) as one Arrow array: numpy arrays
    of one dtype and shape as (nested) fixed_size_lists; otherwise pyarrow's inference."""
    present = [v for v in values if v is not None]
    if present and all(type(v) is np.ndarray for v in present):
        first = present[0]
        if all(v.dtype == first.dtype and v.shape == first.shape for v in present) and (
            first.ndim >= 1 and first.dtype.kind in "biuf"
        ):
            filled = [v if v is not None else np.zeros_like(first) for v in values]
            arr = _tensor(np.stack(filled).reshape(-1), (len(values), *first.shape))
            if len(present) < len(values):
                valid = pa.array([v is not None for v in values])
                arr = pa.FixedSizeListArray.from_arrays(
                    arr.values, arr.type.list_size, mask=pa.compute.invert(valid)
                )
            return arr
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    if present and all(type(v) is int and v >= 0 for v in present):  # past int64
        return pa.array(values, pa.uint64())
    try:
        return pa.array([_arrow_value(v) for v in values])
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
        raise EncodeError(f"column {name!r}: its values have no one Arrow type ({e})") from None


#: The MessagePack tags a value of bytes, str or a numpy array starts with.
_SIZED_TAGS = frozenset(
    [*range(0xA0, 0xC0), 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, *range(0xD4, 0xDC)]
)


def _uniform_array(frames: list[tuple[int, memoryview | None, bool]], decoder: Any) -> Any:
    """A column whose values all have one encoded size and the same leading bytes (bytes or
    strs of one length, numpy arrays of one dtype and shape: images, latents, token windows;
    ints or floats of one MessagePack width, as a columnar append writes them),
    with each value's bytes copied once, block by block, from the frames into the Arrow
    buffer; None for any other column. A header gives the type and length of its value, so
    rows of one size that each start with the first value's header are each such a value,
    one after the other, and the first value decoded stands for all."""
    size = -1
    blocks = []
    for n, raw, _ in frames:
        assert raw is not None
        if n == 0:
            continue
        table = len(raw) - 4 * n
        if table < 0:
            return None
        head = int.from_bytes(raw[table : table + 4], "little")  # the first value's offset
        span = table - head
        if size < 0:
            size = span // n
        if size <= 0 or span != size * n:
            return None
        blocks.append(np.frombuffer(raw, dtype=np.uint8, count=span, offset=head).reshape(n, size))
    return rows_array(blocks, decoder)


def rows_array(blocks: list[np.ndarray[Any, Any]], decoder: Any) -> Any:
    """The column of ``blocks`` (each some blocks' values, a row per value, all rows of one
    size: an array of rows, or of blocks of rows), in order: see ``_uniform_array``."""
    if not blocks:
        return None
    first = blocks[0][(0,) * (blocks[0].ndim - 1)]
    if int(first[0]) not in _SIZED_TAGS and int(first[0]) not in _NUMBER_TAGS:
        return None
    size = len(first)
    try:
        one = decoder.decode(first)
    except (*msgspec_errors, TxstoreError):  # values of other sizes: the general path says
        return None
    kind = type(one)
    number = _NUMBER_TAGS.get(int(first[0])) if kind is int or kind is float else None
    if kind is bytes or kind is str:
        payload = len(one) if kind is bytes else len(one.encode())
    elif kind is np.ndarray and one.dtype.kind in "biuf":
        payload = one.nbytes
    elif number is not None:  # ints or floats all of one width: a tag, then big-endian bytes
        payload = number.itemsize
    else:
        return None
    skip = size - payload
    if skip <= 0 or payload == 0:
        return None
    if number is not None:
        return _numbers_array(blocks, first[:skip], number)
    heads = [rows[..., :skip].reshape(-1, skip) for rows in blocks]
    if not (np.concatenate(heads) == first[:skip]).all():
        return None
    counts = [rows.size // size for rows in blocks]
    total = sum(counts)
    # Into a buffer of Arrow's memory pool, which keeps the pages a dropped batch freed for
    # the next one: a fresh numpy array of this size is a new mapping, faulted in page by
    # page, each chunk of a scan.
    buffer = pa.allocate_buffer(total * payload)
    out = np.frombuffer(buffer, dtype=np.uint8).reshape(total, payload)
    if all(rows.ndim == 2 for rows in blocks):
        np.concatenate([rows[:, skip:] for rows in blocks], out=out)
    else:  # runs of blocks, each copied in one call
        at = 0
        for rows, count in zip(blocks, counts, strict=True):
            np.copyto(out[at : at + count].reshape(*rows.shape[:-1], payload), rows[..., skip:])
            at += count
    if kind is np.ndarray:
        values = out.reshape(-1).view(one.dtype)
        if one.dtype.byteorder == ">":
            values = values.astype(one.dtype.newbyteorder("="))
        return _tensor(values, (total, *one.shape))
    large = total * payload > 2**31 - 1
    offsets_out = np.arange(total + 1, dtype=np.int64 if large else np.int32) * payload
    if kind is bytes:
        arrow_type = pa.large_binary() if large else pa.binary()
    else:
        arrow_type = pa.large_string() if large else pa.string()
    buffers = [None, pa.py_buffer(offsets_out), buffer]
    return pa.Array.from_buffers(arrow_type, total, buffers, null_count=0)


def _numbers_array(
    blocks: list[np.ndarray[Any, Any]], head: np.ndarray[Any, Any], number: np.dtype[Any]
) -> Any:
    """``rows_array`` of ints or floats of one width: each row ``head`` (a tag), then the
    number big-endian. Read through a record view of the rows (a field of 1 to 8 bytes at a
    stride of 2 to 9): numpy copies narrow rows of a 2-d array a byte at a time."""
    record = np.dtype([("head", np.uint8, (len(head),)), ("value", number)])
    views = [np.ascontiguousarray(rows).reshape(-1).view(record) for rows in blocks]
    if not (np.concatenate([view["head"] for view in views]) == head).all():
        return None
    got = np.concatenate([view["value"] for view in views])
    if number.kind == "f":
        return pa.array(got.astype(np.float64))
    if number == np.dtype(">u8") and len(got) and int(got.max()) > 2**63 - 1:
        return None  # beyond int64: the general path says
    return pa.array(got.astype(np.int64))


def _locate_values(
    frames: list[tuple[int, memoryview | None, bool]],
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
    """The frames joined, and where each value starts and ends in them, from each frame's
    table of offsets (its last 4 bytes per value), for all blocks at once; None if a table
    points outside its frame's values."""
    raws = [raw for _, raw, _ in frames]
    counts = np.array([n for n, _, _ in frames], dtype=np.int64)
    sizes = np.array([len(raw) for raw in raws], dtype=np.int64)  # type: ignore[arg-type]
    joined = np.frombuffer(b"".join(raws), dtype=np.uint8)  # type: ignore[arg-type]
    frame_starts = np.zeros(len(raws), dtype=np.int64)
    np.cumsum(sizes[:-1], out=frame_starts[1:])
    tables = frame_starts + sizes - 4 * counts  # where each frame's table starts
    if (tables < frame_starts).any():
        return None
    block = np.repeat(np.arange(len(raws)), counts)
    firsts = np.cumsum(counts) - counts  # the number of each block's first value
    entry = tables[block] + 4 * (np.arange(len(block)) - firsts[block])
    offsets = joined[entry[:, None] + np.arange(4)].view("<u4").reshape(-1).astype(np.int64)
    starts = frame_starts[block] + offsets
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    filled = counts > 0
    ends[(firsts + counts - 1)[filled]] = tables[filled]  # a block's last value ends at its table
    if ((starts < frame_starts[block]) | (ends > tables[block]) | (ends < starts)).any():
        return None
    return joined, starts, ends


def column_array(
    frames: list[tuple[int, memoryview | None, bool]], name: str, decoder: Any
) -> pa.Array:
    """One column of a chunk's blocks: per block its sample count and its frame's raw bytes
    (None where the block has no such column) and whether the frame is sparse."""
    if all(raw is not None and not sparse for _, raw, sparse in frames):
        uniform = _uniform_array(frames, decoder)
        if uniform is not None:
            return uniform
        located = _locate_values(frames)
        if located is None:
            raise CorruptError("a frame's offset table points outside its values")
        body, all_starts, ends = located
        found = _fast_array(body, all_starts, ends, decoder)
        if found is not None:
            return found
    values: list[Any] = []
    for n, raw, sparse in frames:
        if raw is None:
            values += [None] * n
            continue
        table = len(raw) - 4 * n
        got = decoder.decode_sparse(raw[:table]) if sparse else decoder.decode_list(raw[:table])
        if sparse:
            got = [None if v is ABSENT else v for v in got]
        values += got
    return py_array(values, name)


def record_batch(names: list[str], columns: list[list[Any]]) -> pa.RecordBatch:
    """Python values by column (None for a sample without the field) as one RecordBatch,
    typed as ``Snapshot.to_batches`` types them."""
    arrays = [py_array(values, name) for name, values in zip(names, columns, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=names)
