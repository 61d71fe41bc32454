"""PyTorch faces of a snapshot: a map- and iterable-style dataset and its loader, and token
windows for language-model pretraining."""

from .dataset import (
    Piece,
    ResumeMismatchError,
    StreamingDataLoader,
    StreamingDataset,
    plan_worker,
    samples_per_rank,
)
from .tokens import TokenStreamingDataLoader, TokenStreamingDataset

__all__ = [
    "Piece",
    "ResumeMismatchError",
    "StreamingDataLoader",
    "StreamingDataset",
    "TokenStreamingDataLoader",
    "TokenStreamingDataset",
    "plan_worker",
    "samples_per_rank",
]
