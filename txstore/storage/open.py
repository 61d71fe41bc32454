"""The backend for a URI."""

from __future__ import annotations

import os
from typing import Any

from .base import Storage
from .local import LocalStorage
from .memory import MemoryStorage


def open_storage(
    uri: str | os.PathLike[str] | Storage, storage_options: dict[str, Any] | None = None
) -> Storage:
    """The backend for a URI: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``az://container/prefix`` (or ``abfs://``), ``memory://name``, or a local path.

    ``storage_options`` go to the remote backend's fsspec filesystem (s3fs, gcsfs, adlfs).
    """
    if isinstance(uri, Storage):
        return uri
    text = os.fspath(uri)
    if text.startswith("s3://"):
        from .s3 import S3Storage  # s3fs is imported only for S3 stores

        return S3Storage(text, storage_options)
    if text.startswith(("gs://", "gcs://")):
        from .gcs import GcsStorage  # gcsfs is imported only for GCS stores

        return GcsStorage(text, storage_options)
    if text.startswith(("az://", "abfs://", "abfss://")):
        from .azure import AzureStorage  # adlfs and the Azure SDK only for Azure stores

        return AzureStorage(text, storage_options)
    if storage_options:
        raise ValueError(f"storage_options only apply to remote stores, not {text!r}")
    if text.startswith("memory://"):
        return MemoryStorage(text.removeprefix("memory://"))
    if text.startswith("file://"):
        text = text.removeprefix("file://")
    elif "://" in text:
        raise ValueError(
            f"unsupported store URI {text!r}: use a path, s3://, gs://, az://, abfs:// or memory://"
        )
    return LocalStorage(text)


__all__ = ["open_storage"]
