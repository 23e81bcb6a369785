"""Deferred estimators (``dispatch-replay-v1``) run off the main cycle, at a slower cadence.

With ``vecsched run --replay --replay-every SECONDS`` the cycle's estimate
leaves the replay out (``estimate(..., defer=...)``) and keeps the forecasts
stage's inputs instead; after the publication the cycle *offers* them to the
:class:`ReplayLane`, which takes at most one cycle per ``every`` seconds of
cycle time and runs the replay on it in its own thread. The cycle only hands
over a reference and sets an event: its publication never waits for a replay.
A replay still running when the next one is due leaves the latest offer
waiting (older ones are dropped), so the lane never falls behind by more than
one cycle.

A request first seen between replays keeps its true first sighting: the
cycle that first sees it waiting puts it on the lane's *owed* list with its
time, and the next replay records the forecast with that time as
``forecasted_at`` and ``late_s`` = the replay's snapshot time minus it
(:meth:`~vecsched.core.pairing.ForecastRecorder.record_forecasts`). A request
owed that no longer waits in the replay's snapshot (dispatched, expired or
gone in between) gets a *missed* forecast: every p50 and p90 null, no stall
predicted, so the promotion tables count it as a miss, not as a request the
replay was spared. The cadence and the lateness: docs/replay.md, "Off-cycle
cadence and late forecasts".
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

import numpy as np
import pandas as pd

from vecsched.core.forecasts import ESTIMATORS, owed_forecast_rows
from vecsched.core.pairing import ForecastRecorder

log = logging.getLogger("vecsched.forecasts")


class ReplayLane:
    """Deferred estimators on the latest cycle, at most once per ``every`` seconds (see the module docstring).

    Parameters
    ----------
    recorder : ForecastRecorder
        Where the late forecasts go (the main cycle's recorder).
    names : sequence of str
        The deferred estimators (registered in :data:`~vecsched.core.forecasts.ESTIMATORS`).
    every : float
        Seconds of cycle time between replays (0: every cycle, still off the cycle).
    calibration : object, optional
        ``get(now=...) -> {name: calibration}``, e.g.
        :class:`~vecsched.service.replay_calibration.ReplayCalibration`.

    Examples
    --------
    >>> from vecsched.core.pairing import MemoryPairs
    >>> lane = ReplayLane(ForecastRecorder(MemoryPairs()), ("dispatch-replay-v1",), every=60.0)
    >>> lane.due(0.0), lane.run_pending()
    (True, 0)
    """

    def __init__(self, recorder: ForecastRecorder, names: Sequence[str], every: float, calibration: Any = None):
        self.recorder = recorder
        self.names = tuple(names)
        self.every = float(every)
        self.calibration = calibration
        self.replays = 0  # replays run (the tests read it)
        self._lock = threading.Lock()
        self._owed = pd.DataFrame({"first_seen": pd.Series(dtype=float), "gentype": pd.Series(dtype=object),
                                   "expiry": pd.Series(dtype=float)})
        self._offer: tuple[Any, Any, float] | None = None
        self._taken_at = -np.inf  # cycle time of the last offer taken
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def owe(self, ids: Sequence[str], gentype: Sequence[str], expiry: np.ndarray, now: float,
            first_seen: Any = None) -> None:
        """Requests recorded by the cycle at ``now``: each is owed one forecast of every deferred name.

        ``first_seen``: each request's first sighting (seconds, one or one per id; default ``now``).
        It is earlier than ``now`` for a request whose record an earlier cycle failed to write: its
        replay forecast is then late from that sighting, like every other estimator's.

        Requests owed past their expiry and the recorder's grace are let go: their record is gone from
        the store, so no forecast of them could be written (this bounds the list when replays fail).
        """
        seen = np.broadcast_to(np.asarray(now if first_seen is None else first_seen, dtype=float), (len(ids),))
        added = pd.DataFrame({"first_seen": seen.copy(), "gentype": list(gentype),
                              "expiry": np.asarray(expiry, dtype=float)}, index=pd.Index(ids, dtype=object))
        with self._lock:
            owed = self._owed[self._owed["expiry"].to_numpy() + self.recorder.grace >= now]
            added = added[~added.index.isin(owed.index)]
            self._owed = pd.concat([owed, added]) if len(owed) else added

    def owed(self) -> pd.DataFrame:
        """The requests still owed a forecast: first sighting, gentype and expiry by request id."""
        with self._lock:
            return self._owed.copy()

    def due(self, now: float) -> bool:
        """Whether a cycle at ``now`` would be taken (``every`` seconds after the last one taken)."""
        return now - self._taken_at >= self.every

    def offer(self, snapshot: Any, estimates: Any, now: float) -> bool:
        """The cycle at ``now`` after its publication: taken (True) when due, for the lane to replay.

        Never runs the replay itself; a taken offer replaces one not yet replayed.
        """
        if estimates.deferred is None:
            return False
        with self._lock:
            if not self.due(now):
                return False
            self._offer, self._taken_at = (snapshot, estimates, float(now)), float(now)
        self._wake.set()
        return True

    def run_pending(self) -> int:
        """Replay the offer taken, if any, and record what it owes; return how many forecasts were recorded."""
        with self._lock:
            offer, self._offer = self._offer, None
        if offer is None:
            return 0
        snapshot, estimates, now = offer
        calibration = self.calibration.get(now=now) if self.calibration is not None else {}
        forecasts = {name: ESTIMATORS[name].compute(snapshot, estimates.deferred, calibration.get(name))
                     for name in self.names if name in ESTIMATORS}
        self.replays += 1
        return self._record(estimates, forecasts, now)

    def _record(self, estimates: Any, forecasts: dict[str, Any], now: float) -> int:
        with self._lock:
            # Owed by cycles up to this one: a later cycle's sightings wait for a later replay.
            owed = self._owed[self._owed["first_seen"].to_numpy() <= now]
        if len(owed) and not forecasts:  # no deferred name is registered: nothing will ever be recorded
            with self._lock:
                self._owed = self._owed.drop(owed.index)
        if len(owed) == 0 or not forecasts:
            return 0
        rows = owed_forecast_rows(owed.index.tolist(), owed["gentype"].tolist(), owed["expiry"].tolist(),
                                  estimates.request_id, forecasts)
        self.recorder.record_forecasts(rows, now=now, first_seen=owed["first_seen"].to_numpy())
        with self._lock:
            self._owed = self._owed.drop(owed.index)
        return len(rows)

    def start(self) -> None:
        """Run taken offers in a thread of the lane's own until :meth:`stop`."""
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="vecsched-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Let a running replay and the offer taken after it finish (their forecasts are recorded), then end.

        Requests still owed are then recorded as missed: no replay of this process will reach them, and
        a restarted job would otherwise forecast them from a later first sighting, which could only
        flatter the replay (the simulator's scoring ends a run the same way).
        """
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self._record_missed()
        except Exception as exc:  # noqa: BLE001 - a store failing at shutdown must not stop the job's exit
            log.warning("owed replay forecasts not recorded at stop: %s", type(exc).__name__)

    def _record_missed(self) -> int:
        with self._lock:
            owed, self._owed = self._owed, self._owed.iloc[:0]
        if len(owed) == 0 or not any(name in ESTIMATORS for name in self.names):
            return 0
        rows = owed_forecast_rows(owed.index.tolist(), owed["gentype"].tolist(), owed["expiry"].tolist(), [],
                                  {name: None for name in self.names if name in ESTIMATORS})
        self.recorder.record_forecasts(rows, now=float(owed["first_seen"].max()),
                                       first_seen=owed["first_seen"].to_numpy())
        return len(rows)

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                if self._offer is not None:
                    recorded = self.run_pending()
                    log.info("replay off the cycle: %d forecasts recorded", recorded)
            except Exception as exc:  # noqa: BLE001 - a failed replay never stops the lane (or the job)
                log.warning("replay off the cycle failed: %s", type(exc).__name__)
                log.debug("replay off the cycle failed", exc_info=True)
            if self._stopping and self._offer is None:
                return

