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
    "TxstoreError",
    "UnsupportedFormatError",
    "VersionNotFoundError",
    "create",
    "open",
]
