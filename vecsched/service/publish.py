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
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from vecsched.snapshot.schema import GENTYPES
from vecsched.core.result import BOOL_FIELDS, FIELDS, INT_FIELDS

PAYLOAD_VERSION = 1
# A payload is the estimate's fields (vecsched.core.result.FIELDS) behind a
# version and the cycle time; bump PAYLOAD_VERSION when FIELDS change.
PAYLOAD_FIELDS = ("version", "cycle_time") + FIELDS
_INT = INT_FIELDS
_BOOL = BOOL_FIELDS
_FLOAT = ("wait_time", "ahead_wait", "horde_wait_time")


@dataclass(frozen=True)
class Cycle:
    """One cycle's publication: per-request payloads, horde totals, prospective state.

    The id defaults to :func:`make_cycle_id` of ``time`` and ``interval``.

    Examples
    --------
    >>> c = Cycle(100.0, 5.0, ["r1"], ["[1,100.0]"])
    >>> parse_cycle_id(c.id)[:2]
    (100.0, 5.0)
    """

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
    """What a store read returned: the current cycle's id, time, interval and one value.

    Examples
    --------
    >>> Reading("100.0|5.0|ab", 100.0, 5.0, None).interval
    5.0
    """

    cycle_id: str
    time: float
    interval: float
    value: Any


def make_cycle_id(t: float, interval: float) -> str:
    """``time|interval|token``: readers learn the cycle time from the id alone.

    Parameters
    ----------
    t : float
        The cycle time, epoch seconds.
    interval : float
        The refresh interval, seconds.

    Returns
    -------
    str
        A new id; the random token tells apart two cycles of the same time.

    Examples
    --------
    >>> parse_cycle_id(make_cycle_id(1700000000.25, 5.0))[:2]
    (1700000000.25, 5.0)
    """
    return f"{t!r}|{interval!r}|{secrets.token_hex(4)}"


def parse_cycle_id(cycle_id: str | bytes) -> tuple[float, float, str]:
    """The time, interval and token a cycle id carries.

    Parameters
    ----------
    cycle_id : str or bytes
        An id made by :func:`make_cycle_id` (bytes as Redis returns it).

    Returns
    -------
    tuple of (float, float, str)
        ``(time, interval, token)``.

    Examples
    --------
    >>> parse_cycle_id(b"1700000000.5|5.0|0a1b2c3d")
    (1700000000.5, 5.0, '0a1b2c3d')
    """
    if isinstance(cycle_id, bytes):
        cycle_id = cycle_id.decode()
    t, interval, token = cycle_id.split("|")
    return float(t), float(interval), token


def encode_payloads(estimates: Any, cycle_time: float) -> tuple[list[str], list[str]]:
    """Request ids and compact JSON payloads for every request of ``estimates``.

    Floats are kept to the millisecond; unknown (NaN, and the infinities JSON
    cannot carry) is ``null``. The payloads are built column-wise as one ASCII
    byte matrix (see :func:`_ascii_rows`), so the cost per request is NumPy's,
    not the interpreter's: 300,000 requests encode in a fraction of a second.

    Parameters
    ----------
    estimates : Estimates
        Anything with ``request_id`` (array of str) and ``columns`` (name ->
        array, every :data:`PAYLOAD_FIELDS` entry after the first two).
    cycle_time : float
        Epoch seconds of the cycle, carried by every payload.

    Returns
    -------
    ids, payloads : list of str
        Aligned: ``payloads[k]`` is the JSON array of ``ids[k]``.

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
    # map() calls str from C: no interpreter step per request.
    ids = list(map(str, np.asarray(estimates.request_id, dtype=object).tolist()))
    n = len(ids)
    if n == 0:
        return ids, []
    blocks: list[np.ndarray] = []
    for name in PAYLOAD_FIELDS[2:]:
        values = np.asarray(cols[name])
        if len(values) != n:
            raise ValueError(f"column {name!r} has {len(values)} values for {n} requests")
        if name in _FLOAT:
            blocks.append(_float_block(values.astype(np.float64)))
        else:
            blocks.append(_int_block(values.astype(np.int64)))
    head = f"[{PAYLOAD_VERSION},{float(cycle_time)!r},"
    return ids, _ascii_rows(blocks, head, "]")


# -- column-wise ASCII formatting ----------------------------------------------------------
#
# Each column becomes an (n, width) uint8 block of ASCII, right-aligned and padded
# with NUL bytes. The blocks go side by side (with commas) into one matrix, a row
# per request; dropping every NUL leaves the rows back to back, and one split makes
# the strings. NUL never occurs in a formatted number, so padding cannot eat a digit.

_TRIPLES = np.array([list(f"{k:03d}".encode()) for k in range(1000)], dtype=np.uint8)
_FLOAT_EXACT_LIMIT = 1e15  # |x| * 1000 stays an exact int64 below this


def _digits(magnitude: np.ndarray, negative: np.ndarray | None = None) -> np.ndarray:
    """Decimal ASCII of non-negative int64 ``magnitude``, with '-' where ``negative``."""
    n = len(magnitude)
    top = int(magnitude.max())
    chunks = max(1, -(-len(str(top)) // 3))
    width = 3 * chunks
    out = np.empty((n, width), dtype=np.uint8)
    rest = magnitude
    # Three digits per table lookup: integer division is the slow step, so do few.
    for k in range(chunks):
        if k < chunks - 1:
            rest, low = np.divmod(rest, 1000)
        else:
            low = rest
        np.take(_TRIPLES, low, axis=0, out=out[:, width - 3 * (k + 1) : width - 3 * k])
    # Leading zeros become padding; the units digit always shows, so 0 prints "0".
    threshold = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    threshold[-1] = 0
    shown = magnitude[:, None] >= threshold
    out *= shown
    if negative is not None and negative.any():
        out = np.hstack([np.zeros((n, 1), dtype=np.uint8), out])
        rows = np.flatnonzero(negative)
        # the sign goes just left of the first shown digit
        out[rows, width - shown[rows].sum(axis=1)] = ord("-")
    return out


def _int_block(values: np.ndarray) -> np.ndarray:
    negative = values < 0
    return _digits(np.abs(values), negative)


def _float_block(values: np.ndarray) -> np.ndarray:
    """Floats rounded to 3 decimals, as ``int.frac`` with trailing zeros trimmed (``12.4``, ``0.0``)."""
    n = len(values)
    finite = np.isfinite(values)
    exact = finite & (np.abs(np.where(finite, values, 0.0)) < _FLOAT_EXACT_LIMIT)
    # rint(x * 1000) is what np.round(x, 3) rounds; m / 1000 parses back to the same double.
    milli = np.rint(np.where(exact, values, 0.0) * 1000.0).astype(np.int64)
    magnitude = np.abs(milli)
    whole, frac = np.divmod(magnitude, 1000)
    whole_ascii = _digits(whole, milli < 0)
    body = np.empty((n, whole_ascii.shape[1] + 4), dtype=np.uint8)
    body[:, :-4] = whole_ascii
    body[:, -4] = ord(".")
    np.take(_TRIPLES, frac, axis=0, out=body[:, -3:])
    # trailing zeros of the fraction go, one digit always stays: 12.4, 0.0, 0.125
    body[:, -1] *= body[:, -1] != ord("0")
    body[:, -2] *= (body[:, -2] != ord("0")) | (body[:, -1] != 0)
    if not exact.all():
        width = max(body.shape[1], 4)
        if width > body.shape[1]:
            body = np.hstack([np.zeros((n, width - body.shape[1]), dtype=np.uint8), body])
        # Unknown, or infinite (no JSON form): null, right-aligned like the numbers.
        body[~finite] = 0
        body[~finite, width - 4 :] = np.frombuffer(b"null", dtype=np.uint8)
        odd = np.flatnonzero(finite & ~exact)
        if len(odd):
            # Beyond exact milliseconds (weeks of wait are far below): rare, done one by one.
            # round(), not np.round(): x * 1000 would overflow near the top of the range
            texts = [repr(round(v, 3)).encode("ascii") for v in values[odd].tolist()]
            grow = max(map(len, texts)) - width
            if grow > 0:
                body = np.hstack([np.zeros((n, grow), dtype=np.uint8), body])
                width += grow
            body[odd] = 0
            for row, text in zip(odd.tolist(), texts):
                body[row, width - len(text) :] = np.frombuffer(text, dtype=np.uint8)
    return body


def _ascii_rows(blocks: list[np.ndarray], head: str, tail: str) -> list[str]:
    """``head + ",".join(block row texts) + tail`` for every row, without a per-row step."""
    n = len(blocks[0])
    head_b, tail_b = head.encode("ascii"), (tail + "\n").encode("ascii")
    width = len(head_b) + sum(b.shape[1] for b in blocks) + len(blocks) - 1 + len(tail_b)
    # Column-major: each block column is one contiguous write; ravel() below
    # does the single transpose to row order.
    matrix = np.empty((n, width), dtype=np.uint8, order="F")
    at = 0
    for k, block in enumerate(blocks):
        if k:
            matrix[:, at] = ord(",")
            at += 1
        else:
            matrix[:, : len(head_b)] = np.frombuffer(head_b, dtype=np.uint8)
            at = len(head_b)
        matrix[:, at : at + block.shape[1]] = block
        at += block.shape[1]
    matrix[:, at:] = np.frombuffer(tail_b, dtype=np.uint8)
    flat = matrix.ravel()
    rows = flat[flat != 0].tobytes().decode("ascii").split("\n")
    rows.pop()  # after the last newline
    return rows


def decode_payload(payload: str | bytes) -> dict[str, Any]:
    """The published figures of one request, by name (``None``: unknown).

    Parameters
    ----------
    payload : str or bytes
        One payload as :func:`encode_payloads` made it.

    Returns
    -------
    dict
        :data:`PAYLOAD_FIELDS` to values; ``gentype`` as its name, flags as bool.

    Examples
    --------
    >>> got = decode_payload("[1,100.0,1,3,6,1,2,41.6,null,4,50.0,0,1,0,0,0]")
    >>> got["gentype"], got["queue_position"], got["ahead_wait"], got["is_possible"]
    ('image', 2, None, True)
    """
    values = json.loads(payload)
    out = dict(zip(PAYLOAD_FIELDS, values))
    out["gentype"] = GENTYPES[out["gentype"]]
    for name in _BOOL:
        out[name] = bool(out[name])
    return out


@runtime_checkable
class Store(Protocol):
    """What the job and the readers need of a publication store.

    :class:`RedisStore` and :class:`SQLStore` implement it; every read returns
    None while no cycle was ever published.

    Examples
    --------
    >>> isinstance(SQLStore("sqlite://"), Store)
    True
    """

    def publish(self, cycle: Cycle) -> bool:
        """Write ``cycle`` whole, then make it current.

        Parameters
        ----------
        cycle : Cycle

        Returns
        -------
        bool
            False when a newer cycle was already current (nothing switched).
        """
        ...

    def read_status(self, request_id: str) -> Reading | None:
        """The current cycle and one request's payload (value None if the cycle lacks it).

        Parameters
        ----------
        request_id : str

        Returns
        -------
        Reading or None
        """
        ...

    def read_current(self) -> Reading | None:
        """The current cycle alone (value None), as cheaply as the store can.

        Returns
        -------
        Reading or None
        """
        ...

    def read_prospective(self) -> Reading | None:
        """The current cycle and its prospective-request state (bytes).

        Returns
        -------
        Reading or None
        """
        ...

    def read_meta(self) -> Reading | None:
        """The current cycle and its horde totals.

        Returns
        -------
        Reading or None
        """
        ...

    def close(self) -> None:
        """Release the store's connections."""
        ...


# -- Redis -------------------------------------------------------------------------------

_SWITCH = """
-- KEYS: current, status hash, meta, prospective; ARGV: cycle id, prefix, grace TTL, request count
local old = redis.call('GET', KEYS[1])
local function ctime(id) return tonumber(string.match(id, '^[^|]+')) end
if old and old ~= ARGV[1] and ctime(old) > ctime(ARGV[1]) then
  -- a newer cycle is already current (another job process): never go back
  for i = 2, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
  return 0
end
-- Every key must still be there: each had a TTL until now, and a key that
-- expired would leave readers a cycle whose requests all read as unknown.
-- (An empty hash does not exist in Redis, so a cycle of no requests has none.)
if redis.call('EXISTS', KEYS[3]) == 0 or redis.call('EXISTS', KEYS[4]) == 0 then
  return redis.error_reply('cycle keys expired before the switch')
end
if tonumber(ARGV[4]) > 0 and redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.error_reply('cycle status hash expired before the switch')
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
        Raises on any Redis error, and when a key of the cycle expired before the
        switch (the status hash gets its TTL before its later chunks are written);
        readers then still see the previous cycle.

        Parameters
        ----------
        cycle : Cycle

        Returns
        -------
        bool
            True when the cycle is now current.
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
        switched = self._switch(keys=keys, args=[cycle.id, self.prefix, grace, len(ids)])
        return bool(switched)

    def read_status(self, request_id: str) -> Reading | None:
        """The current cycle and request ``request_id``'s payload (None if absent): one round trip.

        Parameters
        ----------
        request_id : str

        Returns
        -------
        Reading or None
            None when no cycle was ever published.
        """
        got = self._read_field(keys=[self.current_key], args=[self.prefix, request_id])
        return _reading(got, lambda v: v.decode() if v is not None else None)

    def read_current(self) -> Reading | None:
        """The current cycle alone (``value`` None): one GET, no payload.

        Returns
        -------
        Reading or None
            None when no cycle was ever published.
        """
        got = self.client.get(self.current_key)
        return None if got is None else _reading([got], lambda v: None)

    def read_prospective(self) -> Reading | None:
        """The current cycle and its prospective-request state (bytes), in one round trip.

        Returns
        -------
        Reading or None
            None when no cycle was ever published.
        """
        got = self._read_key(keys=[self.current_key], args=[self.prefix, ":p"])
        return _reading(got, lambda v: v)

    def read_meta(self) -> Reading | None:
        """The current cycle and its horde totals (``{"horde": ..., "requests": n}``), in one round trip.

        Returns
        -------
        Reading or None
            None when no cycle was ever published.
        """
        got = self._read_key(keys=[self.current_key], args=[self.prefix, ":m"])
        return _reading(got, lambda v: json.loads(v) if v is not None else None)

    def drop_all(self) -> None:
        """Delete every key under this store's prefix (tests, teardown)."""
        keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            self.client.delete(*keys[start : start + 1000])

    def close(self) -> None:
        """Close the Redis client's connections."""
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
        self._current_sql = (
            sa.select(c.c.id, sa.null())
            .select_from(cur.join(c, c.c.id == cur.c.cycle_id)).where(cur.c.slot == 0)
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


def open_store(
    redis_url: str | None = None,
    database_url: str | None = None,
    prefix: str | None = None,
    env: dict[str, str] | None = None,
) -> RedisStore | SQLStore:
    """The configured store: Redis when a URL is given or ``$REDIS_URL`` is set,
    else the SQL database (``$VECSCHED_DATABASE_URL``, else the embedded SQLite file).

    Parameters
    ----------
    redis_url : str, optional
        Wins over ``$REDIS_URL``.
    database_url : str, optional
        Wins over ``$VECSCHED_DATABASE_URL``; used only without a Redis URL.
    prefix : str, optional
        Redis key prefix; default ``$VECSCHED_REDIS_PREFIX``, else ``"vecsched"``.
    env : dict, optional
        The environment to read; default ``os.environ``.

    Returns
    -------
    RedisStore or SQLStore

    Examples
    --------
    >>> type(open_store(database_url="sqlite://", env={})).__name__
    'SQLStore'
    >>> type(open_store(env={"REDIS_URL": "redis://127.0.0.1:6379/0"})).__name__
    'RedisStore'
    """
    from vecsched.service.sql import default_database_url

    env = dict(os.environ) if env is None else env
    redis_url = redis_url or env.get("REDIS_URL")
    if redis_url:
        return RedisStore(redis_url, prefix=prefix or env.get("VECSCHED_REDIS_PREFIX") or "vecsched")
    return SQLStore(database_url or default_database_url(env))


def now() -> float:
    """Wall-clock epoch seconds (the default clock).

    Returns
    -------
    float

    Examples
    --------
    >>> now() > 1.6e9
    True
    """
    return time.time()
