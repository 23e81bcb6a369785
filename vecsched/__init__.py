"""vecsched: every waiting AI Horde request's queue figures, computed at once.

The data's path, one module per stage (all private; this namespace is the API):

- load: :func:`load_snapshot` (JSON), :func:`load_horde` (SQL) -> :class:`Snapshot`
- arrays, eligibility, competition, figures: :func:`estimate` -> :class:`Estimates`
- publish: :func:`run_cycle`, :func:`open_store` (Redis, or SQLite when embedded)
- read: :func:`status`, :func:`prospective` (with an :class:`AllowancePolicy`)

Examples
--------
>>> import vecsched
>>> from vecsched import synthetic
>>> est = vecsched.estimate(synthetic.horde(workers=20, requests=200, seed=1))
>>> frame = est.to_frame()
>>> list(frame.columns[:3])
['gentype', 'eligible_workers', 'eligible_worker_threads']
"""

from __future__ import annotations

from typing import Any

from vecsched.snapshot.schema import RowError
from vecsched.core.estimate import estimate
from vecsched.core.result import EstimateOptions, Estimates
from vecsched.snapshot.snapshot import ListColumn, Snapshot, SnapshotError, Table, load_snapshot

# The service side (SQL, Redis, APScheduler) loads on first use, so that
# `import vecsched` stays light for notebooks and the status path.
_LAZY = {
    "status": ".service.read",
    "prospective": ".service.read",
    "AllowancePolicy": ".service.read",
    "run_cycle": ".service.job",
    "CycleReport": ".service.job",
    "SQLLoader": ".service.job",
    "RedisStore": ".service.store.redis",
    "SQLStore": ".service.store.sql",
    "open_store": ".service.config",
    "load_horde": ".service.sql",
    "import_snapshot": ".service.sql",
}

__all__ = [
    "AllowancePolicy",
    "CycleReport",
    "EstimateOptions",
    "Estimates",
    "ListColumn",
    "RedisStore",
    "RowError",
    "SQLLoader",
    "SQLStore",
    "Snapshot",
    "SnapshotError",
    "Table",
    "estimate",
    "import_snapshot",
    "load_horde",
    "load_snapshot",
    "open_store",
    "prospective",
    "run_cycle",
    "status",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vecsched' has no attribute {name!r}")
