"""Where a cycle's figures go: Redis in production, SQL (the embedded SQLite file) otherwise.

Both stores give the same guarantee (SPEC section 9): a reader sees one whole
cycle, never a mix. A cycle is written under keys (or rows) of its own, and
only then does one atomic step switch the ``current`` pointer to it; a cycle
that fails half-way was never pointed at, so readers keep the last good one.

Redis layout, for a key prefix ``P`` and a cycle id ``C`` (``time|interval|token``):

- ``P:current``: the id of the current cycle;
- ``P:c:C:s``: hash, field = request id, value = the request's payload;
- ``P:c:C:m``: JSON of the cycle's horde-wide totals and counts;
- ``P:c:C:p``: the prospective-request state (bytes).

A cycle's keys are written with a TTL, so a cycle abandoned mid-way cleans
itself up; the switch makes them persistent and gives the previous cycle's
keys a short grace TTL. Reads are one Lua call: pointer and field together.

A payload is a short JSON array (:data:`PAYLOAD_FIELDS`), about 60 bytes, that
carries its cycle time.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ._columns import GENTYPES

PAYLOAD_VERSION = 1
PAYLOAD_FIELDS = (
    "version",
    "cycle_time",
    "gentype",
    "eligible_workers",
    "eligible_worker_threads",
    "is_possible",
    "queue_position",
    "wait_time",
    "ahead_wait",
    "horde_queue_position",
    "horde_wait_time",
    "fallback",
    "waiting",
    "processing",
    "finished",
    "restarted",
)
_INT = ("eligible_workers", "eligible_worker_threads", "queue_position", "horde_queue_position",
        "waiting", "processing", "finished", "restarted")
_BOOL = ("is_possible", "fallback")
_FLOAT = ("wait_time", "ahead_wait", "horde_wait_time")


@dataclass(frozen=True)
class Cycle:
    """One cycle's publication: per-request payloads, horde totals, prospective state."""

    time: float
    interval: float
    request_ids: Sequence[str]
    payloads: Sequence[str]
    horde: dict[str, Any] = field(default_factory=dict)
    prospective: bytes = b""
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", make_cycle_id(self.time, self.interval))


@dataclass(frozen=True)
class Reading:
    """What a store read returned: the current cycle's id, time, interval and one value."""

    cycle_id: str
    time: float
    interval: float
    value: Any


def make_cycle_id(t: float, interval: float) -> str:
    """``time|interval|token``: readers learn the cycle time from the id alone.

    Examples
    --------
    >>> parse_cycle_id(make_cycle_id(1700000000.25, 5.0))[:2]
    (1700000000.25, 5.0)
    """
    return f"{t!r}|{interval!r}|{secrets.token_hex(4)}"


def parse_cycle_id(cycle_id: str | bytes) -> tuple[float, float, str]:
    if isinstance(cycle_id, bytes):
        cycle_id = cycle_id.decode()
    t, interval, token = cycle_id.split("|")
    return float(t), float(interval), token


def encode_payloads(estimates: Any, cycle_time: float) -> tuple[list[str], list[str]]:
    """Request ids and compact JSON payloads for every request of ``estimates``.

    Floats are kept to the millisecond; unknown (NaN) is ``null``.

    Examples
    --------
    >>> import numpy as np
    >>> from types import SimpleNamespace
    >>> cols = {f: np.zeros(1, dtype=np.int64) for f in _INT}
    >>> cols.update({f: np.zeros(1, dtype=bool) for f in _BOOL})
    >>> cols.update({f: np.array([np.nan]) for f in _FLOAT})
    >>> cols["gentype"] = np.zeros(1, dtype=np.int8)
    >>> est = SimpleNamespace(request_id=np.array(["r1"], dtype=object), columns=cols)
    >>> ids, payloads = encode_payloads(est, 1700000000.0)
    >>> payloads[0]
    '[1,1700000000.0,0,0,0,0,0,null,null,0,null,0,0,0,0,0]'
    >>> decode_payload(payloads[0])["wait_time"] is None
    True
    """
    cols = estimates.columns
    n = len(estimates.request_id)
    parts: list[list[str]] = [[str(PAYLOAD_VERSION)] * n, [repr(float(cycle_time))] * n]
    for name in PAYLOAD_FIELDS[2:]:
        values = np.asarray(cols[name])
        if name in _FLOAT:
            rounded = np.round(values.astype(np.float64), 3).tolist()
            parts.append(["null" if math.isnan(v) else repr(v) for v in rounded])
        else:
            parts.append([str(v) for v in values.astype(np.int64).tolist()])
    payloads = ["[" + ",".join(row) + "]" for row in zip(*parts)]
    return [str(r) for r in estimates.request_id.tolist()], payloads


def decode_payload(payload: str | bytes) -> dict[str, Any]:
    """The published figures of one request, by name (``None``: unknown)."""
    values = json.loads(payload)
    out = dict(zip(PAYLOAD_FIELDS, values))
    out["gentype"] = GENTYPES[out["gentype"]]
    for name in _BOOL:
        out[name] = bool(out[name])
    return out


class Store(Protocol):
    """What the job and the readers need of a publication store."""

    def publish(self, cycle: Cycle) -> bool: ...

    def read_status(self, request_id: str) -> Reading | None: ...

    def read_prospective(self) -> Reading | None: ...

    def read_meta(self) -> Reading | None: ...

    def close(self) -> None: ...


# -- Redis -------------------------------------------------------------------------------

_SWITCH = """
local old = redis.call('GET', KEYS[1])
local function ctime(id) return tonumber(string.match(id, '^[^|]+')) end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return redis.error_reply('cycle keys expired before the switch')
end
if old and old ~= ARGV[1] and ctime(old) > ctime(ARGV[1]) then
  -- a newer cycle is already current (another job process): never go back
  for i = 2, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
for i = 2, #KEYS do redis.call('PERSIST', KEYS[i]) end
if old and old ~= ARGV[1] then
  for _, s in ipairs({':s', ':m', ':p'}) do
    redis.call('EXPIRE', ARGV[2] .. ':c:' .. old .. s, ARGV[3])
  end
end
return 1
"""

_READ_FIELD = """
local cur = redis.call('GET', KEYS[1])
if not cur then return false end
return {cur, redis.call('HGET', ARGV[1] .. ':c:' .. cur .. ':s', ARGV[2])}
"""

_READ_KEY = """
local cur = redis.call('GET', KEYS[1])
if not cur then return false end
return {cur, redis.call('GET', ARGV[1] .. ':c:' .. cur .. ARGV[2])}
"""


class RedisStore:
    """Publish cycles to Redis and read them back in one round trip.

    Parameters
    ----------
    client : redis.Redis or str
        A client, or a ``redis://`` URL.
    prefix : str, default "vecsched"
        Key prefix; several hordes (or tests) can share one Redis.
    chunk : int, default 5000
        Hash fields per HSET command in the publication pipeline.

    Examples
    --------
    >>> store = RedisStore("redis://127.0.0.1:6379/0", prefix="doc-" + secrets.token_hex(4))
    >>> store.publish(Cycle(1.0, 5.0, ["r1"], ["[1,1.0]"]))
    True
    >>> store.read_status("r1").value, store.read_status("nope").value
    ('[1,1.0]', None)
    >>> store.drop_all()
    """

    def __init__(self, client: Any, prefix: str = "vecsched", chunk: int = 5000):
        import redis

        if isinstance(client, str):
            client = redis.Redis.from_url(client, socket_timeout=5, socket_connect_timeout=2)
        self.client = client
        self.prefix = prefix
        self.chunk = chunk
        self.current_key = f"{prefix}:current"
        self._switch = client.register_script(_SWITCH)
        self._read_field = client.register_script(_READ_FIELD)
        self._read_key = client.register_script(_READ_KEY)

    def _keys(self, cycle_id: str) -> tuple[str, str, str]:
        base = f"{self.prefix}:c:{cycle_id}"
        return base + ":s", base + ":m", base + ":p"

    def publish(self, cycle: Cycle) -> bool:
        """Write the cycle under new keys, then switch ``current`` to it atomically.

        Returns False when a newer cycle was already current (nothing switched).
        Raises on any Redis error; readers then still see the previous cycle.
        """
        status_key, meta_key, prosp_key = self._keys(cycle.id)
        # Unswitched keys die on their own if this process dies before the switch.
        pending_ttl = int(max(120.0, 20 * cycle.interval))
        grace = int(max(5.0, math.ceil(2 * cycle.interval)))
        meta = json.dumps({"horde": cycle.horde, "requests": len(cycle.request_ids)})
        pipe = self.client.pipeline(transaction=False)
        ids, payloads = list(cycle.request_ids), list(cycle.payloads)
        for start in range(0, len(ids), self.chunk):
            pipe.hset(status_key, mapping=dict(zip(ids[start : start + self.chunk],
                                                   payloads[start : start + self.chunk])))
            if start == 0:
                pipe.expire(status_key, pending_ttl)
        pipe.set(meta_key, meta, ex=pending_ttl)
        pipe.set(prosp_key, cycle.prospective, ex=pending_ttl)
        pipe.execute()
        keys = [self.current_key, status_key, meta_key, prosp_key]
        switched = self._switch(keys=keys, args=[cycle.id, self.prefix, grace])
        return bool(switched)

    def read_status(self, request_id: str) -> Reading | None:
        """The current cycle and request ``request_id``'s payload (None if absent): one round trip."""
        got = self._read_field(keys=[self.current_key], args=[self.prefix, request_id])
        return _reading(got, lambda v: v.decode() if v is not None else None)

    def read_prospective(self) -> Reading | None:
        got = self._read_key(keys=[self.current_key], args=[self.prefix, ":p"])
        return _reading(got, lambda v: v)

    def read_meta(self) -> Reading | None:
        got = self._read_key(keys=[self.current_key], args=[self.prefix, ":m"])
        return _reading(got, lambda v: json.loads(v) if v is not None else None)

    def drop_all(self) -> None:
        """Delete every key under this store's prefix (tests, teardown)."""
        keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            self.client.delete(*keys[start : start + 1000])

    def close(self) -> None:
        self.client.close()


def _reading(got: Any, convert: Any) -> Reading | None:
    if not got:
        return None
    cycle_id, value = got[0], got[1] if len(got) > 1 else None
    cycle_id = cycle_id.decode() if isinstance(cycle_id, bytes) else cycle_id
    t, interval, _ = parse_cycle_id(cycle_id)
    return Reading(cycle_id, t, interval, convert(value))


# -- SQL (embedded SQLite, or any SQLAlchemy database) ---------------------------------

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
    >>> from vecsched._sql import make_engine
    >>> store = SQLStore(make_engine("sqlite://"))
    >>> store.publish(Cycle(1.0, 5.0, ["r1"], ["[1,1.0]"]))
    True
    >>> store.read_status("r1").value, store.read_status("nope").value
    ('[1,1.0]', None)
    """

    def __init__(self, engine: Engine | str, chunk: int = 5000):
        if isinstance(engine, str):
            from ._sql import make_engine

            engine = make_engine(engine)
        self.engine = engine
        self.chunk = chunk
        # Tables are made on first use, so a store can be built while the
        # database is down (the job then logs failed cycles and retries).
        self._ready = False
        c, s, cur = vs_cycles, vs_status, vs_current
        self._status_sql = (
            sa.select(c.c.id, s.c.payload)
            .select_from(cur.join(c, c.c.id == cur.c.cycle_id).outerjoin(
                s, sa.and_(s.c.cycle_id == c.c.id, s.c.request_id == sa.bindparam("rid"))))
            .where(cur.c.slot == 0)
        )
        self._prosp_sql = (
            sa.select(c.c.id, c.c.prospective)
            .select_from(cur.join(c, c.c.id == cur.c.cycle_id)).where(cur.c.slot == 0)
        )
        self._meta_sql = (
            sa.select(c.c.id, c.c.meta)
            .select_from(cur.join(c, c.c.id == cur.c.cycle_id)).where(cur.c.slot == 0)
        )

    def _ensure(self) -> None:
        if not self._ready:
            pub_metadata.create_all(self.engine)
            self._ready = True

    def publish(self, cycle: Cycle) -> bool:
        self._ensure()
        meta = json.dumps({"horde": cycle.horde, "requests": len(cycle.request_ids)})
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Serialise publishers so the monotonic check below holds.
                conn.execute(sa.text("LOCK TABLE vs_current IN EXCLUSIVE MODE"))
            old = conn.execute(sa.select(vs_current.c.cycle_id).where(vs_current.c.slot == 0)).scalar()
            if old is not None and parse_cycle_id(old)[0] > cycle.time:
                return False
            conn.execute(vs_cycles.insert(), [{
                "id": cycle.id, "time": cycle.time, "interval": cycle.interval,
                "meta": meta, "prospective": cycle.prospective,
            }])
            rows = [{"cycle_id": cycle.id, "request_id": r, "payload": p}
                    for r, p in zip(cycle.request_ids, cycle.payloads)]
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
        self._ensure()
        with self.engine.connect() as conn:
            row = conn.execute(sql, params).first()
        if row is None:
            return None
        t, interval, _ = parse_cycle_id(row[0])
        return Reading(row[0], t, interval, convert(row[1]))

    def read_status(self, request_id: str) -> Reading | None:
        return self._one(self._status_sql, {"rid": request_id}, lambda v: v)

    def read_prospective(self) -> Reading | None:
        return self._one(self._prosp_sql, {}, lambda v: bytes(v) if v is not None else None)

    def read_meta(self) -> Reading | None:
        return self._one(self._meta_sql, {}, lambda v: json.loads(v) if v is not None else None)

    def close(self) -> None:
        self.engine.dispose()


def open_store(
    redis_url: str | None = None,
    database_url: str | None = None,
    prefix: str | None = None,
    env: dict[str, str] | None = None,
) -> RedisStore | SQLStore:
    """The configured store: Redis when a URL is given or ``$REDIS_URL`` is set,
    else the SQL database (``$VECSCHED_DATABASE_URL``, else the embedded SQLite file)."""
    from ._sql import default_database_url

    env = dict(os.environ) if env is None else env
    redis_url = redis_url or env.get("REDIS_URL")
    if redis_url:
        return RedisStore(redis_url, prefix=prefix or env.get("VECSCHED_REDIS_PREFIX") or "vecsched")
    return SQLStore(database_url or default_database_url(env))


def now() -> float:
    """Wall-clock epoch seconds (the default clock)."""
    return time.time()
