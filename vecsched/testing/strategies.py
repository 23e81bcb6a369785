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


# Gate hordes are 5 in 14: fewer, and 500 examples drew some gate alone fewer than 3 times.
_SHAPES = ("normal", "normal", "normal", "normal", "empty", "offline", "fallback", "one_model", "slow") + ("gates",) * 5


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
    slow hordes (every worker below its floor, so the chat speed gate falls back);
    and gate hordes (:func:`gate_hordes`), where workers that differ in one gate
    each make every eligibility gate the sole reason of some rejection.
    ``features`` (default: a drawn subset, sometimes all) picks which edges vary.
    """
    shape = draw(_choice(_SHAPES))
    if shape == "gates":
        # A drawn subset would leave most gates shut; a given one says which edges may vary.
        return draw(gate_hordes(max_workers, max_requests, max_jobs, now=now, features=features or FEATURES))
    if features is None:
        features = draw(st.one_of(st.just(FEATURES), st.frozensets(_choice(sorted(FEATURES)))))
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


# -- gate hordes: each eligibility gate the sole reason of a rejection (SPEC section 3) ----------

# SPEC 3, image rule 9: each option (as IMAGE_OPTIONS names it) with the worker's allow flag (None
# where there is none) and the reGen version that brings its bridge capability.
OPTION_NEEDS: dict[str, tuple[str | None, int]] = {
    "source_image": ("allow_img2img", 1),
    "source_processing": ("allow_painting", 1),  # inpainting or outpainting
    "post_processing": ("allow_post_processing", 1),
    "control_type": ("allow_controlnet", 1),
    "hires_fix": (None, 1),
    "tiling": (None, 1),
    "r2": (None, 1),
    "loras": ("allow_lora", 2),
    "tis": (None, 2),
    "extra_source_images": (None, 5),
    "transparent": ("allow_sdxl_controlnet", 8),
}
INPAINTING_IMAGE_MODELS = ("Deliberate Inpainting", "A-Zovya RPG Inpainting")
VALIDATED_TEXT_BRIDGES = TEXT_BRIDGES[:4]
# Bridges with no capability at all: reGen 0, reGen with no or no numeric version, other bridges.
NO_CAPABILITY_BRIDGES = (
    "AI Horde Worker reGen:0:https://example.org",
    "AI Horde Worker reGen",
    "AI Horde Worker reGen:x:y",
    "unknown:0:unknown",
    "SomeBridge:9:z",
)
# The feature (FEATURES) under which each gate of gate_hordes may be shut; option gates are "options".
GATE_FEATURE = {
    "online": "offline", "paused": "paused", "excluded": "exclusions", "maintenance": "maintenance",
    "nsfw": "nsfw", "trust": "trust", "allow_list": "targets", "block_list": "targets", "models": "models",
    "chat_mode": "chat", "max_length": "lengths", "max_context_length": "lengths", "validated": "validated",
    "speed": "slow", "extra_slow": "slow", "pixels": "pixels",
}


GENERIC_GATES = ("maintenance", "paused", "online")  # every pair has them; ordinary hordes reach them


def _regen(draw: st.DrawFn, version: int) -> str:
    form = draw(_choice(("AI Horde Worker reGen:{v}:https://example.org", "AI Horde Worker reGen:{v}.1.0:x")))
    return form.format(v=version)


def _option_set(draw: st.DrawFn, top: str) -> frozenset[str]:
    """Options of one image request, mostly ``top`` with options needing an older bridge than it.

    Only that option's capability gate can then reject a worker alone (an older bridge lacks it
    and has the others); ``top``, a version-1 option, alone makes its version-1 gate decisive.
    """
    if draw(st.integers(0, 7)) == 0:
        return frozenset()
    older = sorted(o for o, (_, v) in OPTION_NEEDS.items() if v < OPTION_NEEDS[top][1])
    used = {top} | (draw(st.frozensets(_choice(older), max_size=2)) if older else frozenset())
    if draw(st.integers(0, 4)) == 0:  # sometimes any mix
        used |= draw(st.frozensets(_choice(sorted(OPTION_NEEDS)), max_size=2))
    return frozenset(used)


def _often(draw: st.DrawFn, on: bool) -> bool:
    """A restriction that is mostly on when its feature is: each one on is a gate more to fail alone."""
    return draw(st.integers(0, 2)) > 0 if on else False


def _gate_request(draw: st.DrawFn, rid: str, g: str, on: Any, base_models: list[str], top: str,
                  now: datetime) -> dict[str, Any]:
    """A waiting request with each restriction of a switched-on feature drawn, that ``base_models`` serve;
    an image request's options are drawn around ``top`` (:func:`_option_set`)."""
    n = draw(_choice((1, 2, 3)))
    models: list[str] = []
    if on("models") and draw(st.booleans()):
        pool = TEXT_MODELS if g == "text" else IMAGE_MODELS
        models = draw(st.lists(_choice(pool), max_size=2, unique=True))
        models = sorted(set(models) | {draw(_choice(base_models))})
    row: dict[str, Any] = {
        "id": rid,
        "user_id": draw(_choice(USER_IDS)),
        "gentype": g,
        "created": iso(-draw(_choice(CREATED_AGO)), now),
        "expiry": iso(draw(_choice((1, 600))), now),
        "extra_priority": draw(_choice((0, 0, 10, -5))),
        "n": n,
        "jobs": n + draw(_choice((0, 0, 1))),
        "models": models,
        "slow_workers": not _often(draw, on("slow")),
        "trusted_workers": _often(draw, on("trust")),
        "nsfw": _often(draw, on("nsfw")),
        "targets": draw(_choice((None, "allow", "block"))) if on("targets") else None,
    }
    if g == "text":
        row.update(
            max_length=draw(_choice((1, 80, 200, 512, 600) if on("lengths") else (80, 200))),
            max_context_length=draw(_choice((1024, 2048, 4096) if on("lengths") else (1024, 2048))),
            is_chat=_often(draw, on("chat")),  # ordinary hordes reach the plain gates more
            validated_backends=_often(draw, on("validated")),
        )
        return row
    used = _option_set(draw, top) if on("options") else frozenset()
    size = SIDES if on("pixels") else (64, 512)
    row.update(
        width=draw(_choice(size)),
        height=draw(_choice(size)),
        steps=draw(_choice((1, 20, 30))),
        extra_slow_workers=not _often(draw, on("slow")),
        source_processing=(
            draw(_choice(("inpainting", "outpainting"))) if "source_processing" in used
            else draw(_choice(("txt2img", "txt2img", "img2img")))  # img2img processing alone is no option
        ),
        post_processing=draw(_choice((1, 2))) if "post_processing" in used else 0,
    )
    for name in IMAGE_OPTIONS:
        if name not in ("source_processing", "post_processing"):
            row[name] = name in used
    row["_used"] = used
    return row


def _options_of(request: dict[str, Any]) -> frozenset[str]:
    return request.get("_used", frozenset())


def _decisive_gates(request: dict[str, Any], on: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """The gates a copy of a worker passing ``request`` can fail alone.

    Three lists: the option gates of its newest option (for painting the inpainting model, then
    the bridge capability and the allow flag), the other option gates, and the other gates, those
    every pair has (:data:`GENERIC_GATES`, which ordinary hordes reach often) last. Allow flags
    come last as the copy of :func:`_gates_to_shut` with several flags off reaches them too.
    """
    gates: list[Any] = []
    top: list[Any] = []
    older: list[Any] = []
    if request["gentype"] == "text":
        if on("slow") and (request["is_chat"] or not request["slow_workers"]):
            gates.append("speed")
        if request["validated_backends"]:
            gates.append("validated")
        gates += [g for g in ("chat_mode", "max_length", "max_context_length") if on(GATE_FEATURE[g])]
        if request["max_length"] == 0 and "max_length" in gates:
            gates.remove("max_length")
    else:
        if not request["slow_workers"]:
            gates.append("speed")
        if not request["extra_slow_workers"]:
            gates.append("extra_slow")
        if on("pixels"):
            gates.append("pixels")
        used = _options_of(request)
        versions = sorted((OPTION_NEEDS[o][1], o) for o in used)
        newest = versions[-1][1] if versions and (len(versions) == 1 or versions[-1][0] > versions[-2][0]) else None
        if "source_processing" in used and (not request["models"] or _plain_models(request)):
            (top if newest == "source_processing" else older).append("inpainting_model")
        if newest:
            top.append(("bridge", newest))  # only the one option needing the newest bridge can fail alone
        for o in sorted(used):
            if OPTION_NEEDS[o][0]:
                (top if o == newest else older).append(("allow", o))
    if request["nsfw"]:
        gates.append("nsfw")
    if request["trusted_workers"]:
        gates.append("trust")
    if request["targets"]:
        gates.append(request["targets"] + "_list")
    if request["models"] and _disjoint_models(request):
        gates.append("models")
    gates += [g for g in ("excluded",) + GENERIC_GATES if on(GATE_FEATURE[g])]
    return top, older, gates


def _disjoint_models(request: dict[str, Any]) -> list[str]:
    """Models a worker could serve sharing none with ``request`` (an inpainting one first if it paints)."""
    pool = TEXT_MODELS if request["gentype"] == "text" else IMAGE_MODELS
    others = [m for m in pool if m not in request["models"]]
    if "source_processing" in _options_of(request):
        inpainting = [m for m in others if m in INPAINTING_IMAGE_MODELS]
        return inpainting + [m for m in others if m not in inpainting] if inpainting else []
    return others


def _plain_models(request: dict[str, Any]) -> list[str]:
    """The request's models that cannot inpaint (all image models without inpainting if it names none)."""
    names = request["models"] or IMAGE_MODELS
    return [m for m in names if m not in INPAINTING_IMAGE_MODELS]


def _passing_worker(draw: st.DrawFn, wid: str, g: str, request_rows: list[dict[str, Any]], base_models: list[str],
                    now: datetime) -> dict[str, Any]:
    """A worker that passes every gate of every request of ``request_rows``, often just at a limit."""
    row: dict[str, Any] = {
        "id": wid,
        "user_id": draw(_choice(USER_IDS)),
        "gentype": g,
        "owner_trusted": True,
        "last_check_in": iso(-draw(_choice((0, 5, 299, 300))), now),
        "threads": draw(st.integers(1, 4)),
        "maintenance": False,
        "paused": False,
        "nsfw": True,
        "models": base_models,
    }
    if g == "text":
        chat = {bool(r["is_chat"]) for r in request_rows}
        longest = max(r["max_length"] for r in request_rows)
        widest = max(r["max_context_length"] for r in request_rows)
        row.update(
            # The floors are 3 to 5 tokens/s; 5 is exactly the highest.
            speed=draw(_choice((None, 5.0, 7.25, 30.0))),
            bridge_agent=draw(_choice(VALIDATED_TEXT_BRIDGES if any(r["validated_backends"] for r in request_rows)
                                      else TEXT_BRIDGES)),
            chat_mode="opt_in" if chat == {True, False} else draw(_choice(("opt_in", "only") if True in chat
                                                                           else ("none", "opt_in"))),
            max_length=draw(_choice((longest, 1024))),
            max_context_length=draw(_choice((widest, 8192))),
        )
        if draw(st.booleans()):  # chat limits of its own, else copies of the text limits
            row["chat_max_length"] = draw(_choice((longest, 2048)))
            row["chat_max_context_length"] = draw(_choice((widest, 8192)))
        return row
    area = max(r["width"] * r["height"] for r in request_rows)
    newest = max((OPTION_NEEDS[o][1] for r in request_rows for o in _options_of(r)), default=0)
    row.update(
        speed=draw(_choice((None, 500_000.0, 1_250_000.0, 4_000_000.0))),
        bridge_agent=_regen(draw, draw(_choice((max(newest, 1), max(newest, 1), 9)))),
        max_pixels=draw(_choice((area,) + tuple(p for p in MAX_PIXELS if p >= area))),
        extra_slow_worker=False,
        **{flag: True for flag, _ in OPTION_NEEDS.values() if flag},
    )
    return row


def _shut(draw: st.DrawFn, worker: dict[str, Any], gate: Any, request: dict[str, Any], now: datetime) -> None:
    """Make ``worker``, a copy of a worker passing ``request``, fail ``gate`` and no other gate of it.

    The gates ``("allows", flags)``, ``("old_bridge", version)`` and ``("limits", fields)`` are
    for all the requests of a horde at once: each request that the copy fails, it fails for one.
    """
    g = request["gentype"]
    if gate == "online":
        worker["last_check_in"] = iso(-draw(_choice((301, 1200))), now)
    elif gate == "paused":
        worker["paused"] = True
    elif gate == "maintenance":
        worker["maintenance"] = True
        worker["user_id"] = draw(_choice([u for u in USER_IDS if u != request["user_id"]]))
    elif gate == "nsfw":
        worker["nsfw"] = False
    elif gate == "trust":
        worker["owner_trusted"] = False
    elif gate == "models":
        others = _disjoint_models(request)
        worker["models"] = others[:1] + draw(st.lists(_choice(others), max_size=1))
        worker["models"] = list(dict.fromkeys(worker["models"]))
    elif gate == "chat_mode":
        worker["chat_mode"] = "none" if request["is_chat"] else "only"
    elif gate in ("max_length", "max_context_length"):
        field = ("chat_" + gate) if request["is_chat"] else gate
        if not request["is_chat"]:
            # A worker without chat limits of its own copies its text limits into them.
            worker.setdefault("chat_" + gate, worker[gate])
        limit = request[gate]
        worker[field] = draw(_choice((limit - 1, limit - 1, limit // 2)))
    elif gate == "validated":
        worker["bridge_agent"] = draw(_choice(TEXT_BRIDGES[4:]))
    elif gate == "speed" and g == "text":
        model = worker["models"][0] if worker["models"] else None
        floor = {TEXT_MODELS[0]: 3.0, TEXT_MODELS[1]: 4.0}.get(model, 5.0)
        worker["speed"] = draw(_choice((floor - 0.5, floor - 0.5, 2.5, 0.0)))
    elif gate == "speed":
        worker["speed"] = draw(_choice((499_999.0, 499_999.0, 250_000.0, 0.0)))
    elif gate == "extra_slow":
        worker["extra_slow_worker"] = True
    elif gate == "pixels":
        area = request["width"] * request["height"]
        worker["max_pixels"] = draw(_choice((area - 1,) + tuple(p for p in MAX_PIXELS if p < area)))
    elif gate == "inpainting_model":
        plain = _plain_models(request)
        worker["models"] = plain[:1] + draw(st.lists(_choice(plain), max_size=1))
        worker["models"] = list(dict.fromkeys(worker["models"]))
    elif gate[0] == "allow":
        worker[OPTION_NEEDS[gate[1]][0]] = False
    elif gate[0] == "allows":  # several flags off at once, each the only gate of some request
        worker.update({flag: False for flag in gate[1]})
    elif gate[0] == "old_bridge":
        version = gate[1]
        worker["bridge_agent"] = _regen(draw, version) if version else draw(_choice(NO_CAPABILITY_BRIDGES))
    elif gate[0] == "limits":  # text limits, each under the requests of one kind
        for field in ("max_length", "max_context_length"):  # chat limits no longer copies of these
            worker.setdefault("chat_" + field, worker[field])
        worker.update(dict(gate[1]))
    elif gate[0] == "bridge":
        need = OPTION_NEEDS[gate[1]][1]
        older = max((OPTION_NEEDS[o][1] for o in _options_of(request) if o != gate[1]), default=0)
        if need == 1:
            worker["bridge_agent"] = draw(_choice(NO_CAPABILITY_BRIDGES))
        else:  # just under the version needed, often
            worker["bridge_agent"] = _regen(draw, draw(_choice((need - 1, need - 1, draw(st.integers(older, need - 1))))))


def _gates_to_shut(draw: st.DrawFn, request_rows: list[dict[str, Any]], on: Any) -> list[tuple[dict[str, Any], Any]]:
    """(request, gate) for the copies of the passing worker, in order: two option gates and another
    gate in turn, the requests taken in turn within each, the gates of each request's newest
    option first (an older option is the newest of some other request).

    Lists walked in turn from a drawn start, not a gate drawn per copy: a drawn index into lists of
    different lengths lands on their first entries far more often, and the copies of a horde would
    then fail the same few gates.
    """
    def rotated(items: list[Any]) -> list[Any]:
        k = draw(st.integers(0, len(items) - 1)) if len(items) > 1 else 0
        return items[k:] + items[:k]

    def in_turn(lists: list[list[Any]]) -> list[Any]:
        return [x[k] for k in range(max((len(x) for x in lists), default=0)) for x in lists if k < len(x)]

    firsts: list[list[tuple[dict[str, Any], Any]]] = []
    rests: list[list[tuple[dict[str, Any], Any]]] = []
    flags: set[str] = set()
    versions: set[int] = set()
    for r in rotated(list(request_rows)):
        top, older, gates = _decisive_gates(r, on)
        flags |= {OPTION_NEEDS[g[1]][0] for g in top if g[0] == "allow"}
        versions |= {OPTION_NEEDS[g[1]][1] - 1 for g in top if g[0] == "bridge"}
        firsts.append([(r, g) for g in top + rotated(older)])
        if draw(st.integers(0, 2)):  # mostly the gates every pair has after the others
            gates = rotated([g for g in gates if g not in GENERIC_GATES]) + [g for g in gates if g in GENERIC_GATES]
        else:
            gates = rotated(gates)
        rests.append([(r, g) for g in gates])
    # Two option gates to one other: there are more of them, and ordinary hordes reach the others.
    options, others = in_turn(firsts), in_turn(rests)
    # One copy with the allow flag of every request's newest option off: each request using one
    # of those options (and no other of those flags) turns it away for that flag alone.
    order: list[tuple[dict[str, Any], Any]] = []
    if len(flags) >= 2:
        order.append((request_rows[0], ("allows", tuple(sorted(flags)))))
    # And one with a bridge just too old for some request's newest option: each request with one
    # option newer than it turns it away for that option's capability alone.
    if versions and len(request_rows) >= 2:
        order.append((request_rows[0], ("old_bridge", draw(_choice(sorted(versions))))))
    # Text: copies with one limit under every plain request's and another under every chat
    # request's, so that each request turns them away for one limit alone.
    plain = [r for r in request_rows if r["gentype"] == "text" and not r["is_chat"]]
    chat = [r for r in request_rows if r["gentype"] == "text" and r["is_chat"]]
    if on("lengths") and (plain or chat):
        for plain_field, chat_field in (("max_length", "max_context_length"), ("max_context_length", "max_length")):
            limits = {}
            if plain and min(r[plain_field] for r in plain) > 0:
                limits[plain_field] = min(r[plain_field] for r in plain) - 1
            if chat and min(r[chat_field] for r in chat) > 0:
                limits["chat_" + chat_field] = min(r[chat_field] for r in chat) - 1
            if limits and draw(st.booleans()):
                order.append((request_rows[0], ("limits", tuple(sorted(limits.items())))))
    while options or others:
        order += options[:2] + others[:1]
        options, others = options[2:], others[1:]
    return order


@st.composite
def gate_hordes(
    draw: st.DrawFn,
    max_workers: int = 6,
    max_requests: int = 10,
    max_jobs: int = 6,
    *,
    now: datetime = NOW,
    features: frozenset[str] = FEATURES,
    gentype: str | None = None,
) -> dict[str, Any]:
    """A snapshot mapping where workers differ from one passing worker in one gate each (SPEC section 3).

    A few waiting requests of one gentype, each with restrictions of the
    switched-on ``features`` and (image) a few options; one worker that passes
    every gate of all of them, often just at a limit (lengths, pixels, speed,
    the oldest bridge version that has every capability needed); and copies of
    it that each fail one gate of one request: an allow flag off, a bridge one
    version too old for the request's newest option, a length or size one
    below the request's, a speed under the floor, no inpainting model, an
    exclusion, a target list leaving it out, and so on. Every gate is then,
    for some pair, the only reason the worker is not eligible, which is what
    lets an equivalence test see a vectorized gate that ignores it. A few
    copies fail one gate for each request at once (several allow flags off, a
    bridge too old for several requests' newest options, text limits under
    every plain and every chat request's), as a horde has few workers;
    then two option gates to one other, as option gates are the most numerous
    and ordinary hordes reach the others (:func:`_gates_to_shut`).
    """
    on = features.__contains__
    g = gentype or draw(_choice(("text", "image", "image")))  # image has more gates
    n_workers = draw(st.integers(max(1, max_workers - 1), max(1, max_workers)))  # room for copies
    n_requests = draw(st.integers(max(1, min(2, max_requests)), max(1, min(4, max_requests))))
    worker_ids = draw(st.lists(st.text("wxyz", min_size=1, max_size=3), min_size=n_workers, max_size=n_workers,
                               unique=True))
    request_ids = draw(st.lists(st.text("abAB01", min_size=1, max_size=3), min_size=n_requests,
                                max_size=n_requests, unique=True))
    pool = TEXT_MODELS if g == "text" else IMAGE_MODELS
    base_models = draw(st.lists(_choice(pool), min_size=1, max_size=3, unique=True))
    # The requests' newest options in turn from a drawn start, so that a horde's requests differ;
    # in version order, so that neighbours often need the same version and one worker with an old
    # bridge is turned away by several requests, each for its own option alone.
    tops = list(OPTION_NEEDS)
    start = draw(st.integers(0, len(tops) - 1))
    request_rows = [_gate_request(draw, rid, g, on, base_models, tops[(start + k) % len(tops)], now)
                    for k, rid in enumerate(request_ids)]
    if any("source_processing" in _options_of(r) for r in request_rows) and not (
        set(base_models) & set(INPAINTING_IMAGE_MODELS)
    ):
        base_models.append(draw(_choice(INPAINTING_IMAGE_MODELS)))
    base = _passing_worker(draw, worker_ids[0], g, request_rows, base_models, now)
    if on("maintenance") and draw(st.integers(0, 5)) == 0:
        base["maintenance"] = True  # serving its owner's requests only, and all of them are
        for r in request_rows:
            r["user_id"] = base["user_id"]
    worker_rows = [base]
    shut: dict[str, list[str]] = {"excluded": [], "allow_list": [], "block_list": []}  # "wid rid" pairs
    focus: dict[str, str] = {}  # worker id -> the request whose gate it fails
    order = _gates_to_shut(draw, request_rows, on)
    for k, wid in enumerate(worker_ids[1:]):
        worker = dict(base, id=wid, models=list(base["models"]))
        if order:  # round again when there are more copies than gates, with other values drawn
            request, gate = order[k % len(order)]
            _shut(draw, worker, gate, request, now)
            focus[wid] = request["id"]
            if gate in shut:
                shut[gate].append(f"{wid} {request['id']}")
            if gate == "excluded":  # often from the other requests too (each pair is its own rejection)
                shut[gate] += [f"{wid} {r['id']}" for r in request_rows if r is not request and draw(st.booleans())]
        worker_rows.append(worker)
    for r in request_rows:
        kind = r.pop("targets")
        r.pop("_used", None)
        if kind == "allow":
            listed = [w["id"] for w in worker_rows if f"{w['id']} {r['id']}" not in shut["allow_list"]]
            # At most 5 ids: the passing worker, then the copies that fail a gate of this request.
            listed.sort(key=lambda wid: (wid != base["id"], focus.get(wid) != r["id"]))
            r["worker_ids"] = (listed + ["ghost-w"] * draw(st.integers(0, 1)))[:5]
            r["worker_blacklist"] = False
        elif kind == "block":
            listed = [w["id"] for w in worker_rows if f"{w['id']} {r['id']}" in shut["block_list"]]
            r["worker_ids"] = (listed + ["ghost-w"] * (not listed or draw(st.booleans())))[:5]
            r["worker_blacklist"] = True
    worker_rows = draw(st.permutations(worker_rows))
    excluded = [pair.split(" ") for pair in shut["excluded"]]
    job_rows: list[dict[str, Any]] = []
    if on("jobs") and draw(st.booleans()):
        job_rows, _ = _jobs_and_exclusions(draw, worker_ids, request_ids, max_jobs, frozenset({"jobs"}), now)
    return {
        "format": "vecsched.snapshot/1",
        "now": iso(0, now),
        "workers": list(worker_rows),
        "requests": request_rows,
        "jobs": job_rows,
        "excluded_pairs": excluded,
    }


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
