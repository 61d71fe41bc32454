"""A hypothesis state machine over a model of the version history.

The model is the list of transactions the store should hold, version v being the first v.
Rules: appends with or without txn ids (ids repeat on purpose), a fault at a chosen storage
call of an append (dies before it, loses its reply, or sees its replay), a racing writer that
commits from a second Store at a chosen call, damaged HEADs, reopening. After every step the
store's history must equal the model: contiguous versions, each its parent plus one whole
transaction, the same transactions in the same order, every txn marker below the latest.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import txstore
from txstore.errors import AlreadyExistsError, CommitStateUnknownError, StorageError
from txstore.format import manifest as fmt
from txstore.format.manifest import Head
from txstore.storage import Storage, open_storage
from txstore.txn import txn_marker_key

from .faults import MODES, FaultyStorage, InjectedFault
from .invariants import read_history, txn_samples

T = TypeVar("T")
TXN_IDS = st.sampled_from([None, "a", "b", "c"])  # few ids: repeats are the point
STEP = st.integers(1, 24)  # an append makes 5-21 storage calls; past them, nothing happens
MODE = st.sampled_from(["before", "after", "replay", "late"])


@dataclass(frozen=True)
class Txn:
    tag: str
    n: int
    txn_id: str | None


class RacingStorage(FaultyStorage):
    """FaultyStorage with several faults per append, and a racing writer before its k-th call.

    One more fault mode, "late": a put-if-absent that times out without writing, and lands
    right after the writer next reads or probes that key (a slow server finishing a request
    its client gave up on). Its writer lock is a no-op so that the racer, a second Store in
    this same process, is not blocked by the local backend's lock file while this one commits.
    """

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.plan: dict[int, str] = {}  # call number -> fault mode
        self.race_at: int | None = None
        self.racer: Callable[[], None] | None = None
        self.late: tuple[str, Callable[[], object]] | None = None
        self.landed_late = False  # in this append, a late write landed

    def arm(self, plan: dict[int, str], race_at: int | None) -> None:
        """Count the next append's calls from 1 again (a late write never armed lands never)."""
        self.calls.clear()
        self.plan, self.race_at, self.late, self.landed_late = plan, race_at, None, False

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        number = len(self.calls) + 1
        if self.racer is not None and number == self.race_at:
            racer, self.racer = self.racer, None
            racer()
        mode = self.plan.get(number, "")
        if mode == "late" and op == "put_if_absent":
            self.calls.append((op, key))
            self.late = (key, fn)
            raise InjectedFault(f"injected: {op} {key} timed out; it lands later")
        self.fail_at, self.mode = (number, mode) if mode in MODES else (None, "before")
        try:
            return super()._call(op, key, fn)
        finally:
            self._land_late(op, key)

    def _land_late(self, op: str, key: str) -> None:
        if self.late is None or self.late[0] != key or op == "put_if_absent":
            return
        late, self.late = self.late[1], None
        try:
            late()
            self.landed_late = True
            event("a late write landed")
        except AlreadyExistsError:  # someone took the key meanwhile: it never lands
            event("a late write lost")

    def writer_lock(self) -> Any:
        return contextlib.nullcontext()


class HistoryMachine(RuleBasedStateMachine):
    backend = "memory"
    storage_class = RacingStorage  # test_teeth.py swaps in a broken one

    def __init__(self) -> None:
        super().__init__()
        self.model: list[Txn] = []
        self.count = 0
        self.folder: str | None = None
        if self.backend == "local":
            self.folder = tempfile.mkdtemp(prefix="txstore-model-")
            self.uri = f"{self.folder}/store"
        else:
            self.uri = f"memory://{uuid.uuid4().hex}"

    @initialize()
    def create(self) -> None:
        txstore.create(self.uri)
        self.raw = open_storage(self.uri)
        self.reopen()

    def teardown(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _txn(self, n: int, txn_id: str | None) -> Txn:
        """A new transaction. All attempts at one txn id carry the same tag: whichever of
        them lands, the version holds that transaction, and the model need not know which."""
        self.count += 1
        return Txn(f"t{self.count}" if txn_id is None else txn_id, n, txn_id)

    def _version_of(self, tag: str, new: dict[int, Txn]) -> int | None:
        found = [v for v, t in enumerate(self.model, 1) if t.tag == tag]
        found += [v for v, t in new.items() if t.tag == tag]
        return found[0] if found else None

    # -- rules -----------------------------------------------------------------------------

    @rule()
    def reopen(self) -> None:
        self.faulty = self.storage_class(self.raw)
        self.writer = txstore.Store(self.faulty)

    @rule(kind=st.sampled_from(["garbage", "missing", "stale", "future", "empty"]))
    def damage_head(self, kind: str) -> None:
        if kind == "missing":
            self.raw.delete("HEAD")
            return
        data = {
            "garbage": b"\x00not json",
            "empty": b"{}",
            "stale": fmt.encode(Head(version=0)),
            "future": fmt.encode(Head(version=len(self.model) + 50)),
        }[kind]
        self.raw.write("HEAD", data)

    @rule(
        n=st.integers(1, 3),
        txn_id=TXN_IDS,
        faults=st.dictionaries(STEP, MODE, max_size=2),
        race=st.none() | st.tuples(STEP, TXN_IDS),
    )
    def append(
        self,
        n: int,
        txn_id: str | None,
        faults: dict[int, str],
        race: tuple[int, str | None] | None,
    ) -> None:
        txn = self._txn(n, txn_id)
        returned: list[tuple[int, Txn]] = []  # (version reported, the transaction)
        if race is not None:
            racer = self._txn(1, race[1])

            def commit_racer() -> None:  # a second Store on the same storage
                commit = txstore.Store(self.raw).append(
                    txn_samples(racer.tag, racer.n), txn_id=racer.txn_id
                )
                returned.append((commit.version, racer))

        self.faulty.racer = commit_racer if race is not None else None
        self.faulty.arm(faults, race[0] if race else None)
        try:
            outcome = self._try_append(txn)
        finally:  # past the append's last call, nothing may fire
            self.faulty.racer = None
            self.faulty.arm({}, None)
        said = "unknown" if outcome is None else "failed" if outcome == "failed" else "ok"
        event(f"append: {said}, racer ran: {bool(returned)}")  # --hypothesis-show-statistics
        if isinstance(outcome, int):
            returned.append((outcome, txn))
        self._settle(returned, txn if outcome is None else None)

    def _try_append(self, txn: Txn) -> int | str | None:
        """The version reported; "failed" if it surely did not land; None if unknown."""
        try:
            commit = self.writer.append(txn_samples(txn.tag, txn.n), txn_id=txn.txn_id)
        except CommitStateUnknownError:
            return None
        except StorageError:
            return "failed"  # txstore says "unknown" whenever a write may have landed
        return commit.version

    def _settle(self, returned: list[tuple[int, Txn]], in_doubt: Txn | None) -> None:
        """Add to the model what the reports say landed, checking they are consistent."""
        new: dict[int, Txn] = {}
        if in_doubt is not None:
            self._look_for(in_doubt, new)
        for version, txn in returned:
            known = self._version_of(txn.tag, new)
            if known is not None:  # a repeat of a committed id reports that commit
                assert version == known, f"{txn} reported v{version}, its id is at v{known}"
            else:
                assert version not in new and version > len(self.model), (version, txn)
                new[version] = txn
        assert sorted(new) == list(range(len(self.model) + 1, len(self.model) + len(new) + 1))
        self.model += [new[v] for v in sorted(new)]

    def _look_for(self, txn: Txn, new: dict[int, Txn]) -> None:
        """Whether an append of unknown outcome landed: the one case that asks the store, as
        its writer would have to (by retrying with the same txn id, or reading the log)."""
        if self._version_of(txn.tag, new) is not None:
            return
        store = txstore.open(self.raw)
        for version in range(len(self.model) + 1, store.version + 1):
            if store.snapshot(version)[-1]["tag"] == txn.tag:
                new[version] = txn

    # -- the check after every step --------------------------------------------------------

    @invariant()
    def store_equals_model(self) -> None:
        if not hasattr(self, "raw"):
            return  # before create()
        store = txstore.open(self.raw)
        history = read_history(store)
        assert history.violations == []
        assert history.tags[1:] == [t.tag for t in self.model]
        for version, txn in enumerate(self.model[:-1], 1):  # format §8: markers below latest
            if txn.txn_id is not None:
                assert self.raw.exists(txn_marker_key(txn.txn_id)), f"no marker for v{version}"
        assert self.writer.version == len(self.model)


class LocalHistoryMachine(HistoryMachine):
    backend = "local"


def _budget(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


# Local disk fsyncs every object (a few ms each on a busy CI disk): fewer examples there; the
# protocol is the same, the memory backend explores it more widely.
TestMemoryHistory = HistoryMachine.TestCase
TestMemoryHistory.settings = _budget(200)
TestLocalHistory = LocalHistoryMachine.TestCase
TestLocalHistory.settings = _budget(60)
