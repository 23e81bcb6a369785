"""The job's part of the forecast loop: record first sightings, derive outcomes, keep verdicts.

Each cycle :class:`ForecastTracker` (held by the job across cycles):

1. records every registered estimator's forecast for the requests it sees
   waiting for the first time (first write wins in the store, so a second job
   process or a restart never replaces an earlier forecast); one the store
   failed to take is written at a later cycle as a late forecast of that
   first sighting;
2. derives outcomes from what the database shows for the requests it tracks:
   a first job of the request = start (at the job's start time, never before
   the first sighting of a request then jobless); every job finished =
   completion; past expiry (the row's own, which the horde moves on as it
   hands out jobs; the record is kept past it) with none started = expiry;
   ``active`` false, or the row gone before expiry with no finished job =
   cancellation;
3. once an hour, trims the pairs to the window and stores a verdict
   (:mod:`vecsched.service.promotion`).

With a :class:`~vecsched.service.replay_lane.ReplayLane` (``vecsched run
--replay-every``) the lane's estimators are left out of the cycle's estimate:
step 1 puts the new requests on the lane's owed list instead, and the cycle
offers itself to the lane, which records their forecasts later, off the cycle.

Everything works on whole columns; the only per-request Python is the JSON of
first sightings and events.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from vecsched.core.forecasts import baseline_forecasts
from vecsched.core.pairing import GRACE_SECONDS, ForecastRecorder
from vecsched.service.forecast_metrics import observe_pairs
from vecsched.snapshot.schema import GENTYPES, JOB_FINISHED, JOB_PROCESSING

log = logging.getLogger("vecsched.forecasts")

VERDICT_EVERY_SECONDS = 3600.0


def recorder_for(store: Any) -> ForecastRecorder:
    """A :class:`ForecastRecorder` on the same Redis (same prefix) or database as ``store``.

    Examples
    --------
    >>> from vecsched.service.store.sql import SQLStore
    >>> type(recorder_for(SQLStore("sqlite://")).backend).__name__
    'SQLPairs'
    """
    if hasattr(store, "client") and hasattr(store, "prefix"):
        from vecsched.service.forecasts_store import RedisPairs

        return ForecastRecorder(RedisPairs(store.client, prefix=store.prefix), observe=observe_pairs)
    from vecsched.service.forecasts_sql import SQLPairs

    return ForecastRecorder(SQLPairs(store.engine), observe=observe_pairs)


class ForecastTracker:
    """Forecasts at first sighting and outcomes between cycles (see the module docstring).

    Parameters
    ----------
    recorder : ForecastRecorder
    verdict_every : float
        Seconds between stored verdicts.
    lane : ReplayLane, optional
        Runs its estimators off the cycle (see the module docstring); None:
        every estimator runs in the cycle's estimate.
    """

    def __init__(self, recorder: ForecastRecorder, *, verdict_every: float = VERDICT_EVERY_SECONDS,
                 lane: Any = None):
        self.recorder = recorder
        self.lane = lane
        self.verdict_every = verdict_every
        self.last_verdict = -np.inf
        # Requests forecast by this process and not yet resolved: their expiry as last seen (the horde moves it
        # on at each job handed out), whether a job has started, when they were first seen, and whether they
        # had no job then.
        self.tracked = pd.DataFrame({"expiry": pd.Series(dtype=float), "started": pd.Series(dtype=bool),
                                     "seen": pd.Series(dtype=float), "jobless": pd.Series(dtype=bool)})
        # Requests seen waiting whose forecasts could not be written yet (the store failed), by first sighting:
        # written later, they are late forecasts of that sighting, never on-time ones of a later one.
        self.unrecorded = pd.Series(dtype=float)
        self._calibration: Any = None
        self._resumed = False

    def _resume(self, now: float) -> None:
        """Track again the requests the store still holds open (once, before this process's first cycle).

        Tracking lives in memory: after a restart the requests in flight, and those that expired or
        were cancelled meanwhile, got no outcome at all, which biased every series at each deploy
        (and lost the stalls, the rarest pairs). A store that cannot be read leaves tracking empty,
        as before; its failure is logged, never raised into the cycle.
        """
        if self._resumed:
            return
        self._resumed = True
        from vecsched.core.pairing import awaiting_outcomes

        try:
            records = awaiting_outcomes(self.recorder.backend.open_records(now))
        except Exception as exc:  # noqa: BLE001 - the cycle goes on without the resumed requests
            log.warning("could not resume tracking the forecast records (%s): their outcomes are lost",
                        type(exc).__name__)
            return
        open_ = {rid: r for rid, r in records.items() if r[1] + self.recorder.grace >= now}
        if not open_:
            return
        seen, expiry, started = (np.array(v) for v in zip(*open_.values()))
        resumed = pd.DataFrame({"expiry": expiry.astype(float), "started": started.astype(bool),
                                "seen": seen.astype(float), "jobless": ~started.astype(bool)},
                               index=pd.Index(list(open_), dtype=object))
        self.tracked = pd.concat([self.tracked[~self.tracked.index.isin(resumed.index)], resumed])
        log.info("resumed tracking %d forecast records still owed an outcome", len(resumed))

    def wrap(self, estimate: Any = None) -> Any:
        """``estimate`` (default :func:`vecsched.estimate`) asked for forecasts only of the requests
        this tracker has not recorded, when it takes ``forecast_skip``; else ``estimate`` itself.
        With a lane, the lane's estimators are deferred (``defer``) to it."""
        import inspect

        from vecsched.core.estimate import estimate as core_estimate

        base = core_estimate if estimate is None else estimate
        try:
            parameters = inspect.signature(base).parameters
        except (TypeError, ValueError):
            parameters = {}
        if "forecast_skip" not in parameters:
            return base
        # An estimate that cannot defer runs every estimator itself; the lane is then never offered inputs.
        takes_defer = "defer" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())

        from vecsched.core.forecasts import ESTIMATORS
        from vecsched.core.replay import NAME as REPLAY
        from vecsched.service.replay_calibration import ReplayCalibration

        # One calibration for the tracker's life (the job wraps its estimate every cycle): its cache of the
        # window's pairs then lasts its refresh, instead of a read of every pair each cycle.
        if self._calibration is None:
            self._calibration = ReplayCalibration(self.recorder.backend, window=self.recorder.window)
        calibration = self._calibration

        deferred = {"defer": self.lane.names} if self.lane is not None and takes_defer else {}

        def skipping(snapshot: Any) -> Any:
            self._resume(float(snapshot.now))
            # Deferred, the replay reads its calibration in the lane, and without the replay nothing reads
            # it: the cycle spares the read.
            needed = not deferred and REPLAY in ESTIMATORS
            handed = calibration.get(now=float(snapshot.now)) if needed else None
            return base(snapshot, forecast_skip=self.tracked.index.to_numpy(dtype=object),
                        calibration=handed, **deferred)

        return skipping

    def observe(self, snapshot: Any, estimates: Any, now: float) -> dict[str, int]:
        """Run steps 1 to 3 for one cycle; return how many forecasts and outcomes were recorded."""
        self._resume(now)
        recorded = self._record_new(snapshot, estimates, now)
        if self.lane is not None:
            self.lane.offer(snapshot, estimates, now)  # hands it over; the replay runs in the lane's thread
        outcomes = self._derive_outcomes(snapshot, now)
        if now - self.last_verdict >= self.verdict_every:
            from vecsched.core.promotion import store_verdict

            self.recorder.backend.trim(now - self.recorder.window, now=now)
            store_verdict(self.recorder.backend, now=now, window=self.recorder.window)
            self.last_verdict = now
        return {"forecasts": recorded, "outcomes": outcomes}

    def _record_new(self, snapshot: Any, estimates: Any, now: float) -> int:
        ids = pd.Index(estimates.request_id)
        self.unrecorded = self.unrecorded[self.unrecorded.index.isin(ids)]  # still waiting, still owed
        new = np.flatnonzero(~ids.isin(self.tracked.index))
        if len(new) == 0 or not estimates.forecasts:
            return 0
        expiry = snapshot.requests.expiry[estimates.request_index[new]]
        gentype = np.asarray(GENTYPES, dtype=object)[estimates.columns["gentype"][new].astype(np.int64)]
        seen = self.unrecorded.reindex(ids[new]).fillna(now).to_numpy(dtype=float)
        named = {**estimates.forecasts, **baseline_forecasts(estimates)}
        rows = []
        for k, rid, g, e in zip(new.tolist(), ids[new].tolist(), gentype.tolist(), expiry.tolist()):
            rows.append((rid, g, e, {name: f.row(k) for name, f in named.items()}))
        try:
            self.recorder.record_forecasts(rows, now=now, first_seen=seen.tolist() if (seen < now).any() else None)
        except Exception:
            owed = pd.Series(seen, index=ids[new])
            self.unrecorded = pd.concat([self.unrecorded, owed[~owed.index.isin(self.unrecorded.index)]])
            raise
        self.unrecorded = self.unrecorded[~self.unrecorded.index.isin(ids[new])]
        if self.lane is not None and estimates.deferred is not None:  # else the replay ran in this estimate
            self.lane.owe(ids[new].tolist(), gentype.tolist(), expiry, now, first_seen=seen)
        jobless = ~ids[new].isin(snapshot.jobs.request_id)
        added = pd.DataFrame({"expiry": expiry, "started": np.zeros(len(new), dtype=bool), "seen": seen,
                              "jobless": jobless}, index=ids[new])
        self.tracked = pd.concat([self.tracked, added]) if len(self.tracked) else added
        return len(new)

    def _derive_outcomes(self, snapshot: Any, now: float) -> int:
        t = self.tracked
        if len(t) == 0:
            return 0
        state = _request_state(snapshot, t.index)
        # A row the loader rejected this cycle is unknown, not gone: judged again when it loads.
        unknown = t.index.isin([e.id for e in snapshot.rejected if e.table == "requests"])
        # The horde moves a request's expiry on as it hands out jobs: judge by the row's own, while it has one.
        expiry = np.where(state["present"], state["expiry"], t["expiry"].to_numpy())
        moved = expiry > t["expiry"].to_numpy()
        if moved.any():
            self.recorder.extend(zip(t.index[moved].tolist(), expiry[moved].tolist()))
        events: list[tuple[str, str, float, float | None]] = []

        newly_started = ~t["started"].to_numpy() & state["has_job"]
        # A job of a request that had none when first seen started after that sighting, whatever the
        # horde's clock says (the job's start is the database's time, the sighting the job's).
        first_start = np.where(t["jobless"].to_numpy(), np.maximum(state["first_start"], t["seen"].to_numpy()),
                               state["first_start"])
        events += _rows(t.index[newly_started], "started_at", first_start[newly_started], expiry[newly_started])
        started = t["started"].to_numpy() | state["has_job"]
        gone_or_off = ~state["present"] | ~state["active"]
        done = state["present"] & (state["n"] == 0) & state["all_finished"]
        done |= ~state["present"] & state["any_finished"] & (state["processing"] == 0)
        # Inactive with every generation handed out and none processing: finished, as the status
        # route reads it, even where the horde no longer keeps the finished jobs' rows.
        done |= state["ended"] & (state["n"] == 0) & (state["total"] > 0) & (state["processing"] == 0)
        done &= ~unknown
        expired = ~started & (now >= expiry) & ~done & ~unknown
        cancelled = gone_or_off & ~done & ~expired & ~state["any_finished"] & ~unknown
        events += _rows(t.index[done], "completed_at", np.full(int(done.sum()), now), expiry[done])
        events += _rows(t.index[expired], "expired_without_start", expiry[expired], expiry[expired])
        events += _rows(t.index[cancelled], "cancelled_at", np.full(int(cancelled.sum()), now), expiry[cancelled])
        if events:
            self.recorder.record_outcomes(events)
        # Resolved, or long past expiry (nothing more will be observed): stop tracking.
        finished = done | expired | cancelled | (now > expiry + GRACE_SECONDS)
        self.tracked = t[~finished].assign(expiry=expiry[~finished], started=started[~finished])
        return len(events)


def _rows(ids: pd.Index, field: str, at: np.ndarray, expiry: np.ndarray) -> list[tuple[str, str, float, float]]:
    return list(zip(ids.tolist(), [field] * len(ids), np.asarray(at, dtype=float).tolist(),
                    np.asarray(expiry, dtype=float).tolist()))


def _request_state(snapshot: Any, ids: pd.Index) -> dict[str, np.ndarray]:
    """Per tracked request: row present, active, expiry, n, and its jobs (any, first start, processing, finished)."""
    r = snapshot.requests
    at = pd.Index(r.id).get_indexer(ids) if len(r) else np.full(len(ids), -1)
    present = at >= 0
    safe = np.maximum(at, 0)
    active = np.where(present, r.active[safe] if len(r) else False, False).astype(bool)
    faulted = np.where(present, r.faulted[safe] if len(r) else False, False).astype(bool)
    expiry = np.where(present, r.expiry[safe] if len(r) else np.nan, np.nan)
    n = np.where(present, r.n[safe] if len(r) else 0, 0)
    total = np.where(present, r.jobs[safe] if len(r) else 0, 0)
    jobs = snapshot.jobs
    k = ids.get_indexer(jobs.request_id) if len(jobs) else np.zeros(0, np.int64)
    mine = k >= 0
    k, state, started = k[mine], jobs.state[mine], jobs.started[mine]
    count = np.bincount(k, minlength=len(ids))
    first = np.full(len(ids), np.inf)
    np.minimum.at(first, k, started)
    processing = np.bincount(k[state == JOB_PROCESSING], minlength=len(ids))
    finished = np.bincount(k[state == JOB_FINISHED], minlength=len(ids))
    return {
        "present": present,
        "active": active,
        "ended": present & ~active & ~faulted,
        "total": total,
        "expiry": expiry,
        "n": n,
        "has_job": count > 0,
        "first_start": first,
        "processing": processing,
        "any_finished": finished > 0,
        "all_finished": (finished >= np.maximum(total, 1)) & (processing == 0),
    }
