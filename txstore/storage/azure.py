"""Azure Blob Storage through adlfs's client, with ETag conditions for the commit step.

adlfs resolves the account and credentials from its usual options (``account_name=``,
``account_key=``, ``connection_string=``, ``sas_token=``, ``credential=``, service principal,
the ``AZURE_STORAGE_*`` variables ...); the calls themselves go to the Azure SDK's blob client
it builds, because adlfs has no compare-and-swap: put-if-absent is an upload with
``If-None-Match: *`` (``overwrite=False``), compare-and-swap one with ``If-Match: <etag>``.
Failures are classified on the HTTP status and the service's error code.

Options the SDK takes per request, not adlfs per filesystem: ``retry_total``,
``retry_connect``, ``retry_read`` and ``retry_status`` are applied to every request of the
store (adlfs never sees them), as are adlfs's own ``timeout``, ``connection_timeout`` and
``read_timeout``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import adlfs
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError

from ..errors import AlreadyExistsError, NotFoundError, RefChangedError, StorageError
from .aio import LoopReads, PutFailed, hand_over, run
from .base import Data, FileInfo, Storage, join

_T = TypeVar("_T")

#: Settings of each request (the SDK's per-operation keywords), not of the filesystem.
_RETRY_OPTIONS = ("retry_total", "retry_connect", "retry_read", "retry_status")
_TIMEOUT_OPTIONS = ("timeout", "connection_timeout", "read_timeout")

SCHEMES = ("az://", "abfs://", "abfss://")


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(exc, HttpResponseError) and isinstance(status, int) else None


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "error_code", "") or "")


class AzureStorage(LoopReads, Storage):
    range_merge_gap = 256 * 1024  # a GET costs a round trip, as on S3
    max_in_flight = 16

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.storage_options = dict(storage_options or {})
        options = dict(self.storage_options)
        # Numbers may come as text (``txstore --storage-option retry_total=0``).
        self._per_request: dict[str, Any] = {
            k: int(options.pop(k)) for k in _RETRY_OPTIONS if k in options
        }
        for k in _TIMEOUT_OPTIONS:  # the server's timeout is whole seconds, the client's not
            if k in options:
                number = int(options[k]) if k == "timeout" else float(options[k])
                options[k] = self._per_request[k] = number
        # Fresh answers matter more than saved round trips: no instance or listings cache.
        self._fs = adlfs.AzureBlobFileSystem(
            skip_instance_cache=True, use_listings_cache=False, **options
        )
        root = self.uri.split("://", 1)[1]
        self._container_name, _, prefix = root.partition("/")
        self._prefix = f"{prefix}/" if prefix else ""
        self._container = self._fs.service_client.get_container_client(self._container_name)

    @property
    def endpoint(self) -> str:
        # The blob service the SDK talks to (an account's, or Azurite's), whatever options
        # named it: a connection string, an account name, an account URL.
        return str(self._fs.service_client.url).rstrip("/")

    def _name(self, key: str) -> str:
        return self._prefix + key

    def _run(self, make: Callable[[], Awaitable[_T]]) -> _T:
        return run(self._fs.loop, make)

    def _fail(self, action: str, key: str, exc: Exception) -> Exception:
        if _status(exc) == 404:
            return NotFoundError(f"{self.uri}/{key} does not exist")
        return StorageError(f"cannot {action} {self.uri}/{key}: {exc}")

    async def _get(
        self, key: str, offset: int | None = None, length: int | None = None
    ) -> tuple[bytes, str]:
        blob = self._container.get_blob_client(self._name(key))
        stream = await blob.download_blob(offset=offset, length=length, **self._per_request)
        data: bytes = await stream.readall()
        # The SDK pins every part of a download to the ETag of its first reply.
        return data, str(stream.properties.etag)

    def _download(
        self, key: str, offset: int | None = None, length: int | None = None
    ) -> tuple[bytes, str]:
        return self._run(lambda: self._get(key, offset, length))

    async def _read_range(self, key: str, start: int, end: int) -> bytes:
        try:
            return (await self._get(key, start, end - start))[0]
        except Exception as e:
            if _status(e) == 416:  # the range starts at or past the end of the blob
                return b""
            raise self._fail("read", key, e) from e

    async def _read_range_into(
        self, key: str, start: int, end: int, put: Callable[[int, list[bytes]], None]
    ) -> None:
        """The range's chunks as the SDK holds them (``chunks()``), each handed to ``put``:
        ``readall`` would copy them into a buffer and out again."""
        offset = start
        try:
            blob = self._container.get_blob_client(self._name(key))
            stream = await blob.download_blob(offset=start, length=end - start, **self._per_request)
            async for piece in stream.chunks():
                await hand_over(put, offset, [piece])
                offset += len(piece)
        except PutFailed:
            raise
        except Exception as e:
            if _status(e) != 416:  # 416: the range starts at or past the end of the blob
                raise self._fail("read", key, e) from e

    def read(self, key: str) -> bytes:
        try:
            return self._download(key)[0]
        except Exception as e:
            raise self._fail("read", key, e) from e

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return self._empty_range(key)
        return self._run(lambda: self._read_range(key, start, end))

    async def _aread(self, key: str) -> bytes:
        try:
            return (await self._get(key))[0]
        except Exception as e:
            raise self._fail("read", key, e) from e

    def _upload(self, key: str, data: bytes, **condition: Any) -> None:
        blob = self._container.get_blob_client(self._name(key))
        options = dict(self._per_request, **condition)
        self._run(lambda: blob.upload_blob(data, **options))

    def write(self, key: str, data: Data) -> None:
        try:
            self._upload(key, join(data), overwrite=True)
        except Exception as e:
            raise self._fail("write", key, e) from e

    def put_if_absent(self, key: str, data: bytes) -> None:
        try:
            # ``overwrite=False`` is ``If-None-Match: *`` (on a block-list commit too).
            self._upload(key, data, overwrite=False)
        except Exception as e:
            status = _status(e)
            if status == 412 or (status == 409 and _code(e) == "BlobAlreadyExists"):
                raise AlreadyExistsError(f"{self.uri}/{key} exists") from e
            # Another 409 (a lease), 5xx, timeouts: the outcome is unknown.
            raise StorageError(f"cannot publish {self.uri}/{key}: {e}") from e

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        try:
            return self._download(key)
        except Exception as e:
            raise self._fail("read", key, e) from e

    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        # Not ``etag="*"`` with ``IfMissing``: the SDK refuses that pair; overwrite=False is it.
        condition: dict[str, Any] = {"overwrite": False}
        if token is not None:
            condition = {"overwrite": True, "etag": token}
            condition["match_condition"] = MatchConditions.IfNotModified
        try:
            self._upload(key, data, **condition)
        except Exception as e:
            status = _status(e)
            if (
                status == 412
                or (status == 409 and _code(e) == "BlobAlreadyExists")
                or (status == 404 and token is not None)
            ):
                raise RefChangedError(f"{self.uri}/{key} changed since it was read") from e
            raise StorageError(f"cannot write {self.uri}/{key}: {e}") from e

    def exists(self, key: str) -> bool:
        blob = self._container.get_blob_client(self._name(key))
        try:
            self._run(lambda: blob.get_blob_properties(**self._per_request))
        except Exception as e:
            if _status(e) == 404:
                return False
            raise StorageError(f"cannot check {self.uri}/{key}: {e}") from e
        return True

    def list(self, prefix: str) -> Iterator[FileInfo]:
        container, options = self._container, self._per_request

        async def listing() -> list[FileInfo]:
            found = []
            pages = container.list_blobs(name_starts_with=self._name(prefix), **options)
            async for blob in pages:
                modified = blob.last_modified
                mtime = modified.timestamp() if modified is not None else 0.0
                found.append(FileInfo(blob.name[len(self._prefix) :], int(blob.size), mtime))
            return found

        try:
            found = self._run(listing)
        except Exception as e:
            if _status(e) == 404 and _code(e) == "ContainerNotFound":
                return
            raise StorageError(f"cannot list {self.uri}/{prefix}: {e}") from e
        yield from sorted(found)

    def delete(self, key: str) -> None:
        blob = self._container.get_blob_client(self._name(key))
        try:
            self._run(lambda: blob.delete_blob(**self._per_request))
        except Exception as e:
            if _status(e) != 404:
                raise StorageError(f"cannot delete {self.uri}/{key}: {e}") from e
