"""The horde's tables in SQL, named as the AI Horde names them.

Tables and their link columns follow the AI Horde's own (``workers``,
``worker_models``, ``waiting_prompts``, ``wp_models``, ``wp_allowed_workers``,
``processing_gens``), so pointing vecsched at a horde database, or at views over
one, needs no code change. Data columns are named as in SNAPSHOT_FORMAT.md.
vecsched adds ``excluded_pairs`` and the scheduling events of SPEC section 7:
``dispatches`` (with ``dispatch_priority_users``) and ``capacity_returns``,
keyed by ``dispatch_id`` and indexed on their time.

Where this schema differs from the horde's, and why:

- list columns live in link tables with a ``position`` column, because a
  worker's *first* model decides its text speed floor (SPEC section 3);
- ``processing_gens`` carries ``state`` (processing, finished, faulted) as a
  string, as the snapshot does, instead of the horde's several flags.
"""

from __future__ import annotations

from typing import Any, Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from vecsched.snapshot.schema import TABLES, Column

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
# The HTTP status route counts one request's jobs per poll.
sa.Index("ix_processing_gens_wp_id", processing_gens.c.wp_id)

excluded_pairs = sa.Table(
    "excluded_pairs",
    metadata,
    sa.Column("worker_id", sa.String(), primary_key=True),
    sa.Column("wp_id", sa.String(), primary_key=True),
)

dispatches = sa.Table(
    "dispatches",
    metadata,
    sa.Column("dispatch_id", sa.String(), primary_key=True),
    *_data_columns(TABLES["dispatches"], skip=("dispatch_id",)),
    sa.Index("ix_dispatches_dispatched_at", "dispatched_at"),
)

dispatch_priority_users = _list_table("dispatch_priority_users", "dispatch_id", "user_id")

capacity_returns = sa.Table(
    "capacity_returns",
    metadata,
    sa.Column("dispatch_id", sa.String(), primary_key=True),
    *_data_columns(TABLES["capacity_returns"], skip=("dispatch_id",)),
    sa.Index("ix_capacity_returns_returned_at", "returned_at"),
)

HORDE_TABLES = (
    workers,
    worker_models,
    waiting_prompts,
    wp_models,
    wp_allowed_workers,
    processing_gens,
    excluded_pairs,
    dispatches,
    dispatch_priority_users,
    capacity_returns,
)

# snapshot table -> (SQL table, {snapshot column: SQL column name})
_MAIN = {
    "workers": (workers, {}),
    "requests": (waiting_prompts, {}),
    "jobs": (processing_gens, {"request_id": "wp_id"}),
}


LOCK_TIMEOUT_SECONDS = 10.0
"""How long a statement waits for a lock on PostgreSQL before it fails (and with it the cycle, which says why)."""
CONNECT_TIMEOUT_SECONDS = 10
"""How long opening a PostgreSQL connection may take before it fails."""
PG_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
                 "tcp_user_timeout": 30_000}
"""libpq parameters of every PostgreSQL connection (a URL's own take precedence): a silent peer ends it in about 30 s."""


def make_engine(url: str, *, pre_ping: bool = True) -> Engine:
    """An engine for ``url``; SQLite files get WAL so readers never block the job.

    ``pre_ping`` (the job's default) checks each pooled connection before use;
    a status poll, one statement, turns it off: a ping would double its round
    trips, and a dropped connection fails one read and is then replaced.

    On PostgreSQL a statement waits at most :data:`LOCK_TIMEOUT_SECONDS` for a
    lock and a connection opens within :data:`CONNECT_TIMEOUT_SECONDS`: a table
    held by a migration, or a server that stops answering, fails the cycle with
    the reason in its log line instead of stalling the job without a word.

    Examples
    --------
    >>> make_engine("sqlite://").dialect.name
    'sqlite'
    >>> make_engine("not a url")
    Traceback (most recent call last):
    ...
    vecsched.errors.SettingError: bad database URL: Could not parse SQLAlchemy URL from given URL string
    """
    from vecsched.errors import SettingError

    try:
        return _engine(url, pre_ping=pre_ping)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ValueError) as exc:
        # SQLAlchemy's messages name the dialect or the part that failed, never the password.
        raise SettingError(f"bad database URL: {str(exc).strip().splitlines()[0]}") from None


def _engine(url: str, *, pre_ping: bool) -> Engine:
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        # A deleted or replaced file is noticed, never read on through an old connection.
        from vecsched.service.sqlite_file import watch_file

        return watch_file(engine)
    parsed = sa.engine.make_url(url)
    postgresql = parsed.get_backend_name() == "postgresql"
    # A server that goes silent mid-query (a partition, a frozen host) held a pooled connection until
    # TCP gave up, hours later: the cycle neither ended nor failed. Keepalives and an unacknowledged-
    # data bound close such a connection within about half a minute; the cycle then fails with it.
    defaults = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, **(PG_KEEPALIVES if postgresql else {})}
    connect_args = {k: v for k, v in defaults.items() if k not in parsed.query}  # the URL's own win
    engine = sa.create_engine(url, pool_pre_ping=pre_ping, connect_args=connect_args)
    if postgresql:

        @sa.event.listens_for(engine, "connect")
        def _lock_timeout(dbapi_conn: Any, _record: Any) -> None:
            # A session setting, committed: the pool's rollback on return must not undo it.
            cur = dbapi_conn.cursor()
            cur.execute(f"SET SESSION lock_timeout = {int(LOCK_TIMEOUT_SECONDS * 1000)}")
            cur.close()
            dbapi_conn.commit()

    return engine


def init_db(engine: Engine) -> None:
    """Create the horde tables (and their indexes) that do not exist yet (idempotent).

    An older database gains what was added since: tables (e.g. the event
    tables), the nullable columns its tables lack (e.g. ``waiting_prompts.kudos``)
    and their indexes (``create_all`` makes indexes only with a table it
    creates); nothing is dropped or changed.
    """
    metadata.create_all(engine, checkfirst=True)
    inspector = sa.inspect(engine)
    for table in metadata.sorted_tables:
        _add_missing_columns(engine, table, {c["name"] for c in inspector.get_columns(table.name)})
        have = {ix["name"] for ix in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in have:
                index.create(engine, checkfirst=True)


def _add_missing_columns(engine: Engine, table: sa.Table, have: set[str]) -> None:
    """``ALTER TABLE ... ADD COLUMN`` for nullable columns an older schema lacks."""
    missing = [c for c in table.columns if c.name not in have and c.nullable]
    if not missing:
        return
    with engine.begin() as conn:
        for col in missing:
            kind = col.type.compile(dialect=engine.dialect)
            conn.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}')


def is_empty(engine: Engine) -> bool:
    """True when the horde tables are missing or hold no worker and no request."""
    insp = sa.inspect(engine)
    if not insp.has_table("workers") or not insp.has_table("waiting_prompts"):
        return True
    with engine.connect() as conn:
        w = conn.execute(sa.select(sa.func.count()).select_from(workers)).scalar_one()
        r = conn.execute(sa.select(sa.func.count()).select_from(waiting_prompts)).scalar_one()
    return w == 0 and r == 0
