"""The vectorized estimator: SPEC.md sections 3 to 6 for every waiting request at once.

How the work is shaped, and why:

* Requests with the same gates (models, lengths, flags, options) form a
  *request group*; online, unpaused workers with the same declarations form a
  *worker declaration*. Gates are evaluated once per (group, declaration) pair
  on small dense boolean blocks, never per (request, worker).
* What depends on a worker's identity or a request's owner (targeting,
  maintenance workers serving their owner, excluded pairs) is rare. Requests
  it touches form *special groups* whose eligibility is expanded to single
  workers; everyone else reads their group's row.
* "Could take" only looks at a worker's *take class* (models, chat mode,
  limits) and a queued request's *take signature* (models, chat flag, length
  buckets), so it is a (class x signature) table. A request's eligible workers
  reduce to the set of signatures they could take; requests with the same set
  form a *competition class*.
* Per competition class, the work ahead of each member is summed either with a
  per-signature ``searchsorted`` on prefix sums (few members) or one dense
  prefix sum over the queue (many members), whichever costs less.

Lengths and image sizes only matter through comparisons with worker limits,
so they are replaced by their rank among the limit values workers declare,
which merges requests that no worker could tell apart.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter
from typing import Iterator

import numpy as np
import pandas as pd

from . import _rules as rules
from ._columns import (
    CHAT_NONE,
    CHAT_ONLY,
    IMAGE,
    JOB_FAULTED,
    JOB_FINISHED,
    JOB_PROCESSING,
    SOURCE_PROCESSING,
    TEXT,
)
from ._estimates import EstimateOptions, Estimates
from ._groups import factorize_rows, overlap_matrix, set_codes
from ._snapshot import ListColumn, Snapshot

# Elements per temporary (group x declaration) block; bounds peak memory.
BLOCK_ELEMENTS = 1 << 23

# What an image request may need of a worker, one bit each.
NEED_BITS = (
    "img2img",
    "painting",
    "post_processing",
    "controlnet",
    "lora",
    "textual_inversion",
    "hires_fix",
    "tiling",
    "transparent",
    "extra_source_images",
    "r2",
)
NEED = {name: np.uint16(1 << k) for k, name in enumerate(NEED_BITS)}


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
# Inputs as arrays
# ---------------------------------------------------------------------------------


@dataclass
class WorkerArrays:
    """Per-worker columns the gates read, derived once per snapshot."""

    ids: np.ndarray
    gentype: np.ndarray
    online: np.ndarray
    usable: np.ndarray
    speed: np.ndarray  # effective: measured, or assumed when there are no samples
    threads: np.ndarray
    user: np.ndarray  # owner code, shared with request user codes
    maintenance: np.ndarray
    nsfw: np.ndarray
    trusted: np.ndarray
    model_set: np.ndarray
    models: ListColumn
    below_floor: np.ndarray
    validated: np.ndarray
    chat_mode: np.ndarray
    max_length: np.ndarray
    max_context_length: np.ndarray
    chat_max_length: np.ndarray
    chat_max_context_length: np.ndarray
    max_pixels: np.ndarray
    image_slow: np.ndarray
    extra_slow: np.ndarray
    has_bits: np.ndarray  # NEED bits this worker satisfies


@dataclass
class RequestArrays:
    """Columns of the waiting requests only, in snapshot order."""

    index: np.ndarray  # row in the snapshot's request table
    ids: np.ndarray
    user: np.ndarray
    gentype: np.ndarray
    priority: np.ndarray
    created: np.ndarray
    n: np.ndarray
    jobs: np.ndarray
    output: np.ndarray  # per job: tokens, or pixel-steps
    model_set: np.ndarray
    models: ListColumn
    is_chat: np.ndarray
    slow_workers: np.ndarray
    trusted_workers: np.ndarray
    nsfw: np.ndarray
    validated_backends: np.ndarray
    max_length: np.ndarray
    max_context_length: np.ndarray
    pixels: np.ndarray
    extra_slow_workers: np.ndarray
    need_bits: np.ndarray
    targets: ListColumn  # worker row indices, -1 for ids not in the snapshot
    blacklist: np.ndarray


def worker_arrays(snapshot: Snapshot, user_codes: np.ndarray) -> WorkerArrays:
    w = snapshot.workers
    n = len(w)
    gentype = w.gentype
    online = (snapshot.now - w.last_check_in) <= rules.ONLINE_WINDOW_SECONDS
    assumed = np.where(gentype == TEXT, rules.ASSUMED_TEXT_SPEED, rules.ASSUMED_IMAGE_SPEED)
    speed = np.where(np.isnan(w.speed), assumed, w.speed)

    vocab = snapshot.model_names
    params = rules.text_model_parameters()
    vocab_params = np.fromiter((params.get(name, 0.0) for name in vocab), dtype=np.float64, count=len(vocab))
    inpainting = rules.inpainting_models()
    vocab_inpaint = np.fromiter((name in inpainting for name in vocab), dtype=bool, count=len(vocab))

    models: ListColumn = w.models
    # The speed floor follows the size of the first model a worker advertises.
    has_models = models.lengths > 0
    first_params = np.zeros(n)
    first_params[has_models] = vocab_params[models.values[models.offsets[:-1][has_models]]]
    below_floor = speed < rules.text_speed_floor(first_params)

    names, versions = rules.parse_bridge_agents(w.bridge_agent)
    validated = np.isin(names, list(rules.VALIDATED_TEXT_BRIDGES))
    cap_by_version = np.array([rules.bridge_capabilities(rules.IMAGE_BRIDGE, v) for v in range(10)], dtype=np.uint16)
    caps = np.where(names == rules.IMAGE_BRIDGE, cap_by_version[np.clip(versions, 0, 9)], 0).astype(np.uint16)

    can_paint = np.zeros(n, dtype=bool)
    if len(models.values):
        can_paint = np.bincount(models.owners(), weights=vocab_inpaint[models.values], minlength=n) > 0

    def cap(name: str) -> np.ndarray:
        return (caps & rules.CAP[name]) != 0

    has = np.zeros(n, dtype=np.uint16)
    for need, ok in (
        ("img2img", w.allow_img2img & cap("img2img")),
        ("painting", w.allow_painting & cap("inpainting") & can_paint),
        ("post_processing", w.allow_post_processing & cap("post_processing")),
        ("controlnet", w.allow_controlnet & cap("controlnet")),
        ("lora", w.allow_lora & cap("lora")),
        ("textual_inversion", cap("textual_inversion")),
        ("hires_fix", cap("hires_fix")),
        ("tiling", cap("tiling")),
        ("transparent", w.allow_sdxl_controlnet & cap("layer_diffuse")),
        ("extra_source_images", cap("extra_source_images")),
        ("r2", cap("r2")),
    ):
        has |= np.where(ok, NEED[need], 0).astype(np.uint16)

    return WorkerArrays(
        ids=w.id,
        gentype=gentype,
        online=online,
        usable=online & ~w.paused,
        speed=speed,
        threads=w.threads.astype(np.int64),
        user=user_codes,
        maintenance=w.maintenance,
        nsfw=w.nsfw,
        trusted=w.owner_trusted,
        model_set=set_codes(models, len(vocab)),
        models=models,
        below_floor=below_floor,
        validated=validated,
        chat_mode=w.chat_mode,
        max_length=w.max_length.astype(np.int64),
        max_context_length=w.max_context_length.astype(np.int64),
        chat_max_length=w.chat_max_length.astype(np.int64),
        chat_max_context_length=w.chat_max_context_length.astype(np.int64),
        max_pixels=w.max_pixels.astype(np.int64),
        image_slow=speed < rules.IMAGE_SLOW_SPEED,
        extra_slow=w.extra_slow_worker,
        has_bits=has,
    )


def request_arrays(snapshot: Snapshot, user_codes: np.ndarray, worker_index: pd.Index) -> RequestArrays:
    r = snapshot.requests
    waiting = r.active & ~r.faulted & (r.expiry > snapshot.now) & (r.n > 0)
    rows = np.flatnonzero(waiting)
    sub = r.take(rows)
    gentype = sub.gentype
    width = sub.width.astype(np.int64)
    height = sub.height.astype(np.int64)
    pixels = width * height
    output = np.where(gentype == TEXT, sub.max_length.astype(np.int64), pixels * sub.steps.astype(np.int64))

    processing = sub.source_processing
    painting = (processing == SOURCE_PROCESSING.index("inpainting")) | (
        processing == SOURCE_PROCESSING.index("outpainting")
    )
    need = np.zeros(len(rows), dtype=np.uint16)
    for name, used in (
        ("img2img", sub.source_image | (processing != SOURCE_PROCESSING.index("txt2img"))),
        ("painting", painting),
        ("post_processing", sub.post_processing > 0),
        ("controlnet", sub.control_type),
        ("lora", sub.loras),
        ("textual_inversion", sub.tis),
        ("hires_fix", sub.hires_fix),
        ("tiling", sub.tiling),
        ("transparent", sub.transparent),
        ("extra_source_images", sub.extra_source_images),
        ("r2", sub.r2),
    ):
        need |= np.where(used, NEED[name], 0).astype(np.uint16)

    target_ids: ListColumn = sub.worker_ids
    target_rows = worker_index.get_indexer(target_ids.values) if len(target_ids.values) else np.zeros(0, dtype=np.int64)
    return RequestArrays(
        index=rows,
        ids=sub.id,
        user=user_codes[rows],
        gentype=gentype,
        priority=sub.extra_priority.astype(np.int64),
        created=sub.created,
        n=sub.n.astype(np.int64),
        jobs=sub.jobs.astype(np.int64),
        output=output,
        model_set=set_codes(sub.models, len(snapshot.model_names)),
        models=sub.models,
        is_chat=sub.is_chat,
        slow_workers=sub.slow_workers,
        trusted_workers=sub.trusted_workers,
        nsfw=sub.nsfw,
        validated_backends=sub.validated_backends,
        max_length=sub.max_length.astype(np.int64),
        max_context_length=sub.max_context_length.astype(np.int64),
        pixels=pixels,
        extra_slow_workers=sub.extra_slow_workers,
        need_bits=need,
        targets=ListColumn(target_ids.offsets, np.asarray(target_rows, dtype=np.int64)),
        blacklist=sub.worker_blacklist,
    )


def queue_positions(priority: np.ndarray, created: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each request's place in queue order (priority desc, created asc, id asc)."""
    n = len(priority)
    order = np.lexsort((created, -priority))
    if n > 1:
        p, c = priority[order], created[order]
        tied = (p[1:] == p[:-1]) & (c[1:] == c[:-1])
        if tied.any():
            # Only rows that tie on (priority, created) need their ids compared;
            # comparing strings for every row would dominate the sort.
            run = np.concatenate([[0], np.cumsum(~tied)])
            in_tie = np.zeros(n, dtype=bool)
            in_tie[1:] |= tied
            in_tie[:-1] |= tied
            where = np.flatnonzero(in_tie)
            tied_ids = np.asarray(ids[order[where]].tolist(), dtype=str)
            _, id_rank = np.unique(tied_ids, return_inverse=True)
            resorted = where[np.lexsort((id_rank, run[where]))]
            order[where] = order[resorted]
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    return position


# ---------------------------------------------------------------------------------
# Eligibility
# ---------------------------------------------------------------------------------


@dataclass
class Eligibility:
    """Eligibility of the waiting requests of one gentype, per request."""

    workers: np.ndarray  # eligible worker count
    threads: np.ndarray  # eligible threads
    throughput: np.ndarray  # sum of speed * threads
    row: np.ndarray  # the request's row in ``takeable`` (group or special group)
    takeable: np.ndarray | None  # packed bits: which take signatures each row could take
    signature: np.ndarray | None  # each request's take signature
    n_groups: int = 0
    n_special: int = 0
    n_declarations: int = 0
    n_signatures: int = 0


def _rank(limits: np.ndarray, values: np.ndarray) -> np.ndarray:
    """How many of the distinct ``limits`` are below each value (value <= limit k iff rank <= k)."""
    return np.searchsorted(limits, values, side="left")


def eligibility(
    wk: WorkerArrays,
    rq: RequestArrays,
    gentype: int,
    excluded: tuple[np.ndarray, np.ndarray],
    vocabulary_size: int,
    with_competition: bool,
) -> Eligibility:
    """Eligible workers, threads and throughput of each request of ``gentype``, plus what it could take."""
    text = gentype == TEXT
    worker_rows = np.flatnonzero(wk.usable & (wk.gentype == gentype))
    n_req = len(rq.index)
    nw = len(worker_rows)

    # Length and size limits become ranks among the values workers declare.
    if text:
        len_limits = np.unique(np.concatenate([wk.max_length[worker_rows], wk.chat_max_length[worker_rows]]))
        ctx_limits = np.unique(
            np.concatenate([wk.max_context_length[worker_rows], wk.chat_max_context_length[worker_rows]])
        )
        req_len = _rank(len_limits, rq.max_length)
        req_ctx = _rank(ctx_limits, rq.max_context_length)
    else:
        pix_limits = np.unique(wk.max_pixels[worker_rows])
        req_pix = _rank(pix_limits, rq.pixels)

    # -- worker declarations -----------------------------------------------------
    w_set = wk.model_set[worker_rows]
    if text:
        w_len = _rank(len_limits, wk.max_length[worker_rows])
        w_ctx = _rank(ctx_limits, wk.max_context_length[worker_rows])
        w_clen = _rank(len_limits, wk.chat_max_length[worker_rows])
        w_cctx = _rank(ctx_limits, wk.chat_max_context_length[worker_rows])
        w_mode = wk.chat_mode[worker_rows]
        take_cols = (w_set, w_mode, w_len, w_ctx, w_clen, w_cctx)
        decl_cols = take_cols + (
            wk.below_floor[worker_rows],
            wk.maintenance[worker_rows],
            wk.nsfw[worker_rows],
            wk.trusted[worker_rows],
            wk.validated[worker_rows],
        )
    else:
        w_pix = _rank(pix_limits, wk.max_pixels[worker_rows])
        take_cols = (w_set, w_pix)
        decl_cols = take_cols + (
            wk.maintenance[worker_rows],
            wk.nsfw[worker_rows],
            wk.trusted[worker_rows],
            wk.image_slow[worker_rows],
            wk.extra_slow[worker_rows],
            wk.has_bits[worker_rows],
        )
    decl_of_worker, decl_first = factorize_rows(*decl_cols) if nw else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    n_decl = len(decl_first)
    d_rows = worker_rows[decl_first]  # a representative worker per declaration
    d = {
        "set": wk.model_set[d_rows],
        "maintenance": wk.maintenance[d_rows],
        "nsfw": wk.nsfw[d_rows],
        "trusted": wk.trusted[d_rows],
    }
    w_speed_threads = wk.speed[worker_rows] * wk.threads[worker_rows]
    decl_sums = np.stack(
        [
            np.bincount(decl_of_worker, minlength=n_decl).astype(np.float64),
            np.bincount(decl_of_worker, weights=wk.threads[worker_rows], minlength=n_decl),
            np.bincount(decl_of_worker, weights=w_speed_threads, minlength=n_decl),
        ],
        axis=1,
    )
    worker_sums = np.stack(
        [np.ones(nw), wk.threads[worker_rows].astype(np.float64), w_speed_threads], axis=1
    )
    if text:
        d.update(
            mode=wk.chat_mode[d_rows],
            len=w_len[decl_first],
            ctx=w_ctx[decl_first],
            clen=w_clen[decl_first],
            cctx=w_cctx[decl_first],
            below=wk.below_floor[d_rows],
            validated=wk.validated[d_rows],
        )
    else:
        d.update(
            pix=w_pix[decl_first],
            slow=wk.image_slow[d_rows],
            xslow=wk.extra_slow[d_rows],
            has=wk.has_bits[d_rows],
        )
    take_class_of_decl, class_first = (
        factorize_rows(*(c[decl_first] for c in take_cols)) if n_decl else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    )
    n_class = len(class_first)

    # -- request groups ------------------------------------------------------------
    if text:
        group_cols = (
            rq.model_set,
            rq.is_chat,
            rq.slow_workers,
            rq.trusted_workers,
            rq.nsfw,
            rq.validated_backends,
            req_len,
            req_ctx,
        )
    else:
        group_cols = (
            rq.model_set,
            req_pix,
            rq.slow_workers,
            rq.extra_slow_workers,
            rq.trusted_workers,
            rq.nsfw,
            rq.need_bits,
        )
    group_of_req, group_first = factorize_rows(*group_cols)
    n_group = len(group_first)
    g = {
        "set": rq.model_set[group_first],
        "nsfw": rq.nsfw[group_first],
        "trusted": rq.trusted_workers[group_first],
    }
    if text:
        g.update(
            chat=rq.is_chat[group_first],
            slow=rq.slow_workers[group_first],
            validated=rq.validated_backends[group_first],
            len=req_len[group_first],
            ctx=req_ctx[group_first],
        )
    else:
        g.update(
            pix=req_pix[group_first],
            slow=rq.slow_workers[group_first],
            xslow=rq.extra_slow_workers[group_first],
            need=rq.need_bits[group_first],
        )

    # Model overlap between distinct request sets and distinct worker sets.
    req_set_codes, req_set_first = np.unique(rq.model_set, return_index=True)
    wrk_set_codes, wrk_set_first = np.unique(wk.model_set[worker_rows], return_index=True)
    overlap = overlap_matrix(
        rq.models.take(req_set_first), wk.models.take(worker_rows[wrk_set_first]), vocabulary_size
    )
    g_set_row = np.searchsorted(req_set_codes, g["set"])
    d_set_col = np.searchsorted(wrk_set_codes, d["set"])

    def gates(group_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(every gate but speed, speed gate) for these groups against every declaration."""
        col = lambda name: g[name][group_idx][:, None]  # noqa: E731
        models_ok = (col("set") == 0) | overlap[np.ix_(g_set_row[group_idx], d_set_col)]
        ok = models_ok & (~col("nsfw") | d["nsfw"]) & (~col("trusted") | d["trusted"])
        if text:
            chat = col("chat")
            ok &= ~col("validated") | d["validated"]
            ok &= np.where(chat, d["mode"] != CHAT_NONE, d["mode"] != CHAT_ONLY)
            ok &= np.where(
                chat,
                (col("len") <= d["clen"]) & (col("ctx") <= d["cctx"]),
                (col("len") <= d["len"]) & (col("ctx") <= d["ctx"]),
            )
            # A plain request that accepts slow workers is not speed-gated.
            speed_ok = ~d["below"] | (~chat & col("slow"))
        else:
            ok &= col("pix") <= d["pix"]
            ok &= ~d["slow"] | col("slow")
            ok &= ~d["xslow"] | col("xslow")
            ok &= (col("need") & ~d["has"]) == 0
            speed_ok = np.ones_like(ok)
        return ok, speed_ok

    def choose(other: np.ndarray, fast: np.ndarray, chat: np.ndarray) -> np.ndarray:
        # A chat request keeps to fast workers unless none passes the other gates.
        use_fast = ~chat | fast.any(axis=1)
        return np.where(use_fast[:, None], fast, other)

    group_chat = g["chat"] if text else np.zeros(n_group, dtype=bool)

    # -- special requests: worker identity or owner matters ---------------------------
    ex_workers, ex_requests = excluded
    has_exclusion = np.zeros(n_req, dtype=bool)
    has_exclusion[ex_requests] = True
    maint_owners = np.unique(wk.user[worker_rows][wk.maintenance[worker_rows]])
    owns_maintenance = np.isin(rq.user, maint_owners)
    has_targets = rq.targets.lengths > 0
    special = has_targets | owns_maintenance | has_exclusion
    special_rows = np.flatnonzero(special)
    if len(special_rows):
        target_set = set_codes(
            ListColumn(rq.targets.offsets, rq.targets.values + 1), len(wk.ids) + 1
        )[special_rows]
        special_of, special_first = factorize_rows(
            group_of_req[special_rows],
            target_set,
            rq.blacklist[special_rows] & has_targets[special_rows],
            np.where(owns_maintenance[special_rows], rq.user[special_rows], -1),
            np.where(has_exclusion[special_rows], special_rows, -1),
        )
    else:
        special_of, special_first = np.zeros(0, np.int64), np.zeros(0, np.int64)
    n_special = len(special_first)
    rep = special_rows[special_first]  # a representative request per special group

    # -- per group: aggregates and the take classes present -------------------------
    group_sums = np.zeros((n_group + n_special, 3))
    present = np.zeros((n_group + n_special, n_class), dtype=bool)
    if n_decl:
        class_order = np.argsort(take_class_of_decl, kind="stable")
        class_starts = np.searchsorted(take_class_of_decl[class_order], np.arange(n_class))
        step = max(1, BLOCK_ELEMENTS // max(n_decl, 1))
        for start in range(0, n_group, step):
            idx = np.arange(start, min(start + step, n_group))
            other, speed_ok = gates(idx)
            other &= ~d["maintenance"]  # maintenance workers serve only their owner
            final = choose(other, other & speed_ok, group_chat[idx])
            group_sums[idx] = final.astype(np.float64) @ decl_sums
            present[idx] = np.logical_or.reduceat(final[:, class_order], class_starts, axis=1)

        # Special groups, expanded to single workers.
        local = np.full(len(wk.ids), -1, dtype=np.int64)
        local[worker_rows] = np.arange(nw)
        w_maint = wk.maintenance[worker_rows]
        w_user = wk.user[worker_rows]
        w_class = take_class_of_decl[decl_of_worker]
        step = max(1, BLOCK_ELEMENTS // max(nw, 1))
        for start in range(0, n_special, step):
            sg = np.arange(start, min(start + step, n_special))
            reqs = rep[sg]
            other_d, speed_d = gates(group_of_req[reqs])
            other = other_d[:, decl_of_worker]
            speed_ok = speed_d[:, decl_of_worker]
            other &= ~w_maint | (w_user == np.where(owns_maintenance[reqs], rq.user[reqs], -1)[:, None])
            targeted = rq.targets.take(reqs)
            t_local = local[np.maximum(targeted.values, 0)]
            t_valid = (targeted.values >= 0) & (t_local >= 0)
            mask = np.zeros_like(other)
            mask[targeted.owners()[t_valid], t_local[t_valid]] = True
            has_t = (targeted.lengths > 0)[:, None]
            black = rq.blacklist[reqs][:, None]
            other &= ~has_t | np.where(black, ~mask, mask)
            # Excluded pairs of these representatives (a request with exclusions is its own group).
            ex_hit = np.isin(ex_requests, reqs)
            if ex_hit.any():
                row_of_req = pd.Index(reqs).get_indexer(ex_requests[ex_hit])
                ex_local = local[ex_workers[ex_hit]]
                ok = ex_local >= 0
                other[row_of_req[ok], ex_local[ok]] = False
            chat = rq.is_chat[reqs] if text else np.zeros(len(reqs), dtype=bool)
            final = choose(other, other & speed_ok, chat)
            group_sums[n_group + sg] = final.astype(np.float64) @ worker_sums
            rr, ww = np.nonzero(final)
            present[n_group + sg[rr], w_class[ww]] = True

    row = group_of_req.copy()
    row[special_rows] = n_group + special_of
    result = Eligibility(
        workers=np.rint(group_sums[row, 0]).astype(np.int64),
        threads=np.rint(group_sums[row, 1]).astype(np.int64),
        throughput=group_sums[row, 2],
        row=row,
        takeable=None,
        signature=None,
        n_groups=n_group,
        n_special=n_special,
        n_declarations=n_decl,
    )
    if not with_competition:
        return result

    # -- what each group's workers could take -----------------------------------------
    if text:
        sig_cols = (rq.model_set, rq.is_chat, req_len, req_ctx)
    else:
        sig_cols = (rq.model_set, req_pix)
    signature, sig_first = factorize_rows(*sig_cols)
    n_sig = len(sig_first)
    s_set_row = np.searchsorted(req_set_codes, rq.model_set[sig_first])
    c_decl = decl_first[class_first] if n_class else np.zeros(0, np.int64)
    c_set_col = np.searchsorted(wrk_set_codes, wk.model_set[worker_rows[c_decl]]) if n_class else c_decl
    can_take = (rq.model_set[sig_first] == 0)[None, :] | overlap[np.ix_(s_set_row, c_set_col)].T
    if text:
        chat = rq.is_chat[sig_first][None, :]
        mode = wk.chat_mode[worker_rows[c_decl]][:, None]
        s_len = req_len[sig_first][None, :]
        s_ctx = req_ctx[sig_first][None, :]
        can_take &= np.where(chat, mode != CHAT_NONE, mode != CHAT_ONLY)
        can_take &= np.where(
            chat,
            (s_len <= w_clen[c_decl][:, None]) & (s_ctx <= w_cctx[c_decl][:, None]),
            (s_len <= w_len[c_decl][:, None]) & (s_ctx <= w_ctx[c_decl][:, None]),
        )
    else:
        can_take &= req_pix[sig_first][None, :] <= w_pix[c_decl][:, None]
    packed = np.packbits(can_take, axis=1)
    takeable = np.zeros((n_group + n_special, packed.shape[1]), dtype=np.uint8)
    rows_with, classes = np.nonzero(present)
    if len(rows_with):
        starts = np.flatnonzero(np.r_[True, rows_with[1:] != rows_with[:-1]])
        step = max(1, BLOCK_ELEMENTS // max(packed.shape[1], 1))
        for a in range(0, len(starts), step):
            s_idx = starts[a : a + step]
            end = starts[a + step] if a + step < len(starts) else len(rows_with)
            block = packed[classes[s_idx[0] : end]]
            takeable[rows_with[s_idx]] = np.bitwise_or.reduceat(block, s_idx - s_idx[0], axis=0)
    result.takeable = takeable
    result.signature = signature
    result.n_signatures = n_sig
    return result


# ---------------------------------------------------------------------------------
# Competition: work ahead of each request that its eligible workers could take
# ---------------------------------------------------------------------------------


def competition(
    position: np.ndarray,
    signature: np.ndarray,
    competition_class: np.ndarray,
    class_takeable: np.ndarray,
    jobs: np.ndarray,
    work: np.ndarray,
    members: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, jobs and work of the competing requests ahead of each of ``members``.

    ``position``, ``signature``, ``jobs`` and ``work`` describe every queued
    request that may compete (one gentype); ``competition_class[k]`` is the
    class of ``members[k]`` and ``class_takeable[q]`` the signatures (bools)
    class ``q`` could take.
    """
    n = len(position)
    # Positions are re-ranked 0..n-1 within this queue, so they index arrays.
    by_pos = np.argsort(position)
    position = np.empty(n, dtype=np.int64)
    position[by_pos] = np.arange(n)
    count_ahead = np.zeros(len(members), dtype=np.int64)
    jobs_ahead = np.zeros(len(members), dtype=np.int64)
    work_ahead = np.zeros(len(members), dtype=np.int64)
    if n == 0 or len(members) == 0:
        return count_ahead, jobs_ahead, work_ahead

    # Requests sorted by (signature, position), with per-signature prefix sums.
    by_sig = np.lexsort((position, signature))
    stride = n + 1
    sorted_key = signature[by_sig] * stride + position[by_sig]
    cum_jobs = np.concatenate([[0], np.cumsum(jobs[by_sig])])
    cum_work = np.concatenate([[0], np.cumsum(work[by_sig])])
    sig_start = np.searchsorted(signature[by_sig], np.arange(class_takeable.shape[1]))

    # Queue order, for classes cheaper to answer with one pass over the queue.
    sig_in_order = signature[by_pos]
    jobs_in_order = jobs[by_pos]
    work_in_order = work[by_pos]

    class_order = np.argsort(competition_class, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(competition_class[class_order]) != 0, True])
    for a, b in zip(bounds[:-1], bounds[1:]):
        who = class_order[a:b]
        q = competition_class[who[0]]
        sigs = np.flatnonzero(class_takeable[q])
        if len(sigs) == 0:
            continue
        at = position[members[who]]
        last = int(at.max())
        if len(who) * len(sigs) * 4 < last:
            queries = (sigs[:, None] * stride + at[None, :]).ravel()
            found = np.searchsorted(sorted_key, queries).reshape(len(sigs), len(who))
            starts = sig_start[sigs][:, None]
            count_ahead[who] = (found - starts).sum(axis=0)
            jobs_ahead[who] = (cum_jobs[found] - cum_jobs[starts]).sum(axis=0)
            work_ahead[who] = (cum_work[found] - cum_work[starts]).sum(axis=0)
        else:
            takes = class_takeable[q][sig_in_order[:last]]
            count_ahead[who] = np.concatenate([[0], np.cumsum(takes)])[at]
            jobs_ahead[who] = np.concatenate([[0], np.cumsum(np.where(takes, jobs_in_order[:last], 0))])[at]
            work_ahead[who] = np.concatenate([[0], np.cumsum(np.where(takes, work_in_order[:last], 0))])[at]
    return count_ahead, jobs_ahead, work_ahead


# ---------------------------------------------------------------------------------
# The whole computation
# ---------------------------------------------------------------------------------


def compute(snapshot: Snapshot, options: EstimateOptions) -> Estimates:
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
    for gentype, name in ((TEXT, "text"), (IMAGE, "image")):
        mine = np.flatnonzero(rq.gentype == gentype)
        with stages("horde"):
            horde[name] = _horde_wide(wk, gentype, rq, mine, position, work, inflight, columns)
        if len(mine) == 0:
            continue
        aware = gentype == TEXT or options.eligible_image_wait
        sub = _subset(rq, mine)
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
        groups[f"{name}_request_groups"] = elig.n_groups
        groups[f"{name}_special_groups"] = elig.n_special
        groups[f"{name}_worker_declarations"] = elig.n_declarations
        columns["eligible_workers"][mine] = elig.workers
        columns["eligible_worker_threads"][mine] = elig.threads
        columns["is_possible"][mine] = (elig.workers > 0) | (progress["processing"][mine] > 0)
        if not aware:
            columns["queue_position"][mine] = columns["horde_queue_position"][mine]
            columns["wait_time"][mine] = columns["horde_wait_time"][mine]
            continue

        with stages("competition"):
            eligible = np.flatnonzero(elig.threads > 0)
            packed_rows = elig.takeable[elig.row[eligible]]
            n_sig = elig.n_signatures
            if len(eligible):
                _, first, klass = np.unique(
                    np.ascontiguousarray(packed_rows).view(np.dtype((np.void, packed_rows.shape[1]))).ravel(),
                    return_index=True,
                    return_inverse=True,
                )
                class_takeable = np.unpackbits(packed_rows[first], axis=1, count=n_sig).astype(bool)
            else:
                klass = np.zeros(0, np.int64)
                class_takeable = np.zeros((0, n_sig), dtype=bool)
            groups[f"{name}_signatures"] = n_sig
            groups[f"{name}_competition_classes"] = len(class_takeable)
            count_ahead, jobs_ahead, work_ahead = competition(
                position[mine],
                elig.signature,
                klass.ravel(),
                class_takeable,
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

    return Estimates(
        now=snapshot.now,
        request_id=rq.ids,
        request_index=rq.index,
        columns=columns,
        horde=horde,
        options=options,
        timings=stages.seconds,
        groups=groups,
        rejected=snapshot.rejected,
    )


def _subset(rq: RequestArrays, rows: np.ndarray) -> RequestArrays:
    values = {}
    for name, value in rq.__dict__.items():
        values[name] = value.take(rows) if isinstance(value, ListColumn) else value[rows]
    return RequestArrays(**values)


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
        "queued_work": int(work[mine].sum()),
        "online_workers": n_online,
        "online_threads": threads,
        "mean_speed": None if not n_online else mean_speed,
    }
