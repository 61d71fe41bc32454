"""The commit protocol: optimistic concurrency, retry, rebase, commit-state-unknown."""

from .commit import Build, CommitResult, RetryPolicy, commit
from .log import VersionLog, manifest_key, txn_marker_key
from .safety import ensure_safe

__all__ = [
    "Build",
    "CommitResult",
    "RetryPolicy",
    "VersionLog",
    "commit",
    "ensure_safe",
    "manifest_key",
    "txn_marker_key",
]
