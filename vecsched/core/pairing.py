"""Recorded forecasts and their outcomes, paired in any order (SPEC.md section 8).

Every request gets one short-lived *record*: a hash of fields, each set once
(the first write wins, also across job processes):

- ``forecast:NAME``: the estimator's whole forecast as JSON, with
  ``forecasted_at`` (the request's first sighting), ``gentype`` and ``expiry``
  (one field per estimator, so two writers never mix halves of two forecasts),
  and ``late_s`` when the estimator runs off the main cycle and forecast the
  request from a later snapshot than its first sighting (seconds after it);
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

A late forecast is scored from the first sighting, like every other
estimator's: its p50 and p90 are moved onto that clock (``late_s`` added), and
an outcome that came before the forecast was made counts as a miss (a null
p50) instead of a hit the forecast could see; so lateness never flatters.

Backends: :class:`MemoryPairs` here (the simulator, tests); the service's
:class:`~vecsched.service.forecasts_store.RedisPairs` (layout in
docs/forecasts.md) and :class:`~vecsched.service.forecasts_sql.SQLPairs`.
No I/O here: the simulator scores with the very same rules.
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

    ``observed`` is seconds from the first sighting to the outcome (``start``,
    ``completion``), or 1.0 / 0.0 for an observed stall / none (``stall``);
    counters carry 0. ``predicted_stall`` is the forecast's stall prediction.
    ``late``: how late the forecast was made (seconds after the first
    sighting, 0 when made at it), on every pair of it (p50, p90 and ``observed`` are
    on the first sighting's clock; a calibration learns on the making's clock,
    where the estimator's own p50 lives, by taking ``late`` off both).

    Examples
    --------
    >>> p = Pair("eligible-share-v1", "text", "start", "r1", 10.0, 5.0, 65.0, 7.0, False)
    >>> Pair.from_json(p.estimator, p.gentype, p.phase, p.to_json(), p.at) == p
    True
    >>> q = Pair("dispatch-replay-v1", "text", "start", "r1", 10.0, 35.0, 95.0, 37.0, False, late=30.0)
    >>> Pair.from_json(q.estimator, q.gentype, q.phase, q.to_json(), q.at) == q
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
    late: float = 0.0

    def to_json(self) -> str:
        """The stored member (estimator, gentype and phase live in the key; ``late`` only when not 0)."""
        member = [self.request_id, self.p50, self.p90, self.observed, self.predicted_stall]
        return json.dumps(member + [self.late] if self.late else member, separators=(",", ":"))

    @classmethod
    def from_json(cls, estimator: str, gentype: str, phase: str, text: str | bytes, at: float) -> "Pair":
        """The pair a stored member describes."""
        rid, p50, p90, observed, stall, *late = json.loads(text)
        return cls(estimator, gentype, phase, rid, float(at), p50, p90, float(observed), bool(stall),
                   float(late[0]) if late else 0.0)


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

    def open_records(self, now: float) -> dict[str, dict[str, str]]:
        """Every record still alive at ``now``, by request id (a restarted job resumes tracking from them)."""
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
    seen) pairs neither start nor stall. A late forecast (``late_s``, see the
    module docstring) pairs from the first sighting with its p50 and p90
    moved by ``late_s``; an outcome before it was made pairs with null ones,
    and a start before it pairs no stall.

    Examples
    --------
    >>> fc = json.dumps({"start_p50": 5.0, "start_p90": 65.0, "completion_p50": 9.0,
    ...                  "completion_p90": 69.0, "predicted_stall": False,
    ...                  "forecasted_at": 100.0, "gentype": "text"})
    >>> [c for c, _ in candidate_pairs("r1", {"forecast:x": fc, "started_at": "112.0"})]
    ['v:x:forecast', 'v:x:start', 'v:x:stall']
    >>> late = json.dumps({**json.loads(fc), "late_s": 10.0})
    >>> [(p.phase, p.p50, p.observed, p.late) for _, p in candidate_pairs("r1", {"forecast:x": late, "started_at": "112.0"})]
    [('forecast', None, 0.0, 10.0), ('start', 15.0, 12.0, 10.0), ('stall', None, 0.0, 10.0)]
    >>> [(p.phase, p.p50) for _, p in candidate_pairs("r1", {"forecast:x": late, "started_at": "105.0"})]
    [('forecast', None), ('start', None)]
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
        late = float(f.get("late_s") or 0.0)
        made = at0 + late

        def pair(phase: str, at: float, p50: Any = None, p90: Any = None, observed: float = 0.0) -> tuple[str, Pair]:
            return f"v:{name}:{phase}", Pair(name, gentype, phase, request_id, at, _number(p50), _number(p90),
                                            observed, stall, late)

        def seen_from_first(value: Any, outcome_at: float) -> Any:
            # Seconds from the making -> from the first sighting; unknown if the outcome came first.
            value = _number(value)
            return None if value is None or outcome_at < made else value + late

        out.append(pair("forecast", at0))
        # A request already assigned when first forecast has no start (nor stall) to predict.
        started_after = started is not None and started >= at0
        if started_after:
            out.append(pair("start", started, seen_from_first(f["start_p50"], started),
                            seen_from_first(f["start_p90"], started), started - at0))
        if completed is not None and cancelled is None:
            out.append(pair("completion", completed, seen_from_first(f["completion_p50"], completed),
                            seen_from_first(f["completion_p90"], completed), max(0.0, completed - at0)))
        if started_after and started >= made:
            out.append(pair("stall", started, observed=0.0))
        elif expired is not None and cancelled is None:
            out.append(pair("stall", expired, observed=1.0))
        if cancelled is not None:
            out.append(pair("cancelled", cancelled))
    return out


TERMINAL_FIELDS = ("completed_at", "expired_without_start", "cancelled_at")
"""Outcomes after which nothing more is observed of a request."""


def awaiting_outcomes(records: Mapping[str, Mapping[str, str]]) -> dict[str, tuple[float, float, bool]]:
    """The records still owed an outcome: ``(first sighting, expiry, started)`` by request id.

    A record with a forecast and no terminal outcome (:data:`TERMINAL_FIELDS`);
    what a restarted job tracks again, so that requests in flight across a
    restart still get their completion, stall or cancellation.

    Examples
    --------
    >>> fc = json.dumps({"forecasted_at": 100.0, "gentype": "text", "expiry": 700.0})
    >>> awaiting_outcomes({"a": {"forecast:x": fc, "started_at": "130.0"},
    ...                    "b": {"forecast:x": fc, "completed_at": "190.0"}, "c": {"started_at": "5.0"}})
    {'a': (100.0, 700.0, True)}
    """
    out = {}
    for rid, record in records.items():
        if any(field in record for field in TERMINAL_FIELDS):
            continue
        forecast = next((text for key, text in record.items() if key.startswith("forecast:")), None)
        if forecast is None:
            continue
        try:
            f = json.loads(forecast)
            out[rid] = (float(f["forecasted_at"]), float(f["expiry"]), "started_at" in record)
        except (ValueError, KeyError, TypeError):
            continue  # a record this code did not write: nothing to resume
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

    def __init__(self, backend: PairBackend, *, grace: float = GRACE_SECONDS, window: float = WINDOW_SECONDS,
                 observe: Any = None):
        self.backend = backend
        self.observe = observe  # called with each batch of new pairs (the service: OpenTelemetry)
        self.grace = grace
        self.window = window

    def record_forecasts(
        self, forecasts: Iterable[tuple[str, str, float, Mapping[str, Mapping[str, Any]]]], *, now: float,
        first_seen: Sequence[float] | None = None,
    ) -> list[Pair]:
        """Record ``(request_id, gentype, expiry, {estimator: forecast})`` rows first seen at ``now``.

        ``first_seen``: per row, when the request was first seen waiting, for
        forecasts made later, at ``now`` (off the main cycle): the record keeps
        that time as ``forecasted_at`` and ``late_s = now - first_seen``.
        """
        forecasts = list(forecasts)
        seen = [now] * len(forecasts) if first_seen is None else [float(t) for t in first_seen]
        writes = []
        for (rid, gentype, expiry, by_name), at0 in zip(forecasts, seen):
            stamp: dict[str, Any] = {"forecasted_at": at0, "gentype": gentype, "expiry": expiry}
            if first_seen is not None:
                stamp["late_s"] = now - at0
            fields = {}
            for name, forecast in by_name.items():
                fields[f"forecast:{name}"] = json.dumps(dict(forecast, **stamp), separators=(",", ":"))
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

    def extend(self, records: Iterable[tuple[str, float]]) -> None:
        """Keep the records of ``(request_id, expiry)`` until that expiry plus the grace (never shorter).

        The horde moves a request's expiry on as it hands out jobs; its record must outlive the new one.
        """
        writes = [Write(rid, {}, float(expiry) + self.grace) for rid, expiry in records]
        if writes:
            self.backend.write(writes)

    def _apply(self, writes: list[Write]) -> list[Pair]:
        if not writes:
            return []
        records = self.backend.write(writes)
        # Pairs not claimed yet, as this write sees its records.
        pending = [c for w, rec in zip(writes, records) for c in candidate_pairs(w.request_id, rec)
                   if c[0] not in rec]
        if not pending:
            return []
        # Stored before they are claimed: adding a pair is idempotent (one per estimator, gentype,
        # phase and request), so a write that fails between the two leaves the pair to the next
        # write, where a claim that came first would have lost it for good. The claim then
        # decides which writer counts it.
        self.backend.add_pairs([p for _, p in pending])
        won = self.backend.claim([(p.request_id, field) for field, p in pending])
        pairs = [p for (_, p), ok in zip(pending, won) if ok]
        if pairs and self.observe is not None:
            self.observe(pairs)
        return pairs


# ---------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------


def _pair_key(pair: Pair) -> tuple[str, str, str, str]:
    """What makes a pair one: a request's phase, per estimator and gentype (the SQL table's key)."""
    return pair.estimator, pair.gentype, pair.phase, pair.request_id


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
        self._keys: set[tuple[str, str, str, str]] = set()
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
            for p in pairs:
                if _pair_key(p) not in self._keys:
                    self._keys.add(_pair_key(p))
                    self._pairs.append(p)

    def pairs(self, since: float, until: float) -> list[Pair]:
        with self._lock:
            return [p for p in self._pairs if since <= p.at <= until]

    def trim(self, before: float, now: float | None = None) -> None:
        with self._lock:
            self._pairs = [p for p in self._pairs if p.at >= before]
            self._keys = {_pair_key(p) for p in self._pairs}

    def add_verdict(self, at: float, verdict: Mapping[str, Any]) -> None:
        with self._lock:
            self._verdicts.append((at, dict(verdict)))

    def verdicts(self, since: float) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            return sorted((v for v in self._verdicts if v[0] >= since), key=lambda v: v[0])

    def record(self, request_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._records.get(request_id, {}))

    def open_records(self, now: float) -> dict[str, dict[str, str]]:
        with self._lock:  # TTLs are not enforced here: every record is open
            return {rid: dict(rec) for rid, rec in self._records.items()}


