"""How good are the estimates? Snapshot a simulated run, estimate, and compare with what happened.

Every ``every`` seconds of the measured window the harness takes a snapshot,
runs :func:`vecsched.estimate` on it, and keeps each waiting request's
figures. The simulation then runs on (arrivals continuing, so the queue keeps
its load) until every snapshotted request has had time to be served or to
expire, and each (snapshot, request) pair is matched with what happened next:
seconds to its next job handed out, seconds to completion, how many requests
of its gentype started before it, and how it ended.

The eligibility-aware figures (``wait_time``, ``queue_position``) are always
scored on the same pairs as the horde-wide ones (``horde_wait_time``,
``horde_queue_position``), so the gain is measured, not claimed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from vecsched.core.estimate import estimate
from vecsched.snapshot.schema import GENTYPES
from vecsched.snapshot.snapshot import Snapshot
from vecsched.simulate.engine import EXPIRY_SECONDS, Simulation
from vecsched.simulate.scenarios import SCENARIOS, Scenario, build, scenario as get_scenario

ESTIMATORS = {"vecsched": ("wait_time", "queue_position"), "horde-wide": ("horde_wait_time", "horde_queue_position")}
"""Each estimator scored: its wait column and its queue position column."""


@dataclass
class Run:
    """A finished simulated run: the simulation, its observation pairs and the accuracy table."""

    scenario: Scenario
    seed: int
    minutes: float
    sim: Simulation
    pairs: pd.DataFrame
    table: pd.DataFrame
    snapshots: list[Snapshot] = field(default_factory=list)

    def markdown(self) -> str:
        """The accuracy table as Markdown."""
        return table_markdown(self.table)


def run(
    name: str | Scenario,
    minutes: float = 10.0,
    seed: int = 0,
    *,
    every: float = 30.0,
    warmup: float = 180.0,
    tail: float = EXPIRY_SECONDS,
    eligible_image_wait: bool = True,
    keep_snapshots: bool = False,
    on_snapshot: Callable[[Snapshot, Any], None] | None = None,
    stall_refresh: float = 0.0,
) -> Run:
    """Simulate a scenario, estimate every ``every`` seconds, and score the estimates.

    Parameters
    ----------
    name : str or Scenario
        A scenario of :data:`~vecsched.simulate.SCENARIOS` or a :class:`Scenario`.
    minutes : float
        Length of the measured window, after ``warmup`` seconds of warm-up.
    seed : int
        Seed of the whole run.
    every : float
        Seconds between snapshots.
    tail : float
        Seconds simulated after the window so that outcomes resolve; a pair
        still unresolved at the end is censored (left out and counted).
    eligible_image_wait : bool
        Score the eligibility-aware image waits (otherwise image ``wait_time``
        is the horde-wide one and the comparison is moot).
    keep_snapshots : bool
        Keep every snapshot in :attr:`Run.snapshots`.
    on_snapshot : callable, optional
        Called as ``on_snapshot(snapshot, estimates)`` at each snapshot.
    stall_refresh : float, default 0
        Hand each snapshot's might_stall sums to the next estimate, as the job
        does (``vecsched run --stall-refresh``): a request's are computed
        again each this many seconds of its age. 0: every snapshot's are
        section 7's at its instant.

    Returns
    -------
    Run

    Examples
    --------
    >>> from vecsched.simulate import run, scenario
    >>> r = run(scenario("steady", text_workers=8, image_workers=0), minutes=2, seed=1,
    ...         every=30, warmup=60, tail=300)
    >>> list(r.table.index.names), sorted(set(r.table.index.get_level_values("estimator")))
    (['gentype', 'estimator'], ['horde-wide', 'vecsched'])
    """
    sc = get_scenario(name) if isinstance(name, str) else name
    sim, _ = build(sc, seed, minutes, warmup=warmup, tail=tail)
    t0 = sim.now
    frames = []
    snapshots = []
    # Snapshots at warmup, warmup + every, ... through the end of the window.
    times = t0 + warmup + every * np.arange(math.floor(minutes * 60.0 / every + 1e-9) + 1)
    kept = None
    for t in times:
        sim.run_until(float(t))
        snap = sim.snapshot()
        est = estimate(snap, eligible_image_wait=eligible_image_wait, stall_sums=kept,
                       stall_refresh=stall_refresh)
        kept = est.stall_sums if stall_refresh > 0 else None
        frame = est.to_frame()
        frame["snapshot_time"] = snap.now
        frame["online_threads"] = _online_threads(snap, frame["gentype"])
        frames.append(frame)
        if keep_snapshots:
            snapshots.append(snap)
        if on_snapshot is not None:
            on_snapshot(snap, est)
    sim.run_until(t0 + warmup + minutes * 60.0 + tail)
    observed = pd.concat(frames) if frames else pd.DataFrame()
    pairs = pair_outcomes(sim, observed)
    return Run(sc, seed, minutes, sim, pairs, score(pairs), snapshots)


def _online_threads(snap: Snapshot, gentypes: pd.Series) -> np.ndarray:
    w = snap.workers
    online = (snap.now - w.last_check_in) <= 300.0
    per = np.array([w.threads[online & (w.gentype == g)].sum() for g in range(len(GENTYPES))])
    codes = pd.Categorical(gentypes, categories=list(GENTYPES)).codes
    return per[codes]


def pair_outcomes(sim: Simulation, observed: pd.DataFrame) -> pd.DataFrame:
    """Add what happened next to each (snapshot, request) row of estimates.

    Added columns: ``obs_start`` (seconds from the snapshot to the next job of
    the request handed out), ``obs_completion`` (to completion),
    ``obs_started_before`` (requests of the gentype started in between),
    ``outcome`` (completed, expired, cancelled, censored) and
    ``expired_unstarted``. Times the request never reached are NaN.
    """
    if observed.empty:
        return observed
    df = observed.reset_index()
    ids = df["id"].tolist()
    ts = df["snapshot_time"].to_numpy()
    n = len(df)
    obs_start = np.full(n, np.nan)
    obs_done = np.full(n, np.nan)
    outcome = np.empty(n, dtype=object)
    unstarted_expiry = np.zeros(n, dtype=bool)
    dispatch_times: dict[str, list[float]] = {}
    for rid in set(ids):
        r = sim.requests[rid]
        dispatch_times[rid] = sorted(sim.jobs[j].started for j in r.job_ids)
    for k, (rid, t) in enumerate(zip(ids, ts.tolist())):
        r = sim.requests[rid]
        later = [d for d in dispatch_times[rid] if d > t]
        if later:
            obs_start[k] = later[0] - t
        if r.status == "done":
            obs_done[k] = r.completed_at - t
            outcome[k] = "completed"
        elif r.status == "expired":
            outcome[k] = "expired"
            unstarted_expiry[k] = r.started_at is None
        elif r.status == "cancelled":
            outcome[k] = "cancelled"
        else:
            outcome[k] = "censored"
    # Requests started between the snapshot and this request's next dispatch.
    starts = {g: [] for g in range(len(GENTYPES))}
    for r in sim.requests.values():
        if r.started_at is not None:
            starts[r.gentype].append(r.started_at)
    sorted_starts = {g: np.sort(np.asarray(v)) for g, v in starts.items()}
    g_codes = pd.Categorical(df["gentype"], categories=list(GENTYPES)).codes
    before = np.full(n, np.nan)
    for g, arr in sorted_starts.items():
        sel = (g_codes == g) & np.isfinite(obs_start)
        if sel.any():
            end = ts[sel] + obs_start[sel]
            before[sel] = np.searchsorted(arr, end, "left") - np.searchsorted(arr, ts[sel], "right")
    df["obs_start"] = obs_start
    df["obs_completion"] = obs_done
    df["obs_started_before"] = before
    df["outcome"] = outcome
    df["expired_unstarted"] = unstarted_expiry
    return df


def _within(est: np.ndarray, obs: np.ndarray) -> np.ndarray:
    return np.abs(est - obs) <= np.maximum(60.0, 0.5 * obs)


def score(pairs: pd.DataFrame) -> pd.DataFrame:
    """The accuracy table: one row per (gentype, estimator).

    Wait columns compare each estimator's wait with the observed seconds to
    completion, on the pairs where the request completed and both estimators
    gave a wait (the same pairs for both): ``pairs``, ``within_tolerance``
    (share within max(60 s, 50 %) of the observed), ``p90_abs_error`` (s),
    ``median_abs_error`` (s), ``spearman``. ``position_spearman`` ranks queue
    positions against the requests observed to start first.
    ``unknown_wait`` is the share of all pairs where the estimator had no wait.
    ``impossible_served`` (of pairs with is_possible false, the share later
    served) and ``possible_expired`` (of pairs with is_possible true, the share
    that expired unstarted) judge ``is_possible``; for horde-wide, "possible"
    means some thread of the gentype is online.
    """
    rows = []
    if pairs.empty:
        return pd.DataFrame(columns=["gentype", "estimator"]).set_index(["gentype", "estimator"])
    for g in GENTYPES:
        p = pairs[pairs["gentype"] == g]
        if p.empty:
            continue
        done = p[np.isfinite(p["obs_completion"])]
        both = done[np.isfinite(done["wait_time"]) & np.isfinite(done["horde_wait_time"])]
        obs = both["obs_completion"].to_numpy()
        started = p[np.isfinite(p["obs_start"])]
        for name, (wait_col, pos_col) in ESTIMATORS.items():
            est = both[wait_col].to_numpy()
            err = np.abs(est - obs)
            possible = (
                p["is_possible"].astype(bool).to_numpy()
                if name == "vecsched"
                else (p["online_threads"] > 0).to_numpy()
            )
            served = np.isfinite(p["obs_start"].to_numpy())
            rows.append(
                {
                    "gentype": g,
                    "estimator": name,
                    "pairs": len(both),
                    "within_tolerance": float(_within(est, obs).mean()) if len(both) else math.nan,
                    "median_abs_error": float(np.median(err)) if len(both) else math.nan,
                    "p90_abs_error": float(np.quantile(err, 0.9)) if len(both) else math.nan,
                    "spearman": _spearman(est, obs),
                    "position_spearman": _spearman(
                        started[pos_col].to_numpy(dtype=float), started["obs_started_before"].to_numpy(dtype=float)
                    ),
                    "unknown_wait": float(np.isnan(p[wait_col].to_numpy(dtype=float)).mean()),
                    "impossible_pairs": int((~possible).sum()),
                    "impossible_served": float(served[~possible].mean()) if (~possible).any() else math.nan,
                    "possible_expired": float(p["expired_unstarted"].to_numpy()[possible].mean())
                    if possible.any()
                    else math.nan,
                }
            )
    return pd.DataFrame(rows).set_index(["gentype", "estimator"])


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return math.nan
    # Spearman is Pearson on average ranks; pandas ranks without scipy, which
    # its own method="spearman" would import.
    ranks_a = pd.Series(a[ok]).rank(method="average")
    ranks_b = pd.Series(b[ok]).rank(method="average")
    return float(ranks_a.corr(ranks_b, method="pearson"))


_COLUMNS = (
    ("pairs", "pairs", "{:d}"),
    ("within_tolerance", "within tol.", "{:.0%}"),
    ("median_abs_error", "median abs err (s)", "{:.0f}"),
    ("p90_abs_error", "p90 abs err (s)", "{:.0f}"),
    ("spearman", "Spearman", "{:.2f}"),
    ("position_spearman", "position Spearman", "{:.2f}"),
    ("unknown_wait", "no wait", "{:.0%}"),
    ("impossible_served", "impossible but served", "{:.0%}"),
    ("possible_expired", "possible but expired", "{:.0%}"),
)


def table_markdown(table: pd.DataFrame, *, scenario_column: bool = False) -> str:
    """Render an accuracy table (from :func:`score`, or several stacked) as Markdown."""
    keys = list(table.index.names)
    head = keys + [label for _, label, _ in _COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for idx, row in table.iterrows():
        idx = idx if isinstance(idx, tuple) else (idx,)
        cells = [str(x) for x in idx]
        for col, _, fmt in _COLUMNS:
            v = row.get(col, math.nan)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("n/a")
            else:
                cells.append(fmt.format(int(v) if fmt == "{:d}" else float(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_suite(
    minutes: float = 10.0, seed: int = 0, names: list[str] | None = None, **kwargs: Any
) -> pd.DataFrame:
    """Run every scenario (or ``names``) and stack their accuracy tables."""
    tables = {}
    for name in names or list(SCENARIOS):
        tables[name] = run(name, minutes, seed, **kwargs).table
    return pd.concat(tables, names=["scenario"])
