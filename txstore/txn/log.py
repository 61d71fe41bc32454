"""The version log: manifests ``versions/index.v<n>.json``, the HEAD hint, txn markers.

Finding the latest version reads HEAD, checks the version it names exists, then probes
forward (n+1, n+2, ...) until a probe misses: a constant number of small reads when HEAD is
fresh. A missing, garbage or too-new HEAD falls back to a galloping search over versions
(O(log n) probes), never a listing. Versions are contiguous from 0, because a writer only
creates n+1 after it has read n, and manifests are never deleted: a version missing while
the one after it exists is damage (a hole), and a writer must never commit into it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar, cast

from ..errors import (
    AlreadyExistsError,
    ConflictError,
    CorruptError,
    NotFoundError,
    StoreNotFoundError,
    TxstoreError,
    VersionNotFoundError,
)
from ..format import manifest as fmt
from ..format.manifest import CommitRecord, Head, Manifest, TxnMarker
from ..storage import Storage

log = logging.getLogger(__name__)

HEAD_KEY = "HEAD"
_M = TypeVar("_M", Manifest, CommitRecord)
_CACHE_SIZE = 64


def manifest_key(version: int) -> str:
    return f"versions/index.v{version}.json"


_MANIFEST_KEY = re.compile(r"versions/index\.v(0|[1-9][0-9]{0,17})\.json")


def version_of_key(key: str) -> int | None:
    """The version whose manifest ``key`` is (``manifest_key`` read back), or None."""
    m = _MANIFEST_KEY.fullmatch(key)
    return None if m is None else int(m.group(1))


def txn_marker_key(txn_id: str) -> str:
    return f"txns/{hashlib.sha256(txn_id.encode()).hexdigest()}.json"


class VersionLog:
    """Reads and advances the chain of manifests of one store."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._cache: OrderedDict[int, Manifest] = OrderedDict()
        self._lock = threading.Lock()
        #: The highest version this log has seen exist (manifests are never deleted), and a
        #: HEAD read by ``find_store`` not yet used: where a reader's next search starts.
        self._known: int | None = None
        self._hint: int | None = None

    # -- manifests -------------------------------------------------------------------------

    def read(self, version: int, *, fresh: bool = False) -> Manifest:
        """Version ``version``'s manifest (immutable, so cached; ``fresh`` reads storage,
        for checks that must see damage done since it was cached)."""
        if not fresh:
            with self._lock:
                cached = self._cache.get(version)
            if cached is not None:
                return cached
        return self._decode(version, self._manifest_bytes(version))

    def read_record(self, version: int) -> Manifest | CommitRecord:
        """Version ``version``'s commit fields: its manifest where cached, else only those
        fields decoded (for listing the history, which needs no segments)."""
        with self._lock:
            cached = self._cache.get(version)
        if cached is not None:
            return cached
        return self._checked(version, self._manifest_bytes(version), CommitRecord)

    def _manifest_bytes(self, version: int) -> bytes:
        try:
            return self.storage.read(manifest_key(version))
        except NotFoundError:
            raise VersionNotFoundError(
                f"version {version} does not exist in {self.storage.uri}"
            ) from None

    def _checked(self, version: int, data: bytes, kind: type[_M]) -> _M:
        """The bytes read under version ``version``'s key decoded as ``kind``, checked."""
        where = f"{self.storage.uri}/{manifest_key(version)}"
        doc = fmt.decode(data, kind, where)
        if doc.version != version:
            raise CorruptError(f"{where} claims to be version {doc.version}")
        return doc

    def _decode(self, version: int, data: bytes) -> Manifest:
        """Version ``version``'s manifest from the bytes read under its key, checked."""
        manifest = self._checked(version, data, Manifest)
        self._remember(manifest)
        return manifest

    def _remember(self, manifest: Manifest) -> None:
        with self._lock:
            self._cache[manifest.version] = manifest
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)

    # -- finding the latest version --------------------------------------------------------

    def _head_hint(self) -> int | None:
        try:
            data = self.storage.read(HEAD_KEY)
        except NotFoundError:
            return None
        return self._parse_head(data)

    def _parse_head(self, data: bytes | None) -> int | None:
        if data is None:
            return None
        try:
            head = fmt.decode(data, Head, f"{self.storage.uri}/HEAD")
        except TxstoreError as e:  # garbage HEAD: a hint we can do without
            log.warning("ignoring HEAD of %s: %s", self.storage.uri, e)
            return None
        return head.version if head.version >= 0 else None

    def find_store(self) -> None:
        """``StoreNotFoundError`` unless a store is here, found in one read where its HEAD
        is there (kept as the start of the next search for the latest version)."""
        hint = self._head_hint()
        if hint is None:
            # Raises StoreNotFoundError. Not the latest version: a hole stops the search
            # short of it, and the next search (``latest_version``) looks past holes.
            self._gallop()
        else:
            self._hint = hint

    def _reader_latest(self) -> int | None:
        """The latest version for a reader, in one round trip when nothing was committed
        since this log last looked (HEAD and the next version's manifest read together) and
        in two otherwise (HEAD, then the version it names with the one after it); None when
        HEAD is missing or names no version (the caller gallops)."""
        known, hint, self._hint = self._known, self._hint, None
        start: int | None = None
        if known is not None:
            head, after = self.storage.read_many([HEAD_KEY, manifest_key(known + 1)])
            if after is None:
                return known
            self._keep(known + 1, after)
            start = known + 1
            hint = self._parse_head(head)
            if hint is None or hint <= start:
                return self._forward(start)
        elif hint is None:
            hint = self._head_hint()
            if hint is None:
                return None
        mine, after = self.storage.read_many([manifest_key(hint), manifest_key(hint + 1)])
        if mine is None:  # HEAD names a version not there: garbage, or a damaged store
            return None if start is None else self._forward(start)
        self._keep(hint, mine)
        if after is None:
            self._known = hint
            return hint
        self._keep(hint + 1, after)
        return self._forward(hint + 1)

    def _keep(self, version: int, data: bytes) -> None:
        """Cache a manifest read while searching; a damaged one is left for ``read`` to
        raise on, if it is the one asked for."""
        with contextlib.suppress(TxstoreError):
            self._decode(version, data)

    def _forward(self, version: int) -> int:
        """The last version of a run of existing versions from ``version`` (which exists)."""
        while self._exists(version + 1):
            version += 1
        self._known = version
        return version

    def _exists(self, version: int) -> bool:
        return self.storage.exists(manifest_key(version))

    def latest_version(self, *, strict: bool = False) -> int:
        """The latest version. A hole (version n+1 missing while n+2 exists) hides the
        versions past it: a writer (``strict``) gets ``CorruptError`` rather than commit into
        it; a reader gets the versions past it.

        The probe past the end costs one more request, so it is made where it matters: by
        writers, always (a stale HEAD below a hole would have them commit there), and after a
        galloping search (HEAD missing or wrong: already O(log n) probes). A reader with a
        good HEAD starts at the latest, above any hole. Only holes of one version are seen
        this way; ``verify`` lists ``versions/`` and finds every one.
        """
        if not strict:
            found = self._reader_latest()
            if found is not None:
                return found
        hint = self._head_hint()
        galloped = hint is None or not self._exists(hint)
        version = self._gallop() if hint is None or galloped else hint
        # The search ends on a miss at version + 1: no need to probe it again at once.
        probe = not galloped
        while True:
            while probe and self._exists(version + 1):
                version += 1
            probe = True
            if not (strict or galloped) or not self._exists(version + 2):
                self._known = version
                return version
            # n+2 exists. Its writer read n+1 first, so n+1 absent now (after n+2 was seen)
            # means it was deleted; present means racing writers made both meanwhile.
            if self._exists(version + 1):
                continue
            missing = version + 1
            if strict:
                raise CorruptError(
                    f"{self.storage.uri}/{manifest_key(missing)} is missing while version "
                    f"{missing + 1} exists: the chain of versions is broken (manifests are "
                    "never deleted). Nothing was committed; restore the file from a backup, "
                    "and run `txstore verify`"
                )
            log.warning(
                "%s: version %d is missing while version %d exists; reading past it "
                "(run `txstore verify`)",
                self.storage.uri,
                missing,
                missing + 1,
            )
            version = missing + 1

    def _gallop(self) -> int:
        """The highest existing version, by doubling probes then bisection."""
        if not self._exists(0):
            raise StoreNotFoundError(f"no txstore store at {self.storage.uri}")
        low, step = 0, 1  # low exists
        while self._exists(low + step):
            low, step = low + step, step * 2
        high = low + step  # missing
        while high - low > 1:
            mid = (low + high) // 2
            if self._exists(mid):
                low = mid
            else:
                high = mid
        return low

    def latest(self, *, strict: bool = False) -> Manifest:
        return self.read(self.latest_version(strict=strict))

    def advance_head(self, version: int) -> None:
        """Move HEAD forward to ``version`` (never back); best effort, as HEAD is a hint."""
        data = fmt.encode(Head(version=version))
        for _ in range(5):
            try:
                try:
                    current, token = self.storage.read_with_token(HEAD_KEY)
                    hint = fmt.decode(current, Head, "HEAD").version
                except NotFoundError:
                    token, hint = None, -1
                except CorruptError:
                    self.storage.write(HEAD_KEY, data)  # garbage: replace it
                    return
                if hint == version or (hint > version and self._exists(hint)):
                    return  # a HEAD naming a version that does not exist is garbage
                self.storage.compare_and_swap(HEAD_KEY, data, token)
                return
            except ConflictError:
                continue
            except TxstoreError as e:
                log.warning("could not advance HEAD of %s: %s", self.storage.uri, e)
                return

    # -- transaction ids -------------------------------------------------------------------

    def find_txn(self, txn_id: str, latest: Manifest) -> Manifest | None:
        """The committed version with ``txn_id``, if any.

        Every version below the latest has its marker (a committer writes its parent's
        marker before it commits), so a marker lookup plus a look at the latest is complete.
        """
        return cast("Manifest | None", self._find_txn(txn_id, latest, self.read))

    def find_txn_record(self, txn_id: str, latest: Manifest) -> Manifest | CommitRecord | None:
        """As ``find_txn``, the version's commit fields alone where it is not cached (what a
        caller that only reports the commit needs: a large store's manifest decodes in a
        fraction of the time without its segment references)."""
        return self._find_txn(txn_id, latest, self.read_record)

    def _find_txn(
        self,
        txn_id: str,
        latest: Manifest,
        read: Callable[[int], Manifest | CommitRecord],
    ) -> Manifest | CommitRecord | None:
        if latest.txn_id == txn_id:
            return latest
        key = txn_marker_key(txn_id)
        try:
            data = self.storage.read(key)
        except NotFoundError:
            return None
        marker = fmt.decode(data, TxnMarker, f"{self.storage.uri}/{key}")
        try:
            found = read(marker.version)
        except VersionNotFoundError:  # markers name committed versions only
            raise CorruptError(
                f"{self.storage.uri}/{key} says version {marker.version} committed "
                f"transaction {txn_id!r}, but that version is missing: the chain of versions "
                "is broken (run `txstore verify`)"
            ) from None
        if found.txn_id != txn_id or found.commit_id != marker.commit_id:
            raise CorruptError(
                f"{self.storage.uri}/{key} names version {marker.version}, "
                f"which is not transaction {txn_id!r}"
            )
        return found

    def ensure_marker(self, manifest: Manifest) -> None:
        """Make sure ``manifest``'s txn marker exists (before anything is built on it)."""
        if manifest.txn_id is None:
            return
        key = txn_marker_key(manifest.txn_id)
        if self.storage.exists(key):
            return
        marker = TxnMarker(
            txn_id=manifest.txn_id, version=manifest.version, commit_id=manifest.commit_id
        )
        with contextlib.suppress(AlreadyExistsError):  # another writer wrote the same marker
            self.storage.put_if_absent(key, fmt.encode(marker))
