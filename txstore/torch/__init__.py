"""PyTorch faces of a snapshot: a map- and iterable-style dataset and its loader, a weighted
mix of datasets, and token windows for language-model pretraining."""

from .dataset import (
    Piece,
    ResumeMismatchError,
    StreamingDataLoader,
    StreamingDataset,
    plan_worker,
    samples_per_rank,
)
from .mixing import MixedStreamingDataset
from .tokens import TokenStreamingDataLoader, TokenStreamingDataset

__all__ = [
    "MixedStreamingDataset",
    "Piece",
    "ResumeMismatchError",
    "StreamingDataLoader",
    "StreamingDataset",
    "TokenStreamingDataLoader",
    "TokenStreamingDataset",
    "plan_worker",
    "samples_per_rank",
]
