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
from vecsched.service.sql import packed
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
    _compiled: dict[tuple[Any, ...], str] = {}

    def _sql(self, key: tuple[Any, ...], build: Callable[[], sa.Select[Any]]) -> str:
        cache_key = (self.conn.dialect.driver, *key)
        sql = self._compiled.get(cache_key)
        if sql is None:
            sql = self._compiled[cache_key] = str(build().compile(dialect=self.conn.dialect))
        return sql

    def _execute(self, sql: str, params: dict[str, Any] | None, arrays: bool = False) -> tuple[tuple[Any, ...], list[int]]:
        """The one row of ``sql`` and its column type oids; ``arrays``: NumPy parses its numeric arrays."""
        # A cursor of our own: the loaders registered on it change nothing
        # for other users of the connection.
        with self.raw.cursor(binary=True) as cur:
            for oid in _PG_ARRAYS if arrays else ():
                cur.adapters.register_loader(oid, self.loader)
            cur.execute(sql, params or None)
            oids = [d.type_code for d in cur.description or ()]
            row = cur.fetchone()
        return (tuple(row) if row is not None else ()), oids

    def _columns(
        self,
        key: str,
        exprs: Callable[[], list[sa.ColumnElement[Any]]],
        text: list[bool],
        where: sa.ColumnElement[bool] | None,
        params: dict[str, Any] | None,
        accept: Callable[[list[int]], None] = lambda oids: None,
    ) -> list[Any]:
        """The cells of ``exprs()`` (labelled ``c0``, ``c1``...), one entry per column, rows in scan order.

        ``exprs`` is called only to compile a statement not seen before.

        Each entry is what :meth:`_raw` takes: a :class:`_PgArray` (fixed-width
        types), a list of cells (text, and types psycopg loads) or None (no
        rows, read as an array). ``accept(oids)`` may refuse the column types
        (raise :class:`_Fallback`) before anything is read. See
        :mod:`vecsched.service.sql.packed`.
        """

        def sub() -> Any:
            query = sa.select(*exprs())
            return (query if where is None else query.where(where)).subquery("s")

        _, oids = self._execute(self._sql(("probe", key), lambda: sa.select(*sub().c).where(sa.false())), params)
        accept(oids)
        labels = [f"c{k}" for k in range(len(text))]
        nullable: set[int] = set()
        odd: set[int] = set()
        for attempt in range(2):
            p = packed.plan(labels, oids, text, nullable, odd)
            sql = self._sql((key, tuple(oids), p.sql), lambda: sa.select(*map(sa.literal_column, p.sql)).select_from(sub()))
            row, _ = self._execute(sql, params, arrays=any(part.how == "array" for part in p.parts))
            read = packed.parse(p, row, oids)
            if not (read.short_record or read.odd_texts):
                return [self._cells(c, oid) for c, oid in zip(read.columns, oids)]
            if attempt:  # rows changed between the reads (READ COMMITTED): the generic read is one query
                raise _Fallback(f"{key}: rows changed while read")
            odd = set(read.odd_texts)
            if read.short_record:
                nullable = self._null_columns(key, sub, labels, [part.how in ("field", "bit") for part in p.parts], params)
        raise AssertionError("unreachable")  # pragma: no cover

    def _null_columns(self, key: str, sub: Callable[[], Any], labels: list[str], fixed: list[bool],
                      params: dict[str, Any] | None) -> set[int]:
        """The fixed-width columns holding a NULL (one count per column)."""
        counted = [k for k, f in enumerate(fixed) if f]
        counts = ["count(*)"] + [f"count(s.{labels[k]})" for k in counted]
        sql = self._sql(("nulls", key, *counted), lambda: sa.select(*map(sa.literal_column, counts)).select_from(sub()))
        row, _ = self._execute(sql, params)
        return {k for k, c in zip(counted, row[1:]) if c < row[0]}

    @staticmethod
    def _cells(column: Any, oid: int) -> Any:
        if isinstance(column, tuple):  # fixed-width values and their NULL mask
            values, null = column
            return _PgArray(values, null, oid in packed.TIMES)
        return column

    def main(
        self,
        table: sa.Table,
        renames: dict[str, str],
        spec: list[Column],
        where: sa.ColumnElement[bool] | None = None,
        params: dict[str, Any] | None = None,
    ) -> list[_Raw]:
        def exprs() -> list[sa.ColumnElement[Any]]:
            return [
                (_bounded(self.conn, c) if col.kind in ("str", "enum") else c).label(f"c{k}")
                for k, col, c in ((k, col, table.c[renames.get(col.name, col.name)]) for k, col in enumerate(spec))
            ]

        def accept(oids: list[int]) -> None:
            for col, oid in zip(spec, oids):
                if col.kind == "time" and oid not in packed.TIMES:
                    raise _Fallback(f"{col.name} is not a timestamp")

        # No ORDER BY: the server sorting wide rows by text keys cost more than the whole
        # read; the rows are put in key order here (_in_key_order).
        cells = self._columns(f"main:{table.name}:{','.join(c.name for c in spec)}", exprs,
                              [col.kind in ("str", "enum") for col in spec], where, params, accept)
        raws = [self._raw(col, value) for col, value in zip(spec, cells)]
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
    ) -> tuple[list[Any], list[Any], np.ndarray | None]:
        """Keys, values and positions in scan order (the client orders them: cheaper than a server sort)."""
        def exprs() -> list[sa.ColumnElement[Any]]:
            return [_bounded(self.conn, table.c[key]).label("c0"), _bounded(self.conn, table.c[value]).label("c1"),
                    table.c.position.label("c2")]

        def accept(oids: list[int]) -> None:
            if oids[2] not in _INTEGERS:
                raise _Fallback(f"{table.name}.position is not an integer")

        keys, vals, position = self._columns(f"link:{table.name}:{key}:{value}", exprs, [True, True, False], where,
                                             params, accept)
        if position is None:  # read as an array: no rows
            return [], [], None
        # A NULL position sorts last, as ORDER BY position puts it.
        order = np.where(position.null, _INT64.max, position.values.astype(np.int64))
        return _texts(keys), _texts(vals), order

    def pairs(self) -> tuple[list[Any], list[Any]]:
        def exprs() -> list[sa.ColumnElement[Any]]:
            return [_bounded(self.conn, excluded_pairs.c.worker_id).label("c0"),
                    _bounded(self.conn, excluded_pairs.c.wp_id).label("c1")]

        worker, request = self._columns("pairs", exprs, [True, True], None, None)
        return _texts(worker), _texts(request)


_INTEGERS = frozenset({21, 23, 20})


def _texts(cells: Any) -> list[Any]:
    """A text column's cells as a list (array_agg over no rows gives None)."""
    return [] if cells is None else list(cells)


def _in_key_order(raws: list[_Raw], key: list[int]) -> list[_Raw]:
    """The columns' rows sorted as ``ORDER BY`` the key columns ``raws[k]`` would under the C collation.

    Text keys compare by code point (the byte order of UTF-8, as the C
    collations of SQLite and PostgreSQL do), NULL keys last; a bad key cell
    sorts by the text as read. Every column, its NULL mask and its error
    masks follow the rows.
    """
    if not raws or len(raws[0].null) < 2:
        return raws
    order = _text_order(raws[key[0]]) if len(key) == 1 else None
    if order is None:
        order = _array_order([raws[k] for k in key])
    if (order[1:] > order[:-1]).all():
        return raws
    return [_Raw(r.values[order], r.null[order], [(mask[order], message) for mask, message in r.errors],
                 None if r.cells is None else [r.cells[i] for i in order]) for r in raws]


def _text_order(raw: _Raw) -> np.ndarray | None:
    """The order of one text key column by code point, NULLs last; None unless every cell is text.

    Python compares strings by code point, so its sort (stable, and linear on
    rows already in order, as a table filled in key order reads) needs no
    fixed-width copy of the keys, whose width would follow the longest.
    """
    cells = raw.values if raw.cells is None else raw.cells
    items = cells.tolist() if isinstance(cells, np.ndarray) else list(cells)
    if raw.null.any():
        items = ["" if z else v for v, z in zip(items, raw.null.tolist())]
    if not set(map(type, items)) <= {str}:
        return None
    order = np.asarray(sorted(range(len(items)), key=items.__getitem__), dtype=np.int64)
    return order[np.argsort(raw.null[order], kind="stable")] if raw.null.any() else order


def _array_order(raws: list[_Raw]) -> np.ndarray:
    """The lexicographic order of key columns of any cells (a bad key cell sorts by its text), NULLs last."""
    sort_keys: list[np.ndarray] = []
    for raw in reversed(raws):  # np.lexsort sorts by its last key first
        cells = raw.values if raw.cells is None else np.asarray(raw.cells, dtype=object)
        if cells.dtype == object:
            cells = np.where(raw.null, "", cells).astype(str)
        sort_keys += [cells, raw.null] if raw.null.any() else [cells]
    return np.argsort(sort_keys[0], kind="stable") if len(sort_keys) == 1 else np.lexsort(sort_keys)
