"""Processes racing in lockstep on GCS (fake-gcs-server) and Azure Blob (Azurite).

The same races as test_txn_race.py, through its helpers, with fewer rounds: one round already
has every process go for the same version, and the S3 servers keep the long runs. The
``objstore`` fixture (tests/emulators.py) is a fresh bucket or container on each emulator.
"""

from __future__ import annotations

from .conftest import Backend
from .test_txn_race import lockstep_appends, put_race
from .test_txn_race import test_same_txn_id_from_several_processes_lands_once as same_txn_race


def test_same_txn_id_from_several_processes_lands_once(objstore: Backend) -> None:
    same_txn_race(objstore, rounds=4)


def test_racing_put_if_absent_has_one_winner_across_processes(objstore: Backend) -> None:
    put_race(objstore, rounds=8)


def test_lockstep_racing_appends_land_exactly_once(objstore: Backend) -> None:
    writers, rounds = 4, 5
    history, acks, found = lockstep_appends(objstore, writers, rounds)
    assert found == []
    assert history.latest == writers * rounds
    assert sorted(a.version for a in acks) == list(range(1, writers * rounds + 1))
