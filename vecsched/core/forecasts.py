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
  j, so every j with a positive share competes with i. Read from the
  eligibility stage's rows (their distinct *eligible sets*), never per pair of
  requests: cost grows with requests x workers (see :func:`shared_work_ahead`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import numpy as np
import pandas as pd

from vecsched.core.groups import unique_rows, unpack_words
from vecsched.snapshot.schema import IMAGE, TEXT

FORECAST_FIELDS = ("start_p50", "start_p90", "completion_p50", "completion_p90", "predicted_stall")
# The forecast recorded for a request owed a late forecast (an estimator run off the main cycle) that left
# the queue before that estimator reached it: every p50 and p90 unknown, so it scores as a miss.
MISSED = {**{name: None for name in FORECAST_FIELDS[:4]}, "predicted_stall": False, "missed": True}
P90_FLOOR_SECONDS = 60.0
P90_SHARE = 0.5
# Floats per temporary block of the eligible-share sums.
BLOCK = 1 << 22
# Requests per block of the eligible-share block sums when every request is asked (the
# product inside a block costs block x workers per asked request, each block a few calls),
# and at most when few are (blocks that stay in cache).
BLOCK_ROWS = 16
MAX_BLOCK_ROWS = 128
# Time of a multiply-add against one pass over an element, measured at 2,000 x 50,000 on one
# BLAS thread: in one large product (the sets) and in the small in-block products.
PRODUCT_COST = 0.05
SMALL_PRODUCT_COST = 0.4
# Passes of the sets path over its (asked requests x sets) prefix table.
SETS_PASSES = 8.0


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
    defer: tuple[str, ...] = (),
) -> dict[str, Forecast]:
    """Every registered estimator's forecast columns, by name, but those named in ``defer``.

    ``calibration`` maps estimator names to what each was handed.
    """
    calibration = calibration or {}
    return {name: est.compute(snapshot, inputs, calibration.get(name)) for name, est in ESTIMATORS.items()
            if name not in defer}


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
            rows = queue.rows[queue_order(inp.position[queue.rows])]
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


def queue_order(position: np.ndarray) -> np.ndarray:
    """``np.argsort(position, kind="stable")``, by one scatter when the positions are distinct.

    The estimate's positions are a permutation of the cycle's requests, so a
    gentype's are distinct integers below the cycle's count: each is its own
    slot of a table, read in order (0.23 ms against 1.07 ms of CPU for a stable
    sort of 20,000 of 49,000). Anything else (ties, negatives, floats, or
    positions spread over more than 16 slots per request) is sorted.

    Examples
    --------
    >>> queue_order(np.array([7, 2, 5])).tolist(), queue_order(np.array([1, 0, 1])).tolist()
    ([1, 2, 0], [1, 0, 2])
    """
    n = len(position)
    if n == 0 or position.dtype.kind not in "iu" or position.min() < 0 or position.max() >= 16 * n + 4096:
        return np.argsort(position, kind="stable")
    slot = np.full(int(position.max()) + 1, -1, dtype=np.int64)
    slot[position] = np.arange(n)
    order = slot[slot >= 0]
    if len(order) != n:  # ties: a slot kept one of them
        return np.argsort(position, kind="stable")
    return order


def shared_work_ahead(
    inp: ForecastInputs, queue: GentypeQueue, wanted: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Jobs and work ahead of each request of ``queue``, each j charged T(A(i) & A(j)) / T(A(j)).

    Returns arrays aligned with ``queue.rows`` (only the ``wanted`` ones are
    computed when given). Requests with no eligible thread get 0 and are
    charged to nobody. Two equal ways to sum, the cheaper chosen (see
    :func:`_by_sets` and :func:`_by_blocks`); shared threads are products of
    0/1 worker rows and whole thread counts, exact in double precision.
    """
    set_of, masks, worker_threads = queue.eligible_sets()
    rows = queue.rows
    out = np.zeros((2, len(rows)))
    asked = set_of >= 0 if wanted is None else wanted & (set_of >= 0)
    if len(masks) == 0 or not asked.any():
        return out[0], out[1]
    threads = worker_threads.astype(np.float64)
    order = queue_order(inp.position[rows])
    # Requests behind the last one asked charge nobody who is asked.
    order = order[: int(np.flatnonzero(asked[order])[-1]) + 1]
    ranked = _RankedQueue(
        set_of=set_of[order],
        asked=np.flatnonzero(asked[order]),
        units=_units(inp, rows[order], set_of[order] >= 0),
        masks=masks,
        threads=threads,
    )
    sums = _by_sets if _sets_cost(ranked) <= _blocks_cost(ranked) else _by_blocks
    out[:, order[ranked.asked]] = sums(ranked)
    return out[0], out[1]


@dataclass(frozen=True)
class _RankedQueue:
    """One queue in queue order up to its last asked request, as the summations read it."""

    set_of: np.ndarray  # each request's eligible set (-1: none, charged nothing)
    asked: np.ndarray  # queue-order positions whose sums are wanted (each with a set)
    units: np.ndarray  # (2, requests): jobs and work over T(A(j)), 0 where uncharged
    masks: np.ndarray  # (sets, workers) boolean
    threads: np.ndarray  # each worker's threads (float64)


def _units(inp: ForecastInputs, rows: np.ndarray, charged: np.ndarray) -> np.ndarray:
    """Each request's jobs and work divided by its eligible threads T(A(j)) (0 where uncharged)."""
    inverse = np.zeros(len(rows))
    inverse[charged] = 1.0 / inp.threads[rows[charged]]
    return np.stack([inp.n[rows] * inverse, inp.work[rows] * inverse])


def _sets_cost(q: _RankedQueue) -> float:
    """Relative time of :func:`_by_sets` (element passes; a product's multiply-add is cheaper)."""
    n_sets, width = q.masks.shape
    asked_sets = len(np.unique(q.set_of[q.asked]))
    return n_sets * width * (1.0 + PRODUCT_COST * asked_sets) + SETS_PASSES * len(q.asked) * n_sets


def _blocks_cost(q: _RankedQueue) -> float:
    """Relative time of :func:`_by_blocks`: the carry's pass over every row and the in-block products."""
    width = q.masks.shape[1]
    return len(q.set_of) * width + SMALL_PRODUCT_COST * len(q.asked) * _block_size(q) * width


def _block_size(q: _RankedQueue) -> int:
    """Requests per block: few asked requests make longer blocks (fewer calls per carry update)."""
    spread = len(q.set_of) / max(len(q.asked), 1)
    return int(np.clip(BLOCK_ROWS * np.sqrt(spread), BLOCK_ROWS, MAX_BLOCK_ROWS))


def _by_sets(q: _RankedQueue) -> np.ndarray:
    """Per set a: its units before each asked request times T(A_a & A(i)), summed over a.

    shared[b, a] = T(A_b & A_a) for each asked set b and every set a is one
    product (asked sets x sets x workers); the units of set a before each
    asked request are a prefix over the gaps between asked requests.
    """
    asked_sets, asked_row = np.unique(q.set_of[q.asked], return_inverse=True)
    shared = (q.masks[asked_sets] * q.threads) @ q.masks.T.astype(np.float64)
    charged = np.flatnonzero(q.set_of >= 0)
    # Request j counts for the asked requests after it: gap = how many asked are at or before j.
    gap = np.searchsorted(q.asked, charged, side="right")
    n_sets, n_asked = len(q.masks), len(q.asked)
    out = np.zeros((2, n_asked))
    step = max(1, BLOCK // max(n_sets, 1))
    carry = np.zeros((2, n_sets))
    for first in range(0, n_asked, step):
        last = min(first + step, n_asked)
        mine = slice(*np.searchsorted(gap, [first, last]))  # gap never decreases in queue order
        # Set-major cells: the prefix over gaps runs along contiguous memory.
        cell = q.set_of[charged[mine]] * (last - first) + (gap[mine] - first)
        rows = shared[asked_row[first:last]]
        for k in range(2):
            before = np.bincount(cell, weights=q.units[k, charged[mine]], minlength=(last - first) * n_sets)
            before = np.cumsum(before.reshape(n_sets, last - first), axis=1) + carry[k][:, None]
            carry[k] = before[:, -1]
            out[k, first:last] = np.einsum("ak,ka->k", before, rows)
    return out


def _by_blocks(q: _RankedQueue) -> np.ndarray:
    """In queue order, a block of requests at a time: per worker, the units ahead whose set holds it
    (a carry), and inside a block the exact products T(A(i) & A(j)) of the asked rows with the block.

    Cost: the requests x workers (the carry) plus the asked x block size x workers.
    Its products are many and small: the estimate runs them on one BLAS thread
    (vecsched.core.threads; 20x the CPU time at 20,000 x 100,000 on two, docs/speed.md,
    "Forecasts at scale"). Each product keeps its operands' shapes and memory layouts: a
    transposed copy of the same numbers gives other last bits (docs/speed.md, round seven).
    """
    n, n_asked = len(q.set_of), len(q.asked)
    out = np.zeros((2, n_asked))
    carry = np.zeros((q.masks.shape[1], 2))  # per worker: units ahead whose set holds it
    size = _block_size(q)
    safe_set = np.maximum(q.set_of, 0)
    # Rows gathered as bytes by np.take: 10-30% less CPU than boolean fancy indexing (round seven).
    mask_bytes = q.masks.view(np.uint8)
    bounds = np.searchsorted(q.asked, np.arange(0, n + size, size))
    behind = np.arange(size)[None, :] >= np.arange(size)[:, None]  # a whole block's [i, j]: j not ahead of i
    for b, first in enumerate(range(0, n, size)):
        last = min(first + size, n)
        units = q.units[:, first:last].T  # (block, 2); 0 for uncharged requests
        block = np.take(mask_bytes, safe_set[first:last], axis=0).astype(np.float64)
        lo, hi = bounds[b], bounds[b + 1]
        if hi > lo:
            # Every row asked (the usual block when all are forecast): the block itself, no row copy.
            whole = hi - lo == size
            local = q.asked[lo:hi] - first
            mine = (block if whole else block[local]) * q.threads  # (asked in block, workers)
            shared = mine @ block.T  # exact integers
            shared[behind if whole else np.arange(last - first)[None, :] >= local[:, None]] = 0  # only j ahead of i
            out[:, lo:hi] = (mine @ carry + shared @ units).T
        carry += block.T @ units
    return out


def queue_of(gentype: int) -> str:
    """The document name of a gentype code.

    Examples
    --------
    >>> queue_of(TEXT), queue_of(IMAGE)
    ('text', 'image')
    """
    return "text" if gentype == TEXT else "image"


def eligible_sets(elig: Any, worker_threads: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's eligible worker set (see :class:`GentypeQueue`), from the eligibility stage's rows.

    ``elig`` is the stage's :class:`~vecsched.core.eligibility.Eligibility`:
    requests of one row share their eligible workers, which ``elig.row_words``
    reads (packed) from the same tables and gates the sums came from. Sets are numbered
    in the order of their packed rows; ``worker_threads`` are the gentype's
    usable workers' threads.
    """
    rows_used, first = np.unique(elig.row, return_index=True)
    reps = first[elig.threads[first] > 0]
    set_of = np.full(len(elig.row), -1, dtype=np.int64)
    n_workers = len(worker_threads)
    if len(reps) == 0:
        return set_of, np.zeros((0, n_workers), dtype=bool), worker_threads
    words = elig.row_words(elig.row[reps])
    set_first, set_of_rep = unique_rows(words)
    set_of_row = np.full(int(rows_used.max()) + 1, -1, dtype=np.int64)
    set_of_row[elig.row[reps]] = set_of_rep.ravel()
    set_of = set_of_row[elig.row]
    set_of[elig.threads == 0] = -1
    return set_of, unpack_words(words[set_first], n_workers), worker_threads


def gentype_queue(wk: Any, gentype: int, elig: Any, rows: np.ndarray, mean_speed: float | None) -> GentypeQueue:
    """The :class:`GentypeQueue` of one gentype; its eligible sets are built only if an estimator asks."""
    built: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def sets() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not built:
            built.append(eligible_sets(elig, wk.threads[elig.worker_rows]))
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


def owed_forecast_rows(
    owed_ids: list[str], gentype: list[str], expiry: list[float], waiting_ids: Any, forecasts: Mapping[str, Any],
) -> list[tuple[str, str, float, dict[str, Any]]]:
    """The rows :meth:`~vecsched.core.pairing.ForecastRecorder.record_forecasts` takes for requests owed a late forecast.

    Each owed request gets every forecast of ``forecasts`` (their rows line up
    with ``waiting_ids``, the requests of the snapshot the late estimators ran
    on), or :data:`MISSED` where that snapshot no longer holds it. One rule for
    the service's replay lane and the simulator's scoring of it.

    Examples
    --------
    >>> rows = owed_forecast_rows(["gone"], ["text"], [900.0], [], {"dispatch-replay-v1": None})
    >>> rows[0][3]["dispatch-replay-v1"]["missed"]
    True
    """
    at = pd.Index(waiting_ids).get_indexer(owed_ids) if len(waiting_ids) else np.full(len(owed_ids), -1)
    return [(rid, g, e, {name: (f.row(k) if k >= 0 else MISSED) for name, f in forecasts.items()})
            for rid, g, e, k in zip(owed_ids, gentype, expiry, at.tolist())]


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
