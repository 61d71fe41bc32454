"""PyTorch faces of a snapshot: a map- and iterable-style dataset and its loader."""

from .dataset import (
    Piece,
    ResumeMismatchError,
    StreamingDataLoader,
    StreamingDataset,
    plan_worker,
    samples_per_rank,
)

__all__ = [
    "Piece",
    "ResumeMismatchError",
    "StreamingDataLoader",
    "StreamingDataset",
    "plan_worker",
    "samples_per_rank",
]
