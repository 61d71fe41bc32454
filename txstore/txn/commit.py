"""The commit loop: optimistic concurrency with rebase, retry and lost-response read-back.

One step decides a commit: the exclusive creation of ``versions/index.v<n+1>.json``. On any
doubt about that step (the object exists, a timeout, a transport error, a 5xx) the writer reads
the object back: its own ``commit_id`` means it committed (the reply was lost); someone else's
means it lost the race and rebases; absent means it can try again; and when even the read fails
it raises ``CommitStateUnknownError`` and leaves its data files alone.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import (
    AlreadyExistsError,
    CommitStateUnknownError,
    ConflictError,
    StorageError,
    TxstoreError,
    VersionNotFoundError,
)
from ..format import manifest as fmt
from ..format.manifest import Manifest
from .log import VersionLog, manifest_key

_MAX_UNSETTLED = 3  # a write failing cleanly this often in a row is a storage problem

#: Builds the next manifest on top of a parent; may raise ConflictError to give up.
Build = Callable[[Manifest], Manifest]


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 50
    base_delay: float = 0.002
    max_delay: float = 0.5

    def delay(self, attempt: int, rng: random.Random) -> float:
        # Full jitter: spreads racing writers out instead of synchronising their retries.
        return rng.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))


@dataclass(frozen=True)
class CommitResult:
    manifest: Manifest
    #: False when a version with the same txn_id existed and nothing new was committed.
    created: bool
    attempts: int


def _settle(log: VersionLog, manifest: Manifest, cause: Exception) -> bool | None:
    """Read back the version we tried to create: True ours, False theirs, None absent."""
    try:
        found = log.read(manifest.version)
    except VersionNotFoundError:
        return None
    except TxstoreError as e:
        raise CommitStateUnknownError(
            f"commit of version {manifest.version} to {log.storage.uri} may or may not have "
            f"landed ({cause}); reading it back failed too ({e}). Its data files are kept; "
            f"retry with the same txn_id, or look for commit_id {manifest.commit_id} in the log",
            version=manifest.version,
            commit_id=manifest.commit_id,
        ) from e
    return found.commit_id == manifest.commit_id


def commit(
    log: VersionLog,
    build: Build,
    *,
    txn_id: str | None = None,
    policy: RetryPolicy = RetryPolicy(),
    rng: random.Random | None = None,
) -> CommitResult:
    """Commit ``build(latest)`` as the next version, rebasing onto newer versions as needed."""
    rng = rng or random.Random()
    unsettled = 0  # failed writes that read back as absent, in a row
    for attempt in range(1, policy.max_attempts + 1):
        with log.storage.writer_lock():
            parent = log.latest()
            if txn_id is not None:
                existing = log.find_txn(txn_id, parent)
                if existing is not None:
                    return CommitResult(existing, created=False, attempts=attempt)
            log.ensure_marker(parent)
            manifest = build(parent)
            if manifest.version != parent.version + 1 or manifest.parent != parent.version:
                raise ValueError("build() must make the version after its parent")
            try:
                log.storage.put_if_absent(manifest_key(manifest.version), fmt.encode(manifest))
                outcome: bool | None = True
            except (AlreadyExistsError, StorageError) as e:
                outcome = _settle(log, manifest, e)
                if outcome is None:
                    unsettled += 1
                    if unsettled >= _MAX_UNSETTLED:
                        raise
        if outcome:
            log.advance_head(manifest.version)
            # Saves the next committer a write; it writes the marker itself if this fails.
            with contextlib.suppress(TxstoreError):
                log.ensure_marker(manifest)
            return CommitResult(manifest, created=True, attempts=attempt)
        if outcome is False:  # lost the race: rebase on the new latest after a pause
            time.sleep(policy.delay(attempt, rng))
    raise ConflictError(
        f"gave up committing to {log.storage.uri} after {policy.max_attempts} attempts "
        "lost to concurrent commits"
    )
