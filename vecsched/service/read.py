"""The read side: a request's status and the prospective request, from what the job published.

Neither function touches the horde database: :func:`status` is one store round
trip (one Lua call on Redis, one SELECT on SQL), :func:`prospective` reads the
prospective state the last cycle published.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from vecsched.service.store.base import Reading, Store
from vecsched.service.payload import decode_payload
from vecsched.service.config import open_store
from vecsched.snapshot.times import iso

log = logging.getLogger("vecsched.read")

DEFAULT_STALE_INTERVALS = 3.0
"""Figures older than this many refresh intervals are stale."""

_PROGRESS = ("waiting", "processing", "finished", "restarted", "faulted", "done")
_default: dict[str, Store] = {}
_default_lock = threading.Lock()

STATE_CACHE_SIZE = 4
"""Parsed prospective states kept, most recently used first out last (a cycle's
state is several MB parsed; readers only ever want the current one or two)."""
_states: OrderedDict[str, Any] = OrderedDict()
_states_lock = threading.Lock()


def default_store() -> Store:
    """The store named by the environment, opened once per process and reused.

    Returns
    -------
    Store
        See :func:`vecsched.service.config.open_store`.

    Examples
    --------
    >>> default_store() is default_store()
    True
    """
    with _default_lock:
        if "store" not in _default:
            _default["store"] = open_store()
        return _default["store"]


def cycle_age(reading: Reading, now: float | None = None, max_age: float | None = None) -> tuple[float, bool]:
    """Seconds since ``reading``'s cycle, and whether it is stale: the one staleness rule of every reader.

    Parameters
    ----------
    reading : Reading
        A published cycle.
    now : float, optional
        Epoch seconds; default the current time.
    max_age : float, optional
        Seconds after which the cycle is stale; default three of its refresh intervals.

    Returns
    -------
    (float, bool)

    Examples
    --------
    >>> cycle_age(Reading("100.0|5.0|x", 100.0, 5.0, None), now=110.0)
    (10.0, False)
    >>> cycle_age(Reading("100.0|5.0|x", 100.0, 5.0, None), now=116.0)[1]
    True
    """
    now = time.time() if now is None else now
    limit = DEFAULT_STALE_INTERVALS * reading.interval if max_age is None else max_age
    age = now - reading.time
    # A cycle stamped ahead of now (a clock that went back since) is as untrustworthy as an old one.
    return age, abs(age) > limit


def status(
    request_id: str,
    *,
    store: Store | None = None,
    progress: Mapping[str, Any] | None = None,
    max_age: float | None = None,
    now: float | None = None,
    publish: "ForecastPublication | None" = None,
) -> dict[str, Any]:
    """The AI Horde status fields of one request, from the last published cycle.

    Parameters
    ----------
    request_id : str
    store : Store, optional
        Where cycles are published; default: the environment's (``REDIS_URL``,
        else ``VECSCHED_DATABASE_URL``, else the embedded SQLite file).
    progress : mapping, optional
        Live progress from the horde (``waiting``, ``processing``, ``finished``,
        ``restarted``, ``faulted``, ``done``); it wins over the published counts,
        which are up to one cycle old.
    max_age : float, optional
        Seconds after which published figures are stale; default three refresh
        intervals of the publishing job.
    now : float, optional
        Epoch seconds; default the wall clock.
    publish : ForecastPublication, optional
        Publish this estimator's forecast (``--publish-forecast NAME``): while
        its promotion verdict is approved, ``wait_time`` is its completion p50,
        the ADR wait moves to ``adr_wait_time`` and the forecast is under
        ``forecast``; otherwise the answer is exactly as without it.

    Returns
    -------
    dict
        ``queue_position`` and ``wait_time`` (integers, wait rounded),
        ``is_possible``, ``eligible_workers``, ``eligible_worker_threads``,
        progress fields, ``done``, and vecsched's ``ahead_wait`` (seconds of work
        ahead), ``cycle_time`` and ``stale``. What is not known is left out: a
        null wait is omitted, stale figures are replaced by ``"stale": true``, and
        a request the cycle does not hold is ``"unknown": true``, never position 0.

    Examples
    --------
    >>> from vecsched.service.store.sql import SQLStore
    >>> from vecsched.service.store.base import Cycle
    >>> store = SQLStore("sqlite://")
    >>> _ = store.publish(Cycle(100.0, 5.0, ["r1"],
    ...     ["[1,100.0,0,3,6,1,2,41.6,20.0,4,50.0,0,1,0,0,0]"]))
    >>> status("r1", store=store, now=101.0)["wait_time"]
    42
    >>> status("r1", store=store, now=200.0)
    {'stale': True, 'cycle_time': '1970-01-01T00:01:40Z'}
    >>> status("r2", store=store, now=101.0)
    {'unknown': True, 'stale': False, 'cycle_time': '1970-01-01T00:01:40Z'}

    A request that left the queue reads as faulted or done:

    >>> _ = store.publish(Cycle(110.0, 5.0, ["r3"], ['{"ended":"faulted"}']))
    >>> status("r3", store=store, now=111.0)["faulted"]
    True
    """
    store = default_store() if store is None else store
    reading = store.read_status(request_id)
    out: dict[str, Any] = {}
    if reading is None:
        out["unknown"] = True
    else:
        _, stale = cycle_age(reading, now, max_age)
        ended = _ended(reading.value)
        if reading.value is None:
            out["unknown"] = True
        elif ended is not None:
            # Left the queue: say how, rather than unknown (the horde's own words).
            out.update(done=ended == "done", faulted=ended == "faulted")
            if ended == "done":
                out.update(queue_position=0, wait_time=0)
            else:
                out["is_possible"] = False
        if not stale and reading.value is not None and ended is None:
            figures = decode_payload(reading.value)
            out["queue_position"] = int(figures["queue_position"])
            if figures["wait_time"] is not None:
                out["wait_time"] = int(round(figures["wait_time"]))
            out["is_possible"] = figures["is_possible"]
            out["eligible_workers"] = int(figures["eligible_workers"])
            out["eligible_worker_threads"] = int(figures["eligible_worker_threads"])
            for name in ("waiting", "processing", "finished", "restarted"):
                out[name] = int(figures[name])
            # A published request was waiting when the cycle ran.
            out["done"] = False
            if figures["ahead_wait"] is not None:
                out["ahead_wait"] = float(figures["ahead_wait"])
            # Section 7: only while work waits and none of it is processing
            # (the evidence is null otherwise); absent from older payloads.
            if figures.get("stall_evidence") is not None:
                out["might_stall"] = figures["might_stall"]
            if publish is not None:
                _publish_forecast(out, publish.forecast(request_id, time.time() if now is None else now))
        out["stale"] = stale
        out["cycle_time"] = iso(reading.time)
    if progress:
        _merge_progress(out, progress)
    return out


def _ended(value: Any) -> str | None:
    """``"faulted"`` or ``"done"`` for a request the cycle published as ended, else None."""
    if isinstance(value, bytes):
        value = value.decode()
    if not isinstance(value, str) or not value.startswith("{"):
        return None
    import json

    return json.loads(value).get("ended")


def _merge_progress(out: dict[str, Any], progress: Mapping[str, Any]) -> None:
    for name in _PROGRESS:
        if name in progress and progress[name] is not None:
            value = progress[name]
            out[name] = bool(value) if name in ("done", "faulted") else int(value)
    if out.get("processing", 0) > 0:
        # SPEC section 4: a job in flight makes the request possible, whatever
        # the eligible counts say; and might_stall holds only while nothing is processing.
        out["is_possible"] = True
        out.pop("might_stall", None)
    if out.get("done") or out.get("faulted"):
        # Nothing of it waits any more (the horde paths say the same): no position, no wait, and
        # none of the cycle's waiting figures; a faulted request will never run, whatever is in flight.
        out["queue_position"] = 0
        out["wait_time"] = 0
        for name in ("ahead_wait", "might_stall", "unknown", "adr_wait_time", "forecast"):
            out.pop(name, None)
        if out.get("faulted"):
            out["is_possible"] = False


PUBLISHED_PHASES = ("start_p50", "start_p90", "completion_p50", "completion_p90")
VERDICT_REFRESH_SECONDS = 60.0
"""How often a reader looks at the stored verdicts again (the job stores one an hour)."""
VERDICT_MAX_AGE_SECONDS = 2 * 3600.0
"""A latest verdict older than this approves nothing: the job has stopped judging."""


def approved_by_verdicts(verdicts: list[tuple[float, Mapping[str, Any]]], name: str, now: float) -> bool:
    """Whether ``name`` is approved as of the job's latest stored hourly verdict.

    The same rule as :func:`vecsched.core.promotion.promotion_document` (all four
    series held in every hourly verdict for 24 hours), judged at the latest
    verdict's time from the ``{"holds": {...}}`` summaries alone, so a reader
    never re-reads a day of pairs. A latest verdict older than
    :data:`VERDICT_MAX_AGE_SECONDS` approves nothing.

    Parameters
    ----------
    verdicts : list of (float, mapping)
        The stored hourly verdicts: (time, ``{"holds": {estimator: bool}}``).
    name : str
        The estimator.
    now : float
        Epoch seconds.

    Returns
    -------
    bool

    Examples
    --------
    >>> day = [(h * 3600.0, {"holds": {"x": True}}) for h in range(25)]
    >>> approved_by_verdicts(day, "x", 24 * 3600.0), approved_by_verdicts(day[1:], "x", 24 * 3600.0)
    (True, False)
    >>> approved_by_verdicts(day, "x", 30 * 3600.0), approved_by_verdicts(day, "y", 24 * 3600.0)
    (False, False)
    """
    from vecsched.core.promotion import HOLD_SECONDS, held_since

    if not verdicts:
        return False
    history = [(float(at), v.get("holds", {})) for at, v in verdicts]
    latest_at, latest = max(history, key=lambda v: v[0])
    if now - latest_at > VERDICT_MAX_AGE_SECONDS:
        return False
    since = held_since(history, name, latest_at, bool(latest.get(name, False)))
    return since is not None and latest_at - since >= HOLD_SECONDS


class ForecastPublication:
    """One estimator's forecast for clients, once its promotion verdict is ``approved`` (SPEC section 8).

    The forecast published is the one the promotion validated: the estimator's
    record of the request's first sighting (``P:forecast:{id}``), counted down
    since it was made. Approval is read from the job's stored hourly verdicts
    at most every ``refresh`` seconds; a failed read keeps the last answer
    (none yet: not approved) for as long as a verdict is current
    (:data:`VERDICT_MAX_AGE_SECONDS` after the last good read), then withdraws it.

    Parameters
    ----------
    name : str
        The estimator (``dispatch-replay-v1``, ...).
    backend : PairBackend
        The forecast records and verdicts (:func:`for_store` finds the store's).
    refresh : float
        Seconds between looks at the verdicts.

    Examples
    --------
    >>> from vecsched.core.pairing import MemoryPairs
    >>> backend = MemoryPairs()
    >>> pub = ForecastPublication("x", backend)
    >>> pub.approved(now=100.0), pub.forecast("r1", now=100.0)
    (False, None)
    """

    def __init__(self, name: str, backend: Any, *, refresh: float = VERDICT_REFRESH_SECONDS):
        self.name = name
        self.backend = backend
        self.refresh = refresh
        self._lock = threading.Lock()
        self._checked_at = -math.inf
        self._read_at = -math.inf  # the last successful read of the verdicts
        self._approved = False
        self._stall_holds = False  # the latest verdict's stall signal passed its own bars

    @classmethod
    def for_store(cls, name: str, store: Store, **kwargs: Any) -> "ForecastPublication":
        """The publication reading the forecast records kept beside ``store`` (same Redis prefix or database).

        Parameters
        ----------
        name : str
            The estimator.
        store : Store
            The publication store whose forecast records to read.
        **kwargs : Any
            Passed on to the constructor (``refresh``).

        Returns
        -------
        ForecastPublication
        """
        from vecsched.service.forecast_job import recorder_for

        return cls(name, recorder_for(store).backend, **kwargs)

    def approved(self, now: float) -> bool:
        """Whether the estimator's latest verdict approves it (see :func:`approved_by_verdicts`).

        Parameters
        ----------
        now : float
            Epoch seconds; the verdicts are read again when ``refresh`` has passed.

        Returns
        -------
        bool
        """
        with self._lock:
            if now - self._checked_at < self.refresh:
                return self._approved
            self._checked_at = now
        from vecsched.core.promotion import HOLD_SECONDS

        try:
            verdicts = self.backend.verdicts(now - 2 * HOLD_SECONDS)
        except Exception:  # noqa: BLE001 - a verdict read never fails a status read
            # The last answer stands only as long as the verdict it came from would.
            with self._lock:
                if now - self._read_at > VERDICT_MAX_AGE_SECONDS:
                    self._approved = False
                return self._approved
        value = approved_by_verdicts(verdicts, self.name, now)
        stall = bool(verdicts and max(verdicts, key=lambda v: v[0])[1].get("stall_holds", {}).get(self.name, False))
        with self._lock:
            self._approved, self._read_at, self._stall_holds = value, now, value and stall
        return value

    def forecast(self, request_id: str, now: float) -> dict[str, Any] | None:
        """The published forecast of a request (seconds from ``now``), or None: not approved or not recorded.

        Parameters
        ----------
        request_id : str
        now : float
            Epoch seconds.

        Returns
        -------
        dict or None
            ``estimator``, ``forecasted_at``, each phase's p50/p90 counted down to ``now``; ``predicted_stall``
            only when the latest verdict's stall signal passes its bars for both gentypes.
        """
        if not self.approved(now):
            return None
        import json

        try:
            raw = self.backend.record(request_id).get(f"forecast:{self.name}")
            doc = json.loads(raw) if raw else None
            forecasted_at = float(doc["forecasted_at"]) if doc else None
        except Exception:  # noqa: BLE001 - an unreadable record never fails a status read: the ADR wait stands
            log.debug("forecast record unreadable (%s)", self.name, exc_info=True)
            return None
        if forecasted_at is None:
            return None
        # A late forecast (made off the cycle, ``late_s`` after the first sighting) counts from its making.
        elapsed = max(now - forecasted_at - float(doc.get("late_s") or 0.0), 0.0)
        out: dict[str, Any] = {"estimator": self.name, "forecasted_at": iso(forecasted_at)}
        for key in PUBLISHED_PHASES:
            value = doc.get(key)
            # Seconds from now: what is left of the wait forecast at first sighting.
            out[key] = None if value is None else round(max(float(value) - elapsed, 0.0), 3)
        # The stall signal has bars of its own (SPEC section 8): its prediction is shown only once it meets them.
        with self._lock:
            if self._stall_holds:
                out["predicted_stall"] = bool(doc.get("predicted_stall", False))
        return out


def _publish_forecast(out: dict[str, Any], forecast: Mapping[str, Any] | None) -> None:
    """Put an approved forecast's completion p50 in ``wait_time``; the ADR wait under ``adr_wait_time``."""
    if forecast is None or forecast.get("completion_p50") is None:
        return
    if "wait_time" in out:
        out["adr_wait_time"] = out["wait_time"]
    out["wait_time"] = int(round(forecast["completion_p50"]))
    out["forecast"] = dict(forecast)


@dataclass(frozen=True)
class AllowancePolicy:
    """The free output allowance from ``ahead_wait``: ``clamp(ceiling - per_second * ahead_wait, floor, ceiling)``.

    The floor applies when no thread is eligible or the wait is unknown.

    Examples
    --------
    >>> policy = AllowancePolicy()
    >>> policy(4, 0.0), policy(4, 100.4), policy(4, 1000.0), policy(0, 0.0), policy(4, None)
    (512, 412, 256, 256, 256)
    """

    ceiling: int = 512
    floor: int = 256
    per_second: float = 1.0

    def __post_init__(self) -> None:
        if not (0 <= self.floor <= self.ceiling):
            raise ValueError("need 0 <= floor <= ceiling")
        if not (self.per_second >= 0 and math.isfinite(self.per_second)):
            raise ValueError("per_second must be a finite number >= 0")

    def __call__(self, eligible_worker_threads: int, ahead_wait: float | None) -> int:
        """The allowance in tokens.

        Parameters
        ----------
        eligible_worker_threads : int
        ahead_wait : float or None
            Seconds of work ahead; None or NaN: unknown.

        Returns
        -------
        int
        """
        if not eligible_worker_threads or ahead_wait is None or math.isnan(ahead_wait):
            return self.floor
        value = self.ceiling - self.per_second * ahead_wait
        return int(round(min(max(value, self.floor), self.ceiling)))


def prospective(
    request: Mapping[str, Any],
    *,
    store: Store | None = None,
    policy: Callable[[int, float | None], int] | None = None,
    max_age: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Eligible workers, threads, ``ahead_wait`` and the allowance of a request not yet created.

    Answers from the prospective state the last cycle published, as if the
    request were queued at ``now``; no database query.

    Parameters
    ----------
    request : mapping
        The would-be request in snapshot request keys (``gentype``, ``models``,
        ``max_length``, ``max_context_length``, ``is_chat``, gates, ``worker_ids``,
        ``extra_priority`` ...); missing keys take the snapshot defaults.
    store : Store, optional
        Default: the environment's (see :func:`status`).
    policy : callable, optional
        ``policy(eligible_worker_threads, ahead_wait) -> tokens``; default
        :class:`AllowancePolicy()`.
    max_age, now : float, optional
        As in :func:`status`.

    Returns
    -------
    dict
        ``eligible_workers``, ``eligible_worker_threads``, ``ahead_wait`` (seconds
        or None), ``allowance`` (tokens), ``stale``, ``cycle_time``, and
        ``queue_position`` (requests ahead) when the state gives it. With no
        current cycle the eligibility fields are left out and the allowance is
        the policy's floor.

    Examples
    --------
    >>> import vecsched
    >>> from vecsched.service.job import run_cycle
    >>> from vecsched.service.store.sql import SQLStore
    >>> snap = vecsched.load_snapshot({
    ...     "format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z",
    ...     "workers": [{"id": "w1", "user_id": "u1", "gentype": "text", "speed": 20,
    ...                  "last_check_in": "2026-11-29T11:59:30Z", "models": ["m"]}],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1,
    ...                   "max_length": 200, "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z", "models": ["m"]}]})
    >>> store = SQLStore("sqlite://")
    >>> run_cycle(lambda now: snap, store, lambda: snap.now).ok
    True
    >>> got = prospective({"gentype": "text", "models": ["m"]}, store=store, now=snap.now)
    >>> got["eligible_workers"], got["ahead_wait"], got["allowance"]
    (1, 10.0, 502)
    """
    store = default_store() if store is None else store
    policy = AllowancePolicy() if policy is None else policy
    now = time.time() if now is None else now
    from vecsched.core.prospective import answer_prospective, prospective_request

    single = prospective_request(request)  # a bad body is refused whether or not a fresh cycle can answer it
    reading, state = _current_state(store)
    if reading is None or state is None:
        return {"unknown": True, "allowance": policy(0, None)}
    _, stale = cycle_age(reading, now, max_age)
    out: dict[str, Any] = {"stale": stale, "cycle_time": iso(reading.time)}
    if stale:
        out["allowance"] = policy(0, None)
        return out
    answer = answer_prospective(state, single, now)
    ahead = answer.get("ahead_wait")
    if ahead is not None and isinstance(ahead, float) and math.isnan(ahead):
        ahead = None
    threads = int(answer["eligible_worker_threads"])
    out.update(
        eligible_workers=int(answer["eligible_workers"]),
        eligible_worker_threads=threads,
        # rounded as the status read rounds it; the allowance reads the exact value
        ahead_wait=None if ahead is None else round(float(ahead), 3),
        allowance=int(policy(threads, ahead)),
    )
    if answer.get("queue_position") is not None:
        out["queue_position"] = int(answer["queue_position"])
    if not out["eligible_workers"]:
        out["reason"] = _why_none(state, request)
    return out


def _why_none(state: Any, request: Mapping[str, Any]) -> str:
    """Why no worker is eligible: no online worker has the model, or one has it but a gate says no."""
    from vecsched.snapshot.schema import GENTYPES

    gentype = request.get("gentype", "text")
    names = [str(m) for m in request.get("models") or ()]
    offered = _online_models(state, GENTYPES.index(gentype) if gentype in GENTYPES else -1)
    if offered is None:
        return "no eligible worker"
    if not offered:
        return f"no {gentype} worker is online"
    if names and not set(names) & offered:
        return f"no online {gentype} worker serves {', '.join(names)}"
    return "no online worker that serves the model passes the request's other gates"


def _online_models(state: Any, gentype: int) -> set[str] | None:
    """Model names served by the state's online workers of ``gentype`` (None: not recorded)."""
    import numpy as np

    workers = getattr(state, "workers", None)
    models = getattr(workers, "models", None)
    names = getattr(state, "model_names", None)
    if models is None or names is None:
        return None
    mask = (np.asarray(workers.gentype) == gentype) & np.asarray(workers.online, dtype=bool)
    owners = np.repeat(np.arange(len(models.offsets) - 1), np.diff(models.offsets))
    return {str(names[c]) for c in np.unique(models.values[mask[owners]]).tolist()}


def _current_state(store: Store) -> tuple[Reading | None, Any]:
    """The current cycle and its parsed prospective state, parsed once per cycle.

    A cache hit costs the store's cheapest read (the pointer alone); only a cycle
    not seen before fetches and parses the state bytes. The cache is keyed by
    cycle id, which names one immutable publication, so a hit is never stale.
    """
    current = store.read_current()
    if current is None:
        return None, None
    with _states_lock:
        state = _states.get(current.cycle_id)
        if state is not None:
            _states.move_to_end(current.cycle_id)
            return current, state
    reading = store.read_prospective()
    if reading is None or not reading.value:
        return reading, None
    with _states_lock:
        state = _states.get(reading.cycle_id)
    if state is None:
        from vecsched.core.prospective import ProspectiveState

        # Parsed outside the lock: readers of the cached cycle are not held up.
        state = _frozen(ProspectiveState.from_bytes(reading.value))
        with _states_lock:
            _states[reading.cycle_id] = state
            while len(_states) > STATE_CACHE_SIZE:
                _states.popitem(last=False)
    return reading, state


def _frozen(state: Any) -> Any:
    """Make the state's arrays read-only: one parsed state serves every thread."""
    import numpy as np

    parts = [state.arrays, vars(state.workers)]
    for part in parts:
        for value in part.values():
            for array in (value, getattr(value, "offsets", None), getattr(value, "values", None)):
                if isinstance(array, np.ndarray):
                    array.flags.writeable = False
    return state


def clear_state_cache() -> None:
    """Forget every parsed prospective state (tests; memory after a store switch).

    Examples
    --------
    >>> clear_state_cache()
    """
    with _states_lock:
        _states.clear()
