"""The commit loop: optimistic concurrency with rebase, retry and lost-response read-back.

One step decides a commit: the exclusive creation of ``versions/index.v<n+1>.json``. On any
doubt about that step (the object exists, a timeout, a transport error, a 5xx) the writer reads
the object back: its own ``commit_id`` means it committed (the reply was lost); someone else's
means it lost the race and rebases; absent means it can try again; and when even the read fails
it raises ``CommitStateUnknownError`` and leaves its data files alone.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import (
    AlreadyExistsError,
    CommitStateUnknownError,
    CorruptError,
    RetriesExhaustedError,
    StorageError,
    TxstoreError,
    VersionNotFoundError,
)
from ..format import manifest as fmt
from ..format.manifest import Manifest
from .log import VersionLog, manifest_key

logger = logging.getLogger(__name__)

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


class _InDoubt:
    """Versions this commit tried to create whose outcome is open: a write that failed in a
    way that may still land (a timeout, a dropped connection) and was absent on read-back.

    Such a write can reach the server later, so before every further step the writer looks
    again: its own commit there means it succeeded; someone else's there means that write
    can never land (put-if-absent); still absent means still in doubt.
    """

    def __init__(self, log: VersionLog) -> None:
        self.log = log
        self.versions: set[int] = set()
        self.commit_id: str | None = None

    def landed(self) -> Manifest | None:
        """Our commit, if one of the doubtful writes has landed since."""
        for version in sorted(self.versions):
            try:
                found = self.log.read(version)
            except VersionNotFoundError:
                continue
            if found.commit_id == self.commit_id:
                return found
            self.versions.discard(version)  # someone else's: ours can never land there
        return None

    def unknown(self, why: str) -> CommitStateUnknownError:
        version = min(self.versions)
        return CommitStateUnknownError(
            f"{why}; a write of version {version} to {self.log.storage.uri} may still land. "
            f"Its data files are kept: retry with the same txn_id, or look for commit_id "
            f"{self.commit_id} in the log",
            version=version,
            commit_id=self.commit_id or "",
        )


def _succeed(log: VersionLog, manifest: Manifest, attempts: int) -> CommitResult:
    logger.debug(
        "committed version %d (%s) to %s in %d attempt(s)",
        manifest.version,
        manifest.operation,
        log.storage.uri,
        attempts,
    )
    log.advance_head(manifest.version)
    # Saves the next committer a write; it writes the marker itself if this fails.
    with contextlib.suppress(TxstoreError):
        log.ensure_marker(manifest)
    return CommitResult(manifest, created=True, attempts=attempts)


def commit(
    log: VersionLog,
    build: Build,
    *,
    txn_id: str | None = None,
    policy: RetryPolicy = RetryPolicy(),
    rng: random.Random | None = None,
) -> CommitResult:
    """Commit ``build(latest)`` as the next version, rebasing onto newer versions as needed.

    ``build`` must give every manifest it makes the same ``commit_id``: that is how a write
    whose reply was lost, or that landed late, is recognised as this commit.
    """
    rng = rng or random.Random()
    doubt = _InDoubt(log)
    unsettled = 0  # failed writes that read back as absent, in a row
    tried_on: int | None = None  # the parent of the previous attempt
    for attempt in range(1, policy.max_attempts + 1):
        try:
            with log.storage.writer_lock():
                # strict: refuse to commit into a hole in the chain of versions
                parent = log.latest(strict=True)
                if tried_on is not None and parent.version > tried_on:
                    logger.info(
                        "commit to %s, attempt %d of %d: rebasing onto version %d (versions "
                        "%d-%d were committed since the last attempt)",
                        log.storage.uri,
                        attempt,
                        policy.max_attempts,
                        parent.version,
                        tried_on + 1,
                        parent.version,
                    )
                tried_on = parent.version
                # After the latest is known: a doubtful write of ours that landed at or below
                # it is visible now (versions are contiguous); one that lands later can only
                # land at parent + 1, where our next write will meet it and read it back.
                ours = doubt.landed()
                if ours is not None:
                    return _succeed(log, ours, attempt)
                if txn_id is not None:
                    existing = log.find_txn(txn_id, parent)
                    if existing is not None:
                        created = existing.commit_id == doubt.commit_id  # a late write of ours
                        return CommitResult(existing, created=created, attempts=attempt)
                log.ensure_marker(parent)
                manifest = build(parent)
                if manifest.version != parent.version + 1 or manifest.parent != parent.version:
                    raise ValueError("build() must make the version after its parent")
                if doubt.commit_id not in (None, manifest.commit_id):
                    raise ValueError("build() must keep one commit_id across attempts")
                doubt.commit_id = manifest.commit_id
                try:
                    key = manifest_key(manifest.version)
                    log.storage.put_if_absent(key, fmt.encode(manifest))
                    outcome: bool | None = True
                except (AlreadyExistsError, StorageError) as e:
                    outcome = _settle(log, manifest, e)
                    if outcome is None:
                        logger.info(
                            "commit to %s, attempt %d of %d: writing version %d failed (%s) "
                            "and it reads back absent: trying again",
                            log.storage.uri,
                            attempt,
                            policy.max_attempts,
                            manifest.version,
                            e,
                        )
                        doubt.versions.add(manifest.version)
                        unsettled += 1
                        if unsettled >= _MAX_UNSETTLED:
                            ours = doubt.landed()
                            if ours is not None:
                                return _succeed(log, ours, attempt)
                            raise doubt.unknown(f"writes kept failing ({e})") from e
        except (StorageError, CorruptError) as e:
            if doubt.versions:  # a write may have landed: "failed" would invite a duplicate
                raise doubt.unknown(f"a later step failed ({e})") from e
            raise
        if outcome:
            return _succeed(log, manifest, attempt)
        if outcome is False:  # lost the race: rebase on the new latest after a pause
            logger.info(
                "commit to %s, attempt %d of %d: version %d was committed by another writer "
                "first; retrying on the new latest",
                log.storage.uri,
                attempt,
                policy.max_attempts,
                manifest.version,
            )
            time.sleep(policy.delay(attempt, rng))
    try:
        ours = doubt.landed()
    except (StorageError, CorruptError) as e:
        raise doubt.unknown(f"gave up, and the last look failed ({e})") from e
    if ours is not None:
        return _succeed(log, ours, policy.max_attempts)
    if doubt.versions:
        raise doubt.unknown(f"gave up after {policy.max_attempts} attempts")
    raise RetriesExhaustedError(
        f"gave up committing to {log.storage.uri} after {policy.max_attempts} attempts "
        "lost to concurrent commits"
    )
