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
    seconds = iso_seconds(series)
    ok = zoned & ~np.isnan(seconds)
    out[idx[ok]] = seconds[ok]
    return out


def iso_seconds(series: pd.Series) -> np.ndarray:
    """Epoch seconds of the ISO 8601 date-times in a ``series`` of strings (naive ones as UTC); NaN for anything else.

    Only text that starts as a date does (pandas reads ``"now"`` and ``"today"`` as the
    wall clock). Fractions are cut to microseconds and the result read at microsecond
    resolution: one value with nanoseconds must not put the whole column at nanosecond
    resolution, where year 2999 overflows and, in one row, rejects or fails another.

    Examples
    --------
    >>> iso_seconds(pd.Series(["2999-01-01T00:00:00Z", "1970-01-01T00:00:01.123456789Z", "now"])).tolist()
    [32472144000.0, 1.123456, nan]
    """
    dated = series.str.match(r"\d{4}-\d\d-\d\d").to_numpy(dtype=bool)
    cut = series.str.replace(r"(\.\d{6})\d+", r"\1", regex=True).where(dated, "")
    parsed = pd.to_datetime(cut, utc=True, errors="coerce", format="ISO8601").dt.tz_localize(None)
    micros = parsed.to_numpy().astype("datetime64[us]")
    seconds = micros.astype(np.int64) / 1e6
    seconds[np.isnat(micros) | ~dated] = np.nan
    return seconds


EARLIEST = -62_135_596_800.0
"""0001-01-01T00:00:00Z in epoch seconds: the first instant a datetime (and so ISO 8601 text) holds."""
END = 253_402_300_800.0
"""10000-01-01T00:00:00Z: times are before it (past it a time cannot be written back as ISO 8601)."""
LATEST = END - 1.0
"""9999-12-31T23:59:59Z: the last whole second (a "never expires" horde stores it)."""


def to_epoch(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)  # OverflowError for an int beyond float: a clear "must be a time"
        if not EARLIEST <= seconds < END:  # NaN fails this too
            raise ValueError(f"time out of range: {value!r}")
        return seconds
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
