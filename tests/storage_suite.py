"""The storage contract (txstore/storage/base.py) as one class of tests.

A backend's test module subclasses ``StorageSuite``, gives the ``storage`` fixture (a fresh,
empty store) and a ``failing_storage`` one (where every call meets an I/O error), and sets the
class attributes that say what the backend declares. Pytest does not collect this class
itself (its name does not start with ``Test``); it collects each subclass.

Run as a module, it is the other process of the cross-process tests: ``python -m
tests.storage_suite <json>`` (see ``_child``).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from txstore.errors import AlreadyExistsError, ConflictError, NotFoundError, StorageError
from txstore.storage import Storage, open_storage

_ROOT = Path(__file__).resolve().parent.parent


def in_another_process(storage: Storage, *steps: tuple[str, str, str]) -> list[Any]:
    """Run ``steps`` (op, key, hex data) on ``storage`` reopened from its URI and options in
    a new Python process; each step's answer: the bytes read (hex), "ok", or the error's type
    name."""
    request = {"uri": storage.uri, "options": storage.storage_options, "steps": steps}
    path = os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "tests.storage_suite", json.dumps(request)],
        cwd=_ROOT,
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answers: list[Any] = json.loads(done.stdout)
    return answers


def _child(request: dict[str, Any]) -> list[Any]:
    storage = open_storage(request["uri"], request["options"] or None)
    answers: list[Any] = []
    for op, key, data in request["steps"]:
        try:
            if op == "read":
                answers.append(storage.read(key).hex())
            elif op == "write":
                storage.write(key, bytes.fromhex(data))
                answers.append("ok")
            elif op == "swap":
                _, token = storage.read_with_token(key)
                storage.compare_and_swap(key, bytes.fromhex(data), token)
                answers.append("ok")
            elif op == "delete":
                storage.delete(key)
                answers.append("ok")
            elif op == "put":
                storage.put_if_absent(key, bytes.fromhex(data))
                answers.append("ok")
            else:
                raise ValueError(op)
        except (NotFoundError, AlreadyExistsError, ConflictError) as e:
            answers.append(type(e).__name__)
    return answers


class StorageSuite:
    """Every test of the storage contract. Subclasses set:"""

    #: Whether an object just written and read is answered from memory (``is_cached``).
    cached_after_read: bool
    #: What the backend declares: ``shared_across_processes``, ``is_remote``.
    shared_across_processes: bool
    is_remote: bool
    #: Whether the objects are files on this machine (``local_path`` is not None).
    has_local_path: bool

    @pytest.fixture
    def storage(self) -> Storage:
        raise NotImplementedError("a backend's test module gives its storage")

    @pytest.fixture
    def failing_storage(self) -> Storage:
        """The backend where every call fails with an I/O error (not a missing key)."""
        raise NotImplementedError("a backend's test module gives its failing storage")

    @pytest.fixture
    def strict_storage(self, storage: Storage) -> Storage:
        """The backend where racing conditional writes must have one winner; an S3 server
        whose conditional writes are not atomic (moto) is replaced by one whose are."""
        return storage

    # -- reads and writes ------------------------------------------------------------------

    def test_write_read_and_ranges(self, storage: Storage) -> None:
        storage.write("chunks/a.chunk", b"0123456789")
        assert storage.read("chunks/a.chunk") == b"0123456789"
        assert storage.read_range("chunks/a.chunk", 2, 5) == b"234"
        assert storage.read_range("chunks/a.chunk", 8, 20) == b"89"
        storage.write("chunks/a.chunk", b"new")
        assert storage.read("chunks/a.chunk") == b"new"

    def test_read_ranges_returns_each_range_in_order(self, storage: Storage) -> None:
        payload = os.urandom(3 * 1024 * 1024 + 17)
        storage.write("chunks/parts.chunk", payload)
        # Parts of a whole object (as a chunk is streamed), out of order, overlapping, past
        # the end, and more of them than the backend keeps in flight.
        step = len(payload) // 40 + 1
        ranges = [(start, start + step) for start in range(0, len(payload), step)]
        ranges += [(10, 20), (5, 15), (len(payload) - 3, len(payload) + 100), (0, 1)]
        random.Random(7).shuffle(ranges)
        got = storage.read_ranges("chunks/parts.chunk", ranges)
        assert got == [payload[start:end] for start, end in ranges]
        assert storage.read_ranges("chunks/parts.chunk", []) == []
        with pytest.raises(NotFoundError):
            storage.read_ranges("chunks/absent.chunk", [(0, 4), (4, 8)])

    def test_read_ranges_into_hands_each_range_over_once(self, storage: Storage) -> None:
        """The bytes of a chunk's parts as they arrive (any order, any thread, a part in one
        call or several), each at its offset: written into a file there they make the object
        again, every byte once."""
        payload = os.urandom(3 * 1024 * 1024 + 17)
        storage.write("chunks/into.chunk", payload)
        step = len(payload) // 40 + 1
        ranges = [
            (start, min(len(payload), start + step)) for start in range(0, len(payload), step)
        ]
        lock = threading.Lock()
        given: list[tuple[int, bytes]] = []

        def put(start: int, pieces: list[bytes]) -> None:
            with lock:
                given.append((start, b"".join(pieces)))

        def tiles(calls: list[tuple[int, bytes]], start: int) -> bytes:
            """The calls' bytes, checked to follow each other from ``start`` on."""
            out = b""
            for offset, data in sorted(calls):
                assert offset == start + len(out)
                out += data
            return out

        storage.read_ranges_into("chunks/into.chunk", ranges, put)
        for start, end in ranges:  # disjoint: each call lies in one of them
            assert tiles([c for c in given if start <= c[0] < end], start) == payload[start:end]
        assert sum(len(data) for _, data in given) == len(payload)
        given.clear()
        # one range far larger than a backend hands over at once
        storage.read_ranges_into("chunks/into.chunk", [(5, len(payload))], put)
        assert tiles(given, 5) == payload[5:]
        with pytest.raises(NotFoundError):
            storage.read_ranges_into("chunks/absent.chunk", [(0, 4), (4, 8)], put)

        def refuse(start: int, pieces: list[bytes]) -> None:
            if start:
                raise OSError(f"no room for the part at {start}")

        with pytest.raises(OSError, match="no room for the part at"):
            storage.read_ranges_into("chunks/into.chunk", ranges, refuse)

    def test_read_many_reads_each_key_and_none_for_missing_ones(self, storage: Storage) -> None:
        objects = {f"segments/{i}.json": os.urandom(100 + i) for i in range(40)}
        for key, data in objects.items():
            storage.write(key, data)
        keys = [*objects, "segments/absent.json", "versions/index.v9.json"]
        random.Random(3).shuffle(keys)
        assert storage.read_many(keys) == [objects.get(key) for key in keys]
        assert storage.read_many([]) == []

    def test_read_buffer_is_the_whole_object_and_outlives_a_delete(self, storage: Storage) -> None:
        payload = bytes(range(256)) * 4099  # over a page, not a whole number of pages
        storage.write("chunks/big.chunk", [payload[:1000], memoryview(payload)[1000:]])
        storage.write("chunks/empty.chunk", b"")
        view = storage.read_buffer("chunks/big.chunk")
        assert bytes(view) == payload
        assert bytes(storage.read_buffer("chunks/empty.chunk")) == b""
        # The tail a reader wants first (a footer) changes nothing it gets, whatever its size.
        for tail in (1, 300, 4096, 4097, len(payload), len(payload) + 5000):
            assert bytes(storage.read_buffer("chunks/big.chunk", tail=tail)) == payload
        assert bytes(storage.read_buffer("chunks/empty.chunk", tail=100)) == b""
        # A reader holding a chunk keeps its bytes while maintenance deletes the file.
        storage.delete("chunks/big.chunk")
        assert bytes(view[-300:]) == payload[-300:]
        with pytest.raises(NotFoundError):
            storage.read_buffer("chunks/big.chunk")

    def test_reads_see_a_rewrite_by_this_process(self, storage: Storage) -> None:
        """A range read after a rewrite is of the new object, whatever a backend kept from
        the read before (a map of the old file): write, swap, delete and put, each."""
        key = "HEAD"
        versions = [b"a" * 5000, b"b" * 5000, b"c" * 40, b"d" * 9000, b"e" * 9000]
        storage.write(key, versions[0])

        def check(expected: bytes) -> None:
            assert storage.read_range(key, 10, 30) == expected[10:30]
            assert bytes(storage.read_range_view(key, 10, 30)) == expected[10:30]
            assert bytes(storage.read_buffer(key)) == expected
            assert storage.read(key) == expected

        check(versions[0])
        storage.write(key, versions[1])  # the same size
        check(versions[1])
        _, token = storage.read_with_token(key)
        storage.compare_and_swap(key, versions[2], token)  # shorter
        check(versions[2])
        storage.delete(key)
        storage.put_if_absent(key, versions[3])
        check(versions[3])
        storage.write(key, [versions[4][:100], versions[4][100:]])
        check(versions[4])

    def test_read_range_sees_a_rewrite_by_another_process(self, storage: Storage) -> None:
        if not self.shared_across_processes:
            pytest.skip("another process cannot open this store")
        key = "versions/retention.json"
        storage.write(key, b"1" * 6000)
        assert storage.read_range(key, 100, 110) == b"1" * 10
        assert in_another_process(storage, ("write", key, (b"2" * 6000).hex())) == ["ok"]
        assert storage.read_range(key, 100, 110) == b"2" * 10
        assert in_another_process(storage, ("swap", key, (b"3" * 50).hex())) == ["ok"]
        assert storage.read_range(key, 40, 60) == b"3" * 10
        assert storage.read(key) == b"3" * 50
        assert in_another_process(storage, ("delete", key, "")) == ["ok"]
        with pytest.raises(NotFoundError):
            storage.read_range(key, 0, 10)
        assert in_another_process(storage, ("put", key, (b"4" * 7000).hex())) == ["ok"]
        assert storage.read_range(key, 6990, 7010) == b"4" * 10

    def test_another_process_sees_the_objects_if_and_only_if_shared(self, storage: Storage) -> None:
        storage.write("chunks/mine", b"written here")
        expected = [b"written here".hex()] if self.shared_across_processes else ["NotFoundError"]
        assert in_another_process(storage, ("read", "chunks/mine", "")) == expected

    def test_is_cached_says_where_a_read_would_not_wait(self, storage: Storage) -> None:
        """A missing key is not cached, and asking never raises."""
        storage.write("chunks/c.chunk", bytes(3 * 4096 + 5))
        assert len(storage.read("chunks/c.chunk")) == 3 * 4096 + 5
        assert storage.is_cached("chunks/c.chunk") is self.cached_after_read
        assert storage.is_cached("chunks/absent.chunk") is False

    def test_missing_keys_raise_not_found(self, storage: Storage) -> None:
        with pytest.raises(NotFoundError):
            storage.read("nope")
        with pytest.raises(NotFoundError):
            storage.read_buffer("nope")
        with pytest.raises(NotFoundError):
            storage.read_range("nope", 0, 4)
        with pytest.raises(NotFoundError):
            storage.read_range_view("nope", 0, 4)
        with pytest.raises(NotFoundError):
            storage.read_range_fresh("nope", 0, 4)
        with pytest.raises(NotFoundError):
            storage.read_with_token("nope")
        assert not storage.exists("nope")
        assert not storage.exists("nope/deeper")
        storage.delete("nope")  # deleting what is absent is fine

    def test_put_if_absent_never_clobbers(self, storage: Storage) -> None:
        storage.put_if_absent("versions/index.v1.json", b"first")
        with pytest.raises(AlreadyExistsError):
            storage.put_if_absent("versions/index.v1.json", b"second")
        assert storage.read("versions/index.v1.json") == b"first"
        assert storage.exists("versions/index.v1.json")

    def test_compare_and_swap(self, storage: Storage) -> None:
        storage.compare_and_swap("HEAD", b"v1", None)
        with pytest.raises(ConflictError):
            storage.compare_and_swap("HEAD", b"v1 again", None)
        data, token = storage.read_with_token("HEAD")
        assert data == b"v1"
        storage.compare_and_swap("HEAD", b"v2", token)
        assert storage.read("HEAD") == b"v2"
        with pytest.raises(ConflictError):
            storage.compare_and_swap("HEAD", b"v3", token)  # stale token
        assert storage.read("HEAD") == b"v2"

    def test_list_and_delete(self, storage: Storage) -> None:
        for key in ["chunks/b", "chunks/a", "segments/s", "HEAD"]:
            storage.write(key, key.encode())
        listed = list(storage.list("chunks/"))
        assert [f.key for f in listed] == ["chunks/a", "chunks/b"]
        assert all(f.size == len(f.key) for f in listed)
        assert all(abs(f.mtime - time.time()) < 3600 for f in listed)
        storage.delete("chunks/a")
        assert [f.key for f in storage.list("chunks/")] == ["chunks/b"]
        assert list(storage.list("nothing/")) == []

    def test_io_errors_raise_storage_error_naming_the_key(self, failing_storage: Storage) -> None:
        """Not a missing key and not a silent False or empty listing: ``StorageError``,
        saying which key or folder. ``is_cached`` is a hint, and never raises."""
        storage = failing_storage
        key = "versions/index.v7.json"
        calls: dict[str, Callable[[], object]] = {
            "exists": lambda: storage.exists(key),
            "list": lambda: list(storage.list("versions/")),
            "read": lambda: storage.read(key),
            "read_range": lambda: storage.read_range(key, 0, 4),
            "read_ranges": lambda: storage.read_ranges(key, [(0, 4), (4, 8)]),
            "read_ranges_into": lambda: storage.read_ranges_into(
                key, [(0, 4), (4, 8)], lambda start, data: None
            ),
            "read_many": lambda: storage.read_many([key, key]),
            "read_buffer": lambda: storage.read_buffer(key),
            "read_with_token": lambda: storage.read_with_token(key),
            "write": lambda: storage.write(key, b"x"),
            "put_if_absent": lambda: storage.put_if_absent(key, b"x"),
            "compare_and_swap": lambda: storage.compare_and_swap(key, b"x", None),
            "delete": lambda: storage.delete(key),
        }
        for name, call in calls.items():
            where = "versions/" if name == "list" else key
            with pytest.raises(StorageError, match=re.escape(where)) as caught:
                call()
            assert not isinstance(caught.value, NotFoundError), name
        assert storage.is_cached(key) is False

    # -- what a backend declares -----------------------------------------------------------

    def test_capabilities_are_the_backends_own(self, storage: Storage) -> None:
        assert storage.shared_across_processes is self.shared_across_processes
        assert storage.is_remote is self.is_remote
        assert (storage.local_path is not None) is self.has_local_path
        reopened = open_storage(storage.uri, storage.storage_options or None)
        assert reopened.shared_across_processes is storage.shared_across_processes
        assert reopened.is_remote is storage.is_remote
        assert reopened.local_path == storage.local_path

    def test_local_path_holds_each_object_as_a_file(self, storage: Storage) -> None:
        if storage.local_path is None:
            pytest.skip("the objects are not files on this machine")
        storage.write("chunks/x.chunk", b"in a file")
        storage.put_if_absent("HEAD", b"head")
        root = Path(storage.local_path)
        assert (root / "chunks" / "x.chunk").read_bytes() == b"in a file"
        assert (root / "HEAD").read_bytes() == b"head"
        (root / "segments").mkdir()
        (root / "segments" / "s.json").write_bytes(b"made beside")
        assert storage.read("segments/s.json") == b"made beside"

    # -- concurrency -----------------------------------------------------------------------

    def test_racing_put_if_absent_has_one_winner(self, strict_storage: Storage) -> None:
        storage = strict_storage
        rounds, racers = 20, 6
        for r in range(rounds):
            key = f"versions/index.v{r}.json"
            barrier = threading.Barrier(racers)

            def race(i: int, key: str = key, barrier: threading.Barrier = barrier) -> bool:
                barrier.wait()
                try:
                    storage.put_if_absent(key, f"writer {i}".encode())
                    return True
                except AlreadyExistsError:
                    return False

            with ThreadPoolExecutor(racers) as pool:
                wins = list(pool.map(race, range(racers)))
            assert sum(wins) == 1, f"round {r}: {sum(wins)} winners"
            assert storage.read(key) == f"writer {wins.index(True)}".encode()

    def test_readers_never_see_partial_writes(self, storage: Storage) -> None:
        big = [bytes([i]) * 2_000_000 for i in range(3)]
        storage.write("chunks/x", big[0])
        stop = threading.Event()
        torn: list[int] = []

        def reader() -> None:
            while not stop.is_set():
                data = storage.read("chunks/x")
                if len(data) != len(big[0]) or data.count(data[:1]) != len(data):
                    torn.append(len(data))

        thread = threading.Thread(target=reader)
        thread.start()
        for i in range(12):
            storage.write("chunks/x", big[i % 3])
        stop.set()
        thread.join()
        assert torn == []

    def test_range_reads_of_many_files_from_many_threads_return_their_own_bytes(
        self, storage: Storage
    ) -> None:
        # More files than a backend keeps open, read at random by threads while others delete
        # and rewrite unrelated keys: every range must come from its own file. A remote
        # backend keeps no file open (each read is a request): fewer files and reads serve.
        count, reads, churns = (40, 60, 80) if self.is_remote else (150, 150, 200)
        files = {f"chunks/{i:03d}.chunk": bytes([i]) * (3000 + i) for i in range(count)}
        for key, data in files.items():
            storage.write(key, data)
        keys = sorted(files)

        def reader(seed: int) -> list[str]:
            rng = random.Random(seed)
            wrong = []
            for _ in range(reads):
                key = rng.choice(keys)
                start = rng.randrange(0, 2000)
                got = storage.read_range(key, start, start + 500)
                if got != files[key][start : start + 500]:
                    wrong.append(key)
            return wrong

        def churn() -> None:
            for i in range(churns):
                storage.write(f"other/{i % 7}", b"x" * i)
                storage.delete(f"other/{(i + 3) % 7}")

        with ThreadPoolExecutor(6) as pool:
            results = [pool.submit(reader, seed) for seed in range(5)]
            pool.submit(churn).result()
            assert [k for r in results for k in r.result()] == []

    # -- what writes take ------------------------------------------------------------------

    def test_writes_of_many_parts_and_large_parts_keep_every_byte(self, storage: Storage) -> None:
        # Local writes go out in writev calls ending at 512 KiB-aligned offsets, each followed
        # by a writeback hint, of at most 1024 buffers: cover the splits.
        rng = random.Random(7)
        parts: list[bytes | memoryview] = [
            bytes([i % 251]) * rng.randrange(0, 40) for i in range(3000)
        ]
        parts += [os.urandom(3 * 2**20 + 5), b"", memoryview(os.urandom(2**20))[3:], b"end"]
        parts += [bytes([i % 13]) * 2**19 for i in range(5)]
        storage.write("chunks/parts.chunk", parts)
        assert storage.read("chunks/parts.chunk") == b"".join(parts)

    def test_a_write_takes_its_buffers_from_an_iterator_once(self, storage: Storage) -> None:
        # Chunk writers hand over a generator that makes each buffer as it is asked for.
        made: list[bytes | memoryview] = []

        def buffers() -> Iterator[bytes | memoryview]:
            for i in range(40):
                part = bytes([i]) * (i * 40_000) if i % 3 else memoryview(b"xy" * i)
                made.append(part)
                yield part

        storage.write("chunks/streamed.chunk", buffers())
        assert len(made) == 40
        assert storage.read("chunks/streamed.chunk") == b"".join(made)

    # -- crossing process boundaries -------------------------------------------------------

    def test_storage_round_trips_through_pickle(self, storage: Storage) -> None:
        # DataLoader workers get the storage pickled: as its URI and options.
        storage.write("k", b"v")
        clone = pickle.loads(pickle.dumps(storage))
        assert type(clone) is type(storage)
        assert clone.uri == storage.uri
        assert clone.read("k") == b"v"

    def test_open_storage_reopens_the_uri(self, storage: Storage) -> None:
        storage.write("segments/s", b"seg")
        assert open_storage(storage) is storage
        reopened = open_storage(storage.uri, storage.storage_options or None)
        assert type(reopened) is type(storage)
        assert reopened.read("segments/s") == b"seg"


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
