"""Shadow forecasts (SPEC.md section 8): named estimators, side by side, every cycle.

An *estimator* turns one cycle's arrays into *forecast columns*: for every
waiting request, p50 and p90 seconds to first assignment (``start``) and to
completion, and whether it predicts an unstarted expiry (``predicted_stall``).
Estimators are registered by name in :data:`ESTIMATORS`; the estimate's
``forecasts`` stage runs every registered one, and the service records what
each said at a request's first sighting. Adding one is writing a class with a
``name`` and a ``compute(snapshot, eligibility, calibration)`` method and
passing it to :func:`register` (see docs/forecasts.md).

``calibration`` is data the service layer reads from the stored pairs and
hands in (e.g. observed error quantiles); the core does no I/O. The two
estimators here ignore it: their p90 is the provisional rule of SPEC section 8,
``p50 + max(60 s, 50% of p50)``.

* ``compatible-queue-v1``: exactly SPEC section 8: the horde-wide queue through
  the request, at the horde-wide speed per thread times the request's eligible
  threads.
* ``eligible-share-v1``: SPEC section 5's wait where each request j ahead is
  charged only ``T(A(i) & A(j)) / T(A(j))`` of its work and jobs, the share of
  j's eligible threads that are also i's. A worker eligible for both could take
  j, so every j with a positive share competes with i. Computed per *eligible
  set* (the distinct worker sets of the request groups), never per pair of
  requests: cost grows with sets x queued requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import numpy as np
import pandas as pd

from vecsched.core.groups import pack_words, unique_rows
from vecsched.snapshot.schema import IMAGE, TEXT

FORECAST_FIELDS = ("start_p50", "start_p90", "completion_p50", "completion_p90", "predicted_stall")
P90_FLOOR_SECONDS = 60.0
P90_SHARE = 0.5
# Floats per temporary block of the eligible-share prefix sums.
BLOCK = 1 << 22


@dataclass(frozen=True)
class Forecast:
    """One estimator's forecast columns, aligned with the estimates' requests.

    Seconds as float64, NaN where unknown (null in the document).

    Examples
    --------
    >>> f = provisional(np.array([10.0, np.nan]), np.array([20.0, np.nan]), np.array([5.0, 5.0]))
    >>> f.start_p90.tolist()[0], bool(f.predicted_stall[0]), bool(f.predicted_stall[1])
    (70.0, True, True)
    """

    start_p50: np.ndarray
    start_p90: np.ndarray
    completion_p50: np.ndarray
    completion_p90: np.ndarray
    predicted_stall: np.ndarray

    def row(self, k: int) -> dict[str, Any]:
        """Entry ``k`` as the document's object (None for unknown)."""
        out: dict[str, Any] = {}
        for name in FORECAST_FIELDS[:4]:
            value = float(getattr(self, name)[k])
            out[name] = None if math.isnan(value) else value
        out["predicted_stall"] = bool(self.predicted_stall[k])
        return out

    def take(self, rows: np.ndarray) -> "Forecast":
        """The same columns restricted to ``rows``."""
        return Forecast(*(getattr(self, name)[rows] for name in FORECAST_FIELDS))


def provisional_p90(p50: np.ndarray) -> np.ndarray:
    """SPEC section 8's provisional p90: ``p50 + max(60 s, 0.5 * p50)`` (NaN stays NaN).

    Examples
    --------
    >>> provisional_p90(np.array([0.0, 100.0, 400.0])).tolist()
    [60.0, 160.0, 600.0]
    """
    return p50 + np.maximum(P90_FLOOR_SECONDS, P90_SHARE * p50)


def provisional(start_p50: np.ndarray, completion_p50: np.ndarray, seconds_left: np.ndarray) -> Forecast:
    """Forecast columns from two p50 columns by the provisional rule of SPEC section 8.

    A stall is predicted where the start p90 reaches the expiry, and where the
    start is unknown (no observed capacity).

    Examples
    --------
    >>> f = provisional(np.array([100.0]), np.array([150.0]), np.array([160.0]))
    >>> bool(f.predicted_stall[0]), f.completion_p90.tolist()
    (True, [225.0])
    """
    start_p90 = provisional_p90(start_p50)
    with np.errstate(invalid="ignore"):
        stall = np.isnan(start_p90) | (start_p90 >= seconds_left)
    return Forecast(start_p50, start_p90, completion_p50, provisional_p90(completion_p50), stall)


@dataclass(frozen=True)
class GentypeQueue:
    """One gentype's waiting requests as the eligibility stage left them.

    ``rows`` index the cycle's requests; ``eligible_sets`` is a callable
    returning ``(set_of, masks, worker_threads)``: each request's eligible
    worker set (-1 when no thread is eligible), one boolean row per set over
    the gentype's usable workers, and those workers' threads.
    """

    gentype: int
    rows: np.ndarray
    mean_speed: float
    eligible_sets: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class ForecastInputs:
    """What estimators read of one cycle: the ``eligibility`` argument of ``compute``.

    Per waiting request, aligned with the estimates: ``gentype`` codes, queue
    ``position`` (smaller is ahead), ``n`` jobs, ``work`` (``n`` x a job's
    output, tokens or pixel-steps), ``seconds_left`` to expiry, eligible
    ``threads`` and ``throughput`` (sum of speed x threads over A(i)), and
    ``inflight`` (the longest remaining time of its own jobs in flight).
    ``wanted``: the rows to forecast (None: all); an estimator may skip the
    others (the job wants only the requests it sees for the first time).
    """

    now: float
    gentype: np.ndarray
    position: np.ndarray
    n: np.ndarray
    work: np.ndarray
    seconds_left: np.ndarray
    threads: np.ndarray
    throughput: np.ndarray
    inflight: np.ndarray
    queues: tuple[GentypeQueue, ...] = ()
    # Rows whose forecasts are wanted (None: all); the others may be left unknown.
    wanted: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.gentype)


class Estimator(Protocol):
    """A named shadow estimator (see the module docstring)."""

    name: str

    def compute(self, snapshot: Any, eligibility: ForecastInputs, calibration: Mapping[str, Any] | None) -> Forecast:
        """Forecast columns for every waiting request of the cycle."""
        ...


ESTIMATORS: dict[str, Estimator] = {}


def register(estimator: Any) -> Any:
    """Add ``estimator`` (an instance, or a class made with no arguments) to :data:`ESTIMATORS`.

    Usable as a class decorator. A second estimator of a name replaces the first.

    Examples
    --------
    >>> sorted(ESTIMATORS)[:2]
    ['compatible-queue-v1', 'eligible-share-v1']
    """
    instance = estimator() if isinstance(estimator, type) else estimator
    ESTIMATORS[instance.name] = instance
    return estimator


def forecast_all(
    snapshot: Any,
    inputs: ForecastInputs,
    calibration: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Forecast]:
    """Every registered estimator's forecast columns, by name.

    ``calibration`` maps estimator names to what each was handed.
    """
    calibration = calibration or {}
    return {name: est.compute(snapshot, inputs, calibration.get(name)) for name, est in ESTIMATORS.items()}


def _unknown(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full(n, np.nan), np.full(n, np.nan)


@register
@dataclass(frozen=True)
class CompatibleQueueV1:
    """SPEC section 8's ``compatible-queue-v1``: horde-wide work through i, at v x min(T, jobs)."""

    name: str = "compatible-queue-v1"

    def compute(self, snapshot: Any, eligibility: ForecastInputs, calibration: Mapping[str, Any] | None) -> Forecast:
        """See the class docstring; ``snapshot`` and ``calibration`` are not read."""
        inp = eligibility
        start, completion = _unknown(len(inp))
        for queue in inp.queues:
            rows = queue.rows[np.argsort(inp.position[queue.rows], kind="stable")]
            if len(rows) == 0:
                continue
            jobs_through = np.cumsum(inp.n[rows])
            work_through = np.cumsum(inp.work[rows].astype(np.float64))
            threads = inp.threads[rows].astype(np.float64)
            v = queue.mean_speed
            known = threads > 0
            if not (v > 0):  # NaN (nobody online) or no speed at all
                continue
            ahead_jobs = jobs_through - inp.n[rows]
            with np.errstate(divide="ignore", invalid="ignore"):
                s = (work_through - inp.work[rows]) / (v * np.minimum(threads, ahead_jobs))
                c = work_through / (v * np.minimum(threads, jobs_through))
            s = np.where(ahead_jobs == 0, 0.0, s)
            start[rows] = np.where(known, s, np.nan)
            completion[rows] = np.where(known, c, np.nan)
        return provisional(start, completion, inp.seconds_left)


@register
@dataclass(frozen=True)
class EligibleShareV1:
    """SPEC section 5's wait, each request ahead charged the share of its threads that i's workers hold."""

    name: str = "eligible-share-v1"

    def compute(self, snapshot: Any, eligibility: ForecastInputs, calibration: Mapping[str, Any] | None) -> Forecast:
        """See the class docstring; ``snapshot`` and ``calibration`` are not read."""
        inp = eligibility
        start, completion = _unknown(len(inp))
        for queue in inp.queues:
            if len(queue.rows) == 0:
                continue
            wanted = None if inp.wanted is None else inp.wanted[queue.rows]
            jobs_ahead, work_ahead = shared_work_ahead(inp, queue, wanted)
            rows = queue.rows
            threads = inp.threads[rows].astype(np.float64)
            rate = inp.throughput[rows]
            own_jobs, own_work = inp.n[rows], inp.work[rows]
            with np.errstate(divide="ignore", invalid="ignore"):
                s = work_ahead / (rate * np.minimum(1.0, jobs_ahead / threads))
                c = (work_ahead + own_work) / (rate * np.minimum(1.0, (jobs_ahead + own_jobs) / threads))
            s = np.where(jobs_ahead <= 0, 0.0, s)
            known = (threads > 0) & (rate > 0) & (True if wanted is None else wanted)
            start[rows] = np.where(known, s, np.nan)
            completion[rows] = np.where(known, c + inp.inflight[rows], np.nan)
        return provisional(start, completion, inp.seconds_left)


def shared_work_ahead(
    inp: ForecastInputs, queue: GentypeQueue, wanted: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Jobs and work ahead of each request of ``queue``, each j charged T(A(i) & A(j)) / T(A(j)).

    Returns arrays aligned with ``queue.rows`` (only the ``wanted`` ones are
    computed when given). Requests with no eligible thread get 0 and are
    charged to nobody. Two equal ways to sum: per eligible
    set (sets x requests, dense; for small queues) or over the memberships of
    requests in *worker columns* (workers that belong to exactly the same sets),
    which costs the memberships alone.
    """
    set_of, masks, worker_threads = queue.eligible_sets()
    rows = queue.rows
    m = len(rows)
    if len(masks) == 0:
        return np.zeros(m), np.zeros(m)
    column_first, column_of = unique_rows(pack_words(np.ascontiguousarray(masks.T)))
    column_threads = np.bincount(column_of, weights=worker_threads, minlength=len(column_first))
    columns = masks[:, column_first]
    order = np.argsort(inp.position[rows], kind="stable")
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m)
    set_threads = columns.astype(np.float64) @ column_threads
    sorted_set = set_of[order]
    charged = sorted_set >= 0
    inverse = np.zeros(m)
    inverse[charged] = 1.0 / set_threads[sorted_set[charged]]
    units = np.stack([inp.n[rows][order] * inverse, inp.work[rows][order] * inverse])
    member_set = set_of if wanted is None else np.where(wanted, set_of, -1)
    dense_cost = len(np.unique(member_set[member_set >= 0])) * m
    memberships = int(columns.sum(axis=1)[sorted_set[charged]].sum())
    sums = _by_sets if dense_cost <= max(memberships, BLOCK) else _by_columns
    return sums(member_set, sorted_set, charged, columns, column_threads, units, rank)


def _by_sets(set_of, sorted_set, charged, columns, column_threads, units, rank):  # type: ignore[no-untyped-def]
    """Per eligible set a: exclusive prefix sums of shared[a, set of j] x j's units, in queue order."""
    m = len(set_of)
    out = np.zeros((2, m))
    weighted = columns * column_threads[None, :]
    safe_set = np.maximum(sorted_set, 0)
    members = np.flatnonzero(set_of >= 0)
    by_set = members[np.argsort(set_of[members], kind="stable")]
    active = np.unique(set_of[members])  # only sets with a request to answer
    bounds = np.searchsorted(set_of[by_set], np.r_[active, len(columns)])
    step = max(1, BLOCK // max(m, 1))
    for first in range(0, len(active), step):
        block = active[first : first + step]
        # shared[a, s] = T(A_a & A_s): the threads set a's workers share with set s.
        share = (weighted[block] @ columns.T.astype(np.float64))[:, safe_set] * charged[None, :]
        who = by_set[bounds[first] : bounds[min(first + step, len(active))]]
        local = np.searchsorted(block, set_of[who])
        for k in range(2):
            before = np.zeros((len(block), m + 1))
            np.cumsum(share * units[k][None, :], axis=1, out=before[:, 1:])
            out[k, who] = before[local, rank[who]]
    return out[0], out[1]


def _by_columns(set_of, sorted_set, charged, columns, column_threads, units, rank):  # type: ignore[no-untyped-def]
    """Per worker column c, over the (request, column) memberships only: Y_c(i) = the units of the
    requests ahead of i whose set holds c; request i sums t_c x Y_c(i) over the columns of its set.

    Cost: the memberships (requests x columns of their sets), a block of requests at a time in
    queue order; each column's running sum carries from block to block.
    """
    m = len(set_of)
    out = np.zeros((2, m))
    ranked = np.argsort(rank, kind="stable")[charged]  # charged rows, in queue order
    ranked_set = sorted_set[charged]
    unit = units[:, charged]
    set_col, set_ptr = _set_columns(columns)
    sizes = np.diff(set_ptr)
    carry = np.zeros((2, columns.shape[1]))
    per_request = max(1, int(sizes.mean())) if len(sizes) else 1
    step = max(1, BLOCK // per_request)
    for first in range(0, len(ranked), step):
        rows = slice(first, min(first + step, len(ranked)))
        k = ranked_set[rows]
        count = sizes[k]
        owner = np.repeat(np.arange(len(k)), count)  # membership -> request in the block (queue order)
        column = set_col[np.repeat(set_ptr[k] - np.r_[0, np.cumsum(count)[:-1]], count) + np.arange(int(count.sum()))]
        # Stable by column keeps queue order inside each column (a radix sort for small codes).
        key = column.astype(np.uint16) if columns.shape[1] <= 1 << 16 else column
        by_column = np.argsort(key, kind="stable")
        owner, column = owner[by_column], column[by_column]
        group_start = np.r_[0, np.flatnonzero(np.diff(column)) + 1]
        run = np.diff(np.r_[group_start, len(owner)])
        u = unit[:, rows][:, owner]
        cum = np.cumsum(u, axis=1)
        # Exclusive prefix within each column's run, plus what earlier blocks left in it.
        before = cum - u - np.repeat(cum[:, group_start] - u[:, group_start], run, axis=1)
        before += np.repeat(carry[:, column[group_start]], run, axis=1)
        before *= np.repeat(column_threads[column[group_start]], run)[None, :]
        for q in range(2):
            out[q, ranked[rows]] += np.bincount(owner, weights=before[q], minlength=len(k))
            carry[q, column[group_start]] += np.add.reduceat(u[q], group_start) if len(owner) else 0.0
    return out[0], out[1]


def _set_columns(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of a boolean (sets x columns) matrix: column indices and row pointers."""
    rows, cols = np.nonzero(columns)
    ptr = np.r_[0, np.cumsum(np.bincount(rows, minlength=len(columns)))].astype(np.int64)
    return cols.astype(np.int64), ptr


def queue_of(gentype: int) -> str:
    """The document name of a gentype code.

    Examples
    --------
    >>> queue_of(TEXT), queue_of(IMAGE)
    ('text', 'image')
    """
    return "text" if gentype == TEXT else "image"


def eligible_sets(
    wk: Any, rq: Any, gentype: int, excluded: tuple[np.ndarray, np.ndarray], vocabulary_size: int, elig: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's eligible worker set (see :class:`GentypeQueue`), from one request per eligibility row.

    The eligibility stage keeps sums per row (request group or special group),
    not worker lists; one representative per row is evaluated again worker by
    worker, so the sets come from the very same gates.
    """
    from vecsched.core.arrays import take_rows
    from vecsched.core.eligibility import eligibility

    rows_used, first = np.unique(elig.row, return_index=True)
    reps = first[elig.threads[first] > 0]
    worker_rows = np.flatnonzero(wk.usable & (wk.gentype == gentype))
    set_of = np.full(len(elig.row), -1, dtype=np.int64)
    if len(reps) == 0:
        return set_of, np.zeros((0, len(worker_rows)), dtype=bool), wk.threads[worker_rows]
    ex_workers, ex_requests = excluded
    local = np.full(len(elig.row), -1, dtype=np.int64)
    local[reps] = np.arange(len(reps))
    keep = local[ex_requests] >= 0 if len(ex_requests) else np.zeros(0, dtype=bool)
    again = eligibility(
        wk, take_rows(rq, reps), gentype, (ex_workers[keep], local[ex_requests[keep]]),
        vocabulary_size, with_competition=False, every_request_special=True,
    )
    rep_masks = again.eligible_workers[again.row - again.n_groups]
    set_first, set_of_rep = unique_rows(pack_words(rep_masks))
    set_of_row = np.full(int(rows_used.max()) + 1, -1, dtype=np.int64)
    set_of_row[elig.row[reps]] = set_of_rep.ravel()
    set_of = set_of_row[elig.row]
    set_of[elig.threads == 0] = -1
    return set_of, rep_masks[set_first], wk.threads[worker_rows]


def gentype_queue(
    wk: Any, rq: Any, gentype: int, excluded: tuple[np.ndarray, np.ndarray], vocabulary_size: int,
    elig: Any, rows: np.ndarray, mean_speed: float | None,
) -> GentypeQueue:
    """The :class:`GentypeQueue` of one gentype; its eligible sets are built only if an estimator asks."""
    built: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def sets() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not built:
            built.append(eligible_sets(wk, rq, gentype, excluded, vocabulary_size, elig))
        return built[0]

    speed = float("nan") if mean_speed is None else float(mean_speed)
    return GentypeQueue(gentype=gentype, rows=rows, mean_speed=speed, eligible_sets=sets)


def forecast_inputs(
    now: float, rq: Any, expiry: np.ndarray, position: np.ndarray, work: np.ndarray, inflight: np.ndarray,
    columns: Mapping[str, np.ndarray], throughput: np.ndarray, queues: list[GentypeQueue],
    skip: Any = None,
) -> ForecastInputs:
    """The :class:`ForecastInputs` of one cycle, from the arrays the estimate already holds."""
    return ForecastInputs(
        now=now,
        gentype=rq.gentype,
        position=position,
        n=rq.n,
        work=work,
        seconds_left=expiry - now,
        threads=columns["eligible_worker_threads"],
        throughput=throughput,
        inflight=inflight,
        queues=tuple(queues),
        wanted=None if skip is None else ~pd.Index(rq.ids).isin(pd.Index(list(skip))),
    )


def baseline_forecasts(estimates: Any) -> dict[str, Any]:
    """The published figures scored as forecasts, beside the estimators (no p90, no stall prediction).

    ``adr-wait``: start = ``ahead_wait``, completion = ``wait_time``;
    ``horde-wide``: both = ``horde_wait_time`` (the one figure the horde gives).
    """
    c = estimates.columns
    none = np.full(len(estimates), np.nan)
    never = np.zeros(len(estimates), dtype=bool)
    return {
        "adr-wait": Forecast(c["ahead_wait"], none, c["wait_time"], none, never),
        "horde-wide": Forecast(c["horde_wait_time"], none, c["horde_wait_time"], none, never),
    }
