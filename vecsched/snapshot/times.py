"""Instants as the snapshot format writes them (ISO 8601 with a zone) and as the code
holds them (float epoch seconds)."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd


def parse_times(raw: list[Any]) -> np.ndarray:
    """Epoch seconds for ISO 8601 strings with a zone; NaN for anything else."""
    out = np.full(len(raw), np.nan)
    strings = [(k, v) for k, v in enumerate(raw) if isinstance(v, str)]
    if not strings:
        return out
    idx = np.fromiter((k for k, _ in strings), dtype=np.int64, count=len(strings))
    series = pd.Series([v for _, v in strings], dtype=object)
    zoned = series.str.contains(r"(?:Z|z|[+-]\d\d:?\d\d)$", regex=True).to_numpy(dtype=bool)
    parsed = pd.to_datetime(series, utc=True, errors="coerce", format="ISO8601")
    ok = zoned & parsed.notna().to_numpy()
    # Microseconds, not nanoseconds: year 2999 must not wrap around int64.
    micros = parsed.dt.tz_localize(None).to_numpy().astype("datetime64[us]").astype(np.int64)
    seconds = micros / 1e6
    out[idx[ok]] = seconds[ok]
    return out


def to_epoch(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.timestamp()
    if isinstance(value, str):
        t = parse_times([value])[0]
        if math.isnan(t):
            raise ValueError(value)
        return float(t)
    raise TypeError(type(value).__name__)


def iso(seconds: float) -> str:
    dt = datetime.fromtimestamp(seconds, tz=timezone.utc)
    text = dt.isoformat(timespec="microseconds" if seconds % 1 else "seconds")
    return text.replace("+00:00", "Z")
