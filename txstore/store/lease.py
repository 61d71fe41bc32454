"""Leases: a running job pins the version it reads, renewing the pin while it runs.

A lease is ``refs/leases/<id>.json`` with the version and an ``expires_at`` time. While it is
unexpired, ``expire`` skips the version and ``vacuum`` keeps every file the version needs. A
background thread rewrites it every ttl/3, so a job that dies stops protecting its version one
ttl later at most; ``release`` (or leaving the ``with`` block) deletes it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from types import TracebackType

from ..errors import TxstoreError
from ..format import manifest as fmt
from ..format.manifest import LeaseRecord, Manifest
from ..format.units import parse_duration
from ..storage import Storage
from ..txn import VersionLog
from .refs import Refs, lease_key

log = logging.getLogger(__name__)

DEFAULT_TTL = 6 * 3600.0
#: A lease is for a running job; a longer pin is a tag. Also keeps ``expires_at`` well inside
#: the range a stored time may have (format.md §3), so the record reads back.
MAX_TTL = 100 * 366 * 86400.0
#: After a failed renewal, try again this much sooner than the regular ttl/3.
_RETRY_FRACTION = 8


class Lease:
    """A renewed pin on one version. Use as a context manager, or call ``release``."""

    def __init__(
        self,
        refs: Refs,
        manifest: Manifest,
        *,
        ttl: float | str | timedelta = DEFAULT_TTL,
        clock: Callable[[], float],
        renew: bool = True,
    ) -> None:
        self.ttl = parse_duration(ttl)
        if not 0 < self.ttl <= MAX_TTL:
            raise ValueError(
                f"a lease needs a ttl above 0 and at most a hundred years, got {ttl!r}; "
                "to keep a version for longer, tag it"
            )
        self.id = uuid.uuid4().hex
        self.key = lease_key(self.id)
        self.version = manifest.version
        self._refs = refs
        self._commit_id = manifest.commit_id
        self._clock = clock
        self._created = clock()
        self._expires_at = 0.0
        self._owner = f"{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.renew()
        try:
            refs.check_retained(self.version, clock(), own_key=self.key)
        except TxstoreError:
            self._delete()
            raise
        self._thread: threading.Thread | None = None
        if renew:
            self._thread = threading.Thread(
                target=self._run, name=f"txstore-lease-{self.id[:8]}", daemon=True
            )
            self._thread.start()

    @property
    def expires_at(self) -> datetime:
        return datetime.fromtimestamp(self._expires_at, tz=timezone.utc)

    @property
    def lapsed(self) -> bool:
        """True if renewals failed for a whole ttl: the version may no longer be protected."""
        return self._clock() >= self._expires_at

    @property
    def released(self) -> bool:
        return self._stop.is_set()

    def renew(self) -> None:
        """Push ``expires_at`` to now + ttl (the background thread does this every ttl/3)."""
        with self._lock:
            if self._stop.is_set():
                return
            now = self._clock()
            record = LeaseRecord(
                version=self.version,
                commit_id=self._commit_id,
                created=self._created,
                expires_at=now + self.ttl,
                owner=self._owner,
            )
            self._refs.storage.write(self.key, fmt.encode(record))
            self._expires_at = record.expires_at

    def _run(self) -> None:
        wait = self.ttl / 3
        while not self._stop.wait(wait):
            try:
                self.renew()
                wait = self.ttl / 3
            except TxstoreError as e:
                wait = self.ttl / 3 / _RETRY_FRACTION
                log.warning("could not renew lease %s on version %d: %s", self.id, self.version, e)

    def _delete(self) -> None:
        self._refs.storage.delete(self.key)

    def release(self) -> None:
        """Stop renewing and delete the lease; the version is no longer pinned by it."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._delete()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else f"until {self.expires_at:%Y-%m-%d %H:%M:%S}"
        return f"<txstore.Lease {self.id[:8]} version={self.version} {state}>"


def lease_version(
    storage: Storage,
    manifest: Manifest,
    *,
    ttl: float | str | timedelta = DEFAULT_TTL,
    clock: Callable[[], float] = time.time,
) -> Lease:
    """A lease on ``manifest``'s version, for code that holds a storage and a manifest but no
    Store (``Snapshot.lease``, ``StreamingDataset``)."""
    return Lease(Refs(VersionLog(storage)), manifest, ttl=ttl, clock=clock)
