"""S3 (and S3-compatible servers) through s3fs, with conditional PUTs for the commit step.

Objects that decide a commit are written with ``put_object`` and ``If-None-Match: *`` or
``If-Match: <etag>``, always single-part: s3fs drops ``IfMatch`` on its multipart path and
lets a 0-byte ``"xb"`` write clobber. Failures are classified on the HTTP status, because not
every server names the failed condition in its error body.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import s3fs

from ..errors import AlreadyExistsError, NotFoundError, RefChangedError, StorageError
from .aio import HAND_OVER_BYTES, LoopReads, PutFailed, hand_over, run
from .base import Data, FileInfo, Storage, join

#: Connections the client keeps per endpoint: a chunk streams as several ranged GETs at once,
#: and a DataLoader worker reads two chunks ahead (aiobotocore's own default is 10).
_POOL_CONNECTIONS = 32


#: Times a ranged read whose reply breaks off is asked for (s3fs's own reads: 5).
_READ_ATTEMPTS = 5


async def _received(body: Any) -> AsyncIterator[bytes]:
    """A reply's body in the buffers it arrived in. aiohttp's reader hands each over whole
    (``readchunk``); the body's own ``read(n)`` joins what is buffered into a new one."""
    content: Any = getattr(body.raw_stream, "content", None)
    if not hasattr(content, "readchunk"):  # another HTTP client under aiobotocore
        while piece := await body.read(HAND_OVER_BYTES):
            yield piece
        return
    while True:
        piece, at_chunk_end = await content.readchunk()
        if piece:
            yield piece
        elif not at_chunk_end:  # the end of the body
            return


def _http_status(exc: BaseException) -> int | None:
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
        seen = seen.__cause__ or seen.__context__
    return None


class S3Storage(LoopReads, Storage):
    range_merge_gap = 256 * 1024  # a GET costs a round trip; 256 KiB more costs ~2 ms
    max_in_flight = 16

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.storage_options = dict(storage_options or {})
        options = dict(self.storage_options)
        config = dict(options.pop("config_kwargs", None) or {})
        config.setdefault("max_pool_connections", _POOL_CONNECTIONS)
        # No listings cache: fresh answers matter more than saved round trips. fsspec's
        # instance cache is kept: stores opened with the same options in a process share one
        # client, which holds connections but no answers. A new client costs 100-200 ms
        # before its first request (botocore loads its models and builds its event tables):
        # without the cache, that was most of every open of a store.
        self._fs = s3fs.S3FileSystem(use_listings_cache=False, config_kwargs=config, **options)
        self._root = self.uri.removeprefix("s3://")
        self._bucket, _, self._prefix = self._root.partition("/")

    def _path(self, key: str) -> str:
        return f"{self._root}/{key}"

    def _object_key(self, key: str) -> str:
        return f"{self._prefix}/{key}" if self._prefix else key

    def _fail(self, action: str, key: str, exc: Exception) -> Exception:
        if isinstance(exc, FileNotFoundError) or _http_status(exc) == 404:
            return NotFoundError(f"{self.uri}/{key} does not exist")
        return StorageError(f"cannot {action} {self.uri}/{key}: {exc}")

    async def _aget(self, key: str) -> tuple[bytes, str]:
        """One GetObject: the object and its ETag. (s3fs's ``cat_file`` of a whole object
        sends a HEAD first: a second round trip for every manifest, segment and chunk.)"""
        try:
            response = await self._fs._call_s3(
                "get_object", Bucket=self._bucket, Key=self._object_key(key)
            )
            async with response["Body"] as stream:
                data: bytes = await stream.read()
        except Exception as e:
            raise self._fail("read", key, e) from e
        return data, str(response["ETag"])

    def _get(self, key: str) -> tuple[bytes, str]:
        return run(self._fs.loop, lambda: self._aget(key))

    async def _aread(self, key: str) -> bytes:
        return (await self._aget(key))[0]

    def read(self, key: str) -> bytes:
        return self._get(key)[0]

    async def _read_range(self, key: str, start: int, end: int) -> bytes:
        try:
            data: bytes = await self._fs._cat_file(self._path(key), start=start, end=end)
        except Exception as e:
            raise self._fail("read", key, e) from e
        return data

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return run(self._fs.loop, lambda: self._read_range(key, start, end))

    async def _read_range_into(
        self, key: str, start: int, end: int, put: Callable[[int, list[bytes]], None]
    ) -> None:
        """The reply streamed to ``put`` a megabyte at a time, in the buffers it arrived in:
        a 64 MiB chunk's parts are never joined into buffers of their own (a copy of every
        byte, into fresh memory) before they are written. A reply that breaks off is asked
        for again from its start (``put`` then writes the same bytes again), as s3fs's own
        reads are; the request itself is retried by s3fs."""
        for attempt in range(1, _READ_ATTEMPTS + 1):
            try:
                response = await self._fs._call_s3(
                    "get_object",
                    Bucket=self._bucket,
                    Key=self._object_key(key),
                    Range=f"bytes={start}-{end - 1}",
                )
            except Exception as e:
                raise self._fail("read", key, e) from e
            try:
                async with response["Body"] as body:
                    offset, pieces, held = start, [], 0
                    async for piece in _received(body):
                        pieces.append(piece)
                        held += len(piece)
                        if held >= HAND_OVER_BYTES:
                            await hand_over(put, offset, pieces)
                            offset, pieces, held = offset + held, [], 0
                    if pieces:
                        await hand_over(put, offset, pieces)
                return
            except PutFailed:
                raise
            except Exception as e:  # the reply broke off (a reset, a timeout, cut short)
                if attempt == _READ_ATTEMPTS:
                    raise self._fail("read", key, e) from e
                await asyncio.sleep(0.1 * 2**attempt)

    def write(self, key: str, data: Data) -> None:
        try:
            self._fs.pipe_file(self._path(key), join(data))
        except Exception as e:
            raise self._fail("write", key, e) from e

    def _conditional_put(self, key: str, data: bytes, **condition: str) -> None:
        if not data:
            raise ValueError("conditional writes of empty objects are not safe on s3fs")
        self._fs.call_s3(
            "put_object", Bucket=self._bucket, Key=self._object_key(key), Body=data, **condition
        )

    def put_if_absent(self, key: str, data: bytes) -> None:
        try:
            self._conditional_put(key, data, IfNoneMatch="*")
        except Exception as e:
            if _http_status(e) == 412:
                raise AlreadyExistsError(f"{self.uri}/{key} exists") from e
            # 409 (a concurrent conditional write), 5xx, timeouts: the outcome is unknown.
            raise StorageError(f"cannot publish {self.uri}/{key}: {e}") from e

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        return self._get(key)

    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        condition = {"IfNoneMatch": "*"} if token is None else {"IfMatch": token}
        try:
            self._conditional_put(key, data, **condition)
        except Exception as e:
            status = _http_status(e)
            if status == 412 or (status == 404 and token is not None):
                raise RefChangedError(f"{self.uri}/{key} changed since it was read") from e
            raise StorageError(f"cannot write {self.uri}/{key}: {e}") from e

    def exists(self, key: str) -> bool:
        try:
            self._fs.call_s3("head_object", Bucket=self._bucket, Key=self._object_key(key))
        except Exception as e:
            if isinstance(e, FileNotFoundError) or _http_status(e) == 404:
                return False
            raise StorageError(f"cannot check {self.uri}/{key}: {e}") from e
        return True

    def info(self, key: str) -> FileInfo | None:
        try:
            head = self._fs.call_s3("head_object", Bucket=self._bucket, Key=self._object_key(key))
        except Exception as e:
            if isinstance(e, FileNotFoundError) or _http_status(e) == 404:
                return None
            raise StorageError(f"cannot check {self.uri}/{key}: {e}") from e
        modified = head.get("LastModified")
        mtime = modified.timestamp() if modified is not None else 0.0
        return FileInfo(key, int(head.get("ContentLength", 0)), mtime)

    def list(self, prefix: str) -> Iterator[FileInfo]:
        try:
            found = self._fs.find(self._path(prefix.rpartition("/")[0]), detail=True)
        except FileNotFoundError:
            return
        except Exception as e:
            raise StorageError(f"cannot list {self.uri}/{prefix}: {e}") from e
        for path, info in sorted(found.items()):
            key = path.removeprefix(self._root + "/")
            if key.startswith(prefix):
                modified = info.get("LastModified")
                mtime = modified.timestamp() if modified is not None else 0.0
                yield FileInfo(key, int(info.get("size", 0)), mtime)

    def delete(self, key: str) -> None:
        try:
            self._fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass
        except Exception as e:
            raise StorageError(f"cannot delete {self.uri}/{key}: {e}") from e
