"""Streams samples into chunk files: encodes on the caller's thread, uploads on another."""

from __future__ import annotations

import contextlib
import uuid
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
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
#: Samples handed to the builder at once (see ``ChunkWriter._batch_size``).
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
        self._sample_bytes = 0.0  # the last full chunk's bytes a sample

    def _new_builder(self) -> ChunkBuilder:
        return ChunkBuilder(block_bytes=self._config.block_bytes, compressor=self._compressor)

    def write(self, samples: Iterable[Any]) -> None:
        """Add samples; raises EncodeError naming the sample's position and key."""
        source = iter(samples)
        limit = self._config.chunk_bytes
        while True:
            builder = self._builder
            batch: list[Any] = []
            try:
                batch.extend(islice(source, self._batch_size(builder, limit)))
            finally:  # what the source gave before it raised is added all the same
                if batch:
                    self._add(builder, batch)
            if not batch:
                return
            if builder.size >= limit:
                self._flush()

    def _add(self, builder: ChunkBuilder, batch: list[Any]) -> None:
        before = builder.num_samples
        try:
            builder.add_many(batch, self.num_samples)
        finally:
            self.num_samples += builder.num_samples - before

    def _batch_size(self, builder: ChunkBuilder, limit: int) -> int:
        """Samples to take from the source at once: a list lets the builder check them in a
        few C passes, and stops about where the chunk fills up (it may pass the limit by one
        sample, as adding one at a time does)."""
        n = builder.num_samples
        sample_bytes = builder.size / n if n else self._sample_bytes
        if sample_bytes <= 0:
            return 1
        return max(1, min(MAX_BATCH, int((limit - builder.size) / sample_bytes)))

    def _flush(self) -> None:
        builder, self._builder = self._builder, self._new_builder()
        if not builder.num_samples:
            return
        self._sample_bytes = builder.size / builder.num_samples
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
