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
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from vecsched.service.sql.schema import capacity_returns, dispatch_priority_users, dispatches

HISTORY_SECONDS = 600.0
"""How far back a cycle reads returns (and returned dispatches)."""

STALE_ACTIVE_SECONDS = 86_400.0
"""A dispatch never returned for this long is dropped by pruning: its worker is long gone."""

CUT = sa.bindparam("cut", type_=sa.DateTime(timezone=True))


class instant(FunctionElement):  # noqa: N801 - reads as the SQL function it compiles to
    """A time column or parameter compared as an instant, whatever text SQLite holds for it.

    SQLite keeps times as text and compares them as text: a time the horde wrote
    with an offset (``...-05:00``) or a ``T`` sorted on the wrong side of the
    cut, so a return in the window was never loaded (and was pruned) while one
    two hours old was loaded every cycle and never pruned. The loader itself
    parses those texts as times, so SQLite compares ``julianday()`` of both
    sides (a scan of the small event tables, as the embedded default has them);
    other databases compare the column itself, on its index.
    """

    type = sa.DateTime(timezone=True)
    inherit_cache = True


@compiles(instant)
def _instant(element: instant, compiler: Any, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(instant, "sqlite")
def _instant_sqlite(element: instant, compiler: Any, **kw: Any) -> str:
    return f"julianday({compiler.process(element.clauses, **kw)})"


class unreadable_time(FunctionElement):  # noqa: N801 - reads as the SQL it compiles to
    """True where SQLite holds text it cannot read as a time (``julianday()`` is NULL); elsewhere a
    time column holds times only, and the SQL stays as it was (no clause for the planner to weigh)."""

    type = sa.Boolean()
    inherit_cache = True


@compiles(unreadable_time)
def _unreadable(element: unreadable_time, compiler: Any, **kw: Any) -> str:
    return "1 = 0"


@compiles(unreadable_time, "sqlite")
def _unreadable_sqlite(element: unreadable_time, compiler: Any, **kw: Any) -> str:
    column = compiler.process(element.clauses, **kw)
    return f"({column} IS NOT NULL AND julianday({column}) IS NULL)"


def _returned_before_cut(dispatch_id: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    early = sa.select(capacity_returns.c.dispatch_id).where(
        capacity_returns.c.dispatch_id == dispatch_id, instant(capacity_returns.c.returned_at) < instant(CUT)
    )
    return sa.exists(early)


def _returned_since_cut(dispatch_id: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    late = sa.select(capacity_returns.c.dispatch_id).where(
        capacity_returns.c.dispatch_id == dispatch_id, instant(capacity_returns.c.returned_at) >= instant(CUT)
    )
    return sa.exists(late)


# table name -> the WHERE clause of the rows a cycle loads (parameter ``cut``)
EVENT_FILTERS: dict[str, sa.ColumnElement[bool]] = {
    "dispatches": ~_returned_before_cut(dispatches.c.dispatch_id),
    # A NULL time, or text SQLite cannot read as one (its julianday() is NULL), is loaded so that it
    # is rejected and counted (as the JSON path does), not lost unseen; it closes no dispatch before
    # the cut either.
    "capacity_returns": ((instant(capacity_returns.c.returned_at) >= instant(CUT))
                         | capacity_returns.c.returned_at.is_(None)
                         | unreadable_time(capacity_returns.c.returned_at)),
    "dispatch_priority_users": ~_returned_before_cut(dispatch_priority_users.c.dispatch_id),
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
    stale = sa.bindparam("stale", datetime.fromtimestamp(now - STALE_ACTIVE_SECONDS, tz=timezone.utc),
                         type_=sa.DateTime(timezone=True))
    old = sa.select(capacity_returns.c.dispatch_id).where(instant(capacity_returns.c.returned_at) < instant(CUT))
    # Never returned for a day, unless its return came in the window (a day-long job): that return
    # would lose the dispatch it closes, and read as incomplete history for ten minutes.
    stale_ids = sa.select(dispatches.c.dispatch_id).where(
        instant(dispatches.c.dispatched_at) < instant(stale), ~_returned_since_cut(dispatches.c.dispatch_id))
    gone = sa.union(old, stale_ids)
    counts = {}
    for table in (dispatch_priority_users, dispatches):
        result = conn.execute(table.delete().where(table.c.dispatch_id.in_(gone)), params)
        counts[table.name] = result.rowcount
    result = conn.execute(capacity_returns.delete().where(instant(capacity_returns.c.returned_at) < instant(CUT)),
                          params)
    counts["capacity_returns"] = result.rowcount
    return counts
