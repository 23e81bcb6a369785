"""Calibrated p90s: split-conformal bounds learned from an estimator's recent pairs.

The service reads the validated pairs of an estimator (forecast p50 and the
observed duration, per gentype and phase) and hands them to the estimator as
``calibration``; the core does no I/O. For a forecast of a given gentype and
phase, the p90 comes from the conformal ``level`` quantile ``q`` of the log
nonconformity score (:func:`log_score`)::

    score = log((observed + offset) / (p50 + offset))
    p90   = (p50 + offset) * exp(max(q, 0)) - offset        (so p90 >= p50)

over the pairs of the same gentype, phase and p50 band (:data:`P50_BANDS`).
The replay's errors grow with its p50 (multiplicative), so one additive
margin per band over-covers its short and under-covers its long forecasts;
the offset keeps the score finite at a zero p50 and gives short forecasts an
absolute margin of the order of a minute. A band with fewer than
``min_pairs`` pairs backs off to the gentype and phase, then to SPEC section
8's provisional margin. Eligible-thread bands, the former second cell key,
were left out: the stored pairs carry no thread count, and fed one offline
they gained nothing and cost up to 3 points of coverage (finer cells, fewer
pairs each; docs/replay.md).

``calibration`` format (every key optional)::

    {"pairs": {"gentype": [...], "phase": [...], "p50": [...], "observed": [...]},
     "no_capacity": {"gentype": [...], "phase": [...], "observed": [...]},
     "min_pairs": 200, "level": 0.93, "offset": 60.0}

``gentype`` as codes or ``"text"``/``"image"``, ``phase`` ``"start"`` or
``"completion"``, seconds as numbers (other pair columns are ignored).
``min_pairs`` (:data:`MIN_PAIRS`): pairs a cell needs to be used;
``level`` (:data:`LEVEL`): the conformal level, chosen on the simulator's
seeds 0/11/23 and 5/17/29 (``python -m vecsched.simulate.replay_scoring``)
and checked, not tuned, on 41/53/67 (docs/replay.md); ``offset``
(:data:`OFFSET_SECONDS`): seconds added to both sides of the score.
:func:`from_pairs` builds it from the service's validated pairs, and adds
``cancel_hazard`` (per gentype code, :func:`cancel_hazards`), which
dispatch-replay-v1 uses in place of its setting.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from vecsched.core.forecasts import provisional_p90
from vecsched.snapshot.schema import IMAGE, TEXT

P50_BANDS = np.array([60.0, 300.0, 900.0])  # upper edges; the last band is open
MIN_PAIRS = 200
"""Pairs a cell needs before its quantile is used (else it backs off to the gentype and phase)."""
LEVEL = 0.93
"""Conformal level of the log score: the one whose pooled coverage strays least from 90% on the tuning seeds."""
OFFSET_SECONDS = 60.0
"""Seconds added to observed and p50 in :func:`log_score` (finite at 0 s; about a minute's margin for short p50s)."""


def _codes(values: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64)
    return np.where(arr == "text", TEXT, np.where(arr == "image", IMAGE, -1)).astype(np.int64)


def _p50_band(p50: np.ndarray) -> np.ndarray:
    """The :data:`P50_BANDS` band of each p50 (NaN in the first; NaN p50s are left out by the callers)."""
    return np.searchsorted(P50_BANDS, np.nan_to_num(p50, nan=0.0), side="right")


def conformal_quantile(scores: np.ndarray, level: float = LEVEL) -> float:
    """The split-conformal ``level`` quantile: the ceil((n + 1) * level)-th smallest score (inf if n too small).

    Examples
    --------
    >>> conformal_quantile(np.arange(1.0, 9.0), 0.9)
    inf
    >>> conformal_quantile(np.arange(1.0, 20.0), 0.9)
    18.0
    """
    k = math.ceil((len(scores) + 1) * level)
    if k > len(scores):
        return math.inf
    return float(np.partition(scores, k - 1)[k - 1])


def log_score(observed: np.ndarray, p50: np.ndarray, offset: float = OFFSET_SECONDS) -> np.ndarray:
    """The nonconformity score ``log((observed + offset) / (p50 + offset))`` (NaN where either is NaN).

    Examples
    --------
    >>> log_score(np.array([60.0, 0.0]), np.array([0.0, 0.0])).round(4).tolist()
    [0.6931, 0.0]
    """
    return np.log((np.asarray(observed, dtype=np.float64) + offset) / (np.asarray(p50, dtype=np.float64) + offset))


def bound(p50: np.ndarray, q: float, offset: float = OFFSET_SECONDS) -> np.ndarray:
    """The p90 of a score quantile ``q``: the inverse of :func:`log_score`, ``q`` clipped at 0 so p90 >= p50.

    ``(p50 + offset) * exp(q) - offset``, written as ``p50`` plus a
    non-negative margin so that rounding never puts the p90 below the p50.

    Examples
    --------
    >>> bound(np.array([0.0, 140.0]), math.log(2.0)).tolist(), bound(np.array([100.0]), -1.0).tolist()
    ([60.0, 340.0], [100.0])
    """
    return p50 + (p50 + offset) * math.expm1(max(q, 0.0))


def calibrated_p90(
    p50: np.ndarray, *, phase: str, gentype: np.ndarray, calibration: Mapping[str, Any] | None,
) -> np.ndarray:
    """p90 seconds for each ``p50``: calibrated where enough pairs exist, else the provisional margin.

    Examples
    --------
    Errors of 0-50% of ``p50 + 60 s``: the p90 of a p50 is about 93% of
    the way up, ``p50 + 0.46 * (p50 + 60)``, in each p50 band (an additive
    score would give one margin per band). Image has no pairs, and a NaN
    p50 no cell: both keep the provisional p90.

    >>> rng = np.random.default_rng(0)
    >>> p50 = np.repeat([100.0, 700.0], 500)
    >>> pairs = {"gentype": ["text"] * 1000, "phase": ["start"] * 1000, "p50": p50,
    ...          "observed": p50 + (p50 + 60.0) * rng.uniform(0, 0.5, 1000)}
    >>> p90 = calibrated_p90(np.array([100.0, 700.0, 100.0, np.nan]), phase="start",
    ...                      gentype=np.array([TEXT, TEXT, IMAGE, TEXT]), calibration={"pairs": pairs})
    >>> ((p90[:2] - [100.0, 700.0]) / [160.0, 760.0]).round(2).tolist(), p90[2:].tolist()
    ([0.47, 0.46], [160.0, nan])
    """
    out = provisional_p90(p50)
    pairs = (calibration or {}).get("pairs")
    if not pairs or len(pairs.get("p50", ())) == 0:
        return out
    settings = (int((calibration or {}).get("min_pairs", MIN_PAIRS)), float((calibration or {}).get("level", LEVEL)),
                float((calibration or {}).get("offset", OFFSET_SECONDS)))
    c_p50 = np.asarray(pairs["p50"], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # observed < -offset: never a duration
        score = log_score(pairs["observed"], c_p50, settings[2])
    ok = ~np.isnan(score) & (np.asarray(pairs["phase"]) == phase)
    c_gentype, c_band, band = _codes(pairs["gentype"]), _p50_band(c_p50), _p50_band(p50)
    known = ~np.isnan(p50)
    for g in np.unique(gentype[known]):
        rows, mine = known & (gentype == g), ok & (c_gentype == g)
        # Coarse to fine: a p50 band with enough pairs overrides the gentype's pooled bound.
        _apply(out, p50, rows, score[mine], settings)
        for b in np.unique(band[rows]):
            _apply(out, p50, rows & (band == b), score[mine & (c_band == b)], settings)
    return out


def _apply(out: np.ndarray, p50: np.ndarray, at: np.ndarray, scores: np.ndarray,
           settings: tuple[int, float, float]) -> None:
    """Set ``out[at]`` from one cell's ``scores`` if it holds at least ``min_pairs``.

    ``settings``: (min_pairs, level, offset).
    """
    min_pairs, level, offset = settings
    if len(scores) >= min_pairs:
        out[at] = bound(p50[at], conformal_quantile(scores, level), offset)


NO_CAPACITY_SOURCE = "compatible-queue-v1"
"""The estimator whose null p50s mark the requests no capacity could serve when first seen (SPEC section 8:
null exactly when no thread is eligible or none of the gentype is measured). It is recorded beside every
other and never filled in, so its pairs stay a source the fill below cannot feed back on."""
MIN_NO_CAPACITY = 50
"""Starts (or completions) of such requests a gentype needs before their quantiles are used."""


def no_capacity_forecast(
    p50: np.ndarray, p90: np.ndarray, *, phase: str, gentype: np.ndarray, calibration: Mapping[str, Any] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(p50, p90)`` with the null p50s filled from the recent outcomes of requests with no capacity when seen.

    A request no worker can serve now has no replay to run, but the horde's recent such requests tell how
    long those that did start waited (a worker joined, or changed its models): their median and 90th
    percentile (the ``no_capacity`` part of ``calibration``, per gentype and phase, at least
    :data:`MIN_NO_CAPACITY` of them). Like every start forecast, it is a wait given a start; whether the
    request starts at all is the stall signal's (predicted for these).

    Examples
    --------
    >>> calibration = {"no_capacity": {"gentype": ["text"] * 100, "phase": ["start"] * 100,
    ...                                "observed": np.arange(100.0) * 10}}
    >>> p50, p90 = no_capacity_forecast(np.array([np.nan, 30.0, np.nan]), np.array([np.nan, 90.0, np.nan]),
    ...                                 phase="start", gentype=np.array([TEXT, TEXT, IMAGE]), calibration=calibration)
    >>> p50.tolist(), p90.round(3).tolist()
    ([495.0, 30.0, nan], [891.0, 90.0, nan])
    """
    seen = (calibration or {}).get("no_capacity")
    p50, p90 = np.array(p50, dtype=np.float64), np.array(p90, dtype=np.float64)
    missing = np.isnan(p50)
    if not seen or not missing.any():
        return p50, p90
    observed = np.asarray(seen["observed"], dtype=np.float64)
    mine = np.asarray(seen["phase"]) == phase
    codes = _codes(seen["gentype"])
    for g in np.unique(gentype[missing]):
        got = observed[mine & (codes == g) & ~np.isnan(observed)]
        if len(got) >= MIN_NO_CAPACITY:
            rows = missing & (gentype == g)
            p50[rows], p90[rows] = np.quantile(got, 0.5), np.quantile(got, 0.9)
    return p50, p90


MIN_CANCELLED = 20
"""Cancellations a gentype needs in the window before its hazard is learned (else 0: none modelled)."""


def cancel_hazards(pairs: Any, *, min_cancelled: int = MIN_CANCELLED) -> list[float]:
    """Per gentype code, cancellations per second of waiting unstarted, from an estimator's pairs.

    Each forecast request waits unstarted from its forecast (``forecast``
    pair) to its first start, expiry or cancellation (``start``, ``stall``,
    ``cancelled`` pairs), or to the last pair of the window if none came yet.
    A request that completes with no start or stall pair had a job when first
    seen (it pairs neither): it never waited unstarted, and adds no exposure.
    The hazard is the cancellations before any start over that exposure.

    Examples
    --------
    >>> from types import SimpleNamespace as P
    >>> pairs = [P(request_id=r, gentype="text", phase="forecast", at=0.0) for r in "abc"]
    >>> pairs += [P(request_id="a", gentype="text", phase="start", at=100.0),
    ...           P(request_id="b", gentype="text", phase="cancelled", at=50.0),
    ...           P(request_id="z", gentype="text", phase="start", at=150.0)]
    >>> cancel_hazards(pairs, min_cancelled=1)   # 1 cancellation over 100 + 50 + 150 s
    [0.0033333333333333335, 0.0]

    A request assigned before it was seen (done at 30 s) beside one cancelled after 50 s, the
    window's last pair a day on: the first counted a day of waiting, and the hazard fell 1,700-fold.

    >>> done = [P(request_id="b", gentype="text", phase="forecast", at=0.0),
    ...         P(request_id="b", gentype="text", phase="cancelled", at=50.0),
    ...         P(request_id="d", gentype="text", phase="forecast", at=0.0),
    ...         P(request_id="d", gentype="text", phase="completion", at=30.0),
    ...         P(request_id="y", gentype="text", phase="forecast", at=86_400.0)]
    >>> cancel_hazards(done, min_cancelled=1)
    [0.02, 0.0]
    """
    import pandas as pd

    frame = pd.DataFrame([(p.request_id, p.gentype, p.phase, p.at) for p in pairs],
                         columns=["request_id", "gentype", "phase", "at"])
    out = [0.0, 0.0]
    if frame.empty:
        return out
    end = frame["at"].max()
    first = frame.pivot_table(index="request_id", columns="phase", values="at", aggfunc="min")
    if "forecast" not in first:
        return out
    gentype = frame.drop_duplicates("request_id").set_index("request_id")["gentype"].reindex(first.index)
    at0 = first["forecast"]
    ends = [first[c] for c in ("start", "stall", "cancelled") if c in first]
    stop = pd.concat(ends, axis=1).min(axis=1).fillna(end) if ends else pd.Series(end, index=first.index)
    cancel = first["cancelled"] if "cancelled" in first else pd.Series(np.nan, index=first.index)
    start = first["start"] if "start" in first else pd.Series(np.nan, index=first.index)
    cancelled_first = cancel.notna() & ~(start <= cancel)
    exposure = (stop - at0).clip(lower=0.0)
    stall = first["stall"] if "stall" in first else pd.Series(np.nan, index=first.index)
    if "completion" in first:
        exposure[first["completion"].notna() & start.isna() & stall.isna() & cancel.isna()] = 0.0
    for code, name in ((TEXT, "text"), (IMAGE, "image")):
        mine = at0.notna() & (gentype == name)
        count, seconds = int(cancelled_first[mine].sum()), float(exposure[mine].sum())
        if count >= min_cancelled and seconds > 0:
            out[code] = count / seconds
    return out


def from_pairs(pairs: Any, **options: Any) -> dict[str, Any]:
    """The ``calibration`` mapping from validated pairs (objects with gentype, phase, p50, observed).

    Stall pairs and pairs without a p50 are left out. ``no_capacity``: pairs of any estimator, of which
    :data:`NO_CAPACITY_SOURCE`'s null-p50 ones give :func:`no_capacity_forecast` its outcomes.

    Examples
    --------
    >>> from types import SimpleNamespace as P
    >>> c = from_pairs([P(gentype="text", phase="start", p50=10.0, observed=12.0),
    ...                 P(gentype="text", phase="stall", p50=None, observed=1.0)], min_pairs=1)
    >>> c["pairs"]["observed"].tolist(), c["min_pairs"]
    ([12.0], 1)
    """
    pairs = list(pairs)
    kept = [p for p in pairs if p.phase in ("start", "completion") and p.p50 is not None]
    # A late forecast's pair is on the first sighting's clock; its estimator's p50 (which the
    # calibration widens) is on the making's: learn there, or lateness would narrow every p90.
    late = np.array([getattr(p, "late", 0.0) for p in kept], dtype=np.float64)
    columns = {
        "gentype": np.array([p.gentype for p in kept], dtype=object),
        "phase": np.array([p.phase for p in kept], dtype=object),
        "p50": np.array([p.p50 for p in kept], dtype=np.float64) - late,
        "observed": np.array([p.observed for p in kept], dtype=np.float64) - late,
    }
    hazard = options.pop("cancel_hazard", None)
    if hazard is None and all(hasattr(p, "request_id") and hasattr(p, "at") for p in pairs):
        hazard = cancel_hazards(pairs)
    # The outcomes of requests no capacity could serve when seen (NO_CAPACITY_SOURCE's null p50s).
    unserved = [p for p in options.pop("no_capacity", ())
                if p.estimator == NO_CAPACITY_SOURCE and p.phase in ("start", "completion") and p.p50 is None]
    out: dict[str, Any] = {"pairs": columns, **options}
    if unserved:
        out["no_capacity"] = {"gentype": np.array([p.gentype for p in unserved], dtype=object),
                              "phase": np.array([p.phase for p in unserved], dtype=object),
                              "observed": np.array([p.observed for p in unserved], dtype=np.float64)}
    if hazard is not None:
        out["cancel_hazard"] = list(hazard)
    return out
