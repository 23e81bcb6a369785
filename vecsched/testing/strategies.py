"""Hypothesis strategies for snapshot mappings in the JSON interchange format.

Each strategy draws plain JSON-ready dicts (SNAPSHOT_FORMAT.md), so a failing
example prints as a snapshot one can paste into a bug report. Values are drawn
from small pools on purpose: ties in priority and creation time, shared model
names, owners equal to requesters, targets naming present and absent workers,
speeds at and around every floor, sizes at and around ``max_pixels``.

``hordes()`` is the entry point; ``workers()``, ``requests()`` and ``jobs()``
draw one row each and can be used on their own.

Swarm testing: each horde switches on a random subset of :data:`FEATURES`;
a feature that is off leaves its fields at permissive values. Drawing every
restriction at once would leave almost no eligible pair (and so almost no
competition or wait to compare); drawing subsets keeps eligibility common
while every restriction, and every combination, still occurs.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from hypothesis import strategies as st

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)

# Text models of each size class of the speed floor (data/text_models.csv) and one unknown.
TEXT_MODELS = (
    "Aeala/Enterredaas-33b",  # 33B: floor 3
    "Austism/chronos-hermes-13b",  # 13B: floor 4
    "Aurore-Reveil/Koto-Small-7B-IT",  # 7B: floor 5
    "someone/not-in-the-list",  # unknown: floor 5
)
# Image models with and without inpainting (data/image_models.csv), and one unknown.
IMAGE_MODELS = (
    "Deliberate Inpainting",  # inpainting
    "A-Zovya RPG Inpainting",  # inpainting
    "AAM XL",
    "2DN",
    "unknown image model",
)
USER_IDS = ("u0", "u1", "u2")

FEATURES: frozenset[str] = frozenset(
    {
        "offline",  # check-ins past the 300 s window
        "maintenance",
        "paused",
        "nsfw",
        "trust",
        "targets",  # allow and block lists, naming present and absent workers
        "exclusions",
        "models",  # requests naming models (off: any model)
        "lengths",  # text lengths that may exceed worker limits
        "chat",  # chat requests and chat modes none/opt_in/only
        "validated",
        "slow",  # speeds below the floors, slow_workers false
        "zero_speed",
        "options",  # image options and r2
        "pixels",  # sizes around and above max_pixels
        "lifecycle",  # inactive, faulted, expired, n=0 requests
        "jobs",  # jobs in flight, finished and faulted
    }
)

TEXT_BRIDGES = (
    "AI Horde Worker:1:https://example.org",
    "AI Horde Worker~aphrodite~oai:2.0:https://example.org",
    "KoboldCppEmbedWorker:1.70:https://example.org",
    "TabbyAPI",
    "koboldcpp:1.70:https://example.org",
    "unknown:0:unknown",
)
TEXT_SPEEDS = (None, None, 0.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.25, 30.0)
IMAGE_SPEEDS = (None, None, 0.0, 250_000.0, 499_999.0, 500_000.0, 1_250_000.0, 4_000_000.0)
# Seconds before NOW: 300 is the last online second, 301 the first offline one.
CHECK_IN_AGO = (0, 0, 5, 299, 300, 301, 1200)
CREATED_AGO = (0, 60, 60, 120, 120, 300.5, 900)
EXPIRES_IN = (-60, 0, 1, 600, 600, 1200)
SIDES = (64, 512, 512, 576, 768, 1024)
MAX_PIXELS = (262_144, 262_144, 294_912, 589_824, 1_048_576, 0)


def iso(seconds_from_now: float, now: datetime = NOW) -> str:
    """ISO 8601 time ``seconds_from_now`` after ``now`` (before it when negative)."""
    t = now + timedelta(seconds=seconds_from_now)
    return t.isoformat().replace("+00:00", "Z")


def _choice(values: Sequence[Any]) -> st.SearchStrategy[Any]:
    return st.sampled_from(values)


def bridge_agents(gentype: str) -> st.SearchStrategy[str]:
    """Bridge agents: validated and unvalidated text bridges; reGen versions 0..9 and others."""
    if gentype == "text":
        return _choice(TEXT_BRIDGES)
    regen = st.builds(
        lambda v, form: form.format(v=v),
        st.integers(0, 9),
        _choice(("AI Horde Worker reGen:{v}:https://example.org", "AI Horde Worker reGen:{v}.1.0:x")),
    )
    return st.one_of(
        regen,
        regen,
        _choice(("unknown:0:unknown", "AI Horde Worker reGen", "AI Horde Worker reGen:x:y", "SomeBridge:9:z")),
    )


def _flag(draw: st.DrawFn, on: bool) -> bool:
    """A restrictive boolean: drawn when its feature is on, else False."""
    return draw(st.booleans()) if on else False


def _rare(draw: st.DrawFn, on: bool) -> bool:
    """A restrictive boolean that is seldom true even when its feature is on."""
    return draw(st.integers(0, 5)) == 5 if on else False


@st.composite
def workers(
    draw: st.DrawFn,
    worker_id: str | st.SearchStrategy[str] = st.text("wxyz", min_size=1, max_size=3),
    *,
    gentype: str | None = None,
    now: datetime = NOW,
    text_models: Sequence[str] = TEXT_MODELS,
    image_models: Sequence[str] = IMAGE_MODELS,
    user_ids: Sequence[str] = USER_IDS,
    features: frozenset[str] = FEATURES,
) -> dict[str, Any]:
    """One worker row, varying the fields of the switched-on ``features``."""
    on = features.__contains__
    wid = draw(worker_id) if isinstance(worker_id, st.SearchStrategy) else worker_id
    g = gentype or draw(_choice(("text", "image")))
    ago = draw(_choice(CHECK_IN_AGO if on("offline") else (0, 5, 299, 300)))
    pool = text_models if g == "text" else image_models
    speeds = TEXT_SPEEDS if g == "text" else IMAGE_SPEEDS
    if not on("slow"):
        speeds = (None, 7.25, 30.0) if g == "text" else (None, 1_250_000.0, 4_000_000.0)
    if on("zero_speed") and draw(st.integers(0, 3)) == 0:
        speeds = (0.0,)
    models = draw(st.lists(_choice(pool), min_size=1, max_size=3, unique=True))
    if on("models") and draw(st.integers(0, 7)) == 0:
        models = []  # a worker with no model is rare but allowed
    row: dict[str, Any] = {
        "id": wid,
        "user_id": draw(_choice(user_ids)),
        "gentype": g,
        "owner_trusted": _flag(draw, on("trust")) or not on("trust"),
        "last_check_in": iso(-ago, now),
        "threads": draw(st.integers(1, 4)),
        "speed": draw(_choice(speeds)),
        "maintenance": _flag(draw, on("maintenance")),
        "paused": _flag(draw, on("paused")),
        "nsfw": not _flag(draw, on("nsfw")),
        "models": models,
        "bridge_agent": draw(bridge_agents(g)),
    }
    if g == "text":
        lengths = on("lengths")
        row.update(
            max_length=draw(_choice((80, 256, 512, 512))) if lengths else 512,
            max_context_length=draw(_choice((1024, 2048, 2048, 4096))) if lengths else 4096,
            chat_mode=draw(_choice(("none", "opt_in", "only"))) if on("chat") else "none",
        )
        # Chat limits: absent (copy the text limits) or their own values.
        if on("chat") and draw(st.booleans()):
            row["chat_max_length"] = draw(_choice((80, 256, 512, 1024)))
            row["chat_max_context_length"] = draw(_choice((1024, 2048, 8192)))
    else:
        options = on("options")
        row.update(
            max_pixels=draw(_choice(MAX_PIXELS)) if on("pixels") else 1_048_576,
            allow_img2img=not _flag(draw, options),
            allow_painting=not _flag(draw, options),
            allow_post_processing=not _flag(draw, options),
            allow_controlnet=draw(st.booleans()),
            allow_sdxl_controlnet=draw(st.booleans()),
            allow_lora=draw(st.booleans()),
            extra_slow_worker=_flag(draw, on("slow")),
        )
    return row


@st.composite
def requests(
    draw: st.DrawFn,
    request_id: str | st.SearchStrategy[str] = st.text("abAB01", min_size=1, max_size=3),
    *,
    gentype: str | None = None,
    now: datetime = NOW,
    text_models: Sequence[str] = TEXT_MODELS,
    image_models: Sequence[str] = IMAGE_MODELS,
    user_ids: Sequence[str] = USER_IDS,
    target_ids: Sequence[str] = ("w", "ghost"),
    features: frozenset[str] = FEATURES,
) -> dict[str, Any]:
    """One request row; ``target_ids`` are the worker ids it may name (present or not)."""
    on = features.__contains__
    rid = draw(request_id) if isinstance(request_id, st.SearchStrategy) else request_id
    g = gentype or draw(_choice(("text", "image")))
    pool = text_models if g == "text" else image_models
    life = on("lifecycle")
    n = 0 if _rare(draw, life) else draw(_choice((1, 2, 3)))
    row: dict[str, Any] = {
        "id": rid,
        "user_id": draw(_choice(user_ids)),
        "gentype": g,
        "created": iso(-draw(_choice(CREATED_AGO)), now),
        "expiry": iso(draw(_choice(EXPIRES_IN)) if _rare(draw, life) else draw(_choice((1, 600))), now),
        "extra_priority": draw(_choice((0, 0, 10, -5))),
        "n": n,
        "jobs": n + draw(_choice((0, 0, 1, 2))),
        "active": not _rare(draw, life),
        "faulted": _rare(draw, life),
        "models": draw(st.lists(_choice(pool), min_size=0, max_size=2, unique=True)) if on("models") else [],
        "slow_workers": not _flag(draw, on("slow")),
        "trusted_workers": _flag(draw, on("trust")),
        "nsfw": _flag(draw, on("nsfw")),
    }
    if target_ids and on("targets") and draw(st.booleans()):
        row["worker_ids"] = draw(st.lists(_choice(list(target_ids)), min_size=1, max_size=5))
        row["worker_blacklist"] = draw(st.booleans())
    if g == "text":
        row.update(
            max_length=draw(_choice((0, 80, 200, 512, 600) if on("lengths") else (0, 80, 200))),
            max_context_length=draw(_choice((1024, 2048, 4096) if on("lengths") else (1024, 2048))),
            is_chat=_flag(draw, on("chat")),
            validated_backends=_flag(draw, on("validated")),
        )
    else:
        # A few options at a time: all of them at once would match no worker.
        used = draw(st.frozensets(_choice(IMAGE_OPTIONS), max_size=3)) if on("options") else frozenset()
        size = SIDES if on("pixels") else (64, 512)
        row.update(
            width=draw(_choice(size)),
            height=draw(_choice(size)),
            steps=draw(_choice((0, 1, 20, 30))),
            extra_slow_workers=draw(st.booleans()),
            source_processing=(
                draw(_choice(SOURCE_PROCESSING[1:])) if "source_processing" in used else "txt2img"
            ),
            post_processing=draw(_choice((1, 2))) if "post_processing" in used else 0,
        )
        for name in IMAGE_OPTIONS:
            if name not in ("source_processing", "post_processing"):
                row[name] = name in used
    return row


SOURCE_PROCESSING = ("txt2img", "img2img", "inpainting", "outpainting")
IMAGE_OPTIONS = (
    "source_image",
    "source_processing",
    "post_processing",
    "loras",
    "tis",
    "control_type",
    "hires_fix",
    "tiling",
    "transparent",
    "extra_source_images",
    "r2",
)



@st.composite
def jobs(
    draw: st.DrawFn,
    job_id: str | st.SearchStrategy[str] = st.text("jk", min_size=1, max_size=4),
    *,
    request_ids: Sequence[str] = ("r", "ghost"),
    worker_ids: Sequence[str] = ("w", "ghost"),
    now: datetime = NOW,
) -> dict[str, Any]:
    """One job in flight or done, naming a request and a worker (present or not)."""
    return {
        "id": draw(job_id) if isinstance(job_id, st.SearchStrategy) else job_id,
        "request_id": draw(_choice(list(request_ids))),
        "worker_id": draw(_choice(list(worker_ids))),
        "started": iso(-draw(_choice((0, 1, 5, 30, 120, 0.25))), now),
        "state": draw(_choice(("processing", "processing", "finished", "faulted"))),
    }


_SHAPES = ("normal", "normal", "normal", "normal", "empty", "offline", "fallback", "one_model", "slow")


@st.composite
def hordes(
    draw: st.DrawFn,
    max_workers: int = 6,
    max_requests: int = 10,
    max_jobs: int = 6,
    *,
    now: datetime = NOW,
    features: frozenset[str] | None = None,
) -> dict[str, Any]:
    """A whole snapshot mapping (``vecsched.snapshot/1``).

    Shapes drawn: ordinary hordes; empty ones; hordes with no online worker;
    all-fallback queues (requests naming only models nobody serves);
    single-model hordes where every request competes with every other; and
    slow hordes (every worker below its floor, so the chat speed gate falls back).
    ``features`` (default: a drawn subset, sometimes all) picks which edges vary.
    """
    if features is None:
        features = draw(st.one_of(st.just(FEATURES), st.frozensets(_choice(sorted(FEATURES)))))
    shape = draw(_choice(_SHAPES))
    if shape == "slow":
        features = features | {"chat", "slow"}
    if shape == "empty":
        n_workers = draw(st.integers(0, 1))
        n_requests = draw(st.integers(0, 1)) if n_workers else 0
    else:
        n_workers = draw(st.integers(0 if shape == "offline" else 1, max_workers))
        n_requests = draw(st.integers(1, max_requests))
    # Mostly one gentype per horde, so workers and requests meet; sometimes both.
    gentypes = draw(_choice((("text",), ("image",), ("text", "image"))))
    models = (TEXT_MODELS[:1], IMAGE_MODELS[:1]) if shape == "one_model" else (TEXT_MODELS, IMAGE_MODELS)
    worker_ids = draw(
        st.lists(st.text("wxyz", min_size=1, max_size=3), min_size=n_workers, max_size=n_workers, unique=True)
    )
    request_ids = draw(
        st.lists(st.text("abAB01", min_size=1, max_size=3), min_size=n_requests, max_size=n_requests, unique=True)
    )
    worker_rows = _worker_rows(draw, worker_ids, shape, gentypes, models, features, now)
    request_rows = _request_rows(draw, request_ids, worker_ids + ["ghost-w"], shape, gentypes, models, features, now)
    _ties_and_owners(draw, worker_rows, request_rows, features)
    job_rows, excluded = _jobs_and_exclusions(draw, worker_ids, request_ids, max_jobs, features, now)
    return {
        "format": "vecsched.snapshot/1",
        "now": iso(0, now),
        "workers": worker_rows,
        "requests": request_rows,
        "jobs": job_rows,
        "excluded_pairs": excluded,
    }


def _worker_rows(
    draw: st.DrawFn,
    worker_ids: list[str],
    shape: str,
    gentypes: tuple[str, ...],
    models: tuple[Sequence[str], Sequence[str]],
    features: frozenset[str],
    now: datetime,
) -> list[dict[str, Any]]:
    worker_features = features - {"offline"} if shape != "offline" else features | {"offline"}
    rows = []
    for wid in worker_ids:
        row = draw(
            workers(
                wid,
                gentype=draw(_choice(gentypes)),
                now=now,
                text_models=models[0],
                image_models=models[1],
                features=worker_features,
            )
        )
        if shape == "offline":
            row["last_check_in"] = iso(-draw(_choice((301, 1200))), now)
        elif "offline" in features:
            row["last_check_in"] = iso(-draw(_choice(CHECK_IN_AGO)), now)
        if shape == "slow":
            # Everyone below the floors: the chat speed gate must fall back.
            slow = (2.5, 3.5, 4.5) if row["gentype"] == "text" else (250_000.0, 499_999.0)
            row["speed"] = draw(_choice(slow))
        rows.append(row)
    return rows


def _request_rows(
    draw: st.DrawFn,
    request_ids: list[str],
    target_pool: list[str],
    shape: str,
    gentypes: tuple[str, ...],
    models: tuple[Sequence[str], Sequence[str]],
    features: frozenset[str],
    now: datetime,
) -> list[dict[str, Any]]:
    request_features = features | {"models"} if shape == "fallback" else features
    rows = []
    for rid in request_ids:
        row = draw(
            requests(
                rid,
                gentype=draw(_choice(gentypes)),
                now=now,
                text_models=models[0],
                image_models=models[1],
                target_ids=target_pool,
                features=request_features,
            )
        )
        if shape == "fallback":
            # Requests naming only models nobody serves: every figure falls back.
            row["models"] = ["nobody/serves-this"]
        rows.append(row)
    return rows


def _ties_and_owners(
    draw: st.DrawFn, worker_rows: list[dict[str, Any]], request_rows: list[dict[str, Any]], features: frozenset[str]
) -> None:
    # Ties: copy one request's priority and creation time onto another, so id order decides.
    if len(request_rows) >= 2 and draw(st.booleans()):
        a, b = draw(st.permutations(range(len(request_rows))))[:2]
        request_rows[b]["extra_priority"] = request_rows[a]["extra_priority"]
        request_rows[b]["created"] = request_rows[a]["created"]
    # A maintenance worker and a request by its owner.
    if "maintenance" in features and worker_rows and request_rows and draw(st.booleans()):
        w = draw(_choice(worker_rows))
        r = draw(_choice(request_rows))
        w["maintenance"] = True
        r["user_id"] = w["user_id"]


def _jobs_and_exclusions(
    draw: st.DrawFn,
    worker_ids: list[str],
    request_ids: list[str],
    max_jobs: int,
    features: frozenset[str],
    now: datetime,
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    # Ids of no row in the snapshot, which every consumer must ignore.
    all_workers, all_requests = worker_ids + ["ghost-w"], request_ids + ["ghost-r"]
    n_jobs = draw(st.integers(0, max_jobs)) if "jobs" in features else 0
    job_ids = draw(st.lists(st.text("jk", min_size=1, max_size=4), min_size=n_jobs, max_size=n_jobs, unique=True))
    job_rows = [
        draw(jobs(jid, request_ids=all_requests, worker_ids=all_workers, now=now)) for jid in job_ids
    ]
    excluded: list[list[str]] = []
    if "exclusions" in features:
        excluded = draw(
            st.lists(st.tuples(_choice(all_workers), _choice(all_requests)).map(list), max_size=4)
        )
    return job_rows, excluded


# -- scheduling history (SPEC section 7) ------------------------------------------------------

# Dispatch times, seconds before NOW: both halves of a full window, the midpoint
# (now - 150) exactly, its edges, and times outside the 300 s window.
DISPATCHED_AGO = (0, 10, 100, 149.5, 150, 200, 290, 300, 301, 400)
WORK = (1.0, 40.0, 300.0, 1000.0, 5000.0)


@st.composite
def _dispatch(draw: st.DrawFn, did: str, worker: dict[str, Any], request_ids: Sequence[str],
              pressure: bool, now: datetime) -> dict[str, Any]:
    ago = draw(_choice(DISPATCHED_AGO))
    # Under pressure, dispatches mostly serve higher-priority work created after
    # any waiting request of the horde, in both halves.
    created_ago = draw(_choice((0, 5, 100, 160, 250))) if pressure else draw(_choice(CREATED_AGO + (5, 160)))
    created = -max(ago, created_ago)
    # Rarely a pop recorded before its request's creation (a skewed clock); the
    # vectorized pass judges those pair by pair.
    if not pressure and draw(st.integers(0, 11)) == 0:
        created = -ago + draw(_choice((1, 30)))
    return {
        "dispatch_id": did,
        "worker_id": worker["id"],
        # Sometimes popped in a capability state the worker has since left.
        "worker_state": worker.get("state", "") if pressure or draw(st.integers(0, 4)) else "old-state",
        "request_id": draw(_choice(tuple(request_ids) + ("gone-r",))),
        "request_created": iso(created, now),
        "request_extra_priority": draw(_choice((20,) * 7 + (-5,) if pressure else (0, 0, 10, -5, 20))),
        "selected_from_priority_queue": draw(st.integers(0, 3)) == 0,
        "priority_user_ids": draw(st.lists(_choice(USER_IDS), max_size=2, unique=True)),
        "dispatched_at": iso(-ago, now),
        "assigned_work": draw(_choice(WORK)),
    }


@st.composite
def histories(draw: st.DrawFn, horde: dict[str, Any], now: datetime = NOW) -> dict[str, Any]:
    """``horde`` with a drawn history of dispatches and capacity returns.

    Two shapes. *Random*: a few dispatches and returns anywhere, by known and
    unknown workers, in and out of the window, returns of unknown dispatches,
    old capability states. *Pressure*: one thread per worker and, per worker,
    two returned pops in each half of a full window plus pops still active, for
    higher-priority work created recently; every later rule of section 7
    (precedence, active pops, arrivals against returns) then decides, so every
    evidence value is reached.
    """
    pressure = bool(horde["workers"]) and draw(st.booleans())
    workers_ = horde["workers"]
    for w in workers_:
        w["state"] = draw(_choice(("", "", "s1")))
        if pressure:
            w["threads"] = 1
    request_ids = [r["id"] for r in horde["requests"]]
    dispatches: list[dict[str, Any]] = []
    returns: list[dict[str, Any]] = []
    seq = iter(range(10_000))
    ghost = {"id": "ghost-w", "state": ""}
    if pressure and draw(st.booleans()):
        for r in horde["requests"]:  # a backlog older than the window
            r["created"] = iso(-900, now)
    if pressure and draw(st.booleans()):
        # Open gates, so that most requests have eligible workers to weigh.
        for r in horde["requests"]:
            r.update(models=[], worker_ids=[], nsfw=False, trusted_workers=False, slow_workers=True)
        for w in workers_:
            w.update(paused=False, maintenance=False, last_check_in=iso(0, now))
    if pressure:
        for w in workers_:
            for ago in (290, 200, 100, 10):  # two returns in each half
                d = draw(_dispatch(f"d{next(seq)}", w, request_ids, True, now))
                d["dispatched_at"] = iso(-min(ago + 5, 300), now)
                dispatches.append(d)
                returns.append({"dispatch_id": d["dispatch_id"], "worker_id": w["id"], "returned_at": iso(-ago, now)})
            if draw(st.booleans()):
                # A surge: big higher-priority pops, still active, for work created in each half.
                for created_ago in (250, 5):
                    d = draw(_dispatch(f"d{next(seq)}", w, request_ids, True, now))
                    d.update(request_created=iso(-created_ago, now), dispatched_at=iso(-created_ago, now),
                             request_extra_priority=20, assigned_work=WORK[-1] * 10)
                    dispatches.append(d)
            for _ in range(draw(st.integers(0, 2))):  # still active
                dispatches.append(draw(_dispatch(f"d{next(seq)}", w, request_ids, True, now)))
    for _ in range(draw(st.integers(0, 2 if pressure else 6))):
        w = draw(_choice(workers_ + [ghost])) if workers_ else ghost
        d = draw(_dispatch(f"d{next(seq)}", w, request_ids, False, now))
        dispatches.append(d)
        if draw(st.booleans()):
            back = draw(_choice((0, 1, 50, 149.9, 150, 299, 350)))
            returns.append({"dispatch_id": d["dispatch_id"], "worker_id": w["id"], "returned_at": iso(-back, now)})
    if draw(st.integers(0, 2)) == 0 and workers_:
        w = draw(_choice(workers_))  # a return whose dispatch is unknown
        returns.append({"dispatch_id": "lost", "worker_id": w["id"], "returned_at": iso(-draw(_choice((5, 200))), now)})
    # A return in the window names its dispatch once; later duplicates are rejected rows.
    seen: set[str] = set()
    unique_returns = [r for r in returns if not (r["dispatch_id"] in seen or seen.add(r["dispatch_id"]))]
    return {**horde, "dispatches": dispatches, "capacity_returns": unique_returns}


@st.composite
def stall_hordes(draw: st.DrawFn, max_workers: int = 5, max_requests: int = 8) -> dict[str, Any]:
    """A horde (:func:`hordes`) with a history (:func:`histories`)."""
    horde = draw(hordes(max_workers=max_workers, max_requests=max_requests))
    return draw(histories(horde))


@st.composite
def keyed_rows(draw: st.DrawFn, max_keys: int = 20, max_rows: int = 19, max_pairs: int = 80,
               width: int = 70) -> tuple[Any, Any, Any, int, Any]:
    """Rows and (key, source row) pairs for the OR-by-key kernels, with the brute-force answer.

    Returns ``(matrix, key, source, n_keys, want)``: a bool ``matrix`` of
    ``width`` columns, the pairs as two int64 arrays (repeats kept, keys
    unsorted), and ``want[k]``, the OR of the rows paired with key ``k``.
    """
    import numpy as np

    n_keys = draw(st.integers(1, max_keys))
    rows = draw(st.lists(st.lists(st.booleans(), min_size=width, max_size=width), min_size=1, max_size=max_rows))
    pairs = draw(st.lists(st.tuples(st.integers(0, n_keys - 1), st.integers(0, len(rows) - 1)), max_size=max_pairs))
    matrix = np.array(rows, dtype=bool)
    key = np.array([k for k, _ in pairs], dtype=np.int64)
    source = np.array([s for _, s in pairs], dtype=np.int64)
    want = np.zeros((n_keys, width), dtype=bool)
    for k, s in pairs:
        want[k] |= matrix[s]
    return matrix, key, source, n_keys, want
