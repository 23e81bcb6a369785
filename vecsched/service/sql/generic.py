"""Reading the horde tables through any SQLAlchemy database: one query per table, rows to raw columns."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from vecsched.service.sql.schema import excluded_pairs
from vecsched.snapshot.schema import Column
from vecsched.snapshot.snapshot import ListColumn


def _epoch(engine_or_conn: Engine | Connection, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """Seconds since the epoch, computed by the database (one float per row)."""
    if engine_or_conn.dialect.name == "sqlite":
        # SQLAlchemy stores SQLite datetimes as UTC text with microseconds;
        # SQLite's own date functions would round them, so the text is read
        # raw and parsed in one vectorized pass (see _sqlite_epochs).
        return sa.type_coerce(column, sa.String())
    return sa.cast(sa.extract("epoch", column), sa.Float(53))


class _Raw:
    """One fetched column: ``values`` in the kind's base dtype, ``null`` where SQL NULL.

    Base dtypes: object (str, enum), bool, float64 (int, float, time; an int
    goes through float64 so an out-of-range value is rejected by the range
    rules instead of wrapping around).
    """

    __slots__ = ("values", "null")

    def __init__(self, values: np.ndarray, null: np.ndarray):
        self.values = values
        self.null = null


class _Fallback(Exception):
    """The fast path met a column type it does not parse; read generically instead."""


class _GenericFetch:
    """Rows through SQLAlchemy, one SELECT per table, turned into column arrays."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def main(
        self,
        table: sa.Table,
        renames: dict[str, str],
        spec: list[Column],
        where: sa.ColumnElement[bool] | None = None,
        params: dict[str, Any] | None = None,
    ) -> list[_Raw]:
        selected = []
        for col in spec:
            sql_col = table.c[renames.get(col.name, col.name)]
            selected.append(_epoch(self.conn, sql_col) if col.kind == "time" else sql_col)
        with _gc_paused():
            query = sa.select(*selected).order_by(*table.primary_key.columns)
            if where is not None:
                query = query.where(where)
            rows = self.conn.execute(query, params or {}).all()
            raw = list(zip(*rows)) if rows else [() for _ in spec]
            del rows
            return [_raw_from_list(col, list(values)) for col, values in zip(spec, raw)]

    def link(
        self,
        table: sa.Table,
        key: str,
        value: str,
        where: sa.ColumnElement[bool] | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[list[Any], list[Any]]:
        with _gc_paused():
            query = sa.select(table.c[key], table.c[value]).order_by(table.c[key], table.c.position)
            if where is not None:
                query = query.where(where)
            rows = self.conn.execute(query, params or {}).all()
            if not rows:
                return [], []
            keys, vals = zip(*rows)
            return list(keys), list(vals)

    def pairs(self) -> tuple[list[Any], list[Any]]:
        rows = self.conn.execute(sa.select(excluded_pairs.c.worker_id, excluded_pairs.c.wp_id)).all()
        return [p[0] for p in rows], [p[1] for p in rows]


def _raw_from_list(col: Column, values: list[Any]) -> _Raw:
    n = len(values)
    # ``None in`` runs in C; most columns have no NULL and skip the scan.
    if None in values:
        null = np.fromiter((v is None for v in values), dtype=bool, count=n)
    else:
        null = np.zeros(n, dtype=bool)
    if col.kind in ("str", "enum"):
        arr = np.empty(n, dtype=object)
        arr[:] = values
    elif col.kind == "bool":
        arr = np.asarray(values, dtype=bool) if n else np.zeros(0, dtype=bool)
    elif col.kind == "time" and any(isinstance(v, str) for v in values):
        arr = _sqlite_epochs(values)
    else:
        # int, float, time (PostgreSQL epoch floats): None -> NaN.
        arr = np.asarray(values, dtype=np.float64) if n else np.zeros(0)
    return _Raw(arr, null)


def _sqlite_epochs(values: list[Any]) -> np.ndarray:
    """Epoch seconds from SQLite datetime text (naive, UTC); NaN where unparsable."""
    out = np.full(len(values), np.nan)
    where = [k for k, v in enumerate(values) if isinstance(v, str)]
    if where:
        series = pd.Series([values[k] for k in where], dtype=object)
        parsed = pd.to_datetime(series, utc=True, errors="coerce", format="ISO8601")
        seconds = parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64) / 1e9
        seconds[parsed.isna().to_numpy()] = np.nan
        out[np.asarray(where)] = seconds
    return out


def _list_column(keys: list[Any], vals: list[Any], row_ids: np.ndarray) -> ListColumn:
    """A list column from link rows in (key, position) order; unknown keys ignored."""
    n = len(row_ids)
    if not keys:
        return ListColumn(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=object))
    owner = pd.Index(row_ids).get_indexer(pd.Index(keys, dtype=object))
    vals_arr = np.empty(len(vals), dtype=object)
    vals_arr[:] = vals
    known = owner >= 0
    owner, vals_arr = owner[known], vals_arr[known]
    # The rows are ordered by key and position; a stable sort by row keeps
    # the position order within each row (and costs nothing when the key
    # order already is the row order).
    order = np.argsort(owner, kind="stable")
    owner, vals_arr = owner[order], vals_arr[order]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=offsets[1:])
    return ListColumn(offsets, vals_arr)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while rows are read.

    Reading 50,000 rows makes millions of tuples and values, none of them in a
    cycle; each few hundred allocations the collector would walk them all for
    nothing (about a third of the fetch at 2,000 x 50,000). Collection resumes
    afterwards, and the previous state is restored even on error.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
