"""``dispatch-replay-v1``: the pop loop replayed forward from the current queue.

Every eligible thread, when free, takes the highest-priority waiting request
it is eligible for (its priority pass over its owners' requests first), at its
worker's measured speed, once its jobs in flight have finished; requests that
reach their expiry before a first job is handed out leave the queue; and the
arrivals of the recent window are repeated forward. The first pop of a request
is its predicted first assignment, its last job's end its completion, and a
request that expires in the replay (or that no thread can take) is a predicted
stall. p90s are calibrated from recent pairs (:mod:`vecsched.core.calibration`)
and fall back to SPEC section 8's provisional margin.

Eligibility is the cycle's own: per *eligible set* (the distinct worker sets of
the request groups, :func:`vecsched.core.forecasts.eligible_sets`), never per
pair. The loop itself is :func:`vecsched.core.replay_kernel.replay_loop`.
See docs/replay.md.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, Mapping

import numpy as np
import pandas as pd

from vecsched.core import rules
from vecsched.core.calibration import calibrated_p90, no_capacity_forecast
from vecsched.core.groups import pack_words, transpose_words, unique_rows, unpack_words
from vecsched.core.forecasts import Forecast, ForecastInputs, GentypeQueue, register
from vecsched.core import replay_kernel
from vecsched.core.replay_kernel import loop_for
from vecsched.snapshot.schema import IMAGE, JOB_PROCESSING, TEXT

NAME = "dispatch-replay-v1"


@dataclass(frozen=True)
class ReplaySettings:
    """How the replay models the horde; the defaults follow the public AI Horde.

    ``arrival_window``: seconds of recent arrivals repeated forward (0: none).
    ``aging_per_second``: priority every waiting request gains per second
    (+50 every 10 s upstream), so a later arrival ranks lower by this much per
    second of delay. ``poll``: seconds an idle thread waits before asking
    again; ``overhead``: seconds between a job's end and the next pop.
    ``max_horizon``: the replay never looks further ahead than this.
    ``served_arrivals``: the gentypes (codes) for which the requests of the
    window that no longer wait (served at once, often by priority) are also
    repeated, from the snapshot's dispatches: each dispatch one job, on the
    worker that took it. Image only by default: in the simulator it lifted
    image and hurt text (docs/replay.md).
    ``measured_timing``: the gentypes (codes) whose job durations and pop gap
    come from the snapshot's own dispatch and capacity-return records (image
    only by default, see docs/replay.md): each worker's speed
    is scaled by its measured seconds per nominal second of work (shrunk
    towards the gentype's by ``prior_jobs`` pseudo-jobs), and ``overhead``
    becomes the gentype's mean gap between a return and the worker's next
    dispatch (gaps over ``gap_cap`` seconds are idle time, not overhead).
    ``absent_after``: a worker that has not checked in for this many seconds
    is taken to have left (the horde counts it online for five minutes; a
    present worker checks in at least every minute); None: every online
    worker stays for the whole horizon.
    ``cancel_hazard``: per gentype code, the share of waiting requests whose
    users cancel them per second of waiting (:func:`leave_times`); the
    calibration's ``cancel_hazard`` (learned from the pairs) replaces it. A
    request cancelled in the replay frees its place for those behind it; its
    own forecast is the one of staying (its start: when a thread reached it).
    ``stall_margin``: per gentype code, thread-seconds: a request the replay
    starts within ``stall_margin / eligible threads`` seconds of its expiry
    is a predicted stall too (a start that close, resting on few threads, is
    one worker's departure or one burst away from missing; text only by
    default, 300: chosen on the equilibrium scenarios, where 800 flagged too
    many requests that then started, see docs/accuracy.md, "Text stall margin
    on the equilibrium loads"). Start and completion p50s are unchanged.
    ``served_peers``: the gentypes (codes) whose served-at-once copies (see
    ``served_arrivals``) may go to any worker offering exactly the models of
    the worker that took the original, not to that worker alone: the request's
    gates are not in the snapshot, but its model is one of those.
    ``served_view``: per gentype code, the weight of a second replay in the
    start and completion p50s, ``(1 - w) * this replay + w * the view``: the
    view has served-at-once arrivals on their model peers and measured timing
    for that gentype (:func:`served_view`). Text 0.4 by default: the two err
    in opposite directions (docs/replay.md, "Round 5"); 0: none.
    ``calm_view``: per gentype code, the weight of a replay without repeated
    arrivals (``arrival_window`` 0) in the same blend. Image 0.25 by default:
    repeating the window is one draw of the future, and the calm one errs the
    other way; 0: none. Stall predictions are always this replay's.
    ``arrival_rate``: the repeated arrivals come this many times as often
    (copies every ``arrival_window / arrival_rate`` seconds; 0: none).
    ``bursts``: (start, end) seconds from now within which arrivals run
    ``burst_factor`` times that rate. A perturbed future of ``spread`` draws
    its own: ``burst_per_hour`` starts (Poisson), each lasting a uniform
    ``burst_minutes``.
    ``spread``: per gentype code, how many futures to replay (docs/replay.md,
    "Round 6"): the first is this replay, the others perturb it (arrival rate
    scaled by its sampling uncertainty widened by ``rate_spread``, workers
    leaving and joining at the measured churn times ``churn_scale``, each
    worker's speed scaled by a lognormal of ``speed_noise``), drawn from a
    seed derived from the snapshot. Start and completion p50s are the
    per-request ``spread_quantile`` of the futures (None: the plain
    replay's), and a request is a predicted stall when it stalls in at least
    ``stall_share`` of them. 1 (the default): the single replay. The other
    defaults (9 image futures, a stall in 2 of them, p50s the plain
    replay's) were chosen on the simulator's tuning seeds, but on full-length
    runs that point flags too many image requests, so the spread is off
    (docs/replay.md, "Round 6").
    ``spread_member``: run only that future (a study view).
    """

    arrival_window: float = 150.0
    aging_per_second: float = 5.0
    poll: float = 3.0
    overhead: float = 1.0
    max_horizon: float = 3600.0
    served_arrivals: tuple[int, ...] = (IMAGE,)
    measured_timing: tuple[int, ...] = (IMAGE,)
    cancel_hazard: tuple[float, ...] = (0.0, 0.0)
    absent_after: float | None = 120.0
    prior_jobs: float = 3.0
    gap_cap: float = 10.0
    stall_margin: tuple[float, ...] = (300.0, 0.0)
    served_peers: tuple[int, ...] = ()
    served_view: tuple[float, ...] = (0.4, 0.0)
    calm_view: tuple[float, ...] = (0.0, 0.25)
    arrival_rate: float = 1.0
    bursts: tuple[tuple[float, float], ...] = ()
    burst_factor: float = 3.0
    burst_per_hour: float = 0.0
    burst_minutes: tuple[float, float] = (2.0, 8.0)
    spread: tuple[int, ...] = (1, 1)
    rate_spread: float = 0.5
    churn_scale: float = 3.0
    speed_noise: float = 0.2
    spread_quantile: float | None = None
    stall_share: float = 0.2
    spread_member: int = -1


def served_view(settings: ReplaySettings, gentype: int) -> ReplaySettings:
    """The settings of the second view of ``gentype`` (see ``ReplaySettings.served_view``), itself without one.

    High-priority arrivals served at once are repeated and may go to any
    worker offering the same models, and job durations are the measured ones
    (the two go together: nominal text durations make up for the missing
    arrivals, see "Why text keeps nominal job durations" in docs/replay.md).

    Examples
    --------
    >>> v = served_view(ReplaySettings(), TEXT)
    >>> TEXT in v.served_arrivals and TEXT in v.served_peers and TEXT in v.measured_timing, v.served_view
    (True, ())
    """
    def plus(codes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted({*codes, gentype}))

    return replace(settings, served_arrivals=plus(settings.served_arrivals), served_peers=plus(settings.served_peers),
                   measured_timing=plus(settings.measured_timing), served_view=(), calm_view=(), spread=())


def _views(settings: ReplaySettings, gentype: int) -> list[tuple[float, ReplaySettings]]:
    """The further replays blended into ``gentype``'s p50s: (weight, settings), weights > 0 only."""
    def weight(of: tuple[float, ...]) -> float:
        return of[gentype] if gentype < len(of) else 0.0

    views = [(weight(settings.served_view), served_view(settings, gentype)),
             (weight(settings.calm_view), replace(settings, arrival_window=0.0, served_view=(), calm_view=(), spread=()))]
    return [(w, v) for w, v in views if w > 0]


@dataclass(frozen=True)
class ReplayResult:
    """One gentype's replay, aligned with the queue's rows (seconds from now; NaN: none)."""

    start: np.ndarray
    completion: np.ndarray
    stall: np.ndarray


def _worker_columns(snapshot: Any, gentype: int, absent_after: float | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The usable workers of ``gentype`` in the order of the eligible sets' columns: rows, speeds, threads.

    A worker silent for more than ``absent_after`` seconds keeps its column
    (the eligible sets count it) but no thread: it is taken to have left.
    """
    w = snapshot.workers
    silent = snapshot.now - w.last_check_in
    online = silent <= rules.ONLINE_WINDOW_SECONDS
    rows = np.flatnonzero(online & ~w.paused & (w.gentype == gentype))
    assumed = rules.ASSUMED_TEXT_SPEED if gentype == TEXT else rules.ASSUMED_IMAGE_SPEED
    measured = w.speed[rows].astype(np.float64)
    speed = np.where(np.isnan(measured), assumed, measured)
    threads = w.threads[rows].astype(np.int64)
    if absent_after is not None:
        threads = np.where(silent[rows] > absent_after, 0, threads)
    return rows, speed, threads


def _measured_timing(snapshot: Any, worker_ids: np.ndarray, speed: np.ndarray, gentype: int,
                     settings: ReplaySettings) -> tuple[np.ndarray, float]:
    """Speeds that give each worker's measured job durations, and the gentype's measured pop gap.

    Returns ``(speed, overhead)``: the given ones when the snapshot has no
    returned dispatch of these workers (or ``measured_timing`` is off).
    """
    d, c = snapshot.dispatches, snapshot.capacity_returns
    if gentype not in settings.measured_timing or not len(d) or not len(c) or not len(speed):
        return speed, settings.overhead
    # A dispatch returned twice counts its last return.
    last = ~pd.Series(c.dispatch_id.astype(object)).duplicated(keep="last").to_numpy()
    back_at = c.returned_at[last]
    returned = pd.Index(c.dispatch_id.astype(object)[last]).get_indexer(d.dispatch_id.astype(object))
    worker = pd.Index(worker_ids.astype(object)).get_indexer(d.worker_id.astype(object))
    ok = np.flatnonzero((worker >= 0) & (returned >= 0))
    ok = ok[speed[worker[ok]] > 0]
    seconds = back_at[returned[ok]] - d.dispatched_at[ok]
    nominal = d.assigned_work[ok].astype(np.float64) * (1.0 if gentype == TEXT else 1e6) / speed[worker[ok]]
    good = (seconds > 0) & (nominal > 0)
    if not good.any():
        return speed, settings.overhead
    ok, seconds, nominal = ok[good], seconds[good], nominal[good]
    w = worker[ok]
    n = len(speed)
    count = np.bincount(w, minlength=n)
    spent, expected = np.bincount(w, seconds, minlength=n), np.bincount(w, nominal, minlength=n)
    pooled = seconds.sum() / nominal.sum()
    # A worker with few returns leans on the gentype's ratio (prior_jobs pseudo-jobs of its mean size).
    prior = settings.prior_jobs * np.where(count > 0, expected / np.maximum(count, 1), 1.0)
    factor = (spent + prior * pooled) / (expected + prior)
    return speed / factor, _pop_gap(d, w, back_at[returned[ok]], worker, settings)


def _pop_gap(d: Any, w: np.ndarray, back: np.ndarray, worker: np.ndarray,
             settings: ReplaySettings) -> float:
    """Mean seconds from a capacity return to the same worker's next dispatch (gaps over ``gap_cap`` left out)."""
    mine = np.flatnonzero(worker >= 0)
    t0 = min(float(d.dispatched_at[mine].min()), float(back.min()))
    # Wider than the times by more than gap_cap: a gap across two workers is never usable.
    span = float(max(d.dispatched_at[mine].max(), back.max())) - t0 + settings.gap_cap + 1.0
    # One sorted key per (worker, time): a return's next dispatch is the first key after it, if the same worker's.
    keys = np.sort(worker[mine] * span + (d.dispatched_at[mine] - t0))
    probe = w * span + (back - t0)
    at = np.searchsorted(keys, probe, side="left")
    has = at < len(keys)
    gap = keys[np.minimum(at, len(keys) - 1)] - probe
    usable = has & (gap >= 0) & (gap <= settings.gap_cap)
    return float(gap[usable].mean()) if usable.any() else settings.overhead


def _job_output(snapshot: Any, rows: np.ndarray) -> np.ndarray:
    """A job's output (tokens, or pixel-steps) of snapshot request ``rows``."""
    r = snapshot.requests
    pixels = r.width[rows].astype(np.float64) * r.height[rows].astype(np.float64)
    return np.where(r.gentype[rows] == TEXT, r.max_length[rows].astype(np.float64), pixels * r.steps[rows])


def _threads(snapshot: Any, worker_rows: np.ndarray, speed: np.ndarray, threads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One entry per thread: seconds until it frees (its job in flight's remaining time, or 0), its worker."""
    jobs = snapshot.jobs
    local = pd.Index(snapshot.workers.id[worker_rows])
    busy_at = np.zeros(0)
    busy_worker = np.zeros(0, dtype=np.int64)
    if len(jobs.id):
        running = np.flatnonzero(jobs.state == JOB_PROCESSING)
        worker = local.get_indexer(jobs.worker_id[running])
        request = pd.Index(snapshot.requests.id).get_indexer(jobs.request_id[running])
        ok = (worker >= 0) & (request >= 0)
        running, worker, request = running[ok], worker[ok], request[ok]
        with np.errstate(divide="ignore", invalid="ignore"):
            seconds = np.where(speed[worker] > 0, _job_output(snapshot, request) / speed[worker], np.inf)
        busy_at, busy_worker = np.maximum(seconds - (snapshot.now - jobs.started[running]), 0.0), worker
    # A worker runs at most `threads` jobs: the longest-running beyond that are dropped.
    order = np.lexsort((busy_at, busy_worker))
    busy_at, busy_worker = busy_at[order], busy_worker[order]
    first = np.searchsorted(busy_worker, busy_worker, side="left")
    keep = (np.arange(len(busy_worker)) - first) < threads[busy_worker]
    busy_at, busy_worker = busy_at[keep], busy_worker[keep]
    idle = np.maximum(threads - np.bincount(busy_worker, minlength=len(threads)), 0)
    idle_worker = np.repeat(np.arange(len(threads)), idle)
    return (np.concatenate([busy_at, np.zeros(len(idle_worker))]),
            np.concatenate([busy_worker, idle_worker]).astype(np.int64))


def _priority_pass(snapshot: Any, worker_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each worker's priority users, from its latest dispatch in the snapshot: (local worker, user id) pairs.

    A worker without a dispatch in the snapshot has no pair. Pairs come
    grouped by worker (ascending), each worker's users in its list's order.
    """
    d = snapshot.dispatches
    if not len(d) or not len(worker_ids):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)
    worker = pd.Index(worker_ids.astype(object)).get_indexer(d.worker_id.astype(object))
    mine = np.flatnonzero(worker >= 0)
    # Latest dispatch per worker: the last row of each worker after a stable sort by (worker, time).
    order = mine[np.lexsort((d.dispatched_at[mine], worker[mine]))]
    by = worker[order]
    last = order[np.r_[by[1:] != by[:-1], True]] if len(order) else order
    users = d.priority_user_ids.take(last)
    return worker[last][users.owners()].astype(np.int64), np.asarray(users.values, dtype=object)


@dataclass(frozen=True)
class _Queue:
    """One gentype's requests in queue order, existing first by position, then the repeated arrivals."""

    rank_of_row: np.ndarray  # queue row k -> its number in queue order
    set_of: np.ndarray  # per numbered request: eligible set (-1: none)
    user: np.ndarray  # owner code, into user_names
    user_names: np.ndarray
    jobs: np.ndarray
    output: np.ndarray
    arrival: np.ndarray
    deadline: np.ndarray
    leave: np.ndarray  # when its user cancels it if nothing of it has started (inf: never)


GOLDEN = (5 ** 0.5 - 1) / 2


def leave_times(arrival: np.ndarray, deadline: np.ndarray, hazard: float) -> np.ndarray:
    """When each numbered request is cancelled, at a constant ``hazard`` per second of waiting (inf: never).

    Deterministic: the k-th request in queue order draws the k-th point of the
    golden-ratio sequence as its quantile of the exponential, so the replay
    stays a pure function of its input and its cancellations are spread evenly
    over every part of the queue. A request already started (infinite
    deadline) is never cancelled.

    Examples
    --------
    >>> leave_times(np.zeros(3), np.array([10.0, np.inf, 10.0]), 0.01).round(1).tolist()
    [96.2, inf, 192.5]
    >>> leave_times(np.zeros(2), np.ones(2), 0.0).tolist()
    [inf, inf]
    """
    if hazard <= 0 or len(arrival) == 0:
        return np.full(len(arrival), np.inf)
    u = np.modf((np.arange(len(arrival)) + 1) * GOLDEN)[0]
    return np.where(np.isinf(deadline), np.inf, arrival - np.log1p(-u) / hazard)


def _arrivals(snap_rows: np.ndarray, snapshot: Any, settings: ReplaySettings, horizon: float) -> tuple[np.ndarray, ...]:
    """The recent arrivals (waiting requests created within the window) repeated forward every window.

    Returns (template index, shift) per future request: the copy arrives
    ``shift`` seconds after its template did (:func:`_copy_times`).
    """
    window = settings.arrival_window
    if window <= 0 or settings.arrival_rate <= 0 or len(snap_rows) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    age = snapshot.now - snapshot.requests.created[snap_rows]
    recent = np.flatnonzero(age <= window)
    take, shift = _copy_times(-age[recent], horizon, settings)
    return recent[take], shift


def _copy_times(created: np.ndarray, horizon: float, settings: ReplaySettings) -> tuple[np.ndarray, np.ndarray]:
    """Future copies of requests created at ``created`` (seconds from now, within the window): (template, shift).

    Copy k of a template arrives ``k * arrival_window / arrival_rate`` seconds
    after it (k >= 1, from now to the horizon); within each burst of
    ``bursts`` (start, end), a second stream of copies comes ``burst_factor -
    1`` times as often, so arrivals run ``burst_factor`` times the rate there.
    """
    streams = [(0.0, horizon, settings.arrival_rate)]
    streams += [(a, min(b, horizon), settings.arrival_rate * (settings.burst_factor - 1.0)) for a, b in settings.bursts]
    takes, shifts = [np.zeros(0, dtype=np.int64)], [np.zeros(0)]
    for lo, hi, rate in streams:
        if rate <= 0 or hi < lo:
            continue
        spacing = settings.arrival_window / rate
        first = np.maximum(1, np.ceil((lo - created) / spacing)).astype(np.int64)
        n = (np.floor((hi - created) / spacing).astype(np.int64) - first + 1).clip(min=0)
        takes.append(np.repeat(np.arange(len(created)), n))
        k = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n) + np.repeat(first, n)
        shifts.append(k * spacing)
    return np.concatenate(takes), np.concatenate(shifts)


def _no_served() -> dict[str, np.ndarray]:
    return {k: np.zeros(0, dtype=np.int64 if k == "set_of" else np.float64)
            for k in ("priority", "created", "output", "deadline", "set_of")}


def _served(snapshot: Any, gentype: int, worker_ids: np.ndarray, waiting_ids: np.ndarray, first_set: int,
            settings: ReplaySettings, horizon: float, life: float) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Future copies of the window's dispatched requests that no longer wait: one job each, on its worker.

    Returns the columns (arrival as ``created``, seconds from now) and, per
    copy, the local worker whose singleton set (numbered from ``first_set``)
    serves it.
    """
    window = settings.arrival_window
    d = snapshot.dispatches
    if gentype not in settings.served_arrivals or window <= 0 or settings.arrival_rate <= 0 or not len(d):
        return _no_served(), np.zeros(0, dtype=np.int64)
    created = d.request_created.astype(np.float64) - snapshot.now
    at = d.dispatched_at.astype(np.float64) - snapshot.now
    worker = pd.Index(worker_ids).get_indexer(d.worker_id.astype(object))
    keep = ((worker >= 0) & (created >= -window) & (at <= 0)
            & ~pd.Index(d.request_id.astype(object)).isin(pd.Index(waiting_ids)))
    created, at, worker = created[keep], at[keep], worker[keep]
    # What the request's priority would be now, had it waited: aging continued since its pop.
    priority = d.request_extra_priority.astype(np.float64)[keep] - settings.aging_per_second * at
    work = d.assigned_work.astype(np.float64)[keep] * (1.0 if gentype == TEXT else 1e6)
    take, shift = _copy_times(created, horizon, settings)
    arrival = created[take] + shift
    columns = {"priority": priority[take] - settings.aging_per_second * shift, "created": arrival,
               "output": work[take], "deadline": arrival + life, "set_of": first_set + worker[take]}
    return columns, worker[take]


def _model_peers(snapshot: Any, worker_rows: np.ndarray) -> np.ndarray:
    """Per worker of ``worker_rows``, a number shared by exactly the workers that offer the same models."""
    models = snapshot.workers.models.take(worker_rows)
    codes, names = pd.factorize(models.values)
    offers = np.zeros((len(worker_rows), max(len(names), 1)), dtype=bool)
    offers[models.owners(), codes] = True
    return unique_rows(pack_words(offers))[1]


def _served_sets(snapshot: Any, worker_rows: np.ndarray, masks: np.ndarray, served_worker: np.ndarray,
                 peers: bool) -> tuple[np.ndarray, np.ndarray]:
    """The eligible sets with those of the served-at-once copies appended, and each copy's set.

    One singleton set per worker that took such a request, or (``peers``) one
    set per distinct model list, holding every worker that offers it.
    """
    n = masks.shape[1]
    group = _model_peers(snapshot, worker_rows) if peers else np.arange(n)
    extra = group[None, :] == np.arange(int(group.max(initial=-1)) + 1)[:, None]
    return np.concatenate([masks, extra]), len(masks) + group[served_worker]


def _numbered(snapshot: Any, inp: ForecastInputs, queue: GentypeQueue, snap_rows: np.ndarray,
              set_of: np.ndarray, started: np.ndarray, settings: ReplaySettings, horizon: float,
              served: dict[str, np.ndarray] | None = None) -> _Queue:
    """Existing and arriving requests of one gentype, numbered in queue order."""
    rows = queue.rows
    r = snapshot.requests
    mine = snap_rows[rows]
    age = snapshot.now - r.created[mine]
    template, shift = _arrivals(mine, snapshot, settings, horizon)
    priority = np.concatenate([r.extra_priority[mine].astype(np.float64),
                               r.extra_priority[mine[template]] - settings.aging_per_second * shift])
    created = np.concatenate([-age, shift - age[template]])
    # Ties (same priority and creation) keep queue order; a copy ranks by its template's place.
    tie = np.concatenate([inp.position[rows], len(rows) + inp.position[rows][template]])
    served = served if served is not None else _no_served()
    priority = np.concatenate([priority, served["priority"]])
    created = np.concatenate([created, served["created"]])
    tie = np.concatenate([tie, 2 * len(rows) + np.arange(len(served["created"]))])
    order = np.lexsort((tie, created, -priority))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    life = (r.expiry[mine] - r.created[mine])[template]
    deadline = np.where(started, np.inf, inp.seconds_left[rows])
    user_codes, user_names = pd.factorize(r.user_id[mine].astype(object))
    columns = {
        "set_of": np.concatenate([set_of, set_of[template], served["set_of"]]),
        "user": np.concatenate([user_codes, user_codes[template], np.full(len(served["created"]), -1)]),
        "jobs": np.concatenate([inp.n[rows], r.jobs[mine[template]], np.ones(len(served["created"]))]).astype(np.int64),
        "output": np.concatenate([_job_output(snapshot, mine), _job_output(snapshot, mine[template]), served["output"]]),
        "arrival": np.concatenate([np.zeros(len(rows)), shift - age[template], served["created"]]),
        "deadline": np.concatenate([deadline, shift - age[template] + life, served["deadline"]]),
    }
    numbered = {name: col[order] for name, col in columns.items()}
    hazard = settings.cancel_hazard[queue.gentype] if queue.gentype < len(settings.cancel_hazard) else 0.0
    numbered["leave"] = leave_times(numbered["arrival"], numbered["deadline"], hazard)
    return _Queue(rank_of_row=rank[: len(rows)], user_names=np.asarray(user_names, dtype=object), **numbered)


def _favoured_users(user_names: np.ndarray, pass_worker: np.ndarray, pass_user: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The priority pass in owner codes: (worker, owner code) pairs of owners with a waiting request, and which owners some worker favours.

    ``favoured`` has one more entry than ``user_names``, always False, so that
    code -1 (a served-at-once copy, owner unknown) reads it.
    """
    codes = pd.Index(user_names).get_indexer(pass_user) if len(pass_user) else np.zeros(0, dtype=np.int64)
    known = codes >= 0
    favoured = np.zeros(len(user_names) + 1, dtype=bool)
    favoured[codes[known]] = True
    return pass_worker[known], codes[known].astype(np.int64), favoured


def _queue_pairs(set_of: np.ndarray, user: np.ndarray, favoured: np.ndarray, n_sets: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Number the queues, the distinct (eligible set, owner if favoured else -1) of the requests, in that order.

    Returns each queue's set and owner code, and each request's queue (-1:
    no eligible set). One integer key per request, ranked by marking the keys
    present (by sorting when the key range is much wider than the requests).
    """
    fav_users = np.flatnonzero(favoured[:-1])
    fav_rank = np.zeros(len(favoured), dtype=np.int64)  # 0: not favoured (the owner's own code otherwise, +1)
    fav_rank[fav_users] = np.arange(1, len(fav_users) + 1)
    has = np.flatnonzero(set_of >= 0)
    width = len(fav_users) + 1
    key = set_of[has] * width + fav_rank[user[has]]  # orders as (set, owner code) with -1 first
    size = n_sets * width
    if size <= 8 * len(key) + 4096:
        present = np.zeros(size, dtype=bool)
        present[key] = True
        distinct = np.flatnonzero(present)
        inverse = (np.cumsum(present) - 1)[key]
    else:
        distinct, inverse = np.unique(key, return_inverse=True)
    queue_of = np.full(len(set_of), -1, dtype=np.int64)
    queue_of[has] = inverse.ravel()
    rank = distinct % width
    pair_user = np.where(rank > 0, fav_users[np.maximum(rank - 1, 0)] if len(fav_users) else -1, -1)
    return (distinct // width).astype(np.int64), pair_user.astype(np.int64), queue_of


def _csr(rows: np.ndarray, values: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, values) of pairs already grouped by row."""
    ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_rows))]).astype(np.int64)
    return ptr, np.asarray(values, dtype=np.int64)


def _row_lists(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR (ptr, columns) of the True cells of each row of a 2-D boolean matrix, columns ascending.

    One flat scan, the columns computed in place: at 2,000 x 50,000 the image
    lists hold 1.75M cells, and every further array of that size costs its
    page faults again in each replay.
    """
    cells = np.flatnonzero(matrix)
    np.remainder(cells, max(matrix.shape[1], 1), out=cells)
    counts = np.count_nonzero(matrix, axis=1) if matrix.size else np.zeros(len(matrix), dtype=np.int64)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), cells


def _columns(masks: np.ndarray, pair_set: np.ndarray) -> tuple[np.ndarray, ...]:
    """Workers that serve exactly the same queues share a column: each worker's column, and who serves which queue.

    ``masks[pair_set]``: queues x workers. Returns (column per worker, CSR by
    column of its queues ascending, CSR by queue of the columns serving it).
    The workers' rows over the queues are the queues' rows transposed as
    packed bits (a bool matrix's transpose costs about ten times as much).
    """
    n_queues, n_workers = len(pair_set), masks.shape[1]
    if n_workers == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, np.zeros(1, dtype=np.int64), empty, np.zeros(n_queues + 1, dtype=np.int64), empty
    worker_words = transpose_words(pack_words(masks[pair_set]), n_workers)
    first, column = unique_rows(worker_words)
    cq_ptr, cq = _row_lists(unpack_words(worker_words[first], n_queues))
    qc_ptr, qc = _row_lists(np.take(masks, first, axis=1)[pair_set])
    return column.astype(np.int64), cq_ptr, cq, qc_ptr, qc


def _pass_queues(masks: np.ndarray, pair_set: np.ndarray, pair_user: np.ndarray, wp_worker: np.ndarray,
                 wp_user: np.ndarray, n_users: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR by worker of its priority-pass queues: the queues of its favoured owners among its sets, ascending.

    Read only over the workers with a priority pass and the queues of favoured owners.
    """
    n_workers = masks.shape[1]
    favoured_queues = np.flatnonzero(pair_user >= 0)
    if len(wp_worker) == 0 or len(favoured_queues) == 0:
        return np.zeros(n_workers + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    passing = np.unique(wp_worker)
    w_at, q_at = np.nonzero(masks[pair_set[favoured_queues]][:, passing].T)
    w_idx, wq_idx = passing[w_at], favoured_queues[q_at]
    pass_key = wp_worker * (n_users + 1) + wp_user
    in_pass = np.isin(w_idx * (n_users + 1) + pair_user[wq_idx], pass_key)
    return _csr(w_idx[in_pass], wq_idx[in_pass], n_workers)


def _queues(q: _Queue, masks: np.ndarray, pass_worker: np.ndarray, pass_user: np.ndarray) -> tuple[np.ndarray, ...]:
    """Split each eligible set by owner where some worker serves that owner first; who serves which queue.

    ``pass_worker``/``pass_user``: the priority pass (:func:`_priority_pass`).
    Returns (queue of each request, heap bases, capacities, each worker's
    column, CSR of each column's queues, CSR by queue of the columns serving
    it, CSR of each worker's priority-pass queues).
    """
    wp_worker, wp_user, favoured = _favoured_users(q.user_names, pass_worker, pass_user)
    pair_set, pair_user, queue_of = _queue_pairs(q.set_of, q.user, favoured, len(masks))
    capacity = np.bincount(queue_of[queue_of >= 0], minlength=len(pair_set)).astype(np.int64)
    base = (np.cumsum(capacity) - capacity).astype(np.int64)
    column, cq_ptr, cq, qc_ptr, qc = _columns(masks, pair_set)
    wp_ptr, wp = _pass_queues(masks, pair_set, pair_user, wp_worker, wp_user, len(q.user_names))
    return queue_of, base, capacity, column, cq_ptr, cq, qc_ptr, qc, wp_ptr, wp


@dataclass(frozen=True)
class Future:
    """How one replayed future departs from the plain replay (:func:`futures`); the default is the plain one.

    ``rate``: factor on the arrival rate (``ReplaySettings.arrival_rate``).
    ``gone``: per usable worker (the order of :func:`_worker_columns`), seconds
    until it leaves. ``join_at``/``join_worker``: one entry per thread that
    joins, when, and the worker whose column and speed it takes (a newcomer
    like that one). ``speed``: per worker, a factor on its speed. ``bursts``:
    as ``ReplaySettings.bursts``.
    """

    rate: float = 1.0
    gone: np.ndarray | None = None
    join_at: np.ndarray | None = None
    join_worker: np.ndarray | None = None
    speed: np.ndarray | None = None
    bursts: tuple[tuple[float, float], ...] = ()


def _count(of: tuple[int, ...], gentype: int) -> int:
    return int(of[gentype]) if gentype < len(of) else 1


def _horizon(snapshot: Any, inp: ForecastInputs, queue: GentypeQueue, snap_rows: np.ndarray,
             settings: ReplaySettings) -> tuple[float, np.ndarray]:
    """The replay's horizon (the latest deadline of a reachable unstarted request), and whether each row has started."""
    rows = queue.rows
    set_of = queue.eligible_sets()[0]
    # pandas hashes the ids; np.isin on object arrays compares them pairwise.
    started = pd.Index(snapshot.requests.id[snap_rows[rows]]).isin(pd.Index(snapshot.jobs.request_id))
    deadlines = np.where(started, 0.0, inp.seconds_left[rows])[set_of >= 0]
    return float(min(settings.max_horizon, deadlines.max(initial=0.0))), started


def churn_rate(snapshot: Any, gentype: int, settings: ReplaySettings) -> float:
    """Departures per present worker per second of ``gentype``, from the workers that went silent lately.

    A worker silent for more than ``absent_after`` seconds but still counted
    online (``rules.ONLINE_WINDOW_SECONDS``) left within the last
    ``ONLINE_WINDOW_SECONDS - absent_after`` seconds (as :func:`_worker_columns` takes it).
    """
    after = settings.absent_after if settings.absent_after is not None else 120.0
    span = rules.ONLINE_WINDOW_SECONDS - after
    w = snapshot.workers
    silent = snapshot.now - w.last_check_in
    mine = (w.gentype == gentype) & ~w.paused
    present = int((mine & (silent <= after)).sum())
    left = int((mine & (silent > after) & (silent <= rules.ONLINE_WINDOW_SECONDS)).sum())
    return left / (span * present) if span > 0 and present > 0 else 0.0


def _seed(snapshot: Any, gentype: int) -> int:
    """A seed that is a function of the snapshot alone: the same snapshot replays the same futures."""
    r = snapshot.requests
    key = np.array([snapshot.now, gentype, len(r.id), len(snapshot.workers.id)], dtype=np.float64).tobytes()
    return zlib.crc32(key + "\x00".join(map(str, r.id[-64:].tolist())).encode())


def futures(snapshot: Any, gentype: int, settings: ReplaySettings, threads: np.ndarray, arrivals: int,
            horizon: float) -> list[Future]:
    """The ``spread`` futures of ``gentype`` to replay: the plain one, then perturbed ones.

    The arrival rate of future j is scaled by ``exp(z_j * sd)``, the z_j the
    normal quantiles at evenly spaced levels (in an order drawn from the seed),
    ``sd`` the relative sampling error of ``arrivals`` recent arrivals widened
    by ``rate_spread``. Each present worker (``threads`` > 0) leaves after an
    exponential time at the measured :func:`churn_rate` (times ``churn_scale``),
    and as many newcomers are expected to join (copies of present workers, at
    uniform times). Every draw comes from :func:`_seed`.
    """
    k = _count(settings.spread, gentype)
    out = [Future()]
    if k <= 1:
        return out
    rng = np.random.default_rng(_seed(snapshot, gentype))
    hazard = churn_rate(snapshot, gentype, settings) * settings.churn_scale
    sd = math.sqrt(1.0 / max(arrivals, 1) + settings.rate_spread ** 2)
    z = rng.permutation([NormalDist().inv_cdf((j + 0.5) / (k - 1)) for j in range(k - 1)])
    present = np.flatnonzero(threads > 0)
    n = len(threads)
    for j in range(k - 1):
        gone = np.full(n, np.inf)
        joins = 0
        if hazard > 0 and len(present):
            gone[present] = rng.exponential(1.0 / hazard, len(present))
            joins = int(rng.poisson(hazard * len(present) * max(horizon, 0.0)))
        source = rng.choice(present, joins) if joins else np.zeros(0, dtype=np.int64)
        at = rng.uniform(0.0, max(horizon, 0.0), joins)
        speed = np.exp(settings.speed_noise * rng.standard_normal(n))
        starts = rng.uniform(0.0, max(horizon, 0.0), rng.poisson(settings.burst_per_hour * max(horizon, 0.0) / 3600.0))
        lasts = 60.0 * rng.uniform(*settings.burst_minutes, len(starts))
        out.append(Future(rate=float(np.exp(z[j] * sd)), gone=gone, join_at=np.repeat(at, threads[source]),
                          join_worker=np.repeat(source, threads[source]).astype(np.int64), speed=speed,
                          bursts=tuple((float(a), float(a + d)) for a, d in zip(starts, lasts))))
    return out


def replay_gentype(snapshot: Any, inp: ForecastInputs, queue: GentypeQueue, snap_rows: np.ndarray,
                   settings: ReplaySettings = ReplaySettings(), future: Future = Future()) -> ReplayResult:
    """Replay one gentype's dispatch; first assignment, completion and stall per row of ``queue.rows``.

    ``snap_rows`` maps the estimate's requests to snapshot rows. A request no
    thread can take has no start (NaN) and a stall unless a job of it is in
    flight; one that expires in the replay keeps, as its start, the time a
    thread first found it expired. ``future``: the perturbations of this
    replay (:func:`futures`); by default none.
    """
    rows = queue.rows
    set_of, masks, _ = queue.eligible_sets()
    worker_rows, speed, threads = _worker_columns(snapshot, queue.gentype, settings.absent_after)
    horizon, started = _horizon(snapshot, inp, queue, snap_rows, settings)
    reachable = set_of >= 0
    settings = replace(settings, arrival_rate=settings.arrival_rate * future.rate, bursts=settings.bursts + future.bursts)
    mine = snap_rows[rows]
    lives = snapshot.requests.expiry[mine] - snapshot.requests.created[mine]
    served, served_worker = _served(snapshot, queue.gentype, snapshot.workers.id[worker_rows],
                                    snapshot.requests.id[mine], len(masks), settings, horizon,
                                    float(np.median(lives)) if len(lives) else 1200.0)
    if len(served_worker):
        masks, served["set_of"] = _served_sets(snapshot, worker_rows, masks, served_worker,
                                               queue.gentype in settings.served_peers)
    speed, overhead = _measured_timing(snapshot, snapshot.workers.id[worker_rows], speed, queue.gentype, settings)
    if future.speed is not None:
        speed = speed * future.speed
    q = _numbered(snapshot, inp, queue, snap_rows, set_of, started, settings, horizon, served)
    queue_of, base, capacity, column, cq_ptr, cq, qc_ptr, qc, wp_ptr, wp = _queues(
        q, masks, *_priority_pass(snapshot, snapshot.workers.id[worker_rows]))
    free_at, thread_worker = _threads(snapshot, worker_rows, speed, threads)
    if future.join_at is not None:
        free_at = np.concatenate([free_at, future.join_at])
        thread_worker = np.concatenate([thread_worker, future.join_worker])
    gone = future.gone if future.gone is not None else np.full(len(speed), np.inf)
    start, done, turn, left, gave_up = loop_for(len(q.jobs))(
        free_at, thread_worker, speed, column, cq_ptr, cq, qc_ptr, qc, wp_ptr, wp, queue_of, base, capacity,
        q.jobs, q.output, q.arrival, q.deadline, q.leave, horizon, settings.poll, overhead, gone, replay_kernel.WALK_FROM)
    k = q.rank_of_row
    s, c = start[k], done[k]
    never = s < 0
    # Not started in the replay: when a thread would first have found it (expired), or the horizon.
    s = np.where(never, np.where(turn[k] >= 0, turn[k], max(horizon, 0.0)), s)
    rate = np.where(inp.threads[rows] > 0, inp.throughput[rows] / np.maximum(inp.threads[rows], 1), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        rough = s + q.output[k] / rate  # the last jobs in parallel at the mean speed
    c = np.where(never | (left[k] > 0), np.maximum(c, rough), c)
    c = np.maximum(c, inp.inflight[rows])
    s = np.where(started, 0.0, s)
    # Cancelled in the replay: not a stall; its start is when a thread reached it.
    stall = ~started & ((never & ~gave_up[k]) | ~reachable | _near_expiry(s, inp, queue, settings))
    s[~reachable & ~started] = np.nan
    c[~reachable & ~(inp.inflight[rows] > 0)] = np.nan
    return ReplayResult(start=s, completion=c, stall=stall)


def _near_expiry(start: np.ndarray, inp: ForecastInputs, queue: GentypeQueue, settings: ReplaySettings) -> np.ndarray:
    """Rows of ``queue`` whose replayed ``start`` falls within ``stall_margin / eligible threads`` of expiry."""
    code = queue.gentype
    margin = settings.stall_margin[code] if code < len(settings.stall_margin) else 0.0
    if margin <= 0:
        return np.zeros(len(queue.rows), dtype=bool)
    threads = np.maximum(inp.threads[queue.rows], 1).astype(np.float64)
    # A start at or past expiry is a stall already; the margin widens that by margin / threads.
    return start >= inp.seconds_left[queue.rows] - margin / threads


def spread_gentype(snapshot: Any, inp: ForecastInputs, queue: GentypeQueue, snap_rows: np.ndarray,
                   settings: ReplaySettings) -> ReplayResult:
    """The replays of :func:`futures`, one per future: per row the ``spread_quantile`` of their starts and completions (None: the first's), and a stall where at least ``stall_share`` of them stall."""
    threads = _worker_columns(snapshot, queue.gentype, settings.absent_after)[2]
    horizon = _horizon(snapshot, inp, queue, snap_rows, settings)[0]
    age = snapshot.now - snapshot.requests.created[snap_rows[queue.rows]]
    every = futures(snapshot, queue.gentype, settings, threads, int((age <= settings.arrival_window).sum()), horizon)
    if settings.spread_member >= 0:  # one future alone (a study view)
        every = every[settings.spread_member: settings.spread_member + 1]
    results = [replay_gentype(snapshot, inp, queue, snap_rows, settings, f) for f in every]
    if len(results) == 1:
        return results[0]
    start = np.stack([r.start for r in results])
    completion = np.stack([r.completion for r in results])
    share = np.mean([r.stall for r in results], axis=0)
    q = settings.spread_quantile
    if q is None:  # the p50s stay the plain replay's
        return ReplayResult(start=results[0].start, completion=results[0].completion, stall=share >= settings.stall_share)
    # A NaN (no eligible thread; unknown speed) is the same in every future, so it stays NaN.
    return ReplayResult(start=np.quantile(start, q, axis=0, method="inverted_cdf"),
                        completion=np.quantile(completion, q, axis=0, method="inverted_cdf"),
                        stall=share >= settings.stall_share)


def _blended(snapshot: Any, inp: ForecastInputs, queue: GentypeQueue, snap_rows: np.ndarray,
             settings: ReplaySettings) -> ReplayResult:
    """:func:`spread_gentype`, its p50s blended with its views' (:func:`_views`); stalls its own."""
    result = spread_gentype(snapshot, inp, queue, snap_rows, settings)
    start, completion = result.start, result.completion
    for weight, view_settings in _views(settings, queue.gentype):
        view = replay_gentype(snapshot, inp, queue, snap_rows, view_settings)
        # Where a view has no p50 (no eligible thread: neither has; speed 0: unknown), this replay's stands.
        start = start + weight * np.where(np.isnan(view.start), 0.0, view.start - result.start)
        completion = completion + weight * np.where(np.isnan(view.completion), 0.0, view.completion - result.completion)
    return ReplayResult(start=start, completion=completion, stall=result.stall)


def waiting_rows(snapshot: Any) -> np.ndarray:
    """Snapshot rows of the waiting requests, in the estimate's order (as :func:`request_arrays` takes them)."""
    r = snapshot.requests
    return np.flatnonzero(r.active & ~r.faulted & (r.expiry > snapshot.now) & (r.n > 0))


@dataclass(frozen=True)
class DispatchReplayV1:
    """``dispatch-replay-v1``: see the module docstring.

    Examples
    --------
    >>> from vecsched import synthetic
    >>> import vecsched
    >>> enable()
    >>> est = vecsched.estimate(synthetic.horde(workers=20, requests=60, seed=1))
    >>> f = est.forecasts["dispatch-replay-v1"]
    >>> bool((f.start_p90[~f.predicted_stall] >= f.start_p50[~f.predicted_stall]).all())
    True
    >>> disable()
    """

    name: str = NAME
    settings: ReplaySettings = ReplaySettings()

    def compute(self, snapshot: Any, eligibility: ForecastInputs, calibration: Mapping[str, Any] | None) -> Forecast:
        """Replay each gentype's queue; p90s from ``calibration`` (see :func:`calibrated_p90`)."""
        inp = eligibility
        n = len(inp)
        start, completion = np.full(n, np.nan), np.full(n, np.nan)
        stall = np.ones(n, dtype=bool)
        snap_rows = waiting_rows(snapshot)
        if len(snap_rows) != n:
            raise ValueError(f"{NAME}: {n} forecast rows but {len(snap_rows)} waiting requests in the snapshot")
        settings = self.settings
        hazard = (calibration or {}).get("cancel_hazard")
        if hazard is not None:  # learned from the pairs: it replaces the setting
            settings = replace(settings, cancel_hazard=tuple(float(h) for h in hazard))
        for queue in inp.queues:
            if len(queue.rows) == 0:
                continue
            result = _blended(snapshot, inp, queue, snap_rows, settings)
            start[queue.rows], completion[queue.rows], stall[queue.rows] = result.start, result.completion, result.stall
        known = ~np.isnan(start)
        p90 = {}
        for phase, p50 in (("start", start), ("completion", completion)):
            p90[phase] = calibrated_p90(p50, phase=phase, gentype=inp.gentype, calibration=calibration)
        stall = stall | ~known
        # No capacity when seen: no replay, but the recent outcomes of such requests (their stall stays predicted).
        start, p90["start"] = no_capacity_forecast(start, p90["start"], phase="start", gentype=inp.gentype,
                                                   calibration=calibration)
        completion, p90["completion"] = no_capacity_forecast(completion, p90["completion"], phase="completion",
                                                             gentype=inp.gentype, calibration=calibration)
        return Forecast(start, p90["start"], completion, p90["completion"], stall)


def enable() -> None:
    """Register ``dispatch-replay-v1``, so that every estimate runs it from now on.

    It is off by default: at ten times today's horde it costs several times the
    SPEC 3-6 estimate (docs/replay.md), so the job runs it only when asked
    (``vecsched run --replay``) and the simulator's scoring turns it on.

    Examples
    --------
    >>> from vecsched.core.forecasts import ESTIMATORS
    >>> enable()
    >>> NAME in ESTIMATORS
    True
    >>> disable()
    """
    register(DispatchReplayV1)


def disable() -> None:
    """Take ``dispatch-replay-v1`` out of the registry again (see :func:`enable`).

    Examples
    --------
    >>> from vecsched.core.forecasts import ESTIMATORS
    >>> enable(); disable()
    >>> NAME in ESTIMATORS
    False
    """
    from vecsched.core.forecasts import ESTIMATORS

    ESTIMATORS.pop(NAME, None)
