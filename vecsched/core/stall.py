"""might_stall for every waiting request (SPEC.md section 7), in one vectorized pass.

For waiting request i with nothing in flight, over the window from
max(created, now - 300 s) to now split at its midpoint, section 7 weighs the
pops by i's eligible workers (were they given to work placed before i?), the
capacity those workers returned, and the work that arrived ahead of i.

Requests of one eligibility row (request group or special group, see
:mod:`vecsched.core.eligibility`) share their eligible workers A(i) and their
takeable signatures, so the events a request may see are found per row, from
the row's worker membership. Requests whose window is the full 300 s share
one window and midpoint: their returns are per-row sums, their dispatches and
arrivals prefix sums over events sorted by queue key (see
:mod:`vecsched.core.stall_prefix`). Requests created within the window read
sums below their own creation time and midpoint, and above their own
priority, from binned matrix products of the rows' memberships
(:mod:`vecsched.core.stall_sums`); only a request's own pops, priority passes
that list its owner, arrivals tied with it on (priority, created) and pops
recorded before their request's creation are judged pair by pair. No Python
loop runs over requests, workers or events.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from vecsched.core.arrays import RequestArrays, take_rows
from vecsched.core.eligibility import Eligibility
from vecsched.core.groups import pick_columns, positions_among, unique_rows, unpack_words
from vecsched.core.stall_cache import REFRESH_SECONDS, StallSums
from vecsched.core.stall_prefix import prefix_arrivals, prefix_sums, takeable_rows
from vecsched.core.stall_sums import (
    RowSets,
    binned_sums,
    bounded_unique,
    dominance_sums,
    expand_ranges,
    row_sets,
    rows_product,
)
from vecsched.snapshot.schema import TEXT
from vecsched.snapshot.snapshot import Snapshot

WINDOW_SECONDS = 300.0
MIN_WINDOW_SECONDS = 120.0
PAIRS_PER_CHUNK = 1 << 22
TOP_LEVEL = np.iinfo(np.int64).max  # a priority pass precedes whatever the priority
# Most word ORs (runs of eight workers x distinct rows x arriving signature words) for which takeable_rows forms
# the rows' takeable signatures (about 2-4 ns each; realistic 2,000 x 50,000 image: 31M, 0.06 s against 0.35 s
# for Takes.takeable; 2,000 x 400,000 image: 379M, 1.6 s against 3.2 s). Above it (many workers, or
# signatures: 20,000 x 1M, adversarial hordes) Takes.takeable's walk over model keys is cheaper.
TAKEABLE_WORD_ORS = 1 << 29

# Evidence, in the order section 7 tries them; the code is the position.
EVIDENCE = (
    "none_eligible",
    "insufficient_window",
    "incomplete_return_history",
    "insufficient_replacement",
    "target_opportunity_seen",
    "compatible_capacity_returning",
    "preceding_arrivals_not_outpacing_drain",
    "arrival_outpaces_drain",
)
NO_EVIDENCE = -1  # a job of the request is processing: evidence null
STALLING = EVIDENCE.index("arrival_outpaces_drain")

INT_COLUMNS = ("dispatch_opportunities", "lost_opportunities", "returned_capacity", "active_preceding_dispatches")
FLOAT_COLUMNS = ("arriving_work", "returned_work")


@dataclass(frozen=True)
class Events:
    """The dispatches and returns of one gentype's usable workers in the last 300 s.

    Worker positions (``worker``) index the gentype's usable workers, in the
    order :func:`~vecsched.core.eligibility.eligibility` numbers them.
    """

    d_time: np.ndarray
    d_worker: np.ndarray
    d_priority: np.ndarray
    d_created: np.ndarray
    d_priority_pass: np.ndarray
    d_work: np.ndarray
    d_active: np.ndarray
    d_request: np.ndarray  # position among the gentype's waiting requests, -1 if not waiting
    d_users: pd.DataFrame  # (dispatch, user id) of priority passes
    c_time: np.ndarray
    c_worker: np.ndarray
    c_matched: np.ndarray
    c_work: np.ndarray


def stall_columns(n: int) -> dict[str, np.ndarray]:
    """The section 7 columns of ``n`` requests before any is computed: no stall, evidence null."""
    columns: dict[str, np.ndarray] = {name: np.zeros(n, np.int64) for name in INT_COLUMNS}
    columns.update({name: np.zeros(n) for name in FLOAT_COLUMNS})
    columns["might_stall"] = np.zeros(n, bool)
    columns["stall_evidence"] = np.full(n, NO_EVIDENCE, np.int8)
    return columns


def evidence_names(codes: np.ndarray) -> list[str | None]:
    """Evidence codes as the document's strings (None for null).

    Examples
    --------
    >>> evidence_names(np.array([0, -1, 7], dtype=np.int8))
    ['none_eligible', None, 'arrival_outpaces_drain']
    """
    names = np.array((None,) + EVIDENCE, dtype=object)
    return names[codes.astype(np.int64) + 1].tolist()


@dataclass(frozen=True)
class EventRows:
    """Where each dispatch and return of a snapshot points, its ids looked up once per snapshot.

    Both gentypes read the same tables: the dispatch ids are joined and the
    worker and request ids looked up once, then each gentype keeps its own by
    integer positions (:func:`window_events`).
    """

    returns_of: np.ndarray  # each return's dispatch row (-1: unknown)
    d_worker: np.ndarray  # each dispatch's worker row of the snapshot (-1: unknown)
    c_worker: np.ndarray  # each return's worker row (-1: unknown)
    d_request: np.ndarray  # each dispatch's request among the waiting requests indexed (-1: not waiting)

    def among(self, requests: np.ndarray, n_requests: int) -> EventRows:
        """These rows with ``d_request`` renumbered among ``requests`` (positions of the indexed waiting requests)."""
        return replace(self, d_request=positions_among(requests, n_requests)[self.d_request])


def event_rows(snapshot: Snapshot, worker_index: pd.Index, request_index: pd.Index) -> EventRows:
    """:class:`EventRows` of ``snapshot``; ``worker_index`` holds its worker ids by row, ``request_index`` the waiting requests' ids."""
    d, c = snapshot.dispatches, snapshot.capacity_returns

    def rows(index: pd.Index, ids: np.ndarray) -> np.ndarray:
        return index.get_indexer(ids).astype(np.int64, copy=False) if len(ids) and len(index) else np.full(len(ids), -1)

    return EventRows(
        returns_of=rows(pd.Index(d.dispatch_id), c.dispatch_id),
        d_worker=rows(worker_index, d.worker_id),
        c_worker=rows(worker_index, c.worker_id),
        d_request=rows(request_index, d.request_id),
    )


def window_events(snapshot: Snapshot, found: EventRows, worker_rows: np.ndarray) -> Events:
    """Section 7's events that any request can see, as arrays; ``worker_rows`` are the gentype's usable workers.

    ``found`` gives each event's rows, with ``d_request`` among the gentype's waiting requests.
    """
    now = snapshot.now
    d, c = snapshot.dispatches, snapshot.capacity_returns
    local = positions_among(worker_rows, len(snapshot.workers.id))
    returns_of = found.returns_of
    returned = np.zeros(len(d), bool)
    returned[returns_of[returns_of >= 0]] = True
    lw = local[found.d_worker]
    # A pop counts only from the capability state its worker is still in.
    state_now = snapshot.workers.state[np.maximum(found.d_worker, 0)] if len(worker_rows) else d.worker_state
    keep = (lw >= 0) & (d.dispatched_at >= now - WINDOW_SECONDS) & (d.dispatched_at <= now)
    keep &= np.asarray(state_now == d.worker_state, dtype=bool) if len(d) else keep
    kept = np.flatnonzero(keep)
    users = d.priority_user_ids.take(kept)
    pp = d.selected_from_priority_queue[kept]
    d_users = pd.DataFrame({"dispatch": users.owners(), "user": users.values})
    d_users = d_users[pp[d_users["dispatch"].to_numpy()]]

    clw = local[found.c_worker]
    ckeep = np.flatnonzero((clw >= 0) & (c.returned_at >= now - WINDOW_SECONDS) & (c.returned_at <= now))
    which = returns_of[ckeep]
    return Events(
        d_time=d.dispatched_at[kept],
        d_worker=lw[kept],
        d_priority=d.request_extra_priority[kept],
        d_created=d.request_created[kept],
        d_priority_pass=pp,
        d_work=d.assigned_work[kept],
        d_active=~returned[kept],
        d_request=found.d_request[kept],
        d_users=d_users,
        c_time=c.returned_at[ckeep],
        c_worker=clw[ckeep],
        c_matched=which >= 0,
        c_work=np.where(which >= 0, d.assigned_work[np.maximum(which, 0)] if len(d) else 0.0, 0.0),
    )


def membership_words(elig: Eligibility, rows: np.ndarray) -> np.ndarray:
    """Row ``k``: the usable workers of the gentype in A(i) for the requests i of row ``rows[k]``, as words.

    Read from the eligibility stage's own tables (``Eligibility.row_words``:
    declarations for shared groups, the kept workers of special groups), not
    evaluated again (:func:`~vecsched.core.groups.pack_words` rows).
    """
    if elig.row_words is None:
        raise ValueError("might_stall needs the eligibility stage's row tables (Eligibility.row_words)")
    return elig.row_words(rows)


def distinct_rows(words: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """``(matrix, of)``: the distinct rows of packed ``words`` as a boolean matrix, and each row's place in it.

    Examples
    --------
    >>> from vecsched.core.groups import pack_words
    >>> matrix, of = distinct_rows(pack_words(np.array([[1, 0], [0, 1], [1, 0]], dtype=bool)), 2)
    >>> matrix[of].astype(int).tolist()
    [[1, 0], [0, 1], [1, 0]]
    >>> len(matrix)
    2
    """
    first, of = unique_rows(np.ascontiguousarray(words))
    return unpack_words(words[first], n_cols), of


def _row_tables(elig: Eligibility, rows: np.ndarray, history: bool, arriving: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(member, member_of, takeable, takeable_of)``: the distinct rows of the ``rows``' eligible workers and takeable signatures.

    Rows alike in a matrix share one of its rows: every sum over a row's
    columns is read once for them. Without ``history`` no worker's membership
    matters (a one-cell matrix). Takeable signatures are kept only for the
    ``arriving`` ones (those of requests created in the window: no
    other is read), column ``k`` for ``arriving[k]``, so rows that differ only
    elsewhere are one. They are read from the eligibility stage when it formed
    them (text competition does), else ORed from the distinct rows' eligible
    workers (:func:`~vecsched.core.stall_prefix.takeable_rows`) when that is
    cheap (:data:`TAKEABLE_WORD_ORS`): forming every row of ``Takes.takeable``
    for image cost more than the rest of the stage's image arrivals.
    """
    words = membership_words(elig, rows)
    first, alike = unique_rows(np.ascontiguousarray(words))
    if history:
        member, member_of = unpack_words(words[first], len(elig.worker_rows)), alike
    else:
        member, member_of = np.zeros((1, 1), bool), np.zeros(len(rows), np.int64)
    takes = elig.competition
    if takes is None:
        return member, member_of, None, None
    cached = set(getattr(takes, "__dict__", {}))  # the cached properties the eligibility stage read
    class_rows = pick_columns(takes.class_rows, arriving)
    word_ors = -(-len(elig.worker_rows) // 8) * len(first) * class_rows.shape[1]  # takeable_rows' cost
    if "takeable" not in cached and word_ors <= TAKEABLE_WORD_ORS:
        signatures = takeable_rows(words[first], class_rows[takes.worker_class])[alike]
    elif cached & {"takeable", "distinct_takeable"}:
        # The rows' distinct takeable rows as the stage formed them, cut to the arriving columns.
        every, every_of = takes.distinct_takeable
        used, used_of = np.unique(every_of[rows], return_inverse=True)
        takeable, of = distinct_rows(pick_columns(every[used], arriving), len(arriving))
        return member, member_of, takeable, of[used_of.ravel()]
    else:  # too many workers x rows x signatures to OR them eight workers at a time: the stage's walk over model keys
        distinct, of = takes.rows_of(class_rows)
        signatures = distinct[of[rows]]
    return member, member_of, *distinct_rows(signatures, len(arriving))


def stall(
    snapshot: Snapshot,
    rq: RequestArrays,
    gentype: int,
    elig: Eligibility,
    position: np.ndarray,
    processing: np.ndarray,
    excluded: tuple[np.ndarray, np.ndarray],
    vocabulary_size: int,
    found: EventRows,
    kept: StallSums | None = None,
    refresh: float = REFRESH_SECONDS,
) -> tuple[dict[str, np.ndarray], StallSums]:
    """Section 7 for the waiting requests ``rq`` of one gentype.

    ``elig`` is their eligibility with competition (``takeable`` and
    ``signature``); ``position`` their queue positions; ``processing`` their
    jobs in flight; ``excluded`` (worker row, position in ``rq``) pairs;
    ``found`` the snapshot's :class:`EventRows` with ``d_request`` among
    ``rq`` (:meth:`EventRows.among`). Returns ``stall_evidence`` (an
    ``int8`` code into :data:`EVIDENCE`, -1 for null), ``might_stall`` and
    the pressure figures, aligned with ``rq``; and the sums of the requests
    they were computed for, for the next cycle. The sums of ``kept`` that
    still hold (:meth:`StallSums.kept`, every ``refresh`` seconds of a
    request's age) are used instead of computing them again; the evidence is
    judged from them at ``now``.
    """
    n = len(rq.ids)
    now = snapshot.now
    out: dict[str, np.ndarray] = {name: np.zeros(n, np.int64) for name in INT_COLUMNS}
    out.update({name: np.zeros(n) for name in FLOAT_COLUMNS})
    start = np.maximum(rq.created, now - WINDOW_SECONDS)
    middle = start + (now - start) / 2
    waits = processing == 0
    threads = elig.threads
    looked = np.flatnonzero(waits & (threads > 0))
    halves = np.zeros((4, n))  # arriving first, second; returned first, second
    counts = np.zeros((2, n), np.int64)  # matched returns per half
    incomplete = np.zeros(n, bool)
    evaluated_at = np.full(n, now)
    computed = looked
    if kept is not None and len(looked):
        in_kept, holds = kept.kept(rq.ids[looked], rq.created[looked], now=now, refresh=refresh,
                                   min_window=MIN_WINDOW_SECONDS)
        held, source = looked[holds], in_kept[holds]
        counts[:, held], halves[:, held] = kept.counts[:, source], kept.halves[:, source]
        incomplete[held], evaluated_at[held] = kept.incomplete[source], kept.evaluated_at[source]
        for name, values in zip(INT_COLUMNS, kept.figures[:, source]):
            out[name][held] = values
        computed = looked[~holds]
    if len(computed):
        unit = rq.output.astype(np.float64) if gentype == TEXT else rq.output / 1e6
        context = _Context(now, rq, start, middle, unit, position, snapshot.requests.user_id[rq.index],
                           window_events(snapshot, found, elig.worker_rows), elig.competition)
        context.out, context.halves, context.counts, context.incomplete = out, halves, counts, incomplete
        _sums(context, elig, computed)
    evidence = np.full(n, NO_EVIDENCE, np.int8)
    conditions = [
        threads == 0,
        now - start < MIN_WINDOW_SECONDS,
        incomplete,
        np.minimum(counts[0], counts[1]) < threads,
        (out["dispatch_opportunities"] == 0) | (out["lost_opportunities"] < out["dispatch_opportunities"]),
        out["active_preceding_dispatches"] < threads,
        (halves[0] <= halves[2]) | (halves[1] <= halves[3]),
    ]
    evidence[waits] = np.select([c[waits] for c in conditions], range(len(conditions)), STALLING)
    out["arriving_work"] = halves[0] + halves[1]
    out["returned_work"] = halves[2] + halves[3]
    out["stall_evidence"] = evidence
    out["might_stall"] = evidence == STALLING
    sums = StallSums.of(rq.ids[looked], created=rq.created[looked], evaluated_at=evaluated_at[looked],
                        counts=counts[:, looked], halves=halves[:, looked], incomplete=incomplete[looked],
                        figures=np.stack([out[name][looked] for name in INT_COLUMNS]))
    return out, sums


def _sums(context: _Context, elig: Eligibility, looked: np.ndarray) -> None:
    """Add section 7's sums of the requests ``looked`` (waiting, with eligible threads) to ``context``'s."""
    rows, row_of = np.unique(elig.row[looked], return_inverse=True)
    ev, takes = context.ev, elig.competition
    member, member_of, takeable, takeable_of = _row_tables(elig, rows, len(ev.d_time) + len(ev.c_time) > 0,
                                                           context.arriving)
    # Each matrix once with its sparser side compressed, for every sum that reads it.
    context.member_sets = row_sets(member)
    context.takeable_sets = None if takes is None else row_sets(takeable)
    member_row = member_of[row_of]
    _shared_returns(context, member, member_row, looked)
    _recent_by_time(context, member, member_row, looked)
    _shared_dispatches(context, member, member_row, looked)
    _recent_dispatches(context, member, member_row, looked)
    if takes is not None:
        context.halves[:2] += _shared_window(context, takeable, takeable_of[row_of], looked)
        context.halves[:2] += _recent_window(context, takeable, takeable_of[row_of], looked)


def _arriving_signatures(takes, rq: RequestArrays, now: float) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(signature, arriving)``: the signatures of the requests created in the window (in row order), and each request's
    place among them (-1 for the others), the columns of :func:`_row_tables`' takeable matrix.

    Only arrivals are read by signature; signatures of no arrival (many requests naming several models have one
    of their own) would only widen every row. With no arrival one column stands in, never read.
    """
    if takes is None:
        return None, None
    arrived = (rq.created >= now - WINDOW_SECONDS) & (rq.created <= now)
    arriving = np.unique(takes.signature[arrived]) if arrived.any() else np.zeros(1, np.int64)
    # Columns in the signatures' row order (TakeTables.appearance), whichever numbering competition reads:
    # the float sums over columns then add in one order.
    arriving = arriving[np.argsort(takes.appearance[arriving])]
    column = np.full(takes.n_signatures, -1, np.int64)
    column[arriving] = np.arange(len(arriving))
    return column[takes.signature], arriving


def _shared_window(context: _Context, takeable: np.ndarray, row_of: np.ndarray, looked: np.ndarray) -> np.ndarray:
    """Arriving work from waiting requests, per half, of the requests whose window is the full 300 s."""
    n = len(context.rq.ids)
    out = np.zeros((2, n))
    shared = context.start[looked] == context.now - WINDOW_SECONDS
    k, arrived = looked[shared], context.arrived
    if len(k) == 0 or len(arrived) == 0:
        return out
    out[:, k] = prefix_arrivals(
        takeable=context.takeable_sets,
        request_row=row_of[shared],
        request_position=context.position[k],
        arrival_position=context.position[arrived],
        arrival_signature=context.signature[arrived],
        arrival_work=context.arrived_work,
        second_half=context.rq.created[arrived] >= context.middle[k[0]],
    )
    return out


def _shared_returns(context: _Context, member: np.ndarray, row_of: np.ndarray, looked: np.ndarray) -> None:
    """Matched returns, their work per half and incompleteness, per row, for the requests whose window is the full 300 s."""
    ev = context.ev
    shared = context.rq.created[looked] < context.now - WINDOW_SECONDS
    k = looked[shared]
    if len(k) == 0 or len(ev.c_time) == 0:
        return
    second = ev.c_time >= context.middle[k[0]]
    width = member.shape[1]
    columns = [(~ev.c_matched, None)] + [(ev.c_matched & (second == h), None) for h in (0, 1)]
    columns += [(ev.c_matched & (second == h), ev.c_work) for h in (0, 1)]
    per_worker = np.stack(
        [np.bincount(ev.c_worker[m], weights=None if w is None else w[m], minlength=width) for m, w in columns], axis=1
    )
    per_row = _per_row(member, row_of[shared], per_worker.astype(np.float64))
    context.incomplete[k] |= per_row[:, 0] > 0
    for h in (0, 1):
        context.counts[h][k] += np.rint(per_row[:, 1 + h]).astype(np.int64)
        context.halves[2 + h][k] += per_row[:, 3 + h]
    context.out["returned_capacity"][k] += np.rint(per_row[:, 1] + per_row[:, 2]).astype(np.int64)


def _per_row(member: np.ndarray, rows: np.ndarray, per_worker: np.ndarray) -> np.ndarray:
    """``member[rows] @ per_worker``, each distinct row once (only the queried rows, not every row of ``member``)."""
    distinct, at = bounded_unique(rows, len(member))
    return rows_product(member, distinct, per_worker)[at]


def _recent_by_time(context: _Context, member: np.ndarray, row_of: np.ndarray, looked: np.ndarray) -> None:
    """One pass for the requests created within the window: their returns, and the sums of their pops.

    Every sum is read below each request's start c and after (every event
    kept is at or before now, so the sums after are the row's totals); the
    sums split into halves (matched returns and their work, arriving pops)
    are also read below the midpoint, over those items alone. Halves are
    differences of those sums. Items (columns of ``weights``):

    * matched returns, by time: count, work;
    * pops (those not recorded before their request's creation), by time:
      priority passes, active ones; the other pops and active ones (before c
      they are ahead of a request of the lowest priority); every pop is the
      sum of the two kinds;
    * for requests at the lowest priority of the pops, the pops that precede
      them and arrive: priority passes or higher priority, by creation (work,
      count); and the other pops ahead by queue key: higher priority (read as
      created at -inf), or the lowest priority created before c (count,
      active).

    Unmatched returns, rare, are read on their own: one weight fewer for
    every other item. The pops' sums are kept in ``context.by_time`` for
    :func:`_recent_dispatches`.
    """
    ev = context.ev
    recent = context.rq.created[looked] >= context.now - WINDOW_SECONDS
    k, rows = looked[recent], row_of[recent]
    context.by_time = None
    if len(k) == 0 or len(ev.c_time) + len(ev.d_time) == 0:
        return
    d = np.flatnonzero(ev.d_created <= ev.d_time)
    context.lowest = int(ev.d_priority[d].min()) if len(d) else 0
    pp, active, prio = ev.d_priority_pass[d].astype(bool), ev.d_active[d].astype(bool), ev.d_priority[d]
    arriving, plain = np.flatnonzero(pp | (prio > context.lowest)), np.flatnonzero(~pp)
    matched = np.flatnonzero(ev.c_matched)
    groups = [  # (item columns, item x, weights, which weights are split into halves)
        (ev.c_worker[matched], ev.c_time[matched], [np.ones(len(matched)), ev.c_work[matched]], [True, True]),
        (ev.d_worker[d], ev.d_time[d], [pp, pp & active, ~pp, ~pp & active], [False] * 4),
        (ev.d_worker[d[arriving]], ev.d_created[d[arriving]], [ev.d_work[d[arriving]], np.ones(len(arriving))],
         [True, True]),
        (ev.d_worker[d[plain]], np.where(prio[plain] > context.lowest, -np.inf, ev.d_created[d[plain]]),
         [np.ones(len(plain)), active[plain]], [False, False]),
    ]
    start = context.start[k]
    # A request created after now has no window: its midpoint falls before its start.
    below = _by_time_sums(context.member_sets, rows, start, np.maximum(context.middle[k], start), groups)
    pops = below[2:6]
    context.by_time = np.concatenate([pops[0:1] + pops[2:3], pops, below[6:]])  # every pop first
    context.arriving_pops = d[arriving]
    unmatched = np.flatnonzero(~ev.c_matched)
    if len(unmatched):
        seen = binned_sums(sets=context.member_sets, query_row=rows, query_x=np.stack([start, np.full(len(k), np.inf)]),
                           item_col=ev.c_worker[unmatched], item_x=ev.c_time[unmatched],
                           weights=np.ones((1, len(unmatched))))[0]
        context.incomplete[k] |= seen[1] - seen[0] > 0.5
    for h in (0, 1):
        count = np.rint(below[0, h + 1] - below[0, h]).astype(np.int64)
        context.counts[h][k] += count
        context.out["returned_capacity"][k] += count
        # Differences of sums: a half with no return has exactly no work.
        context.halves[2 + h][k] += np.where(count > 0, below[1, h + 1] - below[1, h], 0.0)


def _by_time_sums(sets: RowSets, rows: np.ndarray, start: np.ndarray, middle: np.ndarray, groups: list) -> np.ndarray:
    """``out[m, t, q]``: the groups' weights ``m`` below start, midpoint and after (:func:`_recent_by_time`).

    The midpoint reads only the weights split into halves, over the items that weigh in them.
    """
    sizes = [len(g[1]) for g in groups]
    weights = np.zeros((sum(len(g[2]) for g in groups), sum(sizes)))
    row, at = 0, 0
    for (_, _, ws, _), size in zip(groups, sizes):
        weights[row : row + len(ws), at : at + size] = ws
        row, at = row + len(ws), at + size
    item_col, item_x = np.concatenate([g[0] for g in groups]), np.concatenate([g[1] for g in groups])
    out = np.zeros((len(weights), 3, len(rows)))
    out[:, ::2] = binned_sums(sets=sets, query_row=rows, query_x=np.stack([start, np.full(len(rows), np.inf)]),
                              item_col=item_col, item_x=item_x, weights=weights)
    split = np.flatnonzero(np.concatenate([g[3] for g in groups]))
    items = np.flatnonzero(weights[split].any(axis=0))
    out[split, 1] = binned_sums(sets=sets, query_row=rows, query_x=middle[None, :], item_col=item_col[items],
                                item_x=item_x[items], weights=weights[split][:, items])[:, 0]
    return out


def _created_at(context: _Context, member: np.ndarray, k: np.ndarray, rows: np.ndarray, pops: np.ndarray) -> np.ndarray:
    """``(work, count)`` of the ``pops`` by the requests' eligible workers whose request was created exactly at theirs."""
    ev = context.ev
    by_created = pops[np.argsort(ev.d_created[pops], kind="stable")]
    created = ev.d_created[by_created]
    c = context.rq.created[k]
    q, j = expand_ranges(np.searchsorted(created, c, "left"), np.searchsorted(created, c, "right"))
    held = member[rows[q], ev.d_worker[by_created[j]]]
    q, pop = q[held], by_created[j[held]]
    return np.stack([np.bincount(q, weights=ev.d_work[pop], minlength=len(k)), np.bincount(q, minlength=len(k))])


def _key_ranks(priority: np.ndarray, created: np.ndarray) -> np.ndarray:
    """Ranks of (priority desc, created asc) keys; equal keys share a rank."""
    key = -priority.astype(np.float64)
    order = np.lexsort((created, key))
    k, c = key[order], created[order]
    rank = np.empty(len(order), np.int64)
    rank[order] = np.cumsum(np.r_[True, (k[1:] != k[:-1]) | (c[1:] != c[:-1])])
    return rank


def _shared_dispatches(context: _Context, member: np.ndarray, row_of: np.ndarray, looked: np.ndarray) -> None:
    """Relevant and preceding dispatches, per row, for the requests created before the window.

    Their window is the full 300 s and every dispatched request created in it
    was created after them. Preceding ones are those ahead by queue key (a
    prefix sum over dispatches sorted by key, per worker of the row), plus the
    row's priority-pass dispatches, less those that list the owner and are
    not ahead by key, less the request's own dispatches.
    """
    ev, rq, now = context.ev, context.rq, context.now
    shared = rq.created[looked] < now - WINDOW_SECONDS
    k, rows = looked[shared], row_of[shared]
    if len(k) == 0 or len(ev.d_time) == 0:
        return
    late = (ev.d_created >= now - WINDOW_SECONDS) & (ev.d_created <= now)
    second = ev.d_created >= context.middle[k[0]]
    weights = np.stack([np.ones(len(ev.d_time)), ev.d_active.astype(np.float64),
                        np.where(late & ~second, ev.d_work, 0.0), np.where(late & second, ev.d_work, 0.0)])
    rank = _key_ranks(np.r_[ev.d_priority.astype(np.float64), rq.priority[k].astype(np.float64)],
                      np.r_[ev.d_created, rq.created[k]])
    rank_d, rank_k = rank[: len(ev.d_time)], rank[len(ev.d_time) :]
    pp = ev.d_priority_pass.astype(bool)
    preceding = prefix_sums(takeable=context.member_sets, request_row=rows, request_position=rank_k, item_position=rank_d,
                            item_signature=ev.d_worker, weights=weights * ~pp)
    per_worker = np.stack([np.bincount(ev.d_worker, weights=w, minlength=member.shape[1])
                           for w in (*(weights * pp), weights[0])], axis=1)
    per_row = _per_row(member, rows, per_worker).T
    preceding += per_row[:4]
    opportunities = per_row[4]
    qi, dd = _listed_pairs(context, k)
    hit = member[rows[qi], ev.d_worker[dd]] & (rank_d[dd] >= rank_k[qi])
    for m in range(4):
        preceding[m] -= np.bincount(qi[hit], weights=weights[m, dd[hit]], minlength=len(k))
    # The request's own dispatches are not relevant to it.
    at = np.full(len(rq.ids), -1, np.int64)
    at[k] = np.arange(len(k))
    dd = np.flatnonzero(ev.d_request >= 0)
    qi = at[ev.d_request[dd]]
    dd, qi = dd[qi >= 0], qi[qi >= 0]
    mine = member[rows[qi], ev.d_worker[dd]]
    dd, qi = dd[mine], qi[mine]
    opportunities -= np.bincount(qi, minlength=len(k))
    listed = np.isin(dd * context.n_users + context.owner_code[k[qi]], context.listed)
    own = (rank_d[dd] < rank_k[qi]) | (pp[dd] & ~listed)
    for m in range(4):
        preceding[m] -= np.bincount(qi[own], weights=weights[m, dd[own]], minlength=len(k))
    out = context.out
    out["dispatch_opportunities"][k] += np.rint(opportunities).astype(np.int64)
    out["lost_opportunities"][k] += np.rint(preceding[0]).astype(np.int64)
    out["active_preceding_dispatches"][k] += np.rint(preceding[1]).astype(np.int64)
    context.halves[0][k] += preceding[2]
    context.halves[1][k] += preceding[3]


def _recent_dispatches(context: _Context, member: np.ndarray, row_of: np.ndarray, looked: np.ndarray) -> None:
    """Relevant and preceding dispatches, and their arriving work, of the requests created within the window.

    Such a request's window starts at its creation c. A pop not from a
    priority pass precedes it when it is ahead by queue key; as a pop never
    comes before its request's creation, one popped before c is ahead exactly
    when its priority is at least the request's, so those since c are every
    pop ahead less those. Priority passes precede unless they list the owner,
    and the request's own pops are not relevant: both are taken back pair by
    pair (:func:`_take_back`). Arriving work is that of preceding pops created
    after c: higher priority, or a priority pass. Pops recorded before their
    request's creation break the argument: judged pair by pair.
    """
    ev, rq, now = context.ev, context.rq, context.now
    recent = rq.created[looked] >= now - WINDOW_SECONDS
    k, rows = looked[recent], row_of[recent]
    if len(k) == 0 or len(ev.d_time) == 0:
        return
    odd = ev.d_created > ev.d_time
    context.pairs(member, k, rows, np.flatnonzero(odd))
    d = np.flatnonzero(~odd)
    n, pp = len(k), ev.d_priority_pass[d].astype(bool)
    c, p = rq.created[k], rq.priority[k].astype(np.int64)
    by_time = context.by_time  # see _recent_by_time
    seen = by_time[:3, 2] - by_time[:3, 0]  # every pop since c; those of priority passes (all, active)
    # Requests at the lowest priority of the pops read the rest from the same pass; the others below.
    slow = np.flatnonzero(p != context.lowest)
    fast = np.flatnonzero(p == context.lowest)
    # By queue key, every pop ahead of the request; a pop before c that is ahead has a priority at least p
    # (its request was created before c), so those since c are the ones ahead less those before c of
    # priority at least p (above p - 1): every other pop before c when p is at or below every pop's.
    plain = np.stack([~pp, ~pp & ev.d_active[d].astype(bool)]).astype(np.float64)
    ahead = by_time[7:9, 0].copy()
    rank = _key_ranks(np.r_[ev.d_priority[d], p[slow]].astype(np.float64), np.r_[ev.d_created[d], c[slow]])
    ahead[:, slow] = binned_sums(sets=context.member_sets, query_row=rows[slow], query_x=rank[len(d) :][None, :],
                                 item_col=ev.d_worker[d], item_x=rank[: len(d)], weights=plain)[:, 0]
    before = by_time[3:5, 0].copy()
    high = np.flatnonzero(p > context.lowest)
    before[:, high] = dominance_sums(sets=context.member_sets, query_row=rows[high], query_level=p[high] - 1,
                                     query_x=c[high][None, :], item_col=ev.d_worker[d], item_level=ev.d_priority[d].astype(np.int64),
                                     item_x=ev.d_time[d], weights=plain)[:, 0]
    # Arriving: preceding pops created after c, in each half: of higher priority, or from a priority pass.
    by_created = np.zeros((2, 3, n))
    c_up = np.nextafter(c[slow], np.inf)
    cuts = np.stack([c_up, np.maximum(context.middle[k[slow]], c_up), np.full(len(slow), np.nextafter(now, np.inf))])
    by_created[:, :, slow] = dominance_sums(
        sets=context.member_sets, query_row=rows[slow], query_level=p[slow], query_x=cuts, item_col=ev.d_worker[d],
        item_level=np.where(pp, TOP_LEVEL, ev.d_priority[d].astype(np.int64)), item_x=ev.d_created[d],
        weights=np.stack([ev.d_work[d], np.ones(len(d))]))
    # The pass read "created before c"; arriving work starts after c: the pops created at c count before it.
    at_c = _created_at(context, member, k[fast], rows[fast], context.arriving_pops)
    fast_sums = by_time[5:7][:, :, fast]
    fast_sums[:, 0] += at_c
    fast_sums[:, 1] += np.where(context.middle[k[fast]] <= c[fast], at_c, 0.0)
    by_created[:, :, fast] = fast_sums
    figures = np.stack([seen[0], *(seen[1:] + ahead - before)])  # relevant, preceding, active preceding
    arriving = np.stack([by_created[:, h + 1] - by_created[:, h] for h in (0, 1)])  # half, (work, count)
    _take_back(context, k, rows, member, figures, arriving)
    out = context.out
    out["dispatch_opportunities"][k] += np.rint(figures[0]).astype(np.int64)
    out["lost_opportunities"][k] += np.rint(figures[1]).astype(np.int64)
    out["active_preceding_dispatches"][k] += np.rint(figures[2]).astype(np.int64)
    for h in (0, 1):
        # Differences of sums: a half with no arriving pop has exactly no work.
        context.halves[h][k] += np.where(arriving[h, 1] > 0.5, arriving[h, 0], 0.0)


def _take_back(context: _Context, k: np.ndarray, rows: np.ndarray, member: np.ndarray, figures: np.ndarray,
               arriving: np.ndarray) -> None:
    """Correct the sums of :func:`_recent_dispatches` pair by pair: the request's own pops, and priority passes that list its owner.

    The sums counted every priority pass as preceding; one that lists the
    owner precedes only by queue key. The request's own pops were counted as
    relevant, and as preceding if they precede.
    """
    ev, rq, now = context.ev, context.rq, context.now
    at = np.full(len(rq.ids), -1, np.int64)
    at[k] = np.arange(len(k))
    own_d = np.flatnonzero(ev.d_request >= 0)
    own_q = at[ev.d_request[own_d]]
    listed_q, listed_d = _listed_pairs(context, k)
    qi, dd = np.r_[own_q[own_q >= 0], listed_q], np.r_[own_d[own_q >= 0], listed_d]
    own = np.r_[np.ones((own_q >= 0).sum(), bool), np.zeros(len(listed_q), bool)]
    keep = (ev.d_created[dd] <= ev.d_time[dd]) & member[rows[qi], ev.d_worker[dd]] & (ev.d_time[dd] >= rq.created[k[qi]])
    qi, dd, own = qi[keep], dd[keep], own[keep]
    prio, mine, created = ev.d_priority[dd], rq.priority[k[qi]], ev.d_created[dd]
    by_key = (prio > mine) | ((prio == mine) & (created < rq.created[k[qi]]))
    listed = np.isin(dd * context.n_users + context.owner_code[k[qi]], context.listed)
    precedes = by_key | (ev.d_priority_pass[dd].astype(bool) & ~listed)
    # Own pops: all they added. Listing pairs: the preceding they were wrongly given.
    wrong = np.where(own, precedes, ~by_key)
    active = ev.d_active[dd].astype(np.float64)
    n = len(k)
    figures[0] -= np.bincount(qi[own], minlength=n)
    figures[1] -= np.bincount(qi[wrong], minlength=n)
    figures[2] -= np.bincount(qi[wrong], weights=active[wrong], minlength=n)
    late = wrong & (created > rq.created[k[qi]]) & (created <= now)
    second = created >= context.middle[k[qi]]
    for h, half in enumerate((late & ~second, late & second)):
        arriving[h, 0] -= np.bincount(qi[half], weights=ev.d_work[dd[half]], minlength=n)
        arriving[h, 1] -= np.bincount(qi[half], minlength=n)


def _listed_pairs(context: _Context, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position in ``k``, dispatch) pairs: a priority-pass dispatch that lists the request's owner."""
    listed = context.listed
    dispatch, user = listed // context.n_users, listed % context.n_users
    owners = context.owner_code[k]
    by_owner = np.argsort(owners, kind="stable")
    sorted_owners = owners[by_owner]
    lo = np.searchsorted(sorted_owners, user, "left")
    hi = np.searchsorted(sorted_owners, user, "right")
    return _expand_ranges(lo, hi, dispatch, by_owner)


def _recent_window(context: _Context, takeable: np.ndarray, row_of: np.ndarray, looked: np.ndarray) -> np.ndarray:
    """Arriving work from waiting requests, per half, of the requests whose window starts at their creation.

    An arrival ahead of such a request and created in its window has a higher
    priority (summed here over creation times by priority bands), or the same
    priority and creation time (a join, :meth:`_Context.arrivals`).
    """
    rq, arrived = context.rq, context.arrived
    out = np.zeros((2, len(rq.ids)))
    recent = context.start[looked] > context.now - WINDOW_SECONDS
    k, rows = looked[recent], row_of[recent]
    if len(k) == 0 or len(arrived) == 0:
        return out
    start = context.start[k]
    middle = np.maximum(context.middle[k], start)
    below = dominance_sums(
        sets=context.takeable_sets, query_row=rows, query_level=rq.priority[k].astype(np.int64),
        query_x=np.stack([start, middle, np.full(len(k), np.inf)]), item_col=context.signature[arrived],
        item_level=rq.priority[arrived].astype(np.int64), item_x=rq.created[arrived],
        weights=np.stack([context.arrived_work, np.ones(len(arrived))]),
    )
    for h in (0, 1):
        work, count = below[:, h + 1] - below[:, h]
        # A difference of sums: a half with no arrival has exactly no work.
        out[h, k] = np.where(count > 0.5, work, 0.0)
    context.arrivals(takeable, rows, k)
    return out


def _expand_ranges(lo: np.ndarray, hi: np.ndarray, item: np.ndarray, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(request, item) pairs: ``requests[lo[i]:hi[i]]`` with ``item[i]``, for every i."""
    i, j = expand_ranges(lo, hi)
    return requests[j], item[i]


class _Context:
    """What every block reads: the requests' windows and queue places, the events; and the sums it adds to."""

    def __init__(self, now, rq, start, middle, unit, position, owners, ev, takes):
        self.now, self.rq, self.start, self.middle = now, rq, start, middle
        self.position, self.ev = position, ev
        self.signature, self.arriving = _arriving_signatures(takes, rq, now)
        self.arrived = np.flatnonzero((rq.created >= now - WINDOW_SECONDS) & (rq.created <= now))
        self.arrived_work = (rq.n[self.arrived] * unit[self.arrived]).astype(np.float64)
        prio_values, self.prio_rank = np.unique(rq.priority, return_inverse=True)
        created_values, self.created_rank = np.unique(rq.created, return_inverse=True)
        self.n_prio, self.n_created = len(prio_values) + 1, len(created_values) + 1
        self.prio_rank, self.created_rank = self.prio_rank.ravel(), self.created_rank.ravel()
        # Owners and priority-pass users as codes of one vocabulary.
        codes, vocabulary = pd.factorize(np.concatenate([owners, ev.d_users["user"].to_numpy()]).astype(object))
        self.owner_code = codes[: len(owners)].astype(np.int64)
        self.n_users = max(len(vocabulary), 1)
        listed = ev.d_users["dispatch"].to_numpy().astype(np.int64) * self.n_users + codes[len(owners) :]
        self.listed = np.unique(listed)

    def pairs(self, member: np.ndarray, k: np.ndarray, rows: np.ndarray, dispatches: np.ndarray) -> None:
        """Judge the requests ``k`` (of rows ``rows``) against ``dispatches`` pair by pair."""
        ev = self.ev
        chunk = max(1, PAIRS_PER_CHUNK // max(len(k), 1))
        for lo in range(0, len(dispatches), chunk):
            d = np.tile(dispatches[lo : lo + chunk], len(k))
            q = np.repeat(np.arange(len(k)), min(chunk, len(dispatches) - lo))
            held = member[rows[q], ev.d_worker[d]]
            self._dispatches(k[q[held]], d[held])

    @staticmethod
    def _add(target: np.ndarray, k: np.ndarray, weights: np.ndarray | None = None) -> None:
        target += np.bincount(k, weights=weights, minlength=len(target)).astype(target.dtype)

    def _dispatches(self, k: np.ndarray, d: np.ndarray) -> None:
        ev, rq = self.ev, self.rq
        keep = (ev.d_time[d] >= self.start[k]) & (ev.d_request[d] != k)
        k, d = k[keep], d[keep]
        self._add(self.out["dispatch_opportunities"], k)
        prio, mine = ev.d_priority[d], rq.priority[k]
        precedes = (prio > mine) | ((prio == mine) & (ev.d_created[d] < rq.created[k]))
        passes = np.flatnonzero(ev.d_priority_pass[d] & ~precedes)
        # A priority pass precedes i unless i's owner is one of its users.
        listed = np.isin(d[passes] * self.n_users + self.owner_code[k[passes]], self.listed)
        precedes[passes[~listed]] = True
        k, d = k[precedes], d[precedes]
        self._add(self.out["lost_opportunities"], k)
        self._add(self.out["active_preceding_dispatches"], k[ev.d_active[d]])
        created = ev.d_created[d]
        late = (created > rq.created[k]) & (created >= self.start[k]) & (created <= self.now)
        k, d = k[late], d[late]
        second = ev.d_created[d] >= self.middle[k]
        for h, mask in enumerate((~second, second)):
            self._add(self.halves[h], k[mask], ev.d_work[d[mask]])

    def arrivals(self, takeable: np.ndarray, row_local: np.ndarray, reqs: np.ndarray) -> None:
        """Arriving work of the requests ``reqs`` (of rows ``row_local``) from arrivals tied with them on (priority, created).

        For a request whose window starts at its creation, an arrival ahead of it has a higher
        priority (see _recent_window) or the same priority and creation time: those tied ahead in
        the queue and takeable by the request's row. Summed per (tie, arrival signature) as
        running sums in queue order, so the cost follows the requests times the signatures of
        their tie, never the pairs of a tie: thousands of requests made in one transaction share
        one ``created`` (PostgreSQL's now()), and listing their pairs took seconds and gigabytes.
        """
        rq, arrived = self.rq, self.arrived
        if len(arrived) == 0 or len(reqs) == 0:
            return
        same = self.prio_rank * self.n_created + self.created_rank
        key, sig = same[arrived].astype(np.int64), self.signature[arrived].astype(np.int64)
        # Arrivals by (tie, signature) segment, then queue position; running work within each segment.
        code = key * (int(sig.max()) + 1) + sig
        order = np.lexsort((self.position[arrived], code))
        code_sorted, pos_sorted = code[order], self.position[arrived][order].astype(np.int64)
        first = np.flatnonzero(np.r_[True, code_sorted[1:] != code_sorted[:-1]])  # each segment's first row
        seg_sorted = np.cumsum(np.r_[False, code_sorted[1:] != code_sorted[:-1]])
        running = np.concatenate([[0.0], np.cumsum(self.arrived_work[order])])
        seg_key, seg_sig = key[order][first], sig[order][first]
        span = int(pos_sorted.max(initial=0)) + 1
        ranked = seg_sorted * span + pos_sorted  # ascending: segments, then positions
        # (request, segment of its tie) pairs, in chunks that bound memory.
        lo = np.searchsorted(seg_key, same[reqs], "left")
        hi = np.searchsorted(seg_key, same[reqs], "right")
        per = np.maximum(hi - lo, 0)
        bounds = np.searchsorted(np.cumsum(per), np.arange(0, int(per.sum()), PAIRS_PER_CHUNK), "right")
        for a, b in zip(np.r_[0, bounds[1:]], np.r_[bounds[1:], len(reqs)]):
            seg, q = _expand_ranges(lo[a:b], hi[a:b], np.arange(a, b), np.arange(len(seg_key)))
            takes = takeable[row_local[q], seg_sig[seg]]
            seg, q = seg[takes], q[takes]
            k = reqs[q]
            # Work of the segment's arrivals ahead of k: positions before k's within its segment.
            ahead = np.searchsorted(ranked, seg * span + self.position[k].astype(np.int64), "left")
            work = running[ahead] - running[first[seg]]
            # A tie's creation is the request's own: in its window, and in the second half only
            # when the window has no first one.
            second = rq.created[k] >= self.middle[k]
            keep = rq.created[k] >= self.start[k]
            for h, mask in enumerate((~second & keep, second & keep)):
                self._add(self.halves[h], k[mask], work[mask])
