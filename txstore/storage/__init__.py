"""Bytes <-> a backend: local folder, memory, S3, GCS or Azure Blob."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import TEMP_PREFIX, FileInfo, Storage
from .local import LocalStorage
from .memory import MemoryStorage
from .open import open_storage

if TYPE_CHECKING:
    from .azure import AzureStorage
    from .gcs import GcsStorage
    from .s3 import S3Storage


def __getattr__(name: str) -> Any:
    # Remote backends on first use: importing s3fs (aiobotocore), gcsfs or adlfs (the Azure
    # SDK) costs every process that never opens such a store.
    if name == "S3Storage":
        from .s3 import S3Storage

        return S3Storage
    if name == "GcsStorage":
        from .gcs import GcsStorage

        return GcsStorage
    if name == "AzureStorage":
        from .azure import AzureStorage

        return AzureStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TEMP_PREFIX",
    "AzureStorage",
    "FileInfo",
    "GcsStorage",
    "LocalStorage",
    "MemoryStorage",
    "S3Storage",
    "Storage",
    "open_storage",
]
