"""Publish cycles into a SQL database (the embedded SQLite file, or any SQLAlchemy database)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from vecsched.service.store.base import Cycle, Reading, parse_cycle_id

pub_metadata = sa.MetaData()

vs_cycles = sa.Table(
    "vs_cycles",
    pub_metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("time", sa.Float(53), nullable=False),
    sa.Column("interval", sa.Float(53), nullable=False),
    sa.Column("meta", sa.Text(), nullable=False),
    sa.Column("prospective", sa.LargeBinary(), nullable=False),
)

vs_status = sa.Table(
    "vs_status",
    pub_metadata,
    sa.Column("cycle_id", sa.String(), primary_key=True),
    sa.Column("request_id", sa.String(), primary_key=True),
    sa.Column("payload", sa.Text(), nullable=False),
)

vs_current = sa.Table(
    "vs_current",
    pub_metadata,
    sa.Column("slot", sa.Integer(), primary_key=True),
    sa.Column("cycle_id", sa.String(), nullable=False),
)


class SQLStore:
    """The same publication semantics in SQL: a cycle column, and the pointer
    switched in the transaction that writes the cycle.

    Readers run one SELECT that joins the pointer to the payload, so they see
    the cycle that was current when the statement began, whole.

    Examples
    --------
    >>> from vecsched.service.sql import make_engine
    >>> store = SQLStore(make_engine("sqlite://"))
    >>> store.publish(Cycle(1.0, 5.0, ["r1"], ["[1,1.0]"]))
    True
    >>> store.read_status("r1").value, store.read_status("nope").value
    ('[1,1.0]', None)
    """

    def __init__(self, engine: Engine | str, chunk: int = 5000):
        if isinstance(engine, str):
            from vecsched.service.sql import make_engine

            engine = make_engine(engine)
        self.engine = engine
        self.chunk = chunk
        # Tables are made on first use, so a store can be built while the
        # database is down (the job then logs failed cycles and retries).
        self._ready = False
        c, s, cur = vs_cycles, vs_status, vs_current
        self._status_sql = (
            sa.select(c.c.id, s.c.payload)
            .select_from(
                cur.join(c, c.c.id == cur.c.cycle_id).outerjoin(
                    s, sa.and_(s.c.cycle_id == c.c.id, s.c.request_id == sa.bindparam("rid"))
                )
            )
            .where(cur.c.slot == 0)
        )
        self._prosp_sql = (
            sa.select(c.c.id, c.c.prospective).select_from(cur.join(c, c.c.id == cur.c.cycle_id)).where(cur.c.slot == 0)
        )
        self._meta_sql = (
            sa.select(c.c.id, c.c.meta).select_from(cur.join(c, c.c.id == cur.c.cycle_id)).where(cur.c.slot == 0)
        )
        self._current_sql = (
            sa.select(c.c.id, sa.null()).select_from(cur.join(c, c.c.id == cur.c.cycle_id)).where(cur.c.slot == 0)
        )

    def _ensure(self) -> None:
        if not self._ready:
            pub_metadata.create_all(self.engine)
            self._ready = True

    def publish(self, cycle: Cycle) -> bool:
        """Write the cycle and switch the pointer to it in one transaction.

        Older cycles' rows go in the same transaction (readers that began
        before the commit still see them).

        Parameters
        ----------
        cycle : Cycle

        Returns
        -------
        bool
            False when a newer cycle was already current (nothing written).
        """
        self._ensure()
        meta = json.dumps({"horde": cycle.horde, "requests": len(cycle.request_ids)})
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Serialise publishers so the monotonic check below holds.
                conn.execute(sa.text("LOCK TABLE vs_current IN EXCLUSIVE MODE"))
            else:
                # The embedded file may have been replaced since the tables were made.
                pub_metadata.create_all(conn)
            old = conn.execute(sa.select(vs_current.c.cycle_id).where(vs_current.c.slot == 0)).scalar()
            if old is not None and parse_cycle_id(old)[0] > cycle.time:
                return False
            conn.execute(
                vs_cycles.insert(),
                [
                    {
                        "id": cycle.id,
                        "time": cycle.time,
                        "interval": cycle.interval,
                        "meta": meta,
                        "prospective": cycle.prospective,
                    }
                ],
            )
            rows = [
                {"cycle_id": cycle.id, "request_id": r, "payload": p} for r, p in zip(cycle.request_ids, cycle.payloads)
            ]
            for start in range(0, len(rows), self.chunk):
                conn.execute(vs_status.insert(), rows[start : start + self.chunk])
            if old is None:
                conn.execute(vs_current.insert(), [{"slot": 0, "cycle_id": cycle.id}])
            else:
                conn.execute(vs_current.update().where(vs_current.c.slot == 0).values(cycle_id=cycle.id))
            # Readers that began before this commit still see the old rows
            # (MVCC / WAL), so old cycles can go in the same transaction.
            conn.execute(vs_status.delete().where(vs_status.c.cycle_id != cycle.id))
            conn.execute(vs_cycles.delete().where(vs_cycles.c.id != cycle.id))
        return True

    def _one(self, sql: Any, params: dict[str, Any], convert: Any) -> Reading | None:
        if not self._ready:
            # Readers never make the tables: several processes' first polls racing each other's (and the
            # job's) CREATE TABLE failed with a duplicate key. No table yet is no cycle yet.
            if not sa.inspect(self.engine).has_table(vs_current.name, schema=vs_current.schema):
                return None
            self._ready = True
        with self.engine.connect() as conn:
            row = conn.execute(sql, params).first()
        if row is None:
            return None
        t, interval, _ = parse_cycle_id(row[0])
        return Reading(row[0], t, interval, convert(row[1]))

    def read_status(self, request_id: str) -> Reading | None:
        """The current cycle and request ``request_id``'s payload (None if absent): one SELECT.

        Parameters
        ----------
        request_id : str

        Returns
        -------
        Reading or None
            None when no cycle was ever published.
        """
        return self._one(self._status_sql, {"rid": request_id}, lambda v: v)

    def read_current(self) -> Reading | None:
        """The current cycle alone (``value`` None): one SELECT, no payload.

        Returns
        -------
        Reading or None
            None when no cycle was ever published.
        """
        return self._one(self._current_sql, {}, lambda v: None)

    def read_prospective(self) -> Reading | None:
        """The current cycle and its prospective-request state (bytes): one SELECT.

        Returns
        -------
        Reading or None
            None when no cycle was ever published.
        """
        return self._one(self._prosp_sql, {}, lambda v: bytes(v) if v is not None else None)

    def read_meta(self) -> Reading | None:
        """The current cycle and its horde totals: one SELECT.

        Returns
        -------
        Reading or None
            None when no cycle was ever published.
        """
        return self._one(self._meta_sql, {}, lambda v: json.loads(v) if v is not None else None)

    def close(self) -> None:
        """Dispose of the engine's connection pool."""
        self.engine.dispose()
