"""Deliberately broken variants of txstore, kept to prove that the checks catch them.

test_teeth.py runs the race, crash, network and model checks against each and asserts that
they report the violation. Nothing else uses these.
"""

from __future__ import annotations

import contextlib
from typing import Any

from txstore.format.manifest import Manifest
from txstore.txn.log import VersionLog

from .faults import FaultyStorage
from .test_model import RacingStorage


class BlindPut(FaultyStorage):
    """A backend whose put-if-absent is a blind overwrite (and whose writers never queue)."""

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._call("put_if_absent", key, lambda: self.inner.write(key, data))

    def writer_lock(self) -> Any:
        return contextlib.nullcontext()


class BlindRacingStorage(RacingStorage):
    """The state machine's storage, with the same blind overwrite."""

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._call("put_if_absent", key, lambda: self.inner.write(key, data))


def settle_as_conflict(log: VersionLog, manifest: Manifest, cause: Exception) -> bool | None:
    """A commit path without read-back: any failed put counts as someone else's commit.

    Stands in for ``txstore.txn.commit._settle`` (monkeypatched, in tests only).
    """
    return False
