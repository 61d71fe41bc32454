"""A property-based fuzzer over every document the store reads.

Each example copies a small store that holds every kind of document (manifests, segments,
chunk files with their footers and frames, field files, HEAD, a tag, a lease, the retention
record, txn markers), applies one hostile mutation to one of them (or to a staged part handed
to a transaction), then runs every public operation: open, len / iteration / indexing of old
and latest snapshots, log, tags, leases, diff, verify and verify(deep=True), vacuum, expire,
append (twice with one txn_id), and the CLI's commands. Mutations: wrong types, out-of-range
numbers, unsafe and misplaced paths, disagreeing counts, dropped / duplicated / swapped list
entries, truncation, byte flips, deletion, data files moved into metadata folders or out of
the root, and forgeries: a footer, frame or segment changed and sealed again with valid
checksums, so that the change gets past them. tests/fuzzing.py has the details.

Properties, after every operation:

1. only ``TxstoreError`` subclasses escape (and ``IndexError`` for an index past ``len()``);
   the CLI returns an int, and never 2 (bad usage) for valid arguments;
2. nothing outside the store's root is read, written or deleted (sentinel files around the
   store, and an audit hook on file-system calls);
3. no manifest, tag, unexpired lease, txn marker or retention record is deleted;
4. acknowledged data stays readable, or the damage is reported: a version that reads back
   reads what was acknowledged (for forged documents: the acknowledged number of samples,
   and len, iteration and indexing agree); after a verify that finds nothing, every
   unexpired version reads back; vacuum and expire never make a version that read back
   unreadable unless damage was reported before; an acknowledged append is what every later
   reader sees last, and its txn_id never commits twice; the latest, tagged and leased
   versions never read as expired; a Store opened before the damage does not call it ok
   when a fresh one finds it; a staged part that a commit accepts leaves a version that
   reads back; a frame value the format cannot hold is refused, not handed out;
5. each example ends within 20 s of CPU and 1 GiB of memory (a hostile number must not make
   an operation loop or allocate without bound).

``test_fuzz_known`` runs the cases the store was seen to fail (``fuzzing.KNOWN``: a hole in
the chain, data files named in metadata folders, hostile footers and frame values, out-of-range
timestamps, a retention record naming the latest version, hostile staged parts), one test id
each. ``test_fuzz_documents`` then draws new mutations: by default a few per kind of document,
derandomized and on a template built with a fixed clock and seeded ids (the same examples and
bytes every run), so CI stays fast and stable. The long mode, by hand::

    PYTHONPATH=$PWD python -m pytest tests/test_fuzz.py -p no:cacheprovider -n 0 \\
        --fuzz-examples 2000 --fuzz-seed 12345

``--fuzz-seed`` draws random examples from that seed (print a new one with
``python -c 'import random; print(random.getrandbits(32))'``); without it the examples are
derandomized. Examples are not shrunk (each is one mutation already): a failure prints the
mutation and every property it broke.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, reject, seed, settings

from .fuzzing import (
    KINDS,
    KNOWN,
    Mutation,
    NotApplicable,
    Template,
    build_template,
    known_id,
    known_mutation,
    mutations,
    run_case,
)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    return build_template(tmp_path_factory.mktemp("fuzz-template") / "store")


@pytest.mark.parametrize("kind", KINDS)
def test_fuzz_documents(
    kind: str,
    template: Template,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    examples: int = request.config.getoption("--fuzz-examples")
    fuzz_seed: int | None = request.config.getoption("--fuzz-seed")
    base = tmp_path_factory.mktemp(f"fuzz-{kind}")
    numbers = itertools.count()

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=fuzz_seed is None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(m=mutations(kind))
    def one(m: Mutation) -> None:
        box = base / f"box{next(numbers)}"
        try:
            run = run_case(box, template, m)
        except NotApplicable:
            reject()
        finally:
            shutil.rmtree(box, ignore_errors=True)
        problems = "\n  ".join(str(v) for v in run.violations)
        assert not run.violations, f"{run.applied.label}: {run.applied.detail}\n  {problems}\n  {m}"

    if fuzz_seed is not None:
        one = seed(fuzz_seed)(one)
    one()


@pytest.mark.parametrize("number", range(len(KNOWN)), ids=known_id)
def test_fuzz_known(number: int, template: Template, tmp_path: Path) -> None:
    """The cases the store was seen to fail (fuzzing.KNOWN), each on its own."""
    m = known_mutation(template, number)
    run = run_case(tmp_path / "box", template, m)
    problems = "\n  ".join(str(v) for v in run.violations)
    assert not run.violations, f"{run.applied.label}: {run.applied.detail}\n  {problems}"


def test_template_reads_back(template: Template, tmp_path: Path) -> None:
    """The harness's own check: the unmutated store passes every property (else every
    failure above would be the harness's)."""
    m = Mutation(
        kind="staged",
        op="none",
        file=0,
        node=0,
        value=None,
        reseal=False,
        pos=0,
        byte=1,
        place="",
        frame_value=0,
        typed=False,
        number=0,
        text="",
        with_head=False,
        abort=False,
        stale=True,
    )
    run = run_case(tmp_path / "box", template, m)
    assert [str(v) for v in run.violations] == []
