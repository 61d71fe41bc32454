"""Real processes racing to append to one store, on local disk and on S3."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import txstore

from .conftest import Backend
from .helpers import REPO, check_history


def test_racing_processes_all_land_exactly_once(shared_backend: Backend) -> None:
    writers, appends = 4, 25
    txstore.create(shared_backend.uri, **shared_backend.kwargs())
    options = json.dumps(shared_backend.storage_options or {})
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.child",
                "append-many",
                shared_backend.uri,
                options,
                str(w),
                str(appends),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(writers)
    ]
    acknowledged: dict[str, int] = {}
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        for line in out.splitlines():
            record = json.loads(line)
            acknowledged[record["tag"]] = record["version"]
    assert len(acknowledged) == writers * appends

    store = txstore.open(shared_backend.uri, **shared_backend.kwargs())
    assert store.version == writers * appends  # contiguous: 1..100, no gaps, no extras
    contents = check_history(store)
    final = contents[-1]
    tags = Counter(s["tag"] for s in final)
    assert tags == {tag: 3 for tag in acknowledged}  # each append present exactly once
    for tag, version in acknowledged.items():  # each at the version it reported
        added = contents[version][len(contents[version - 1]) :]
        assert {s["tag"] for s in added} == {tag}
    log = store.log()
    assert sorted(c.message for c in log if c.operation == "append") == sorted(acknowledged)
