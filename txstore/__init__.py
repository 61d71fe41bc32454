"""txstore: a transactional, versioned dataset store for ML training data."""

import logging

from .errors import (
    AlreadyExistsError,
    ChecksumError,
    CommitStateUnknownError,
    ConflictError,
    CorruptError,
    EncodeError,
    FieldExistsError,
    FieldMissingError,
    FieldNotFoundError,
    FieldTypeError,
    HistoryChangedError,
    InputError,
    InvalidArgumentError,
    MissingDataError,
    NotFoundError,
    RefChangedError,
    ResumeMismatchError,
    RetriesExhaustedError,
    StorageError,
    StoreExistsError,
    StoreNotFoundError,
    TagExistsError,
    TagNotFoundError,
    TransactionClosedError,
    TxstoreError,
    UnsafeStorageError,
    UnsupportedFormatError,
    VersionExpiredError,
    VersionNotFoundError,
)
from .interop.imports import import_litdata, import_mds, import_parquet
from .store.core import Commit, Store, create, open
from .store.exports import Export, export_litdata, export_mds, export_parquet
from .store.ingest import optimize
from .store.lease import Lease
from .store.progress import Progress
from .store.snapshot import Snapshot
from .store.staging import StagedPart, StagedWriter, Transaction, TransactionHandle

__version__ = "0.1.0"

# The "txstore" logger (commit retries and rebases, what vacuum deletes, what readers fetch)
# is silent unless the application configures logging: a library adds no handler of its own.
logging.getLogger(__name__).addHandler(logging.NullHandler())


#: The names the torch faces give, loaded on first use.
_TORCH_NAMES = (
    "StreamingDataset",
    "StreamingDataLoader",
    "MixedStreamingDataset",
    "TokenStreamingDataset",
    "TokenStreamingDataLoader",
)


def __getattr__(name: str) -> object:
    # The torch faces load torch only when asked for: torch is an optional extra.
    if name in _TORCH_NAMES:
        try:
            from . import torch as _torch
        except ModuleNotFoundError as e:
            if e.name is None or e.name.partition(".")[0] != "torch":
                raise
            # Still an ImportError (``except ImportError`` keeps working), with the fix in it.
            raise ModuleNotFoundError(
                f"txstore.{name} needs torch, which is not installed: pip install 'txstore[torch]'",
                name=e.name,
            ) from e
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
    "Export",
    "FieldExistsError",
    "FieldMissingError",
    "FieldNotFoundError",
    "FieldTypeError",
    "HistoryChangedError",
    "InputError",
    "InvalidArgumentError",
    "Lease",
    "MissingDataError",
    "MixedStreamingDataset",
    "NotFoundError",
    "Progress",
    "RefChangedError",
    "ResumeMismatchError",
    "RetriesExhaustedError",
    "Snapshot",
    "StagedPart",
    "StagedWriter",
    "StorageError",
    "Store",
    "StoreExistsError",
    "StoreNotFoundError",
    "StreamingDataLoader",
    "StreamingDataset",
    "TagExistsError",
    "TagNotFoundError",
    "TokenStreamingDataLoader",
    "TokenStreamingDataset",
    "Transaction",
    "TransactionClosedError",
    "TransactionHandle",
    "TxstoreError",
    "UnsafeStorageError",
    "UnsupportedFormatError",
    "VersionExpiredError",
    "VersionNotFoundError",
    "create",
    "export_litdata",
    "export_mds",
    "export_parquet",
    "import_litdata",
    "import_mds",
    "import_parquet",
    "open",
    "optimize",
]
