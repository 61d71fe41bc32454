"""Bytes <-> a backend: local folder, memory, or S3."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import TEMP_PREFIX, FileInfo, Storage
from .local import LocalStorage
from .memory import MemoryStorage
from .open import open_storage

if TYPE_CHECKING:
    from .s3 import S3Storage


def __getattr__(name: str) -> Any:
    # S3Storage on first use: importing s3fs (and aiobotocore) costs every process that never
    # opens an S3 store.
    if name == "S3Storage":
        from .s3 import S3Storage

        return S3Storage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TEMP_PREFIX",
    "FileInfo",
    "LocalStorage",
    "MemoryStorage",
    "S3Storage",
    "Storage",
    "open_storage",
]
