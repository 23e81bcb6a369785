"""The job's main cycle with dispatch-replay-v1 inside it against the replay off the cycle (docs/replay.md).

    PYTHONPATH=$PWD python benchmarks/replay_offcycle.py [WORKERS] [REQUESTS] [ROUNDS] [--inline-only]

One synthetic horde (seed 0) served from memory (no SQL load: the point is
what the estimate and the publication cost), published to the Redis on
127.0.0.1:6379 under a throwaway key prefix. The estimate forecasts 1% of the
requests as new (the other 99% skipped, as in ``benchmarks.service``); the
replay, which replays the whole queue whatever is asked, runs either inside the
estimate (``inline``) or in a :class:`~vecsched.service.replay_lane.ReplayLane`
thread (``offcycle``). Each round runs, in this order: one inline cycle; one
off-cycle cycle with the lane idle (``offcycle_idle``); its offer starts the
lane's replay; one off-cycle cycle while that replay runs (``offcycle_busy``:
the two share the machine's cores); then the lane is drained. ``to_publish``
is the cycle's estimate + publish (what a reader waits for); ``cpu`` is the
process's CPU seconds over the cycle (all threads); the lane's replay is
timed apart (wall and its thread's CPU). The first, cold cycle (numba's compile
or cache load) is not counted.

Digests: of the inline estimate (every figure column and every forecast), and,
per round, whether the lane's replay equals the inline one bit for bit.
``--inline-only`` runs only the inline cycles (for a tree without the lane:
compare its digest with this tree's).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import statistics
import sys
import threading
import time
from functools import partial
from typing import Any

if __package__ in (None, ""):  # run as a file: the checkout is the package root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import vecsched  # noqa: E402
from vecsched import synthetic  # noqa: E402
from vecsched.core import replay as RP  # noqa: E402
from vecsched.core.forecasts import ESTIMATORS, FORECAST_FIELDS  # noqa: E402
from vecsched.service.job import run_cycle  # noqa: E402
from vecsched.service.store.redis import RedisStore  # noqa: E402


def digest(est: Any, names: Any = None) -> str:
    """SHA-256 of every figure column and of the named forecasts' columns (default: all)."""
    h = hashlib.sha256()
    for key in sorted(est.columns):
        h.update(key.encode() + np.ascontiguousarray(est.columns[key]).tobytes())
    for name in sorted(est.forecasts if names is None else names):
        for field in FORECAST_FIELDS:
            h.update(name.encode() + np.ascontiguousarray(getattr(est.forecasts[name], field)).tobytes())
    return h.hexdigest()[:16]


def forecast_digest(forecast: Any) -> str:
    h = hashlib.sha256()
    for field in FORECAST_FIELDS:
        h.update(np.ascontiguousarray(getattr(forecast, field)).tobytes())
    return h.hexdigest()[:16]


class LaneTimed:
    """The replay as the lane runs it, keeping wall and thread CPU seconds and the output's digest."""

    name = RP.NAME

    def __init__(self, inner: Any):
        self.inner = inner
        self.runs: list[dict[str, Any]] = []

    def compute(self, snapshot: Any, eligibility: Any, calibration: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        out = self.inner.compute(snapshot, eligibility, calibration)
        self.runs.append({"wall": time.perf_counter() - wall, "cpu": time.thread_time() - cpu,
                          "digest": forecast_digest(out)})
        return out


def cycle(store: Any, snap: Any, now: float, estimate: Any) -> tuple[dict[str, float], Any]:
    kept: list[Any] = []

    def keeping(snapshot: Any) -> Any:
        kept.append(estimate(snapshot))
        return kept[-1]

    cpu = time.process_time()
    report = run_cycle(lambda _now: snap, store, lambda: now, interval=5.0, estimate=keeping)
    assert report.ok, report.error
    return {"to_publish": report.estimate + report.publish, "estimate": report.estimate,
            "publish": report.publish, "cpu": time.process_time() - cpu}, kept[0]


def main(workers: int, requests: int, rounds: int, inline_only: bool) -> dict[str, Any]:
    from vecsched.core.pairing import ForecastRecorder, MemoryPairs

    snap = synthetic.horde(workers=workers, requests=requests, seed=0)
    ids = snap.requests.id
    skip = ids[: int(len(ids) * 0.99)]
    RP.enable()
    inline = partial(vecsched.estimate, forecast_skip=skip)
    store = RedisStore("redis://127.0.0.1:6379/0", prefix="vs-bench-" + secrets.token_hex(4))
    out: dict[str, Any] = {"workers": workers, "requests": requests, "rounds": rounds,
                           "load_before": os.getloadavg()[0], "inline": [], "offcycle_idle": [],
                           "offcycle_busy": [], "digests": []}
    try:
        _, warm = cycle(store, snap, snap.now, inline)  # numba's compile or cache load: not counted
        inline_replay = forecast_digest(warm.forecasts[RP.NAME])
        out["inline_digest"] = digest(warm)
        timed = LaneTimed(ESTIMATORS[RP.NAME])
        ESTIMATORS[RP.NAME] = timed  # the inline cycles run it too: same code, timed alike
        offcycle = partial(vecsched.estimate, forecast_skip=skip, defer=(RP.NAME,))
        for k in range(rounds):
            t = snap.now + 10.0 * (k + 1)
            figures, est = cycle(store, snap, t, inline)
            out["inline"].append(figures)
            out["digests"].append(digest(est) == out["inline_digest"])
            if inline_only:
                continue
            from vecsched.service.replay_lane import ReplayLane  # not in a tree without the lane

            lane = ReplayLane(ForecastRecorder(MemoryPairs()), (RP.NAME,), every=0.0)
            lane.start()
            figures, est = cycle(store, snap, t + 1, offcycle)
            out["offcycle_idle"].append(figures)
            lane.offer(snap, est, t + 1)  # the lane's replay starts now, in its thread
            figures, _ = cycle(store, snap, t + 2, offcycle)
            out["offcycle_busy"].append(figures)
            lane.stop()  # drain: let the replay finish
        # Per round: the inline cycle's replay, then (unless inline only) the lane's.
        step = 1 if inline_only else 2
        out["inline_replays"] = timed.runs[0::step]
        out["lane_replays"] = [] if inline_only else timed.runs[1::2]
        out["lane_equals_inline"] = [r["digest"] == inline_replay for r in timed.runs]
    finally:
        store.drop_all()
        store.close()
    out["load_after"] = os.getloadavg()[0]
    return out


def summary(out: dict[str, Any]) -> dict[str, Any]:
    """Medians per kind of cycle, and the ratios off-cycle over inline."""
    med = {}
    for kind in ("inline", "offcycle_idle", "offcycle_busy"):
        if out[kind]:
            med[kind] = {k: round(statistics.median(c[k] for c in out[kind]), 3) for k in out[kind][0]}
    if "offcycle_idle" in med:
        for kind in ("offcycle_idle", "offcycle_busy"):
            med[f"{kind}_over_inline"] = {k: round(med[kind][k] / med["inline"][k], 3)
                                          for k in ("to_publish", "cpu")}
    return med


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    w, r, n = (int(args[0]) if args else 2000), (int(args[1]) if len(args) > 1 else 50000), \
        (int(args[2]) if len(args) > 2 else 3)
    result = main(w, r, n, "--inline-only" in sys.argv)
    print(json.dumps({**result, "medians": summary(result)}, indent=1))
