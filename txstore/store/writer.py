"""Streams samples into chunk files: encodes on the caller's thread, stores on others."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from ..errors import TxstoreError
from ..format.builder import ChunkBuilder
from ..format.chunkfile import BuiltChunk, ChunkStream
from ..format.codec import FrameCompressor
from ..format.columnar import ColumnBatch, peek_columns
from ..format.manifest import ChunkRef, StoreConfig
from ..storage import Storage

#: Chunks built but not yet stored; bounds memory to a few chunks whatever the input size.
#: Each is stored by a thread of the writer's own, and one more stores the chunk being built:
#: while some wait for their chunk's fsync (or an S3 PUT), another writes. Four keep large
#: appends as fast as one plain file written and fsynced once (bench/bench_append.py).
MAX_PENDING_UPLOADS = 4
#: Samples of a list handed to the builder at once.
MAX_BATCH = 256
#: Bytes a chunk grows by between hand-offs to the thread that stores it while it is built.
#: Its first bytes reach the disk soon after the append starts, not once a whole chunk is
#: encoded. At each hand-off the encoding thread lets go of the GIL for a moment: otherwise
#: upload threads, which need it back after every write call, wait for the interpreter's
#: switch interval each time, fall behind, and finish after the encoding does.
STREAM_BYTES = 1 << 20
#: How often a thread waiting for more of a chunk checks that its writer still exists.
_OWNER_CHECK_S = 0.5
_ABORT = object()


def new_chunk_key() -> str:
    return f"chunks/{uuid.uuid4().hex}.chunk"


class _WriterGone(Exception):
    """The writer of a chunk being stored aborted, or was dropped, before finishing it."""


class _StreamedUpload:
    """A chunk being stored by an upload thread while the writer still builds it: the writer
    puts frame counts (how far the thread may write), then the BuiltChunk (the rest)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.marks: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.future: Future[ChunkRef] = Future()


def _store_streamed(
    storage: Storage,
    upload: _StreamedUpload,
    stream: ChunkStream,
    owner: weakref.ref[ChunkWriter],
) -> ChunkRef:
    built: list[BuiltChunk] = []

    def pieces() -> Iterator[bytes | memoryview]:
        while True:
            try:
                mark = upload.marks.get(timeout=_OWNER_CHECK_S)
            except queue.Empty:  # a writer dropped without finish() or abort(): give up
                if owner() is None:
                    raise _WriterGone(upload.key) from None
                continue
            if isinstance(mark, int):
                yield from stream.pieces(mark)
            elif isinstance(mark, BuiltChunk):
                built.append(mark)
                yield from mark
                return
            else:
                raise _WriterGone(upload.key)

    storage.write(upload.key, pieces())
    (chunk,) = built
    return ChunkRef(
        path=upload.key,
        num_samples=chunk.num_samples,
        size=chunk.size,
        crc32=chunk.crc32,
        footer_offset=chunk.footer_offset,
        digest=chunk.digest,
    )


def _run(future: Future[ChunkRef], fn: Callable[..., ChunkRef], args: tuple[Any, ...]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args))
    except BaseException as e:  # for whoever waits on the future
        future.set_exception(e)


_Job = tuple[Future[ChunkRef], Callable[..., ChunkRef], tuple[Any, ...]]


class _Uploaders:
    """A writer's upload threads, started as uploads first need them (never more than the
    uploads in flight at once) and reused for every later chunk. Daemons, as a writer left
    unfinished at interpreter exit must not keep it waiting; each stops at ``close``, or once
    its writer is gone."""

    def __init__(self, limit: int, owner: weakref.ref[ChunkWriter]) -> None:
        self._limit = limit
        self._owner = owner
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._submitted = 0

    def submit(self, job: _Job) -> None:
        self._submitted += 1
        # At most ``limit`` uploads are in flight (the writer waits before starting more),
        # so ``limit`` threads take each job as it comes.
        if len(self._threads) < min(self._limit, self._submitted):
            thread = threading.Thread(target=self._work, name="txstore-upload", daemon=True)
            thread.start()  # raises before the job is queued: the caller ends its future
            self._threads.append(thread)
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=_OWNER_CHECK_S)
            except queue.Empty:
                if self._owner() is None:
                    return
                continue
            if job is None:
                return
            _run(*job)
            del job  # the finished chunk's buffers go now, not at the next job

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        self._threads = []


class ChunkWriter:
    """Writes the chunks of one transaction; ``abort`` deletes what it wrote."""

    def __init__(self, storage: Storage, config: StoreConfig) -> None:
        self._storage = storage
        self._config = config
        self._compressor = FrameCompressor(config.compression, config.compression_level)
        self._builder = self._new_builder()
        self._streaming: _StreamedUpload | None = None  # the chunk being built, if stored yet
        self._uploads: deque[Future[ChunkRef]] = deque()  # built chunks, in order
        self._refs: list[ChunkRef] = []
        self._keys: list[str] = []
        self.num_samples = 0
        self.closed = False  # finished or aborted
        self._uploaders = _Uploaders(MAX_PENDING_UPLOADS + 1, weakref.ref(self))

    def _new_builder(self) -> ChunkBuilder:
        return ChunkBuilder(block_bytes=self._config.block_bytes, compressor=self._compressor)

    def _limit(self, builder: ChunkBuilder) -> int:
        """Where the builder stops next: the chunk's end, or the next hand-off before it."""
        return min(self._config.chunk_bytes, builder.size + STREAM_BYTES)

    def write(self, samples: Iterable[Any]) -> None:
        """Add samples; raises EncodeError naming the sample's position and key.

        A list or tuple goes to the builder in slices, checked a slice at a time. Any other
        iterable is taken one sample at a time, each added before the next is taken: a source
        may reuse its dicts or buffers, and a caller that catches an EncodeError may go on
        with the same iterator from just past the refused sample.

        Columns (``columnar.as_columns``: a pyarrow Table or RecordBatch, an iterable of
        them, a pandas DataFrame, a dict of equal-length columns) are added a column at a
        time."""
        batches, samples = peek_columns(samples, self.num_samples)
        if batches is not None:
            for batch in batches:
                self._write_columns(batch)
            return
        if isinstance(samples, (list, tuple)):
            self._write_sequence(samples)
            return
        source = iter(samples)
        while True:
            builder = self._builder
            limit = self._limit(builder)
            before = builder.num_samples
            try:
                added = builder.add_from(source, self.num_samples, limit)
            finally:
                self.num_samples += builder.num_samples - before
            if added == 0 or builder.size < limit:
                return  # the source ended
            self._hand_off()

    def _write_columns(self, batch: ColumnBatch) -> None:
        start = 0
        while start < batch.num_rows:
            builder = self._builder
            limit = self._limit(builder)
            added = builder.add_columns(batch, start, self.num_samples, limit)
            self.num_samples += added
            start += added
            if builder.size >= limit:
                self._hand_off()

    def _write_sequence(self, samples: Sequence[Any]) -> None:
        start = 0
        while start < len(samples):
            builder = self._builder
            limit = self._limit(builder)
            before = builder.num_samples
            try:
                builder.add_many(samples[start : start + MAX_BATCH], self.num_samples, limit)
            finally:
                added = builder.num_samples - before
                self.num_samples += added
                start += added
            if builder.size >= limit:
                self._hand_off()

    def _hand_off(self) -> None:
        """The builder reached its limit: store the full chunk, or what is sealed of it."""
        if self._builder.size >= self._config.chunk_bytes:
            self._flush()
            return
        upload = self._streaming or self._start_upload()
        if upload.future.done():  # it failed (a full disk): say so now, not at the end
            upload.future.result()
        self._collect_stored()
        upload.marks.put(self._builder.sealed_frames)
        time.sleep(0)  # let the upload threads waiting for the GIL take it now

    def _collect_stored(self) -> None:
        """Take the refs of built chunks stored by now, raising the first failure."""
        while self._uploads and self._uploads[0].done():
            self._refs.append(self._uploads.popleft().result())

    def _start_upload(self) -> _StreamedUpload:
        self._collect_stored()
        while len(self._uploads) >= MAX_PENDING_UPLOADS:
            self._refs.append(self._uploads.popleft().result())
        upload = _StreamedUpload(new_chunk_key())
        self._keys.append(upload.key)
        # The upload gets the writer weakly, so that a writer dropped mid-chunk is collected
        # and the upload stops; its temp file is what a crash leaves, which vacuum deletes.
        self._streaming = upload  # abort() finds it from here on
        args = (self._storage, upload, self._builder.stream(), weakref.ref(self))
        try:
            self._uploaders.submit((upload.future, _store_streamed, args))
        except BaseException as e:  # no thread: the future must still end
            upload.future.set_exception(e)
            raise
        return upload

    def _flush(self) -> None:
        if not self._builder.num_samples:
            return
        builder = self._builder
        upload = self._streaming or self._start_upload()
        self._builder, self._streaming = self._new_builder(), None
        builder.end_block()  # compress here: the compressor is not shared across threads
        upload.marks.put(builder.finish())
        self._uploads.append(upload.future)

    def finish(self) -> list[ChunkRef]:
        """Store the last chunk and wait for every upload; the refs in sample order."""
        self._flush()
        try:
            while self._uploads:
                self._refs.append(self._uploads.popleft().result())
        finally:
            self._uploaders.close()
        self.closed = True
        return self._refs

    def abort(self) -> None:
        """Delete every chunk this writer stored: only for a transaction known not committed."""
        self.closed = True
        if self._streaming is not None:
            self._streaming.marks.put(_ABORT)
            self._uploads.append(self._streaming.future)
            self._streaming = None
        for upload in self._uploads:
            with contextlib.suppress(Exception):
                upload.result()
        self._uploads.clear()
        self._uploaders.close()
        for key in self._keys:
            with contextlib.suppress(TxstoreError):
                self._storage.delete(key)
