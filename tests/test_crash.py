"""A writer dies, or loses a reply, at every storage call of an append.

After each: the store reads back whole, readers see all of the append or none of it, a retry
with the same txn_id never commits twice, and the next append succeeds.

The faults are injected at the ``Storage`` interface, above any backend, so memory and local
disk (the one that several processes share) are enough here; on S3 the reply of every request
of an append is lost or delayed at the HTTP level by tests/test_network.py, and writers are
SIGKILLed at random by tests/test_soak.py.
"""

from __future__ import annotations

import json

import pytest

import txstore
from txstore.errors import CommitStateUnknownError, StorageError
from txstore.storage import open_storage

from .conftest import Backend
from .faults import FaultyStorage
from .invariants import read_history
from .invariants import txn_samples as batch
from .workers import run


def _base_store(backend: Backend) -> txstore.Store:
    store = txstore.create(backend.uri, **backend.kwargs())
    store.append(batch("base", 4))
    return store


def _check_after_fault(backend: Backend, tag: str, landed: bool | None) -> None:
    """``landed``: what the writer was told (True committed, False not, None unknown)."""
    store = txstore.open(backend.uri, **backend.kwargs())
    history = read_history(store)
    assert history.violations == []
    tags = [s["tag"] for s in history.samples]
    present = tags.count(tag)
    assert present in (0, 5), f"append half-visible: {present} of 5 samples"
    if landed is not None:
        assert (present == 5) == landed
    # A retry with the same txn id lands it exactly once.
    retry = store.append(batch(tag, 5), txn_id=tag)
    tags = [s["tag"] for s in store.snapshot()]
    assert tags.count(tag) == 5
    assert retry.version == store.version == history.latest + (0 if present else 1)
    # And the store takes the next append.
    after = store.append(batch("after", 2))
    assert after.version == retry.version + 1 if not present else store.version
    assert read_history(store).violations == []


def _steps(backend: Backend) -> int:
    """How many storage calls an append makes on this backend."""
    _base_store(backend)
    storage = FaultyStorage(open_storage(backend.uri, backend.storage_options))
    txstore.open(storage).append(batch("probe", 5), txn_id="probe")
    return len(storage.calls)


@pytest.mark.parametrize("mode", ["before", "after", "replay"])
def test_fault_at_every_step_in_process(backend: Backend, mode: str) -> None:
    probe = Backend(backend.name, backend.uri + "-probe", backend.storage_options)
    steps = _steps(probe)
    assert steps >= 8
    for k in range(1, steps + 1):
        case = Backend(backend.name, f"{backend.uri}-{mode}-{k}", backend.storage_options)
        _base_store(case)
        storage = FaultyStorage(open_storage(case.uri, case.storage_options), fail_at=k, mode=mode)
        tag = f"t{k}"
        landed: bool | None
        try:
            txstore.open(storage).append(batch(tag, 5), txn_id=tag)
            landed = True
        except CommitStateUnknownError:
            landed = None
        except StorageError:
            landed = False
        _check_after_fault(case, tag, landed)


@pytest.mark.parametrize("mode", ["kill_before", "kill_after"])
def test_sigkill_at_every_step(shared_backend: Backend, mode: str) -> None:
    probe = Backend(
        shared_backend.name, shared_backend.uri + "-probe", shared_backend.storage_options
    )
    steps = _steps(probe)
    options = json.dumps(shared_backend.storage_options or {})
    killed = 0
    for k in range(1, steps + 1):
        case = Backend(
            shared_backend.name, f"{shared_backend.uri}-{mode}-{k}", shared_backend.storage_options
        )
        _base_store(case)
        out = run("append-with-fault", case.uri, options, f"t{k}", str(k), mode)
        assert out == [], f"step {k}: the writer was not killed: {out}"
        killed += 1
        _check_after_fault(case, f"t{k}", None)
    assert killed == steps
