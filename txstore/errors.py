"""The txstore exception tree, grouped by what a caller does about each error.

- ``ConflictError``: someone else changed the store first and nothing was committed:
  - ``HistoryChangedError``: versions committed since the operation began change what it
    means (a rollback under an append, say); look at the log, decide, run it again;
  - ``RetriesExhaustedError``: it lost to concurrent commits more times than its retry
    budget; run it again later, or with a larger ``RetryPolicy``;
  - ``RefChangedError``: a compare-and-swap lost (HEAD, a tag, the retention record
    changed since it was read); read again and retry.
- ``CommitStateUnknownError``: the commit may or may not have landed; look before retrying.
- ``NotFoundError``: the store, version, tag, field or file named does not exist;
  ``FieldMissingError``: some samples lack a field a reader asked for (tell it what to do).
- ``AlreadyExistsError``: the thing to be created exists already (a store, a tag, a field:
  say to replace it).
- ``CorruptError``: stored bytes are damaged, foreign or unsafe; repair or restore.
- ``UnsupportedFormatError``: written by a newer txstore; upgrade to read it.
- ``EncodeError``: a sample holds a value the format cannot store; fix the input.
- ``FieldTypeError``: a field's values are not what a reader needs (token windows: 1-d
  integer arrays); fix the data or read another field.
- ``InvalidArgumentError``: an argument a face cannot take; fix the call.
- ``StorageError``: the backend failed (network, permissions, disk); retry later.
- ``UnsafeStorageError``: the backend does not keep conditional writes, so commits there
  would be lost; use another server (retrying cannot help).
"""

from __future__ import annotations


class TxstoreError(Exception):
    """Base of every error txstore raises."""


class ConflictError(TxstoreError):
    """Someone else changed the store first; nothing was committed (see the subclasses)."""


class HistoryChangedError(ConflictError):
    """A version committed since the operation began is one it may not be rebased over.

    ``version`` and ``operation``: the first such version and what made it.
    """

    def __init__(self, message: str, *, version: int, operation: str) -> None:
        super().__init__(message)
        self.version = version
        self.operation = operation


class RetriesExhaustedError(ConflictError):
    """An operation lost to concurrent commits more times than its retry budget allows."""


class RefChangedError(ConflictError):
    """A compare-and-swap lost: the object changed since it was read."""


class TransactionClosedError(TxstoreError, RuntimeError):
    """The transaction was committed or aborted already; start a new one."""


class CommitStateUnknownError(TxstoreError):
    """A commit's outcome cannot be known: the write may have landed or not.

    The writer's chunks are left in place; read the store's log (or retry with the same
    ``txn_id``, which never commits twice) to settle it.
    """

    def __init__(self, message: str, *, version: int, commit_id: str) -> None:
        super().__init__(message)
        self.version = version
        self.commit_id = commit_id


class NotFoundError(TxstoreError):
    """A store, version, tag or file does not exist."""


class StoreNotFoundError(NotFoundError):
    """No txstore store exists at the location."""


class VersionNotFoundError(NotFoundError, KeyError):
    """The store has no such version."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AlreadyExistsError(TxstoreError):
    """The object to be created exists already."""


class StoreExistsError(AlreadyExistsError):
    """A store exists at the location already."""


class CorruptError(TxstoreError):
    """Stored bytes are damaged, foreign or name files outside the store."""


class ChecksumError(CorruptError):
    """Bytes read back do not match the checksum recorded when they were written."""


class MissingDataError(CorruptError):
    """A file that a committed version needs is missing."""


class UnsupportedFormatError(TxstoreError):
    """The data was written in a format version this txstore cannot read."""


class EncodeError(TxstoreError, ValueError):
    """A sample holds a value the format cannot store.

    ``index``: the input of an ingest job whose sample it is (None outside ``optimize``).
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index

    def __reduce__(self) -> tuple[object, ...]:  # crosses back from worker processes
        return (type(self), (self.args[0], self.index))


class UnsafeStorageError(TxstoreError):
    """The backend let through a conditional write it must refuse (a second create of one
    object, or a swap with a stale token): commits there would be lost without an error.

    Raised before anything is committed; nothing is written but a probe object. Use a server
    that honours ``If-None-Match`` and ``If-Match`` on writes (docs/object-stores.md).
    """


class StorageError(TxstoreError):
    """The storage backend failed in a way that may pass (network, permissions, disk)."""


class VersionExpiredError(VersionNotFoundError):
    """The version was expired by ``Store.expire``: its files may be gone.

    Tag or lease the versions you need before expiring, or pin another version.
    """


class FieldNotFoundError(NotFoundError, KeyError):
    """No sample of the snapshot has a field of that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class FieldMissingError(FieldNotFoundError):
    """Some samples of the snapshot lack a field a reader asked for.

    ``field``: the field; ``count``: how many samples lack it; ``samples``: the first of them.
    Tell the reader what to do with them (``missing="skip"`` or a fill value), or give them
    the field (``add_fields(..., missing_only=True)``).
    """

    def __init__(self, message: str, *, field: str, count: int, samples: tuple[int, ...]) -> None:
        super().__init__(message)
        self.field = field
        self.count = count
        self.samples = samples

    def __reduce__(self) -> tuple[object, ...]:  # crosses back from DataLoader workers
        return (_field_missing, (self.args[0], self.field, self.count, self.samples))


def _field_missing(message: str, field: str, count: int, samples: tuple[int, ...]) -> Exception:
    return FieldMissingError(message, field=field, count=count, samples=samples)


class FieldExistsError(AlreadyExistsError):
    """``add_fields`` was asked for a field that samples have already: pass ``replace=True``
    to replace their values, or ``missing_only=True`` to compute it only where it is missing.
    Nothing was committed."""


class TagNotFoundError(NotFoundError, KeyError):
    """The store has no tag of that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TagExistsError(AlreadyExistsError):
    """A tag of that name exists already; pass ``force=True`` to move it."""


class InputError(TxstoreError):
    """The user's function failed on one input of an ingest job; nothing was committed."""

    def __init__(self, message: str, index: int = -1) -> None:
        super().__init__(message)
        self.index = index

    def __reduce__(self) -> tuple[object, ...]:  # crosses back from worker processes
        return (InputError, (self.args[0], self.index))


class ResumeMismatchError(TxstoreError):
    """A saved loader state belongs to another snapshot or another layout of the epoch."""


class InvalidArgumentError(TxstoreError, TypeError, ValueError):
    """An argument is not one the operation takes (a wrong type or a wrong value); the
    message names the argument and what it must be. Both a ``TypeError`` and a
    ``ValueError``, so that either ``except`` clause catches it."""


class FieldTypeError(TxstoreError, TypeError):
    """A field's values are not of the kind a reader needs (token windows: 1-d integer
    arrays of one dtype).

    ``field``: the field; ``sample``: the first sample whose value is not.
    """

    def __init__(self, message: str, *, field: str, sample: int) -> None:
        super().__init__(message)
        self.field = field
        self.sample = sample

    def __reduce__(self) -> tuple[object, ...]:  # crosses back from DataLoader workers
        return (_field_type, (self.args[0], self.field, self.sample))


def _field_type(message: str, field: str, sample: int) -> Exception:
    return FieldTypeError(message, field=field, sample=sample)
