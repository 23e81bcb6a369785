"""The periodic job: load the horde, estimate, publish; one log line per cycle.

The cycle takes its I/O as arguments (a loader, a store and a clock), so it
can be run against SQLite, PostgreSQL, Redis or hand-built fakes alike, and
the estimator in between stays pure.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from vecsched.core.estimate import estimate as estimate_snapshot
from vecsched.core.prospective import build_prospective_state
from vecsched.core.stall_cache import REFRESH_SECONDS
from vecsched.service.stall_refresh import StallRefresh
from vecsched.snapshot.schema import RowError
from vecsched.service.store.base import Cycle, Store
from vecsched.service.payload import encode_payloads
from vecsched.service.redact import mask_text
from vecsched.snapshot.snapshot import Snapshot

log = logging.getLogger("vecsched.job")

DEFAULT_INTERVAL = 5.0


@dataclass
class CycleReport:
    """What one cycle did: stage times (seconds), counts, rejected rows, and the error if it failed.

    ``superseded``: the cycle was written but a newer one was already current,
    so nothing it computed was published (``published`` is 0; still ok).

    Examples
    --------
    >>> CycleReport(0.0, ok=True, published=3).line()[:9]
    'cycle ok '
    """

    cycle_time: float
    ok: bool = False
    load: float = 0.0
    estimate: float = 0.0
    publish: float = 0.0
    workers: int = 0
    requests: int = 0
    jobs: int = 0
    published: int = 0
    superseded: bool = False
    rejected: list[RowError] = field(default_factory=list)
    error: str | None = None

    def line(self) -> str:
        """The one log line of the cycle.

        Returns
        -------
        str

        Examples
        --------
        >>> CycleReport(0.0, ok=True, superseded=True).line().split()[:2]
        ['cycle', 'ok']
        >>> "superseded" in CycleReport(0.0, ok=True, superseded=True).line()
        True
        """
        head = (
            f"cycle {'ok' if self.ok else 'FAILED'} load={self.load:.3f}s "
            f"estimate={self.estimate:.3f}s publish={self.publish:.3f}s "
            f"workers={self.workers} requests={self.requests} jobs={self.jobs} "
            f"published={self.published} rejected={len(self.rejected)}"
        )
        if self.superseded:
            # not an error: another job process already published a newer cycle
            head += " superseded"
        if self.rejected:
            # Counts per table.field only: ids never reach a log line at INFO
            # (`vecsched db check` lists every rejected row).
            head += f" rejected_by_field=[{rejected_counts(self.rejected)}]"
        if self.error:
            # One line: a driver's message may run on with hints and links.
            head += f" error={mask_text(self.error.splitlines()[0] if self.error.strip() else self.error)}"
        return head


def rejected_counts(rejected: list[RowError]) -> str:
    """``table.field=count`` for each field that rejected rows, most first.

    Parameters
    ----------
    rejected : list of RowError

    Returns
    -------
    str
        Comma-separated counts; empty when nothing was rejected. No ids: it
        goes into the INFO line of the cycle.

    Examples
    --------
    >>> from vecsched.snapshot.schema import RowError
    >>> rejected_counts([RowError("requests", 3, "r", "n", "x"), RowError("requests", 9, "s", "n", "x"),
    ...                  RowError("workers", 0, "w", "threads", "x")])
    'requests.n=2,workers.threads=1'
    """
    from collections import Counter

    counts = Counter(f"{e.table}.{e.field}" for e in rejected)
    return ",".join(f"{key}={count}" for key, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


class SQLLoader:
    """``loader(now) -> Snapshot`` over a horde database (engine or URL).

    Examples
    --------
    >>> from vecsched.service import sql as _sql
    >>> engine = _sql.make_engine("sqlite://")
    >>> _sql.metadata.create_all(engine)
    >>> len(SQLLoader(engine)(1.7e9).requests)
    0
    """

    def __init__(self, engine: Any):
        from vecsched.service.sql import make_engine

        self.engine = make_engine(engine) if isinstance(engine, str) else engine

    def __call__(self, now: float) -> Snapshot:
        """The horde as of ``now``.

        Parameters
        ----------
        now : float
            Epoch seconds, the snapshot's clock.

        Returns
        -------
        Snapshot
        """
        from vecsched.service.sql import load_horde

        snapshot = load_horde(self.engine, now)
        self._prune(now)
        return snapshot

    PRUNE_EVERY = 60.0
    _pruned_at = float("-inf")

    def _prune(self, now: float) -> None:
        """Keep the event tables bounded: drop rows no cycle can need, once a minute.

        Pruning is housekeeping: its failure is logged and never fails the cycle.
        """
        if now - self._pruned_at < self.PRUNE_EVERY:
            return
        from vecsched.service.sql.events import prune_events

        try:
            prune_events(self.engine, now)
            self._pruned_at = now
        except Exception as exc:  # noqa: BLE001 - the next cycle tries again
            log.warning("pruning the event tables failed: %s", type(exc).__name__)


def run_cycle(
    load: Callable[[float], Snapshot],
    store: Store,
    clock: Callable[[], float] = time.time,
    *,
    interval: float = DEFAULT_INTERVAL,
    estimate: Callable[[Snapshot], Any] | None = None,
    observe: Callable[[CycleReport, Any, Any], None] | None = None,
    forecasts: Any = None,
    stall: Any = None,
) -> CycleReport:
    """Run one cycle: ``load(now)``, estimate, publish to ``store``; never raises.

    A failure at any stage publishes nothing (the store's pointer is switched
    only after the whole cycle is written) and is reported in the returned
    :class:`CycleReport` and the log line.

    Parameters
    ----------
    load : callable
        ``load(now) -> Snapshot``, e.g. :class:`SQLLoader`.
    store : Store
        :class:`~vecsched.service.store.redis.RedisStore` or :class:`~vecsched.service.store.sql.SQLStore`.
    clock : callable
        Epoch seconds; the cycle time, stamped on every published figure.
    interval : float
        The refresh interval, published so readers can tell stale figures.
    estimate : callable, optional
        ``estimate(snapshot) -> Estimates``; default :func:`vecsched.estimate`.
    observe : callable, optional
        ``observe(report, snapshot, estimates)`` after the cycle (metrics);
        its failure is logged and changes nothing.
    forecasts : ForecastTracker, optional
        Records first sightings' forecasts and derived outcomes after the
        publication (:mod:`vecsched.service.forecast_job`); its failure is
        logged and never fails the cycle.
    stall : StallRefresh, optional
        Hands the last cycle's section 7 sums to this cycle's estimate, and
        keeps this one's (:mod:`vecsched.service.stall_refresh`); without it,
        every cycle computes every request's.

    Returns
    -------
    CycleReport

    Examples
    --------
    >>> from vecsched.service.store.sql import SQLStore
    >>> def broken(now):
    ...     raise ConnectionError("database down")
    >>> report = run_cycle(broken, SQLStore("sqlite://"), lambda: 0.0)
    >>> report.ok, report.error
    (False, 'ConnectionError: database down')
    """
    if stall is not None:
        estimate = stall.wrap(estimate)  # section 7's sums of a request once a minute of its age
    if forecasts is not None:
        estimate = forecasts.wrap(estimate)  # forecasts only for requests not yet recorded
    estimate = estimate_snapshot if estimate is None else estimate
    now = float(clock())
    report = CycleReport(cycle_time=now)
    snapshot = estimates = None
    stage = "load"
    began = t0 = time.perf_counter()  # the current stage's start: a failed stage's time is reported too
    try:
        snapshot = load(now)
        t1 = time.perf_counter()
        report.load = t1 - t0
        report.workers, report.requests, report.jobs = (
            len(snapshot.workers), len(snapshot.requests), len(snapshot.jobs))
        report.rejected = list(snapshot.rejected)
        for error in report.rejected:
            log.debug("rejected %s", error)  # ids: DEBUG only
        stage, began = "estimate", t1
        estimates = estimate(snapshot)
        state = build_prospective_state(snapshot, estimates)
        ids, payloads = encode_payloads(estimates, now, snapshot.requests)
        ended_ids, ended_payloads = ended_requests(snapshot)
        t2 = time.perf_counter()
        report.estimate = t2 - t1
        stage, began = "publish", t2
        cycle = Cycle(now, float(interval), ids + ended_ids, payloads + ended_payloads,
                      _jsonable(estimates.horde), state)
        switched = store.publish(cycle)
        report.publish = time.perf_counter() - t2
        # False: a newer cycle is current, so none of these figures reach a reader.
        report.superseded = not switched
        report.published = len(ids) if switched else 0
        report.ok = True
        if forecasts is not None:
            _observe_forecasts(forecasts, snapshot, estimates, now)
    except Exception as exc:  # noqa: BLE001 - a cycle must never take the job down
        setattr(report, stage, time.perf_counter() - began)  # the failed stage's time, up to the failure
        report.error = f"{type(exc).__name__}: {exc}"
        log.debug("cycle failed in %s", stage, exc_info=True)
    (log.info if report.ok else log.warning)(report.line())
    if report.superseded:
        log.warning("a newer cycle is current, so this one was not published: another job publishes to the same "
                    "store, or this machine's clock went back (nothing publishes until it passes that cycle's time)")
    if report.ok:
        _warn_if_empty(estimates, report)
    if observe is not None:
        try:
            observe(report, snapshot, estimates)
        except Exception:  # noqa: BLE001 - metrics never fail a cycle
            log.debug("observing the cycle failed", exc_info=True)
    return report


def _observe_forecasts(tracker: Any, snapshot: Snapshot, estimates: Any, now: float) -> None:
    try:
        tracker.observe(snapshot, estimates, now)
    except Exception as exc:  # noqa: BLE001 - shadow forecasts never fail a cycle
        log.warning("forecast recording failed: %s", type(exc).__name__)
        log.debug("forecast recording failed", exc_info=True)


def _warn_if_empty(estimates: Any, report: CycleReport) -> None:
    """Say so when the figures cannot mean much: no worker online, or nothing waiting."""
    online = sum(int(totals.get("online_workers") or 0) for totals in estimates.horde.values()
                 if isinstance(totals, dict))
    if report.workers and not online:
        log.warning("no worker is online (none checked in within 300 s): every wait is unknown; "
                    "is the horde database still being updated?")
    elif not report.workers:
        log.warning("the horde has no worker at all: every wait is unknown")
    if not len(estimates.request_id):
        log.warning("no request is waiting: there is nothing to estimate")


ENDED_PAYLOADS = {"faulted": '{"ended":"faulted"}', "done": '{"ended":"done"}'}
"""What a request that left the queue is published as, beside the waiting ones' figures."""


def ended_requests(snapshot: Snapshot) -> tuple[list[str], list[str]]:
    """Ids and payloads of the requests the horde still holds but that wait no more.

    A faulted request reads as faulted and an inactive one as done, instead of
    unknown, for as long as the horde keeps its row.

    Parameters
    ----------
    snapshot : Snapshot

    Returns
    -------
    (list of str, list of str)
        Request ids and their :data:`ENDED_PAYLOADS`.

    Examples
    --------
    >>> from vecsched import synthetic
    >>> ids, payloads = ended_requests(synthetic.horde(workers=5, requests=400, seed=1))
    >>> len(ids) > 0 and set(payloads) <= set(ENDED_PAYLOADS.values())
    True
    """
    import numpy as np

    r = snapshot.requests
    faulted = np.asarray(r.faulted, dtype=bool)
    done = ~np.asarray(r.active, dtype=bool) & ~faulted
    ids: list[str] = []
    payloads: list[str] = []
    for kind, mask in (("faulted", faulted), ("done", done)):
        chosen = r.id[mask].tolist()
        ids += chosen
        payloads += [ENDED_PAYLOADS[kind]] * len(chosen)
    return ids, payloads


def _jsonable(value: Any) -> Any:
    """Horde totals as plain JSON values (NumPy scalars out, NaN as null)."""
    import math

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def how_to_read(published: int) -> str:
    """The line that tells where the figures are, logged after the first good cycle.

    Parameters
    ----------
    published : int
        Requests the cycle published.

    Returns
    -------
    str

    Examples
    --------
    >>> how_to_read(3)
    'published 3 requests; list them with vecsched top, read one with vecsched status ID'
    """
    return f"published {published} requests; list them with vecsched top, read one with vecsched status ID"


class _CycleWithHint:
    """``run_cycle`` as the scheduler calls it, telling how to read the figures after the first good cycle."""

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.told = False

    def __call__(self, load: Callable[[float], Snapshot], store: Store, clock: Callable[[], float]) -> CycleReport:
        report = run_cycle(load, store, clock, **self.kwargs)
        if report.ok and not self.told:
            self.told = True
            log.info("%s", how_to_read(report.published))
        return report


def run_service(
    load: Callable[[float], Snapshot],
    store: Store,
    *,
    interval: float = DEFAULT_INTERVAL,
    clock: Callable[[], float] = time.time,
    stop: threading.Event | None = None,
    install_signals: bool = True,
    estimate: Callable[[Snapshot], Any] | None = None,
    observe: Callable[[CycleReport, Any, Any], None] | None = None,
    replay_every: float | None = None,
    stall_refresh: float = REFRESH_SECONDS,
) -> None:
    """Run cycles every ``interval`` seconds until SIGINT/SIGTERM (or ``stop`` is set).

    APScheduler runs the cycle: never two at once (``max_instances=1``), missed
    runs coalesced into one, the first run at once. A failed cycle is logged
    and the next one retries; the scheduler itself keeps going.

    Parameters
    ----------
    load : callable
        ``load(now) -> Snapshot``, e.g. :class:`SQLLoader`.
    store : Store
        Where cycles are published.
    interval : float
        Seconds between cycle starts.
    clock : callable
        Epoch seconds; the cycle time.
    stop : threading.Event, optional
        Set it to stop the service (besides the signals).
    install_signals : bool
        Whether SIGINT/SIGTERM stop the service (main thread only).
    estimate : callable, optional
        ``estimate(snapshot) -> Estimates``; default :func:`vecsched.estimate`.
    replay_every : float, optional
        Run ``dispatch-replay-v1`` (when registered) off the cycle, in a
        :class:`~vecsched.service.replay_lane.ReplayLane` thread, at most once
        per this many seconds; None (default): inside every cycle's estimate.
    stall_refresh : float, default 60
        Seconds of a request's age between two computations of its
        might_stall sums (:mod:`vecsched.core.stall_cache`); 0: every cycle.

    Examples
    --------
    >>> from vecsched.service.store.sql import SQLStore
    >>> stop = threading.Event()
    >>> stop.set()  # stops at its first check, after the first cycle started
    >>> def nothing(now):
    ...     raise ConnectionError("no horde here")
    >>> run_service(nothing, SQLStore("sqlite://"), stop=stop, install_signals=False)
    """
    from apscheduler.schedulers.background import BackgroundScheduler

    stop = threading.Event() if stop is None else stop
    tracker = forecast_tracker(store, replay_every=replay_every)
    if tracker.lane is not None:
        tracker.lane.start()
    scheduler = BackgroundScheduler(timezone="UTC")
    scheduler.add_job(
        _CycleWithHint(interval=interval, estimate=estimate, observe=observe, forecasts=tracker,
                       stall=StallRefresh(stall_refresh)),
        "interval",
        seconds=interval,
        args=(load, store, clock),
        id="vecsched-cycle",
        max_instances=1,
        coalesce=True,
        misfire_grace_time=None,
        next_run_time=_utcnow(),
    )
    previous = {}
    if install_signals and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: _on_signal(stop))
    scheduler.start()
    log.info("vecsched job started: interval %.3gs", interval)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        # Let a running cycle finish: it either switches its pointer or not,
        # so stopping never leaves a half-published cycle visible.
        scheduler.shutdown(wait=True)
        if tracker.lane is not None:
            tracker.lane.stop()  # a replay running finishes and records first
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.info("vecsched job stopped")


def _on_signal(stop: threading.Event) -> None:
    """The first SIGINT/SIGTERM stops the job after its running cycle; a second one exits at once.

    A cycle stuck on a silent database would otherwise hold the stop for as long as it hangs. Leaving
    then publishes nothing half-done: a cycle's figures are switched in at once, or not at all.
    """
    if not stop.is_set():
        stop.set()
        return
    log.warning("vecsched job: second stop signal, exiting without waiting for the running cycle")
    logging.shutdown()
    os._exit(1)


def forecast_tracker(store: Store, *, replay_every: float | None = None) -> Any:
    """The :class:`~vecsched.service.forecast_job.ForecastTracker` recording into ``store``'s Redis or database.

    Parameters
    ----------
    store : Store
        The publication store; forecasts go to the same Redis (prefix) or database.
    replay_every : float, optional
        Seconds between replays off the cycle (a :class:`~vecsched.service.replay_lane.ReplayLane`,
        not started); None: no lane, the replay (when registered) runs inside every cycle.

    Returns
    -------
    ForecastTracker

    Examples
    --------
    >>> from vecsched.service.store.sql import SQLStore
    >>> type(forecast_tracker(SQLStore("sqlite://"))).__name__
    'ForecastTracker'
    >>> forecast_tracker(SQLStore("sqlite://"), replay_every=60.0).lane.every
    60.0
    """
    from vecsched.service.forecast_job import ForecastTracker, recorder_for

    recorder = recorder_for(store)
    if replay_every is None:
        return ForecastTracker(recorder)
    from vecsched.core.replay import NAME
    from vecsched.service.replay_calibration import ReplayCalibration
    from vecsched.service.replay_lane import ReplayLane

    lane = ReplayLane(recorder, (NAME,), replay_every, ReplayCalibration(recorder.backend, window=recorder.window))
    return ForecastTracker(recorder, lane=lane)


def _utcnow() -> Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)
