"""Eligibility (SPEC.md section 3) of every waiting request of one gentype, by groups.

Every gate but the model gate compares a few request flags with a few worker
flags, and the model gate compares two model sets. So:

* a request's gates are a *request set* (its models) and a *request flag
  combination* (chat, lengths as ranks, trust, nsfw, options...); a request
  group is the pair;
* a worker's declarations are a *worker set* and a *worker flag combination*;
* the gate table is ``overlap[request set, worker set] & passes[request flags,
  worker flags]``, two small tables instead of one per (request, worker);
* sums over eligible workers (count, threads, speed * threads) become two
  matrix products: per worker set and request flags first, then over the
  worker sets that overlap each request set.

What depends on a worker's identity or a request's owner (targeting,
maintenance workers serving their owner, excluded pairs) touches few
requests; those form *special groups* evaluated worker by worker, but only
over workers of overlapping model sets.

"Could take" (SPEC section 3, end) compares a worker's *take class* (its set
and chat mode and limits) with a queued request's *signature* (its set, chat
flag, length ranks or size rank). Signatures that every take class treats
alike are merged, and each group's takeable signatures are the OR of the rows
of the take classes among its eligible workers.

:func:`eligibility` runs these as named steps, each returning a frozen result:
gate columns (the one place text and image part ways, :data:`_GENTYPE_GATES`),
model sets, flag tables, shared groups, special groups, special sums and, with
competition, the takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Callable

import numpy as np
import pandas as pd

from vecsched.core.arrays import RequestArrays, WorkerArrays
from vecsched.snapshot.schema import CHAT_NONE, CHAT_ONLY, IMAGE, TEXT
from vecsched.core.groups import (
    StackedRows,
    factorize_rows,
    or_by_segments,
    or_rows_by_pairs,
    bit_sums,
    bit_summer,
    holders,
    or_by_lists,
    or_distinct_by_bits,
    or_distinct_dense,
    pack_words,
    positions_among,
    row_codes,
    transpose_words,
    set_codes,
    sorted_codes,
    unique_rows,
    unpack_words,
)
from vecsched.snapshot.lists import ListColumn

# Elements per temporary block; bounds peak memory whatever the horde's size.
BLOCK_ELEMENTS = 1 << 23
# Words of packed eligible workers formed and summed per block by the shared groups (1 MB).
SUM_BLOCK_WORDS = 1 << 17
# Largest (sources / 8, keys) byte table the eight-at-a-time OR may use.
DENSE_TABLE_BYTES = 1 << 27
# or_rows_dense pays about this many word ORs per run of eight sources (its Python step per
# run and source); ORing pair by pair pays one per pair and word.
WORDS_PER_DENSE_RUN = 10_000


@dataclass(frozen=True)
class TakeTables:
    """Signatures and take classes of one gentype (SPEC section 3, end): what :class:`Takes` forms on first read.

    Attributes
    ----------
    signature : ndarray
        Each request's (merged) signature. Given the requests' queue positions
        (:func:`eligibility`'s ``queue_position``) signatures are numbered by
        birth: signature 0 is the one whose first request comes first in queue
        order, and so on; else by first appearance in request row order.
    n_signatures : int
        How many signatures there are.
    class_rows : ndarray of uint64
        Each take class's signatures (64-bit words).
    worker_class : ndarray
        The take class of each usable worker of the gentype, in worker row order.
    class_first : ndarray
        A usable worker of each take class.
    appearance : ndarray
        Each signature's number in request row order (the numbering without
        ``queue_position``): might_stall orders its columns by it, so its float
        sums add in the same order whichever numbering competition reads.
    """

    signature: np.ndarray
    n_signatures: int
    class_rows: np.ndarray
    worker_class: np.ndarray
    class_first: np.ndarray
    appearance: np.ndarray


@dataclass(frozen=True)
class Takes:
    """What the requests' eligible workers could take (SPEC section 3, end), formed on first read.

    Nothing is formed until read: of the SPEC 3-6 stages only text competition
    (and image competition with ``eligible_image_wait``) reads it, inside the
    eligibility stage; might_stall reads image's in its own stage.

    Attributes
    ----------
    signature, n_signatures, class_rows, worker_class, appearance
        See :class:`TakeTables`.
    takeable : ndarray of uint64
        Per row of the result (see :attr:`Eligibility.row`), the signatures its
        eligible workers could take, as 64-bit words.
    """

    # () -> the tables; (tables, class_rows) -> (distinct takeable rows, each row's place among them)
    form: Callable[[], TakeTables] = field(repr=False, compare=False)
    rows_for: Callable[[TakeTables, np.ndarray], tuple[np.ndarray, np.ndarray]] = field(repr=False, compare=False)

    @cached_property
    def tables(self) -> TakeTables:
        """The signatures and take classes, formed once."""
        return self.form()

    @property
    def signature(self) -> np.ndarray:
        return self.tables.signature

    @property
    def n_signatures(self) -> int:
        return self.tables.n_signatures

    @property
    def class_rows(self) -> np.ndarray:
        return self.tables.class_rows

    @property
    def worker_class(self) -> np.ndarray:
        return self.tables.worker_class

    @property
    def appearance(self) -> np.ndarray:
        return self.tables.appearance

    def rows_of(self, class_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(distinct, of)`` for ``class_rows`` (a row per take class, any columns) in place of :attr:`class_rows`."""
        return self.rows_for(self.tables, class_rows)

    @cached_property
    def distinct_takeable(self) -> tuple[np.ndarray, np.ndarray]:
        """``(distinct, of)``: the distinct takeable rows (no two equal) and each row's place among them.

        ``distinct[of]`` is :attr:`takeable`; competition reads this form, so the
        many rows that take alike are formed (and compared) once.
        """
        return self.rows_of(self.class_rows)

    @cached_property
    def takeable(self) -> np.ndarray:
        """Each row's takeable signatures (see the class docstring)."""
        distinct, of = self.distinct_takeable
        return distinct[of]


@dataclass(frozen=True)
class Eligibility:
    """Eligibility of the requests of one gentype (arrays aligned with the requests)."""

    workers: np.ndarray  # eligible worker count
    threads: np.ndarray  # eligible threads
    throughput: np.ndarray  # sum of speed * threads
    row: np.ndarray  # the request's row: its shared group, or n_groups + its special group
    n_groups: int = 0
    n_special: int = 0
    n_declarations: int = 0
    competition: Takes | None = None  # with_competition only
    # With every_request_special: each special group's eligible workers.
    eligible_workers: np.ndarray | None = None
    # The gentype's usable workers (worker rows): the columns of row_words and of any per-worker table.
    worker_rows: np.ndarray | None = None
    # rows -> their eligible workers (usable workers of the gentype) as pack_words rows, from the
    # same tables (shared rows) and gates (special rows) as the sums; read by the forecasts stage.
    row_words: Callable[[np.ndarray], np.ndarray] | None = None


def eligibility(
    wk: WorkerArrays,
    rq: RequestArrays,
    gentype: int,
    excluded: tuple[np.ndarray, np.ndarray],
    with_competition: bool,
    every_request_special: bool = False,
    *,
    queue_position: np.ndarray | None = None,
) -> Eligibility:
    """Eligible workers, threads and throughput of each request of ``gentype``, and what it could take.

    ``excluded`` holds (worker row, request position in ``rq``) pairs.
    ``every_request_special`` evaluates every request worker by worker and
    returns its eligible workers (for one-off requests; slow for a queue).
    ``queue_position`` (optional, one number per request of ``rq``, lower
    first; the estimate's ``position``) numbers the signatures of
    ``competition`` by birth (:class:`TakeTables`), so the competition sweep
    reads a short prefix of each takeable row; without it they are numbered by
    first appearance in row order. Either numbering gives the same figures.
    """
    if queue_position is not None:
        queue_position = np.asarray(queue_position)
        if queue_position.shape != (len(rq.ids),):
            raise ValueError(f"queue_position: shape {queue_position.shape}, expected ({len(rq.ids)},)")
    gates = _GENTYPE_GATES[gentype]  # the one place text and image part ways
    cols = gates.columns(wk, rq)
    sets = _model_sets(wk, rq, cols.worker_rows)
    flags = _flag_tables(wk, cols, gates)
    shared = _shared_groups(wk, cols, sets, flags)
    special = _special_groups(wk, rq, cols, shared.group_of, excluded, every_request_special)
    found = _special_sums(
        wk, rq, cols, sets, flags, special, excluded, shared.w_values,
        # might_stall and the forecasts read special rows' workers again (row_words)
        keep_workers=every_request_special or with_competition,
    )
    row = shared.group_of.copy()
    row[special.rows] = shared.n + special.of
    all_sums = np.concatenate([shared.sums, found.sums])
    takes = None
    if with_competition:
        takes = _takes(wk, cols, gates, sets, flags, shared, found, queue_position)
    return Eligibility(
        workers=np.rint(all_sums[row, 0]).astype(np.int64),
        threads=np.rint(all_sums[row, 1]).astype(np.int64),
        throughput=all_sums[row, 2],
        row=row,
        n_groups=shared.n,
        n_special=special.n,
        n_declarations=len(factorize_rows(sets.w_set, flags.w_flags)[1]),
        competition=takes,
        eligible_workers=found.workers(np.arange(special.n)) if every_request_special else None,
        worker_rows=cols.worker_rows,
        row_words=_row_words(wk, rq, cols, sets, flags, shared, special, excluded, found),
    )


def _take_classes(wk: WorkerArrays, cols: GateColumns, sets: ModelSets) -> tuple[np.ndarray, np.ndarray]:
    """Each usable worker's take class, (worker set, kind), and a worker of each class.

    Classes are numbered by their set's smallest model: the classes holding a
    model then sit close together, so the OR over a model key's classes
    (:func:`vecsched.core.groups.or_rows_dense`) touches few runs of eight.
    """
    w_class, class_first = factorize_rows(sets.w_set, *cols.w_kind)
    lists = wk.models.take(cols.worker_rows[class_first])
    smallest = np.full(len(class_first), -1, dtype=np.int64)
    held = lists.lengths > 0
    smallest[held] = np.minimum.reduceat(lists.values.astype(np.int64), lists.offsets[:-1][held])
    order = np.lexsort((sets.w_set[class_first], smallest))
    renumber = np.empty_like(order)
    renumber[order] = np.arange(len(order))
    return renumber[w_class], class_first[order]


# -- step 1: the gate inputs of one gentype, as small-integer columns ---------------------


@dataclass(frozen=True)
class GateColumns:
    """The gate inputs of the usable workers and the requests of one gentype.

    *Kind* columns are what "could take" compares (chat mode and length ranks,
    or the size rank); *other* columns the remaining flag gates.
    """

    worker_rows: np.ndarray  # usable workers of the gentype
    w_kind: tuple[np.ndarray, ...]
    w_other: tuple[np.ndarray, ...]
    r_kind: tuple[np.ndarray, ...]
    r_other: tuple[np.ndarray, ...]
    chat: np.ndarray  # per request: the chat speed fallback applies


def _rank(limits: np.ndarray, values: np.ndarray) -> np.ndarray:
    """How many distinct ``limits`` are below each value: value <= limits[k] iff rank <= k."""
    return np.searchsorted(limits, values, side="left")


def _text_columns(wk: WorkerArrays, rq: RequestArrays) -> GateColumns:
    wr = np.flatnonzero(wk.usable & (wk.gentype == TEXT))
    # Limits as ranks among the values workers declare.
    lengths = np.unique(np.r_[wk.max_length[wr], wk.chat_max_length[wr]])
    contexts = np.unique(np.r_[wk.max_context_length[wr], wk.chat_max_context_length[wr]])
    return GateColumns(
        worker_rows=wr,
        w_kind=(
            wk.chat_mode[wr],
            _rank(lengths, wk.max_length[wr]),
            _rank(contexts, wk.max_context_length[wr]),
            _rank(lengths, wk.chat_max_length[wr]),
            _rank(contexts, wk.chat_max_context_length[wr]),
        ),
        w_other=(wk.below_floor[wr], wk.nsfw[wr], wk.trusted[wr], wk.validated[wr]),
        r_kind=(rq.is_chat, _rank(lengths, rq.max_length), _rank(contexts, rq.max_context_length)),
        r_other=(rq.slow_workers, rq.trusted_workers, rq.nsfw, rq.validated_backends),
        chat=rq.is_chat,
    )


def _text_kind(request_kind: list[np.ndarray], worker_kind: list[np.ndarray]) -> np.ndarray:
    """``ok[request kind, worker kind]``: the chat mode and the length limits (text gate 7)."""
    chat, rlen, rctx = (c[:, None] for c in request_kind)
    mode, wlen, wctx, wclen, wcctx = worker_kind
    ok = np.where(chat, mode != CHAT_NONE, mode != CHAT_ONLY)
    return ok & np.where(chat, (rlen <= wclen) & (rctx <= wcctx), (rlen <= wlen) & (rctx <= wctx))


def _text_other(
    request_kind: list[np.ndarray], request_other: list[np.ndarray], worker_other: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Nsfw, trust and validated backends; and the speed gate (text gate 9) apart."""
    chat = request_kind[0][:, None]
    slow, rtrusted, rnsfw, rvalid = (c[:, None] for c in request_other)
    below, wnsfw, wtrusted, wvalid = worker_other
    passes = (~rnsfw | wnsfw) & (~rtrusted | wtrusted) & (~rvalid | wvalid)
    # A plain request that accepts slow workers is not speed-gated; a chat
    # request is, with the fallback applied per group.
    return passes, ~below | (~chat & slow)


def _image_columns(wk: WorkerArrays, rq: RequestArrays) -> GateColumns:
    wr = np.flatnonzero(wk.usable & (wk.gentype == IMAGE))
    sizes = np.unique(wk.max_pixels[wr])
    return GateColumns(
        worker_rows=wr,
        w_kind=(_rank(sizes, wk.max_pixels[wr]),),
        w_other=(wk.image_slow[wr], wk.extra_slow[wr], wk.nsfw[wr], wk.trusted[wr], wk.has_bits[wr]),
        r_kind=(_rank(sizes, rq.pixels),),
        r_other=(rq.slow_workers, rq.extra_slow_workers, rq.trusted_workers, rq.nsfw, rq.need_bits),
        chat=np.zeros(len(rq.ids), dtype=bool),
    )


def _image_kind(request_kind: list[np.ndarray], worker_kind: list[np.ndarray]) -> np.ndarray:
    """``ok[request kind, worker kind]``: the size (image gate 7)."""
    return request_kind[0][:, None] <= worker_kind[0]


def _image_other(
    request_kind: list[np.ndarray], request_other: list[np.ndarray], worker_other: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Nsfw, trust, slow and extra slow workers, and the options (image gates 3, 8 and 9)."""
    slow, xslow, rtrusted, rnsfw, need = (c[:, None] for c in request_other)
    wslow, wxslow, wnsfw, wtrusted, whas = worker_other
    passes = (~rnsfw | wnsfw) & (~rtrusted | wtrusted)
    passes = passes & (~wslow | slow) & (~wxslow | xslow) & ((need & ~whas) == 0)
    return passes, np.ones_like(passes)


@dataclass(frozen=True)
class _GentypeGates:
    """The three places text and image differ, chosen once per call."""

    columns: Callable[[WorkerArrays, RequestArrays], GateColumns]
    kind: Callable[[list[np.ndarray], list[np.ndarray]], np.ndarray]
    other: Callable[[list[np.ndarray], list[np.ndarray], list[np.ndarray]], tuple[np.ndarray, np.ndarray]]


_GENTYPE_GATES = {
    TEXT: _GentypeGates(_text_columns, _text_kind, _text_other),
    IMAGE: _GentypeGates(_image_columns, _image_kind, _image_other),
}


# -- step 2: model sets and their overlap ----------------------------------------------------


@dataclass(frozen=True)
class ModelSets:
    """Distinct model sets of the requests and of the usable workers, and which workers each overlaps."""

    r_set: np.ndarray  # each request's set
    r_set_first: np.ndarray  # a request of each set
    w_set: np.ndarray  # each usable worker's set
    w_set_first: np.ndarray
    set_models: ListColumn  # distinct models of each request set
    worker_words: np.ndarray  # [request set]: the usable workers of overlapping sets, packed


def _model_sets(wk: WorkerArrays, rq: RequestArrays, worker_rows: np.ndarray) -> ModelSets:
    r_first, r_set = sorted_codes(rq.model_set)
    w_first, w_set = sorted_codes(wk.model_set[worker_rows])
    set_models = _distinct_models(rq.models.take(r_first))  # repeats inside a request's list removed
    w_lists = wk.models.take(worker_rows)
    worker_words = _overlap_words(set_models, w_lists)
    return ModelSets(r_set.ravel(), r_first, w_set.ravel(), w_first, set_models, worker_words)


def _overlap_words(set_models: ListColumn, lists: ListColumn) -> np.ndarray:
    """Per request set, the ``lists`` it overlaps (packed): the OR of one row per model it names.

    A request naming no model takes any.
    """
    n_values = 1 + max([0] + [int(v.max()) for v in (set_models.values, lists.values) if len(v)])
    words = or_by_lists(set_models, holders(lists, n_values))
    words[set_models.lengths == 0] = pack_words(np.ones((1, len(lists)), dtype=bool))
    return words


# -- step 3: flag combinations and the flag gates -----------------------------------------


@dataclass(frozen=True)
class FlagTables:
    """Request and worker flag combinations, and which pass which."""

    w_flags: np.ndarray  # each usable worker's combination
    r_flags: np.ndarray  # each request's combination
    passes: np.ndarray  # [request flags, worker flags]: every flag gate but speed
    speed_ok: np.ndarray  # [request flags, worker flags]: the speed gate
    passes_base: np.ndarray  # passes, maintenance workers left out
    fast_base: np.ndarray  # passes_base and the speed gate
    chat: np.ndarray  # per request combination


def _flag_tables(wk: WorkerArrays, cols: GateColumns, gates: _GentypeGates) -> FlagTables:
    maintenance = wk.maintenance[cols.worker_rows]
    w_flags, w_first = factorize_rows(*cols.w_kind, *cols.w_other, maintenance)
    r_flags, r_first = factorize_rows(*cols.r_kind, *cols.r_other)
    passes, speed_ok = gates.other(
        [c[r_first] for c in cols.r_kind], [c[r_first] for c in cols.r_other], [c[w_first] for c in cols.w_other]
    )
    passes = passes & gates.kind([c[r_first] for c in cols.r_kind], [c[w_first] for c in cols.w_kind])
    # Maintenance workers serve only their owner: never in a group's shared row.
    passes_base = passes & ~maintenance[w_first]
    return FlagTables(w_flags, r_flags, passes, speed_ok, passes_base, passes_base & speed_ok, cols.chat[r_first])


# -- step 4: shared groups (request set, request flags) and their sums ---------------------


@dataclass(frozen=True)
class SharedGroups:
    """Requests alike in model set and flags, and the sums over each group's eligible workers."""

    group_of: np.ndarray  # each request's group
    g_set: np.ndarray
    g_flags: np.ndarray
    g_fast: np.ndarray  # the group keeps to workers passing the speed gate
    sums: np.ndarray  # (groups, 3): workers, threads, speed * threads
    w_values: np.ndarray  # (usable workers, 3): what the sums add up
    # [variant, request flags]: the usable workers passing passes_base (0) or fast_base (1), packed.
    flag_words: np.ndarray
    worker_words: np.ndarray  # ModelSets.worker_words: per request set

    @property
    def n(self) -> int:
        return len(self.g_set)

    def words(self, groups: np.ndarray, variant: np.ndarray) -> np.ndarray:
        """The eligible usable workers of ``groups`` (packed): model overlap AND the flag gates."""
        return self.worker_words[self.g_set[groups]] & self.flag_words[variant, self.g_flags[groups]]


def _packed_columns(table: np.ndarray, worker_column: np.ndarray) -> np.ndarray:
    """``table[:, worker_column]`` packed (:func:`pack_words`), a block of rows at a time.

    Columns are gathered with ``np.take(..., axis=1)``: 3-5x less CPU than fancy indexing them.
    """
    step = max(1, BLOCK_ELEMENTS // max(len(worker_column), 1))
    blocks = range(0, max(len(table), 1), step)
    return np.concatenate([pack_words(np.take(table[a : a + step], worker_column, axis=1)) for a in blocks])


def _shared_groups(wk: WorkerArrays, cols: GateColumns, sets: ModelSets, flags: FlagTables) -> SharedGroups:
    group_of, group_first = factorize_rows(sets.r_set, flags.r_flags)
    g_set, g_flags = sets.r_set[group_first], flags.r_flags[group_first]
    wr = cols.worker_rows
    threads = wk.threads[wr].astype(np.float64)
    w_values = np.stack([np.ones(len(wr)), threads, wk.speed[wr] * wk.threads[wr]], axis=1)
    flag_words = np.stack([_packed_columns(t, flags.w_flags) for t in (flags.passes_base, flags.fast_base)])
    groups = SharedGroups(group_of, g_set, g_flags, np.zeros(0, bool), np.zeros((0, 3)), w_values, flag_words, sets.worker_words)

    # Request sets overlapping the same workers, and flag rows passing the same workers, coded alike.
    @cache
    def set_code() -> np.ndarray:
        return row_codes(sets.worker_words)[0]

    @cache
    def flag_code(variant: int) -> np.ndarray:
        return row_codes(flag_words[variant])[0]

    step = max(1, SUM_BLOCK_WORDS // max(sets.worker_words.shape[1], 1))
    summer = bit_summer(w_values, flag_words.shape[2])  # planes and byte tables formed once

    def sums(some: np.ndarray, variant: int) -> np.ndarray:
        # Groups of alike (overlap row, flag row) pairs have alike eligible workers: each pair's
        # workers are packed once, a block of pairs at a time (no (groups, words) temporary: at
        # 1M it cost more in page faults than the sums it saved), and alike rows of a block
        # (pairs whose flags pass the same workers) are summed once. Groups that fit one block
        # skip the pairs: the block's alike rows are found anyway.
        pair, pair_first = np.arange(len(some)), np.arange(len(some))
        if len(some) > step:
            pair, pair_first = factorize_rows(set_code()[g_set[some]], flag_code(variant)[g_flags[some]])
        out = np.empty((len(pair_first), 3))
        for a in range(0, len(pair_first), step):
            at = some[pair_first[a : a + step]]
            words = groups.words(at, np.full(len(at), variant))
            codes, first = row_codes(words)
            out[a : a + step] = summer(words[first])[codes]
        return out[pair]

    # Variant 1 (the speed gate too) is variant 0 where no speed gate applies (image).
    g_sums = sums(np.arange(groups.n), 1)
    # A chat request keeps to fast workers unless none passes its other gates: only
    # those groups read the sums without the speed gate.
    g_fast = ~flags.chat[g_flags] | (g_sums[:, 0] > 0)
    slow = np.flatnonzero(~g_fast)
    g_sums[slow] = sums(slow, 0)
    return SharedGroups(group_of, g_set, g_flags, g_fast, g_sums, w_values, flag_words, sets.worker_words)


# -- step 5: special groups (targeting, maintenance owners, excluded pairs) ---------------


@dataclass(frozen=True)
class SpecialGroups:
    """Requests whose eligibility depends on worker identity, grouped where they agree."""

    rows: np.ndarray  # the special requests
    of: np.ndarray  # each special request's group
    representative: np.ndarray  # a request of each group
    owns_maintenance: np.ndarray  # per request

    @property
    def n(self) -> int:
        return len(self.representative)


def _special_groups(
    wk: WorkerArrays,
    rq: RequestArrays,
    cols: GateColumns,
    group_of: np.ndarray,
    excluded: tuple[np.ndarray, np.ndarray],
    every_request_special: bool,
) -> SpecialGroups:
    ex_workers, ex_requests = excluded
    n_req = len(rq.ids)
    has_exclusion = np.zeros(n_req, dtype=bool)
    has_exclusion[ex_requests] = True
    wr = cols.worker_rows
    owns_maintenance = np.isin(rq.user, np.unique(wk.user[wr][wk.maintenance[wr]]))
    has_targets = rq.targets.lengths > 0
    rows = np.flatnonzero(has_targets | owns_maintenance | has_exclusion | every_request_special)
    if len(rows) == 0:
        return SpecialGroups(rows, np.zeros(0, np.int64), rows, owns_maintenance)
    # Requests alike in gates, targets, owner and excluded workers share one row:
    # one worker's word list hitting many prompts must not make each its own group.
    # Set codes only tell alike lists apart, so the special requests' lists alone are coded.
    targets = rq.targets.take(rows)
    by_request = np.argsort(ex_requests, kind="stable")
    excluded_lists = ListColumn(
        np.r_[0, np.cumsum(np.bincount(ex_requests, minlength=n_req))].astype(np.int64),
        ex_workers[by_request].astype(np.int64),
    )
    of, first = factorize_rows(
        group_of[rows],
        set_codes(ListColumn(targets.offsets, targets.values + 1), len(wk.ids) + 1),
        rq.blacklist[rows] & has_targets[rows],
        np.where(owns_maintenance[rows], rq.user[rows], -1),
        set_codes(excluded_lists.take(rows), len(wk.ids)),
    )
    return SpecialGroups(rows, of, rows[first], owns_maintenance)


# -- step 6: special groups evaluated worker by worker --------------------------------------


@dataclass(frozen=True)
class SpecialSums:
    """Per special group: the sums over its eligible workers and, on request, those workers.

    The workers are kept as the blocks evaluated them (a block's groups over
    the worker columns read for them), not spread over a (groups, usable
    workers) matrix: at 20,000 x 1,000,000 that matrix took 350 MB of pages
    written once and read back once.
    """

    sums: np.ndarray  # (special groups, 3)
    # With keep_workers: (groups, the worker columns read for them, final[groups, columns]) per block.
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    n_workers: int  # usable workers of the gentype
    kept: bool  # keep_workers: blocks holds every group's workers

    def present(self, w_class: np.ndarray, n_class: int) -> np.ndarray:
        """``group * n_class + class`` for each take class among each group's eligible workers.

        Read from the kept blocks, over the columns each was evaluated on; only
        takeable rows need it, so it waits for them.
        """
        parts = [np.zeros(0, dtype=np.int64)]
        for groups, columns, final in self.blocks:
            if len(columns):
                parts.append(_classes_present(final, groups, w_class[columns], n_class))
        return np.concatenate(parts)

    def workers(self, groups: np.ndarray) -> np.ndarray:
        """``out[i, w]``: usable worker ``w`` is eligible for special group ``groups[i]`` (kept blocks only)."""
        out = np.zeros((len(groups), self.n_workers), dtype=bool)
        block_of = np.full(len(self.sums), -1, dtype=np.int64)
        row_in_block = np.zeros(len(self.sums), dtype=np.int64)
        for b, (some, _, _) in enumerate(self.blocks):
            block_of[some], row_in_block[some] = b, np.arange(len(some))
        block = block_of[groups]
        for b in np.unique(block[block >= 0]):  # a few blocks, each a bounded number of groups
            at = np.flatnonzero(block == b)
            _, columns, final = self.blocks[b]
            rows = final[row_in_block[groups[at]]]
            if len(columns) == self.n_workers:
                out[at] = rows
            else:
                out[np.ix_(at, columns)] = rows
        return out


def _special_sums(
    wk: WorkerArrays,
    rq: RequestArrays,
    cols: GateColumns,
    sets: ModelSets,
    flags: FlagTables,
    special: SpecialGroups,
    excluded: tuple[np.ndarray, np.ndarray],
    w_values: np.ndarray,
    keep_workers: bool,
) -> SpecialSums:
    """The sums of each special group, evaluated a block of groups at a time."""
    nw, n_special = len(cols.worker_rows), special.n
    sums = np.zeros((n_special, 3))
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    if n_special and nw:
        step = max(1, BLOCK_ELEMENTS // nw)
        reps = special.representative
        # A whitelisted group can take only its targets: its block reads those
        # workers alone. Other groups of alike model sets share a block, so that
        # a block reads only the workers whose sets overlap one of its groups'
        # (the others fail the model gate): cost follows those workers, not all.
        listed = (rq.targets.lengths[reps] > 0) & ~rq.blacklist[reps]
        position = positions_among(cols.worker_rows, len(wk.ids))  # worker row -> usable worker, -1 -> -1
        local = np.full(len(wk.ids), -1, dtype=np.int64)
        for part in (np.flatnonzero(~listed), np.flatnonzero(listed)):
            by_set = part[np.argsort(sets.r_set[reps[part]], kind="stable")]
            for start in range(0, len(part), step):
                sg = by_set[start : start + step]
                reqs = reps[sg]
                if listed[sg[0]]:
                    columns = np.unique(position[rq.targets.take(reqs).values])
                    columns = columns[columns >= 0]
                else:
                    reach = np.bitwise_or.reduce(sets.worker_words[sets.r_set[reqs]], axis=0)
                    columns = np.flatnonzero(unpack_words(reach[None, :], nw)[0])
                if 2 * len(columns) > nw:  # most workers: whole rows cost less than picking columns
                    columns = np.arange(nw)
                local[cols.worker_rows[columns]] = np.arange(len(columns))
                final = _special_block(wk, rq, cols, sets, flags, special, excluded, local, reqs, columns)
                local[cols.worker_rows[columns]] = -1
                sums[sg] = bit_sums(pack_words(final), w_values[columns])
                if keep_workers:
                    blocks.append((sg, columns, final))
    return SpecialSums(sums, blocks, nw, keep_workers)


def _classes_present(final: np.ndarray, groups: np.ndarray, column_class: np.ndarray, n_class: int) -> np.ndarray:
    """``group * n_class + class`` for each take class among each group's eligible workers (``final`` rows).

    Most classes have a worker or two: the j-th worker of every class having
    one is ORed in as a column gather, for the first :data:`FEW_MEMBERS`; the
    rest of larger classes by one OR reduction over their runs of columns
    (a reduction over every class's run cost 1.5-2x more: one run per class).
    """
    by_class = np.argsort(column_class, kind="stable")
    sorted_class = column_class[by_class]
    starts = np.flatnonzero(np.r_[True, sorted_class[1:] != sorted_class[:-1]])
    sizes = np.diff(np.r_[starts, len(by_class)])
    present = np.take(final, by_class[starts], axis=1)
    for j in range(1, min(int(sizes.max()), FEW_MEMBERS)):
        having = np.flatnonzero(sizes > j)
        present[:, having] |= np.take(final, by_class[starts[having] + j], axis=1)
    large = np.flatnonzero(sizes > FEW_MEMBERS)
    if len(large):  # members past the first FEW_MEMBERS, class by class in runs
        rest = np.repeat(starts[large] + FEW_MEMBERS - np.r_[0, np.cumsum(sizes[large] - FEW_MEMBERS)[:-1]], sizes[large] - FEW_MEMBERS)
        columns = by_class[np.arange(len(rest)) + rest]
        runs = np.r_[0, np.cumsum(sizes[large] - FEW_MEMBERS)[:-1]]
        present[:, large] |= np.logical_or.reduceat(np.take(final, columns, axis=1), runs, axis=1)
    group, klass = np.nonzero(present)
    return groups[group] * n_class + sorted_class[starts][klass]


# _classes_present ORs this many first workers of each class column by column.
FEW_MEMBERS = 8


def _special_block(
    wk: WorkerArrays,
    rq: RequestArrays,
    cols: GateColumns,
    sets: ModelSets,
    flags: FlagTables,
    special: SpecialGroups,
    excluded: tuple[np.ndarray, np.ndarray],
    local: np.ndarray,
    reqs: np.ndarray,
    columns: np.ndarray,
) -> np.ndarray:
    """``final[i, j]``: usable worker ``columns[j]`` is eligible for request ``reqs[i]``.

    ``local`` maps a worker row to its place in ``columns`` (-1 elsewhere).
    """
    wr = cols.worker_rows[columns]
    w_flags = flags.w_flags[columns]
    overlapping = unpack_words(sets.worker_words[sets.r_set[reqs]], len(cols.worker_rows))
    if len(columns) < len(cols.worker_rows):
        overlapping = np.take(overlapping, columns, axis=1)
    other = overlapping & np.take(flags.passes[flags.r_flags[reqs]], w_flags, axis=1)
    # Maintenance workers serve only their owner; they are few, so only their columns are read.
    maintained = np.flatnonzero(wk.maintenance[wr])
    if len(maintained):
        owner = np.where(special.owns_maintenance[reqs], rq.user[reqs], -1)
        other[:, maintained] &= wk.user[wr[maintained]] == owner[:, None]
    targeted = rq.targets.take(reqs)
    t_local = local[np.maximum(targeted.values, 0)]
    t_ok = (targeted.values >= 0) & (t_local >= 0)
    t_row, t_col = targeted.owners()[t_ok], t_local[t_ok]
    # A blacklist clears its workers; a whitelist keeps its workers only.
    blacklist = rq.blacklist[reqs]
    on_black = blacklist[t_row]
    other[t_row[on_black], t_col[on_black]] = False
    white = np.flatnonzero((targeted.lengths > 0) & ~blacklist)
    if len(white):
        white_row = np.full(len(reqs), -1, dtype=np.int64)
        white_row[white] = np.arange(len(white))
        mask = np.zeros((len(white), len(columns)), dtype=bool)
        mask[white_row[t_row[~on_black]], t_col[~on_black]] = True
        other[white] &= mask
    ex_workers, ex_requests = excluded
    hit = np.isin(ex_requests, reqs)
    if hit.any():
        row_of = pd.Index(reqs).get_indexer(ex_requests[hit])
        ex_local = local[ex_workers[hit]]
        ok = ex_local >= 0
        other[row_of[ok], ex_local[ok]] = False
    if flags.speed_ok.all():  # no speed gate (image)
        return other
    fast = np.take(flags.speed_ok[flags.r_flags[reqs]], w_flags, axis=1)
    fast &= other
    # A chat request keeps to fast workers unless none passes its other gates.
    slow = np.flatnonzero(cols.chat[reqs] & ~fast.any(axis=1))
    fast[slow] = other[slow]
    return fast


# -- step 7: what each row's eligible workers could take ----------------------------------


def _takes(
    wk: WorkerArrays,
    cols: GateColumns,
    gates: _GentypeGates,
    sets: ModelSets,
    flags: FlagTables,
    shared: SharedGroups,
    found: SpecialSums,
    queue_position: np.ndarray | None = None,
) -> Takes:
    """What each row's eligible workers could take, formed when first read (:class:`Takes`)."""

    def form() -> TakeTables:
        # Take classes: (worker set, chat mode and limits) or (worker set, size rank).
        w_class, class_first = _take_classes(wk, cols, sets)
        signature, n_signatures, class_rows, appearance = _signatures(
            wk, cols, gates, sets, class_first, queue_position)
        return TakeTables(signature, n_signatures, class_rows, w_class, class_first, appearance)

    def rows_for(tables: TakeTables, class_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w_class, class_first = tables.worker_class, tables.class_first
        n_class, n_special = len(class_first), len(found.sums)
        zero = np.zeros((1, class_rows.shape[1]), dtype=np.uint64)
        # The shared rows are stack.take(shared_first) (distinct), never copied out before the end.
        stack, shared_first, shared_of = StackedRows.of([zero]), np.zeros(1, np.int64), np.zeros(shared.n, np.int64)
        special_rows, special_of = zero, np.zeros(n_special, np.int64)
        if shared.n and n_class:
            stack, shared_first, shared_of = _shared_takeable(wk, cols, sets, flags, shared, w_class, class_first, class_rows)
        pair = found.present(w_class, n_class) if n_special and n_class else np.zeros(0, np.int64)
        if len(pair):  # (special group, class), deduplicated per block
            special_rows, special_of = _or_rows_by_key(pair // n_class, pair % n_class, class_rows, n_special)
        # Special rows often equal shared ones: one code over both. Codes are numbered by first
        # appearance over the shared rows, then each special group's row: competition's classes
        # follow this order, and its cost depends on it (measured: 1.5x at 50k in another order).
        n_before = len(stack)
        stack = stack.extended([special_rows])
        appearance = np.r_[shared_first, n_before + special_of]
        code, first = stack.codes(appearance)
        return stack.take(appearance[first]), code[np.r_[shared_of, len(shared_first) + np.arange(len(special_of))]]

    return Takes(form, rows_for)


def _signatures(
    wk: WorkerArrays, cols: GateColumns, gates: _GentypeGates, sets: ModelSets, class_first: np.ndarray,
    queue_position: np.ndarray | None = None,
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """Each request's signature, merged where every take class treats them alike; their count; each class's row.

    And each signature's number by first appearance in row order (:attr:`TakeTables.appearance`).
    Signatures are numbered by birth given ``queue_position`` (see :func:`eligibility`), else by that
    first appearance.
    """
    r_kind, r_kind_first = factorize_rows(*cols.r_kind)
    w_kind, w_kind_first = factorize_rows(*cols.w_kind)
    kinds_ok = gates.kind([c[r_kind_first] for c in cols.r_kind], [c[w_kind_first] for c in cols.w_kind])
    raw_sig, raw_sig_first = factorize_rows(sets.r_set, r_kind)
    # can_take[s, c]: take class c could take signature s; packed over classes per request set
    # (the overlap) and per request kind, ANDed per signature.
    by_set = _overlap_words(sets.set_models, wk.models.take(cols.worker_rows[class_first]))
    by_kind = _packed_columns(kinds_ok, w_kind[class_first])
    can_take = by_set[sets.r_set[raw_sig_first]] & by_kind[r_kind[raw_sig_first]]
    merged_of, merged_first = row_codes(can_take)
    signature = merged_of[raw_sig]
    appearance = np.arange(len(merged_first))
    if queue_position is not None and len(merged_first):
        # Renumbered by birth: the signatures' rows are gathered in that order (the gather's order is free).
        birth = np.full(len(merged_first), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(birth, signature, queue_position.astype(np.int64, copy=False))
        appearance = np.argsort(birth, kind="stable")  # new number k: the signature first appearing appearance[k]-th
        merged_first = merged_first[appearance]
        new_id = np.empty_like(appearance)
        new_id[appearance] = np.arange(len(appearance))
        signature = new_id[signature]
    class_rows = transpose_words(can_take[merged_first], len(class_first))  # class -> signatures
    return signature, len(merged_first), class_rows, appearance


def _shared_takeable(
    wk: WorkerArrays,
    cols: GateColumns,
    sets: ModelSets,
    flags: FlagTables,
    shared: SharedGroups,
    w_class: np.ndarray,
    class_first: np.ndarray,
    class_rows: np.ndarray,
) -> tuple[StackedRows, np.ndarray, np.ndarray]:
    """Per shared group, the OR of the rows of the take classes among its eligible workers.

    Returns ``(stack, first, of)`` as :func:`_or_combinations` does.

    present[g, c] = overlap[set of g, set of c] and some worker of class c
    passes g's flags. overlap(request set, class set) is an OR over the
    request's models, so a group's row is the OR over its models m of one row
    per (m, variant, flags) key: the classes holding m whose workers pass
    those flags (flags passing the same classes share keys). A group naming one model reads a single key; one naming none
    reads the key of "any model" (m = -1), which every class holds.
    """
    n_group, n_class = shared.n, len(class_first)
    flags_by_class = _flags_by_class(w_class, flags.w_flags, n_class, flags.passes_base, flags.fast_base)
    variant = shared.g_fast.astype(np.int64)
    sizes = sets.set_models.lengths[shared.g_set]
    named = np.repeat(np.arange(n_group), sizes)
    key_group = np.r_[named, np.flatnonzero(sizes == 0)]
    key_model = np.r_[sets.set_models.take(shared.g_set).values, np.full(int((sizes == 0).sum()), -1)]
    # (variant, flags) passing the same classes give alike keys for every model: one code for them.
    n_rflags = flags_by_class.shape[2]
    passing_code, code_first = row_codes(pack_words(flags_by_class.transpose(0, 2, 1).reshape(2 * n_rflags, n_class)))
    g_passing = passing_code[variant * n_rflags + shared.g_flags]
    key_of_pair, key_first = factorize_rows(key_model, g_passing[key_group])
    k_model = key_model[key_first]
    k_first = code_first[g_passing[key_group[key_first]]]  # a (variant, flags) of each key
    # Each key's classes as bits: (classes holding its model) AND (classes passing its flags).
    holding = _model_class_bits(wk, cols, class_first, k_model)
    codes, k_code = np.unique(k_first, return_inverse=True)
    passing = np.packbits(flags_by_class[codes // n_rflags, :, codes % n_rflags], axis=1, bitorder="little")
    key_rows, key_row = _or_rows_by_key_bits(holding & passing[k_code.ravel()], class_rows)
    stack = StackedRows.of([key_rows])
    key_code, distinct_first = stack.codes(np.arange(len(key_rows)))  # keys of alike classes take alike
    return _or_combinations(key_group, key_code[key_row[key_of_pair]], stack, distinct_first, n_group)


def _or_combinations(
    key: np.ndarray, source: np.ndarray, stack: StackedRows, rows_at: np.ndarray, n_keys: int
) -> tuple[StackedRows, np.ndarray, np.ndarray]:
    """``(stack, first, of)``: key ``k``'s OR of the rows its pairs name is row ``of[k]`` of ``stack.take(first)``.

    Source ``s`` names the row ``stack.take(rows_at[s])`` (``stack``: one part).
    A key of one source reads that row as it is (most groups name one model);
    keys of several sources are ORed once per distinct set of sources. The
    rows of ``stack.take(first)`` are distinct, numbered by first appearance
    over the named rows, the zero row and the ORs; the returned stack holds
    the ORs too, and no row is copied but those ORed.
    """
    n_rows = len(rows_at)
    _, pair_first = factorize_rows(key, source)
    key, source = key[pair_first], source[pair_first]  # repeats dropped
    n_sources = np.bincount(key, minlength=n_keys)
    of = np.full(n_keys, n_rows, dtype=np.int64)  # keys of no source read the zero row appended
    one = n_sources[key] == 1
    of[key[one]] = source[one]
    several = ~one
    order = np.argsort(key[several], kind="stable")
    s_sorted = source[several][order]
    multi = np.flatnonzero(n_sources > 1)
    lists = ListColumn(np.r_[0, np.cumsum(n_sources[multi])].astype(np.int64), s_sorted)
    combination, combination_first = factorize_rows(set_codes(lists, n_rows))
    pair_owner = np.repeat(np.arange(len(multi)), n_sources[multi])
    is_first = np.zeros(len(multi), dtype=bool)
    is_first[combination_first] = True
    keep = is_first[pair_owner]  # the pairs of one key per combination
    rows = stack.parts[0]
    ored = or_rows_by_pairs(combination[pair_owner[keep]], rows_at[s_sorted[keep]], rows, len(combination_first))
    of[multi] = n_rows + 1 + combination
    n_stacked = len(stack)
    stack = stack.extended([np.zeros((1, rows.shape[1]), dtype=rows.dtype), ored])
    # Positions of the named rows, the zero row and the ORs, in that order.
    listed = np.r_[rows_at, np.arange(n_stacked, len(stack))]
    codes, first = stack.codes(listed)
    return stack, listed[first], codes[of]


def _model_class_bits(wk: WorkerArrays, cols: GateColumns, class_first: np.ndarray, k_model: np.ndarray) -> np.ndarray:
    """Per key, the take classes holding its model (all for -1), packed little-endian (bit b of byte r: class 8r + b)."""
    n_class = len(class_first)
    class_models = _distinct_models(wk.models.take(cols.worker_rows[class_first]))
    models, key_model = np.unique(k_model, return_inverse=True)
    at = np.minimum(np.searchsorted(models, class_models.values), len(models) - 1)
    named = models[at] == class_models.values
    holds = np.zeros((len(models), n_class), dtype=bool)
    holds[at[named], class_models.owners()[named]] = True
    holds[models < 0] = True
    return np.packbits(holds, axis=1, bitorder="little")[key_model.ravel()]


def _distinct_models(lists: ListColumn) -> ListColumn:
    """Each list without repeats (sorted)."""
    owners = lists.owners()
    values = lists.values.astype(np.int64)
    order = np.lexsort((values, owners))
    owners, values = owners[order], values[order]
    keep = np.r_[True, (owners[1:] != owners[:-1]) | (values[1:] != values[:-1])] if len(values) else np.zeros(0, bool)
    owners, values = owners[keep], values[keep]
    offsets = np.r_[0, np.cumsum(np.bincount(owners, minlength=len(lists)))].astype(np.int64)
    return ListColumn(offsets, values)


def _flags_by_class(
    w_class: np.ndarray, w_flags: np.ndarray, n_class: int, passes_base: np.ndarray, fast_base: np.ndarray
) -> np.ndarray:
    """``out[variant, class, request flags]``: some worker of the class passes those flags.

    Variant 0 uses every gate but speed, variant 1 the speed gate too.
    """
    n_rflags = passes_base.shape[0]
    out = np.zeros((2, n_class, n_rflags), dtype=bool)
    if n_class == 0:
        return out
    pairs, pair_first = factorize_rows(w_class, w_flags)
    p_class, p_flags = w_class[pair_first], w_flags[pair_first]
    order = np.argsort(p_class, kind="stable")
    starts = np.searchsorted(p_class[order], np.arange(n_class))
    for variant, table in enumerate((passes_base, fast_base)):
        words = pack_words(np.ascontiguousarray(table.T[p_flags[order]]))  # (pairs, request flags)
        out[variant] = unpack_words(or_by_segments(words, starts), n_rflags)
    return out


def _or_rows_by_key(key: np.ndarray, source: np.ndarray, rows: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct, of)``: ``distinct[of[k]]`` = OR of ``rows[source[i]]`` over the pairs ``i`` with ``key[i] == k``.

    Keys with the same set of sources are answered once: many groups (all
    "any model" groups with alike flags, say) OR the same classes. Where its
    (sources / 8, keys) byte table fits in :data:`DENSE_TABLE_BYTES`,
    :func:`vecsched.core.groups.or_rows_dense` answers instead: it ORs eight
    sources at a time and needs no sort. Where keys have few sources each (groups
    ORing their models' key rows), :func:`vecsched.core.groups.or_rows_by_pairs`
    is cheaper still: its cost follows pairs x words, not the runs of sources.
    Rows of ``distinct`` may be equal; keys with the same sources share one.
    """
    out = np.zeros((n_keys, rows.shape[1]), dtype=rows.dtype)
    every = np.arange(n_keys)
    if len(key) == 0:
        return out, every
    pair_words = len(key) * rows.shape[1]
    if pair_words <= min(BLOCK_ELEMENTS, WORDS_PER_DENSE_RUN * -(-len(rows) // 8)):
        return or_rows_by_pairs(key, source, rows, n_keys), every
    if n_keys * -(-len(rows) // 8) <= DENSE_TABLE_BYTES:
        return or_distinct_dense(key, source, rows, n_keys)
    order = np.lexsort((source, key))
    key, source = key[order], source[order]
    lists = ListColumn(np.r_[0, np.cumsum(np.bincount(key, minlength=n_keys))].astype(np.int64), source)
    same_sources = set_codes(lists, len(rows))
    distinct, first = np.unique(same_sources, return_index=True)
    keep = np.isin(key, first)
    key, source = key[keep], source[keep]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, np.int64)
    step = max(1, BLOCK_ELEMENTS // max(rows.shape[1], 1))
    a = 0
    while a < len(starts):
        stop = max(int(np.searchsorted(starts, starts[a] + step, side="right")), a + 1)
        seg = starts[a:stop]
        end = starts[stop] if stop < len(starts) else len(key)
        out[key[seg]] = or_by_segments(rows[source[seg[0] : end]], seg - seg[0])
        a = stop
    # Every key takes the row of the first key with its set of sources.
    return out, first[np.searchsorted(distinct, same_sources)]


def _or_rows_by_key_bits(key_bits: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_or_rows_by_key` for keys given as source bits (:func:`vecsched.core.groups.or_rows_by_bits`).

    Where the eight-at-a-time OR would be chosen, it reads the bits as they
    are; elsewhere the bits become (key, source) pairs, a block of keys at a time.
    """
    n_keys, n_runs = key_bits.shape
    n_pairs = int(np.bitwise_count(key_bits).sum(dtype=np.int64))
    pair_words = n_pairs * rows.shape[1]
    by_pairs = pair_words <= min(BLOCK_ELEMENTS, WORDS_PER_DENSE_RUN * -(-len(rows) // 8))
    if n_pairs and not by_pairs and n_keys * n_runs <= DENSE_TABLE_BYTES:
        return or_distinct_by_bits(key_bits, rows)
    step = max(1, BLOCK_ELEMENTS // max(n_runs * 8, 1))
    pairs = [np.nonzero(np.unpackbits(key_bits[a : a + step], axis=1, count=len(rows), bitorder="little"))
             for a in range(0, n_keys, step)]
    key = np.concatenate([np.zeros(0, np.int64)] + [k + a for a, (k, _) in zip(range(0, n_keys, step), pairs)])
    source = np.concatenate([np.zeros(0, np.int64)] + [c for _, c in pairs])
    return _or_rows_by_key(key, source, rows, n_keys)


def _row_words(
    wk: WorkerArrays,
    rq: RequestArrays,
    cols: GateColumns,
    sets: ModelSets,
    flags: FlagTables,
    shared: SharedGroups,
    special: SpecialGroups,
    excluded: tuple[np.ndarray, np.ndarray],
    found: SpecialSums,
) -> Callable[[np.ndarray], np.ndarray]:
    """The eligible workers of result rows as :func:`pack_words` rows, on demand.

    A shared row's workers are its model overlap AND its flag table row (the
    very packed tables its sums add over, :meth:`SharedGroups.words`), so a
    row costs a few words; a special
    row's are its representative evaluated by :func:`_special_block`, unless
    kept already. Nothing is evaluated until called.
    """
    local = np.full(len(wk.ids), -1, dtype=np.int64)
    local[cols.worker_rows] = np.arange(len(cols.worker_rows))
    nw = len(cols.worker_rows)
    step = max(1, BLOCK_ELEMENTS // max(nw, 1))

    def words(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.zeros((len(rows), -(-max(nw, 1) // 64)), dtype=np.uint64)
        mine = np.flatnonzero(rows < shared.n)
        if len(mine):
            group = rows[mine]
            variant = shared.g_fast[group].astype(np.int64)  # 0: every gate but speed, 1: speed too
            out[mine] = shared.words(group, variant)
        mine = np.flatnonzero(rows >= shared.n)
        for a in range(0, len(mine) if nw else 0, step):
            at = mine[a : a + step]
            group = rows[at] - shared.n
            if found.kept:
                out[at] = pack_words(found.workers(group))
            else:
                reps = special.representative[group]
                out[at] = pack_words(_special_block(wk, rq, cols, sets, flags, special, excluded, local, reps, np.arange(nw)))
        return out

    return words
