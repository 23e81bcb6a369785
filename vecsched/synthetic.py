"""Synthetic hordes with the shape of the public AI Horde, built fast enough for benchmarks.

:func:`horde` draws a whole horde at one instant (workers, waiting requests,
jobs in flight, excluded pairs) from a seeded NumPy generator and returns it as
a :class:`~vecsched.Snapshot`. Every column is drawn as a whole array: there
is no Python loop over rows, so a million requests take seconds, not minutes.

The defaults aim at what a live queue looks like rather than at uniform noise,
because uniform noise hides the cases the estimator exists for: a few models
take most of the traffic, most text workers serve a single model, speeds spread
over more than an order of magnitude with a tail below the speed floors, a few
requests name a model nobody serves, and priorities have a long kudos tail.
Model names and sizes come from the packaged reference lists
(``vecsched/data/text_models.csv`` and ``image_models.csv``).

Every knob is a keyword option of :func:`horde`; :data:`SHAPE_DEFAULTS` lists
them with their defaults and :func:`shape_options` checks them, in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from vecsched.snapshot.schema import CHAT_NONE, CHAT_ONLY, CHAT_OPT_IN, IMAGE, JOB_FAULTED, JOB_FINISHED, JOB_PROCESSING, TEXT
from vecsched.core.rules import ONLINE_WINDOW_SECONDS, model_table
from vecsched.snapshot.lists import ListColumn
from vecsched.snapshot.snapshot import Snapshot
from vecsched.snapshot.times import to_epoch

__all__ = ["DEFAULT_NOW", "REQUEST_LIFETIME", "SHAPE_DEFAULTS", "SHAPE_OPTIONS", "horde", "shape_options"]

DEFAULT_NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc).timestamp()
"""The instant of a synthetic horde when ``now`` is not given: fixed, so a seed alone fixes the snapshot."""

REQUEST_LIFETIME = 20 * 60.0  # the horde expires a waiting request 20 minutes after creation

SHAPE_OPTIONS: dict[str, tuple[float | int, str]] = {
    # -- workers ---------------------------------------------------------------
    "text_share": (0.5, "share of workers serving text (the rest serve images)"),
    "text_model_pool": (60, "distinct text models in use (drawn from text_models.csv)"),
    "image_model_pool": (140, "distinct image models in use (drawn from image_models.csv)"),
    "zipf_exponent": (1.1, "model popularity: weight of the k-th most popular model ~ k ** -exponent"),
    "unsampled_share": (0.08, "workers with no speed samples yet (speed null)"),
    "offline_share": (0.1, "workers whose last check-in is older than the online window"),
    "paused_share": (0.02, "workers that are paused"),
    "maintenance_share": (0.03, "workers in maintenance"),
    "chat_opt_in_share": (0.35, "text workers taking plain and chat jobs"),
    "chat_only_share": (0.12, "text workers taking chat jobs only"),
    "trusted_owner_share": (0.7, "worker owners who are trusted"),
    "owner_request_share": (0.01, "requests sent by the owner of a worker in maintenance (testing it)"),
    # -- requests --------------------------------------------------------------
    "text_request_share": (0.4, "share of requests for text"),
    "chat_share": (0.3, "text requests that are chat requests"),
    "any_model_share": (0.08, "requests naming no model (any model will do)"),
    "several_models_share": (0.08, "requests naming 2 to 4 models"),
    "unserved_model_share": (0.02, "requests naming a model no worker serves"),
    "targeted_share": (0.03, "requests with a worker allow list or block list"),
    "blocklist_share": (0.2, "of the targeted requests, those whose list is a block list"),
    "nsfw_share": (0.3, "requests asking for nsfw workers"),
    "trusted_share": (0.05, "requests asking for trusted workers only"),
    "validated_share": (0.1, "text requests asking for validated backends"),
    "fit_limits_share": (0.85, "text requests whose client fit max_length/context to the model's workers"),
    "no_slow_share": (0.12, "requests with slow_workers false"),
    "extra_slow_share": (0.05, "image requests accepting extra-slow workers"),
    "priority_share": (0.3, "users with extra (kudos-based) priority; the rest have 0"),
    "img2img_share": (0.08, "image requests with a source image"),
    "inpainting_share": (0.25, "of those, the share that inpaint or outpaint"),
    "lora_share": (0.15, "image requests with loras"),
    "ti_share": (0.04, "image requests with textual inversions"),
    "controlnet_share": (0.03, "image requests with a controlnet (they carry a source image)"),
    "post_processing_share": (0.12, "image requests with post-processors"),
    "hires_fix_share": (0.08, "image requests with hires fix"),
    "tiling_share": (0.01, "image requests with tiling"),
    "transparent_share": (0.01, "image requests asking for transparency"),
    "extra_source_images_share": (0.01, "image requests with extra source images"),
    "expired_share": (0.005, "requests past their expiry"),
    "inactive_share": (0.005, "requests no longer active"),
    "faulted_share": (0.002, "faulted requests"),
    "zero_n_share": (0.005, "requests whose jobs were all handed out (n = 0)"),
    # -- jobs and exclusions ---------------------------------------------------
    "jobs_in_flight_share": (0.06, "requests with jobs on workers (processing, a few finished/faulted)"),
    "excluded_pair_share": (0.002, "excluded (worker, request) pairs per request"),
}
"""Every shape option of :func:`horde`: (default, meaning).

Names ending in ``_share`` are probabilities in [0, 1]; ``zipf_exponent`` is a
positive number; the pools are model counts, at least 1 and fewer than the
reference list holds (so some listed model is always unserved).
"""

SHAPE_DEFAULTS: dict[str, float | int] = {key: default for key, (default, _) in SHAPE_OPTIONS.items()}
"""The default of every shape option."""


_POOLS = ("text_model_pool", "image_model_pool")


def shape_options(**shape: Any) -> dict[str, float | int]:
    """The complete, checked shape options: :data:`SHAPE_DEFAULTS` updated with ``shape``.

    Parameters
    ----------
    **shape
        Any of the keys of :data:`SHAPE_DEFAULTS`.

    Returns
    -------
    dict
        Every option, given or default.

    Raises
    ------
    TypeError
        For an unknown option or a value of the wrong type.
    ValueError
        For a value out of its range.

    Examples
    --------
    >>> shape_options(chat_share=0.5)["chat_share"]
    0.5
    >>> shape_options(chat_shar=0.5)
    Traceback (most recent call last):
    ...
    TypeError: unknown shape option 'chat_shar'
    """
    unknown = sorted(set(shape) - set(SHAPE_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown shape option {unknown[0]!r}")
    opts = dict(SHAPE_DEFAULTS)
    reference = _reference()
    limits = {"text_model_pool": len(reference.text_names), "image_model_pool": len(reference.image_names)}
    for key, value in shape.items():
        if key in _POOLS:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"shape option {key!r} must be an integer, got {value!r}")
            if not 1 <= value < limits[key]:
                raise ValueError(f"shape option {key!r} must be in [1, {limits[key] - 1}], got {value}")
            opts[key] = int(value)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"shape option {key!r} must be a number, got {value!r}")
        value = float(value)
        if key == "zipf_exponent":
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"shape option 'zipf_exponent' must be a positive number, got {value}")
        elif not 0.0 <= value <= 1.0:
            raise ValueError(f"shape option {key!r} must be in [0, 1], got {value}")
        opts[key] = value
    # Options that split one population must leave room for the rest of it.
    for parts in (
        ("chat_opt_in_share", "chat_only_share"),
        ("any_model_share", "several_models_share", "unserved_model_share"),
    ):
        if sum(opts[p] for p in parts) > 1.0:
            raise ValueError(f"shape options {', '.join(parts)} must sum to at most 1")
    return opts


def horde(
    workers: int = 150,
    requests: int = 3000,
    seed: int = 0,
    *,
    now: float | datetime | str | None = None,
    **shape: Any,
) -> Snapshot:
    """A synthetic horde at one instant, shaped like the public AI Horde.

    Parameters
    ----------
    workers, requests
        Number of worker rows and request rows (text and image together).
    seed
        Seed of the NumPy generator: the same arguments give the same snapshot.
    now
        The snapshot's instant (epoch seconds, aware datetime or ISO 8601 text);
        :data:`DEFAULT_NOW` when omitted.
    **shape
        Shape options; see :data:`SHAPE_DEFAULTS` for the names and defaults.

    Returns
    -------
    Snapshot
        Workers, requests (mostly waiting, a few expired, inactive, faulted
        or with ``n = 0``), jobs in flight and excluded pairs. Every row is
        valid: ``snapshot.rejected == ()``.

    Notes
    -----
    Shape options and their defaults (also in :data:`SHAPE_OPTIONS`):

    <shape options>

    Examples
    --------
    >>> from vecsched.synthetic import horde
    >>> snap = horde(workers=40, requests=200, seed=1, chat_share=0.5)
    >>> len(snap.workers), len(snap.requests), snap.rejected
    (40, 200, ())
    >>> horde(0, 0).requests.n.size
    0
    """
    for name, value in (("workers", workers), ("requests", requests)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    opts = shape_options(**shape)
    t_now = DEFAULT_NOW if now is None else to_epoch(now)
    rng = np.random.default_rng(seed)
    ref = _reference()
    users = _draw_users(rng, int(workers), int(requests), opts)
    w = _draw_workers(rng, int(workers), t_now, opts, ref, users)
    r = _draw_requests(rng, int(requests), t_now, opts, ref, users, w)
    jobs = _draw_jobs(rng, t_now, opts, w, r)
    pairs = _draw_excluded_pairs(rng, opts, w, r)
    return Snapshot.from_columns(t_now, w.columns, r.columns, jobs, pairs)


def _options_table() -> str:
    width = max(len(k) for k in SHAPE_OPTIONS) + 4
    rows = [f"    {'option':<{width}} {'default':<8} meaning", f"    {'=' * width} {'=' * 8} {'=' * 60}"]
    for key, (default, meaning) in SHAPE_OPTIONS.items():
        rows.append(f"    {'``' + key + '``':<{width}} {default!s:<8} {meaning}")
    return "\n".join([rows[1], *rows[:1], rows[1], *rows[2:], rows[1]])


if horde.__doc__:  # absent under python -OO
    horde.__doc__ = horde.__doc__.replace("    <shape options>", _options_table())


# -- reference data ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Reference:
    """Model names of both gentypes in one code space: text codes first, then image."""

    names: np.ndarray  # object array of every model name, text then image
    text_names: np.ndarray
    image_names: np.ndarray
    text_parameters: np.ndarray  # parameter count by text code


@lru_cache(maxsize=1)
def _reference() -> _Reference:
    text, image = model_table("text"), model_table("image")
    text_names = text["name"].to_numpy(dtype=object)
    image_names = image["name"].to_numpy(dtype=object)
    return _Reference(
        names=np.concatenate([text_names, image_names]),
        text_names=text_names,
        image_names=image_names,
        text_parameters=text["parameters"].fillna(0).to_numpy(dtype=float),
    )


# -- small vectorized helpers ---------------------------------------------------------------


def _pick(rng: np.random.Generator, choices: Any, weights: Any, size: int) -> np.ndarray:
    """``size`` draws from ``choices`` with the given relative weights."""
    choices = np.asarray(choices)
    p = np.asarray(weights, dtype=float)
    return choices[rng.choice(len(choices), size=size, p=p / p.sum())]


def _share_of(rng: np.random.Generator, share: float, among: np.ndarray) -> np.ndarray:
    """A random ``share`` of the rows where ``among`` holds."""
    return among & (rng.random(len(among)) < share)


def _zipf(k: int, exponent: float) -> np.ndarray:
    """Probabilities of ranks 1..k with weight rank ** -exponent."""
    w = np.arange(1, k + 1, dtype=float) ** -exponent
    return w / w.sum()


# Two ASCII hex digits per byte value, so a byte matrix turns into text with one lookup.
_HEX_PAIRS = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), dtype=np.uint16)


def _uuids(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random version-4 UUID strings (object array), as the horde uses for ids.

    Built as a byte matrix and decoded once, because formatting a million ids
    one by one in Python would dominate the whole build.
    """
    raw = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    digits = _HEX_PAIRS[raw].view(np.uint8)  # (n, 32) ASCII hex digits
    chars = np.full((n, 36), ord("-"), dtype=np.uint8)
    for (lo, hi), at in zip(((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)), (0, 9, 14, 19, 24)):
        chars[:, at : at + hi - lo] = digits[:, lo:hi]
    flat = chars.view("S36").ravel()
    out = np.empty(n, dtype=object)
    # Decode in slices: a whole million-row unicode intermediate would double the peak memory.
    step = 1 << 17
    for lo in range(0, n, step):
        out[lo : lo + step] = flat[lo : lo + step].astype("U36")
    return out


def _csr(n_rows: int, rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR (offsets, values) from (row, value) pairs; order within a row is kept."""
    order = np.argsort(rows, kind="stable")
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=offsets[1:])
    return offsets, values[order]


def _unique_pairs(rows: np.ndarray, values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, value) pairs without repeats, sorted by row then value."""
    key = np.unique(rows.astype(np.int64) * width + values)
    return key // width, key % width


def _top_k_without_replacement(
    rng: np.random.Generator, probabilities: np.ndarray, k: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each row, ``k[row]`` distinct items drawn by weight (Gumbel top-k).

    Returns (rows, items) in row order, the likeliest-looking item first in
    each row. Sorting one Gumbel-perturbed matrix replaces a per-row
    ``rng.choice(replace=False)`` loop.
    """
    n, m = len(k), len(probabilities)
    if n == 0 or m == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    keys = np.log(probabilities)[None, :] + rng.gumbel(size=(n, m))
    order = np.argsort(-keys, axis=1)
    take = np.arange(m)[None, :] < np.minimum(k, m)[:, None]
    rows = np.broadcast_to(np.arange(n)[:, None], (n, m))[take]
    return rows, order[take]


# -- users --------------------------------------------------------------------------------


@dataclass
class _Users:
    ids: np.ndarray  # horde user ids (integers as text), object array
    trusted: np.ndarray
    priority: np.ndarray  # extra priority of the user's requests


def _draw_users(rng: np.random.Generator, n_workers: int, n_requests: int, opts: dict[str, Any]) -> _Users:
    size = max(1, n_workers + n_requests // 10)
    # Increasing gaps give distinct ids without a per-user check.
    numbers = 1000 + np.cumsum(rng.integers(1, 40, size=size))
    priority = np.zeros(size, dtype=np.int64)
    # Extra priority comes from kudos: most users have none, the rest a long tail.
    rich = rng.random(size) < opts["priority_share"]
    priority[rich] = np.minimum(np.rint(rng.lognormal(math.log(5000), 1.8, size=int(rich.sum()))), 5e7).astype(np.int64)
    return _Users(ids=numbers.astype(str).astype(object), trusted=rng.random(size) < 0.1, priority=priority)


# -- workers ------------------------------------------------------------------------------

# Text bridges by the family of the worker's first model: koboldcpp/ names come from
# KoboldCpp, aphrodite/ names from the aphrodite worker, bare names from the rest.
_KOBOLDCPP_AGENTS = (
    ("KoboldCppEmbedWorker:2:https://github.com/LostRuins/koboldcpp", 0.6),
    ("KoboldCppEmbedWorker:1:https://github.com/LostRuins/koboldcpp", 0.2),
    ("KoboldCpp:1.79:https://github.com/LostRuins/koboldcpp", 0.2),
)
_APHRODITE_AGENTS = (
    ("AI Horde Worker~aphrodite~oai:24:https://github.com/Haidra-Org/AI-Horde-Worker", 0.5),
    ("AI Horde Worker~aphrodite~kai:23:https://github.com/Haidra-Org/AI-Horde-Worker", 0.3),
    ("aphrodite-engine:0.6:https://github.com/PygmalionAI/aphrodite-engine", 0.2),
)
_OTHER_TEXT_AGENTS = (
    ("TabbyAPI:1:https://github.com/theroyallab/tabbyAPI", 0.35),
    ("AI Horde Worker:24:https://github.com/Haidra-Org/AI-Horde-Worker", 0.25),
    ("tabbyAPI-horde-bridge:0.3:unknown", 0.15),
    ("text-generation-webui:1:unknown", 0.15),
    ("unknown:0:unknown", 0.1),
)
_REGEN = "AI Horde Worker reGen"
_REGEN_URL = "https://github.com/Haidra-Org/horde-worker-reGen"
# Most image workers keep up with reGen releases; a few lag behind.
_REGEN_MAJOR_WEIGHTS = (0.02, 0.03, 0.03, 0.04, 0.05, 0.08, 0.15, 0.25, 0.35)
_OTHER_IMAGE_AGENTS = (
    ("AI Horde Worker:23:https://github.com/Haidra-Org/AI-Horde-Worker", 0.6),
    ("unknown:0:unknown", 0.4),
)

_TEXT_MAX_LENGTHS = ((80, 0.03), (120, 0.05), (160, 0.05), (200, 0.1), (240, 0.1), (256, 0.17), (300, 0.1), (400, 0.05), (512, 0.35))
_TEXT_CONTEXTS = (
    (1024, 0.03), (2048, 0.12), (4096, 0.25), (6144, 0.05), (8192, 0.25),
    (12288, 0.05), (16384, 0.15), (24576, 0.03), (32768, 0.07),
)  # fmt: skip
_MAX_PIXELS = ((512 * 512, 0.1), (768 * 768, 0.2), (1024 * 1024, 0.35), (1536 * 1024, 0.15), (1536 * 1536, 0.12), (2048 * 2048, 0.08))
_THREADS = ((1, 0.74), (2, 0.14), (3, 0.04), (4, 0.05), (5, 0.01), (6, 0.01), (8, 0.007), (12, 0.003))


def _split(pairs: tuple[tuple[Any, float], ...]) -> tuple[list[Any], list[float]]:
    return [a for a, _ in pairs], [b for _, b in pairs]


@dataclass
class _Workers:
    columns: dict[str, Any]
    gentype: np.ndarray
    online: np.ndarray
    usable: np.ndarray  # online and not paused: could hold a job
    model_offsets: np.ndarray
    model_codes: np.ndarray  # into _Reference.names
    ids: np.ndarray
    owner: np.ndarray  # index into _Users
    maintenance: np.ndarray
    text_pool: np.ndarray  # codes of the text models in use, most popular first
    image_pool: np.ndarray


def _draw_workers(
    rng: np.random.Generator, n: int, now: float, opts: dict[str, Any], ref: _Reference, users: _Users
) -> _Workers:
    # The draws keep their order, so that a seed gives the same horde as before.
    gentype = np.where(rng.random(n) < opts["text_share"], TEXT, IMAGE).astype(np.int8)
    is_text = gentype == TEXT
    models = _draw_worker_models(rng, is_text, opts, ref)
    speed = _draw_worker_speeds(rng, is_text, models.first_code, opts, ref)
    state = _draw_worker_state(rng, n, now, opts)
    owner = _draw_owners(rng, n, opts, users)
    agent = _draw_bridge_agents(rng, is_text, models.first_code, ref)
    limits = _draw_text_limits(rng, is_text, opts)
    max_pixels = np.where(is_text, 262144, _pick(rng, *_split(_MAX_PIXELS), n)).astype(np.int64)
    ids = _uuids(rng, n)
    columns = {
        "id": ids,
        "user_id": users.ids[owner],
        "gentype": gentype,
        "owner_trusted": users.trusted[owner],
        "last_check_in": state.last_check_in,
        "threads": state.threads,
        "speed": speed,
        "maintenance": state.maintenance,
        "paused": state.paused,
        "nsfw": state.nsfw,
        "models": ListColumn(models.offsets, ref.names[models.codes]),
        "bridge_agent": agent,
        **limits,
        "max_pixels": max_pixels,
        **_draw_image_flags(rng, ~is_text, speed),
    }
    online = state.age <= ONLINE_WINDOW_SECONDS
    return _Workers(
        columns=columns,
        gentype=gentype,
        online=online,
        usable=online & ~state.paused,
        model_offsets=models.offsets,
        model_codes=models.codes,
        ids=ids,
        owner=owner,
        maintenance=state.maintenance,
        text_pool=models.text_pool,
        image_pool=models.image_pool,
    )


@dataclass(frozen=True)
class _WorkerModels:
    text_pool: np.ndarray
    image_pool: np.ndarray
    offsets: np.ndarray
    codes: np.ndarray
    first_code: np.ndarray  # each worker's first model


def _draw_worker_models(rng: np.random.Generator, is_text: np.ndarray, opts: dict[str, Any], ref: _Reference) -> _WorkerModels:
    n, n_text = len(is_text), int(is_text.sum())
    text_rows, image_rows = np.flatnonzero(is_text), np.flatnonzero(~is_text)
    # Model pools: which reference models are in use, most popular first.
    n_text_ref = len(ref.text_names)
    text_pool = rng.permutation(n_text_ref)[: opts["text_model_pool"]]
    image_pool = n_text_ref + rng.permutation(len(ref.image_names))[: opts["image_model_pool"]]
    text_p = _zipf(len(text_pool), opts["zipf_exponent"])
    image_p = _zipf(len(image_pool), opts["zipf_exponent"])

    # Text workers load one model, sometimes two or three; image workers tens.
    k_text = _pick(rng, [1, 2, 3], [0.85, 0.12, 0.03], n_text)
    few = rng.random(n - n_text) < 0.2
    k_image = np.where(
        few,
        rng.integers(1, 5, size=n - n_text),
        np.clip(np.rint(rng.lognormal(math.log(25), 0.6, size=n - n_text)), 5, len(image_pool)),
    ).astype(np.int64)
    tr, tm = _top_k_without_replacement(rng, text_p, k_text)
    ir, im = _top_k_without_replacement(rng, image_p, k_image)
    rows = np.concatenate([text_rows[tr], image_rows[ir]])
    codes = np.concatenate([text_pool[tm], image_pool[im]]).astype(np.int64)
    model_offsets, model_codes = _csr(n, rows, codes)
    # Every worker serves at least one model (k >= 1 and the pools are not empty).
    first_code = model_codes[model_offsets[:-1]] if n else np.zeros(0, dtype=np.int64)
    return _WorkerModels(text_pool, image_pool, model_offsets, model_codes, first_code)


def _draw_worker_speeds(
    rng: np.random.Generator, is_text: np.ndarray, first_code: np.ndarray, opts: dict[str, Any], ref: _Reference
) -> np.ndarray:
    """Lognormal like volunteers' hardware; bigger text models run slower, so a
    worker's median tracks its first model's size."""
    n = len(is_text)
    params = np.where(is_text, ref.text_parameters[np.minimum(first_code, len(ref.text_names) - 1)], 13e9)
    params = np.maximum(params, 1e8)
    text_median = 12.0 * (params / 13e9) ** -0.2
    text_speed = np.clip(rng.lognormal(0.0, 0.7, size=n) * text_median, 0.3, 120.0).round(2)
    image_speed = np.clip(rng.lognormal(math.log(1.1e6), 0.8, size=n), 5e4, 2e7).round(0)
    speed = np.where(is_text, text_speed, image_speed)
    speed[rng.random(n) < opts["unsampled_share"]] = np.nan
    return speed


@dataclass(frozen=True)
class _WorkerState:
    threads: np.ndarray
    age: np.ndarray  # seconds since the last check-in
    last_check_in: np.ndarray
    paused: np.ndarray
    maintenance: np.ndarray
    nsfw: np.ndarray


def _draw_worker_state(rng: np.random.Generator, n: int, now: float, opts: dict[str, Any]) -> _WorkerState:
    threads = _pick(rng, *_split(_THREADS), n).astype(np.int32)
    offline = rng.random(n) < opts["offline_share"]
    # Online workers check in every few seconds; offline ones went away minutes to days ago.
    age = np.where(
        offline,
        ONLINE_WINDOW_SECONDS + 1.0 + rng.exponential(3 * 3600.0, size=n),
        np.minimum(rng.exponential(6.0, size=n), ONLINE_WINDOW_SECONDS - 5.0),
    )
    paused = rng.random(n) < opts["paused_share"]
    maintenance = rng.random(n) < opts["maintenance_share"]
    nsfw = rng.random(n) < 0.75
    return _WorkerState(threads, age, np.round(now - age, 3), paused, maintenance, nsfw)


def _draw_owners(rng: np.random.Generator, n: int, opts: dict[str, Any], users: _Users) -> np.ndarray:
    """A few users run many workers. Owners come from the users who also send
    requests, so maintenance workers meet some of their owners' own requests."""
    n_owners = max(1, min(len(users.ids), int(0.8 * n)))
    owner_rank = rng.choice(n_owners, size=n, p=_zipf(n_owners, 1.2))
    owner = rng.permutation(len(users.ids))[:n_owners][owner_rank]
    users.trusted[owner] = rng.random(n) < opts["trusted_owner_share"]
    return owner


def _draw_bridge_agents(rng: np.random.Generator, is_text: np.ndarray, first_code: np.ndarray, ref: _Reference) -> np.ndarray:
    """Bridges follow the first model's family (its name prefix), judged once per
    reference name rather than once per worker."""
    n = len(is_text)
    prefix = pd.Series(ref.names, dtype=object).str.split("/", n=1).str[0].to_numpy(dtype=object)
    family = prefix[first_code]
    agent = np.empty(n, dtype=object)
    for mask, table in (
        (is_text & (family == "koboldcpp"), _KOBOLDCPP_AGENTS),
        (is_text & (family == "aphrodite"), _APHRODITE_AGENTS),
        (is_text & (family != "koboldcpp") & (family != "aphrodite"), _OTHER_TEXT_AGENTS),
        (~is_text, _OTHER_IMAGE_AGENTS),
    ):
        agent[mask] = _pick(rng, *_split(table), int(mask.sum())).astype(object)
    regen_agents = np.array(
        [f"{_REGEN}:{v}:{_REGEN_URL}" for v in range(1, 10)] + [f"{_REGEN}:{v}.1.0:{_REGEN_URL}" for v in range(1, 10)],
        dtype=object,
    )
    regen = ~is_text & (rng.random(n) < 0.95)
    major = _pick(rng, np.arange(9), _REGEN_MAJOR_WEIGHTS, int(regen.sum()))
    agent[regen] = regen_agents[major + 9 * (rng.random(len(major)) < 0.3)]
    return agent


def _draw_text_limits(rng: np.random.Generator, is_text: np.ndarray, opts: dict[str, Any]) -> dict[str, np.ndarray]:
    """Text limits and chat mode; chat limits default to the text limits."""
    n, text_rows = len(is_text), np.flatnonzero(is_text)
    max_length = np.full(n, 512, dtype=np.int32)
    max_context = np.full(n, 2048, dtype=np.int32)
    max_length[text_rows] = _pick(rng, *_split(_TEXT_MAX_LENGTHS), len(text_rows))
    max_context[text_rows] = _pick(rng, *_split(_TEXT_CONTEXTS), len(text_rows))
    u = rng.random(n)
    opt_in, only = opts["chat_opt_in_share"], opts["chat_only_share"]
    chat_mode = np.full(n, CHAT_NONE, dtype=np.int8)
    chat_mode[is_text & (u < opt_in)] = CHAT_OPT_IN
    chat_mode[is_text & (u >= opt_in) & (u < opt_in + only)] = CHAT_ONLY
    own_chat_limits = (chat_mode != CHAT_NONE) & (rng.random(n) < 0.4)
    return {
        "max_length": max_length,
        "max_context_length": max_context,
        "chat_mode": chat_mode,
        "chat_max_length": np.where(own_chat_limits, _pick(rng, *_split(_TEXT_MAX_LENGTHS), n), max_length).astype(np.int32),
        "chat_max_context_length": np.where(own_chat_limits, _pick(rng, *_split(_TEXT_CONTEXTS), n), max_context).astype(
            np.int32
        ),
    }


def _draw_image_flags(rng: np.random.Generator, img: np.ndarray, speed: np.ndarray) -> dict[str, np.ndarray]:
    """Image workers' allow flags; text workers keep the defaults."""
    n = len(img)

    def flag(share: float, default: bool) -> np.ndarray:
        return np.where(img, rng.random(n) < share, default)

    slow_image = img & (np.nan_to_num(speed, nan=1e6) < 4e5)
    return {
        "allow_img2img": flag(0.85, True),
        "allow_painting": flag(0.8, True),
        "allow_post_processing": flag(0.85, True),
        "allow_controlnet": flag(0.3, False),
        "allow_sdxl_controlnet": flag(0.15, False),
        "allow_lora": flag(0.6, False),
        # Slow image workers are the ones that mark themselves extra slow.
        "extra_slow_worker": (slow_image & (rng.random(n) < 0.5)) | (img & (rng.random(n) < 0.02)),
    }


# -- requests -------------------------------------------------------------------------------

_REQUEST_MAX_LENGTHS = ((80, 0.05), (120, 0.1), (150, 0.12), (200, 0.2), (250, 0.15), (300, 0.13), (350, 0.05), (512, 0.2))
_REQUEST_CONTEXTS = ((1024, 0.1), (2048, 0.3), (4096, 0.3), (8192, 0.2), (16384, 0.1))
_SIZES = (
    ((512, 512), 0.3), ((768, 768), 0.12), ((1024, 1024), 0.25), ((832, 1216), 0.08), ((1216, 832), 0.05),
    ((512, 768), 0.07), ((768, 512), 0.04), ((576, 1024), 0.04), ((1024, 576), 0.03), ((1536, 1536), 0.02),
)  # fmt: skip
_STEPS = ((8, 0.08), (20, 0.2), (25, 0.25), (30, 0.3), (40, 0.1), (50, 0.07))
_TEXT_N = ((1, 0.85), (2, 0.08), (3, 0.03), (4, 0.04))
_IMAGE_N = ((1, 0.6), (2, 0.1), (3, 0.04), (4, 0.15), (5, 0.02), (6, 0.02), (7, 0.01), (8, 0.06))

_ANY, _SINGLE, _SEVERAL, _UNSERVED, _TARGET = range(5)


@dataclass
class _Requests:
    columns: dict[str, Any]
    gentype: np.ndarray
    created: np.ndarray
    first_code: np.ndarray  # first named model, -1 for any model


def _draw_requests(
    rng: np.random.Generator,
    n: int,
    now: float,
    opts: dict[str, Any],
    ref: _Reference,
    users: _Users,
    w: _Workers,
) -> _Requests:
    # The draws keep their order, so that a seed gives the same horde as before.
    gentype = np.where(rng.random(n) < opts["text_request_share"], TEXT, IMAGE).astype(np.int8)
    is_text = gentype == TEXT
    img = ~is_text
    user = _draw_senders(rng, gentype, opts, users, w)
    created = _draw_created(rng, n, now, opts)
    count = np.where(is_text, _pick(rng, *_split(_TEXT_N), n), _pick(rng, *_split(_IMAGE_N), n)).astype(np.int32)
    zero_n = rng.random(n) < opts["zero_n_share"]
    targets = _draw_targets(rng, gentype, opts, w)
    models = _draw_request_models(rng, gentype, opts, ref, w, targets)
    lengths = _draw_request_lengths(rng, is_text, models.first_code, opts, w, len(ref.names))
    source = _draw_sources(rng, img, opts)

    def share(key: str, among: np.ndarray = img) -> np.ndarray:
        return _share_of(rng, opts[key], among)

    columns = {
        "id": _uuids(rng, n),
        "user_id": users.ids[user],
        "gentype": gentype,
        "created": created,
        "expiry": created + REQUEST_LIFETIME,
        "extra_priority": users.priority[user],
        "n": np.where(zero_n, 0, count).astype(np.int32),
        "jobs": count.copy(),  # raised below by the jobs already handed out
        "active": rng.random(n) >= opts["inactive_share"],
        "faulted": rng.random(n) < opts["faulted_share"],
        "models": ListColumn(models.offsets, ref.names[models.codes]),
        "slow_workers": rng.random(n) >= opts["no_slow_share"],
        "trusted_workers": rng.random(n) < opts["trusted_share"],
        "nsfw": rng.random(n) < opts["nsfw_share"],
        "worker_blacklist": targets.blocklist,
        "worker_ids": ListColumn(targets.offsets, targets.values),
        **lengths,
        "validated_backends": share("validated_share", is_text),
        "width": np.where(img, source.size[:, 0], 512).astype(np.int64),
        "height": np.where(img, source.size[:, 1], 512).astype(np.int64),
        "steps": np.where(img, _pick(rng, *_split(_STEPS), n), 30).astype(np.int64),
        "extra_slow_workers": share("extra_slow_share"),
        "source_image": source.source_image,
        "loras": share("lora_share"),
        "tis": share("ti_share"),
        "control_type": source.control,
        "hires_fix": share("hires_fix_share"),
        "tiling": share("tiling_share"),
        "transparent": share("transparent_share"),
        "extra_source_images": share("extra_source_images_share") & source.source_image,
        "source_processing": source.processing,
        "post_processing": np.where(source.post, np.where(rng.random(n) < 0.8, 1, 2), 0).astype(np.int32),
        "r2": ~img | (rng.random(n) < 0.97),
    }
    return _Requests(columns=columns, gentype=gentype, created=created, first_code=models.first_code)


def _draw_senders(
    rng: np.random.Generator, gentype: np.ndarray, opts: dict[str, Any], users: _Users, w: _Workers
) -> np.ndarray:
    """Each request's user: a few users (bots, front ends) send most requests."""
    n, n_users = len(gentype), len(users.ids)
    user = rng.permutation(n_users)[rng.choice(n_users, size=n, p=_zipf(n_users, 1.0))]
    # Owners put workers in maintenance to test them with their own requests,
    # the one case where a worker in maintenance is eligible.
    for g in (TEXT, IMAGE):
        testers = w.owner[w.maintenance & (w.gentype == g)]
        rows = np.flatnonzero((gentype == g) & (rng.random(n) < opts["owner_request_share"]))
        if len(testers):
            user[rows] = testers[rng.integers(0, len(testers), size=len(rows))]
    return user


def _draw_created(rng: np.random.Generator, n: int, now: float, opts: dict[str, Any]) -> np.ndarray:
    """Ages as in a live queue: many fresh requests, the rest spread over the
    20-minute lifetime; a few already past their expiry."""
    age = np.where(
        rng.random(n) < 0.6, rng.exponential(150.0, size=n), rng.uniform(0.0, REQUEST_LIFETIME, size=n)
    )
    age = np.minimum(age, REQUEST_LIFETIME - 1.0)
    expired = rng.random(n) < opts["expired_share"]
    age[expired] = REQUEST_LIFETIME + rng.uniform(0.0, 600.0, size=int(expired.sum()))
    return np.round(now - age, 3)


@dataclass(frozen=True)
class _Targets:
    row: np.ndarray  # (request, worker) pairs, sorted by request
    worker: np.ndarray
    offsets: np.ndarray  # the worker_ids list column
    values: np.ndarray
    has_target: np.ndarray
    blocklist: np.ndarray


def _draw_targets(rng: np.random.Generator, gentype: np.ndarray, opts: dict[str, Any], w: _Workers) -> _Targets:
    """An allow list of one or two workers (mostly online ones), or a block list."""
    n, n_w = len(gentype), len(w.ids)
    targeted = rng.random(n) < opts["targeted_share"]
    blocklist = rng.random(n) < opts["blocklist_share"]
    k = np.where(blocklist, rng.integers(1, 4, size=n), _pick(rng, [1, 2], [0.7, 0.3], n))
    t_rows, t_workers = [], []
    for g in (TEXT, IMAGE):
        cand = np.flatnonzero((w.gentype == g) & w.online)
        if len(cand) == 0:
            cand = np.flatnonzero(w.gentype == g)
        rows_g = np.flatnonzero(targeted & (gentype == g))
        if len(cand) == 0 or len(rows_g) == 0:
            continue
        reps = np.repeat(rows_g, k[rows_g])
        t_rows.append(reps)
        t_workers.append(cand[rng.integers(0, len(cand), size=len(reps))])
    t_row = np.concatenate(t_rows) if t_rows else np.zeros(0, dtype=np.int64)
    t_worker = np.concatenate(t_workers) if t_workers else np.zeros(0, dtype=np.int64)
    t_row, t_worker = _unique_pairs(t_row, t_worker, max(n_w, 1))
    offsets, values = _csr(n, t_row, w.ids[t_worker] if len(t_worker) else np.zeros(0, dtype=object))
    has_target = np.diff(offsets) > 0
    return _Targets(t_row, t_worker, offsets, values, has_target, blocklist & has_target)


@dataclass(frozen=True)
class _RequestModels:
    offsets: np.ndarray
    codes: np.ndarray
    first_code: np.ndarray  # first named model, -1 for any model


def _draw_request_models(
    rng: np.random.Generator, gentype: np.ndarray, opts: dict[str, Any], ref: _Reference, w: _Workers, targets: _Targets
) -> _RequestModels:
    """Mostly one served model (popular ones more), some several, some none, a
    few a model nobody serves; allow-listed requests mostly ask for their
    target's model, as people who pick a worker do."""
    n = len(gentype)
    u = rng.random(n)
    a, s, x = opts["any_model_share"], opts["several_models_share"], opts["unserved_model_share"]
    kind = np.select([u < a, u < a + s, u < a + s + x], [_ANY, _SEVERAL, _UNSERVED], _SINGLE)
    kind[targets.has_target & ~targets.blocklist & (rng.random(n) < 0.8)] = _TARGET
    code = np.full(n, -1, dtype=np.int64)
    m_rows, m_codes = [], []
    for g in (TEXT, IMAGE):
        rows_s, codes_s = _draw_models_of(rng, g, gentype, kind, code, w, ref, opts)
        m_rows.append(rows_s)
        m_codes.append(codes_s)
    # The first target's first model (pairs are sorted by row, so np.unique finds each row's first).
    via_target = np.flatnonzero(kind == _TARGET)
    first_target = np.zeros(n, dtype=np.int64)
    target_rows, first_pair = np.unique(targets.row, return_index=True)
    first_target[target_rows] = targets.worker[first_pair]
    code[via_target] = w.model_codes[w.model_offsets[first_target[via_target]]]
    single = np.flatnonzero(code >= 0)
    rows = np.concatenate([single, *m_rows])
    codes = np.concatenate([code[single], *m_codes]).astype(np.int64)
    model_offsets, model_codes = _csr(n, rows, codes)
    first_code = np.full(n, -1, dtype=np.int64)
    named = np.flatnonzero(np.diff(model_offsets) > 0)
    first_code[named] = model_codes[model_offsets[named]]
    return _RequestModels(model_offsets, model_codes, first_code)


def _draw_models_of(
    rng: np.random.Generator,
    g: int,
    gentype: np.ndarray,
    kind: np.ndarray,
    code: np.ndarray,
    w: _Workers,
    ref: _Reference,
    opts: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray]:
    """Models of the requests of gentype ``g``: sets ``code`` for one-model requests
    and returns the (row, code) pairs of the several-model ones."""
    n_codes, n_text = len(ref.names), len(ref.text_names)
    pool, start, stop = (w.text_pool, 0, n_text) if g == TEXT else (w.image_pool, n_text, n_codes)
    worker_owner = np.repeat(np.arange(len(w.ids)), np.diff(w.model_offsets))
    # Clients offer the models that online workers serve; failing that, any in use.
    of_g = w.gentype[worker_owner] == g
    served = np.unique(w.model_codes[of_g & w.online[worker_owner]])
    if len(served) == 0:
        served = np.unique(w.model_codes[of_g])
    if len(served) == 0:
        served = pool
    rank = np.full(n_codes, np.inf)
    rank[pool] = np.arange(1, len(pool) + 1)
    p = rank[served] ** -opts["zipf_exponent"]
    p /= p.sum()
    unserved = np.setdiff1d(np.arange(start, stop), served)
    is_g = gentype == g
    one = np.flatnonzero(is_g & (kind == _SINGLE))
    code[one] = served[rng.choice(len(served), size=len(one), p=p)]
    lost = np.flatnonzero(is_g & (kind == _UNSERVED))
    code[lost] = unserved[rng.integers(0, len(unserved), size=len(lost))]
    several = np.flatnonzero(is_g & (kind == _SEVERAL))
    reps = np.repeat(several, rng.integers(2, 5, size=len(several)))
    return _unique_pairs(reps, served[rng.choice(len(served), size=len(reps), p=p)], n_codes)


def _draw_request_lengths(
    rng: np.random.Generator,
    is_text: np.ndarray,
    first_code: np.ndarray,
    opts: dict[str, Any],
    w: _Workers,
    n_codes: int,
) -> dict[str, np.ndarray]:
    """Text lengths from a handful of common settings; most clients then cut them
    to the largest limits among the online workers of the chosen model, so
    that a request fails on its lengths only now and then, as in the horde."""
    n = len(is_text)
    is_chat = _share_of(rng, opts["chat_share"], is_text)
    max_length = np.where(is_text, _pick(rng, *_split(_REQUEST_MAX_LENGTHS), n), 80).astype(np.int32)
    max_context = np.where(is_text, _pick(rng, *_split(_REQUEST_CONTEXTS), n), 2048).astype(np.int32)
    fit = is_text & (first_code >= 0) & (rng.random(n) < opts["fit_limits_share"])
    wc = w.columns
    worker_owner = np.repeat(np.arange(len(w.ids)), np.diff(w.model_offsets))
    for chat, modes, length_col, context_col in (
        (False, (CHAT_NONE, CHAT_OPT_IN), "max_length", "max_context_length"),
        (True, (CHAT_OPT_IN, CHAT_ONLY), "chat_max_length", "chat_max_context_length"),
    ):
        takes = w.online & (w.gentype == TEXT) & np.isin(wc["chat_mode"], modes)
        sel = takes[worker_owner]
        longest = np.zeros(n_codes, dtype=np.int64)
        widest = np.zeros(n_codes, dtype=np.int64)
        np.maximum.at(longest, w.model_codes[sel], wc[length_col][worker_owner[sel]])
        np.maximum.at(widest, w.model_codes[sel], wc[context_col][worker_owner[sel]])
        rows = np.flatnonzero(fit & (is_chat == chat))
        cap_len, cap_ctx = longest[first_code[rows]], widest[first_code[rows]]
        served_rows = cap_len > 0  # nobody takes this kind of job for the model: nothing to fit to
        rows, cap_len, cap_ctx = rows[served_rows], cap_len[served_rows], cap_ctx[served_rows]
        max_length[rows] = np.minimum(max_length[rows], cap_len)
        max_context[rows] = np.minimum(max_context[rows], cap_ctx)
    return {"max_length": max_length, "max_context_length": max_context, "is_chat": is_chat}


@dataclass(frozen=True)
class _Sources:
    size: np.ndarray  # (width, height) rows
    control: np.ndarray
    source_image: np.ndarray
    processing: np.ndarray  # source_processing codes
    post: np.ndarray  # uses post-processors


def _draw_sources(rng: np.random.Generator, img: np.ndarray, opts: dict[str, Any]) -> _Sources:
    """Image sizes and source images, at the small shares seen in practice."""
    n = len(img)
    sizes = np.array([wh for wh, _ in _SIZES])
    size = sizes[rng.choice(len(sizes), size=n, p=np.array([q for _, q in _SIZES]) / sum(q for _, q in _SIZES))]
    control = _share_of(rng, opts["controlnet_share"], img)
    source_image = _share_of(rng, opts["img2img_share"], img) | control  # controlnet works from a source image
    painting = source_image & ~control & (rng.random(n) < opts["inpainting_share"])
    processing = np.where(painting, np.where(rng.random(n) < 0.2, 3, 2), np.where(source_image, 1, 0)).astype(np.int8)
    post = _share_of(rng, opts["post_processing_share"], img)
    return _Sources(size, control, source_image, processing, post)


# -- jobs in flight and excluded pairs ---------------------------------------------------------


def _draw_jobs(
    rng: np.random.Generator, now: float, opts: dict[str, Any], w: _Workers, r: _Requests
) -> dict[str, Any]:
    """Jobs on usable workers, mostly ones serving the request's model; updates ``jobs`` counts."""
    n_r, n_w = len(r.gentype), len(w.ids)
    zero_n = r.columns["n"] == 0
    rows = np.flatnonzero((rng.random(n_r) < opts["jobs_in_flight_share"]) | zero_n)
    job_request = np.repeat(rows, _pick(rng, [1, 2, 3, 4], [0.75, 0.12, 0.06, 0.07], len(rows)))
    m = len(job_request)

    # Usable workers by model, so a job can go to a worker that serves its model.
    owner = np.repeat(np.arange(n_w), np.diff(w.model_offsets))
    keep = w.usable[owner]
    by_code = np.argsort(w.model_codes[keep], kind="stable")
    codes_sorted = w.model_codes[keep][by_code]
    workers_sorted = owner[keep][by_code]
    code = r.first_code[job_request]
    lo = np.searchsorted(codes_sorted, code, side="left")
    hi = np.searchsorted(codes_sorted, code, side="right")
    u = rng.random(m)
    worker = np.full(m, -1, dtype=np.int64)
    served = (code >= 0) & (hi > lo)
    worker[served] = workers_sorted[lo[served] + (u[served] * (hi - lo)[served]).astype(np.int64)]
    for g in (TEXT, IMAGE):
        cand = np.flatnonzero(w.usable & (w.gentype == g))
        rest = np.flatnonzero(~served & (r.gentype[job_request] == g))
        if len(cand):
            worker[rest] = cand[(u[rest] * len(cand)).astype(np.int64)]
    ok = worker >= 0
    job_request, worker = job_request[ok], worker[ok]
    m = len(job_request)

    state = _pick(rng, [JOB_PROCESSING, JOB_FINISHED, JOB_FAULTED], [0.85, 0.1, 0.05], m).astype(np.int8)
    created = r.created[job_request]
    started = np.maximum(created, np.round(now - rng.exponential(45.0, size=m), 3))
    # jobs = n still to hand out + jobs handed out and not faulted (a faulted job goes back to n).
    handed = np.bincount(job_request[state != JOB_FAULTED], minlength=n_r).astype(np.int32)
    has_jobs = np.bincount(job_request, minlength=n_r) > 0
    cols = r.columns
    cols["jobs"] = np.where(has_jobs, cols["n"] + handed, cols["jobs"]).astype(np.int32)
    return {
        "id": _uuids(rng, m),
        "request_id": cols["id"][job_request],
        "worker_id": w.ids[worker],
        "started": started,
        "state": state,
    }


def _draw_excluded_pairs(rng: np.random.Generator, opts: dict[str, Any], w: _Workers, r: _Requests) -> dict[str, Any]:
    """A sparse set of (worker, request) pairs of the same gentype."""
    n_r = len(r.gentype)
    rows = np.flatnonzero(rng.random(n_r) < opts["excluded_pair_share"])
    p_rows, p_workers = [], []
    for g in (TEXT, IMAGE):
        cand = np.flatnonzero(w.gentype == g)
        rows_g = rows[r.gentype[rows] == g]
        if len(cand) and len(rows_g):
            p_rows.append(rows_g)
            p_workers.append(cand[rng.integers(0, len(cand), size=len(rows_g))])
    if not p_rows:
        return {"worker_id": np.zeros(0, dtype=object), "request_id": np.zeros(0, dtype=object)}
    req, wk = np.concatenate(p_rows), np.concatenate(p_workers)
    return {"worker_id": w.ids[wk], "request_id": r.columns["id"][req]}
