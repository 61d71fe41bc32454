"""The rules of the version chain, each written once: what each operation does to its
parent's samples, what a commit may be rebased over, and how the next manifest is made.

What each operation does to a version's samples:

- ``append`` adds ``added_samples`` at the end;
- ``compact``, ``add_fields`` and ``drop_fields`` keep the parent's samples, in order;
- ``overwrite`` replaces them all; ``rollback`` makes the content of ``source_version`` again;
- ``create`` starts empty.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..errors import HistoryChangedError, NotFoundError
from ..format.manifest import Manifest, SegmentRef, StoreConfig

if TYPE_CHECKING:
    from .log import VersionLog

logger = logging.getLogger(__name__)

#: Operations that keep their parent's samples, in order (chunks or fields change).
SAME_SAMPLES = frozenset({"compact", "add_fields", "drop_fields"})
#: Operations after which the parent's samples are still the first samples, in order.
KEEPS_PREFIX = SAME_SAMPLES | {"append"}
#: Every operation a manifest may record.
OPERATIONS = KEEPS_PREFIX | {"create", "overwrite", "rollback"}

#: What each operation may be rebased over: the operations others may have committed since
#: it began for it still to mean what its caller asked. Anything else is a
#: ``HistoryChangedError`` and nothing is committed. An append is rebased in its commit's
#: build; a commit that replaces the chunk list (overwrite, add_fields, drop_fields) lands
#: only on the version it was built from, and its operation is redone from the latest when
#: this table allows.
REBASES_OVER: Mapping[str, frozenset[str]] = {
    # A batch meant to extend what its writer saw still does.
    "append": KEEPS_PREFIX,
    # Rewritten chunks and computed field files stay valid while others only add chunks.
    "compact": frozenset({"append"}),
    "add_fields": frozenset({"append"}),
    # Only metadata changes: redone on whatever is latest.
    "drop_fields": OPERATIONS,
    # Made from exactly what the caller saw.
    "overwrite": frozenset(),
    "rollback": frozenset(),
}

_ADVICE = {
    "append": "commit again if the batch still belongs",
    "compact": "compact again",
    "add_fields": "run add_fields again",
    "drop_fields": "drop the fields again",
    "overwrite": "look at the log and overwrite again if still wanted",
    "rollback": "look at the log and roll back again if still wanted",
}


def _what(m: Manifest) -> str:
    if m.operation == "rollback":
        return f"rolled back to version {m.source_version}"
    if m.operation == "overwrite":
        return "replaced the samples (overwrite)"
    return f"was committed meanwhile ({m.operation})"


class Rebase:
    """Checks, for one commit of ``operation`` begun at version ``start``, that every
    version committed since is one it may be rebased over (``REBASES_OVER``, or ``allowed``:
    empty for a commit that must land right on ``start``). Call ``check(parent)`` in the
    commit's build; each version is read once however many attempts it takes."""

    def __init__(
        self,
        log: VersionLog,
        start: int,
        operation: str,
        *,
        allowed: frozenset[str] | None = None,
    ) -> None:
        self.log = log
        self.start = start
        self.operation = operation
        self.allowed = REBASES_OVER[operation] if allowed is None else allowed
        self._checked = start

    def check(self, parent: Manifest) -> None:
        over: list[str] = []
        for v in range(self._checked + 1, parent.version + 1):
            m = parent if v == parent.version else self.log.read(v)
            over.append(f"{v} ({m.operation})")
            if m.operation not in self.allowed:
                raise HistoryChangedError(
                    f"version {v} of {self.log.storage.uri} {_what(m)} while this "
                    f"{self.operation} was prepared (it began at version {self.start}); "
                    f"nothing was committed: {_ADVICE[self.operation]}",
                    version=v,
                    operation=m.operation,
                )
        if over:
            logger.info(
                "%s begun at version %d of %s rebased over version %s",
                self.operation,
                self.start,
                self.log.storage.uri,
                ", ".join(over),
            )
        self._checked = max(self._checked, parent.version)


def first_manifest(config: StoreConfig, *, commit_id: str, timestamp: float) -> Manifest:
    """Version 0 of a new store: empty."""
    return Manifest(
        version=0,
        parent=None,
        commit_id=commit_id,
        operation="create",
        timestamp=timestamp,
        message="create store",
        num_samples=0,
        added_samples=0,
        config=config,
        segments=(),
    )


def next_manifest(
    parent: Manifest,
    *,
    operation: str,
    commit_id: str,
    timestamp: float,
    segments: tuple[SegmentRef, ...],
    num_samples: int,
    message: str | None = None,
    txn_id: str | None = None,
    source_version: int | None = None,
) -> Manifest:
    """The version after ``parent``: the only place a manifest's chain fields are set."""
    return Manifest(
        version=parent.version + 1,
        parent=parent.version,
        commit_id=commit_id,
        txn_id=txn_id,
        operation=operation,
        timestamp=timestamp,
        message=message,
        num_samples=num_samples,
        added_samples=num_samples - parent.num_samples,
        config=parent.config,
        segments=segments,
        source_version=source_version,
    )


def sample_origins(
    manifest: Manifest, read: Callable[[int], Manifest]
) -> list[tuple[int, int, int | None]]:
    """The runs [start, stop) of ``manifest``'s samples, each with the version that appended
    (or created, by overwrite) them, in sample order: the chain is followed back through
    operations that keep their parent's samples, and a rollback to the version it restored.
    ``read(version)`` gives a manifest; where one cannot be read (expired and gone), the
    samples still unattributed get None."""
    runs: list[tuple[int, int, int | None]] = []
    m, high = manifest, manifest.num_samples
    while high > 0:
        try:
            if m.operation == "append":
                low = max(0, m.num_samples - m.added_samples)
                if low < high:
                    runs.append((low, high, m.version))
                    high = low
                nxt = m.parent
            elif m.operation in SAME_SAMPLES:
                nxt = m.parent
            elif m.operation == "rollback":
                nxt = m.source_version
            else:  # create, overwrite: every sample left is its own
                runs.append((0, high, m.version))
                break
            if nxt is None:
                runs.append((0, high, None))
                break
            m = read(nxt)
        except NotFoundError:
            runs.append((0, high, None))
            break
    return runs[::-1]
