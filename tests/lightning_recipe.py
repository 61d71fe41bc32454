"""The Lightning recipe's parts, for tests/test_lightning.py (imported by its test only, so
that collecting the suite does not import Lightning)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

import txstore

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


def trainer(tmp_path: Path, **kwargs: Any) -> Any:
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
