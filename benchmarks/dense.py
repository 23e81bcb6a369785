"""The plain dense NumPy baseline: a full worker x request eligibility matrix and a
request x request competition matrix, straight from SPEC.md sections 3 to 6.

This is what a first vectorization would look like: every gate is a broadcast
comparison of a worker column against a request column, the model gate is one
matrix product of model incidence matrices, and "j competes with i" is
``(E.T @ C)[i, j] > 0`` for eligibility ``E`` and could-take ``C``, masked by
queue order. It derives its per-row facts (speeds, floors, bridge capabilities)
from :mod:`vecsched.reference` helpers, not from the vectorized modules, so that
agreeing with :func:`vecsched.estimate` means something.

Memory grows as W x R + R x R, so it only runs where that fits (see
:func:`dense_bytes`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from vecsched import reference as ref
from vecsched.snapshot.schema import CHAT_NONE, CHAT_ONLY, IMAGE, JOB_PROCESSING, SOURCE_PROCESSING, TEXT
from vecsched.snapshot.snapshot import Snapshot

# Rows of the request x request matrix computed per matrix product; bounds the float temporaries.
BLOCK_ROWS = 2048


def dense_bytes(n_workers: int, n_requests: int, text_share: float = 0.5) -> int:
    """A rough upper bound of the dense baseline's memory for a horde of this size.

    The W x R matrices (bool eligibility, could-take, model overlap, and one
    float64 copy for the sums) plus the text R x R bool competition matrix and
    its float32 block.
    """
    w, r = n_workers, n_requests
    rt = int(r * text_share) + 1
    return w * r * (8 + 6) + rt * rt + BLOCK_ROWS * rt * 8


def dense_flops(n_workers: int, n_requests: int, text_share: float = 0.5) -> float:
    """Multiply-adds of the competition product (the dominant cost): W_text x R_text^2."""
    rt = n_requests * text_share
    return (n_workers * text_share) * rt * rt


def _queue_order(ids: np.ndarray, priority: np.ndarray, created: np.ndarray) -> np.ndarray:
    """Position of each request in queue order: priority desc, created asc, id asc."""
    frame = pd.DataFrame({"p": -priority.astype(np.int64), "c": created, "i": ids})
    order = frame.sort_values(["p", "c", "i"], kind="mergesort").index.to_numpy()
    pos = np.empty(len(ids), dtype=np.int64)
    pos[order] = np.arange(len(ids))
    return pos


def _incidence(models, rows: np.ndarray, n_models: int) -> np.ndarray:
    """rows x models float32 incidence matrix of a models ListColumn."""
    sub = models.take(rows)
    out = np.zeros((len(rows), max(n_models, 1)), dtype=np.float32)
    out[sub.owners(), sub.values] = 1.0
    return out


def dense_estimate(snapshot: Snapshot) -> pd.DataFrame:
    """Every waiting request's figures by dense matrices (text eligibility-aware, image horde-wide).

    Returns a frame indexed by request id with eligible_workers,
    eligible_worker_threads, queue_position, wait_time, ahead_wait,
    horde_queue_position, horde_wait_time, fallback.

    Examples
    --------
    >>> from vecsched.synthetic import horde
    >>> frame = dense_estimate(horde(workers=20, requests=50, seed=1))
    >>> int((frame["eligible_workers"] >= 0).sum()) == len(frame)
    True
    """
    now = float(snapshot.now)
    w, r = snapshot.workers, snapshot.requests
    names = snapshot.model_names
    n_models = len(names)

    # -- per-worker facts ----------------------------------------------------------
    wgen = w.gentype
    online = (now - w.last_check_in) <= ref.ONLINE_WINDOW_SECONDS
    assumed = np.where(wgen == TEXT, ref.ASSUMED_SPEED["text"], ref.ASSUMED_SPEED["image"])
    speed = np.where(np.isnan(w.speed), assumed, w.speed)
    threads = w.threads.astype(np.int64)
    params = ref.text_model_parameters()
    vocab_params = np.array([params.get(str(nm), 0.0) for nm in names], dtype=np.float64)
    listed = w.models.lengths > 0
    first = np.zeros(len(w))
    first[listed] = vocab_params[w.models.values[w.models.offsets[:-1][listed]]]
    floor = np.where(first >= 20e9, 3.0, np.where(first >= 13e9, 4.0, 5.0))
    below = speed < floor
    agents, agent_code = np.unique(w.bridge_agent.astype(str), return_inverse=True) if len(w) else (np.array([]), np.zeros(0, int))
    validated = np.array([ref.bridge_name(a) in ref.VALIDATED_TEXT_BRIDGES for a in agents], dtype=bool)[agent_code] if len(w) else np.zeros(0, bool)
    caps_by_agent = [ref.bridge_capabilities(a) for a in agents]
    inpaint = ref.inpainting_models()
    model_inpaint = np.array([str(nm) in inpaint for nm in names], dtype=bool)
    can_paint = np.zeros(len(w), dtype=bool)
    if len(w.models.values):
        can_paint = np.bincount(w.models.owners(), weights=model_inpaint[w.models.values], minlength=len(w)) > 0
    # What each image option needs: (allow flag column or None, capability name); bit k = option k.
    options = (
        ("allow_img2img", "img2img"),
        ("allow_painting", "inpainting"),
        ("allow_post_processing", "post_processing"),
        ("allow_controlnet", "controlnet"),
        ("allow_lora", "lora"),
        (None, "textual_inversion"),
        (None, "hires_fix"),
        (None, "tiling"),
        ("allow_sdxl_controlnet", "layer_diffuse"),
        (None, "extra_source_images"),
        (None, "r2"),
    )
    has = np.zeros(len(w), dtype=np.int64)
    for k, (allow, cap) in enumerate(options):
        ok = np.array([cap in c for c in caps_by_agent], dtype=bool)[agent_code] if len(w) else np.zeros(0, bool)
        if allow is not None:
            ok = ok & w.columns[allow]
        if cap == "inpainting":
            ok = ok & can_paint
        has |= ok.astype(np.int64) << k

    # -- per-request facts (waiting requests only) ----------------------------------
    waiting = np.flatnonzero(r.active & ~r.faulted & (r.expiry > now) & (r.n > 0))
    rq = r.take(waiting)
    ids = rq.id
    rgen = rq.gentype
    n = rq.n.astype(np.int64)
    pixels = rq.width.astype(np.int64) * rq.height.astype(np.int64)
    output = np.where(rgen == TEXT, rq.max_length.astype(np.int64), pixels * rq.steps.astype(np.int64)).astype(np.float64)
    work = n * output
    pos = _queue_order(ids, rq.extra_priority, rq.created)
    sp = rq.source_processing
    painting = (sp == SOURCE_PROCESSING.index("inpainting")) | (sp == SOURCE_PROCESSING.index("outpainting"))
    uses = (
        rq.source_image | (sp != SOURCE_PROCESSING.index("txt2img")),
        painting,
        rq.post_processing > 0,
        rq.control_type,
        rq.loras,
        rq.tis,
        rq.hires_fix,
        rq.tiling,
        rq.transparent,
        rq.extra_source_images,
        rq.r2,
    )
    need = np.zeros(len(ids), dtype=np.int64)
    for k, used in enumerate(uses):
        need |= used.astype(np.int64) << k
    users, _ = pd.factorize(np.concatenate([w.user_id, rq.user_id]).astype(object))
    wuser, ruser = users[: len(w)], users[len(w) :]
    worker_row = pd.Index(w.id)
    request_row = pd.Index(ids)

    # Jobs in flight: progress and the in-flight part of waits.
    jobs = snapshot.jobs
    jreq = request_row.get_indexer(jobs.request_id) if len(jobs) else np.zeros(0, np.int64)
    run = (jreq >= 0) & (jobs.state == JOB_PROCESSING) if len(jobs) else np.zeros(0, bool)
    inflight = np.zeros(len(ids))
    if run.any():
        jr = jreq[run]
        jw = worker_row.get_indexer(jobs.worker_id[run])
        jassumed = np.where(rgen[jr] == TEXT, ref.ASSUMED_SPEED["text"], ref.ASSUMED_SPEED["image"])
        jspeed = np.where(jw >= 0, speed[np.maximum(jw, 0)] if len(w) else 0.0, jassumed)
        with np.errstate(divide="ignore", invalid="ignore"):
            left = np.where(jspeed > 0, np.maximum(output[jr] / jspeed - (now - jobs.started[run]), 0.0), np.nan)
        frame = pd.DataFrame({"r": jr, "t": left})
        worst = frame.groupby("r")["t"].agg(lambda s: np.nan if s.isna().any() else s.max())
        inflight[worst.index.to_numpy()] = worst.to_numpy()

    out = {
        "eligible_workers": np.zeros(len(ids), np.int64),
        "eligible_worker_threads": np.zeros(len(ids), np.int64),
        "queue_position": np.zeros(len(ids), np.int64),
        "wait_time": np.full(len(ids), np.nan),
        "ahead_wait": np.full(len(ids), np.nan),
        "horde_queue_position": np.zeros(len(ids), np.int64),
        "horde_wait_time": np.full(len(ids), np.nan),
        "fallback": np.zeros(len(ids), bool),
    }

    # Target and exclusion pairs, as (worker row, request row).
    tgt = rq.worker_ids
    t_req = tgt.owners()
    t_wrk = worker_row.get_indexer(tgt.values) if len(tgt.values) else np.zeros(0, np.int64)
    has_targets = tgt.lengths > 0
    pairs = snapshot.excluded_pairs
    x_wrk = worker_row.get_indexer(pairs.worker_id) if len(pairs.worker_id) else np.zeros(0, np.int64)
    x_req = request_row.get_indexer(pairs.request_id) if len(pairs.request_id) else np.zeros(0, np.int64)

    for gentype in (TEXT, IMAGE):
        wi = np.flatnonzero(wgen == gentype)
        ri = np.flatnonzero(rgen == gentype)
        if len(ri) == 0:
            continue
        # Horde-wide figures (SPEC section 6): cumulative sums in queue order.
        gon = wi[online[wi]]
        order = ri[np.argsort(pos[ri])]
        jobs_ahead = np.concatenate([[0], np.cumsum(n[order])[:-1]])
        work_ahead = np.concatenate([[0.0], np.cumsum(work[order])[:-1]])
        out["horde_queue_position"][order] = np.arange(len(order))
        mean_speed = speed[gon].mean() if len(gon) else np.nan
        if len(gon) and mean_speed > 0:
            rate = mean_speed * np.minimum(threads[gon].sum(), jobs_ahead + n[order])
            out["horde_wait_time"][order] = (work_ahead + work[order]) / rate + inflight[order]

        # -- the W x R eligibility matrix, gate by gate ------------------------------
        col = lambda a: a[ri][None, :]  # noqa: E731 - request column as a row vector
        row = lambda a: a[wi][:, None]  # noqa: E731 - worker column as a column vector
        overlap = (_incidence(w.models, wi, n_models) @ _incidence(rq.models, ri, n_models).T) > 0
        models_ok = overlap | (rq.models.lengths[ri] == 0)[None, :]
        base = row(online) & ~row(w.paused) & (~row(w.maintenance) | (row(wuser) == col(ruser)))
        base &= ~col(rq.nsfw) | row(w.nsfw)
        base &= ~col(rq.trusted_workers) | row(w.owner_trusted)
        targeted = np.zeros((len(wi), len(ri)), dtype=bool)
        wpos = np.full(len(w), -1)
        wpos[wi] = np.arange(len(wi))
        rpos = np.full(len(ids), -1)
        rpos[ri] = np.arange(len(ri))
        keep = (t_wrk >= 0) & (rpos[t_req] >= 0)
        keep[keep] &= wpos[t_wrk[keep]] >= 0
        targeted[wpos[t_wrk[keep]], rpos[t_req[keep]]] = True
        base &= ~col(has_targets) | (targeted ^ col(rq.worker_blacklist))
        base &= models_ok
        keep = (x_wrk >= 0) & (x_req >= 0)
        keep[keep] &= (wpos[x_wrk[keep]] >= 0) & (rpos[x_req[keep]] >= 0)
        base[wpos[x_wrk[keep]], rpos[x_req[keep]]] = False

        if gentype == TEXT:
            chat = col(rq.is_chat)
            mode = row(w.chat_mode)
            kind_ok = np.where(chat, mode != CHAT_NONE, mode != CHAT_ONLY)
            fits = np.where(
                chat,
                (col(rq.max_length) <= row(w.chat_max_length)) & (col(rq.max_context_length) <= row(w.chat_max_context_length)),
                (col(rq.max_length) <= row(w.max_length)) & (col(rq.max_context_length) <= row(w.max_context_length)),
            )
            could = models_ok & kind_ok & fits
            others = base & kind_ok & fits & (~col(rq.validated_backends) | row(validated))
            fast = others & ~row(below)
            gated = chat | ~col(rq.slow_workers)
            elig = np.where(gated, fast, others)
            # A chat request nobody fast can serve counts the slow workers (SPEC 3, text 9).
            nobody = rq.is_chat[ri] & ~fast.any(axis=0)
            elig[:, nobody] = others[:, nobody]
        else:
            elig = base & (col(pixels) <= row(w.max_pixels))
            elig &= ~(row(speed < ref.IMAGE_SLOW_SPEED) & ~col(rq.slow_workers))
            elig &= ~(row(w.extra_slow_worker) & ~col(rq.extra_slow_workers))
            elig &= (col(need) & ~row(has)) == 0
            could = None

        ef = elig.astype(np.float64)
        sums = np.stack([np.ones(len(wi)), threads[wi].astype(np.float64), speed[wi] * threads[wi]]) @ ef
        count, thr, throughput = sums[0].round().astype(np.int64), sums[1].round().astype(np.int64), sums[2]
        out["eligible_workers"][ri] = count
        out["eligible_worker_threads"][ri] = thr
        if gentype != TEXT:
            out["queue_position"][ri] = out["horde_queue_position"][ri]
            out["wait_time"][ri] = out["horde_wait_time"][ri]
            continue

        # -- the R x R competition matrix: j competes with i -------------------------
        e32 = elig.T.astype(np.float32)  # R x W
        c32 = could.astype(np.float32)  # W x R
        rp = pos[ri]
        competes = np.zeros((len(ri), len(ri)), dtype=bool)
        for start in range(0, len(ri), BLOCK_ROWS):
            stop = min(start + BLOCK_ROWS, len(ri))
            competes[start:stop] = (e32[start:stop] @ c32) > 0
            competes[start:stop] &= rp[None, :] < rp[start:stop, None]
        q = competes.sum(axis=1)
        jobs_j = np.zeros(len(ri))
        work_j = np.zeros(len(ri))
        nf, wf = n[ri].astype(np.float64), work[ri]
        for start in range(0, len(ri), BLOCK_ROWS):
            block = competes[start : start + BLOCK_ROWS].astype(np.float64)
            jobs_j[start : start + BLOCK_ROWS] = block @ nf
            work_j[start : start + BLOCK_ROWS] = block @ wf
        with np.errstate(divide="ignore", invalid="ignore"):
            wait = (work_j + wf) / (throughput * np.minimum(1.0, (jobs_j + nf) / thr)) + inflight[ri]
            ahead = np.where(jobs_j == 0, 0.0, work_j / (throughput * np.minimum(1.0, jobs_j / thr)))
        wait[throughput == 0] = np.nan
        ahead[(throughput == 0) & (jobs_j > 0)] = np.nan
        fell = thr == 0
        out["queue_position"][ri] = np.where(fell, out["horde_queue_position"][ri], q)
        out["wait_time"][ri] = np.where(fell, out["horde_wait_time"][ri], wait)
        out["ahead_wait"][ri] = np.where(fell, np.nan, ahead)
        out["fallback"][ri] = fell

    return pd.DataFrame(out, index=pd.Index(ids, name="id"))


COMPARED = ("eligible_workers", "eligible_worker_threads", "queue_position", "wait_time", "ahead_wait", "fallback")


def compare(dense: pd.DataFrame, batch: pd.DataFrame) -> dict[str, object]:
    """Do the dense figures agree with ``vecsched.estimate``'s frame? Mismatch counts per column."""
    batch = batch.reindex(dense.index)
    mismatches: dict[str, int] = {}
    for name in COMPARED:
        a = dense[name].to_numpy()
        b = batch[name].to_numpy()
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            a, b = a.astype(np.float64), b.astype(np.float64)
            same = np.isclose(a, b, rtol=1e-6, atol=1e-9) | (np.isnan(a) & np.isnan(b))
        else:
            same = a == b
        mismatches[name] = int((~same).sum())
    return {"agrees": not any(mismatches.values()), "mismatches": mismatches, "compared": list(COMPARED)}
