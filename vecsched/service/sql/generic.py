"""Reading the horde tables through any SQLAlchemy database: one query per table, rows to raw columns."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from itertools import repeat
from typing import Any, Iterable, Iterator

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.types import NullType

from vecsched.service.sql.schema import excluded_pairs
from vecsched.snapshot.cells import (
    MAX_STRING_BYTES,
    NOT_UTF8,
    UndecodableText,
    decode_text,
    judge_cells,
)
from vecsched.snapshot.schema import Column
from vecsched.snapshot.snapshot import ListColumn
from vecsched.snapshot.times import iso_seconds


def _epoch(engine_or_conn: Engine | Connection, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """Seconds since the epoch, computed by the database (one float per row)."""
    if engine_or_conn.dialect.name == "sqlite":
        # SQLAlchemy stores SQLite datetimes as UTC text with microseconds;
        # SQLite's own date functions would round them, so the text is read
        # raw and parsed in one vectorized pass (see _sqlite_epochs).
        return sa.type_coerce(column, sa.String())
    return sa.cast(sa.extract("epoch", column), sa.Float(53))


def _bounded(conn: Connection, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """A text cell longer than the string bound, cut in SQL to one character past it.

    The cell is rejected either way (too long); cutting it in the database
    keeps a 5 MB value from ever being fetched (sqlite3 and psycopg spend 17
    to 25 times a cell's size fetching it). SQLite counts bytes as a blob, so
    a NUL does not end the count. PostgreSQL reads the column as text, so a
    horde's uuid or integer key reads as its text, as SQLite's text affinity
    stores it.
    """
    limit = MAX_STRING_BYTES
    if conn.dialect.name == "sqlite":
        size, text = sa.func.length(sa.cast(column, sa.LargeBinary())), column
    elif conn.dialect.name == "postgresql":
        text = sa.cast(column, sa.Text())
        size = sa.func.octet_length(text)
    else:
        return column
    # Literal numbers: the fast path runs the compiled text without parameters.
    bound, one, cut = (sa.literal_column(str(v)) for v in (limit, 1, limit + 1))
    return sa.case((size > bound, sa.func.substr(text, one, cut)), else_=text)


class _Raw:
    """One fetched column: ``values`` typed for its kind, ``null`` where SQL NULL,
    ``errors`` the cells that are not what the column needs ``[(mask, message)]``.

    Typed: object (str), int64 codes (enum), bool, int64 (int), float64 (float,
    time). A bad cell holds a placeholder and is named in ``errors``; the
    loader turns those into RowErrors, so one bad cell costs its row, never
    the load.
    """

    __slots__ = ("values", "null", "errors", "cells")

    def __init__(
        self,
        values: np.ndarray,
        null: np.ndarray,
        errors: list[tuple[np.ndarray, str]] | None = None,
        cells: list[Any] | None = None,
    ):
        self.values = values
        self.null = null
        self.errors = errors or []
        # The cells as read, kept only when some are bad (an error names a bad id as it was).
        self.cells = cells


class _Fallback(Exception):
    """The fast path met a column type it does not parse; read generically instead."""


class _GenericFetch:
    """Rows through SQLAlchemy, one SELECT per table, turned into column arrays."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def read_all(self, reads: Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> Iterator[Any]:
        """The result of each read ``(method, args, kwargs)`` (``main``, ``link``, ``pairs``), in order, when asked."""
        return (getattr(self, name)(*args, **kwargs) for name, args, kwargs in reads)

    def main(
        self,
        table: sa.Table,
        renames: dict[str, str],
        spec: list[Column],
        where: sa.ColumnElement[bool] | None = None,
        params: dict[str, Any] | None = None,
    ) -> list[_Raw]:
        selected = []
        text_times = self._text_times(table, renames, spec)
        for col in spec:
            sql_col = table.c[renames.get(col.name, col.name)]
            # The raw cell, not what a SQLAlchemy type would make of it: SQLite
            # keeps any value in any column, and each is judged by value.
            if col.kind == "time" and col.name in text_times and self.conn.dialect.name == "postgresql":
                # As text, cut at the bound (SQLite's cells are read raw: a blob stays a blob, judged as one).
                sql_col = _bounded(self.conn, sa.cast(sql_col, sa.Text()))
            elif col.kind == "time":
                sql_col = _epoch(self.conn, sql_col)
            elif col.kind in ("str", "enum"):
                sql_col = _bounded(self.conn, sql_col)
            selected.append(sa.type_coerce(sql_col, NullType()))
        with _gc_paused():
            query = sa.select(*selected).order_by(*(_code_point_order(self.conn, c) for c in table.primary_key.columns))
            if where is not None:
                query = query.where(where)
            rows = self._all(query, params)
            raw = list(zip(*rows)) if rows else [() for _ in spec]
            del rows
            return [_raw_from_list(col, list(values), text_times=col.name in text_times) for col, values in zip(spec, raw)]

    def _text_times(self, table: sa.Table, renames: dict[str, str], spec: list[Column]) -> set[str]:
        """The time columns read as text and parsed here: all of them on SQLite; on PostgreSQL those
        the database does not type as timestamps (a view exposing ISO text), where extract(epoch)
        failed every cycle with a line naming no column. Their cells are judged as SQLite's are."""
        times = [col.name for col in spec if col.kind == "time"]
        if self.conn.dialect.name == "sqlite":
            return set(times)
        if self.conn.dialect.name != "postgresql" or not times:
            return set()
        typed = {c["name"]: c["type"] for c in sa.inspect(self.conn).get_columns(table.name)}
        stored = {name: typed.get(renames.get(name, name)) for name in times}
        return {name for name, kind in stored.items() if kind is not None and not isinstance(kind, (sa.DateTime, sa.Date))}

    def link(
        self,
        table: sa.Table,
        key: str,
        value: str,
        where: sa.ColumnElement[bool] | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[list[Any], list[Any], np.ndarray | None]:
        """Keys and values in key and position order (no positions needed: ``None``)."""
        with _gc_paused():
            columns = (_bounded(self.conn, table.c[key]), _bounded(self.conn, table.c[value]))
            query = sa.select(*columns).order_by(table.c[key], table.c.position)
            if where is not None:
                query = query.where(where)
            rows = self._all(query, params)
            if not rows:
                return [], [], None
            keys, vals = zip(*rows)
            return list(keys), list(vals), None

    def pairs(self) -> tuple[list[Any], list[Any]]:
        rows = self._all(sa.select(_bounded(self.conn, excluded_pairs.c.worker_id), _bounded(self.conn, excluded_pairs.c.wp_id)))
        return [p[0] for p in rows], [p[1] for p in rows]

    def _all(self, statement: sa.Select[Any], params: dict[str, Any] | None = None) -> list[Any]:
        """All rows of ``statement``; on SQLite, text that is not UTF-8 is read cell by cell.

        sqlite3 decodes every text cell as UTF-8 and fails the whole query on
        the first that is not. Only then is the statement read again with a
        text factory that turns such a cell into an :class:`UndecodableText`
        (the row is rejected by value); the usual read stays in C.
        """
        try:
            return self.conn.execute(statement, params or {}).all()
        except sa.exc.OperationalError as exc:
            if self.conn.dialect.name != "sqlite" or "decode" not in str(exc.orig).lower():
                raise
        driver = self.conn.connection.driver_connection
        before = driver.text_factory
        driver.text_factory = decode_text
        try:
            return self.conn.execute(statement, params or {}).all()
        finally:
            driver.text_factory = before


def _code_point_order(conn: Connection, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``column`` to sort by in code point order, as the fast path sorts ids (SQLite's BINARY already does).

    A PostgreSQL database of another collation (en_US.UTF-8, ICU) sorts ids otherwise, and the two
    paths then gave the same rows in different orders, with different row numbers in their errors.
    """
    if conn.dialect.name == "postgresql":
        # As text: the horde's uuid (or integer) keys take no collation, and the fast path sorts their text.
        return sa.cast(column, sa.Text()).collate("C")
    return column


def _raw_from_list(col: Column, values: list[Any], *, text_times: bool = False) -> _Raw:
    """Judge one column's cells by value (:func:`~vecsched.snapshot.cells.judge_cells`)."""
    if col.kind == "time":
        return _raw_times(values, text_times)
    arr, null, errors = judge_cells(col.kind, values, choices=col.choices, nullable=True, sql=True)
    return _Raw(arr, null, errors, values if errors and col.kind == "str" else None)


def _raw_times(values: list[Any], text: bool) -> _Raw:
    n = len(values)
    null = np.fromiter((v is None for v in values), dtype=bool, count=n) if None in values else np.zeros(n, bool)
    if text:
        # SQLite holds times as text; anything else in the column is not a time (NaN, rejected).
        arr = _sqlite_epochs(values)
        if UndecodableText not in set(map(type, values)):
            return _Raw(arr, null)
        undecodable = np.fromiter((isinstance(v, UndecodableText) for v in values), dtype=bool, count=n)
        return _Raw(arr, null, [(undecodable, NOT_UTF8)])
    # PostgreSQL: extract(epoch) floats, None for NULL.
    return _Raw(np.asarray(values, dtype=np.float64) if n else np.zeros(0), null)


def _sqlite_epochs(values: list[Any]) -> np.ndarray:
    """Epoch seconds from SQLite datetime text (naive, UTC); NaN where unparsable."""
    out = np.full(len(values), np.nan)
    where = [k for k, v in enumerate(values) if isinstance(v, str)]
    if where:
        out[np.asarray(where)] = iso_seconds(pd.Series([values[k] for k in where], dtype=object))
    return out


class RowNumbers:
    """Each id's row number in a table of ``count`` rows, its first row where it repeats.

    A later duplicate is rejected, never looked up. One per table, read by
    each of its link tables: building and probing a dict costs less than a
    pandas index per link table (about 3 + 3 ms at 50,000 ids and 55,000 keys).
    """

    __slots__ = ("of", "count")

    def __init__(self, row_ids: np.ndarray):
        ids = row_ids.tolist()
        self.count = len(ids)
        self.of: dict[Any, int] = dict(zip(reversed(ids), range(len(ids) - 1, -1, -1)))


def _list_column(keys: list[Any], vals: list[Any], positions: np.ndarray | None, rows: RowNumbers) -> ListColumn:
    """A list column from link rows; keys that are no row's id are ignored.

    ``rows`` maps a row's id to its number. Without
    ``positions`` the link rows are in position order within each key (keys
    in any order); with them, in any order, and ``positions`` orders each
    key's values.
    """
    n = rows.count
    if not keys:
        return ListColumn(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=object))
    owner = np.asarray(list(map(rows.of.get, keys, repeat(-1))), dtype=np.int64)
    vals_arr = np.empty(len(vals), dtype=object)
    vals_arr[:] = vals
    known = owner >= 0
    if not known.all():
        owner, vals_arr = owner[known], vals_arr[known]
        positions = None if positions is None else positions[known]
    # A stable sort by row keeps the position order within each row (and
    # costs little when the key order already is the row order).
    if positions is None:
        order = np.argsort(owner, kind="stable")
    elif len(owner) and 0 <= positions.min() and positions.max() < 2**31:
        order = np.argsort(owner * 2**31 + positions, kind="stable")  # one key sorts faster than two
    else:
        order = np.lexsort((positions, owner))
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
