"""Chunk files taken apart and put together again by tests, per docs/format.md §7 and not
through txstore's reader: a footer as a tree of MessagePack values, ``[major, minor,
num_samples, columns, [[num_samples, [frame, ...]], ...]]``, whichever layout the file has
(the packed footer of format 3 or the list of formats 1 and 2), and from major 4 a sixth item
when the file has columns stored apart: ``[[column, [[num_samples, frame], ...], copy], ...]``,
a piece's sample count and frame per piece (§7.6)."""

from __future__ import annotations

import itertools
import struct
import zlib
from typing import Any

import msgspec

TRAILER = struct.Struct("<II8s")
TRAILER_MAGIC = b"TXSCEND\0"


def packed(data: bytes) -> bool:
    """Whether a chunk's header names a major with a packed footer (3 on)."""
    return struct.unpack_from("<H", data, 4)[0] >= 3


def split(data: bytes) -> tuple[bytes, Any]:
    """A chunk's header and frames, and its footer as a tree."""
    length, _, magic = TRAILER.unpack_from(data, len(data) - TRAILER.size)
    assert magic == TRAILER_MAGIC
    start = len(data) - TRAILER.size - length
    footer = msgspec.msgpack.decode(data[start : start + length])
    if packed(data):
        major, minor, num_samples, columns, blocks, starts, ends, frames, *apart = footer
        assert blocks == []
        count = len(ends) // 4
        first = struct.unpack(f"<{count + 1}Q", starts)
        last = (0, *struct.unpack(f"<{count}I", ends))
        listed = [
            [first[k + 1] - first[k], msgspec.msgpack.decode(frames[last[k] : last[k + 1]])]
            for k in range(count)
        ]
        footer = [major, minor, num_samples, columns, listed]
        for column, piece_starts, piece_frames, copy in apart[0] if apart else ():
            footer[5:] = footer[5:] or [[]]
            bounds = struct.unpack(f"<{len(piece_frames) + 1}Q", piece_starts)
            pieces = [[b - a, f] for a, b, f in zip(bounds, bounds[1:], piece_frames, strict=False)]
            footer[5].append([column, pieces, copy])
    return data[:start], footer


def pack(footer: Any) -> Any:
    """A footer tree in the packed layout: each block's count and frames packed as §7.3
    says (a count wraps modulo 2**64, as a crafted file may hold it). A tree whose blocks can
    no longer be packed (a test changed their shape) is returned as it is."""
    try:
        head, blocks, rest = footer[:4], footer[4], footer[5:]
        framed = [msgspec.msgpack.encode(block[1]) for block in blocks]
        starts = itertools.accumulate((block[0] for block in blocks), initial=0)
        ends = list(itertools.accumulate(map(len, framed)))
        if rest:  # the columns stored apart
            rest = [
                [
                    [
                        column,
                        b"".join(
                            struct.pack("<Q", start % 2**64)
                            for start in itertools.accumulate((p[0] for p in pieces), initial=0)
                        ),
                        [p[1] for p in pieces],
                        copy,
                    ]
                    for column, pieces, copy in rest[0]
                ],
                *rest[1:],
            ]
        return [
            *head,
            [],
            b"".join(struct.pack("<Q", start % 2**64) for start in starts),
            struct.pack(f"<{len(ends)}I", *ends),
            b"".join(framed),
            *rest,
        ]
    except (IndexError, KeyError, TypeError, ValueError, OverflowError, struct.error):
        return footer


def seal(body: bytes, footer: Any) -> bytes:
    """A chunk file of ``body`` (header and frames) and ``footer`` (a tree, packed when the
    header's major has a packed footer), with a valid trailer. Raises what msgspec raises for
    a tree it cannot encode."""
    raw = msgspec.msgpack.encode(pack(footer) if packed(body) else footer)
    return body + raw + TRAILER.pack(len(raw), zlib.crc32(raw), TRAILER_MAGIC)
