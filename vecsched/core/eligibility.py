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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from vecsched.core.arrays import RequestArrays, WorkerArrays
from vecsched.snapshot.schema import CHAT_NONE, CHAT_ONLY, TEXT
from vecsched.core.groups import (
    factorize_rows,
    or_by_segments,
    overlap_matrix,
    pack_words,
    set_codes,
    unique_rows,
    unpack_words,
)
from vecsched.snapshot.lists import ListColumn

# Elements per temporary block; bounds peak memory whatever the horde's size.
BLOCK_ELEMENTS = 1 << 23


@dataclass
class Eligibility:
    """Eligibility of the requests of one gentype (arrays aligned with the requests)."""

    workers: np.ndarray  # eligible worker count
    threads: np.ndarray  # eligible threads
    throughput: np.ndarray  # sum of speed * threads
    row: np.ndarray  # the request's row in ``takeable``
    takeable: np.ndarray | None  # 64-bit words: the signatures each row could take
    signature: np.ndarray | None  # each request's (merged) signature
    n_signatures: int = 0
    n_groups: int = 0
    n_special: int = 0
    n_declarations: int = 0
    # With competition: each take class's signatures (64-bit words) and the
    # take class of each usable worker of the gentype (in worker row order).
    class_rows: np.ndarray | None = None
    worker_class: np.ndarray | None = None
    # With every_request_special: each special group's eligible workers.
    eligible_workers: np.ndarray | None = None


def _rank(limits: np.ndarray, values: np.ndarray) -> np.ndarray:
    """How many distinct ``limits`` are below each value: value <= limits[k] iff rank <= k."""
    return np.searchsorted(limits, values, side="left")


def eligibility(
    wk: WorkerArrays,
    rq: RequestArrays,
    gentype: int,
    excluded: tuple[np.ndarray, np.ndarray],
    vocabulary_size: int,
    with_competition: bool,
    every_request_special: bool = False,
) -> Eligibility:
    """Eligible workers, threads and throughput of each request of ``gentype``, and what it could take.

    ``excluded`` holds (worker row, request position in ``rq``) pairs.
    ``every_request_special`` evaluates every request worker by worker and
    returns its eligible workers (for one-off requests; slow for a queue).
    """
    text = gentype == TEXT
    worker_rows = np.flatnonzero(wk.usable & (wk.gentype == gentype))
    nw, n_req = len(worker_rows), len(rq.ids)

    # -- limits as ranks among the values workers declare ------------------------------
    if text:
        len_limits = np.unique(np.r_[wk.max_length[worker_rows], wk.chat_max_length[worker_rows]])
        ctx_limits = np.unique(np.r_[wk.max_context_length[worker_rows], wk.chat_max_context_length[worker_rows]])
        r_len, r_ctx = _rank(len_limits, rq.max_length), _rank(ctx_limits, rq.max_context_length)
        w_mode = wk.chat_mode[worker_rows]
        w_len = _rank(len_limits, wk.max_length[worker_rows])
        w_ctx = _rank(ctx_limits, wk.max_context_length[worker_rows])
        w_clen = _rank(len_limits, wk.chat_max_length[worker_rows])
        w_cctx = _rank(ctx_limits, wk.chat_max_context_length[worker_rows])
        w_kind_cols = (w_mode, w_len, w_ctx, w_clen, w_cctx)
        w_flag_cols = w_kind_cols + (
            wk.below_floor[worker_rows],
            wk.maintenance[worker_rows],
            wk.nsfw[worker_rows],
            wk.trusted[worker_rows],
            wk.validated[worker_rows],
        )
        r_kind_cols = (rq.is_chat, r_len, r_ctx)
        r_flag_cols = r_kind_cols + (rq.slow_workers, rq.trusted_workers, rq.nsfw, rq.validated_backends)
    else:
        pix_limits = np.unique(wk.max_pixels[worker_rows])
        r_pix = _rank(pix_limits, rq.pixels)
        w_pix = _rank(pix_limits, wk.max_pixels[worker_rows])
        w_kind_cols = (w_pix,)
        w_flag_cols = w_kind_cols + (
            wk.image_slow[worker_rows],
            wk.extra_slow[worker_rows],
            wk.maintenance[worker_rows],
            wk.nsfw[worker_rows],
            wk.trusted[worker_rows],
            wk.has_bits[worker_rows],
        )
        r_kind_cols = (r_pix,)
        r_flag_cols = r_kind_cols + (
            rq.slow_workers,
            rq.extra_slow_workers,
            rq.trusted_workers,
            rq.nsfw,
            rq.need_bits,
        )

    # -- model sets and their overlap ----------------------------------------------
    r_set_codes, r_set_first, r_set = np.unique(rq.model_set, return_index=True, return_inverse=True)
    r_set = r_set.ravel()
    w_set_codes, w_set_first, w_set = np.unique(wk.model_set[worker_rows], return_index=True, return_inverse=True)
    w_set = w_set.ravel()
    overlap = overlap_matrix(rq.models.take(r_set_first), wk.models.take(worker_rows[w_set_first]), vocabulary_size)
    overlap[r_set_codes == 0, :] = True  # a request naming no model takes any

    # -- flag combinations and the flag gates ------------------------------------------
    w_flags, w_flags_first = factorize_rows(*w_flag_cols)
    r_flags, r_flags_first = factorize_rows(*r_flag_cols)
    wf = [c[w_flags_first] for c in w_flag_cols]
    rf = [c[r_flags_first][:, None] for c in r_flag_cols]
    if text:
        mode, wlen, wctx, wclen, wcctx, below, maint, wnsfw, wtrusted, wvalid = wf
        chat, rlen, rctx, slow, rtrusted, rnsfw, rvalid = rf
        passes = (~rnsfw | wnsfw) & (~rtrusted | wtrusted) & (~rvalid | wvalid)
        passes &= np.where(chat, mode != CHAT_NONE, mode != CHAT_ONLY)
        passes &= np.where(chat, (rlen <= wclen) & (rctx <= wcctx), (rlen <= wlen) & (rctx <= wctx))
        # A plain request that accepts slow workers is not speed-gated; a chat
        # request is, with the fallback applied per group below.
        speed_ok = ~below | (~chat & slow)
        flags_chat = rq.is_chat[r_flags_first]
    else:
        wpix, wslow, wxslow, maint, wnsfw, wtrusted, whas = wf
        rpix, slow, xslow, rtrusted, rnsfw, need = rf
        passes = (~rnsfw | wnsfw) & (~rtrusted | wtrusted) & (rpix <= wpix)
        passes &= (~wslow | slow) & (~wxslow | xslow) & ((need & ~whas) == 0)
        speed_ok = np.ones_like(passes)
        flags_chat = np.zeros(len(r_flags_first), dtype=bool)
    # Maintenance workers serve only their owner: never in a group's shared row.
    passes_base = passes & ~maint
    fast_base = passes_base & speed_ok

    # -- request groups: (request set, request flags) -----------------------------------
    group_of, group_first = factorize_rows(r_set, r_flags)
    g_set, g_flags = r_set[group_first], r_flags[group_first]
    n_group = len(group_first)

    # -- sums over eligible workers, per group ------------------------------------------
    w_speed_threads = wk.speed[worker_rows] * wk.threads[worker_rows]
    w_values = np.stack([np.ones(nw), wk.threads[worker_rows].astype(np.float64), w_speed_threads], axis=1)
    # Distinct models of each request set (repeats inside a request's list removed).
    set_models = _distinct_models(rq.models.take(r_set_first))
    sums_other = _group_sums(overlap, w_set, w_flags, w_values, passes_base, g_set, g_flags, set_models, vocabulary_size)
    sums_fast = (
        sums_other
        if not text
        else _group_sums(overlap, w_set, w_flags, w_values, fast_base, g_set, g_flags, set_models, vocabulary_size)
    )
    # A chat request keeps to fast workers unless none passes its other gates.
    g_fast = ~flags_chat[g_flags] | (sums_fast[:, 0] > 0)
    group_sums = np.where(g_fast[:, None], sums_fast, sums_other)

    # -- special groups: targeting, maintenance owners, excluded pairs -----------------
    ex_workers, ex_requests = excluded
    has_exclusion = np.zeros(n_req, dtype=bool)
    has_exclusion[ex_requests] = True
    maint_owners = np.unique(wk.user[worker_rows][wk.maintenance[worker_rows]])
    owns_maintenance = np.isin(rq.user, maint_owners)
    has_targets = rq.targets.lengths > 0
    special_rows = np.flatnonzero(has_targets | owns_maintenance | has_exclusion | every_request_special)
    if len(special_rows):
        # Requests alike in gates, targets, owner and excluded workers share one row:
        # one worker's word list hitting many prompts must not make each its own group.
        target_set = set_codes(ListColumn(rq.targets.offsets, rq.targets.values + 1), len(wk.ids) + 1)
        by_request = np.argsort(ex_requests, kind="stable")
        excluded_lists = ListColumn(
            np.r_[0, np.cumsum(np.bincount(ex_requests, minlength=n_req))].astype(np.int64),
            ex_workers[by_request].astype(np.int64),
        )
        excluded_set = set_codes(excluded_lists, len(wk.ids))
        special_of, special_first = factorize_rows(
            group_of[special_rows],
            target_set[special_rows],
            rq.blacklist[special_rows] & has_targets[special_rows],
            np.where(owns_maintenance[special_rows], rq.user[special_rows], -1),
            excluded_set[special_rows],
        )
    else:
        special_of, special_first = np.zeros(0, np.int64), np.zeros(0, np.int64)
    n_special = len(special_first)
    representative = special_rows[special_first]

    # Take classes: (worker set, chat mode and limits) or (worker set, size rank).
    w_class, class_first = factorize_rows(w_set, *w_kind_cols)
    n_class = len(class_first)

    special_sums = np.zeros((n_special, 3))
    special_workers = np.zeros((n_special, nw), dtype=bool) if every_request_special else None
    special_present: list[np.ndarray] = []
    if n_special and nw:
        local = np.full(len(wk.ids), -1, dtype=np.int64)
        local[worker_rows] = np.arange(nw)
        w_maint = wk.maintenance[worker_rows]
        w_user = wk.user[worker_rows]
        step = max(1, BLOCK_ELEMENTS // nw)
        for start in range(0, n_special, step):
            sg = np.arange(start, min(start + step, n_special))
            reqs = representative[sg]
            other = overlap[r_set[reqs]][:, w_set] & passes[r_flags[reqs]][:, w_flags]
            owner = np.where(owns_maintenance[reqs], rq.user[reqs], -1)
            other &= ~w_maint | (w_user == owner[:, None])
            targeted = rq.targets.take(reqs)
            t_local = local[np.maximum(targeted.values, 0)]
            t_ok = (targeted.values >= 0) & (t_local >= 0)
            mask = np.zeros_like(other)
            mask[targeted.owners()[t_ok], t_local[t_ok]] = True
            on_list = (targeted.lengths > 0)[:, None]
            other &= ~on_list | np.where(rq.blacklist[reqs][:, None], ~mask, mask)
            hit = np.isin(ex_requests, reqs)
            if hit.any():
                row_of = pd.Index(reqs).get_indexer(ex_requests[hit])
                ex_local = local[ex_workers[hit]]
                ok = ex_local >= 0
                other[row_of[ok], ex_local[ok]] = False
            fast = other & speed_ok[r_flags[reqs]][:, w_flags]
            chat = rq.is_chat[reqs] if text else np.zeros(len(reqs), dtype=bool)
            use_fast = ~chat | fast.any(axis=1)
            final = np.where(use_fast[:, None], fast, other)
            special_sums[sg] = final.astype(np.float64) @ w_values
            if special_workers is not None:
                special_workers[sg] = final
            if with_competition:
                rows, workers = np.nonzero(final)
                special_present.append(np.unique(sg[rows] * n_class + w_class[workers]))

    row = group_of.copy()
    row[special_rows] = n_group + special_of
    all_sums = np.concatenate([group_sums, special_sums])
    result = Eligibility(
        workers=np.rint(all_sums[row, 0]).astype(np.int64),
        threads=np.rint(all_sums[row, 1]).astype(np.int64),
        throughput=all_sums[row, 2],
        row=row,
        takeable=None,
        signature=None,
        n_groups=n_group,
        n_special=n_special,
        n_declarations=len(factorize_rows(w_set, w_flags)[1]),
    )
    result.eligible_workers = special_workers
    if not with_competition:
        return result

    # -- signatures, merged where every take class treats them alike ------------------
    r_kind, r_kind_first = factorize_rows(*r_kind_cols)
    w_kind, w_kind_first = factorize_rows(*w_kind_cols)
    kinds_ok = _kind_table(text, [c[r_kind_first] for c in r_kind_cols], [c[w_kind_first] for c in w_kind_cols])
    raw_sig, raw_sig_first = factorize_rows(r_set, r_kind)
    c_set, c_kind = w_set[class_first], w_kind[class_first]
    # can_take[s, c]: take class c could take signature s.
    can_take = overlap[np.ix_(r_set[raw_sig_first], c_set)] & kinds_ok[np.ix_(r_kind[raw_sig_first], c_kind)]
    merged_first, merged_of = unique_rows(pack_words(can_take))
    signature = merged_of[raw_sig]
    n_sig = len(merged_first)
    class_rows = pack_words(np.ascontiguousarray(can_take[merged_first].T))  # class -> signatures

    # -- which take classes each group's eligible workers belong to ---------------------
    # present[g, c] = overlap[set of g, set of c] and some worker of class c passes g's flags.
    flags_by_class = _flags_by_class(w_class, w_flags, n_class, passes_base, fast_base)
    takeable = np.zeros((n_group + n_special, class_rows.shape[1]), dtype=np.uint64)
    if n_group and n_class:
        # overlap(request set, class set) is an OR over the request's models, so a
        # group's row is the OR over its models m of one row per (m, variant,
        # flags) key: the classes holding m whose workers pass those flags.
        # A group naming one model reads a single key; one naming none reads the
        # key of "any model" (m = -1), which every class holds.
        variant = g_fast.astype(np.int64)
        sizes = set_models.lengths[g_set]
        named = np.repeat(np.arange(n_group), sizes)
        key_group = np.r_[named, np.flatnonzero(sizes == 0)]
        key_model = np.r_[set_models.take(g_set).values, np.full(int((sizes == 0).sum()), -1)]
        key_of_pair, key_first = factorize_rows(key_model, variant[key_group], g_flags[key_group])
        k_model = key_model[key_first]
        k_variant, k_flags = variant[key_group[key_first]], g_flags[key_group[key_first]]
        # Classes holding each model (all classes for "any model").
        class_models = _distinct_models(wk.models.take(worker_rows[class_first]))
        by_model = np.argsort(class_models.values, kind="stable")
        model_sorted = class_models.values[by_model]
        class_of_value = class_models.owners()[by_model]
        lo = np.searchsorted(model_sorted, k_model, side="left")
        hi = np.searchsorted(model_sorted, k_model, side="right")
        lo = np.where(k_model < 0, 0, lo)
        hi = np.where(k_model < 0, n_class, hi)
        counts = hi - lo
        pair_key = np.repeat(np.arange(len(key_first)), counts)
        within = np.arange(int(counts.sum())) - np.repeat(np.r_[0, np.cumsum(counts)[:-1]], counts)
        start = np.repeat(lo, counts) + within
        pair_class = start.copy()  # "any model" keys index classes directly
        named_pair = ~np.repeat(k_model < 0, counts)
        pair_class[named_pair] = class_of_value[start[named_pair]]
        passing = flags_by_class[k_variant[pair_key], pair_class, k_flags[pair_key]]
        key_rows = _or_rows_by_key(pair_key[passing], pair_class[passing], class_rows, len(key_first))
        takeable[:n_group] = _or_rows_by_key(key_group, key_of_pair, key_rows, n_group)
    if special_present and n_class:
        pair = np.concatenate(special_present)  # (special group, class), deduplicated per block
        takeable[n_group:] = _or_rows_by_key(pair // n_class, pair % n_class, class_rows, n_special)
    result.takeable = takeable
    result.class_rows = class_rows
    result.worker_class = w_class
    result.signature = signature
    result.n_signatures = n_sig
    return result


def _kind_table(text: bool, request_kind: list[np.ndarray], worker_kind: list[np.ndarray]) -> np.ndarray:
    """``ok[request kind, worker kind]``: the worker's mode and limits accept the request's kind."""
    if text:
        chat, rlen, rctx = (c[:, None] for c in request_kind)
        mode, wlen, wctx, wclen, wcctx = worker_kind
        ok = np.where(chat, mode != CHAT_NONE, mode != CHAT_ONLY)
        return ok & np.where(chat, (rlen <= wclen) & (rctx <= wcctx), (rlen <= wlen) & (rctx <= wctx))
    (rpix,) = (c[:, None] for c in request_kind)
    (wpix,) = worker_kind
    return rpix <= wpix


def _group_sums(
    overlap: np.ndarray,
    w_set: np.ndarray,
    w_flags: np.ndarray,
    w_values: np.ndarray,
    passes: np.ndarray,
    g_set: np.ndarray,
    g_flags: np.ndarray,
    set_models: ListColumn,
    n_models: int,
) -> np.ndarray:
    """Per group, the sums of ``w_values`` over workers passing both the model and flag gates.

    Sums are first formed per (worker set, request flags) over the worker
    declarations. A group naming no model then takes the total over worker
    sets; a group naming one model takes that model's total (the worker sets
    holding it), read from one product with the (model x worker set)
    incidence; only groups naming several models sum their overlap rows.
    ``set_models`` lists the models of each request set (in ``g_set`` codes).
    """
    n_group, k = len(g_set), w_values.shape[1]
    out = np.zeros((n_group, k))
    if n_group == 0 or len(w_set) == 0:
        return out
    n_wsets = overlap.shape[1]
    decl, decl_first = factorize_rows(w_set, w_flags)
    decl_values = np.zeros((len(decl_first), k))
    _add_rows(decl_values, decl, w_values)
    d_set, d_flags = w_set[decl_first], w_flags[decl_first]

    size = set_models.lengths[g_set]
    # The one model of each single-model request set, and a column per such model.
    one_model = size == 1
    only_model = set_models.values[set_models.offsets[:-1][g_set[one_model]]]
    models_used, model_col = np.unique(only_model, return_inverse=True)
    # incidence[m, s]: worker set s holds model models_used[m] (a request naming only m overlaps s).
    incidence = overlap[_single_model_sets(set_models, models_used)] if len(models_used) else np.zeros((0, n_wsets), bool)
    group_model = np.full(n_group, -1, dtype=np.int64)
    group_model[one_model] = model_col.ravel()

    used_flags, g_flag_col = np.unique(g_flags, return_inverse=True)
    g_flag_col = g_flag_col.ravel()
    step = max(1, BLOCK_ELEMENTS // max(n_wsets * k, 1))
    for a in range(0, len(used_flags), step):
        flags = used_flags[a : a + step]
        # per_set[s, j, f]: sum of value j over declarations of worker set s passing flags f.
        passing = passes[np.ix_(flags, d_flags)].T.astype(np.float64)
        per_set = np.zeros((n_wsets, k, len(flags)))
        for j in range(k):
            _add_rows(per_set[:, j, :], d_set, passing * decl_values[:, j : j + 1])
        mine = np.flatnonzero((g_flag_col >= a) & (g_flag_col < a + len(flags)))
        col = g_flag_col[mine] - a
        any_model = size[mine] == 0
        out[mine[any_model]] = per_set.sum(axis=0)[:, col[any_model]].T
        one = group_model[mine] >= 0
        if one.any():
            per_model = (incidence.astype(np.float64) @ per_set.reshape(n_wsets, -1)).reshape(len(models_used), k, len(flags))
            out[mine[one]] = per_model[group_model[mine[one]], :, col[one]]
        # Groups naming several models: their overlap rows times the worker-set
        # sums of their flags, one product per flag combination.
        several = mine[size[mine] > 1]
        several = several[np.argsort(g_flag_col[several], kind="stable")]
        flag_of = g_flag_col[several]
        bounds = np.flatnonzero(np.r_[True, flag_of[1:] != flag_of[:-1], True]) if len(several) else []
        rows_per_block = max(1, BLOCK_ELEMENTS // max(n_wsets, 1))
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            sums_by_set = per_set[:, :, flag_of[lo] - a]  # (worker sets, k)
            for b in range(lo, hi, rows_per_block):
                rows = several[b : min(b + rows_per_block, hi)]
                out[rows] = overlap[g_set[rows]].astype(np.float64) @ sums_by_set
    return out


def _single_model_sets(set_models: ListColumn, models: np.ndarray) -> np.ndarray:
    """For each model, a request set (row of ``set_models``) that names exactly that model."""
    sizes = set_models.lengths
    rows = np.flatnonzero(sizes == 1)
    only = set_models.values[set_models.offsets[:-1][rows]]
    order = np.argsort(only, kind="stable")
    return rows[order][np.searchsorted(only[order], models)]


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


def _add_rows(out: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """``out[index] += values`` row-wise, for large inputs (sorted segment sums)."""
    order = np.argsort(index, kind="stable")
    index, values = index[order], values[order]
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
    out[index[starts]] += np.add.reduceat(values, starts, axis=0)


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


def _or_rows_by_key(key: np.ndarray, source: np.ndarray, rows: np.ndarray, n_keys: int) -> np.ndarray:
    """``out[k]`` = OR of ``rows[source[i]]`` over the pairs ``i`` with ``key[i] == k``.

    Keys with the same set of sources are answered once: many groups (all
    "any model" groups with alike flags, say) OR the same classes.
    """
    out = np.zeros((n_keys, rows.shape[1]), dtype=rows.dtype)
    if len(key) == 0:
        return out
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
    return out[first[np.searchsorted(distinct, same_sources)]]
