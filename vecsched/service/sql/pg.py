"""The PostgreSQL fast path (psycopg 3): each table read as one row of binary arrays that NumPy parses."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from vecsched.service.sql.generic import (
    _bounded,
    _Fallback,
    _GenericFetch,
    _Raw,
    _raw_from_list,
)
from vecsched.service.sql.schema import excluded_pairs
from vecsched.snapshot.cells import INT_LIMIT, INT_RANGE, NOT_BOOL, NOT_FINITE, NOT_INT
from vecsched.snapshot.schema import Column

# PostgreSQL epoch (2000-01-01) in Unix microseconds, and the +-infinity timestamps.
_PG_EPOCH_US = 946_684_800_000_000
_INT64 = np.iinfo(np.int64)

# array type oid -> element dtype in the binary array format
_PG_ARRAYS = {
    1000: np.dtype("?"),  # bool[]
    1005: np.dtype(">i2"),  # int2[]
    1007: np.dtype(">i4"),  # int4[]
    1016: np.dtype(">i8"),  # int8[]
    1021: np.dtype(">f4"),  # float4[]
    1022: np.dtype(">f8"),  # float8[]
    1115: np.dtype(">i8"),  # timestamp[] (microseconds since 2000-01-01, read as UTC)
    1185: np.dtype(">i8"),  # timestamptz[]
}

_PG_TIMES = {1115, 1185}


class _PgArray:
    """A parsed 1-D binary array: ``values`` (native dtype), ``null`` mask, element ``oid`` kind."""

    __slots__ = ("values", "null", "time")

    def __init__(self, values: np.ndarray, null: np.ndarray, time: bool):
        self.values = values
        self.null = null
        self.time = time


def _parse_pg_array(data: Any, oid: int) -> _PgArray:
    """Parse PostgreSQL's binary array format for a fixed-width element type.

    Layout: ndim, has-null flag, element oid (int32 each); per dimension its
    length and lower bound; then per element an int32 byte length (-1 for
    NULL) and the big-endian value.
    """
    dtype = _PG_ARRAYS[oid]
    buf = memoryview(data).cast("B")
    ndim, hasnull = np.frombuffer(buf, dtype=">i4", count=2)
    native = dtype.newbyteorder("=")
    if ndim == 0:
        return _PgArray(np.zeros(0, dtype=native), np.zeros(0, dtype=bool), oid in _PG_TIMES)
    if ndim != 1:
        raise _Fallback(f"array of {ndim} dimensions")
    n = int(np.frombuffer(buf, dtype=">i4", count=1, offset=12)[0])
    start = 12 + 8 * ndim
    if not hasnull:
        # Every element is 4 length bytes and then the value: a fixed stride.
        rec = np.dtype([("len", ">i4"), ("v", dtype)])
        values = np.frombuffer(buf, dtype=rec, count=n, offset=start)["v"].astype(native)
        return _PgArray(values, np.zeros(n, dtype=bool), oid in _PG_TIMES)
    # With NULLs the stride varies. A fixed-width value's length word is 0..8,
    # a NULL's is -1, so one byte tells them apart; the walk only marks NULLs
    # and the value offsets follow from a running count.
    raw = bytes(buf)
    marks = bytearray(n)
    pos, step = start, 4 + dtype.itemsize
    for k in range(n):
        if raw[pos] == 0xFF:
            marks[k] = 1
            pos += 4
        else:
            pos += step
    if pos != len(raw):
        raise _Fallback("array of unexpected element width")
    null = np.frombuffer(marks, dtype=bool)
    present = ~null
    before = np.cumsum(present) - present  # values before each element
    offsets = start + 4 * (np.arange(n) + 1) + dtype.itemsize * before
    idx = offsets[present, None] + np.arange(dtype.itemsize)
    values = np.zeros(n, dtype=native)
    values[present] = np.frombuffer(raw, dtype=np.uint8)[idx].copy().view(dtype).ravel()
    return _PgArray(values, null.copy(), oid in _PG_TIMES)


def _pg_epochs(us: np.ndarray) -> np.ndarray:
    """Epoch seconds from PostgreSQL microseconds, equal to ``extract(epoch ...)::float8``.

    Both round the exact quotient once: below 2**53 the integer microseconds
    are exact in float64 and one IEEE division rounds correctly; beyond (past
    the year 2255) Python's int division does the same, value by value.
    """
    out = np.empty(len(us), dtype=np.float64)
    pos_inf, neg_inf = us == _INT64.max, us == _INT64.min
    small = (np.abs(us) < 2**53 - _PG_EPOCH_US) & ~pos_inf & ~neg_inf
    out[small] = (us[small] + _PG_EPOCH_US).astype(np.float64) / 1e6
    for k in np.flatnonzero(~small & ~pos_inf & ~neg_inf).tolist():
        out[k] = (int(us[k]) + _PG_EPOCH_US) / 1_000_000
    out[pos_inf] = np.inf
    out[neg_inf] = -np.inf
    return out


def _judge_array(col: Column, value: _PgArray) -> _Raw:
    """The generic path's judgement (:func:`~vecsched.snapshot.cells.judge_cells`) on a whole array.

    By value, as from any other source: an int column takes integers within
    range, a float column finite numbers, a bool column booleans or the
    integers 0 and 1; a column of another type fails the same cells the
    generic path fails, with the same message.
    """
    present = ~value.null
    kind = value.values.dtype.kind  # b, i or f
    if col.kind == "int":
        if kind != "i":
            return _Raw(np.zeros(len(present), np.int64), value.null, [(present, NOT_INT)])
        arr = value.values.astype(np.int64)
        bad = present & ((arr <= -INT_LIMIT) | (arr >= INT_LIMIT))
        arr[bad | value.null] = 0
        return _Raw(arr, value.null, [(bad, INT_RANGE)] if bad.any() else [])
    if col.kind == "bool":
        if kind == "b":
            return _Raw(value.values.astype(bool), value.null)
        ok = present & (kind == "i") & ((value.values == 0) | (value.values == 1))
        bad = present & ~ok
        return _Raw(ok & (value.values == 1), value.null, [(bad, NOT_BOOL)] if bad.any() else [])
    # float
    if kind == "b":
        return _Raw(np.zeros(len(present)), value.null, [(present, "must be a number")])
    arr = value.values.astype(np.float64)
    bad = present & ~np.isfinite(arr)
    arr[bad] = 0.0
    arr[value.null] = np.nan
    return _Raw(arr, value.null, [(bad, NOT_FINITE)] if bad.any() else [])


class _PgFetch(_GenericFetch):
    """One row of binary arrays per table over psycopg 3, parsed by NumPy."""

    def __init__(self, conn: Connection):
        super().__init__(conn)
        from psycopg.adapt import Loader
        from psycopg.pq import Format

        class ArrayLoader(Loader):
            format = Format.BINARY

            def load(self, data: Any) -> _PgArray:
                return _parse_pg_array(data, self.oid)

        self.raw = conn.connection.driver_connection
        self.loader = ArrayLoader

    @contextmanager
    def serial_plans(self) -> Iterator[None]:
        """No parallel plans in this transaction while the arrays are read.

        The arrays of one table keep one row order (the subquery's, by
        position for link tables) only if one process reads the rows; from
        PostgreSQL 16 on, array_agg may run as a parallel aggregate, whose
        partial arrays are joined in whatever order the workers finish. The
        previous setting is restored afterwards.
        """
        with self.raw.cursor() as cur:
            before = cur.execute(
                "SELECT current_setting('max_parallel_workers_per_gather'), "
                "set_config('max_parallel_workers_per_gather', '0', true)"
            ).fetchone()
        assert before is not None

        def restore() -> None:
            with self.raw.cursor() as cur:
                cur.execute("SELECT set_config('max_parallel_workers_per_gather', %s, true)", (before[0],))

        try:
            yield
        except _Fallback:
            restore()  # the generic read follows in this transaction
            raise
        # Not restored after a database error: that transaction is lost anyway.
        restore()

    # The statements never change; compiling them costs ~10 ms per load.
    _compiled: dict[tuple[str, str], str] = {}

    def _row(
        self, key: str, build: Callable[[], sa.Select[Any]], params: dict[str, Any] | None = None
    ) -> tuple[Any, ...]:
        cache_key = (self.conn.dialect.driver, key)
        sql = self._compiled.get(cache_key)
        if sql is None:
            sql = self._compiled[cache_key] = str(build().compile(dialect=self.conn.dialect))
        # A cursor of our own: the loaders registered on it change nothing
        # for other users of the connection.
        with self.raw.cursor(binary=True) as cur:
            for oid in _PG_ARRAYS:
                cur.adapters.register_loader(oid, self.loader)
            cur.execute(sql, params or None)
            row = cur.fetchone()
        assert row is not None  # an aggregate without GROUP BY returns one row
        return tuple(row)

    @staticmethod
    def _ordered_aggregate(
        columns: list[sa.ColumnElement[Any]], order_by: list[Any], where: sa.ColumnElement[bool] | None = None
    ) -> sa.Select[Any]:
        # Aggregates of one plain Agg node read the subquery's rows together,
        # in the subquery's order, so the arrays line up row by row.
        query = sa.select(*columns).order_by(*order_by)
        if where is not None:
            query = query.where(where)
        sub = query.subquery("s")
        return sa.select(*(sa.func.array_agg(c) for c in sub.c))

    def main(
        self,
        table: sa.Table,
        renames: dict[str, str],
        spec: list[Column],
        where: sa.ColumnElement[bool] | None = None,
        params: dict[str, Any] | None = None,
    ) -> list[_Raw]:
        def build() -> sa.Select[Any]:
            cols = [
                (_bounded(self.conn, c) if col.kind in ("str", "enum") else c).label(f"c{k}")
                for k, col, c in ((k, col, table.c[renames.get(col.name, col.name)]) for k, col in enumerate(spec))
            ]
            # No ORDER BY: the server sorting wide rows by text keys cost more than the whole
            # aggregate; the rows are put in key order here (_in_key_order).
            return self._ordered_aggregate(cols, [], where)

        row = self._row(f"main:{table.name}:{','.join(c.name for c in spec)}", build, params)
        raws = [self._raw(col, value) for col, value in zip(spec, row)]
        names = [renames.get(col.name, col.name) for col in spec]
        return _in_key_order(raws, [names.index(c.name) for c in table.primary_key.columns])

    @staticmethod
    def _raw(col: Column, value: Any) -> _Raw:
        if value is None:  # array_agg over no rows: nothing to parse, and no fallback
            return _raw_from_list(col, [])
        if isinstance(value, _PgArray):
            if col.kind == "time":
                if not value.time:
                    raise _Fallback(f"{col.name} is not a timestamp")
                return _Raw(_pg_epochs(value.values), value.null)
            if value.time or col.kind in ("str", "enum"):
                raise _Fallback(f"{col.name} has an unexpected type")
            return _judge_array(col, value)
        if col.kind == "time":
            raise _Fallback(f"{col.name} is not a timestamp")
        # Text (and any type without a NumPy parser): psycopg's loaders made
        # the Python objects the generic path would see.
        return _raw_from_list(col, list(value))

    def link(
        self,
        table: sa.Table,
        key: str,
        value: str,
        where: sa.ColumnElement[bool] | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[list[Any], list[Any]]:
        row = self._row(
            f"link:{table.name}:{key}:{value}",
            # Position order alone: the rows are grouped by key on the client (a stable integer
            # sort), cheaper than the server sorting the text keys.
            lambda: self._ordered_aggregate(
                [_bounded(self.conn, table.c[key]), _bounded(self.conn, table.c[value])],
                [table.c.position],
                where,
            ),
            params,
        )
        if row[0] is None:
            return [], []
        if isinstance(row[0], _PgArray) or isinstance(row[1], _PgArray):
            raise _Fallback(f"{table.name} keys are not text")
        return row[0], row[1]

    def pairs(self) -> tuple[list[Any], list[Any]]:
        row = self._row(
            "pairs",
            lambda: sa.select(
                sa.func.array_agg(_bounded(self.conn, excluded_pairs.c.worker_id)),
                sa.func.array_agg(_bounded(self.conn, excluded_pairs.c.wp_id)),
            ),
        )
        if row[0] is None:
            return [], []
        if isinstance(row[0], _PgArray) or isinstance(row[1], _PgArray):
            raise _Fallback("excluded_pairs ids are not text")
        return row[0], row[1]


def _in_key_order(raws: list[_Raw], key: list[int]) -> list[_Raw]:
    """The columns' rows sorted as ``ORDER BY`` the key columns ``raws[k]`` would under the C collation.

    Text keys compare by code point (the byte order of UTF-8, as the C
    collations of SQLite and PostgreSQL do), NULL keys last; a bad key cell
    sorts by the text as read. Every column, its NULL mask and its error
    masks follow the rows.
    """
    if not raws or len(raws[0].null) < 2:
        return raws
    sort_keys: list[np.ndarray] = []
    for k in reversed(key):  # np.lexsort sorts by its last key first
        raw = raws[k]
        cells = raw.values if raw.cells is None else np.asarray(raw.cells, dtype=object)
        if cells.dtype == object:
            cells = np.where(raw.null, "", cells).astype(str)
        sort_keys += [cells, raw.null] if raw.null.any() else [cells]
    order = np.argsort(sort_keys[0], kind="stable") if len(sort_keys) == 1 else np.lexsort(sort_keys)
    if (order[1:] > order[:-1]).all():
        return raws
    return [_Raw(r.values[order], r.null[order], [(mask[order], message) for mask, message in r.errors],
                 None if r.cells is None else [r.cells[i] for i in order]) for r in raws]
