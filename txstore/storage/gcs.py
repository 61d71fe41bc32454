"""Google Cloud Storage through gcsfs, with generation preconditions for the commit step.

Objects that decide a commit are written in one multipart upload (``uploadType=multipart``)
with ``ifGenerationMatch``: 0 for put-if-absent, the generation read for a compare-and-swap.
Real GCS honours preconditions on every upload type, but fake-gcs-server (the emulator the
tests run against) honours them on multipart uploads only, and gcsfs's ``open("xb")`` goes
resumable: one call that is safe on both. Failures are classified on the HTTP status.

Requests go through gcsfs's session, credentials and retries (``token=``, ``project=``,
``endpoint_url=`` ... are gcsfs's own options), to the JSON API endpoints of its ``_call``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from urllib.parse import quote

import gcsfs
from gcsfs.retry import HttpError

from ..errors import AlreadyExistsError, NotFoundError, RefChangedError, StorageError
from .aio import LoopReads, run
from .base import Data, FileInfo, Storage, join


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind a gcsfs error (gcsfs turns 404 and 412 into builtins)."""
    if isinstance(exc, FileNotFoundError):
        return 404
    if isinstance(exc, FileExistsError):
        return 412
    if isinstance(exc, HttpError) and isinstance(exc.code, int):
        return exc.code
    return None


def _mtime(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    # RFC 3339 with a "Z"; Python 3.10's fromisoformat wants an offset.
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class GcsStorage(LoopReads, Storage):
    range_merge_gap = 256 * 1024  # a GET costs a round trip, as on S3
    max_in_flight = 16

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.storage_options = dict(storage_options or {})
        # Fresh answers matter more than saved round trips: no instance or listings cache.
        self._fs = gcsfs.GCSFileSystem(
            skip_instance_cache=True, use_listings_cache=False, **self.storage_options
        )
        root = self.uri.split("://", 1)[1]
        self._bucket, _, prefix = root.partition("/")
        self._prefix = f"{prefix}/" if prefix else ""

    @property
    def endpoint(self) -> str:
        # gcsfs's resolved endpoint: its option, the emulator's environment variable, or
        # Google's own.
        return str(self._fs._location).rstrip("/")

    def _name(self, key: str) -> str:
        return self._prefix + key

    def _media(self, key: str) -> str:
        return self._fs.url(f"{self._bucket}/{self._name(key)}")  # type: ignore[no-any-return]

    def _fail(self, action: str, key: str, exc: Exception) -> Exception:
        if _status(exc) == 404:
            return NotFoundError(f"{self.uri}/{key} does not exist")
        return StorageError(f"cannot {action} {self.uri}/{key}: {exc}")

    def _get(self, key: str, start: int | None = None, end: int | None = None) -> tuple[Any, bytes]:
        headers = {} if start is None else {"Range": f"bytes={start}-{max(start, end or 0) - 1}"}
        result: tuple[Any, bytes] = self._fs.call("GET", self._media(key), headers=headers)
        return result

    def read(self, key: str) -> bytes:
        try:
            return self._get(key)[1]
        except Exception as e:
            raise self._fail("read", key, e) from e

    async def _read_range(self, key: str, start: int, end: int) -> bytes:
        headers = {"Range": f"bytes={start}-{end - 1}"}
        try:
            media = self._media(key)
            found: tuple[Any, bytes] = await self._fs._call("GET", media, headers=headers)
        except Exception as e:
            if _status(e) == 416:  # the range starts at or past the end of the object
                return b""
            raise self._fail("read", key, e) from e
        return found[1]

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return self._empty_range(key)
        return run(self._fs.loop, lambda: self._read_range(key, start, end))

    async def _aread(self, key: str) -> bytes:
        try:
            found: tuple[Any, bytes] = await self._fs._call("GET", self._media(key))
        except Exception as e:
            raise self._fail("read", key, e) from e
        return found[1]

    def write(self, key: str, data: Data) -> None:
        try:
            # gcsfs: one multipart upload for small objects, a resumable one for large ones.
            self._fs.pipe_file(f"{self._bucket}/{self._name(key)}", join(data))
        except Exception as e:
            raise self._fail("write", key, e) from e

    def _upload_if_generation(self, key: str, data: bytes, generation: str) -> None:
        """One multipart upload, applied only if the object's generation is ``generation``
        (``"0"``: only if there is no object)."""
        boundary = uuid.uuid4().hex  # never inside the body: it is random per request
        meta = json.dumps({"name": self._name(key)})
        body = b"".join(
            [
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
                meta.encode(),
                f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
                data,
                f"\r\n--{boundary}--\r\n".encode(),
            ]
        )
        url = f"{self._fs._location}/upload/storage/v1/b/{quote(self._bucket, safe='')}/o"
        self._fs.call(
            "POST",
            url,
            uploadType="multipart",
            # The name in the query too (it must equal the metadata's): a request names its
            # object in its URL, for logs and proxies.
            name=self._name(key),
            ifGenerationMatch=generation,
            headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
            data=body,
        )

    def put_if_absent(self, key: str, data: bytes) -> None:
        try:
            self._upload_if_generation(key, data, "0")
        except Exception as e:
            if _status(e) == 412:
                raise AlreadyExistsError(f"{self.uri}/{key} exists") from e
            # 5xx, timeouts, a lost connection: the outcome is unknown.
            raise StorageError(f"cannot publish {self.uri}/{key}: {e}") from e

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        try:
            headers, data = self._get(key)
        except Exception as e:
            raise self._fail("read", key, e) from e
        # The generation of the very bytes returned: one response carries both.
        generation = headers.get("x-goog-generation")
        if not generation:
            raise StorageError(f"cannot read {self.uri}/{key}: the reply names no generation")
        return data, str(generation)

    def compare_and_swap(self, key: str, data: bytes, token: str | None) -> None:
        try:
            self._upload_if_generation(key, data, "0" if token is None else token)
        except Exception as e:
            status = _status(e)
            if status == 412 or (status == 404 and token is not None):
                raise RefChangedError(f"{self.uri}/{key} changed since it was read") from e
            raise StorageError(f"cannot write {self.uri}/{key}: {e}") from e

    def exists(self, key: str) -> bool:
        try:
            self._fs.call("GET", "b/{}/o/{}", self._bucket, self._name(key), fields="name")
        except Exception as e:
            if _status(e) == 404:
                return False
            raise StorageError(f"cannot check {self.uri}/{key}: {e}") from e
        return True

    def list(self, prefix: str) -> Iterator[FileInfo]:
        found: list[FileInfo] = []
        token: str | None = None
        try:
            while True:
                page = self._fs.call(
                    "GET",
                    "b/{}/o",
                    self._bucket,
                    prefix=self._name(prefix),
                    pageToken=token,
                    fields="items(name,size,updated),nextPageToken",
                    json_out=True,
                )
                for item in page.get("items", []):
                    key, size = item["name"][len(self._prefix) :], int(item.get("size", 0))
                    found.append(FileInfo(key, size, _mtime(item.get("updated"))))
                token = page.get("nextPageToken")
                if not token:
                    break
        except Exception as e:
            if _status(e) == 404:  # no bucket: nothing under the prefix
                return
            raise StorageError(f"cannot list {self.uri}/{prefix}: {e}") from e
        yield from sorted(found)

    def delete(self, key: str) -> None:
        try:
            self._fs.call("DELETE", "b/{}/o/{}", self._bucket, self._name(key))
        except Exception as e:
            if _status(e) != 404:
                raise StorageError(f"cannot delete {self.uri}/{key}: {e}") from e
