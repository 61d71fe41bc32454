"""The store: versions, snapshots, history, refs, maintenance, fields and staged writes."""

from .core import Commit, Store, create, open

__all__ = ["Commit", "Store", "create", "open"]
