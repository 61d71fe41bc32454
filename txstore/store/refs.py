"""Refs: tags, leases and the retention record, the small mutable documents under ``refs/``.

- ``refs/tags/<name>.json`` names a version. Created put-if-absent; moved only when asked,
  by compare-and-swap.
- ``refs/leases/<id>.json`` pins a version for a running job until ``expires_at``; renewed by
  rewriting it, deleted on release (txstore/store/lease.py).
- ``refs/retention.json`` records which versions ``expire`` expired, and when
  (compare-and-swap).

A version listed in the retention record is expired unless a tag or an unexpired lease
protects it. A new tag or lease is written first and the record read after it; ``vacuum``
reads the record first and the refs after it. So vacuum sees the version either unlisted or
protected by the new ref, and a ref that finds its version listed removes itself and fails.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

from ..errors import (
    AlreadyExistsError,
    CorruptError,
    NotFoundError,
    TagExistsError,
    TagNotFoundError,
    VersionExpiredError,
)
from ..format import manifest as fmt
from ..format.manifest import ExpiredRange, LeaseRecord, Manifest, Retention, Tag
from ..storage import Storage
from ..txn import VersionLog

TAGS = "refs/tags/"
LEASES = "refs/leases/"
RETENTION_KEY = "refs/retention.json"
#: Neighbouring ranges expired longer ago than this are merged (keeping the later time), so
#: the record stays small however often ``expire`` runs; no grace period is this long.
COALESCE_AFTER = 90 * 86400.0

_TAG_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_TAG_KEY = re.compile(rf"{TAGS}({_TAG_NAME.pattern})\.json")
_LEASE_KEY = re.compile(rf"{LEASES}([0-9a-f]{{32}})\.json")


def _valid_tag_name(name: object) -> bool:
    return isinstance(name, str) and bool(_TAG_NAME.fullmatch(name)) and not name.isdigit()


def check_tag_name(name: str) -> str:
    """A tag name that is a safe file name and cannot be mistaken for a version number."""
    if not _valid_tag_name(name):
        raise ValueError(
            f"invalid tag name {name!r}: use letters, digits, '_', '.' and '-' (at most 128, "
            "not starting with '.' or '-', not all digits)"
        )
    return name


def is_tag_key(key: str) -> bool:
    """Whether ``key`` is where a tag is kept (not a temp or lock file beside one)."""
    return _TAG_KEY.fullmatch(key) is not None


def tag_key(name: str) -> str:
    return f"{TAGS}{check_tag_name(name)}.json"


def lease_key(lease_id: str) -> str:
    return f"{LEASES}{lease_id}.json"


def _utc(ts: float) -> str:
    # Only for messages: a stored time out of range must not hide the error being reported.
    try:
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{ts!r} (not a valid time)"


# -- the retention record ------------------------------------------------------------------


def find_expired(retention: Retention, version: int) -> ExpiredRange | None:
    """The range of the record that lists ``version``, if any."""
    ranges = retention.expired
    i = bisect_right([r.first for r in ranges], version) - 1
    if i >= 0 and ranges[i].first <= version <= ranges[i].last:
        return ranges[i]
    return None


def with_expired(retention: Retention, versions: Sequence[int], now: float) -> Retention:
    """The record plus ``versions`` (sorted, none listed yet) expired at ``now``."""
    ranges = list(retention.expired)
    start = 0
    for i in range(1, len(versions) + 1):
        if i == len(versions) or versions[i] != versions[i - 1] + 1:
            ranges.append(ExpiredRange(first=versions[start], last=versions[i - 1], expired_at=now))
            start = i
    ranges.sort(key=lambda r: r.first)
    merged: list[ExpiredRange] = []
    for r in ranges:
        prev = merged[-1] if merged else None
        if prev is not None and prev.last + 1 == r.first:
            old = max(prev.expired_at, r.expired_at) < now - COALESCE_AFTER
            if old or prev.expired_at == r.expired_at:
                at = max(prev.expired_at, r.expired_at)
                merged[-1] = ExpiredRange(first=prev.first, last=r.last, expired_at=at)
                continue
        merged.append(r)
    return Retention(expired=tuple(merged))


# -- reading and writing refs ----------------------------------------------------------------


def read_many(storage: Storage, keys: Sequence[str]) -> list[bytes | None]:
    """Several small objects at once (None for one deleted meanwhile)."""

    def get(key: str) -> bytes | None:
        try:
            return storage.read(key)
        except NotFoundError:
            return None

    if len(keys) <= 1:
        return [get(k) for k in keys]
    with ThreadPoolExecutor(max_workers=min(16, len(keys))) as pool:
        return list(pool.map(get, keys))


class Refs:
    """Tags, leases and the retention record of one store."""

    def __init__(self, log: VersionLog) -> None:
        self.log = log
        self.storage = log.storage

    def _where(self, key: str) -> str:
        return f"{self.storage.uri}/{key}"

    # -- tags ------------------------------------------------------------------------------

    def decode_tag(self, key: str, data: bytes) -> Tag:
        """The tag document read from ``key``; it must hold the tag its key names."""
        where = self._where(key)
        match = _TAG_KEY.fullmatch(key)
        if match is None:
            raise CorruptError(f"{where} is not where a tag is kept")
        name = match.group(1)
        tag = fmt.decode(data, Tag, where)
        # Names build keys (untag, protection) and are shown to people: a document that names
        # another tag, or a path, is damaged or forged.
        if tag.name != name:
            raise CorruptError(f"{where} names tag {tag.name!r}, not {name!r} as its key says")
        if not _valid_tag_name(name):
            raise CorruptError(f"{where} names tag {name!r}, which is not a valid tag name")
        return tag

    def tag(self, name: str) -> Tag:
        key = tag_key(name)
        try:
            data = self.storage.read(key)
        except NotFoundError:
            raise TagNotFoundError(f"no tag {name!r} in {self.storage.uri}") from None
        return self.decode_tag(key, data)

    def tags(self) -> list[Tag]:
        """Every tag, by name."""
        keys = [f.key for f in self.storage.list(TAGS) if _TAG_KEY.fullmatch(f.key)]
        out = []
        for key, data in zip(keys, read_many(self.storage, keys), strict=True):
            if data is not None:
                out.append(self.decode_tag(key, data))
        return sorted(out, key=lambda t: t.name)

    def put_tag(
        self, name: str, manifest: Manifest, *, message: str | None, force: bool, now: float
    ) -> Tag:
        key = tag_key(name)
        self.check_retained(manifest.version, now)  # fail fast; checked again below
        tag = Tag(
            name=name,
            version=manifest.version,
            commit_id=manifest.commit_id,
            timestamp=now,
            message=message,
        )
        data = fmt.encode(tag)
        if not force:
            try:
                self.storage.put_if_absent(key, data)
            except AlreadyExistsError:
                current = self.tag(name)
                if current != tag:  # equal: our own write, its reply lost and replayed
                    raise TagExistsError(
                        f"tag {name!r} exists already (version {current.version}); "
                        "pass force=True (--force) to move it"
                    ) from None
        else:
            try:
                _, token = self.storage.read_with_token(key)
            except NotFoundError:
                token = None
            self.storage.compare_and_swap(key, data, token)  # ConflictError if moved meanwhile
        try:
            self.check_retained(manifest.version, now, own_key=key)
        except VersionExpiredError:
            self.storage.delete(key)
            raise
        return tag

    def delete_tag(self, name: str) -> Tag:
        tag = self.tag(name)  # TagNotFoundError
        self.storage.delete(tag_key(name))
        return tag

    # -- leases ----------------------------------------------------------------------------

    def leases(self) -> list[tuple[str, LeaseRecord]]:
        """Every lease (lapsed ones too) as (id, record)."""
        found = [
            (m.group(1), f.key)
            for f in self.storage.list(LEASES)
            if (m := _LEASE_KEY.fullmatch(f.key))
        ]
        out = []
        datas = read_many(self.storage, [key for _, key in found])
        for (lease_id, key), data in zip(found, datas, strict=True):
            if data is not None:
                out.append((lease_id, fmt.decode(data, LeaseRecord, self._where(key))))
        return out

    # -- retention -------------------------------------------------------------------------

    def retention(self) -> tuple[Retention, str | None]:
        """The retention record and its compare-and-swap token (None: no record yet)."""
        try:
            data, token = self.storage.read_with_token(RETENTION_KEY)
        except NotFoundError:
            return Retention(), None
        return fmt.decode(data, Retention, self._where(RETENTION_KEY)), token

    def protection(self, now: float) -> dict[int, list[str]]:
        """Each version a tag or an unexpired lease protects, with those refs' keys."""
        out: dict[int, list[str]] = defaultdict(list)
        for tag in self.tags():
            out[tag.version].append(tag_key(tag.name))
        for lease_id, lease in self.leases():
            if lease.expires_at > now:
                out[lease.version].append(lease_key(lease_id))
        return dict(out)

    def check_retained(self, version: int, now: float, *, own_key: str | None = None) -> None:
        """Raise ``VersionExpiredError`` if ``version`` is expired.

        Listed versions stay readable while a tag or live lease (other than ``own_key``, the
        ref being created) protects them.
        """
        listed = find_expired(self.retention()[0], version)
        if listed is None or version >= self.log.latest_version():
            return  # the latest never expires: a record listing it is damaged or forged
        if any(key != own_key for key in self.protection(now).get(version, ())):
            return
        raise VersionExpiredError(
            f"version {version} of {self.storage.uri} was expired at {_utc(listed.expired_at)}; "
            "its files may be gone. Tag or lease the versions you need before expiring"
        )


# -- what the API returns ---------------------------------------------------------------------


def _dt(ts: float, key: str) -> datetime:
    try:
        return datetime.fromtimestamp(ts, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        raise CorruptError(f"{key} holds a time out of range: {ts!r}") from None


@dataclass(frozen=True)
class TagInfo:
    name: str
    version: int
    commit_id: str
    created: datetime
    message: str | None

    @classmethod
    def from_doc(cls, tag: Tag) -> TagInfo:
        created = _dt(tag.timestamp, tag_key(tag.name))
        return cls(tag.name, tag.version, tag.commit_id, created, tag.message)


@dataclass(frozen=True)
class LeaseInfo:
    id: str
    version: int
    created: datetime
    expires_at: datetime
    owner: str
    #: False once lapsed: a lapsed lease protects nothing.
    active: bool

    @classmethod
    def from_doc(cls, lease_id: str, lease: LeaseRecord, now: float) -> LeaseInfo:
        return cls(
            lease_id,
            lease.version,
            _dt(lease.created, lease_key(lease_id)),
            _dt(lease.expires_at, lease_key(lease_id)),
            lease.owner,
            lease.expires_at > now,
        )
