"""The Lightning recipe (docs/lightning.md): a LightningDataModule over a pinned snapshot whose
StreamingDataLoader's place is saved in Lightning's checkpoint, and a resumed run that trains
on exactly the samples the interrupted one had not reached, in the same order."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

import txstore


def recipe() -> ModuleType:
    """The recipe's module, imported here rather than at collection (Lightning takes seconds)."""
    pytest.importorskip("torch")
    pytest.importorskip("pytorch_lightning")
    from . import lightning_recipe

    return lightning_recipe


def test_a_resumed_run_trains_on_the_rest_of_the_epoch_in_order(tmp_path: Path) -> None:
    r = recipe()
    uri = str(tmp_path / "st")
    store = txstore.create(uri, chunk_bytes="2KiB", compression=None)
    store.append({"id": i, "x": float(i % 5), "pad": bytes(64)} for i in range(r.N))
    version = store.version
    store.append({"id": r.N + i, "x": 0.0, "pad": b""} for i in range(8))  # not in the pin

    whole = r.Recorder()
    r.trainer(tmp_path / "whole", max_epochs=1).fit(whole, r.PinnedData(uri, version))
    assert sorted(whole.seen) == list(range(r.N))  # every pinned sample once, none newer

    # Interrupted mid-epoch: a checkpoint every STOP_AT steps, the first one kept, and the
    # run stopped there (as a preempted job stops).
    first = r.Recorder()
    keep = r.pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=r.STOP_AT, save_top_k=-1
    )
    r.trainer(tmp_path / "first", max_epochs=1, callbacks=[keep, r.StopAt(r.STOP_AT)]).fit(
        first, r.PinnedData(uri, version)
    )
    assert len(first.seen) == r.STOP_AT * r.BATCH
    (checkpoint,) = (tmp_path / "ckpt").iterdir()
    saved = r.torch.load(checkpoint, weights_only=True)  # plain data only: no pickled objects
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"], "no loader state saved"

    rest = r.Recorder()
    r.trainer(tmp_path / "rest", max_epochs=1).fit(
        rest, r.PinnedData(uri, version), ckpt_path=checkpoint
    )
    assert first.seen + rest.seen == whole.seen
