"""One cycle's figures for every waiting request (SPEC.md sections 4 to 6).

The stages, each timed: ``prepare`` (columns to arrays, queue order, jobs in
flight), ``horde`` (horde-wide figures), ``eligibility`` (per request group,
:mod:`vecsched.core.eligibility`), ``competition`` (work ahead, per competition
class, :mod:`vecsched.core.competition`) and ``figures`` (waits from the sums).
"""

from __future__ import annotations

from contextlib import contextmanager
from time import perf_counter
from typing import Any, Iterator

import numpy as np
import pandas as pd

from vecsched.core import rules
from vecsched.core.arrays import RequestArrays, WorkerArrays, queue_positions, request_arrays, take_rows, worker_arrays
from vecsched.snapshot.schema import IMAGE, JOB_FAULTED, JOB_FINISHED, JOB_PROCESSING, TEXT
from vecsched.core.competition import competition
from vecsched.core.eligibility import eligibility
from vecsched.core import forecasts as _forecasts
from vecsched.core import replay as _replay  # noqa: F401  (registers dispatch-replay-v1)
from vecsched.core.result import EstimateOptions, Estimates
from vecsched.core.groups import unique_rows
from vecsched.snapshot.snapshot import Snapshot

class _Stages:
    """Wall time per named stage, accumulated."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + perf_counter() - start


# ---------------------------------------------------------------------------------
# The whole computation
# ---------------------------------------------------------------------------------


def compute(snapshot: Snapshot, options: EstimateOptions) -> Estimates:
    """The figures of every waiting request of ``snapshot``; see :func:`vecsched.estimate`."""
    stages = _Stages()
    groups: dict[str, int] = {}
    with stages("prepare"):
        w, r = snapshot.workers, snapshot.requests
        user_codes, _ = pd.factorize(np.concatenate([w.user_id, r.user_id]).astype(object))
        worker_index = pd.Index(w.id)
        wk = worker_arrays(snapshot, user_codes[: len(w)].astype(np.int64))
        rq = request_arrays(snapshot, user_codes[len(w) :].astype(np.int64), worker_index)
        n = len(rq.index)
        work = rq.n * rq.output
        position = queue_positions(rq.priority, rq.created, rq.ids)

        request_index = pd.Index(rq.ids)
        pairs = snapshot.excluded_pairs
        ex_w = worker_index.get_indexer(pairs.worker_id) if len(pairs.worker_id) else np.zeros(0, np.int64)
        ex_r = request_index.get_indexer(pairs.request_id) if len(pairs.request_id) else np.zeros(0, np.int64)
        known = (ex_w >= 0) & (ex_r >= 0)
        ex_w, ex_r = ex_w[known], ex_r[known]

        inflight, progress = _jobs_in_flight(snapshot, rq, worker_index, wk.speed, request_index)

    columns = {
        "gentype": rq.gentype.astype(np.int8),
        "eligible_workers": np.zeros(n, dtype=np.int64),
        "eligible_worker_threads": np.zeros(n, dtype=np.int64),
        "is_possible": np.zeros(n, dtype=bool),
        "queue_position": np.zeros(n, dtype=np.int64),
        "wait_time": np.full(n, np.nan),
        "ahead_wait": np.full(n, np.nan),
        "horde_queue_position": np.zeros(n, dtype=np.int64),
        "horde_wait_time": np.full(n, np.nan),
        "fallback": np.zeros(n, dtype=bool),
        **progress,
    }
    horde: dict[str, dict[str, float]] = {}
    extras: dict[str, dict[str, object]] = {}
    queues: list[_forecasts.GentypeQueue] = []  # what the forecasts stage reads
    forecast_throughput = np.zeros(n)
    for gentype, name in ((TEXT, "text"), (IMAGE, "image")):
        mine = np.flatnonzero(rq.gentype == gentype)
        with stages("horde"):
            horde[name] = _horde_wide(wk, gentype, rq, mine, position, work, inflight, columns)
        if len(mine) == 0:
            continue
        aware = gentype == TEXT or options.eligible_image_wait
        sub = take_rows(rq, mine)
        in_mine = np.full(n, -1, dtype=np.int64)
        in_mine[mine] = np.arange(len(mine))
        sel = np.isin(ex_r, mine)
        with stages("eligibility"):
            elig = eligibility(
                wk,
                sub,
                gentype,
                (ex_w[sel], in_mine[ex_r[sel]]),
                len(snapshot.model_names),
                with_competition=aware,
            )
        if aware:
            # What a request not yet created needs to be answered like the queue
            # (vecsched.core.prospective): take classes and each queued request's signature.
            extras[name] = {
                "rows": mine,
                "signature": elig.signature,
                "n_signatures": elig.n_signatures,
                "class_rows": elig.class_rows,
                "worker_class": elig.worker_class,
            }
        groups[f"{name}_request_groups"] = elig.n_groups
        groups[f"{name}_special_groups"] = elig.n_special
        groups[f"{name}_worker_declarations"] = elig.n_declarations
        queues.append(_forecasts.gentype_queue(
            wk, sub, gentype, (ex_w[sel], in_mine[ex_r[sel]]), len(snapshot.model_names), elig, mine,
            horde[name]["mean_speed"]))
        forecast_throughput[mine] = elig.throughput
        columns["eligible_workers"][mine] = elig.workers
        columns["eligible_worker_threads"][mine] = elig.threads
        columns["is_possible"][mine] = (elig.workers > 0) | (progress["processing"][mine] > 0)
        if not aware:
            columns["queue_position"][mine] = columns["horde_queue_position"][mine]
            columns["wait_time"][mine] = columns["horde_wait_time"][mine]
            continue

        with stages("competition"):
            eligible = np.flatnonzero(elig.threads > 0)
            # Requests whose eligible workers could take the same signatures compete
            # alike; rows are deduplicated per group, never per request.
            used_rows, row_of_request = np.unique(elig.row[eligible], return_inverse=True)
            first, class_of_row = unique_rows(elig.takeable[used_rows])
            class_takeable = elig.takeable[used_rows[first]]
            klass = class_of_row[row_of_request.ravel()]
            n_sig = elig.n_signatures
            groups[f"{name}_signatures"] = n_sig
            groups[f"{name}_competition_classes"] = len(class_takeable)
            count_ahead, jobs_ahead, work_ahead = competition(
                position[mine],
                elig.signature,
                klass.ravel(),
                class_takeable,
                n_sig,
                rq.n[mine],
                work[mine],
                eligible,
            )
        with stages("figures"):
            at = mine[eligible]
            threads = elig.threads[eligible].astype(np.float64)
            throughput = elig.throughput[eligible]
            own_jobs = rq.n[at]
            with np.errstate(divide="ignore", invalid="ignore"):
                status_rate = throughput * np.minimum(1.0, (jobs_ahead + own_jobs) / threads)
                wait = (work_ahead + work[at]) / status_rate + inflight[at]
                ahead_rate = throughput * np.minimum(1.0, jobs_ahead / threads)
                ahead = np.where(jobs_ahead == 0, 0.0, work_ahead / ahead_rate)
            wait[throughput == 0] = np.nan
            ahead[(throughput == 0) & (jobs_ahead > 0)] = np.nan
            columns["queue_position"][at] = count_ahead
            columns["wait_time"][at] = wait
            columns["ahead_wait"][at] = ahead
            fell_back = mine[elig.threads == 0]
            columns["fallback"][fell_back] = True
            columns["queue_position"][fell_back] = columns["horde_queue_position"][fell_back]
            columns["wait_time"][fell_back] = columns["horde_wait_time"][fell_back]

    with stages("forecasts"):
        inputs = _forecasts.forecast_inputs(
            snapshot.now, rq, snapshot.requests.expiry[rq.index], position, work, inflight, columns, forecast_throughput, queues,
            options.forecast_skip)
        forecasts = _forecasts.forecast_all(snapshot, inputs, options.calibration)

    return Estimates(
        now=snapshot.now,
        forecasts=forecasts,
        request_id=rq.ids,
        request_index=rq.index,
        columns=columns,
        horde=horde,
        options=options,
        timings=stages.seconds,
        groups=groups,
        rejected=snapshot.rejected,
        extras=extras,
    )


def _jobs_in_flight(
    snapshot: Snapshot,
    rq: RequestArrays,
    worker_index: pd.Index,
    worker_speed: np.ndarray,
    request_index: pd.Index,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The remaining time of each request's own jobs in flight, and its progress counts."""
    n = len(rq.index)
    jobs = snapshot.jobs
    req = request_index.get_indexer(jobs.request_id) if len(jobs.request_id) else np.zeros(0, np.int64)
    mine = req >= 0
    req, state = req[mine], jobs.state[mine]
    counts = {
        name: np.bincount(req[state == code], minlength=n).astype(np.int64)
        for name, code in (("processing", JOB_PROCESSING), ("finished", JOB_FINISHED), ("restarted", JOB_FAULTED))
    }
    counts["waiting"] = np.maximum(rq.jobs - counts["processing"] - counts["finished"], 0)

    inflight = np.zeros(n)
    running = state == JOB_PROCESSING
    if running.any():
        r = req[running]
        wrow = worker_index.get_indexer(jobs.worker_id[mine][running]) if len(worker_index) else np.full(len(r), -1)
        assumed = np.where(rq.gentype[r] == TEXT, rules.ASSUMED_TEXT_SPEED, rules.ASSUMED_IMAGE_SPEED)
        speed = np.where(wrow >= 0, worker_speed[np.maximum(wrow, 0)] if len(worker_speed) else 0.0, assumed)
        with np.errstate(divide="ignore", invalid="ignore"):
            remaining = rq.output[r] / speed - (snapshot.now - jobs.started[mine][running])
        remaining = np.where(speed > 0, np.maximum(remaining, 0.0), np.nan)
        # NaN (a job on a worker measured at speed 0) must win: the wait is unknown.
        with np.errstate(invalid="ignore"):
            np.maximum.at(inflight, r, remaining)
    return inflight, {k: counts[k] for k in ("waiting", "processing", "finished", "restarted")}


def _horde_wide(
    wk: WorkerArrays,
    gentype: int,
    rq: RequestArrays,
    mine: np.ndarray,
    position: np.ndarray,
    work: np.ndarray,
    inflight: np.ndarray,
    columns: dict[str, np.ndarray],
) -> dict[str, float]:
    """Horde-wide totals of one gentype, and its requests' horde-wide figures (SPEC section 6)."""
    online = wk.online & (wk.gentype == gentype)
    n_online = int(online.sum())
    threads = int(wk.threads[online].sum())
    mean_speed = float(wk.speed[online].mean()) if n_online else float("nan")
    if len(mine):
        order = mine[np.argsort(position[mine])]
        jobs_ahead = np.concatenate([[0], np.cumsum(rq.n[order])[:-1]])
        work_ahead = np.concatenate([[0], np.cumsum(work[order])[:-1]])
        columns["horde_queue_position"][order] = np.arange(len(order))
        if n_online and mean_speed > 0:
            rate = mean_speed * np.minimum(threads, jobs_ahead + rq.n[order])
            columns["horde_wait_time"][order] = (work_ahead + work[order]) / rate + inflight[order]
    return {
        "queued_requests": int(len(mine)),
        "queued_jobs": int(rq.n[mine].sum()),
        # Work in the document's units: tokens, or megapixel-steps for image.
        "queued_work": int(work[mine].sum()) if gentype == TEXT else float(work[mine].sum()) / 1e6,
        "online_workers": n_online,
        "online_threads": threads,
        "mean_speed": None if not n_online else mean_speed,
    }


def estimate(
    snapshot: Snapshot, *, eligible_image_wait: bool = False, forecast_skip: Any = None, calibration: Any = None
) -> Estimates:
    """Compute every waiting request's figures (SPEC.md sections 3 to 6) at once.

    Parameters
    ----------
    snapshot : Snapshot
        The horde at one instant.
    eligible_image_wait : bool, default False
        Give image requests eligibility-aware queue figures too.
    forecast_skip : collection of str, optional
        Request ids whose shadow forecasts are not needed (left unknown).
    calibration : dict, optional
        Per estimator name, what it is handed (``vecsched.core.forecasts``).

    Returns
    -------
    Estimates

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({
    ...     "format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z",
    ...     "workers": [{"id": "w1", "user_id": "u1", "gentype": "text", "speed": 20,
    ...                  "last_check_in": "2026-11-29T11:59:30Z", "models": ["m"]}],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1,
    ...                   "max_length": 200, "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z", "models": ["m"]}]})
    >>> est = vecsched.estimate(snap)
    >>> row = est.to_frame().loc["r1"]
    >>> int(row.eligible_workers), int(row.queue_position), float(row.wait_time)
    (1, 0, 10.0)
    """
    options = EstimateOptions(eligible_image_wait=eligible_image_wait, calibration=calibration,
                              forecast_skip=forecast_skip)
    return compute(snapshot, options)
