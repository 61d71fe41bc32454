"""A version's schema (types and coverage), and readers asked for fields some samples lack."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import txstore
from txstore.torch import StreamingDataLoader, StreamingDataset

from .conftest import Backend
from .workers import REPO, run_cli


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """The runs [start, stop) where ``flags`` is true, computed here from the samples."""
    out: list[tuple[int, int]] = []
    for i, flag in enumerate(flags):
        if flag and out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        elif flag:
            out.append((i, i + 1))
    return out


def _has_text(i: int) -> bool:
    return i % 3 != 0


def _cascade(backend: Backend) -> txstore.Store:
    """v1: 400 pairs (a third without text); v2: latents for the first 300; v3: 100 more."""
    store = txstore.create(backend.uri, chunk_bytes=4096, block_bytes=512, **backend.kwargs())
    store.append(({"id": i, "text": f"t{i}"} if _has_text(i) else {"id": i}) for i in range(400))
    store.add_fields(
        lambda s: {"latent": np.full((2, 2), s["id"], dtype=np.float32)} if s["id"] < 300 else {},
        ["latent"],
    )
    store.append({"id": i, "text": f"t{i}"} for i in range(400, 500))
    return store


def test_schema_gives_types_and_coverage(backend: Backend) -> None:
    store = _cascade(backend)
    schema = store.snapshot().schema()
    assert (schema.version, schema.num_samples) == (3, 500)
    assert schema.names == ["id", "latent", "text"]
    text_flags = [_has_text(i) or i >= 400 for i in range(500)]
    expected = {
        "id": ("int", 500, [(0, 500)]),
        "latent": ("ndarray[float32, (2, 2)]", 300, [(0, 300)]),
        "text": ("str", sum(text_flags), _runs(text_flags)),
    }
    for name, (kind, count, ranges) in expected.items():
        field = schema[name]
        assert (field.type, field.count, list(field.ranges)) == (kind, count, ranges), name
        assert field.missing == 500 - count
    assert schema["latent"].lacking(3) == [300, 301, 302]
    assert schema["text"].lacking(4) == [0, 3, 6, 9]
    # Which versions appended the samples that have each field.
    assert list(schema.origins) == [(0, 400, 1), (400, 500, 3)]
    assert schema["id"].versions == ((1, 3),) and schema["id"].partly == ()
    assert schema["latent"].versions == () and schema["latent"].partly == (1,)
    assert schema["text"].versions == ((3, 3),) and schema["text"].partly == (1,)
    with pytest.raises(txstore.FieldNotFoundError, match="'nope'"):
        schema["nope"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        schema["id"].count = 0  # type: ignore[misc]
    assert "latent" not in store.snapshot(1).schema()
    store.drop_fields(["text"])
    assert store.snapshot().schema().names == ["id", "latent"]


def test_schema_of_a_rolled_back_and_compacted_version(tmp_path: Path) -> None:
    store = _cascade(Backend("local", str(tmp_path / "s")))
    store.rollback(2)  # v4: the 400 of v1, with latents for 300
    store.append({"id": i} for i in range(400, 420))  # v5
    store.compact()  # v6
    schema = store.snapshot().schema()
    assert list(schema.origins) == [(0, 400, 1), (400, 420, 5)]
    assert schema["id"].versions == ((1, 5),)
    assert list(schema["latent"].ranges) == [(0, 300)]


def test_a_reader_asked_for_a_field_some_samples_lack_fails_at_open(backend: Backend) -> None:
    snap = _cascade(backend).snapshot()
    with pytest.raises(txstore.FieldMissingError, match=r"200 of the 500 .* 'latent'") as e:
        snap.select(["id", "latent"])
    assert (e.value.field, e.value.count, e.value.samples) == (
        "latent",
        200,
        (300, 301, 302, 303, 304),
    )
    assert "missing_only=True" in str(e.value)
    assert isinstance(e.value, txstore.FieldNotFoundError)  # the family callers catch
    with pytest.raises(txstore.FieldMissingError, match="'text'") as e:
        snap.select(["text"])
    assert e.value.samples == (0, 3, 6, 9, 12)
    # Told what to do: skip those samples, or give them a value.
    skipped = list(snap.select(["id", "latent"], missing="skip"))
    assert [s["id"] for s in skipped] == list(range(300))
    filler = np.zeros((2, 2), dtype=np.float32)
    filled = list(snap.select(["id", "latent"], missing=filler))
    assert len(filled) == 500
    assert all((s["latent"] == (s["id"] if s["id"] < 300 else 0)).all() for s in filled)
    assert snap.select(["text"], missing="")[3] == {"text": ""}
    assert snap.select(["text"], missing="").zero_copy()[3] == {"text": ""}
    assert list(snap.select(["id"])) == [{"id": i} for i in range(500)]  # everyone has it


def test_streaming_dataset_fails_at_open_or_fills(tmp_path: Path) -> None:
    store = _cascade(Backend("local", str(tmp_path / "s")))
    with pytest.raises(txstore.FieldMissingError, match="'latent'"):
        StreamingDataset(store.snapshot(), fields=["id", "latent"])
    with pytest.raises(ValueError, match="cannot skip"):
        StreamingDataset(store.snapshot(), fields=["id", "latent"], missing="skip")
    filler = np.full((2, 2), -1, dtype=np.float32)
    ds = StreamingDataset(store.snapshot(), fields=["id", "latent"], missing=filler, shuffle=True)
    batches = list(StreamingDataLoader(ds, batch_size=32, num_workers=2))
    ids = np.concatenate([b["id"].numpy() for b in batches])
    latents = np.concatenate([b["latent"].numpy() for b in batches])
    assert sorted(ids.tolist()) == list(range(500))
    for i, latent in zip(ids.tolist(), latents, strict=True):
        assert (latent == (i if i < 300 else -1)).all()
    assert (ds[450]["latent"] == -1).all()


def _cli(*args: str) -> str:
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_info_and_show_print_the_schema(tmp_path: Path) -> None:
    uri = str(tmp_path / "s")
    _cascade(Backend("local", uri))
    text = _cli("info", uri)
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert "ndarray[float32, (2, 2)]" in lines["latent"] and " 300 " in lines["latent"]
    assert "0-299" in lines["latent"] and "in part v1" in lines["latent"]
    assert "500" in lines["id"] and "all" in lines["id"] and "v1-3" in lines["id"]
    info = json.loads(_cli("info", uri, "--json"))
    fields = {f["name"]: f for f in info["fields"]}
    assert fields["latent"]["count"] == 300 and fields["latent"]["ranges"] == [[0, 300]]
    assert fields["text"]["missing"] == len([i for i in range(400) if not _has_text(i)])
    shown = json.loads(_cli("show", uri, "1", "--json"))
    assert [f["name"] for f in shown["fields"]] == ["id", "text"]
    assert "latent" in _cli("show", uri, "2") and "latent" not in _cli("show", uri, "1")


def test_the_cascade_example_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "examples/cascade.py", str(tmp_path / "store")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "latent_256: 8,000 of 8,500 samples (500 missing)" in lines
    assert "a dataset refuses to open: 500 samples lack 'latent_256'" in lines
    assert "one epoch over version 5: 8,500 samples" in lines
    pinned = txstore.open(str(tmp_path / "store")).snapshot("train-512")
    assert [(f.name, f.count) for f in pinned.schema()][-2:] == [
        ("latent_256", 8500),
        ("latent_512", 8500),
    ]
