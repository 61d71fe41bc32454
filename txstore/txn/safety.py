"""The backend check: prove that conditional writes are kept before trusting a backend with
commits (format §9, "The backend check").

A commit is one put-if-absent; HEAD, tags and the retention record move by compare-and-swap.
A server that lets a second conditional create through, or a swap with a stale token,
acknowledges commits and then loses them without an error. So before a store's first commit,
and when a writer reaches a store through an endpoint its record does not list, the writer
runs the check on a probe object of its own: a second create must be refused and leave the
first bytes, and a swap with a stale token must be refused and leave the newer bytes. The
endpoints that passed are recorded in ``checks/storage.json``.

Only remote backends are checked: on local disk and in memory the contract is kept by
txstore's own code (``os.link``, locks), which the storage suite tests; there is no server
between the writer and its files to distrust.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from ..errors import (
    AlreadyExistsError,
    CorruptError,
    NotFoundError,
    RefChangedError,
    StorageError,
    UnsafeStorageError,
    UnsupportedFormatError,
)
from ..format import manifest as fmt
from ..storage import Storage

log = logging.getLogger("txstore.txn")

#: The checks a backend must pass, in the order they are run (and named in the record).
CHECKS = ("put_if_absent", "compare_and_swap")
_RECORD_TRIES = 5


def _unsafe(storage: Storage, check: str, what: str) -> UnsafeStorageError:
    return UnsafeStorageError(
        f"{storage.uri} (endpoint {storage.endpoint}) failed the {check} check: {what}. "
        "Commits there would be lost without an error (two writers could both create one "
        "version), so nothing is committed. Use a server that honours If-None-Match and "
        "If-Match on writes (AWS S3, GCS, Azure Blob, or an S3-compatible server that "
        "passes this check; see docs/object-stores.md)."
    )


def probe(storage: Storage) -> None:
    """Run the check on a fresh probe object; ``UnsafeStorageError`` names the failed part.

    ``StorageError`` passes through (the backend failed, which says nothing of its safety).
    The probe object is deleted after, or left for vacuum where the delete fails.
    """
    key = fmt.probe_key(uuid.uuid4().hex)
    first, second, third, fourth = b"probe:1", b"probe:2", b"probe:3", b"probe:4"
    try:
        storage.put_if_absent(key, first)
        try:
            storage.put_if_absent(key, second)
        except AlreadyExistsError:
            pass
        else:
            raise _unsafe(storage, CHECKS[0], f"a second conditional create of {key} succeeded")
        if (kept := storage.read(key)) != first:
            raise _unsafe(storage, CHECKS[0], f"a refused create replaced {key} ({kept!r})")
        _, stale = storage.read_with_token(key)
        try:
            storage.compare_and_swap(key, third, stale)
        except RefChangedError:
            raise _unsafe(
                storage, CHECKS[1], f"a swap of {key} with its current token was refused"
            ) from None
        try:
            storage.compare_and_swap(key, fourth, stale)
        except RefChangedError:
            pass
        else:
            raise _unsafe(storage, CHECKS[1], f"a swap of {key} with a stale token succeeded")
        if (kept := storage.read(key)) != third:
            raise _unsafe(storage, CHECKS[1], f"a refused swap replaced {key} ({kept!r})")
    finally:
        try:
            storage.delete(key)
        except StorageError:
            log.info("could not delete the probe %s/%s; vacuum will", storage.uri, key)


def _read_record(storage: Storage) -> tuple[fmt.StorageCheck | None, str | None]:
    """The record and its token; a damaged or foreign one reads as empty (it is only a hint),
    with the token to replace it."""
    try:
        data, token = storage.read_with_token(fmt.STORAGE_CHECK_KEY)
    except NotFoundError:
        return None, None
    try:
        return fmt.decode(data, fmt.StorageCheck, f"{storage.uri}/{fmt.STORAGE_CHECK_KEY}"), token
    except (CorruptError, UnsupportedFormatError) as e:
        log.info("ignoring the backend check record: %s", e)
        return None, token


def is_checked(storage: Storage) -> bool:
    """Whether the store's record lists this storage's endpoint as passing every check."""
    record, _ = _read_record(storage)
    return record is not None and any(
        e.endpoint == storage.endpoint and set(CHECKS) <= set(e.checks) for e in record.endpoints
    )


def _record(storage: Storage, now: float) -> None:
    """Add this endpoint to the record (compare-and-swap; a lost race re-reads)."""
    for _ in range(_RECORD_TRIES):
        record, token = _read_record(storage)
        kept = tuple(
            e for e in (record.endpoints if record else ()) if e.endpoint != storage.endpoint
        )
        entry = fmt.CheckedEndpoint(endpoint=storage.endpoint, checks=CHECKS, checked_at=now)
        doc = fmt.StorageCheck(endpoints=(*kept, entry))
        try:
            storage.compare_and_swap(fmt.STORAGE_CHECK_KEY, fmt.encode(doc), token)
            return
        except RefChangedError:
            continue
    # Only a hint: the next writer through this endpoint runs the check again.
    log.info("the backend check passed but could not be recorded in %s", storage.uri)


def ensure_safe(storage: Storage, clock: Callable[[], float]) -> None:
    """Raise ``UnsafeStorageError`` unless this storage's endpoint is known, or now proved,
    to keep conditional writes; a pass is recorded. Local and memory storages pass as they
    are."""
    if not storage.is_remote or is_checked(storage):
        return
    log.info("checking the conditional writes of %s (endpoint %s)", storage.uri, storage.endpoint)
    probe(storage)
    _record(storage, clock())
