"""Import a snapshot into the horde tables (``vecsched db load``)."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from vecsched.service.sql.schema import (
    _MAIN,
    HORDE_TABLES,
    capacity_returns,
    dispatch_priority_users,
    dispatches,
    excluded_pairs,
    init_db,
    worker_models,
    wp_allowed_workers,
    wp_models,
)
from vecsched.snapshot.schema import TABLES
from vecsched.snapshot.snapshot import ListColumn, Snapshot
from vecsched.snapshot.times import EARLIEST, LATEST

_CHUNK = 5000


def import_snapshot(
    engine: Engine,
    snapshot: Snapshot,
    *,
    replace: bool = True,
    shift_to: float | None = None,
) -> dict[str, int]:
    """Write a snapshot into the horde tables (bulk executemany, in one transaction).

    Parameters
    ----------
    engine : Engine
    snapshot : Snapshot
    replace : bool, default True
        Empty the horde tables first.
    shift_to : float, optional
        Move every time by ``shift_to - snapshot.now``, so that a recorded
        horde looks current at ``shift_to`` (used to seed the embedded demo).

    Returns
    -------
    dict
        Rows written per table.

    Examples
    --------
    >>> import vecsched
    >>> from vecsched.service.sql import load_horde, make_engine
    >>> engine = make_engine("sqlite://")
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z", "workers": [{"id": "w1", "user_id": "u",
    ...     "gentype": "text", "last_check_in": "2026-11-29T11:59:00Z", "models": ["m"]}],
    ...     "requests": []})
    >>> import_snapshot(engine, snap)["workers"]
    1
    >>> load_horde(engine, snap.now).model_lists("workers")
    [['m']]
    """
    init_db(engine)
    shift = 0.0 if shift_to is None else float(shift_to) - snapshot.now
    counts: dict[str, int] = {}
    with engine.begin() as conn:
        if replace:
            for table in reversed(HORDE_TABLES):
                conn.execute(table.delete())
        events = {"dispatches": (dispatches, {}), "capacity_returns": (capacity_returns, {})}
        for name, (table, renames) in {**_MAIN, **events}.items():
            t = getattr(snapshot, name)
            spec = [c for c in TABLES[name] if c.kind != "str_list"]
            cols = {}
            for col in spec:
                values = t.columns[col.name]
                if col.kind == "time":
                    cols[col.name] = _datetimes(values + shift)
                elif col.kind == "enum":
                    cols[col.name] = [col.choices[v] for v in values.tolist()]
                elif col.kind == "float":
                    cols[col.name] = [None if math.isnan(v) else v for v in values.tolist()]
                else:
                    cols[col.name] = values.tolist()
            names = [renames.get(c.name, c.name) for c in spec]
            rows = [dict(zip(names, r)) for r in zip(*(cols[c.name] for c in spec))]
            _insert(conn, table, rows)
            counts[table.name] = len(rows)
        for name, table, key, value, column in (
            ("workers", worker_models, "worker_id", "model", "models"),
            ("requests", wp_models, "wp_id", "model", "models"),
            ("requests", wp_allowed_workers, "wp_id", "worker_id", "worker_ids"),
            ("dispatches", dispatch_priority_users, "dispatch_id", "user_id", "priority_user_ids"),
        ):
            t = getattr(snapshot, name)
            lc: ListColumn = t.columns[column]
            values = snapshot.model_names[lc.values] if column == "models" else lc.values
            owners = t.id[lc.owners()]
            positions = np.arange(len(lc.values)) - np.repeat(lc.offsets[:-1], lc.lengths)
            rows = [
                {key: o, "position": p, value: v}
                for o, p, v in zip(owners.tolist(), positions.tolist(), values.tolist())
            ]
            _insert(conn, table, rows)
            counts[table.name] = len(rows)
        pairs = sorted(
            set(zip(snapshot.excluded_pairs.worker_id.tolist(), snapshot.excluded_pairs.request_id.tolist()))
        )
        _insert(conn, excluded_pairs, [{"worker_id": w, "wp_id": r} for w, r in pairs])
        counts["excluded_pairs"] = len(pairs)
    return counts


def _insert(conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    # executemany in chunks: psycopg 3 pipelines each chunk, SQLite runs it
    # natively; chunking bounds client memory and keeps every statement
    # well under PostgreSQL's 65,535 bind-parameter limit.
    for start in range(0, len(rows), _CHUNK):
        conn.execute(table.insert(), rows[start : start + _CHUNK])


def _datetimes(seconds: np.ndarray) -> list[datetime | None]:
    # A shifted "never" (9999-12-31) stays the last instant a datetime holds instead of failing the load.
    clipped = np.clip(seconds, EARLIEST, LATEST).tolist()
    return [None if not math.isfinite(s) else datetime.fromtimestamp(s, tz=timezone.utc) for s in clipped]
