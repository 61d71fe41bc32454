"""Tests of the tests: two deliberately broken variants, and the checks that must catch them.

1. A backend whose put-if-absent is a blind overwrite (tests/broken.py ``BlindPut``): two
   writers that both build version n+1 both "win", and one acknowledged append vanishes.
2. A commit path that treats a lost reply as a conflict (``settle_as_conflict`` patched over
   ``txstore.txn.commit._settle``): a commit that landed is retried on top of itself, so it
   lands twice, or, with a txn_id, its chunks are deleted as if it had not landed.

Each test runs a real check of this suite (lockstep race, crash point, lost reply through the
proxy, the state machine) against a broken variant and asserts that it reports a violation.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import txstore
from txstore.errors import TxstoreError
from txstore.storage import open_storage

from .broken import BlindPut, BlindRacingStorage, settle_as_conflict
from .conftest import Backend, S3Server
from .faults import FaultyStorage
from .invariants import Ack, txn_samples, violations
from .proxy import Proxy, Rule
from .test_model import HistoryMachine
from .test_network import Case, is_commit
from .test_txn_race import lockstep_appends


@pytest.fixture
def lost_reply_is_a_conflict(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The module, not the function of the same name that txstore.txn exports.
    module = importlib.import_module("txstore.txn.commit")
    monkeypatch.setattr(module, "_settle", settle_as_conflict)
    yield


def _model_fails(machine: type[HistoryMachine]) -> BaseException | None:
    """Run the state machine; the first failure it finds (no shrinking: it only must fail).

    A blind overwrite needs a racer inside a window of two or three storage calls: about one
    example in 125 finds it, so the budget is large (a run stops at its first failure).
    """
    quick = settings(
        max_examples=2000,
        stateful_step_count=20,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow],
    )
    try:
        run_state_machine_as_test(machine, settings=quick)
    except (AssertionError, TxstoreError) as e:  # a check failed, or the store broke
        return e
    return None


# -- 1. put-if-absent as a blind overwrite -------------------------------------------------


def test_race_check_catches_a_blind_overwrite(s3_server: S3Server) -> None:
    backend = Backend("s3", f"s3://{s3_server.new_bucket()}/store", s3_server.options)
    _, _, found = lockstep_appends(backend, writers=4, rounds=5, variant="blind-put")
    assert any("was acknowledged at version" in v for v in found), found


def test_racing_writer_check_catches_a_blind_overwrite() -> None:
    """In-process and deterministic: a second writer commits just before our commit step."""
    raw = open_storage(f"memory://{uuid.uuid4().hex}")
    txstore.create(raw)
    acks: list[Ack] = []

    class Racy(BlindPut):
        def put_if_absent(self, key: str, data: bytes) -> None:
            if key.startswith("versions/") and not acks:
                commit = txstore.Store(raw).append(txn_samples("racer", 2))
                acks.append(Ack("racer", commit.version))
            super().put_if_absent(key, data)

    ours = txstore.Store(Racy(raw)).append(txn_samples("ours", 2))
    acks.append(Ack("ours", ours.version))
    _, found = violations(txstore.Store(raw), acks)
    assert "'racer' was acknowledged at version 1, is at None" in found


def test_model_catches_a_blind_overwrite() -> None:
    class Blind(HistoryMachine):
        storage_class = BlindRacingStorage

    assert _model_fails(Blind) is not None


# -- 2. a lost reply taken for a conflict --------------------------------------------------


@pytest.mark.parametrize("mode", ["after", "replay"])
@pytest.mark.usefixtures("lost_reply_is_a_conflict")
def test_crash_check_catches_a_lost_reply_taken_for_a_conflict(mode: str) -> None:
    """The reply to the commit step is lost; the variant commits again.

    (With a txn_id the variant does no harm: the retry finds its own commit id under the txn
    marker and takes it as its success, so there is nothing for a check to catch.)
    """
    raw = open_storage(f"memory://{uuid.uuid4().hex}")
    txstore.create(raw)
    # Counting puts only, the first one of an append on a fresh store is its commit step.
    faulty = FaultyStorage(raw, fail_at=1, mode=mode, only=frozenset({"put_if_absent"}))
    commit = txstore.Store(faulty).append(txn_samples("t", 2))
    _, found = violations(txstore.Store(raw), [Ack("t", commit.version)])
    assert any("committed 2 times" in v for v in found), found


@pytest.mark.parametrize("mode", ["after", "replay"])
@pytest.mark.usefixtures("lost_reply_is_a_conflict")
def test_a_txn_id_keeps_a_lost_reply_harmless_even_then(mode: str) -> None:
    raw = open_storage(f"memory://{uuid.uuid4().hex}")
    txstore.create(raw)
    faulty = FaultyStorage(raw, fail_at=1, mode=mode, only=frozenset({"put_if_absent"}))
    commit = txstore.Store(faulty).append(txn_samples("t", 2), txn_id="t")
    assert violations(txstore.Store(raw), [Ack("t", commit.version)])[1] == []


@pytest.mark.usefixtures("lost_reply_is_a_conflict")
def test_network_check_catches_a_lost_reply_taken_for_a_conflict(
    s3_server: S3Server, proxy: Proxy
) -> None:
    case = Case(s3_server, proxy)
    reported = case.append("t", Rule(is_commit, "drop"), txn=False)
    assert any("committed 2 times" in v for v in case.check("t", reported, retry=False))


@pytest.mark.usefixtures("lost_reply_is_a_conflict")
def test_model_catches_a_lost_reply_taken_for_a_conflict() -> None:
    assert _model_fails(HistoryMachine) is not None
