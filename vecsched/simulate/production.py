"""Score the shadow forecasts as production would: one forecast per request, at its first sighting.

The harness of :mod:`vecsched.simulate.accuracy` scores every (snapshot,
request) pair, so a request waiting ten minutes counts twenty times. The
promotion series (SPEC.md section 8) count each request once: the forecast
recorded when the job first saw it waiting, paired with what then happened.
This module does exactly that over a simulated run, through the same
:class:`~vecsched.service.forecasts_store.ForecastRecorder` and pairing rules
as the service (in memory), and writes the ``vecsched.promotion/1``
document, pooled over seeds.

Scored side by side: every registered estimator (``compatible-queue-v1``,
``eligible-share-v1``) and the published figures ``adr-wait`` and
``horde-wide`` (:func:`vecsched.core.forecasts.baseline_forecasts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from vecsched.core.forecasts import baseline_forecasts, owed_forecast_rows
from vecsched.core.pairing import ForecastRecorder, MemoryPairs, Pair
from vecsched.core.promotion import promotion_document
from vecsched.snapshot.schema import GENTYPES


@dataclass
class FirstSightings:
    """An ``on_snapshot`` callback of :func:`vecsched.simulate.run` recording each request's first forecast.

    ``late`` names estimators run off the main cycle, as ``vecsched run
    --replay-every`` runs the replay: their forecasts are taken only from
    snapshots at least ``every`` seconds apart, and a request first seen in
    between is owed one, recorded at the next such snapshot with its true
    first sighting and ``late_s`` (missed, all p50s unknown, if it no longer
    waits then). Requests still owed when the run ends are recorded as missed
    at the last snapshot: a later replay might have reached them, so this errs
    against the late estimator, never for it.

    Examples
    --------
    >>> FirstSightings(late=("dispatch-replay-v1",), every=60.0).every
    60.0
    """

    recorder: ForecastRecorder = field(default_factory=lambda: ForecastRecorder(MemoryPairs()))
    seen: set[str] = field(default_factory=set)
    expiry: dict[str, float] = field(default_factory=dict)
    late: tuple[str, ...] = ()
    every: float = 0.0
    owed: dict[str, tuple[float, str, float]] = field(default_factory=dict)  # id -> (first seen, gentype, expiry)
    _last_late: float = -math.inf
    _last_now: float = -math.inf

    def __call__(self, snapshot: Any, estimates: Any) -> None:
        import pandas as pd

        ids = estimates.request_id
        now = float(snapshot.now)
        self._last_now = now
        new = np.flatnonzero(~pd.Index(ids).isin(list(self.seen)))
        named = {**estimates.forecasts, **baseline_forecasts(estimates)}
        late = {name: named.pop(name) for name in self.late if name in named}
        if len(new):
            gentype = np.asarray(GENTYPES, dtype=object)[estimates.columns["gentype"][new].astype(np.int64)]
            expiry = snapshot.requests.expiry[estimates.request_index[new]]
            rows = []
            for k, g, e in zip(new.tolist(), gentype.tolist(), expiry.tolist()):
                rid = str(ids[k])
                self.seen.add(rid)
                self.expiry[rid] = e
                rows.append((rid, g, e, {name: f.row(k) for name, f in named.items()}))
                if self.late:
                    self.owed[rid] = (now, g, e)
            self.recorder.record_forecasts(rows, now=now)
        if late and now - self._last_late >= self.every:
            self._last_late = now
            self._record_owed(pd.Index(ids), late, now)

    def _record_owed(self, ids: Any, late: dict[str, Any], now: float) -> None:
        """Every owed request's late forecasts, made at ``now`` (missed where ``ids`` no longer hold it)."""
        if not self.owed:
            return
        owed = list(self.owed)
        rows = owed_forecast_rows(owed, [self.owed[rid][1] for rid in owed], [self.owed[rid][2] for rid in owed],
                                  ids, late)
        self.recorder.record_forecasts(rows, now=now, first_seen=[self.owed[rid][0] for rid in owed])
        self.owed.clear()

    def outcomes(self, sim: Any) -> list[Pair]:
        """Record what the simulation says happened to every request seen; return all pairs."""
        if self.owed:
            import pandas as pd

            self._record_owed(pd.Index([]), {name: None for name in self.late}, self._last_now)
        events = []
        for rid in sorted(self.seen):
            r = sim.requests[rid]
            expiry = self.expiry[rid]
            if r.started_at is not None:
                events.append((rid, "started_at", r.started_at, expiry))
            if r.status == "done":
                events.append((rid, "completed_at", r.completed_at, expiry))
            elif r.status == "expired" and r.started_at is None:
                events.append((rid, "expired_without_start", r.expired_at, expiry))
            elif r.status == "cancelled":
                events.append((rid, "cancelled_at", r.cancelled_at, expiry))
        self.recorder.record_outcomes(events)
        return self.recorder.backend.pairs(-math.inf, math.inf)


def seeded(pairs: Sequence[Pair], seed: int) -> list[Pair]:
    """The same pairs with request ids made unique across seeds."""
    from dataclasses import replace

    return [replace(p, request_id=f"{seed}:{p.request_id}") for p in pairs]


def promotion_for(pairs: Sequence[Pair], seeds: Sequence[int]) -> dict[str, Any]:
    """The ``vecsched.promotion/1`` document of pooled simulated pairs (the window spans them all)."""
    from vecsched.core.forecasts import ESTIMATORS

    times = [p.at for p in pairs] or [0.0]
    start, end = min(times), max(times)
    return promotion_document(pairs, now=end, window=max(end - start, 1.0), seeds=list(seeds),
                              estimators=[*ESTIMATORS, "adr-wait", "horde-wide"])


def run_seeds(name: str, minutes: float, seeds: Sequence[int], **kwargs: Any) -> tuple[dict[str, Any], list[Any]]:
    """Run scenario ``name`` once per seed; the pooled promotion document and the runs.

    Examples
    --------
    >>> from vecsched.simulate import scenario
    >>> doc, runs = run_seeds(scenario("steady", text_workers=6, image_workers=0), 1, [1, 2],
    ...                       every=30, warmup=60, tail=120)
    >>> doc["format"], doc["seeds"], sorted(doc["estimators"])[:2]
    ('vecsched.promotion/1', [1, 2], ['adr-wait', 'compatible-queue-v1'])
    """
    from vecsched.simulate.accuracy import run

    seeds = list(dict.fromkeys(seeds))  # a seed named twice would count its pairs twice
    pooled: list[Pair] = []
    runs = []
    on_snapshot = kwargs.pop("on_snapshot", None)
    on_run = kwargs.pop("on_run", None)  # called with each finished run
    for seed in seeds:
        sightings = FirstSightings()
        result = run(name, minutes, seed, on_snapshot=_chain(on_snapshot, sightings), **kwargs)
        pooled.extend(seeded(sightings.outcomes(result.sim), seed))
        runs.append(result)
        if on_run is not None:
            on_run(result)
    return promotion_for(pooled, seeds), runs


def _chain(first: Any, second: Any) -> Any:
    if first is None:
        return second

    def both(snapshot: Any, estimates: Any) -> None:
        first(snapshot, estimates)
        second(snapshot, estimates)

    return both
