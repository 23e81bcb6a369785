"""The Redis backend of the forecast records and pairs (rules: :mod:`vecsched.core.pairing`)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from vecsched.core.pairing import (  # noqa: F401 - the service's names for the pairing core
    COUNTERS,
    GRACE_SECONDS,
    OUTCOME_FIELDS,
    PHASES,
    VERDICT_KEEP_SECONDS,
    WINDOW_SECONDS,
    ForecastRecorder,
    MemoryPairs,
    Pair,
    PairBackend,
    Write,
    candidate_pairs,
)


_WRITE_LUA = """
-- KEYS[1]: the record; ARGV[1]: expire at (epoch s); then field, value pairs
for i = 2, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
local want = tonumber(ARGV[1])
local ttl = redis.call('TTL', KEYS[1])
local now = tonumber(redis.call('TIME')[1])
if ttl < 0 or now + ttl < want then redis.call('EXPIREAT', KEYS[1], math.ceil(want)) end
return redis.call('HGETALL', KEYS[1])
"""


_ADD_PAIR_LUA = """
-- KEYS[1]: the request's record, KEYS[2]: the pair's series; ARGV: stored-mark field, member, score
-- One pair per (estimator, phase, request), as SQL's primary key keeps it: two writers may hold two
-- versions of a pair (one saw the expiry, the other the start), and the series takes the first.
if redis.call('HSETNX', KEYS[1], ARGV[1], '1') == 1 then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2]) end
return 0
"""


class RedisPairs:
    """The Redis backend (layout: docs/forecasts.md).

    Parameters
    ----------
    client : redis.Redis or str
    prefix : str

    Examples
    --------
    >>> import secrets
    >>> b = RedisPairs("redis://127.0.0.1:6379/0", prefix="doc-" + secrets.token_hex(4))
    >>> b.claim([("r", "v:x:start"), ("r", "v:x:start")])
    [True, False]
    >>> b.drop_all()
    """

    def __init__(self, client: Any, prefix: str = "vecsched"):
        from vecsched.service.store.redis import redis_client

        if isinstance(client, str):
            client = redis_client(client)
        self.client = client
        self.prefix = prefix
        self._write = client.register_script(_WRITE_LUA)
        self._add_pair = client.register_script(_ADD_PAIR_LUA)

    def key(self, request_id: str) -> str:
        """The record's key: ``{prefix}:forecast:{request_id}``."""
        return f"{self.prefix}:forecast:{request_id}"

    def _series(self, estimator: str, gentype: str, phase: str) -> str:
        return f"{self.prefix}:pairs:{estimator}:{gentype}:{phase}"

    def write(self, writes: Sequence[Write]) -> list[dict[str, str]]:
        pipe = self.client.pipeline(transaction=False)
        for w in writes:
            args: list[Any] = [repr(float(w.expire_at))]
            for k, v in w.fields.items():
                args += [k, v]
            self._write(keys=[self.key(w.request_id)], args=args, client=pipe)
        out = []
        for flat in pipe.execute():
            it = iter(flat)
            out.append({_s(k): _s(v) for k, v in zip(it, it)})
        return out

    def claim(self, claims: Sequence[tuple[str, str]]) -> list[bool]:
        pipe = self.client.pipeline(transaction=False)
        for rid, field in claims:
            pipe.hsetnx(self.key(rid), field, "1")
        return [bool(x) for x in pipe.execute()]

    def add_pairs(self, pairs: Sequence[Pair]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for p in pairs:
            key = self._series(p.estimator, p.gentype, p.phase)
            # The mark lives in the record, so it expires with it (a pair forms only while it lives).
            self._add_pair(keys=[self.key(p.request_id), key], args=[f"s:{p.estimator}:{p.phase}", p.to_json(), p.at],
                           client=pipe)
            pipe.sadd(f"{self.prefix}:pairs", f"{p.estimator}\t{p.gentype}\t{p.phase}")
        pipe.execute()

    def _all_series(self) -> list[tuple[str, str, str]]:
        return [tuple(_s(m).split("\t")) for m in self.client.smembers(f"{self.prefix}:pairs")]  # type: ignore[misc]

    def pairs(self, since: float, until: float) -> list[Pair]:
        series = self._all_series()
        pipe = self.client.pipeline(transaction=False)
        for s in series:
            pipe.zrangebyscore(self._series(*s), since, until, withscores=True)
        out = []
        for s, members in zip(series, pipe.execute()):
            out.extend(Pair.from_json(*s, m, at) for m, at in members)
        return out

    def trim(self, before: float, now: float | None = None) -> None:
        # Records expire by their own TTL; ``now`` is for backends without one.
        pipe = self.client.pipeline(transaction=False)
        for s in self._all_series():
            pipe.zremrangebyscore(self._series(*s), "-inf", f"({before!r}")
        pipe.zremrangebyscore(f"{self.prefix}:verdicts", "-inf", f"({before - VERDICT_KEEP_SECONDS!r}")
        pipe.execute()

    def add_verdict(self, at: float, verdict: Mapping[str, Any]) -> None:
        # The time is part of the member: hourly verdicts that say the same
        # would otherwise be one member, rescored, and no run of them could last 24 h.
        member = json.dumps({"at": float(at), **verdict}, separators=(",", ":"))
        self.client.zadd(f"{self.prefix}:verdicts", {member: at})

    def verdicts(self, since: float) -> list[tuple[float, dict[str, Any]]]:
        got = self.client.zrangebyscore(f"{self.prefix}:verdicts", since, "+inf", withscores=True)
        return [(float(at), {k: v for k, v in json.loads(m).items() if k != "at"}) for m, at in got]

    def record(self, request_id: str) -> dict[str, str]:
        return {_s(k): _s(v) for k, v in self.client.hgetall(self.key(request_id)).items()}

    def open_records(self, now: float) -> dict[str, dict[str, str]]:
        # The records' own TTLs say which are alive; one SCAN and pipelined reads, once per job start.
        head = self.key("")
        keys = [_s(k) for k in self.client.scan_iter(match=_glob_escape(head) + "*", count=1000)]
        out: dict[str, dict[str, str]] = {}
        for start in range(0, len(keys), 1000):
            pipe = self.client.pipeline(transaction=False)
            for key in keys[start : start + 1000]:
                pipe.hgetall(key)
            for key, fields in zip(keys[start : start + 1000], pipe.execute()):
                if fields:
                    out[key[len(head):]] = {_s(k): _s(v) for k, v in fields.items()}
        return out

    def drop_all(self) -> None:
        """Delete every key under the prefix (tests)."""
        for key in self.client.scan_iter(match=f"{self.prefix}:*", count=1000):
            self.client.delete(key)


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob (a prefix may hold ``*``, ``?`` or ``[``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
