"""vecsched: every waiting request's queue figures, computed at once."""

from ._columns import RowError
from ._estimates import EstimateOptions, Estimates, estimate
from ._snapshot import ListColumn, Snapshot, SnapshotError, Table, load_snapshot

__all__ = [
    "EstimateOptions",
    "Estimates",
    "estimate",
   "ListColumn", "RowError", "Snapshot", "SnapshotError", "Table", "load_snapshot"]
