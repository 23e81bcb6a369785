"""Facts about the public AI Horde that the estimator follows (SPEC.md sections 1 and 3)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from vecsched.snapshot.schema import SOURCE_PROCESSING

ONLINE_WINDOW_SECONDS = 300.0
ASSUMED_TEXT_SPEED = 10.0  # tokens/s per thread for a worker with no samples
ASSUMED_IMAGE_SPEED = 1_000_000.0  # pixel-steps/s per thread
IMAGE_SLOW_SPEED = 500_000.0  # below this an image worker needs slow_workers

# Text speed floor by the first advertised model's parameter count.
TEXT_FLOOR_BY_SIZE = ((20e9, 3.0), (13e9, 4.0))
TEXT_FLOOR_DEFAULT = 5.0

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
# Capability bits, cumulative by reGen version.
CAPABILITIES = (
    "img2img",
    "inpainting",
    "post_processing",
    "r2",
    "controlnet",
    "hires_fix",
    "tiling",
    "clip_skip",
    "lora",
    "textual_inversion",
    "extra_source_images",
    "layer_diffuse",
    "flux",
)
CAP = {name: np.uint16(1 << k) for k, name in enumerate(CAPABILITIES)}
_CAPS_SINCE_VERSION = (
    (1, ("img2img", "inpainting", "post_processing", "r2", "controlnet", "hires_fix", "tiling", "clip_skip")),
    (2, ("lora", "textual_inversion")),
    (5, ("extra_source_images",)),
    (8, ("layer_diffuse",)),
    (9, ("flux",)),
)




@dataclass(frozen=True)
class ImageOption:
    """An image request option (SPEC section 3, image gate 9) and what a worker needs to serve it.

    Attributes
    ----------
    name : str
        The option, as :func:`image_options_used` names it.
    allow : str or None
        The worker's allow flag (a worker column), None where there is none.
    capability : str
        The bridge capability (see :data:`CAPABILITIES`).
    needs_inpainting_model : bool
        The worker must also serve a model that can inpaint.
    """

    name: str
    allow: str | None
    capability: str
    needs_inpainting_model: bool = False


# The one table of image options: the vectorized arrays (vecsched.core.arrays) and
# the simulator (vecsched.simulate.engine) both read it.
IMAGE_OPTIONS = (
    ImageOption("img2img", "allow_img2img", "img2img"),
    ImageOption("painting", "allow_painting", "inpainting", needs_inpainting_model=True),
    ImageOption("post_processing", "allow_post_processing", "post_processing"),
    ImageOption("controlnet", "allow_controlnet", "controlnet"),
    ImageOption("lora", "allow_lora", "lora"),
    ImageOption("textual_inversion", None, "textual_inversion"),
    ImageOption("hires_fix", None, "hires_fix"),
    ImageOption("tiling", None, "tiling"),
    ImageOption("transparent", "allow_sdxl_controlnet", "layer_diffuse"),
    ImageOption("extra_source_images", None, "extra_source_images"),
    ImageOption("r2", None, "r2"),
)
# One bit per option, in table order.
OPTION_BIT = {option.name: np.uint16(1 << k) for k, option in enumerate(IMAGE_OPTIONS)}
_INPAINTING, _OUTPAINTING = (SOURCE_PROCESSING.index(p) for p in ("inpainting", "outpainting"))


def image_options_used(request: Any) -> dict[str, Any]:
    """Which options an image request uses, by option name.

    ``request`` has the request columns as attributes: a table of columns
    (each answer is then a boolean array) or one request (each a bool).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> r = SimpleNamespace(source_image=False, source_processing=2, post_processing=0, control_type=False,
    ...                     loras=True, tis=False, hires_fix=False, tiling=False, transparent=False,
    ...                     extra_source_images=False, r2=True)
    >>> sorted(name for name, used in image_options_used(r).items() if used)
    ['lora', 'painting', 'r2']
    """
    processing = request.source_processing
    return {
        # A source image makes img2img; source_processing alone does not (SPEC 3, image 9).
        "img2img": request.source_image,
        "painting": (processing == _INPAINTING) | (processing == _OUTPAINTING),
        "post_processing": request.post_processing > 0,
        "controlnet": request.control_type,
        "lora": request.loras,
        "textual_inversion": request.tis,
        "hires_fix": request.hires_fix,
        "tiling": request.tiling,
        "transparent": request.transparent,
        "extra_source_images": request.extra_source_images,
        "r2": request.r2,
    }


def image_option_bits(used: dict[str, Any]) -> Any:
    """The options marked in ``used`` (from :func:`image_options_used`) as :data:`OPTION_BIT` bits."""
    bits = np.uint16(0)
    for name, bit in OPTION_BIT.items():
        bits = bits | np.where(used[name], bit, np.uint16(0)).astype(np.uint16)
    return bits


def options_served(worker: Any, capabilities: Any, serves_inpainting_model: Any) -> Any:
    """The options a worker can serve, as :data:`OPTION_BIT` bits: allow flag, capability, model.

    ``worker`` has the worker columns as attributes (arrays, or one worker's
    values); ``capabilities`` are its bridge's :data:`CAP` bits.
    """
    bits = np.uint16(0)
    for option in IMAGE_OPTIONS:
        ok = (capabilities & CAP[option.capability]) != 0
        if option.allow is not None:
            ok = ok & getattr(worker, option.allow)
        if option.needs_inpainting_model:
            ok = ok & serves_inpainting_model
        bits = bits | np.where(ok, OPTION_BIT[option.name], np.uint16(0)).astype(np.uint16)
    return bits


def bridge_capabilities(name: str, version: int) -> int:
    """The capability bits of an image bridge; an unknown bridge has none."""
    if name != IMAGE_BRIDGE:
        return 0
    bits = 0
    for since, caps in _CAPS_SINCE_VERSION:
        if version >= since:
            for cap in caps:
                bits |= int(CAP[cap])
    return bits


def parse_bridge_agents(agents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split ``name:version:url`` into (name, major version number; 0 if it has none).

    Bridges report versions such as ``9``, ``9.1.0`` or ``5-beta``;
    capabilities are granted by the leading whole number.
    """
    if len(agents) == 0:
        return np.zeros(0, dtype=object), np.zeros(0, dtype=np.int64)
    # A horde runs a few dozen bridge builds: parse each distinct string once (20,000
    # workers: 0.7 s of string splitting per cycle otherwise).
    codes, distinct = pd.factorize(pd.Series(agents, dtype=object), use_na_sentinel=False)
    names, versions = _parse_distinct_agents(np.asarray(distinct, dtype=object))
    return names[codes], versions[codes]


_LEADING_NUMBER = re.compile(r"\d+")
# Capabilities stop growing at version 9; any larger number may be held as this.
_VERSION_CAP = 2**31 - 1


def _parse_distinct_agents(agents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # A plain loop over the distinct strings: pandas' string methods cost about 7 ms of
    # fixed overhead, for a few dozen strings. The number is read as the scalar reference
    # reads it (any digits, however many, leading zeros included).
    names = np.empty(len(agents), dtype=object)
    versions = np.zeros(len(agents), dtype=np.int64)
    for k, agent in enumerate(agents):
        parts = agent.split(":", 2) if isinstance(agent, str) else [""]
        names[k] = parts[0]
        number = _LEADING_NUMBER.match(parts[1]) if len(parts) > 1 else None
        versions[k] = min(int(number.group()), _VERSION_CAP) if number else 0
    return names, versions


@lru_cache(maxsize=2)
def model_table(gentype: str) -> pd.DataFrame:
    """The packaged reference list of ``"text"`` or ``"image"`` models; read once, here only.

    Text rows have ``name`` and ``parameters`` (NaN: unknown); image rows
    ``name`` and ``inpainting``. Treat the frame as read-only: it is shared.

    Examples
    --------
    >>> {"name", "inpainting"} <= set(model_table("image").columns)
    True
    """
    if gentype not in ("text", "image"):
        raise ValueError(f"gentype must be 'text' or 'image', not {gentype!r}")
    with resources.files("vecsched.data").joinpath(f"{gentype}_models.csv").open("r", encoding="utf-8") as fh:
        return pd.read_csv(fh)


@lru_cache(maxsize=1)
def text_model_parameters() -> dict[str, float]:
    """Parameter count by text model name (0: unknown), from the packaged reference list."""
    frame = model_table("text")
    return dict(zip(frame["name"], frame["parameters"].astype(float)))


@lru_cache(maxsize=1)
def inpainting_models() -> frozenset[str]:
    """Image models that can inpaint, from the packaged reference list."""
    frame = model_table("image")
    return frozenset(frame.loc[frame["inpainting"].astype(str) == "True", "name"])


def text_speed_floor(first_model_parameters: np.ndarray) -> np.ndarray:
    """Tokens/s floor for each worker, from its first model's parameter count (0: unknown)."""
    floor = np.full(len(first_model_parameters), TEXT_FLOOR_DEFAULT)
    for size, value in reversed(TEXT_FLOOR_BY_SIZE):
        floor[first_model_parameters >= size] = value
    return floor
