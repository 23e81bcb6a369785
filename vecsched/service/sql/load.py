"""The set-based loader: the horde tables into a checked :class:`~vecsched.Snapshot`.

The loader runs one query per table and turns the result straight into column
arrays; no ORM object is made per row. On PostgreSQL (psycopg 3) each table is
read as one row of binary arrays that NumPy parses, a few times faster than
rows of Python objects, every table's query sent at once (libpq pipeline mode,
a large table in block ranges) so PostgreSQL aggregates one while NumPy parses
another; SQLite reads rows. Both paths share the judging of
values, so they load the same snapshot. It loads values as they are and lets
:meth:`Snapshot.from_columns` judge them, so a bad row (negative threads, an
unknown gentype string, a NULL in a required column) becomes a
:class:`~vecsched.RowError` and is left out instead of failing the load.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
from sqlalchemy.engine import Connection, Engine

from vecsched.service.sql.generic import _Fallback, _GenericFetch, _list_column, _Raw, RowNumbers
from vecsched.service.sql.pg import _PgFetch
from vecsched.service.sql.events import EVENT_FILTERS, HISTORY_SECONDS, cut_params
from vecsched.service.sql.schema import (
    _MAIN,
    capacity_returns,
    dispatch_priority_users,
    dispatches,
    worker_models,
    wp_allowed_workers,
    wp_models,
)
from vecsched.snapshot.schema import REQUIRED, TABLES, Column, RowError, _as_id
from vecsched.snapshot.snapshot import Snapshot


def _fast_path(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


def load_horde(conn: Engine | Connection, now: float, *, fast: bool = True,
               history: float = HISTORY_SECONDS) -> Snapshot:
    """Read the horde from SQL into a :class:`Snapshot` taken at ``now``.

    One query per table (a large table's in parts on PostgreSQL). Bad rows are left out and described in
    :attr:`Snapshot.rejected`. On PostgreSQL through psycopg each table comes
    back as one row of binary arrays that NumPy parses without a Python object
    per value; elsewhere (SQLite) rows are read and turned into column arrays.
    Both give the same snapshot.

    Parameters
    ----------
    conn : Engine or Connection
        Where the horde tables live (SQLite or PostgreSQL).
    now : float
        The snapshot instant, epoch seconds.
    fast : bool, default True
        Use the PostgreSQL fast path when the database allows it; ``False``
        forces the generic path (for comparisons).
    history : float, default HISTORY_SECONDS
        Seconds of returned dispatches and returns before ``now`` to read (every dispatch still
        active is read whatever its age); ``math.inf``: every event row (``vecsched db dump``).

    Returns
    -------
    Snapshot

    Examples
    --------
    >>> from vecsched.service.sql import init_db, make_engine
    >>> engine = make_engine("sqlite://")
    >>> init_db(engine)
    >>> load_horde(engine, 0.0)
    <Snapshot at 1970-01-01T00:00:00Z: 0 workers, 0 requests, 0 jobs, 0 rejected rows>
    """
    if isinstance(conn, Engine):
        # One transaction so the tables are read at one instant (PostgreSQL
        # REPEATABLE READ; SQLite's read transaction is a snapshot already).
        with conn.connect() as c:
            if c.dialect.name == "postgresql":
                c = c.execution_options(isolation_level="REPEATABLE READ")
            with c.begin():
                return load_horde(c, now, fast=fast, history=history)
    if fast and _fast_path(conn):
        fetch = _PgFetch(conn)
        try:
            with fetch.serial_plans():
                return _load(conn, now, fetch, history)
        except _Fallback:
            pass  # same transaction, so the generic read sees the same rows
    return _load(conn, now, _GenericFetch(conn), history)


def _spec(name: str) -> list[Column]:
    """The columns of table ``name`` read from its own table (list columns come from link tables)."""
    return [c for c in TABLES[name] if c.kind != "str_list"]


_LINKS = (("workers", "models", worker_models, "worker_id", "model"),
          ("requests", "models", wp_models, "wp_id", "model"),
          ("requests", "worker_ids", wp_allowed_workers, "wp_id", "worker_id"))
"""The list columns read from link tables: (table, column, link table, key column, value column)."""

_EVENTS = (("dispatches", dispatches), ("capacity_returns", capacity_returns))


def _reads(now: float, history: float) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """Every read of one load, in the order :func:`_load` takes the results (``_GenericFetch.read_all``)."""
    params = cut_params(now, history)
    return [
        *(("main", (table, renames, _spec(name)), {}) for name, (table, renames) in _MAIN.items()),
        *(("link", (link, key, value), {}) for _, _, link, key, value in _LINKS),
        ("pairs", (), {}),
        *(("main", (table, {}, _spec(name)), {"where": EVENT_FILTERS[name], "params": params})
          for name, table in _EVENTS),
        ("link", (dispatch_priority_users, "dispatch_id", "user_id"),
         {"where": EVENT_FILTERS["dispatch_priority_users"], "params": params}),
    ]


def _load(conn: Connection, now: float, fetch: "_GenericFetch", history: float) -> Snapshot:
    errors: list[RowError] = []
    tables: dict[str, dict[str, Any]] = {}
    got = fetch.read_all(_reads(now, history))
    for name in _MAIN:
        tables[name] = _judge(name, _spec(name), next(got), errors)
    rows = {name: RowNumbers(tables[name]["id"]) for name in ("workers", "requests")}
    for name, column, *_ in _LINKS:
        tables[name][column] = _list_column(*next(got), rows[name])
    pair_w, pair_r = next(got)
    _load_events(got, tables, errors)
    return Snapshot.from_columns(
        now,
        tables["workers"],
        tables["requests"],
        tables["jobs"],
        {"worker_id": pair_w, "request_id": pair_r},
        dispatches=tables["dispatches"],
        capacity_returns=tables["capacity_returns"],
        rejected=errors,
    )


def _load_events(got: Iterator[Any], tables: dict[str, Any], errors: list[RowError]) -> None:
    """The dispatches and returns section 7 needs (see :mod:`vecsched.service.sql.events`)."""
    for name, _ in _EVENTS:
        tables[name] = _judge(name, _spec(name), next(got), errors)
    users = next(got)
    tables["dispatches"]["priority_user_ids"] = _list_column(*users, RowNumbers(tables["dispatches"]["dispatch_id"]))


def _judge(name: str, spec: list[Column], raw: list[_Raw], errors: list[RowError]) -> dict[str, Any]:
    """Fill defaults, reject bad rows and type the columns of one table.

    Every fetch path hands over cells already judged by value (``_Raw.errors``);
    here NULLs take their defaults (or reject the row when the column is
    required) and each rejected row gets one RowError, in row order, for its
    first bad column, so both SQL paths report the very same list.
    """
    n = len(raw[0].values)
    bad = np.zeros(n, dtype=bool)
    ids = raw[0].values if raw[0].cells is None else raw[0].cells

    def reject(messages: dict[int, str], field: str) -> None:
        for k in sorted(messages):
            if not bad[k]:
                errors.append(RowError(name, int(k), _as_id(ids[k]), field, messages[k]))
                bad[k] = True

    out: dict[str, Any] = {}
    for col, r in zip(spec, raw):
        values = r.values
        messages: dict[int, str] = {}
        for mask, message in r.errors:
            messages.update(dict.fromkeys(np.flatnonzero(mask).tolist(), message))
        # A nullable float keeps NaN for NULL (speed: no samples).
        if r.null.any() and not (col.kind == "float" and col.nullable):
            nulls = np.flatnonzero(r.null)
            values = values.copy()
            if col.default is REQUIRED:
                messages.update(dict.fromkeys(nulls.tolist(), "is required (NULL in the database)"))
            elif isinstance(col.default, str) and col.default.startswith("="):
                values[nulls] = out[col.default[1:]][nulls]
            else:
                values[nulls] = col.choices.index(col.default) if col.kind == "enum" else col.default
        reject(messages, col.name)
        out[col.name] = values.astype(col.dtype) if col.kind == "enum" else values
    keep = ~bad
    result: dict[str, Any] = {k: v[keep] for k, v in out.items()}
    # Row numbers in later RowErrors count rows of the ordered SELECT.
    result["__row__"] = np.flatnonzero(keep)
    return result
