"""Publish cycles to Redis, read them back in one round trip.

Redis layout, for a key prefix ``P`` and a cycle id ``C`` (``time|interval|token``):

- ``P:current``: the id of the current cycle;
- ``P:c:C:s``: the payloads: a string, every request's padded payload row and
  an index by id hash (:mod:`vecsched.service.store.packed`); or, when an id
  or payload holds a newline, tab or NUL, a hash of field = request id and
  value = payload (also read: a hash whose field ``#`` holds a bucket count,
  :mod:`vecsched.service.store.buckets`, as published before the packed layout);
- ``P:c:C:m``: JSON of the cycle's horde-wide totals and counts;
- ``P:c:C:p``: the prospective-request state (bytes).

A cycle's keys are written with a TTL, so a cycle abandoned mid-way cleans
itself up; the switch makes them persistent and gives the previous cycle's
keys a short grace TTL. Reads are one Lua call: pointer and field together.
"""

from __future__ import annotations

import json
import math
from itertools import chain
from typing import Any, Iterator

from vecsched.service.store.base import Cycle, Reading, _reading
from vecsched.service.store.buckets import HASH_MODULUS, unbucket
from vecsched.service.store.packed import HEADER, pack_status, unpack_status

_SWITCH = """
-- KEYS: current, status key, meta, prospective; ARGV: cycle id, prefix, grace TTL, request count
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
  return redis.error_reply('cycle status key expired before the switch')
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
local h = ARGV[1] .. ':c:' .. cur .. ':s'
local id = ARGV[2]
-- a packed status is a string (no TYPE call: one less per read); a hash says WRONGTYPE
local head = redis.pcall('GETRANGE', h, 0, HEADER - 1)
if head == '' then return {cur, false} end
if type(head) == 'table' and not string.find(head['err'] or '', 'WRONGTYPE', 1, true) then return head end
-- The packed and bucketed layouts search "\\n" .. id .. "\\t", which an id holding a separator would match
-- across two entries (another request's row); no such id is ever in them (a cycle with one is published
-- a field per request, read by the HGET below), so it is not searched for there.
local separated = string.find(id, '\\n', 1, true) or string.find(id, '\\t', 1, true) or string.find(id, '\\0', 1, true)
local x = 0
for at = 1, #id, 64 do  -- string.byte returns the bytes at once, a bounded slice at a time
  local bytes = {string.byte(id, at, at + 63)}
  for i = 1, #bytes do x = (x * 31 + bytes[i]) % MODULUS end
end
if type(head) == 'string' then
  if separated then return {cur, false} end
  -- packed (vecsched.service.store.packed): header, the bucket's two offsets, its entries, the row
  local b, od, rd, w, at_index, at_rows = string.match(head, '^%S+ (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)')
  if not b then return redis.error_reply('not a packed status: ' .. h) end
  od, rd, w, at_index, at_rows = tonumber(od), tonumber(rd), tonumber(w), tonumber(at_index), tonumber(at_rows)
  local at = HEADER + (x % tonumber(b)) * od
  local span = redis.call('GETRANGE', h, at, at + 2 * od - 1)
  local first, stop = tonumber(string.sub(span, 1, od)), tonumber(string.sub(span, od + 1))
  if first == stop then return {cur, false} end
  local entries = redis.call('GETRANGE', h, at_index + first, at_index + stop - 1)
  local _, e = string.find(entries, '\\n' .. id .. '\\t', 1, true)
  if not e then return {cur, false} end
  local row = at_rows + tonumber(string.sub(entries, e + 1, e + rd)) * w
  -- the row is a tab, the payload, and NULs anywhere: the reader drops them (4 us of Redis time in Lua)
  return {cur, redis.call('GETRANGE', h, row + 1, row + w - 1), 1}
end
local buckets = tonumber(redis.call('HGET', h, '#') or '0') or 0
if buckets == 0 then return {cur, redis.call('HGET', h, id)} end
if separated then return {cur, false} end
-- many requests per field (vecsched.service.store.buckets): find this one's
local blob = redis.call('HGET', h, tostring(x % buckets))
if not blob then return {cur, false} end
local _, stop = string.find(blob, '\\n' .. id .. '\\t', 1, true)
if not stop then return {cur, false} end
local next_entry = string.find(blob, '\\n', stop + 1, true)
return {cur, string.sub(blob, stop + 1, (next_entry or 0) - 1)}
""".replace("MODULUS", str(HASH_MODULUS)).replace("HEADER", str(HEADER))

_READ_KEY = """
local cur = redis.call('GET', KEYS[1])
if not cur then return false end
return {cur, redis.call('GET', ARGV[1] .. ':c:' .. cur .. ARGV[2])}
"""


def redis_client(url: str) -> Any:
    """A redis-py client for ``url``, with the timeouts every vecsched client uses.

    A URL redis-py cannot parse is a :class:`vecsched.errors.SettingError` (the
    command line exits 2); the message never carries the URL, which may hold a password.

    Parameters
    ----------
    url : str
        A ``redis://``, ``rediss://`` or ``unix://`` URL.

    Returns
    -------
    redis.Redis

    Examples
    --------
    >>> redis_client("redis://127.0.0.1:6379/0").connection_pool.connection_kwargs["port"]
    6379
    >>> redis_client("redis://:secret@127.0.0.1:99999/0")
    Traceback (most recent call last):
    ...
    vecsched.errors.SettingError: bad Redis URL: Port out of range 0-65535
    """
    import redis

    from vecsched.errors import SettingError

    try:
        return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
    except ValueError as exc:
        raise SettingError(f"bad Redis URL: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


class RedisStore:
    """Publish cycles to Redis and read them back in one round trip.

    Parameters
    ----------
    client : redis.Redis or str
        A client, or a ``redis://`` URL.
    prefix : str, default "vecsched"
        Key prefix; several hordes (or tests) can share one Redis.
    chunk : int, default 5000
        Hash fields per HSET command when one field per request is written.
    bucketed : bool, default True
        Publish the packed layout (one string per cycle: far less work for
        Redis and this process); False publishes one hash field per request.
        Reads handle every layout.

    Examples
    --------
    >>> import secrets
    >>> store = RedisStore("redis://127.0.0.1:6379/0", prefix="doc-" + secrets.token_hex(4))
    >>> store.publish(Cycle(1.0, 5.0, ["r1"], ["[1,1.0]"]))
    True
    >>> store.read_status("r1").value, store.read_status("nope").value
    ('[1,1.0]', None)
    >>> store.drop_all()
    """

    def __init__(self, client: Any, prefix: str = "vecsched", chunk: int = 5000, bucketed: bool = True):
        if isinstance(client, str):
            client = redis_client(client)
        self.client = client
        self.prefix = prefix
        self.chunk = chunk
        self.bucketed = bucketed
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
        switch (every key is written with its TTL);
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
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            # as redis-py's own pipeline does: a dropped connection is retried, the cycle's bytes made again
            conn.retry.call_with_retry(
                lambda: self._write(conn, cycle, status_key, pending_ttl, [
                    (1, conn.pack_command("SET", meta_key, meta, "EX", pending_ttl)),
                    (1, conn.pack_command("SET", prosp_key, cycle.prospective, "EX", pending_ttl))]),
                lambda error: conn.disconnect())
        finally:
            pool.release(conn)
        keys = [self.current_key, status_key, meta_key, prosp_key]
        switched = self._switch(keys=keys, args=[cycle.id, self.prefix, grace, len(cycle.request_ids)])
        return bool(switched)

    def _write(self, conn: Any, cycle: Cycle, status_key: str, ttl: int, then: list[tuple[int, Any]]) -> None:
        """Send the status key's commands, then ``then``, on ``conn`` in one stream; read every reply.

        Nothing is read before everything is sent (a pipeline); the first
        error reply is raised once all replies are read, and any other failure
        drops the connection (a command may be half sent).
        """
        from redis.exceptions import ResponseError

        replies = 0
        try:
            for k, (count, pieces) in enumerate([*self._status_commands(conn, cycle, status_key, ttl), *then]):
                # a health check pings, which must come before any reply is pending
                conn.send_packed_command(pieces, check_health=k == 0)
                replies += count
            errors = []
            for _ in range(replies):
                try:
                    conn.read_response()
                except ResponseError as error:
                    errors.append(error)
            if errors:
                raise errors[0]
        except BaseException:
            conn.disconnect()
            raise

    def _status_commands(self, conn: Any, cycle: Cycle, key: str, ttl: int) -> Iterator[tuple[int, Any]]:
        """The status key's commands as (replies, wire pieces), each one written with its TTL."""
        packed = pack_status(cycle.request_ids, cycle.payloads) if self.bucketed else None
        if packed is not None:
            size, pieces = packed
            name = conn.encoder.encode(key)
            # one SET whose value is made a few thousand requests at a time, while it is sent
            yield 1, chain([b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(name), name, size)], pieces,
                           [b"\r\n$2\r\nEX\r\n$%d\r\n%d\r\n" % (len(str(ttl)), ttl)])
            return
        # one field per request (asked for, or an id or payload holds a separator)
        names, values = list(map(str.encode, cycle.request_ids)), list(map(str.encode, cycle.payloads))
        for start in range(0, len(names), self.chunk):
            part = slice(start, start + self.chunk)
            pairs: list[bytes] = [b""] * (2 * len(names[part]))
            pairs[0::2], pairs[1::2] = names[part], values[part]
            yield 1, conn.pack_command("HSET", key, *pairs)
            if start == 0:
                yield 1, conn.pack_command("EXPIRE", key, ttl)

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
        if got and len(got) > 2:  # a packed row, NUL-padded (a payload of the other layouts may hold NULs)
            got = [got[0], got[1].replace(b"\0", b"")]
        return _reading(got, lambda v: v.decode() if v is not None else None)

    def payloads(self, cycle_id: str) -> dict[str, str]:
        """Every request id and payload of cycle ``cycle_id`` (the whole status key), whatever the layout.

        Parameters
        ----------
        cycle_id : str

        Returns
        -------
        dict
            Request id to payload; empty when the cycle has no requests or is gone.
        """
        key = self._keys(cycle_id)[0]
        if self.client.type(key) == b"string":
            return unpack_status(self.client.get(key))
        return unbucket(self.client.hgetall(key))

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
