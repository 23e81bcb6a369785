"""The horde in SQL: table definitions, the set-based loader, import and export.

Tables and their link columns follow the AI Horde's own (``workers``,
``worker_models``, ``waiting_prompts``, ``wp_models``, ``wp_allowed_workers``,
``processing_gens``), so pointing vecsched at a horde database, or at views over
one, needs no code change. Data columns are named as in SNAPSHOT_FORMAT.md.
vecsched adds ``excluded_pairs``.

Where this schema differs from the horde's, and why:

- list columns live in link tables with a ``position`` column, because a
  worker's *first* model decides its text speed floor (SPEC section 3);
- ``processing_gens`` carries ``state`` (processing, finished, faulted) as a
  string, as the snapshot does, instead of the horde's several flags.

The loader runs one query per table and turns the result straight into column
arrays; no ORM object is made per row. On PostgreSQL (psycopg 3) each table is
read as one row of binary arrays that NumPy parses, a few times faster than
rows of Python objects; SQLite reads rows. Both paths share the judging of
values, so they load the same snapshot. It loads values as they are and lets
:meth:`Snapshot.from_columns` judge them, so a bad row (negative threads, an
unknown gentype string, a NULL in a required column) becomes a
:class:`~vecsched.RowError` and is left out instead of failing the load.
"""

from __future__ import annotations

import gc
import math
import os
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from vecsched.snapshot.schema import REQUIRED, TABLES, Column, RowError
from vecsched.snapshot.snapshot import ListColumn, Snapshot

metadata = sa.MetaData()

_SA_TYPES = {
    "str": lambda: sa.String(),
    "bool": lambda: sa.Boolean(create_constraint=False),
    "int": lambda: sa.BigInteger(),
    "float": lambda: sa.Float(53),
    "time": lambda: sa.DateTime(timezone=True),
    "enum": lambda: sa.String(16),
}


def _data_columns(spec: tuple[Column, ...], skip: Iterable[str] = ()) -> list[sa.Column]:
    skip = set(skip) | {"id"}
    out = []
    for col in spec:
        if col.name in skip or col.kind == "str_list":
            continue
        # Every data column is nullable: a NULL in an optional column takes
        # the snapshot default, in a required one it rejects the row (rather
        # than the INSERT), which is what a horde database with gaps needs.
        out.append(sa.Column(col.name, _SA_TYPES[col.kind](), nullable=True))
    return out


def _list_table(name: str, owner: str, value: str) -> sa.Table:
    """A list column as rows (owner, position, value); position keeps list order,
    which matters for a worker's first model (its speed floor)."""
    return sa.Table(
        name,
        metadata,
        sa.Column(owner, sa.String(), primary_key=True),
        sa.Column("position", sa.Integer(), primary_key=True),
        sa.Column(value, sa.String(), nullable=False),
    )


workers = sa.Table(
    "workers",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    *_data_columns(TABLES["workers"]),
)
worker_models = _list_table("worker_models", "worker_id", "model")
waiting_prompts = sa.Table(
    "waiting_prompts",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    *_data_columns(TABLES["requests"]),
)
wp_models = _list_table("wp_models", "wp_id", "model")
wp_allowed_workers = _list_table("wp_allowed_workers", "wp_id", "worker_id")
processing_gens = sa.Table(
    "processing_gens",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("wp_id", sa.String(), nullable=True),
    sa.Column("worker_id", sa.String(), nullable=True),
    sa.Column("started", sa.DateTime(timezone=True), nullable=True),
    sa.Column("state", sa.String(16), nullable=True),
)
excluded_pairs = sa.Table(
    "excluded_pairs",
    metadata,
    sa.Column("worker_id", sa.String(), primary_key=True),
    sa.Column("wp_id", sa.String(), primary_key=True),
)

HORDE_TABLES = (
    workers,
    worker_models,
    waiting_prompts,
    wp_models,
    wp_allowed_workers,
    processing_gens,
    excluded_pairs,
)

# snapshot table -> (SQL table, {snapshot column: SQL column name})
_MAIN = {
    "workers": (workers, {}),
    "requests": (waiting_prompts, {}),
    "jobs": (processing_gens, {"request_id": "wp_id"}),
}


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get WAL so readers never block the job.

    Examples
    --------
    >>> make_engine("sqlite://").dialect.name
    'sqlite'
    """
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


def init_db(engine: Engine) -> None:
    """Create the horde tables that do not exist yet (idempotent)."""
    metadata.create_all(engine)


def _epoch(engine_or_conn: Engine | Connection, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """Seconds since the epoch, computed by the database (one float per row)."""
    if engine_or_conn.dialect.name == "sqlite":
        # SQLAlchemy stores SQLite datetimes as UTC text with microseconds;
        # SQLite's own date functions would round them, so the text is read
        # raw and parsed in one vectorized pass (see _sqlite_epochs).
        return sa.type_coerce(column, sa.String())
    return sa.cast(sa.extract("epoch", column), sa.Float(53))


# -- loading --------------------------------------------------------------------------
#
# Two ways to read rows, one way to judge them. A fetcher returns, per column,
# a ``_Raw`` (values in the column kind's base dtype plus a NULL mask): the
# generic fetcher from rows of any SQLAlchemy dialect, the PostgreSQL one from
# one row of binary arrays per table (see _PgFetch). :func:`_judge` then fills
# defaults, rejects bad rows and types the columns, so both give the same
# snapshot and the same RowErrors.


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


def _fast_path(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


def load_horde(conn: Engine | Connection, now: float, *, fast: bool = True) -> Snapshot:
    """Read the horde from SQL into a :class:`Snapshot` taken at ``now``.

    One query per table. Bad rows are left out and described in
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

    Returns
    -------
    Snapshot

    Examples
    --------
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
                return load_horde(c, now, fast=fast)
    if fast and _fast_path(conn):
        fetch = _PgFetch(conn)
        try:
            with fetch.serial_plans():
                return _load(conn, now, fetch)
        except _Fallback:
            pass  # same transaction, so the generic read sees the same rows
    return _load(conn, now, _GenericFetch(conn))


def _load(conn: Connection, now: float, fetch: "_GenericFetch") -> Snapshot:
    errors: list[RowError] = []
    tables: dict[str, dict[str, Any]] = {}
    for name, (table, renames) in _MAIN.items():
        spec = [c for c in TABLES[name] if c.kind != "str_list"]
        tables[name] = _judge(name, spec, fetch.main(table, renames, spec), errors)
    w_ids = tables["workers"]["id"]
    r_ids = tables["requests"]["id"]
    tables["workers"]["models"] = _list_column(*fetch.link(worker_models, "worker_id", "model"), w_ids)
    tables["requests"]["models"] = _list_column(*fetch.link(wp_models, "wp_id", "model"), r_ids)
    tables["requests"]["worker_ids"] = _list_column(
        *fetch.link(wp_allowed_workers, "wp_id", "worker_id"), r_ids
    )
    pair_w, pair_r = fetch.pairs()
    return Snapshot.from_columns(
        now,
        tables["workers"],
        tables["requests"],
        tables["jobs"],
        {"worker_id": pair_w, "request_id": pair_r},
        rejected=errors,
    )


def _judge(name: str, spec: list[Column], raw: list[_Raw], errors: list[RowError]) -> dict[str, Any]:
    """Fill defaults, reject bad rows and type the columns of one table."""
    n = len(raw[0].values)
    bad = np.zeros(n, dtype=bool)
    ids = raw[0].values

    def reject(positions: np.ndarray, field: str, message: str) -> None:
        for k in positions.tolist():
            if not bad[k]:
                rid = ids[k] if isinstance(ids[k], str) else None
                errors.append(RowError(name, int(k), rid, field, message))
                bad[k] = True

    out: dict[str, Any] = {}
    for col, r in zip(spec, raw):
        values = r.values
        # A nullable float keeps NaN for NULL (speed: no samples).
        if r.null.any() and not (col.kind == "float" and col.nullable):
            nulls = np.flatnonzero(r.null)
            values = values.copy()
            if col.default is REQUIRED:
                reject(nulls, col.name, "is required (NULL in the database)")
                fill: Any = {"str": "", "enum": col.choices[0] if col.choices else ""}.get(col.kind, 0)
                values[nulls] = fill
            elif isinstance(col.default, str) and col.default.startswith("="):
                values[nulls] = out[col.default[1:]][nulls]
            else:
                values[nulls] = col.default
        out[col.name] = _typed(col, values, reject)
    keep = ~bad
    result: dict[str, Any] = {k: v[keep] for k, v in out.items()}
    # Row numbers in later RowErrors count rows of the ordered SELECT.
    result["__row__"] = np.flatnonzero(keep)
    return result


def _typed(col: Column, values: np.ndarray, reject: Callable[..., None]) -> np.ndarray:
    if col.kind == "enum":
        # Anything that is not one of the choices (a typo, a number) is -1.
        codes = pd.Index(col.choices, dtype=object).get_indexer(pd.Index(values, dtype=object))
        unknown = np.flatnonzero(codes < 0)
        reject(unknown, col.name, f"must be one of {', '.join(col.choices)}")
        codes[unknown] = 0
        return codes.astype(col.dtype)
    if col.kind == "int":
        arr = values
        if col.dtype == "int32":
            big = np.flatnonzero(np.abs(arr) >= 2**31)
            reject(big, col.name, "out of range")
            if len(big):
                arr = arr.copy()
                arr[big] = 0
        return arr.astype(col.dtype)
    return values


# -- the generic fetcher (any dialect) ------------------------------------------------


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


class _GenericFetch:
    """Rows through SQLAlchemy, one SELECT per table, turned into column arrays."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def main(self, table: sa.Table, renames: dict[str, str], spec: list[Column]) -> list[_Raw]:
        selected = []
        for col in spec:
            sql_col = table.c[renames.get(col.name, col.name)]
            selected.append(_epoch(self.conn, sql_col) if col.kind == "time" else sql_col)
        with _gc_paused():
            rows = self.conn.execute(sa.select(*selected).order_by(table.c.id)).all()
            raw = list(zip(*rows)) if rows else [() for _ in spec]
            del rows
            return [_raw_from_list(col, list(values)) for col, values in zip(spec, raw)]

    def link(self, table: sa.Table, key: str, value: str) -> tuple[list[Any], list[Any]]:
        with _gc_paused():
            rows = self.conn.execute(
                sa.select(table.c[key], table.c[value]).order_by(table.c[key], table.c.position)
            ).all()
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


# -- the PostgreSQL fast path ---------------------------------------------------------
#
# Measured at 2,000 workers x 50,000 requests, the generic path spends most of
# its time making a Python object per value (tuples, floats, datetimes) and the
# server most of its time in extract(epoch) and in sorting wide rows. Here each
# table is one row of arrays, aggregated over an id-ordered subquery of the raw
# columns (the planner walks the primary key index; no expression per value),
# fetched in binary, and the arrays of fixed-width types are parsed straight
# into NumPy. Text arrays go through psycopg's own C loader.

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

        The arrays keep the subquery's id order only if one process reads the
        rows in that order; from PostgreSQL 16 on, array_agg may run as a
        parallel aggregate, whose partial arrays are joined in whatever order
        the workers finish. The previous setting is restored afterwards.
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

    def _row(self, key: str, build: Callable[[], sa.Select[Any]]) -> tuple[Any, ...]:
        cache_key = (self.conn.dialect.driver, key)
        sql = self._compiled.get(cache_key)
        if sql is None:
            sql = self._compiled[cache_key] = str(build().compile(dialect=self.conn.dialect))
        # A cursor of our own: the loaders registered on it change nothing
        # for other users of the connection.
        with self.raw.cursor(binary=True) as cur:
            for oid in _PG_ARRAYS:
                cur.adapters.register_loader(oid, self.loader)
            cur.execute(sql)
            row = cur.fetchone()
        assert row is not None  # an aggregate without GROUP BY returns one row
        return tuple(row)

    @staticmethod
    def _ordered_aggregate(columns: list[sa.ColumnElement[Any]], order_by: list[Any]) -> sa.Select[Any]:
        # Aggregates of one plain Agg node read the subquery's rows together,
        # in the subquery's order, so the arrays line up row by row.
        sub = sa.select(*columns).order_by(*order_by).subquery("s")
        return sa.select(*(sa.func.array_agg(c) for c in sub.c))

    def main(self, table: sa.Table, renames: dict[str, str], spec: list[Column]) -> list[_Raw]:
        def build() -> sa.Select[Any]:
            cols = [table.c[renames.get(col.name, col.name)].label(f"c{k}") for k, col in enumerate(spec)]
            return self._ordered_aggregate(cols, [table.c.id])

        row = self._row(f"main:{table.name}:{','.join(c.name for c in spec)}", build)
        return [self._raw(col, value) for col, value in zip(spec, row)]

    @staticmethod
    def _raw(col: Column, value: Any) -> _Raw:
        if value is None:  # array_agg over no rows
            value = []
        if isinstance(value, _PgArray):
            if col.kind == "time":
                if not value.time:
                    raise _Fallback(f"{col.name} is not a timestamp")
                return _Raw(_pg_epochs(value.values), value.null)
            if value.time or col.kind in ("str", "enum"):
                raise _Fallback(f"{col.name} has an unexpected type")
            if col.kind == "bool":
                # Generic path: np.asarray(values, bool) of the loaded objects.
                return _Raw(value.values.astype(bool), value.null)
            arr = value.values.astype(np.float64)
            if value.null.any():
                arr[value.null] = np.nan
            return _Raw(arr, value.null)
        if col.kind == "time":
            raise _Fallback(f"{col.name} is not a timestamp")
        # Text (and any type without a NumPy parser): psycopg's loaders made
        # the Python objects the generic path would see.
        return _raw_from_list(col, list(value))

    def link(self, table: sa.Table, key: str, value: str) -> tuple[list[Any], list[Any]]:
        row = self._row(
            f"link:{table.name}:{key}:{value}",
            lambda: self._ordered_aggregate([table.c[key], table.c[value]], [table.c[key], table.c.position]),
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
                sa.func.array_agg(excluded_pairs.c.worker_id), sa.func.array_agg(excluded_pairs.c.wp_id)
            ),
        )
        if row[0] is None:
            return [], []
        if isinstance(row[0], _PgArray) or isinstance(row[1], _PgArray):
            raise _Fallback("excluded_pairs ids are not text")
        return row[0], row[1]


# -- import / export --------------------------------------------------------------------

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
        for name, (table, renames) in _MAIN.items():
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
    return [
        None if not math.isfinite(s) else datetime.fromtimestamp(s, tz=timezone.utc)
        for s in seconds.tolist()
    ]


def is_empty(engine: Engine) -> bool:
    """True when the horde tables are missing or hold no worker and no request."""
    insp = sa.inspect(engine)
    if not insp.has_table("workers") or not insp.has_table("waiting_prompts"):
        return True
    with engine.connect() as conn:
        w = conn.execute(sa.select(sa.func.count()).select_from(workers)).scalar_one()
        r = conn.execute(sa.select(sa.func.count()).select_from(waiting_prompts)).scalar_one()
    return w == 0 and r == 0


def default_database_url(env: dict[str, str] | None = None) -> str:
    """``$VECSCHED_DATABASE_URL``, else a SQLite file in ``$VECSCHED_HOME`` (default ``.``).

    Examples
    --------
    >>> default_database_url({"VECSCHED_HOME": "/srv/vs"})
    'sqlite:////srv/vs/vecsched.sqlite'
    """
    env = os.environ if env is None else env
    url = env.get("VECSCHED_DATABASE_URL")
    if url:
        return url
    home = env.get("VECSCHED_HOME") or "."
    return "sqlite:///" + os.path.join(home, "vecsched.sqlite")
