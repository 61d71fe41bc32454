"""The Lightning recipe (docs/lightning.md): a LightningDataModule over a pinned snapshot whose
StreamingDataLoader's place is saved in Lightning's checkpoint, and a resumed run that trains
on exactly the samples the interrupted one had not reached, in the same order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import txstore

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

N, BATCH, STOP_AT = 96, 4, 7


class Recorder(pl.LightningModule):
    """Trains a single weight and records the ids of every batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[int] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        self.seen += batch["id"].tolist()
        return ((self.w - batch["x"].float()) ** 2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class PinnedData(pl.LightningDataModule):
    """One pinned version of a store, shuffled, through a 2-worker StreamingDataLoader."""

    def __init__(self, uri: str, version: int) -> None:
        super().__init__()
        self.uri, self.version = uri, version

    def train_dataloader(self) -> Any:
        snap = txstore.open(self.uri).snapshot(self.version)
        dataset = txstore.StreamingDataset(snap, shuffle=True, seed=3)
        return txstore.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=2)


class StopAt(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def _trainer(tmp_path: Path, **kwargs: Any) -> Any:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing="callbacks" in kwargs,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        **kwargs,
    )


def test_a_resumed_run_trains_on_the_rest_of_the_epoch_in_order(tmp_path: Path):
    uri = str(tmp_path / "st")
    store = txstore.create(uri, chunk_bytes="2KiB", compression=None)
    store.append({"id": i, "x": float(i % 5), "pad": bytes(64)} for i in range(N))
    version = store.version
    store.append({"id": N + i, "x": 0.0, "pad": b""} for i in range(8))  # not in the pin

    whole = Recorder()
    _trainer(tmp_path / "whole", max_epochs=1).fit(whole, PinnedData(uri, version))
    assert sorted(whole.seen) == list(range(N))  # every pinned sample once, none newer

    # Interrupted mid-epoch: a checkpoint every STOP_AT steps, the first one kept, and the
    # run stopped there (as a preempted job stops).
    first = Recorder()
    keep = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=STOP_AT,
                                        save_top_k=-1)  # fmt: skip
    _trainer(tmp_path / "first", max_epochs=1, callbacks=[keep, StopAt(STOP_AT)]).fit(
        first, PinnedData(uri, version)
    )
    assert len(first.seen) == STOP_AT * BATCH
    (checkpoint,) = (tmp_path / "ckpt").iterdir()
    saved = torch.load(checkpoint, weights_only=True)  # plain data only: no pickled objects
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"], "no loader state saved"

    rest = Recorder()
    _trainer(tmp_path / "rest", max_epochs=1).fit(
        rest, PinnedData(uri, version), ckpt_path=checkpoint
    )
    assert first.seen + rest.seen == whole.seen
