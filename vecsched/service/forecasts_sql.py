"""The embedded (SQL) backend of :mod:`vecsched.service.forecasts_store`.

Three tables of their own (created on first use, SQLite or PostgreSQL):

- ``vs_forecast_fields (request_id, field, value, expires_at)``: the records;
  the primary key makes "insert if absent" the first-write-wins claim;
- ``vs_forecast_pairs (estimator, gentype, phase, request_id, at, data)``:
  validated pairs, one per key;
- ``vs_forecast_verdicts (at, data)``: the hourly verdicts.

Expired records are deleted by :meth:`SQLPairs.trim` (the job calls it).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import sqlalchemy as sa

from vecsched.service.forecasts_store import VERDICT_KEEP_SECONDS, Pair, Write

metadata = sa.MetaData()
fields_table = sa.Table(
    "vs_forecast_fields",
    metadata,
    # Unbounded: the loader takes ids of up to 256 bytes, and one longer than a
    # bounded column failed every cycle's whole batch of records.
    sa.Column("request_id", sa.String(), primary_key=True),
    sa.Column("field", sa.String(255), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False, index=True),
)
pairs_table = sa.Table(
    "vs_forecast_pairs",
    metadata,
    sa.Column("estimator", sa.String(100), primary_key=True),
    sa.Column("gentype", sa.String(10), primary_key=True),
    sa.Column("phase", sa.String(20), primary_key=True),
    sa.Column("request_id", sa.String(), primary_key=True),
    sa.Column("at", sa.Float, nullable=False, index=True),
    sa.Column("data", sa.Text, nullable=False),
)
verdicts_table = sa.Table(
    "vs_forecast_verdicts",
    metadata,
    sa.Column("at", sa.Float, primary_key=True),
    sa.Column("data", sa.Text, nullable=False),
)


def _insert_ignore(engine: sa.Engine, table: sa.Table) -> Any:
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table).on_conflict_do_nothing()


def _widen_request_ids(engine: sa.Engine) -> None:
    """Tables made before request ids were unbounded (``varchar(255)``) take any id the loader does (idempotent)."""
    tables = [t.name for t in (fields_table, pairs_table)]
    with engine.begin() as conn:
        bounded = conn.execute(sa.text(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = ANY(:tables) AND column_name = 'request_id' AND character_maximum_length IS NOT NULL"),
            {"tables": tables}).scalars().all()
        for name in bounded:
            conn.execute(sa.text(f'ALTER TABLE "{name}" ALTER COLUMN request_id TYPE varchar'))


class SQLPairs:
    """Forecast records and pairs in the embedded database.

    Examples
    --------
    >>> b = SQLPairs("sqlite://")
    >>> b.claim([("r", "v:x:start"), ("r", "v:x:start")])
    [True, False]
    """

    def __init__(self, engine: sa.Engine | str):
        if isinstance(engine, str):
            from vecsched.service.sql import make_engine

            engine = make_engine(engine)
        self.engine = engine
        self._ready = False  # tables made (and widened) by this writer
        self._seen = False  # tables seen by a reader

    def _ensure(self) -> None:
        """Make the tables (writers only: a report must never run DDL in the database it reads)."""
        if not self._ready:
            try:
                metadata.create_all(self.engine)
            except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
                # Another job process made them at the same instant (PostgreSQL's catalog refuses
                # the second CREATE TABLE): they exist now, which is what was wanted.
                metadata.create_all(self.engine)
            if self.engine.dialect.name == "postgresql":
                _widen_request_ids(self.engine)
            self._ready = True

    def _readable(self) -> bool:
        """Whether the tables exist; a reader of a database no job has written to reads nothing."""
        if not (self._ready or self._seen):
            inspector = sa.inspect(self.engine)
            self._seen = all(inspector.has_table(t.name) for t in metadata.sorted_tables)
        return self._ready or self._seen

    def write(self, writes: Sequence[Write]) -> list[dict[str, str]]:
        self._ensure()
        f = fields_table
        rows = [{"request_id": w.request_id, "field": k, "value": v, "expires_at": w.expire_at}
                for w in writes for k, v in w.fields.items()]
        ids = sorted({w.request_id for w in writes})
        with self.engine.begin() as conn:
            if rows:
                conn.execute(_insert_ignore(self.engine, f), rows)
            # Extend, never shorten, each record's life (one statement, many parameter sets).
            conn.execute(
                sa.update(f).where(f.c.request_id == sa.bindparam("rid"), f.c.expires_at < sa.bindparam("until"))
                .values(expires_at=sa.bindparam("until")),
                [{"rid": w.request_id, "until": w.expire_at} for w in writes])
            got: dict[str, dict[str, str]] = {rid: {} for rid in ids}
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                for rid, field, value in conn.execute(
                        sa.select(f.c.request_id, f.c.field, f.c.value).where(f.c.request_id.in_(chunk))):
                    got[rid][field] = value
        return [dict(got[w.request_id]) for w in writes]

    def claim(self, claims: Sequence[tuple[str, str]]) -> list[bool]:
        # Bulk: a claim is won when its row was absent before this call. Two processes racing on
        # the same claim may both think they won, but the pairs table's primary key then keeps
        # one pair: each pair still counts once.
        self._ensure()
        f = fields_table
        ids = sorted({rid for rid, _ in claims})
        present: set[tuple[str, str]] = set()
        expires: dict[str, float] = {}
        with self.engine.begin() as conn:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                for rid, field, at in conn.execute(
                        sa.select(f.c.request_id, f.c.field, f.c.expires_at).where(f.c.request_id.in_(chunk))):
                    present.add((rid, field))
                    expires[rid] = max(expires.get(rid, 0.0), at)
            out, rows = [], []
            for rid, field in claims:
                won = (rid, field) not in present
                present.add((rid, field))
                out.append(won)
                if won:
                    rows.append({"request_id": rid, "field": field, "value": "1", "expires_at": expires.get(rid, 0.0)})
            if rows:
                conn.execute(_insert_ignore(self.engine, f), rows)
        return out

    def add_pairs(self, pairs: Sequence[Pair]) -> None:
        self._ensure()
        rows = [{"estimator": p.estimator, "gentype": p.gentype, "phase": p.phase, "request_id": p.request_id,
                 "at": p.at, "data": p.to_json()} for p in pairs]
        with self.engine.begin() as conn:
            conn.execute(_insert_ignore(self.engine, pairs_table), rows)

    def pairs(self, since: float, until: float) -> list[Pair]:
        if not self._readable():
            return []
        t = pairs_table
        with self.engine.connect() as conn:
            got = conn.execute(sa.select(t.c.estimator, t.c.gentype, t.c.phase, t.c.data, t.c.at)
                               .where(t.c.at >= since, t.c.at <= until)).all()
        return [Pair.from_json(e, g, ph, data, at) for e, g, ph, data, at in got]

    def trim(self, before: float, now: float | None = None) -> None:
        self._ensure()
        with self.engine.begin() as conn:
            conn.execute(sa.delete(pairs_table).where(pairs_table.c.at < before))
            conn.execute(sa.delete(verdicts_table).where(verdicts_table.c.at < before - VERDICT_KEEP_SECONDS))
            if now is not None:
                conn.execute(sa.delete(fields_table).where(fields_table.c.expires_at < now))

    def add_verdict(self, at: float, verdict: Mapping[str, Any]) -> None:
        self._ensure()
        with self.engine.begin() as conn:
            conn.execute(_insert_ignore(self.engine, verdicts_table), [{"at": at, "data": json.dumps(verdict)}])

    def verdicts(self, since: float) -> list[tuple[float, dict[str, Any]]]:
        if not self._readable():
            return []
        t = verdicts_table
        with self.engine.connect() as conn:
            got = conn.execute(sa.select(t.c.at, t.c.data).where(t.c.at >= since).order_by(t.c.at)).all()
        return [(float(at), json.loads(data)) for at, data in got]

    def open_records(self, now: float) -> dict[str, dict[str, str]]:
        if not self._readable():
            return {}
        f = fields_table
        out: dict[str, dict[str, str]] = {}
        with self.engine.connect() as conn:
            for rid, field, value in conn.execute(sa.select(f.c.request_id, f.c.field, f.c.value)
                                                  .where(f.c.expires_at >= now)):
                out.setdefault(rid, {})[field] = value
        return out

    def record(self, request_id: str) -> dict[str, str]:
        if not self._readable():
            return {}
        f = fields_table
        with self.engine.connect() as conn:
            return dict(conn.execute(sa.select(f.c.field, f.c.value).where(f.c.request_id == request_id)).all())
