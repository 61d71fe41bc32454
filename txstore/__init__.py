"""txstore: a transactional, versioned dataset store for ML training data."""

from .errors import (
    AlreadyExistsError,
    ChecksumError,
    CommitStateUnknownError,
    ConflictError,
    CorruptError,
    EncodeError,
    MissingDataError,
    NotFoundError,
    StorageError,
    StoreExistsError,
    StoreNotFoundError,
    TxstoreError,
    UnsupportedFormatError,
    VersionNotFoundError,
)
from .snapshot import Snapshot
from .store import Commit, Store, create, open

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The torch faces load torch only when asked for: torch is an optional extra.
    if name in ("StreamingDataset", "StreamingDataLoader"):
        from . import torch as _torch

        return getattr(_torch, name)
    raise AttributeError(f"module 'txstore' has no attribute {name!r}")


__all__ = [
    "AlreadyExistsError",
    "ChecksumError",
    "Commit",
    "CommitStateUnknownError",
    "ConflictError",
    "CorruptError",
    "EncodeError",
    "MissingDataError",
    "NotFoundError",
    "Snapshot",
    "StorageError",
    "Store",
    "StoreExistsError",
    "StoreNotFoundError",
    "StreamingDataLoader",
    "StreamingDataset",
    "TxstoreError",
    "UnsupportedFormatError",
    "VersionNotFoundError",
    "create",
    "open",
]
