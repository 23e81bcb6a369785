"""The scheduling-event tables (SPEC section 7): which rows a cycle reads, and pruning.

A cycle needs the dispatches and capacity returns of the last
:data:`HISTORY_SECONDS` (section 7 looks back at most 300 s; twice that leaves
room for a slow cycle), plus every dispatch whose capacity came back after
that or not at all: an old dispatch still active is what a return in the
window is matched against. Both reads are one indexed, set-based query.
"""

from __future__ import annotations

import math

from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from vecsched.service.sql.schema import capacity_returns, dispatch_priority_users, dispatches

HISTORY_SECONDS = 600.0
"""How far back a cycle reads returns (and returned dispatches)."""

STALE_ACTIVE_SECONDS = 86_400.0
"""A dispatch never returned for this long is dropped by pruning: its worker is long gone."""

CUT = sa.bindparam("cut", type_=sa.DateTime(timezone=True))


def _not_returned_before_cut(dispatch_id: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    early = sa.select(capacity_returns.c.dispatch_id).where(
        capacity_returns.c.dispatch_id == dispatch_id, capacity_returns.c.returned_at < CUT
    )
    return ~sa.exists(early)


# table name -> the WHERE clause of the rows a cycle loads (parameter ``cut``)
EVENT_FILTERS: dict[str, sa.ColumnElement[bool]] = {
    "dispatches": _not_returned_before_cut(dispatches.c.dispatch_id),
    # A NULL time is loaded so that it is rejected and counted (as the JSON path does), not lost unseen;
    # it closes no dispatch before the cut either.
    "capacity_returns": (capacity_returns.c.returned_at >= CUT) | capacity_returns.c.returned_at.is_(None),
    "dispatch_priority_users": _not_returned_before_cut(dispatch_priority_users.c.dispatch_id),
}


def cut_params(now: float, history: float = HISTORY_SECONDS) -> dict[str, datetime]:
    """The bound parameters of :data:`EVENT_FILTERS` for a snapshot at ``now``, ``history`` seconds back.

    An infinite ``history`` keeps every row (``vecsched db dump``: the whole history, not a cycle's).
    """
    if not math.isfinite(history):
        return {"cut": datetime(1, 1, 2, tzinfo=timezone.utc)}
    return {"cut": datetime.fromtimestamp(now - history, tz=timezone.utc)}


def prune_events(conn: Engine | Connection, now: float) -> dict[str, int]:
    """Delete event rows no cycle can need any more; returns rows deleted per table.

    Returned dispatches go with their return once it is older than
    :data:`HISTORY_SECONDS`; a dispatch never returned goes after
    :data:`STALE_ACTIVE_SECONDS`. Dispatches go first so that a surviving
    dispatch never loses the return that closes it.

    Examples
    --------
    >>> from vecsched.service.sql import init_db, make_engine
    >>> engine = make_engine("sqlite://")
    >>> init_db(engine)
    >>> prune_events(engine, 0.0)
    {'dispatch_priority_users': 0, 'dispatches': 0, 'capacity_returns': 0}
    """
    if isinstance(conn, Engine):
        with conn.begin() as c:
            return prune_events(c, now)
    params = cut_params(now)
    stale = datetime.fromtimestamp(now - STALE_ACTIVE_SECONDS, tz=timezone.utc)
    old = sa.select(capacity_returns.c.dispatch_id).where(capacity_returns.c.returned_at < CUT)
    stale_ids = sa.select(dispatches.c.dispatch_id).where(dispatches.c.dispatched_at < stale)
    gone = sa.union(old, stale_ids)
    counts = {}
    for table in (dispatch_priority_users, dispatches):
        result = conn.execute(table.delete().where(table.c.dispatch_id.in_(gone)), params)
        counts[table.name] = result.rowcount
    result = conn.execute(capacity_returns.delete().where(capacity_returns.c.returned_at < CUT), params)
    counts["capacity_returns"] = result.rowcount
    return counts
