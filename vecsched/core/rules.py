"""Facts about the public AI Horde that the estimator follows (SPEC.md sections 1 and 3)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np
import pandas as pd

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
    parts = pd.Series(agents, dtype=object).str.split(":", n=2, expand=True)
    if parts.shape[1] < 2:
        parts[1] = None
    names = parts[0].fillna("").to_numpy(dtype=object)
    major = parts[1].astype(object).str.extract(r"^(\d{1,9})", expand=False)
    versions = pd.to_numeric(major, errors="coerce").fillna(0).astype(np.int64).to_numpy()
    return names, versions


@lru_cache(maxsize=1)
def text_model_parameters() -> dict[str, float]:
    """Parameter count by text model name (0: unknown), from the packaged reference list."""
    with resources.files("vecsched.data").joinpath("text_models.csv").open("r", encoding="utf-8") as fh:
        frame = pd.read_csv(fh)
    return dict(zip(frame["name"], frame["parameters"].astype(float)))


@lru_cache(maxsize=1)
def inpainting_models() -> frozenset[str]:
    """Image models that can inpaint, from the packaged reference list."""
    with resources.files("vecsched.data").joinpath("image_models.csv").open("r", encoding="utf-8") as fh:
        frame = pd.read_csv(fh)
    return frozenset(frame.loc[frame["inpainting"].astype(str) == "True", "name"])


def text_speed_floor(first_model_parameters: np.ndarray) -> np.ndarray:
    """Tokens/s floor for each worker, from its first model's parameter count (0: unknown)."""
    floor = np.full(len(first_model_parameters), TEXT_FLOOR_DEFAULT)
    for size, value in reversed(TEXT_FLOOR_BY_SIZE):
        floor[first_model_parameters >= size] = value
    return floor
