"""The reworked eligible-share stage equals the per-worker computation it replaced.

Below the tests, the computation as it was on main at 0020357: eligible sets from a
second, worker-by-worker eligibility pass over one representative per eligibility
row, and sums by per-set prefix sums or per-column running sums over memberships.
The reworked stage reads the sets from the eligibility stage's tables
(``Eligibility.row_words``) and sums by :func:`_by_sets` or :func:`_by_blocks`;
both must give the same sets and the same sums on random hordes, with blocks made
tiny so that every carry across blocks and chunks is exercised.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import vecsched
from vecsched import synthetic
from vecsched.core import estimate as E
from vecsched.core import forecasts as F
from vecsched.core.arrays import take_rows
from vecsched.core.forecasts import ForecastInputs, GentypeQueue
from vecsched.core.groups import pack_words, unique_rows
from vecsched.snapshot.schema import IMAGE, TEXT
from vecsched.testing.strategies import hordes

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _queues(snapshot: vecsched.Snapshot) -> list[tuple[ForecastInputs, GentypeQueue, GentypeQueue]]:
    """Per gentype with waiting requests: the inputs, the reworked queue and the queue as before."""
    batch = E._prepare(snapshot)
    n = len(batch.queue.index)
    threads = np.zeros(n, dtype=np.int64)
    found = []
    for gentype in (TEXT, IMAGE):
        mine = np.flatnonzero(batch.queue.gentype == gentype)
        if len(mine) == 0:
            continue
        elig = E._eligibility(batch, gentype, mine, True)
        threads[mine] = elig.threads
        new = F.gentype_queue(batch.workers, gentype, elig, mine, 1.0)
        before = eligible_sets_by_worker(batch.workers, take_rows(batch.queue, mine), gentype,
                                         E._excluded_among(batch, mine), elig)
        found.append((new, GentypeQueue(gentype, mine, 1.0, lambda before=before: before)))
    inp = ForecastInputs(now=snapshot.now, gentype=batch.queue.gentype, position=batch.position, n=batch.queue.n,
                         work=batch.work, seconds_left=np.zeros(n), threads=threads, throughput=np.ones(n),
                         inflight=np.zeros(n))
    return [(inp, new, before) for new, before in found]


@EXAMPLES
@given(doc=hordes(max_workers=8, max_requests=16))
def test_sets_from_the_tables_equal_the_worker_by_worker_pass(doc: dict[str, Any]) -> None:
    note(json.dumps(doc))
    for _, new, before in _queues(vecsched.load_snapshot(doc)):
        got, want = new.eligible_sets(), before.eligible_sets()
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("path", ["_by_sets", "_by_blocks"])
@EXAMPLES
@given(doc=hordes(max_workers=8, max_requests=24), data=st.data())
def test_reworked_sums_equal_the_sums_before(doc: dict[str, Any], data: st.DataObject, path: str) -> None:
    note(json.dumps(doc))
    for inp, new, before in _queues(vecsched.load_snapshot(doc)):
        m = len(new.rows)
        wanted = data.draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=m, max_size=m).map(np.array)))
        set_of = new.eligible_sets()[0]
        asked = (set_of >= 0) & (True if wanted is None else wanted)
        with pytest.MonkeyPatch.context() as mp:
            # Tiny blocks and chunks: every carry between them is used.
            mp.setattr(F, "BLOCK_ROWS", data.draw(st.integers(1, 3)))
            mp.setattr(F, "MAX_BLOCK_ROWS", data.draw(st.integers(3, 5)))
            mp.setattr(F, "BLOCK", data.draw(st.integers(1, 40)))
            chosen = getattr(F, path)
            mp.setattr(F, "_by_sets", chosen)
            mp.setattr(F, "_by_blocks", chosen)
            got = F.shared_work_ahead(inp, new, wanted)
        for way in ("sets", "columns"):
            want = shared_work_ahead_before(inp, before, wanted, way)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g[asked], w[asked], rtol=1e-9, atol=1e-6)
                assert not g[~asked].any()  # nobody unasked is computed


def test_the_cost_rule_picks_sets_for_a_few_new_requests_and_blocks_for_all() -> None:
    snapshot = synthetic.horde(workers=60, requests=1500, seed=3)
    for inp, new, _ in _queues(snapshot):
        m = len(new.rows)
        # The request last in the queue: everyone with a set is ahead of it.
        last = np.argmax(np.where(new.eligible_sets()[0] >= 0, inp.position[new.rows], -1))
        picked = []
        for wanted in (None, np.arange(m) == last):
            calls: list[str] = []
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(F, "_by_sets", lambda q: calls.append("sets") or np.zeros((2, len(q.asked))))
                mp.setattr(F, "_by_blocks", lambda q: calls.append("blocks") or np.zeros((2, len(q.asked))))
                F.shared_work_ahead(inp, new, wanted)
            picked.append(calls)
        assert picked[0] == ["blocks"]
        assert picked[1] == ["sets"]  # one new request: one row of products


@pytest.mark.parametrize("share", [None, 0.05])
def test_blocks_make_the_same_floating_point_operations_as_the_loop_of_round_six(share: float | None) -> None:
    # Round seven takes a block whose every row is asked as it is (no row copy, one triangle): the
    # products and their operands are unchanged, so the sums are equal bit for bit, not only close.
    snapshot = synthetic.horde(workers=60, requests=1500, seed=5)
    rng = np.random.default_rng(5)
    for inp, new, _ in _queues(snapshot):
        wanted = None if share is None else rng.random(len(new.rows)) < share
        seen: list[Any] = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(F, "BLOCK_ROWS", 4)
            record = lambda q: seen.append(q) or np.zeros((2, len(q.asked)))  # noqa: E731
            mp.setattr(F, "_by_sets", record)
            mp.setattr(F, "_by_blocks", record)
            F.shared_work_ahead(inp, new, wanted)
        (q,) = seen
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(F, "BLOCK_ROWS", 4)
            got, want = F._by_blocks(q), _by_blocks_round_six(q)
        np.testing.assert_array_equal(got, want)
        assert want.any()


def _by_blocks_round_six(q: Any) -> np.ndarray:
    """:func:`vecsched.core.forecasts._by_blocks` as it was before round seven (ee7f8ad)."""
    n, n_asked = len(q.set_of), len(q.asked)
    out = np.zeros((2, n_asked))
    carry = np.zeros((q.masks.shape[1], 2))
    size = F._block_size(q)
    safe_set = np.maximum(q.set_of, 0)
    bounds = np.searchsorted(q.asked, np.arange(0, n + size, size))
    for b, first in enumerate(range(0, n, size)):
        last = min(first + size, n)
        units = q.units[:, first:last].T
        block = q.masks[safe_set[first:last]].astype(np.float64)
        lo, hi = bounds[b], bounds[b + 1]
        if hi > lo:
            local = q.asked[lo:hi] - first
            mine = block[local] * q.threads
            shared = mine @ block.T
            shared[np.arange(last - first)[None, :] >= local[:, None]] = 0
            out[:, lo:hi] = (mine @ carry + shared @ units).T
        carry += block.T @ units
    return out


# -- the computation before the rework ------------------------------------------------------


BEFORE_BLOCK = 1 << 22


def shared_work_ahead_before(
    inp: ForecastInputs, queue: GentypeQueue, wanted: np.ndarray | None = None, path: str | None = None
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
    sums = _before_by_sets if (dense_cost <= max(memberships, BEFORE_BLOCK) if path is None else path == "sets") else _before_by_columns
    return sums(member_set, sorted_set, charged, columns, column_threads, units, rank)


def _before_by_sets(set_of, sorted_set, charged, columns, column_threads, units, rank):  # type: ignore[no-untyped-def]
    """Per eligible set a: exclusive prefix sums of shared[a, set of j] x j's units, in queue order."""
    m = len(set_of)
    out = np.zeros((2, m))
    weighted = columns * column_threads[None, :]
    safe_set = np.maximum(sorted_set, 0)
    members = np.flatnonzero(set_of >= 0)
    by_set = members[np.argsort(set_of[members], kind="stable")]
    active = np.unique(set_of[members])  # only sets with a request to answer
    bounds = np.searchsorted(set_of[by_set], np.r_[active, len(columns)])
    step = max(1, BEFORE_BLOCK // max(m, 1))
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


def _before_by_columns(set_of, sorted_set, charged, columns, column_threads, units, rank):  # type: ignore[no-untyped-def]
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
    set_col, set_ptr = _before_set_columns(columns)
    sizes = np.diff(set_ptr)
    carry = np.zeros((2, columns.shape[1]))
    per_request = max(1, int(sizes.mean())) if len(sizes) else 1
    step = max(1, BEFORE_BLOCK // per_request)
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


def _before_set_columns(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of a boolean (sets x columns) matrix: column indices and row pointers."""
    rows, cols = np.nonzero(columns)
    ptr = np.r_[0, np.cumsum(np.bincount(rows, minlength=len(columns)))].astype(np.int64)
    return cols.astype(np.int64), ptr


def eligible_sets_by_worker(
    wk: Any, rq: Any, gentype: int, excluded: tuple[np.ndarray, np.ndarray], elig: Any
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
        with_competition=False, every_request_special=True,
    )
    rep_masks = again.eligible_workers[again.row - again.n_groups]
    set_first, set_of_rep = unique_rows(pack_words(rep_masks))
    set_of_row = np.full(int(rows_used.max()) + 1, -1, dtype=np.int64)
    set_of_row[elig.row[reps]] = set_of_rep.ravel()
    set_of = set_of_row[elig.row]
    set_of[elig.threads == 0] = -1
    return set_of, rep_masks[set_first], wk.threads[worker_rows]




@EXAMPLES
@given(doc=hordes(max_workers=8, max_requests=16))
def test_row_words_evaluate_special_rows_when_their_workers_were_not_kept(doc: dict[str, Any]) -> None:
    """Without competition the special groups' workers are not kept: row_words evaluates them itself."""
    note(json.dumps(doc))
    snapshot = vecsched.load_snapshot(doc)
    batch = E._prepare(snapshot)
    for gentype in (TEXT, IMAGE):
        mine = np.flatnonzero(batch.queue.gentype == gentype)
        if len(mine) == 0:
            continue
        kept = E._eligibility(batch, gentype, mine, True)
        lazy = E._eligibility(batch, gentype, mine, False)
        np.testing.assert_array_equal(kept.row, lazy.row)
        rows = np.unique(kept.row)
        np.testing.assert_array_equal(lazy.row_words(rows), kept.row_words(rows))


@given(data=st.data())
@settings(max_examples=200, deadline=None)
def test_queue_order_is_the_stable_argsort(data: st.DataObject) -> None:
    # Distinct positions take the scatter; ties, negatives and spread-out ones the sort.
    n = data.draw(st.integers(0, 40))
    kind = data.draw(st.sampled_from(["subset of a permutation", "any integers", "floats"]))
    if kind == "subset of a permutation":
        total = n + data.draw(st.integers(0, 5000))
        position = np.array(data.draw(st.permutations(range(total)))[:n], dtype=np.int64)
    elif kind == "any integers":
        position = np.array(data.draw(st.lists(st.integers(-3, 10**5), min_size=n, max_size=n)), dtype=np.int64)
    else:
        position = np.array(data.draw(st.lists(st.floats(0, 50), min_size=n, max_size=n)))
    np.testing.assert_array_equal(F.queue_order(position), np.argsort(position, kind="stable"))
