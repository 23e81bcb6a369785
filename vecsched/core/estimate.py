"""One cycle's figures for every waiting request (SPEC.md sections 4 to 6).

The stages, each timed: ``prepare`` (columns to arrays, queue order, jobs in
flight), ``horde`` (horde-wide figures), ``eligibility`` (per request group,
:mod:`vecsched.core.eligibility`), ``competition`` (work ahead, per competition
class, :mod:`vecsched.core.competition`) and ``figures`` (waits from the sums).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Iterator

import numpy as np
import pandas as pd

from vecsched.core import figures, rules
from vecsched.core.arrays import RequestArrays, WorkerArrays, queue_positions, request_arrays, take_rows, worker_arrays
from vecsched.snapshot.schema import IMAGE, JOB_FAULTED, JOB_FINISHED, JOB_PROCESSING, TEXT
from vecsched.core.competition import competition
from vecsched.core.eligibility import Eligibility, eligibility
from vecsched.core import forecasts as _forecasts
from vecsched.core.result import CompetitionState, EstimateOptions, Estimates, QueueSignatures
from vecsched.core.stall import EventRows, event_rows, stall, stall_columns
from vecsched.core.stall_cache import REFRESH_SECONDS, StallSums
from vecsched.core.threads import one_blas_thread
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


@dataclass(frozen=True)
class _Batch:
    """What every gentype's stages read, prepared once per snapshot."""

    workers: WorkerArrays
    queue: RequestArrays
    users: np.ndarray  # user names by code
    work: np.ndarray  # per waiting request: jobs * output per job
    position: np.ndarray  # place in queue order
    excluded: tuple[np.ndarray, np.ndarray]  # (worker row, waiting request) pairs
    in_flight: np.ndarray  # remaining seconds of each request's jobs in flight
    progress: dict[str, np.ndarray]  # waiting, processing, finished, restarted
    worker_index: pd.Index  # worker ids by row, hashed once
    request_index: pd.Index  # waiting requests' ids by queue row, hashed once


def compute(snapshot: Snapshot, options: EstimateOptions) -> Estimates:
    """The figures of every waiting request of ``snapshot``; see :func:`estimate`."""
    stages = _Stages()
    with stages("prepare"):
        batch = _prepare(snapshot)
    columns = _empty_columns(batch)
    horde: dict[str, dict[str, float]] = {}
    groups: dict[str, int] = {}
    queues: dict[str, QueueSignatures] = {}
    forecast_queues: list[_forecasts.GentypeQueue] = []  # what the forecasts stage reads
    forecast_throughput = np.zeros(len(batch.queue.index))
    with stages("stall"):  # both gentypes read the same event tables: their ids are looked up once
        found = event_rows(snapshot, batch.worker_index, batch.request_index)
    stall_sums: list[StallSums] = []
    for gentype, name in ((TEXT, "text"), (IMAGE, "image")):
        mine = np.flatnonzero(batch.queue.gentype == gentype)
        with stages("horde"):
            horde[name] = _horde_wide(batch, gentype, mine, columns)
        if len(mine) == 0:
            continue
        aware = gentype == TEXT or options.eligible_image_wait
        with stages("eligibility"):
            # might_stall needs what each group could take, image included.
            elig = _eligibility(batch, gentype, mine, True)
            if aware:  # competition reads the distinct takeable rows; might_stall alone reads them per row later
                _ = elig.competition.distinct_takeable
        groups.update(
            {
                f"{name}_request_groups": elig.n_groups,
                f"{name}_special_groups": elig.n_special,
                f"{name}_worker_declarations": elig.n_declarations,
            }
        )
        forecast_queues.append(_forecasts.gentype_queue(batch.workers, gentype, elig, mine, horde[name]["mean_speed"]))
        forecast_throughput[mine] = elig.throughput
        columns["eligible_workers"][mine] = elig.workers
        columns["eligible_worker_threads"][mine] = elig.threads
        columns["is_possible"][mine] = (elig.workers > 0) | (batch.progress["processing"][mine] > 0)
        with stages("stall"):
            stall_sums.append(_stall(columns, batch, snapshot, gentype, mine, elig,
                                     found.among(mine, len(batch.queue.ids)), options))
        if not aware:
            _use_horde_figures(columns, mine)
            continue
        takes = elig.competition
        # What a request not yet created needs to be answered like the queue.
        queues[name] = QueueSignatures(mine, takes.signature, takes.n_signatures, takes.class_rows, takes.worker_class)
        with stages("competition"):
            ahead = _competition(batch, mine, elig, groups, name)
        with stages("figures"):
            _fill_figures(columns, batch, mine, elig, ahead)
    with stages("forecasts"):
        inputs = _forecasts.forecast_inputs(
            snapshot.now, batch.queue, snapshot.requests.expiry[batch.queue.index], batch.position, batch.work,
            batch.in_flight, columns, forecast_throughput, forecast_queues, options.forecast_skip)
        forecasts = _forecasts.forecast_all(snapshot, inputs, options.calibration, options.defer)

    return Estimates(
        forecasts=forecasts,
        deferred=inputs if options.defer else None,
        stall_sums=StallSums.concat(stall_sums),
        now=snapshot.now,
        request_id=batch.queue.ids,
        request_index=batch.queue.index,
        columns=columns,
        horde=horde,
        options=options,
        timings=stages.seconds,
        groups=groups,
        rejected=snapshot.rejected,
        competition=CompetitionState(
            workers=batch.workers,
            users=batch.users,
            priority=batch.queue.priority,
            jobs=batch.queue.n,
            output=batch.queue.output,
            by_gentype=queues,
        ),
    )


def _prepare(snapshot: Snapshot) -> _Batch:
    """Columns to arrays, queue order, excluded pairs and jobs in flight."""
    w = snapshot.workers
    user_codes, users = pd.factorize(np.concatenate([w.user_id, snapshot.requests.user_id]).astype(object))
    user_codes = user_codes.astype(np.int64)
    worker_index = pd.Index(w.id)
    wk = worker_arrays(snapshot, user_codes[: len(w)])
    rq = request_arrays(snapshot, user_codes[len(w) :], worker_index)
    request_index = pd.Index(rq.ids)
    pairs = snapshot.excluded_pairs
    ex_w = worker_index.get_indexer(pairs.worker_id) if len(pairs.worker_id) else np.zeros(0, np.int64)
    ex_r = request_index.get_indexer(pairs.request_id) if len(pairs.request_id) else np.zeros(0, np.int64)
    known = (ex_w >= 0) & (ex_r >= 0)
    in_flight, progress = _jobs_in_flight(snapshot, rq, worker_index, wk.speed, request_index)
    return _Batch(
        workers=wk,
        queue=rq,
        users=np.asarray(users, dtype=object),
        work=rq.n * rq.output,
        position=queue_positions(rq.priority, rq.created, rq.ids),
        excluded=(ex_w[known], ex_r[known]),
        in_flight=in_flight,
        progress=progress,
        worker_index=worker_index,
        request_index=request_index,
    )


def _empty_columns(batch: _Batch) -> dict[str, np.ndarray]:
    n = len(batch.queue.index)
    return {
        "gentype": batch.queue.gentype.astype(np.int8),
        "eligible_workers": np.zeros(n, dtype=np.int64),
        "eligible_worker_threads": np.zeros(n, dtype=np.int64),
        "is_possible": np.zeros(n, dtype=bool),
        "queue_position": np.zeros(n, dtype=np.int64),
        "wait_time": np.full(n, np.nan),
        "ahead_wait": np.full(n, np.nan),
        "horde_queue_position": np.zeros(n, dtype=np.int64),
        "horde_wait_time": np.full(n, np.nan),
        "fallback": np.zeros(n, dtype=bool),
        **batch.progress,
        **stall_columns(n),
    }


def _use_horde_figures(columns: dict[str, np.ndarray], rows: np.ndarray) -> None:
    """Requests without eligibility-aware figures are told the horde-wide ones."""
    columns["queue_position"][rows] = columns["horde_queue_position"][rows]
    columns["wait_time"][rows] = columns["horde_wait_time"][rows]


def _eligibility(batch: _Batch, gentype: int, mine: np.ndarray, aware: bool) -> Eligibility:
    """Eligibility of the waiting requests ``mine`` (all of ``gentype``)."""
    return eligibility(
        batch.workers,
        take_rows(batch.queue, mine),
        gentype,
        _excluded_among(batch, mine),
        with_competition=aware,
        # Signatures numbered by birth in queue order: competition's sweep reads short prefixes of them.
        queue_position=batch.position[mine],
    )


def _stall(columns: dict[str, np.ndarray], batch: _Batch, snapshot: Snapshot, gentype: int, mine: np.ndarray,
           elig: Eligibility, found: EventRows, options: EstimateOptions) -> StallSums:
    """might_stall and its figures for the waiting requests ``mine`` (SPEC section 7); the sums behind them."""
    pressure, sums = stall(snapshot, take_rows(batch.queue, mine), gentype, elig, batch.position[mine],
                           batch.progress["processing"][mine], _excluded_among(batch, mine),
                           len(snapshot.model_names), found, options.stall_sums, options.stall_refresh)
    for name, values in pressure.items():
        columns[name][mine] = values
    return sums


def _excluded_among(batch: _Batch, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The excluded pairs of the requests ``mine``, as (worker, position within ``mine``)."""
    in_mine = np.full(len(batch.queue.index), -1, dtype=np.int64)
    in_mine[mine] = np.arange(len(mine))
    ex_w, ex_r = batch.excluded
    sel = np.isin(ex_r, mine)
    return ex_w[sel], in_mine[ex_r[sel]]


@dataclass(frozen=True)
class _Ahead:
    """The competing requests ahead of each request with eligible threads."""

    eligible: np.ndarray  # positions in the gentype's requests
    count: np.ndarray
    jobs: np.ndarray
    work: np.ndarray


def _competition(batch: _Batch, mine: np.ndarray, elig: Eligibility, groups: dict[str, int], name: str) -> _Ahead:
    """Count, jobs and work ahead that each request's eligible workers could take."""
    takes = elig.competition
    eligible = np.flatnonzero(elig.threads > 0)
    # Requests whose eligible workers could take the same signatures compete
    # alike; rows are deduplicated per group, never per request.
    distinct, of = takes.distinct_takeable
    # The distinct rows are the classes as they are (competition ignores rows no member has):
    # copying out the used ones would be a fresh 114 MB at 20,000 x 1M, paid in page faults.
    klass = of[elig.row[eligible]]
    groups[f"{name}_signatures"] = takes.n_signatures
    groups[f"{name}_competition_classes"] = int(np.count_nonzero(np.bincount(klass, minlength=len(distinct))))
    count, jobs, work = competition(
        batch.position[mine],
        takes.signature,
        klass,
        distinct,
        takes.n_signatures,
        batch.queue.n[mine],
        batch.work[mine],
        eligible,
    )
    return _Ahead(eligible, count, jobs, work)


def _fill_figures(columns: dict[str, np.ndarray], batch: _Batch, mine: np.ndarray, elig: Eligibility, ahead: _Ahead) -> None:
    """Queue position, wait and ahead wait; requests with no eligible thread fall back."""
    at = mine[ahead.eligible]
    threads = elig.threads[ahead.eligible].astype(np.float64)
    throughput = elig.throughput[ahead.eligible]
    columns["queue_position"][at] = ahead.count
    columns["wait_time"][at] = figures.wait_time(
        ahead.work, ahead.jobs, batch.work[at], batch.queue.n[at], threads, throughput, batch.in_flight[at]
    )
    columns["ahead_wait"][at] = figures.ahead_wait(ahead.work, ahead.jobs, threads, throughput)
    fell_back = mine[elig.threads == 0]
    columns["fallback"][fell_back] = True
    _use_horde_figures(columns, fell_back)


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
    counts["waiting"] = figures.waiting_jobs(rq.jobs, counts["processing"], counts["finished"])

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


def _horde_wide(batch: _Batch, gentype: int, mine: np.ndarray, columns: dict[str, np.ndarray]) -> dict[str, float]:
    """Horde-wide totals of one gentype, and its requests' horde-wide figures (SPEC section 6)."""
    wk, rq, work = batch.workers, batch.queue, batch.work
    online = wk.online & (wk.gentype == gentype)
    n_online = int(online.sum())
    threads = int(wk.threads[online].sum())
    mean_speed = float(wk.speed[online].mean()) if n_online else float("nan")
    if len(mine):
        order = mine[np.argsort(batch.position[mine])]
        jobs_ahead = np.concatenate([[0], np.cumsum(rq.n[order])[:-1]])
        work_ahead = np.concatenate([[0], np.cumsum(work[order])[:-1]])
        columns["horde_queue_position"][order] = np.arange(len(order))
        if n_online and mean_speed > 0:
            rate = mean_speed * np.minimum(threads, jobs_ahead + rq.n[order])
            columns["horde_wait_time"][order] = (work_ahead + work[order]) / rate + batch.in_flight[order]
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
    snapshot: Snapshot, *, eligible_image_wait: bool = False, forecast_skip: Any = None, calibration: Any = None,
    defer: tuple[str, ...] = (), stall_sums: Any = None, stall_refresh: float = REFRESH_SECONDS,
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
    defer : tuple of str, optional
        Estimator names not run here: the forecasts stage's inputs are kept in
        ``Estimates.deferred`` instead, to run them later (off the job's cycle).
    stall_sums : StallSums, optional
        ``Estimates.stall_sums`` of the previous cycle: section 7's sums of a
        request are then computed again only once each ``stall_refresh``
        seconds of its age (and when its window reaches 120 s); in between,
        its evidence is judged at ``now`` from the kept sums, its eligible
        threads and whether a job is in flight. Without it (the default),
        every request's sums are computed: the figures are SPEC section 7's
        at ``now``.
    stall_refresh : float, default 60
        Seconds of a request's age between two computations of its sums
        (0: every cycle); the horde's own status path keeps them 60 s.

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
                              forecast_skip=forecast_skip, defer=tuple(defer), stall_sums=stall_sums,
                              stall_refresh=stall_refresh)
    with one_blas_thread():
        return compute(snapshot, options)
