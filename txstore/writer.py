"""Streams samples into chunk files: encodes on the caller's thread, uploads on another."""

from __future__ import annotations

import contextlib
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .errors import TxstoreError
from .format.builder import ChunkBuilder
from .format.codec import FrameCompressor
from .format.manifest import ChunkRef, StoreConfig
from .storage import Storage

#: Chunks built but not yet stored; bounds memory to a few chunks whatever the input size.
MAX_PENDING_UPLOADS = 4
#: Upload threads: while some wait for their chunk's fsync (or an S3 PUT), another writes the
#: next chunk. Measured (W2 append, 2 GB): 1 thread 1.3-1.4 s, 2 threads 1.2-1.4 s, 4 threads
#: 0.94-1.18 s, as fast as one plain file written and fsynced once; concurrent fsyncs overlap.
UPLOAD_THREADS = 4
#: Samples of a list handed to the builder at once.
MAX_BATCH = 256


def new_chunk_key() -> str:
    return f"chunks/{uuid.uuid4().hex}.chunk"


class ChunkWriter:
    """Writes the chunks of one transaction; ``abort`` deletes what it wrote."""

    def __init__(self, storage: Storage, config: StoreConfig) -> None:
        self._storage = storage
        self._config = config
        self._compressor = FrameCompressor(config.compression, config.compression_level)
        self._builder = self._new_builder()
        self._uploads: deque[Future[ChunkRef]] = deque()
        self._pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="txstore-upload")
        self._refs: list[ChunkRef] = []
        self._keys: list[str] = []
        self.num_samples = 0

    def _new_builder(self) -> ChunkBuilder:
        return ChunkBuilder(block_bytes=self._config.block_bytes, compressor=self._compressor)

    def write(self, samples: Iterable[Any]) -> None:
        """Add samples; raises EncodeError naming the sample's position and key.

        A list or tuple goes to the builder in slices, checked a slice at a time. Any other
        iterable is taken one sample at a time, each added before the next is taken: a source
        may reuse its dicts or buffers, and a caller that catches an EncodeError may go on
        with the same iterator from just past the refused sample."""
        if isinstance(samples, (list, tuple)):
            self._write_sequence(samples)
            return
        source = iter(samples)
        limit = self._config.chunk_bytes
        while True:
            builder = self._builder
            before = builder.num_samples
            try:
                added = builder.add_from(source, self.num_samples, limit)
            finally:
                self.num_samples += builder.num_samples - before
            if added == 0 or builder.size < limit:
                return  # the source ended
            self._flush()

    def _write_sequence(self, samples: Sequence[Any]) -> None:
        limit = self._config.chunk_bytes
        start = 0
        while start < len(samples):
            builder = self._builder
            before = builder.num_samples
            try:
                builder.add_many(samples[start : start + MAX_BATCH], self.num_samples, limit)
            finally:
                added = builder.num_samples - before
                self.num_samples += added
                start += added
            if builder.size >= limit:
                self._flush()

    def _flush(self) -> None:
        builder, self._builder = self._builder, self._new_builder()
        if not builder.num_samples:
            return
        builder.end_block()  # compress here: the compressor is not shared across threads
        key = new_chunk_key()
        self._keys.append(key)
        while len(self._uploads) >= MAX_PENDING_UPLOADS:
            self._refs.append(self._uploads.popleft().result())
        # The builder is this upload's alone now: it checksums and writes there while this
        # thread encodes the next chunk.
        self._uploads.append(self._pool.submit(self._upload, key, builder))

    def _upload(self, key: str, builder: ChunkBuilder) -> ChunkRef:
        built = builder.finish()
        self._storage.write(key, built)
        return ChunkRef(
            path=key,
            num_samples=built.num_samples,
            size=built.size,
            crc32=built.crc32,
            footer_offset=built.footer_offset,
        )

    def finish(self) -> list[ChunkRef]:
        """Store the last chunk and wait for every upload; the refs in sample order."""
        self._flush()
        while self._uploads:
            self._refs.append(self._uploads.popleft().result())
        self._pool.shutdown()
        return self._refs

    def abort(self) -> None:
        """Delete every chunk this writer stored: only for a transaction known not committed."""
        for upload in self._uploads:
            with contextlib.suppress(Exception):
                upload.result()
        self._uploads.clear()
        self._pool.shutdown()
        for key in self._keys:
            with contextlib.suppress(TxstoreError):
                self._storage.delete(key)
