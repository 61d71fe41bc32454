"""PyTorch faces of a snapshot: a map- and iterable-style dataset, a weighted mix of them, and
their loader."""

from .dataset import (
    Piece,
    ResumeMismatchError,
    StreamingDataLoader,
    StreamingDataset,
    plan_worker,
    samples_per_rank,
)
from .mixing import MixedStreamingDataset

__all__ = [
    "MixedStreamingDataset",
    "Piece",
    "ResumeMismatchError",
    "StreamingDataLoader",
    "StreamingDataset",
    "plan_worker",
    "samples_per_rank",
]
