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

The loader runs one SELECT per table and turns the rows straight into column
arrays; no ORM object is made per row. It loads values as they are and lets
:meth:`Snapshot.from_columns` judge them, so a bad row (negative threads, an
unknown gentype string, a NULL in a required column) becomes a
:class:`~vecsched.RowError` and is left out instead of failing the load.
"""

from __future__ import annotations

import math
import os
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ._columns import REQUIRED, TABLES, Column, RowError
from ._snapshot import ListColumn, Snapshot

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


workers = sa.Table(
    "workers",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    *_data_columns(TABLES["workers"]),
)
worker_models = sa.Table(
    "worker_models",
    metadata,
    sa.Column("worker_id", sa.String(), primary_key=True),
    sa.Column("position", sa.Integer(), primary_key=True),
    sa.Column("model", sa.String(), nullable=False),
)
waiting_prompts = sa.Table(
    "waiting_prompts",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    *_data_columns(TABLES["requests"]),
)
wp_models = sa.Table(
    "wp_models",
    metadata,
    sa.Column("wp_id", sa.String(), primary_key=True),
    sa.Column("position", sa.Integer(), primary_key=True),
    sa.Column("model", sa.String(), nullable=False),
)
wp_allowed_workers = sa.Table(
    "wp_allowed_workers",
    metadata,
    sa.Column("wp_id", sa.String(), primary_key=True),
    sa.Column("position", sa.Integer(), primary_key=True),
    sa.Column("worker_id", sa.String(), nullable=False),
)
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


def load_horde(conn: Engine | Connection, now: float) -> Snapshot:
    """Read the horde from SQL into a :class:`Snapshot` taken at ``now``.

    One SELECT per table, rows turned straight into column arrays. Bad rows
    are left out and described in :attr:`Snapshot.rejected`.

    Parameters
    ----------
    conn : Engine or Connection
        Where the horde tables live (SQLite or PostgreSQL).
    now : float
        The snapshot instant, epoch seconds.

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
                return load_horde(c, now)
    errors: list[RowError] = []
    tables: dict[str, dict[str, Any]] = {}
    for name, (table, renames) in _MAIN.items():
        tables[name] = _load_main(conn, name, table, renames, errors)
    w_ids = tables["workers"]["id"]
    r_ids = tables["requests"]["id"]
    tables["workers"]["models"] = _load_list(conn, worker_models, "worker_id", "model", w_ids)
    tables["requests"]["models"] = _load_list(conn, wp_models, "wp_id", "model", r_ids)
    tables["requests"]["worker_ids"] = _load_list(conn, wp_allowed_workers, "wp_id", "worker_id", r_ids)
    pairs = conn.execute(sa.select(excluded_pairs.c.worker_id, excluded_pairs.c.wp_id)).all()
    pair_cols = {
        "worker_id": [p[0] for p in pairs],
        "request_id": [p[1] for p in pairs],
    }
    return Snapshot.from_columns(
        now,
        tables["workers"],
        tables["requests"],
        tables["jobs"],
        pair_cols,
        rejected=errors,
    )


def _load_main(
    conn: Connection,
    name: str,
    table: sa.Table,
    renames: dict[str, str],
    errors: list[RowError],
) -> dict[str, Any]:
    spec = [c for c in TABLES[name] if c.kind != "str_list"]
    selected = []
    for col in spec:
        sql_col = table.c[renames.get(col.name, col.name)]
        selected.append(_epoch(conn, sql_col) if col.kind == "time" else sql_col)
    rows = conn.execute(sa.select(*selected).order_by(table.c.id)).all()
    n = len(rows)
    raw = list(zip(*rows)) if n else [() for _ in spec]
    bad = np.zeros(n, dtype=bool)
    ids = raw[0]

    def reject(positions: Iterable[int], field: str, message: str) -> None:
        for k in positions:
            if not bad[k]:
                rid = ids[k] if isinstance(ids[k], str) else None
                errors.append(RowError(name, int(k), rid, field, message))
                bad[k] = True

    out: dict[str, Any] = {}
    for col, values in zip(spec, raw):
        values = list(values)
        # ``None in`` runs in C; most columns have no NULL and skip the scan.
        nulls = [k for k, v in enumerate(values) if v is None] if None in values else []
        if nulls and not (col.kind == "float" and col.nullable):
            if col.default is REQUIRED:
                reject(nulls, col.name, "is required (NULL in the database)")
                fill: Any = {"str": "", "enum": col.choices[0] if col.choices else ""}.get(col.kind, 0)
                for k in nulls:
                    values[k] = fill
            elif isinstance(col.default, str) and col.default.startswith("="):
                source = out[col.default[1:]]
                for k in nulls:
                    values[k] = source[k]
            else:
                for k in nulls:
                    values[k] = col.default
        out[col.name] = _typed(col, values, reject)
    keep = ~bad
    result: dict[str, Any] = {k: v[keep] for k, v in out.items()}
    # Row numbers in later RowErrors count rows of the ordered SELECT.
    result["__row__"] = np.flatnonzero(keep)
    return result


def _typed(col: Column, values: list[Any], reject: Callable[..., None]) -> np.ndarray:
    n = len(values)
    if col.kind in ("str",):
        arr = np.empty(n, dtype=object)
        arr[:] = values
        return arr
    if col.kind == "enum":
        index = {c: i for i, c in enumerate(col.choices)}
        codes = np.fromiter((index.get(v, -1) for v in values), dtype=np.int64, count=n)
        unknown = np.flatnonzero(codes < 0)
        reject(unknown.tolist(), col.name, f"must be one of {', '.join(col.choices)}")
        codes[unknown] = 0
        return codes.astype(col.dtype)
    if col.kind == "bool":
        return np.asarray(values, dtype=bool) if n else np.zeros(0, dtype=bool)
    if col.kind == "int":
        # Load as float64 first so an out-of-range value is rejected by the
        # snapshot's range rules instead of wrapping around in int32.
        arr = np.asarray(values, dtype=np.float64) if n else np.zeros(0)
        if col.dtype == "int32":
            big = np.flatnonzero(np.abs(arr) >= 2**31)
            reject(big.tolist(), col.name, "out of range")
            arr[big] = 0
        return arr.astype(col.dtype)
    if col.kind == "time" and any(isinstance(v, str) for v in values):
        return _sqlite_epochs(values)
    # float and time: None -> NaN (speed: no samples; time: rejected by the snapshot)
    return np.asarray(values, dtype=np.float64) if n else np.zeros(0)


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


def _load_list(
    conn: Connection, table: sa.Table, key: str, value: str, row_ids: np.ndarray
) -> ListColumn:
    """A list column from a link table, in ``position`` order; unknown keys ignored."""
    rows = conn.execute(
        sa.select(table.c[key], table.c[value]).order_by(table.c[key], table.c.position)
    ).all()
    n = len(row_ids)
    if not rows:
        return ListColumn(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=object))
    keys, vals = zip(*rows)
    owner = pd.Index(row_ids).get_indexer(pd.Index(keys, dtype=object))
    vals_arr = np.empty(len(vals), dtype=object)
    vals_arr[:] = vals
    known = owner >= 0
    owner, vals_arr = owner[known], vals_arr[known]
    # The SELECT is ordered by key and position; a stable sort by row keeps
    # the position order within each row.
    order = np.argsort(owner, kind="stable")
    owner, vals_arr = owner[order], vals_arr[order]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=offsets[1:])
    return ListColumn(offsets, vals_arr)


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
