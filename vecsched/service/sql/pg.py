"""The PostgreSQL fast path (psycopg 3): each table read as one row of binary arrays that NumPy parses."""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from itertools import repeat
from typing import Any, Callable, Iterable, Iterator, NamedTuple

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
from vecsched.service.sql.textorder import code_point_order
from vecsched.service.sql.schema import excluded_pairs
from vecsched.snapshot.cells import INT_LIMIT, INT_RANGE, NOT_BOOL, NOT_FINITE, NOT_INT, bad_cell_message
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
    if value.values.dtype == np.float32:
        # A real as PostgreSQL writes it (its shortest digits, 25.7), as the generic path reads it; widened
        # bit for bit it would be 25.700000762939453.
        arr = value.values.astype(str).astype(np.float64)
    else:
        arr = value.values.astype(np.float64)
    bad = present & ~np.isfinite(arr)
    arr[bad] = 0.0
    arr[value.null] = np.nan
    return _Raw(arr, value.null, [(bad, NOT_FINITE)] if bad.any() else [])


class _Query(NamedTuple):
    """One table read of the fast path: the arguments of :meth:`_PgFetch._columns`."""

    key: str
    exprs: Callable[[], list[sa.ColumnElement[Any]]]
    text: list[bool]
    where: sa.ColumnElement[bool] | None
    params: dict[str, Any] | None
    accept: Callable[[list[int]], None]
    table: str | None = None  # a whole table, read in block ranges when large (_block_ranges); None: never split


_FirstRead = tuple[list[int], packed.Plan, Iterator[tuple[Any, ...]]]
"""A read's column type oids, the optimistic plan (no NULL, no separator) and its result rows, one per block range."""

_PART_PAGES = 300  # a table of more pages than twice this is read in block ranges of about this many
_MAX_PARTS = 4


def _block_ranges(pages: int) -> list[tuple[int, int | None] | None]:
    """Block ranges (first, stop) covering a table of about ``pages`` pages; the last one open-ended.

    Each part is one query over ``ctid`` in its range (a TID range scan): PostgreSQL
    computes the next part's aggregates while this process parses the last one's.
    In one snapshot every row has one ctid, so the parts hold each row once, whatever
    ``pages`` was when measured. ``[None]``: one read of the whole table.
    """
    parts = min(_MAX_PARTS, pages // _PART_PAGES)
    if parts < 2:
        return [None]
    cuts = [k * pages // parts for k in range(parts + 1)]
    return [(cuts[k], cuts[k + 1] if k + 1 < parts else None) for k in range(parts)]


class _Pipeline:
    """The tables' first reads sent at once (libpq pipeline mode), their results taken in order.

    PostgreSQL computes a table's aggregates while this process judges the
    previous table's cells, instead of each waiting on the other (the result
    of an aggregate is one row, sent when it is complete). Each read's column
    types are probed first, as the plan follows them. While the pipeline is
    open nothing else may use the connection: :meth:`close` takes what is left
    and leaves pipeline mode before any other query (a second read, a
    fallback). The first database error is raised where its read is taken.
    """

    def __init__(self, fetch: "_PgFetch", queries: list[_Query]):
        from psycopg import ClientCursor

        self.fetch = fetch
        self.pgconn = fetch.raw.pgconn
        pages = fetch._pages([q.table for q in queries if q.table])
        firsts = []
        for q in queries:
            oids, p = fetch._probe(q)
            whole = q.table is None or any(part.how == "array" for part in p.parts)  # arrays are not joined
            sqls = [fetch._plan_sql(q, oids, p, blocks) for blocks in _block_ranges(0 if whole else pages[q.table])]
            if q.params:  # the values inlined as literals, as psycopg's client-side binding makes them
                sqls = [ClientCursor(fetch.raw).mogrify(sql, q.params) for sql in sqls]
            firsts.append((q.key, oids, p, sqls))
        self.pending = [(key, oids, p, len(sqls)) for key, oids, p, sqls in firsts]
        self.pgconn.enter_pipeline_mode()
        self.open = True
        try:
            for sql in (sql for *_, sqls in firsts for sql in sqls):
                self.pgconn.send_query_params(sql.encode(fetch.raw.info.encoding), None, result_format=1)
                # the server sends each result whole once computed, not when its output buffer fills
                self.pgconn.send_flush_request()
            self.pgconn.pipeline_sync()
            self._flush()
        except BaseException:
            self.close()
            raise

    def take(self, key: str) -> _FirstRead | None:
        """Read ``key``'s results, or None when it is not the next one sent (the pipeline is closed then).

        The rows come lazily, each when its part arrives; take them all before the next read.
        """
        if not (self.open and self.pending and self.pending[0][0] == key):
            self.close()
            return None
        _, oids, p, parts = self.pending.pop(0)
        return oids, p, (self._row(p) for _ in range(parts))

    def _row(self, p: packed.Plan) -> tuple[Any, ...]:
        from psycopg.pq import ExecStatus

        result = self._next_result()
        self._next_result()  # the end of this query's results
        if result.status != ExecStatus.TUPLES_OK:
            self.close()  # the results after an error only say the pipeline was aborted
            raise self._error(result)
        with self.fetch.raw.cursor(binary=True) as cur:
            if any(part.how == "array" for part in p.parts):
                for oid in _PG_ARRAYS:
                    cur.adapters.register_loader(oid, self.fetch.loader)
            from psycopg.adapt import Transformer

            loads = Transformer(cur)
            loads.set_pgresult(result)
            row = loads.load_row(0, tuple) if result.ntuples else None
        return tuple(row) if row is not None else ()

    def close(self) -> None:
        """Take every result left, up to the sync, and leave pipeline mode: the connection is free again.

        Raises the first database error among them: the transaction is lost,
        and that error says why (not the next statement's "transaction aborted").
        """
        from psycopg.pq import ExecStatus

        if not self.open:
            return
        self.open = False
        self.pending = []
        failed = None
        while True:
            result = self._next_result()
            if result is None:
                continue
            if result.status == ExecStatus.PIPELINE_SYNC:
                break
            if result.status == ExecStatus.FATAL_ERROR and failed is None:
                failed = result
        self.pgconn.exit_pipeline_mode()
        if failed is not None:
            raise self._error(failed)

    def _error(self, result: Any) -> Exception:
        from psycopg import errors

        return errors.error_from_result(result, encoding=self.fetch.raw.info.encoding)

    def _next_result(self) -> Any:
        import select

        while True:
            self.pgconn.consume_input()
            if not self.pgconn.is_busy():
                return self.pgconn.get_result()
            select.select([self.pgconn.socket], [], [])

    def _flush(self) -> None:
        import select

        while self.pgconn.flush():  # 1: more to send; take results meanwhile, so neither side waits on the other
            readable, _, _ = select.select([self.pgconn.socket], [self.pgconn.socket], [])
            if readable:
                self.pgconn.consume_input()


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
        self.ahead: _Pipeline | None = None

    def read_all(self, reads: Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> Iterator[Any]:
        """As :meth:`_GenericFetch.read_all`; every first read is sent at once (:class:`_Pipeline`)."""
        reads = list(reads)
        self.end_read_ahead()
        self.ahead = _Pipeline(self, [getattr(self, f"_{name}_query")(*args, **kwargs) for name, args, kwargs in reads])
        return super().read_all(reads)

    def end_read_ahead(self) -> None:
        """Close the pipeline of first reads, if open: the connection is free for other queries."""
        if self.ahead is not None:
            self.ahead.close()
            self.ahead = None

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
            self.end_read_ahead()
            restore()  # the generic read follows in this transaction
            raise
        finally:
            self.end_read_ahead()
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

    def _columns(self, q: _Query) -> list[Any]:
        """The cells of ``q.exprs()`` (labelled ``c0``, ``c1``...), one entry per column, rows in scan order.

        ``exprs`` is called only to compile a statement not seen before.

        Each entry is what :meth:`_raw` takes: a :class:`_PgArray` (fixed-width
        types), a list of cells (text, and types psycopg loads) or None (no
        rows, read as an array). ``q.accept(oids)`` may refuse the column types
        (raise :class:`_Fallback`) before anything is read. See
        :mod:`vecsched.service.sql.packed`. The first read may have run ahead
        (:class:`_Pipeline`); a second one runs here.
        """
        first = self.ahead.take(q.key) if self.ahead is not None else None
        oids, p, rows = first if first is not None else self._first_read(q)
        read = packed.joined([packed.parse(p, row, oids) for row in rows])  # each part parsed as it arrives
        labels = [f"c{k}" for k in range(len(q.text))]
        for attempt in range(2):
            if not (read.short_record or read.odd_texts):
                return [self._cells(c, oid) for c, oid in zip(read.columns, oids)]
            if attempt:  # rows changed between the reads (READ COMMITTED): the generic read is one query
                raise _Fallback(f"{q.key}: rows changed while read")
            self.end_read_ahead()  # the connection is needed here
            nullable, odd = self._learned.get(self._learned_key(q, oids), (frozenset(), frozenset()))
            if read.short_record:
                nullable = frozenset(self._null_columns(q.key, self._sub(q), labels,
                                                        [part.how in ("field", "bit") for part in p.parts], q.params))
            odd = odd | frozenset(read.odd_texts)
            self._learned[self._learned_key(q, oids)] = nullable, odd
            p = packed.plan(labels, oids, q.text, set(nullable), set(odd))
            read = packed.parse(p, self._run_plan(q, oids, p), oids)
        raise AssertionError("unreachable")  # pragma: no cover

    # Per read and column types, the columns the last second read found NULLs or odd texts in:
    # the next load plans for them at once (a plan with more of them reads the same cells), so a
    # table that always holds a NULL costs one read, not three, and the pipeline stays open.
    _learned: dict[tuple[Any, ...], tuple[frozenset[int], frozenset[int]]] = {}

    def _learned_key(self, q: _Query, oids: list[int]) -> tuple[Any, ...]:
        return self.conn.dialect.driver, q.key, tuple(oids)

    @staticmethod
    def _sub(q: _Query, blocks: tuple[int, int | None] | None = None) -> Callable[[], Any]:
        """The subquery ``s`` of ``q``'s cells, of the rows in block range ``blocks`` when given."""
        def sub() -> Any:
            query = sa.select(*q.exprs())
            where = [] if q.where is None else [q.where]
            if blocks is not None:
                first, stop = blocks
                where += [sa.text(f"ctid >= '({first},0)'::tid")] if first else []
                where += [sa.text(f"ctid < '({stop},0)'::tid")] if stop is not None else []
            return query.where(*where).subquery("s")

        return sub

    def _pages(self, tables: list[str]) -> dict[str, int]:
        """The pages of each table now (0 when not found), in one query."""
        row, _ = self._execute("SELECT array_agg(coalesce(pg_relation_size(to_regclass(t.name)), 0) "
                               "/ current_setting('block_size')::int8 ORDER BY t.k) "
                               "FROM unnest(%(t)s::text[]) WITH ORDINALITY AS t(name, k)", {"t": tables})
        return dict(zip(tables, row[0] or []))

    def _first_read(self, q: _Query) -> _FirstRead:
        """Probe the column types, then read as if no cell were NULL and no text held the separator.

        Except in the columns where the last second read of ``q`` found them (:attr:`_learned`).
        """
        oids, p = self._probe(q)
        return oids, p, iter([self._run_plan(q, oids, p)])

    def _probe(self, q: _Query) -> tuple[list[int], packed.Plan]:
        """The column types (``q.accept`` may refuse them) and the optimistic plan that follows from them."""
        sub = self._sub(q)
        _, oids = self._execute(self._sql(("probe", q.key), lambda: sa.select(*sub().c).where(sa.false())), q.params)
        q.accept(oids)
        nullable, odd = self._learned.get(self._learned_key(q, oids), (frozenset(), frozenset()))
        return oids, packed.plan([f"c{k}" for k in range(len(q.text))], oids, q.text, set(nullable), set(odd))

    def _plan_sql(self, q: _Query, oids: list[int], p: packed.Plan,
                  blocks: tuple[int, int | None] | None = None) -> str:
        sub = self._sub(q, blocks)
        return self._sql((q.key, tuple(oids), p.sql, blocks),
                         lambda: sa.select(*map(sa.literal_column, p.sql)).select_from(sub()))

    def _run_plan(self, q: _Query, oids: list[int], p: packed.Plan) -> tuple[Any, ...]:
        arrays = any(part.how == "array" for part in p.parts)
        return self._execute(self._plan_sql(q, oids, p), q.params, arrays=arrays)[0]

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
        # No ORDER BY: the server sorting wide rows by text keys cost more than the whole
        # read; the rows are put in key order here (_in_key_order).
        cells = self._columns(self._main_query(table, renames, spec, where, params))
        raws = [self._raw(col, value) for col, value in zip(spec, cells)]
        names = [renames.get(col.name, col.name) for col in spec]
        return _in_key_order(raws, [names.index(c.name) for c in table.primary_key.columns])

    def _main_query(self, table: sa.Table, renames: dict[str, str], spec: list[Column],
                    where: sa.ColumnElement[bool] | None = None, params: dict[str, Any] | None = None) -> _Query:
        def exprs() -> list[sa.ColumnElement[Any]]:
            return [
                (_bounded(self.conn, c) if col.kind in ("str", "enum") else c).label(f"c{k}")
                for k, col, c in ((k, col, table.c[renames.get(col.name, col.name)]) for k, col in enumerate(spec))
            ]

        def accept(oids: list[int]) -> None:
            for col, oid in zip(spec, oids):
                if col.kind == "time" and oid not in packed.TIMES:
                    raise _Fallback(f"{col.name} is not a timestamp")

        return _Query(f"main:{table.name}:{','.join(c.name for c in spec)}", exprs,
                      [col.kind in ("str", "enum") for col in spec], where, params, accept,
                      table.name if where is None else None)

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
        if isinstance(value, packed.Texts):
            return _raw_from_texts(col, value)
        # Text read as an array (and any type without a NumPy parser): psycopg's
        # loaders made the Python objects the generic path would see.
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
        keys, vals, position = self._columns(self._link_query(table, key, value, where, params))
        if position is None:  # read as an array: no rows
            return [], [], None
        # A NULL position sorts last, as ORDER BY position puts it.
        order = np.where(position.null, _INT64.max, position.values.astype(np.int64))
        return _texts(keys), _texts(vals), order

    def _link_query(self, table: sa.Table, key: str, value: str, where: sa.ColumnElement[bool] | None = None,
                    params: dict[str, Any] | None = None) -> _Query:
        def exprs() -> list[sa.ColumnElement[Any]]:
            return [_bounded(self.conn, table.c[key]).label("c0"), _bounded(self.conn, table.c[value]).label("c1"),
                    table.c.position.label("c2")]

        def accept(oids: list[int]) -> None:
            if oids[2] not in _INTEGERS:
                raise _Fallback(f"{table.name}.position is not an integer")

        return _Query(f"link:{table.name}:{key}:{value}", exprs, [True, True, False], where, params, accept,
                      table.name if where is None else None)

    def pairs(self) -> tuple[list[Any], list[Any]]:
        worker, request = self._columns(self._pairs_query())
        return _texts(worker), _texts(request)

    def _pairs_query(self) -> _Query:
        def exprs() -> list[sa.ColumnElement[Any]]:
            return [_bounded(self.conn, excluded_pairs.c.worker_id).label("c0"),
                    _bounded(self.conn, excluded_pairs.c.wp_id).label("c1")]

        return _Query("pairs", exprs, [True, True], None, None, lambda oids: None)


_INTEGERS = frozenset({21, 23, 20})


def _raw_from_texts(col: Column, cells: packed.Texts) -> _Raw:
    """:func:`~vecsched.service.sql.generic._raw_from_list`'s judgement of cells known to be ``str``, none NULL.

    The same values and errors without its scans for NULLs and cell types: a
    string column's cells are all good here (the string rules are checked by
    the snapshot), an enumeration's are its codes, an unknown name its error.
    """
    n = len(cells)
    null = np.zeros(n, dtype=bool)
    if col.kind == "str":
        arr = np.empty(n, dtype=object)
        arr[:] = cells
        return _Raw(arr, null)
    if col.kind != "enum":
        return _raw_from_list(col, cells)
    codes = np.fromiter(map(_enum_codes(col.choices).get, cells, repeat(-1)), dtype=np.int64, count=n)
    unknown = codes < 0
    if not unknown.any():
        return _Raw(codes, null)
    codes[unknown] = 0
    return _Raw(codes, null, [(unknown, bad_cell_message("enum", col.choices))])


@lru_cache(maxsize=None)
def _enum_codes(choices: tuple[str, ...]) -> dict[str, int]:
    return {name: code for code, name in enumerate(choices)}


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
    # A NULL mask with no NULL reads the same in any order (most columns: no copy).
    return [_Raw(r.values[order], r.null[order] if r.null.any() else r.null,
                 [(mask[order], message) for mask, message in r.errors],
                 None if r.cells is None else [r.cells[i] for i in order]) for r in raws]


def _text_order(raw: _Raw) -> np.ndarray | None:
    """The order of one text key column by code point, NULLs last; None unless every cell is text.

    NumPy sorts the cells' UTF-8 bytes (:func:`~vecsched.service.sql.textorder.code_point_order`);
    a cell that is no valid NUL-free text (a bad key cell) leaves the column to
    Python's sort, which compares strings by code point too.
    """
    cells = raw.values if raw.cells is None else raw.cells
    items = cells.tolist() if isinstance(cells, np.ndarray) else list(cells)
    if raw.null.any():
        items = ["" if z else v for v, z in zip(items, raw.null.tolist())]
    if not set(map(type, items)) <= {str}:
        return None
    order = code_point_order(items)
    if order is None:
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
