"""A scalar reference for SPEC.md sections 1 and 3 to 6: one request at a time, one worker at a time.

This module is an executable copy of the spec, meant to be read next to it.
It works on plain Python rows (the ``to_dict("records")`` of
:meth:`vecsched.Snapshot.to_frames`), loops over workers and requests, and
keeps its own copy of the horde's constants. It deliberately imports nothing
from the vectorized modules (``vecsched.core.rules``, ``vecsched.core.estimate``): the
property tests compare the two, and a shared helper would hide a shared bug.

It is slow on purpose (a request's figures cost a pass over every worker and
every request ahead of it), which also makes it the "computed per request on
each poll" baseline that SPEC.md section 0 describes.

Decisions where SPEC.md is silent follow the project's recorded decisions; each
is noted where it is applied.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import pandas as pd

# -- constants (SPEC.md sections 1 and 3) ----------------------------------------------

ONLINE_WINDOW_SECONDS = 300.0
ASSUMED_SPEED = {"text": 10.0, "image": 1_000_000.0}  # per thread, for a worker with no samples
IMAGE_SLOW_SPEED = 500_000.0  # pixel-steps/s; a slower image worker needs slow_workers

VALIDATED_TEXT_BRIDGES = frozenset(
    {
        "AI Horde Worker",
        "AI Horde Worker~aphrodite~oai",
        "AI Horde Worker~aphrodite~kai",
        "KoboldCppEmbedWorker",
        "TabbyAPI",
    }
)

IMAGE_BRIDGE = "AI Horde Worker reGen"
# What each reGen version brings; a version has everything of the versions below it.
CAPABILITIES_SINCE_VERSION = {
    1: ("img2img", "inpainting", "post_processing", "r2", "controlnet", "hires_fix", "tiling", "clip_skip"),
    2: ("lora", "textual_inversion"),
    5: ("extra_source_images",),
    8: ("layer_diffuse",),
    9: ("flux",),
}

FIELDS = (
    "gentype",
    "eligible_workers",
    "eligible_worker_threads",
    "is_possible",
    "queue_position",
    "wait_time",
    "ahead_wait",
    "horde_queue_position",
    "horde_wait_time",
    "fallback",
    "waiting",
    "processing",
    "finished",
    "restarted",
)
_INT_FIELDS = (
    "eligible_workers",
    "eligible_worker_threads",
    "queue_position",
    "horde_queue_position",
    "waiting",
    "processing",
    "finished",
    "restarted",
)
_FLOAT_FIELDS = ("wait_time", "ahead_wait", "horde_wait_time")
_BOOL_FIELDS = ("is_possible", "fallback")

_TIME_FIELDS = {
    "workers": ("last_check_in",),
    "requests": ("created", "expiry"),
    "jobs": ("started",),
}


# -- packaged model reference data ----------------------------------------------------


def _read_csv(name: str) -> list[dict[str, str]]:
    with resources.files("vecsched.data").joinpath(name).open("r", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@lru_cache(maxsize=1)
def text_model_parameters() -> dict[str, float]:
    """Parameter count of each known text model (``data/text_models.csv``); 0 when not given."""
    out = {}
    for row in _read_csv("text_models.csv"):
        try:
            out[row["name"]] = float(row["parameters"] or 0)
        except ValueError:
            out[row["name"]] = 0.0
    return out


@lru_cache(maxsize=1)
def inpainting_models() -> frozenset[str]:
    """The image models that can inpaint (``data/image_models.csv``)."""
    return frozenset(row["name"] for row in _read_csv("image_models.csv") if row["inpainting"] == "True")


# -- facts about one worker or one request ---------------------------------------------


def _is_null(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def effective_speed(worker: Mapping[str, Any]) -> float:
    """Measured speed, or the assumed one for a worker with no samples (SPEC section 1)."""
    if _is_null(worker["speed"]):
        return ASSUMED_SPEED[worker["gentype"]]
    return float(worker["speed"])


def is_online(worker: Mapping[str, Any], now: float) -> bool:
    """Checked in within the last 300 s (boundary included)."""
    return now - worker["last_check_in"] <= ONLINE_WINDOW_SECONDS


def is_waiting(request: Mapping[str, Any], now: float) -> bool:
    """Active, not faulted, not expired, and has jobs left to hand out."""
    return bool(request["active"]) and not request["faulted"] and request["expiry"] > now and request["n"] > 0


def job_output(request: Mapping[str, Any]) -> int:
    """Output of one job: tokens (text) or pixel-steps (image)."""
    if request["gentype"] == "text":
        return int(request["max_length"])
    return int(request["width"]) * int(request["height"]) * int(request["steps"])


def queue_key(request: Mapping[str, Any]) -> tuple[int, float, str]:
    """Sort key of the queue order: priority descending, then created, then id."""
    return (-int(request["extra_priority"]), request["created"], request["id"])


def text_speed_floor(worker: Mapping[str, Any]) -> float:
    """Tokens/s below which a text worker is slow, from its first model's size."""
    models = list(worker["models"])
    parameters = text_model_parameters().get(models[0], 0.0) if models else 0.0
    if parameters >= 20e9:
        return 3.0
    if parameters >= 13e9:
        return 4.0
    return 5.0  # smaller, or unknown size


def bridge_name(agent: str) -> str:
    """The bridge name: ``bridge_agent`` up to its first ``:``."""
    return agent.split(":", 1)[0]


def bridge_version(agent: str) -> int:
    """The leading whole number of the version part of ``name:version:url`` (0 if none)."""
    parts = agent.split(":", 2)
    if len(parts) < 2:
        return 0
    match = re.match(r"\d+", parts[1])
    return int(match.group()) if match else 0


def bridge_capabilities(agent: str) -> frozenset[str]:
    """Capabilities of an image bridge; only reGen has any, cumulative by version."""
    if bridge_name(agent) != IMAGE_BRIDGE:
        return frozenset()
    version = bridge_version(agent)
    caps: set[str] = set()
    for since, names in CAPABILITIES_SINCE_VERSION.items():
        if version >= since:
            caps.update(names)
    return frozenset(caps)


def image_options(request: Mapping[str, Any]) -> list[tuple[str, str | None, str]]:
    """The options an image request uses: (option, worker allow flag or None, capability)."""
    used = []
    # SPEC 3, image rule 9: a source image makes img2img; source_processing alone does not.
    if request["source_image"]:
        used.append(("img2img", "allow_img2img", "img2img"))
    if request["source_processing"] in ("inpainting", "outpainting"):
        used.append(("painting", "allow_painting", "inpainting"))
    if request["post_processing"] > 0:
        used.append(("post_processing", "allow_post_processing", "post_processing"))
    if request["control_type"]:
        used.append(("controlnet", "allow_controlnet", "controlnet"))
    if request["loras"]:
        used.append(("loras", "allow_lora", "lora"))
    if request["tis"]:
        used.append(("tis", None, "textual_inversion"))
    if request["hires_fix"]:
        used.append(("hires_fix", None, "hires_fix"))
    if request["tiling"]:
        used.append(("tiling", None, "tiling"))
    if request["transparent"]:
        used.append(("transparent", "allow_sdxl_controlnet", "layer_diffuse"))
    if request["extra_source_images"]:
        used.append(("extra_source_images", None, "extra_source_images"))
    if request["r2"]:
        used.append(("r2", None, "r2"))
    return used


def _models(row: Mapping[str, Any]) -> frozenset[str]:
    # prepare() stores the set once per row; a bare row builds it on the fly.
    cached = row.get("model_set")
    return cached if cached is not None else frozenset(row["models"])


# -- eligibility (SPEC section 3) -------------------------------------------------------


@dataclass
class Context:
    """What a pair check needs beyond the two rows: the instant, the exclusions, the workers.

    ``workers`` is needed by the chat speed gate, whose fallback depends on
    whether *any* online worker passes it.
    """

    now: float
    workers: list[dict[str, Any]]
    excluded: frozenset[tuple[str, str]] = frozenset()
    _chat_has_fast: dict[str, bool] = field(default_factory=dict, repr=False)

    def chat_has_fast_worker(self, request: Mapping[str, Any]) -> bool:
        """Does some worker pass every gate of this chat request, the speed gate included?"""
        rid = request["id"]
        if rid not in self._chat_has_fast:
            self._chat_has_fast[rid] = any(
                passes_gates_except_speed(w, request, self) and passes_speed_gate(w, request)
                for w in self.workers
            )
        return self._chat_has_fast[rid]


def passes_gates_except_speed(worker: Mapping[str, Any], request: Mapping[str, Any], ctx: Context) -> bool:
    """Every gate of SPEC section 3 except the text speed gate (text gate 9)."""
    # 1. same gentype, online worker, waiting request
    if worker["gentype"] != request["gentype"]:
        return False
    if not is_online(worker, ctx.now) or not is_waiting(request, ctx.now):
        return False
    # paused is handed decoys only
    if worker["paused"]:
        return False
    # 6. excluded pairs
    if (worker["id"], request["id"]) in ctx.excluded:
        return False
    if not passes_shared_gates(worker, request):
        return False
    if request["gentype"] == "text":
        return passes_text_gates(worker, request)
    if effective_speed(worker) < IMAGE_SLOW_SPEED and not request["slow_workers"]:
        return False  # image gate 8, slow workers
    return passes_image_limits(worker, request) and passes_image_options(worker, request)


def passes_shared_gates(worker: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    """The gates both gentypes share that read only the two rows: maintenance, nsfw, trust,
    targeting and models (SPEC section 3, gates 2 to 5)."""
    # 2. maintenance serves only the owner
    if worker["maintenance"] and worker["user_id"] != request["user_id"]:
        return False
    # 3. nsfw and trust
    if request["nsfw"] and not worker["nsfw"]:
        return False
    if request["trusted_workers"] and not worker["owner_trusted"]:
        return False
    # 4. targeting
    targets = list(request["worker_ids"])
    if targets:
        targeted = worker["id"] in targets
        if request["worker_blacklist"] and targeted:
            return False
        if not request["worker_blacklist"] and not targeted:
            return False
    # 5. models
    if request["models"] and not (_models(request) & _models(worker)):
        return False
    return True


def passes_text_gates(worker: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    """Text gates 7 and 8: the kind of job with its length limits, and validated backends."""
    # 7. kind of job and length limits
    if request["is_chat"]:
        if worker["chat_mode"] not in ("opt_in", "only"):
            return False
        if request["max_length"] > worker["chat_max_length"]:
            return False
        if request["max_context_length"] > worker["chat_max_context_length"]:
            return False
    else:
        if worker["chat_mode"] == "only":
            return False
        if request["max_length"] > worker["max_length"]:
            return False
        if request["max_context_length"] > worker["max_context_length"]:
            return False
    # 8. validated backends
    if request["validated_backends"] and bridge_name(worker["bridge_agent"]) not in VALIDATED_TEXT_BRIDGES:
        return False
    return True


def passes_image_limits(worker: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    """Image gates 7 and 8 but the speed: the size, and extra slow workers."""
    if request["width"] * request["height"] > worker["max_pixels"]:
        return False
    if worker["extra_slow_worker"] and not request["extra_slow_workers"]:
        return False
    return True


def passes_image_options(worker: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    """Image gate 9: each option's allow flag where one exists, and the bridge capability."""
    caps = bridge_capabilities(worker["bridge_agent"])
    for option, allow, capability in image_options(request):
        if allow is not None and not worker[allow]:
            return False
        if capability not in caps:
            return False
        if option == "painting" and not (_models(worker) & inpainting_models()):
            return False
    return True


def passes_speed_gate(worker: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    """Text gate 9 without its chat fallback; image requests have no such gate here."""
    if request["gentype"] != "text":
        return True
    below_floor = effective_speed(worker) < text_speed_floor(worker)
    if request["is_chat"]:
        return not below_floor  # chat is always gated, whatever slow_workers says
    if not request["slow_workers"]:
        return not below_floor
    return True


def is_eligible(worker: Mapping[str, Any], request: Mapping[str, Any], ctx: Context) -> bool:
    """May ``worker`` be handed a job of ``request`` (SPEC section 3)?

    Examples
    --------
    >>> w = {"id": "w", "user_id": "u", "gentype": "text", "last_check_in": 0.0,
    ...      "speed": None, "maintenance": False, "paused": False, "nsfw": True,
    ...      "owner_trusted": False, "models": ["m"], "bridge_agent": "unknown:0:unknown",
    ...      "chat_mode": "none", "max_length": 512, "max_context_length": 2048,
    ...      "chat_max_length": 512, "chat_max_context_length": 2048}
    >>> r = {"id": "r", "user_id": "v", "gentype": "text", "active": True, "faulted": False,
    ...      "expiry": 600.0, "n": 1, "nsfw": False, "trusted_workers": False,
    ...      "worker_ids": [], "worker_blacklist": False, "models": ["m"], "is_chat": False,
    ...      "max_length": 80, "max_context_length": 1024, "validated_backends": False,
    ...      "slow_workers": True}
    >>> is_eligible(w, r, Context(now=10.0, workers=[w]))
    True
    >>> is_eligible(w, dict(r, max_length=600), Context(now=10.0, workers=[w]))
    False
    """
    if not passes_gates_except_speed(worker, request, ctx):
        return False
    if passes_speed_gate(worker, request):
        return True
    # A chat request nobody fast can serve still counts the slow workers (SPEC 3, text 9).
    return request["gentype"] == "text" and bool(request["is_chat"]) and not ctx.chat_has_fast_worker(request)


def could_take(worker: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    """Could ``worker`` take queued ``request``, judged on the stored queue's fields (SPEC 3)?

    Online, speed, trust and targeting are not part of it.

    Examples
    --------
    >>> w = {"gentype": "text", "models": ["m"], "chat_mode": "none", "max_length": 512,
    ...      "max_context_length": 2048, "chat_max_length": 512, "chat_max_context_length": 2048}
    >>> j = {"gentype": "text", "models": ["m"], "is_chat": False, "max_length": 80,
    ...      "max_context_length": 1024}
    >>> could_take(w, j), could_take(w, dict(j, is_chat=True))
    (True, False)
    """
    if worker["gentype"] != request["gentype"]:
        return False
    if request["models"] and not (_models(request) & _models(worker)):
        return False
    if request["gentype"] == "image":
        return request["width"] * request["height"] <= worker["max_pixels"]
    if request["is_chat"]:
        return (
            worker["chat_mode"] in ("opt_in", "only")
            and request["max_length"] <= worker["chat_max_length"]
            and request["max_context_length"] <= worker["chat_max_context_length"]
        )
    return (
        worker["chat_mode"] in ("none", "opt_in")
        and request["max_length"] <= worker["max_length"]
        and request["max_context_length"] <= worker["max_context_length"]
    )


# -- per-snapshot setup -------------------------------------------------------------------


@dataclass
class Prepared:
    """The per-snapshot setup of :func:`estimate_one`: rows as dicts, indexes by id, the queue."""

    now: float
    workers: list[dict[str, Any]]
    requests: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    ctx: Context
    worker_by_id: dict[str, dict[str, Any]]
    request_by_id: dict[str, dict[str, Any]]
    jobs_by_request: dict[str, list[dict[str, Any]]]
    waiting: list[dict[str, Any]]  # waiting requests, in queue order


def _rows(snapshot: Any, frames: dict[str, pd.DataFrame], table: str) -> list[dict[str, Any]]:
    rows = frames[table].to_dict("records")
    # Times as the snapshot's own epoch seconds: going through Timestamps could
    # move a value by a nanosecond and flip a comparison at an exact boundary.
    columns = getattr(snapshot, table).columns
    for name in _TIME_FIELDS[table]:
        for row, value in zip(rows, columns[name].tolist()):
            row[name] = float(value)
    for row in rows:
        if "models" in row:
            row["model_set"] = frozenset(row["models"])
        if "speed" in row and _is_null(row["speed"]):
            row["speed"] = None
    return rows


def prepare(snapshot: Any) -> Prepared:
    """Do the per-snapshot work of :func:`estimate_one` once.

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z", "workers": [], "requests": []})
    >>> prepare(snap).waiting
    []
    """
    frames = snapshot.to_frames()
    now = float(snapshot.now)
    workers = _rows(snapshot, frames, "workers")
    requests = _rows(snapshot, frames, "requests")
    jobs = _rows(snapshot, frames, "jobs")
    excluded = frozenset(
        zip(frames["excluded_pairs"]["worker_id"].tolist(), frames["excluded_pairs"]["request_id"].tolist())
    )
    jobs_by_request: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        jobs_by_request.setdefault(job["request_id"], []).append(job)
    waiting = sorted((r for r in requests if is_waiting(r, now)), key=queue_key)
    return Prepared(
        now=now,
        workers=workers,
        requests=requests,
        jobs=jobs,
        ctx=Context(now=now, workers=workers, excluded=excluded),
        worker_by_id={w["id"]: w for w in workers},
        request_by_id={r["id"]: r for r in requests},
        jobs_by_request=jobs_by_request,
        waiting=waiting,
    )


# -- figures (SPEC sections 4 to 6) ---------------------------------------------------------


def eligible_workers(snapshot: Any, request_id: str, prepared: Prepared | None = None) -> list[str]:
    """Ids of the workers in A(i), in snapshot order (empty for a request that is not waiting).

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z",
    ...     "workers": [{"id": "w1", "user_id": "u1", "gentype": "text", "models": ["m"],
    ...                  "last_check_in": "2026-11-29T11:59:00Z"},
    ...                 {"id": "w2", "user_id": "u1", "gentype": "text", "models": ["x"],
    ...                  "last_check_in": "2026-11-29T11:59:00Z"}],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1,
    ...                   "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z", "models": ["m"]}]})
    >>> eligible_workers(snap, "r1")
    ['w1']
    """
    p = prepared if prepared is not None else prepare(snapshot)
    request = p.request_by_id.get(request_id)
    if request is None:
        return []
    return [w["id"] for w in p.workers if is_eligible(w, request, p.ctx)]


def in_flight_part(request: Mapping[str, Any], p: Prepared) -> float:
    """Longest remaining time of the request's processing jobs; NaN when a worker's speed is 0."""
    longest = 0.0
    for job in p.jobs_by_request.get(request["id"], []):
        if job["state"] != "processing":
            continue
        worker = p.worker_by_id.get(job["worker_id"])
        # A worker not in the snapshot counts at the assumed speed of the request's gentype.
        speed = effective_speed(worker) if worker is not None else ASSUMED_SPEED[request["gentype"]]
        if speed == 0:
            return math.nan
        remaining = job_output(request) / speed - (p.now - job["started"])
        longest = max(longest, max(0.0, remaining))
    return longest


def estimate_one(
    snapshot: Any,
    request_id: str,
    prepared: Prepared | None = None,
    *,
    eligible_image_wait: bool = False,
) -> dict[str, Any]:
    """All figures of one waiting request, by the letter of SPEC.md sections 4 to 6.

    Raises ``KeyError`` when ``request_id`` is not a waiting request of the snapshot.

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z",
    ...     "workers": [{"id": "w1", "user_id": "u1", "gentype": "text", "speed": 20,
    ...                  "models": ["m"], "last_check_in": "2026-11-29T11:59:00Z"}],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1,
    ...                   "max_length": 200, "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z", "models": ["m"]}]})
    >>> fig = estimate_one(snap, "r1")
    >>> fig["eligible_workers"], fig["queue_position"], fig["wait_time"]
    (1, 0, 10.0)
    """
    p = prepared if prepared is not None else prepare(snapshot)
    i = p.request_by_id.get(request_id)
    if i is None or not is_waiting(i, p.now):
        raise KeyError(f"{request_id!r} is not a waiting request of this snapshot")
    gentype = i["gentype"]
    n_i = int(i["n"])
    own_output = n_i * job_output(i)

    # Section 4: eligible workers and progress.
    eligible = [w for w in p.workers if is_eligible(w, i, p.ctx)]
    threads = sum(int(w["threads"]) for w in eligible)
    throughput = sum(effective_speed(w) * int(w["threads"]) for w in eligible)
    my_jobs = p.jobs_by_request.get(request_id, [])
    processing = sum(1 for job in my_jobs if job["state"] == "processing")
    finished = sum(1 for job in my_jobs if job["state"] == "finished")
    restarted = sum(1 for job in my_jobs if job["state"] == "faulted")
    in_flight = in_flight_part(i, p)

    # Section 6: horde-wide figures of i's gentype.
    ahead = [j for j in p.waiting if j["gentype"] == gentype and queue_key(j) < queue_key(i)]
    online = [w for w in p.workers if w["gentype"] == gentype and is_online(w, p.now)]
    horde_threads = sum(int(w["threads"]) for w in online)
    horde_output_ahead = sum(int(j["n"]) * job_output(j) for j in ahead)
    horde_jobs_ahead = sum(int(j["n"]) for j in ahead)
    if online:
        mean_speed = sum(effective_speed(w) for w in online) / len(online)
    else:
        mean_speed = math.nan
    if not online or mean_speed == 0:
        horde_wait = math.nan  # unknown
    else:
        horde_wait = (horde_output_ahead + own_output) / (
            mean_speed * min(horde_threads, horde_jobs_ahead + n_i)
        ) + in_flight

    # Section 5: the eligibility-aware queue (text; image too when switched on).
    fallback = False
    if gentype == "text" or eligible_image_wait:
        if threads == 0:
            queue_position, wait_time, ahead_wait, fallback = len(ahead), horde_wait, math.nan, True
        else:
            competing = [j for j in ahead if any(could_take(w, j) for w in eligible)]
            queue_position = len(competing)
            output_ahead = sum(int(j["n"]) * job_output(j) for j in competing)
            jobs_ahead = sum(int(j["n"]) for j in competing)
            if throughput == 0:
                wait_time = math.nan
                ahead_wait = 0.0 if jobs_ahead == 0 else math.nan
            else:
                wait_time = (output_ahead + own_output) / (
                    throughput * min(1.0, (jobs_ahead + n_i) / threads)
                ) + in_flight
                if jobs_ahead == 0:
                    ahead_wait = 0.0
                else:
                    ahead_wait = output_ahead / (throughput * min(1.0, jobs_ahead / threads))
    else:
        queue_position, wait_time, ahead_wait = len(ahead), horde_wait, math.nan

    return {
        "gentype": gentype,
        "eligible_workers": len(eligible),
        "eligible_worker_threads": threads,
        "is_possible": processing > 0 or len(eligible) > 0,
        "queue_position": queue_position,
        "wait_time": float(wait_time),
        "ahead_wait": float(ahead_wait),
        "horde_queue_position": len(ahead),
        "horde_wait_time": float(horde_wait),
        "fallback": fallback,
        "waiting": max(int(i["jobs"]) - processing - finished, 0),
        "processing": processing,
        "finished": finished,
        "restarted": restarted,
    }


def estimate_reference(snapshot: Any, eligible_image_wait: bool = False) -> pd.DataFrame:
    """Every waiting request's figures, one at a time; the frame of ``Estimates.to_frame()``.

    Indexed by request id (name ``id``), waiting requests in snapshot order.

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z", "workers": [],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 2,
    ...                   "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z"}]})
    >>> frame = estimate_reference(snap)
    >>> bool(frame.loc["r1", "fallback"]), bool(frame.loc["r1", "is_possible"])
    (True, False)
    """
    p = prepare(snapshot)
    ids = [r["id"] for r in p.requests if is_waiting(r, p.now)]
    rows = [estimate_one(snapshot, rid, p, eligible_image_wait=eligible_image_wait) for rid in ids]
    data: dict[str, Any] = {}
    for name in FIELDS:
        values = [row[name] for row in rows]
        if name == "gentype":
            data[name] = pd.Categorical(values, categories=["text", "image"])
        elif name in _INT_FIELDS:
            data[name] = pd.Series(values, dtype="int64").to_numpy()
        elif name in _FLOAT_FIELDS:
            data[name] = pd.Series(values, dtype="float64").to_numpy()
        else:
            data[name] = pd.Series(values, dtype="bool").to_numpy()
    index = pd.Index(pd.Series(ids, dtype=object), name="id")
    return pd.DataFrame(data, index=index)


# -- might_stall (SPEC section 7) -----------------------------------------------------------

STALL_WINDOW_SECONDS = 300.0
STALL_MIN_WINDOW_SECONDS = 120.0
STALL_FIELDS = (
    "might_stall",
    "stall_evidence",
    "dispatch_opportunities",
    "lost_opportunities",
    "returned_capacity",
    "active_preceding_dispatches",
    "arriving_work",
    "returned_work",
)


def job_work(request: Mapping[str, Any]) -> float:
    """Work of one job in section 7's units: tokens (text), megapixel-steps (image)."""
    if request["gentype"] == "text":
        return float(request["max_length"])
    return job_output(request) / 1e6


def _event_rows(snapshot: Any, table: str) -> list[dict[str, Any]]:
    columns = getattr(snapshot, table).columns
    names = [n for n in columns if n != "id"]
    values = [columns[n].tolist() for n in names]
    return [dict(zip(names, row)) for row in zip(*values)]


def _precedes(dispatch: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    """Was ``dispatch`` given to work placed before ``request``?"""
    if dispatch["selected_from_priority_queue"] and request["user_id"] not in dispatch["priority_user_ids"]:
        return True
    if dispatch["request_extra_priority"] != request["extra_priority"]:
        return dispatch["request_extra_priority"] > request["extra_priority"]
    return dispatch["request_created"] < request["created"]


def _arriving_work(p: Prepared, i: Mapping[str, Any], eligible: list[Any], preceding: list[Any],
                   half: Any) -> list[float]:
    """Arriving work per half: takeable arrivals ahead of i, plus preceding pops of later requests."""
    arriving = [0.0, 0.0]
    for j in p.waiting:
        h = half(j["created"])
        if (
            j["gentype"] == i["gentype"]
            and h is not None
            and queue_key(j) < queue_key(i)
            and any(could_take(w, j) for w in eligible)
        ):
            arriving[h] += int(j["n"]) * job_work(j)
    for d in preceding:
        h = half(d["request_created"])
        if d["request_created"] > i["created"] and h is not None:
            arriving[h] += d["assigned_work"]
    return arriving


def _first_evidence(*, threads: int, window: float, incomplete: bool, returns_per_half: list[int],
                    relevant: int, preceding: int, active_preceding: int, arriving: list[float],
                    returned_work: list[float]) -> str:
    """The first of section 7's evidence values that applies, in the SPEC's order."""
    if threads == 0:
        return "none_eligible"
    if window < STALL_MIN_WINDOW_SECONDS:
        return "insufficient_window"
    if incomplete:
        return "incomplete_return_history"
    if min(returns_per_half) < threads:
        return "insufficient_replacement"
    if not relevant or preceding < relevant:
        return "target_opportunity_seen"
    if active_preceding < threads:
        return "compatible_capacity_returning"
    if any(arriving[h] <= returned_work[h] for h in (0, 1)):
        return "preceding_arrivals_not_outpacing_drain"
    return "arrival_outpaces_drain"


def stall_one(snapshot: Any, request_id: str, prepared: Prepared | None = None) -> dict[str, Any]:
    """might_stall, its evidence and the pressure figures of one waiting request (SPEC section 7).

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z", "workers": [],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1,
    ...                   "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z"}]})
    >>> stall_one(snap, "r1")["stall_evidence"]
    'none_eligible'
    """
    p = prepared if prepared is not None else prepare(snapshot)
    i = p.request_by_id[request_id]
    figures: dict[str, Any] = {
        "might_stall": False,
        "stall_evidence": None,
        "dispatch_opportunities": 0,
        "lost_opportunities": 0,
        "returned_capacity": 0,
        "active_preceding_dispatches": 0,
        "arriving_work": 0.0,
        "returned_work": 0.0,
        "_halves": ((0.0, 0.0), (0.0, 0.0)),
    }
    # Only while the request waits with nothing in flight.
    if any(job["state"] == "processing" for job in p.jobs_by_request.get(request_id, [])):
        return figures
    eligible = [w for w in p.workers if is_eligible(w, i, p.ctx)]
    in_a = {w["id"]: w for w in eligible}
    threads = sum(int(w["threads"]) for w in eligible)
    start = max(i["created"], p.now - STALL_WINDOW_SECONDS)
    middle = start + (p.now - start) / 2

    def half(t: float) -> int | None:
        if start <= t < middle:
            return 0
        if middle <= t <= p.now:
            return 1
        return None

    dispatches = _event_rows(snapshot, "dispatches")
    returns = _event_rows(snapshot, "capacity_returns")
    dispatch_by_id = {d["dispatch_id"]: d for d in dispatches}
    returned_ids = {c["dispatch_id"] for c in returns}

    # Relevant dispatches: in the window, by a worker of A(i) in the capability
    # state it popped in, for another request.
    relevant = [
        d for d in dispatches
        if half(d["dispatched_at"]) is not None
        and d["worker_id"] in in_a
        and d["worker_state"] == in_a[d["worker_id"]]["state"]
        and d["request_id"] != request_id
    ]
    preceding = [d for d in relevant if _precedes(d, i)]
    active_preceding = [d for d in preceding if d["dispatch_id"] not in returned_ids]

    in_window = [c for c in returns if half(c["returned_at"]) is not None and c["worker_id"] in in_a]
    matched = [c for c in in_window if c["dispatch_id"] in dispatch_by_id]
    incomplete = len(matched) < len(in_window)
    returns_per_half = [0, 0]
    returned_work = [0.0, 0.0]
    for c in matched:
        h = half(c["returned_at"])
        returns_per_half[h] += 1
        returned_work[h] += dispatch_by_id[c["dispatch_id"]]["assigned_work"]

    arriving = _arriving_work(p, i, eligible, preceding, half)

    figures.update(
        dispatch_opportunities=len(relevant),
        lost_opportunities=len(preceding),
        returned_capacity=len(matched),
        active_preceding_dispatches=len(active_preceding),
        arriving_work=arriving[0] + arriving[1],
        returned_work=returned_work[0] + returned_work[1],
    )
    evidence = _first_evidence(
        threads=threads, window=p.now - start, incomplete=incomplete, returns_per_half=returns_per_half,
        relevant=len(relevant), preceding=len(preceding), active_preceding=len(active_preceding),
        arriving=arriving, returned_work=returned_work,
    )
    figures["stall_evidence"] = evidence
    figures["might_stall"] = evidence == "arrival_outpaces_drain"
    # The halves, for tests that need to tell a tie from a strict comparison.
    figures["_halves"] = (tuple(arriving), tuple(returned_work))
    return figures


def stall_reference(snapshot: Any) -> pd.DataFrame:
    """Section 7 for every waiting request, one at a time; indexed by request id.

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z", "workers": [], "requests": []})
    >>> list(stall_reference(snap).columns) == list(STALL_FIELDS) + ["_halves"]
    True
    """
    p = prepare(snapshot)
    ids = [r["id"] for r in p.requests if is_waiting(r, p.now)]
    rows = [stall_one(snapshot, rid, p) for rid in ids]
    names = list(STALL_FIELDS) + ["_halves"]
    index = pd.Index(pd.Series(ids, dtype=object), name="id")
    return pd.DataFrame({name: pd.Series([row[name] for row in rows], dtype=object, index=index) for name in names})




# -- shadow forecasts (SPEC section 8; eligible-share-v1 from issue 12) --------------------

FORECAST_FIELDS = ("start_p50", "start_p90", "completion_p50", "completion_p90", "predicted_stall")


def _provisional(start_p50: float, completion_p50: float, seconds_left: float) -> dict[str, Any]:
    """p90 = p50 + max(60 s, 50% of p50); a stall when the start p90 reaches the expiry or is unknown."""
    def p90(p50: float) -> float:
        return p50 + max(60.0, 0.5 * p50) if not math.isnan(p50) else math.nan

    start_p90 = p90(start_p50)
    return {
        "start_p50": start_p50,
        "start_p90": start_p90,
        "completion_p50": completion_p50,
        "completion_p90": p90(completion_p50),
        "predicted_stall": math.isnan(start_p90) or start_p90 >= seconds_left,
    }


def compatible_queue_v1(snapshot: Any, request_id: str, prepared: Prepared | None = None) -> dict[str, Any]:
    """SPEC section 8's ``compatible-queue-v1`` forecast of one waiting request.

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z",
    ...     "workers": [{"id": "w1", "user_id": "u1", "gentype": "text", "speed": 20,
    ...                  "models": ["m"], "last_check_in": "2026-11-29T11:59:00Z"}],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1,
    ...                   "max_length": 200, "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z", "models": ["m"]}]})
    >>> f = compatible_queue_v1(snap, "r1")
    >>> f["start_p50"], f["completion_p50"], f["completion_p90"], f["predicted_stall"]
    (0.0, 10.0, 70.0, False)
    """
    p = prepared if prepared is not None else prepare(snapshot)
    i = p.request_by_id[request_id]
    gentype = i["gentype"]
    through = [j for j in p.waiting if j["gentype"] == gentype and queue_key(j) <= queue_key(i)]
    work_through = sum(int(j["n"]) * job_output(j) for j in through)
    jobs_through = sum(int(j["n"]) for j in through)
    own_work, own_jobs = int(i["n"]) * job_output(i), int(i["n"])
    online = [w for w in p.workers if w["gentype"] == gentype and is_online(w, p.now)]
    v = sum(effective_speed(w) for w in online) / len(online) if online else 0.0
    threads = sum(int(w["threads"]) for w in p.workers if is_eligible(w, i, p.ctx))
    if v > 0 and threads > 0:
        ahead_jobs = jobs_through - own_jobs
        start = 0.0 if ahead_jobs == 0 else (work_through - own_work) / (v * min(threads, ahead_jobs))
        completion = work_through / (v * min(threads, jobs_through))
    else:
        start = completion = math.nan
    return _provisional(start, completion, i["expiry"] - p.now)


def eligible_share_v1(snapshot: Any, request_id: str, prepared: Prepared | None = None) -> dict[str, Any]:
    """``eligible-share-v1``: SPEC section 5's wait, each j ahead charged T(A(i) & A(j)) / T(A(j)) of its work.

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z",
    ...     "workers": [{"id": "w1", "user_id": "u1", "gentype": "text", "speed": 20,
    ...                  "models": ["m"], "last_check_in": "2026-11-29T11:59:00Z"}],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 1,
    ...                   "max_length": 200, "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z", "models": ["m"]}]})
    >>> eligible_share_v1(snap, "r1")["completion_p50"]
    10.0
    """
    p = prepared if prepared is not None else prepare(snapshot)
    i = p.request_by_id[request_id]
    mine = {w["id"] for w in p.workers if is_eligible(w, i, p.ctx)}
    threads_of = {w["id"]: int(w["threads"]) for w in p.workers}
    threads = sum(threads_of[w] for w in mine)
    throughput = sum(effective_speed(p.worker_by_id[w]) * threads_of[w] for w in mine)
    jobs_ahead = work_ahead = 0.0
    for j in p.waiting:
        if j["gentype"] != i["gentype"] or queue_key(j) >= queue_key(i):
            continue
        theirs = {w["id"] for w in p.workers if is_eligible(w, j, p.ctx)}
        their_threads = sum(threads_of[w] for w in theirs)
        if their_threads == 0:
            continue  # delays nobody, charged nothing
        share = sum(threads_of[w] for w in theirs & mine) / their_threads
        jobs_ahead += share * int(j["n"])
        work_ahead += share * int(j["n"]) * job_output(j)
    own_jobs, own_work = int(i["n"]), int(i["n"]) * job_output(i)
    if threads > 0 and throughput > 0:
        start = 0.0 if jobs_ahead <= 0 else work_ahead / (throughput * min(1.0, jobs_ahead / threads))
        completion = (work_ahead + own_work) / (
            throughput * min(1.0, (jobs_ahead + own_jobs) / threads)
        ) + in_flight_part(i, p)
    else:
        start = completion = math.nan
    return _provisional(start, completion, i["expiry"] - p.now)


REFERENCE_ESTIMATORS = {"compatible-queue-v1": compatible_queue_v1, "eligible-share-v1": eligible_share_v1}


def forecasts_reference(snapshot: Any) -> pd.DataFrame:
    """Every waiting request's forecasts, one at a time: columns ``forecast.NAME.FIELD``.

    Examples
    --------
    >>> import vecsched
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1",
    ...     "now": "2026-11-29T12:00:00Z", "workers": [],
    ...     "requests": [{"id": "r1", "user_id": "u2", "gentype": "text", "n": 2,
    ...                   "created": "2026-11-29T11:58:00Z",
    ...                   "expiry": "2026-11-29T12:18:00Z"}]})
    >>> bool(forecasts_reference(snap).loc["r1", "forecast.eligible-share-v1.predicted_stall"])
    True
    """
    p = prepare(snapshot)
    ids = [r["id"] for r in p.requests if is_waiting(r, p.now)]
    data: dict[str, Any] = {}
    for name, one in REFERENCE_ESTIMATORS.items():
        rows = [one(snapshot, rid, p) for rid in ids]
        for f in FORECAST_FIELDS:
            dtype = "bool" if f == "predicted_stall" else "float64"
            data[f"forecast.{name}.{f}"] = pd.Series([row[f] for row in rows], dtype=dtype).to_numpy()
    return pd.DataFrame(data, index=pd.Index(pd.Series(ids, dtype=object), name="id"))
