"""Recorded forecasts and their outcomes, paired in any order (SPEC.md section 8).

Every request gets one short-lived *record*: a hash of fields, each set once
(the first write wins, also across job processes):

- ``forecast:NAME``: the estimator's whole forecast as JSON, with
  ``forecasted_at``, ``gentype`` and ``expiry`` (one field per estimator, so two
  writers never mix halves of two forecasts);
- ``started_at``, ``completed_at``, ``expired_without_start``, ``cancelled_at``:
  outcome times, epoch seconds;
- ``v:NAME:PHASE``: a claim that the pair (NAME, PHASE) was validated; only the
  writer whose claim succeeds adds the pair, so each pair counts exactly once.

The record lives until the request's expiry plus :data:`GRACE_SECONDS`
(a later write only ever extends it). Whoever writes a field reads the whole
record back and claims every pair it now completes, so a pair forms whichever
of forecast and outcome came first.

Validated pairs are kept per (estimator, gentype, phase) for the rolling
window, scored by their time; phases: ``start``, ``completion``, ``stall``
(expiry before first assignment, predicted or not), and the counters
``forecast`` and ``cancelled`` for the shares beside each series.

Backends: :class:`RedisPairs` (layout in docs/forecasts.md), :class:`SQLPairs`
(the embedded store: three tables) and :class:`MemoryPairs` (the simulator,
tests).
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

GRACE_SECONDS = 600.0
WINDOW_SECONDS = 86_400.0
VERDICT_KEEP_SECONDS = 3 * 86_400.0
OUTCOME_FIELDS = ("started_at", "completed_at", "expired_without_start", "cancelled_at")
PHASES = ("start", "completion", "stall")
COUNTERS = ("forecast", "cancelled")


@dataclass(frozen=True)
class Pair:
    """One validated pair: a forecast and what happened.

    ``observed`` is seconds from the forecast to the outcome (``start``,
    ``completion``), or 1.0 / 0.0 for an observed stall / none (``stall``);
    counters carry 0. ``predicted_stall`` is the forecast's stall prediction.

    Examples
    --------
    >>> p = Pair("eligible-share-v1", "text", "start", "r1", 10.0, 5.0, 65.0, 7.0, False)
    >>> Pair.from_json(p.estimator, p.gentype, p.phase, p.to_json(), p.at) == p
    True
    """

    estimator: str
    gentype: str
    phase: str
    request_id: str
    at: float
    p50: float | None
    p90: float | None
    observed: float
    predicted_stall: bool

    def to_json(self) -> str:
        """The stored member (estimator, gentype and phase live in the key)."""
        return json.dumps([self.request_id, self.p50, self.p90, self.observed, self.predicted_stall],
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, estimator: str, gentype: str, phase: str, text: str | bytes, at: float) -> "Pair":
        """The pair a stored member describes."""
        rid, p50, p90, observed, stall = json.loads(text)
        return cls(estimator, gentype, phase, rid, float(at), p50, p90, float(observed), bool(stall))


@dataclass(frozen=True)
class Write:
    """Fields to set once on one request's record, and the time it must live until."""

    request_id: str
    fields: Mapping[str, str]
    expire_at: float


class PairBackend(Protocol):
    """What :class:`ForecastRecorder` needs of a store."""

    def write(self, writes: Sequence[Write]) -> list[dict[str, str]]:
        """Set each absent field, extend each record's life; return each whole record after."""
        ...

    def claim(self, claims: Sequence[tuple[str, str]]) -> list[bool]:
        """Set each (request_id, claim field) once; True where this call set it."""
        ...

    def add_pairs(self, pairs: Sequence[Pair]) -> None:
        """Keep validated pairs for the window."""
        ...

    def pairs(self, since: float, until: float) -> list[Pair]:
        """Every kept pair with ``since <= at <= until``."""
        ...

    def trim(self, before: float, now: float | None = None) -> None:
        """Forget pairs older than ``before`` (and records expired by ``now``, where TTLs are not native)."""
        ...

    def add_verdict(self, at: float, verdict: Mapping[str, Any]) -> None:
        """Keep one hourly verdict."""
        ...

    def verdicts(self, since: float) -> list[tuple[float, dict[str, Any]]]:
        """Kept verdicts since ``since``, oldest first."""
        ...

    def record(self, request_id: str) -> dict[str, str]:
        """One request's record (empty when there is none)."""
        ...


# ---------------------------------------------------------------------------------
# Pairing: which pairs a record completes
# ---------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def candidate_pairs(request_id: str, record: Mapping[str, str]) -> list[tuple[str, Pair]]:
    """Every pair ``record`` completes, with the claim field that makes it count once.

    Rules (SPEC section 8): a start pairs whenever it was seen (also before a
    cancellation); completion and stall pairs leave cancelled requests out; a
    stall resolves at the first start (none) or at an expiry without start. A
    start before the forecast (the request was already assigned when first
    seen) pairs neither start nor stall.

    Examples
    --------
    >>> fc = json.dumps({"start_p50": 5.0, "start_p90": 65.0, "completion_p50": 9.0,
    ...                  "completion_p90": 69.0, "predicted_stall": False,
    ...                  "forecasted_at": 100.0, "gentype": "text"})
    >>> [c for c, _ in candidate_pairs("r1", {"forecast:x": fc, "started_at": "112.0"})]
    ['v:x:forecast', 'v:x:start', 'v:x:stall']
    """
    out: list[tuple[str, Pair]] = []
    started = _number(record.get("started_at"))
    completed = _number(record.get("completed_at"))
    expired = _number(record.get("expired_without_start"))
    cancelled = _number(record.get("cancelled_at"))
    for key, text in record.items():
        if not key.startswith("forecast:"):
            continue
        name = key[len("forecast:"):]
        f = json.loads(text)
        at0, gentype, stall = float(f["forecasted_at"]), str(f["gentype"]), bool(f["predicted_stall"])

        def pair(phase: str, at: float, p50: Any = None, p90: Any = None, observed: float = 0.0) -> tuple[str, Pair]:
            return f"v:{name}:{phase}", Pair(name, gentype, phase, request_id, at, _number(p50), _number(p90),
                                            observed, stall)

        out.append(pair("forecast", at0))
        # A request already assigned when first forecast has no start (nor stall) to predict.
        started_after = started is not None and started >= at0
        if started_after:
            out.append(pair("start", started, f["start_p50"], f["start_p90"], started - at0))
        if completed is not None and cancelled is None:
            out.append(pair("completion", completed, f["completion_p50"], f["completion_p90"],
                            max(0.0, completed - at0)))
        if started_after:
            out.append(pair("stall", started, observed=0.0))
        elif expired is not None and cancelled is None:
            out.append(pair("stall", expired, observed=1.0))
        if cancelled is not None:
            out.append(pair("cancelled", cancelled))
    return out


# ---------------------------------------------------------------------------------
# The recorder: forecasts and outcomes in, validated pairs out
# ---------------------------------------------------------------------------------


class ForecastRecorder:
    """Write forecasts and outcomes to a :class:`PairBackend` and validate what they pair.

    Parameters
    ----------
    backend : PairBackend
    grace : float
        Seconds a record outlives the request's expiry (or the outcome's time).
    window : float
        Seconds validated pairs are kept.

    Examples
    --------
    >>> rec = ForecastRecorder(MemoryPairs())
    >>> fc = {"start_p50": 5.0, "start_p90": 65.0, "completion_p50": 9.0,
    ...       "completion_p90": 69.0, "predicted_stall": False}
    >>> [p.phase for p in rec.record_forecasts([("r1", "text", 700.0, {"v1": fc})], now=100.0)]
    ['forecast']
    >>> [(p.phase, p.observed) for p in rec.record_outcomes([("r1", "started_at", 112.0, None)])]
    [('start', 12.0), ('stall', 0.0)]
    """

    def __init__(self, backend: PairBackend, *, grace: float = GRACE_SECONDS, window: float = WINDOW_SECONDS):
        self.backend = backend
        self.grace = grace
        self.window = window

    def record_forecasts(
        self, forecasts: Iterable[tuple[str, str, float, Mapping[str, Mapping[str, Any]]]], *, now: float
    ) -> list[Pair]:
        """Record ``(request_id, gentype, expiry, {estimator: forecast})`` rows first seen at ``now``."""
        writes = []
        for rid, gentype, expiry, by_name in forecasts:
            fields = {}
            for name, forecast in by_name.items():
                doc = dict(forecast, forecasted_at=now, gentype=gentype, expiry=expiry)
                fields[f"forecast:{name}"] = json.dumps(doc, separators=(",", ":"))
            writes.append(Write(rid, fields, max(expiry, now) + self.grace))
        return self._apply(writes)

    def record_outcomes(self, outcomes: Iterable[tuple[str, str, float, float | None]]) -> list[Pair]:
        """Record ``(request_id, outcome field, at, expiry or None)`` rows; return the pairs they complete."""
        writes = []
        for rid, name, at, expiry in outcomes:
            if name not in OUTCOME_FIELDS:
                raise ValueError(f"unknown outcome field {name!r}")
            until = max(at, expiry if expiry is not None else at) + self.grace
            writes.append(Write(rid, {name: repr(float(at))}, until))
        return self._apply(writes)

    def _apply(self, writes: list[Write]) -> list[Pair]:
        if not writes:
            return []
        records = self.backend.write(writes)
        candidates = [c for w, rec in zip(writes, records) for c in candidate_pairs(w.request_id, rec)]
        if not candidates:
            return []
        won = self.backend.claim([(p.request_id, field) for field, p in candidates])
        pairs = [p for (_, p), ok in zip(candidates, won) if ok]
        if pairs:
            self.backend.add_pairs(pairs)
            _observe(pairs)
        return pairs


def _observe(pairs: Sequence[Pair]) -> None:
    """Validation errors as OpenTelemetry histograms (bounded labels: estimator, gentype, phase)."""
    from vecsched.service import forecast_metrics

    forecast_metrics.observe_pairs(pairs)


# ---------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------


class MemoryPairs:
    """An in-process backend (the simulator, tests); TTLs are not enforced.

    Examples
    --------
    >>> m = MemoryPairs()
    >>> m.claim([("r", "v:x:start"), ("r", "v:x:start")])
    [True, False]
    """

    def __init__(self) -> None:
        self._records: dict[str, dict[str, str]] = {}
        self._pairs: list[Pair] = []
        self._verdicts: list[tuple[float, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def write(self, writes: Sequence[Write]) -> list[dict[str, str]]:
        with self._lock:
            out = []
            for w in writes:
                rec = self._records.setdefault(w.request_id, {})
                for k, v in w.fields.items():
                    rec.setdefault(k, v)
                out.append(dict(rec))
            return out

    def claim(self, claims: Sequence[tuple[str, str]]) -> list[bool]:
        with self._lock:
            out = []
            for rid, field in claims:
                rec = self._records.setdefault(rid, {})
                out.append(field not in rec)
                rec.setdefault(field, "1")
            return out

    def add_pairs(self, pairs: Sequence[Pair]) -> None:
        with self._lock:
            self._pairs.extend(pairs)

    def pairs(self, since: float, until: float) -> list[Pair]:
        with self._lock:
            return [p for p in self._pairs if since <= p.at <= until]

    def trim(self, before: float, now: float | None = None) -> None:
        with self._lock:
            self._pairs = [p for p in self._pairs if p.at >= before]

    def add_verdict(self, at: float, verdict: Mapping[str, Any]) -> None:
        with self._lock:
            self._verdicts.append((at, dict(verdict)))

    def verdicts(self, since: float) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            return sorted((v for v in self._verdicts if v[0] >= since), key=lambda v: v[0])

    def record(self, request_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._records.get(request_id, {}))


_WRITE_LUA = """
-- KEYS[1]: the record; ARGV[1]: expire at (epoch s); then field, value pairs
for i = 2, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
local want = tonumber(ARGV[1])
local ttl = redis.call('TTL', KEYS[1])
local now = tonumber(redis.call('TIME')[1])
if ttl < 0 or now + ttl < want then redis.call('EXPIREAT', KEYS[1], math.ceil(want)) end
return redis.call('HGETALL', KEYS[1])
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
        import redis

        if isinstance(client, str):
            client = redis.Redis.from_url(client, socket_timeout=5, socket_connect_timeout=2)
        self.client = client
        self.prefix = prefix
        self._write = client.register_script(_WRITE_LUA)

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
            pipe.zadd(key, {p.to_json(): p.at})
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
        self.client.zadd(f"{self.prefix}:verdicts", {json.dumps(verdict, separators=(",", ":")): at})

    def verdicts(self, since: float) -> list[tuple[float, dict[str, Any]]]:
        got = self.client.zrangebyscore(f"{self.prefix}:verdicts", since, "+inf", withscores=True)
        return [(float(at), json.loads(m)) for m, at in got]

    def record(self, request_id: str) -> dict[str, str]:
        return {_s(k): _s(v) for k, v in self.client.hgetall(self.key(request_id)).items()}

    def drop_all(self) -> None:
        """Delete every key under the prefix (tests)."""
        for key in self.client.scan_iter(match=f"{self.prefix}:*", count=1000):
            self.client.delete(key)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
