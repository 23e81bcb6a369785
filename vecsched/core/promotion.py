"""The promotion verdict (SPEC.md section 8): four accuracy series and the stall signal per estimator.

Per estimator, gentype (text, image) and phase (start, completion), over the
window's validated pairs:

- ``pairs``; ``within_tolerance``: share of p50 within max(60 s, 50% of the
  observed duration); ``p90_abs_error``: the 90th percentile (nearest rank)
  of |p50 - observed|; ``p90_coverage``: share of observed <= p90;
- ``expired_share``, ``cancelled_share``: of the estimator's forecasts of the
  gentype in the window, the share whose request expired unstarted, or was
  cancelled (so nobody looks good by what it leaves out);
- ``late_share``: the share of those forecasts made after the request's first
  sighting (an estimator run off the main cycle, ``vecsched run
  --replay-every``); 0 for the estimators of every cycle;
- ``enough_pairs``: at least 10,000 pairs; ``passes``: the levels alone
  (within >= 80%, p90 error <= 120 s, 85% <= coverage <= 95%).

A forecast with a null p50 counts as a miss (its error is unbounded; when
more than a tenth are null the 90th percentile is infinite and reported as
null). A null p90 counts as not covering, unless every p90 is null (an
estimator with no p90, e.g. ``adr-wait``), when coverage is null.

Stall: ``predictions`` (resolved stall pairs), ``stalls`` (expiry before a
first assignment), precision, recall, false-positive rate, ``enough``
(10,000 predictions and 500 stalls), ``passes`` (precision >= 60%, recall >=
80%, false-positive rate <= 10%). Shares are fractions; null where undefined.

``approved``: every one of the four series passed with enough pairs in each
hourly verdict for the last 24 hours (``held_since`` says since when).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

FORMAT = "vecsched.promotion/1"
GENTYPE_NAMES = ("text", "image")
SERIES_PHASES = ("start", "completion")
MIN_PAIRS = 10_000
MIN_STALLS = 500
HOLD_SECONDS = 86_400.0
# Verdicts are stored hourly; a longer silence between two (the job down, or not judging) breaks a run of
# holding verdicts, so a day without verdicts is never read as a day of holding.
VERDICT_GAP_SECONDS = 1.5 * 3600.0
TOLERANCE_FLOOR = 60.0
TOLERANCE_SHARE = 0.5
WITHIN_MIN = 0.80
P90_ERROR_MAX = 120.0
COVERAGE_RANGE = (0.85, 0.95)
PRECISION_MIN, RECALL_MIN, FPR_MAX = 0.60, 0.80, 0.10


def _share(numerator: float, denominator: float) -> float | None:
    return None if denominator == 0 else float(numerator) / float(denominator)


def nearest_rank(values: np.ndarray, q: float) -> float | None:
    """The ``q`` quantile by nearest rank: the smallest value with at least ``q`` of all values <= it.

    Examples
    --------
    >>> nearest_rank(np.arange(1.0, 11.0), 0.9), nearest_rank(np.array([]), 0.9)
    (9.0, None)
    """
    if len(values) == 0:
        return None
    ordered = np.sort(values)
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


def series_stats(p50: np.ndarray, p90: np.ndarray, observed: np.ndarray, *, forecasts: int = 0,
                 expired: int = 0, cancelled: int = 0, late: int = 0) -> dict[str, Any]:
    """One accuracy series from its pairs (NaN for null forecasts).

    Examples
    --------
    >>> s = series_stats(np.array([10.0, 100.0]), np.array([80.0, np.nan]), np.array([50.0, 400.0]))
    >>> s["pairs"], s["within_tolerance"], s["p90_abs_error"], s["p90_coverage"], s["passes"]
    (2, 0.5, 300.0, 0.5, False)
    """
    n = len(observed)
    error = np.where(np.isnan(p50), np.inf, np.abs(p50 - observed))
    within = error <= np.maximum(TOLERANCE_FLOOR, TOLERANCE_SHARE * observed)
    p90_error = nearest_rank(error, 0.9)
    if p90_error is not None and not math.isfinite(p90_error):
        p90_error = None
    coverage = None if n == 0 or np.isnan(p90).all() else float(np.mean(observed <= np.nan_to_num(p90, nan=-np.inf)))
    within_share = _share(int(within.sum()), n)
    passes = (
        within_share is not None and within_share >= WITHIN_MIN
        and p90_error is not None and p90_error <= P90_ERROR_MAX
        and coverage is not None and COVERAGE_RANGE[0] <= coverage <= COVERAGE_RANGE[1]
    )
    return {
        "pairs": int(n),
        "within_tolerance": within_share,
        "p90_abs_error": p90_error,
        "p90_coverage": coverage,
        "expired_share": _share(expired, forecasts),
        "cancelled_share": _share(cancelled, forecasts),
        "late_share": _share(late, forecasts),
        "enough_pairs": bool(n >= MIN_PAIRS),
        "passes": bool(passes),
    }


def stall_stats(predicted: np.ndarray, observed: np.ndarray) -> dict[str, Any]:
    """The stall signal from resolved predictions (booleans).

    Examples
    --------
    >>> s = stall_stats(np.array([True, True, False, False]), np.array([True, False, True, False]))
    >>> s["precision"], s["recall"], s["false_positive_rate"]
    (0.5, 0.5, 0.5)
    """
    predicted, observed = predicted.astype(bool), observed.astype(bool)
    tp = int((predicted & observed).sum())
    fp = int((predicted & ~observed).sum())
    fn = int((~predicted & observed).sum())
    tn = int((~predicted & ~observed).sum())
    precision, recall, fpr = _share(tp, tp + fp), _share(tp, tp + fn), _share(fp, fp + tn)
    passes = (precision is not None and precision >= PRECISION_MIN and recall is not None
              and recall >= RECALL_MIN and fpr is not None and fpr <= FPR_MAX)
    return {
        "predictions": len(predicted),
        "stalls": tp + fn,
        "precision": precision,
        "recall": recall,
        "false_positive_rate": fpr,
        "enough": bool(len(predicted) >= MIN_PAIRS and tp + fn >= MIN_STALLS),
        "passes": bool(passes),
    }


def estimator_stats(pairs: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Per estimator: ``{gentype: {start, completion, stall}}`` from its window's pairs."""
    by: dict[tuple[str, str, str], list[Any]] = {}
    for p in pairs:
        by.setdefault((p.estimator, p.gentype, p.phase), []).append(p)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({p.estimator for p in pairs}):
        entry: dict[str, Any] = {}
        for gentype in GENTYPE_NAMES:
            stall = by.get((name, gentype, "stall"), [])
            made = by.get((name, gentype, "forecast"), [])
            forecasts = len(made)
            late = sum(1 for p in made if p.late > 0)
            expired = sum(1 for p in stall if p.observed >= 1.0)
            cancelled = len(by.get((name, gentype, "cancelled"), []))
            block: dict[str, Any] = {}
            for phase in SERIES_PHASES:
                got = by.get((name, gentype, phase), [])
                block[phase] = series_stats(
                    _column(got, "p50"), _column(got, "p90"), _column(got, "observed"),
                    forecasts=forecasts, expired=expired, cancelled=cancelled, late=late)
            block["stall"] = stall_stats(np.array([p.predicted_stall for p in stall], dtype=bool),
                                         np.array([p.observed >= 1.0 for p in stall], dtype=bool))
            entry[gentype] = block
        out[name] = entry
    return out


def _column(pairs: Sequence[Any], name: str) -> np.ndarray:
    return np.array([np.nan if getattr(p, name) is None else getattr(p, name) for p in pairs], dtype=np.float64)


def series_hold(entry: Mapping[str, Any]) -> bool:
    """Whether all four series of one estimator's entry pass with enough pairs."""
    return all(entry[g][ph]["passes"] and entry[g][ph]["enough_pairs"] for g in GENTYPE_NAMES for ph in SERIES_PHASES)


def stall_holds(entry: Mapping[str, Any]) -> bool:
    """Whether one estimator's stall signal passes its bars with enough predictions and stalls, for both gentypes."""
    return all(entry[g]["stall"]["passes"] and entry[g]["stall"]["enough"] for g in GENTYPE_NAMES)


def held_since(history: Iterable[tuple[float, Mapping[str, bool]]], name: str, now: float, holds_now: bool) -> float | None:
    """The start of the unbroken run of hourly verdicts (ending now) in which ``name`` held.

    A gap of more than :data:`VERDICT_GAP_SECONDS` between two verdicts (or
    between the last one and ``now``) ends the run.

    Examples
    --------
    >>> held_since([(0.0, {"x": False}), (3600.0, {"x": True})], "x", 7200.0, True)
    3600.0
    >>> held_since([(0.0, {"x": True})], "x", 7200.0, False) is None
    True
    >>> held_since([(0.0, {"x": True}), (86400.0, {"x": True})], "x", 86400.0, True)  # a day unjudged
    86400.0
    """
    if not holds_now:
        return None
    since = now
    for at, held in sorted(history, key=lambda v: v[0], reverse=True):
        if at > now:
            continue
        if not held.get(name, False) or since - at > VERDICT_GAP_SECONDS:
            break
        since = at
    return since


def promotion_document(
    pairs: Sequence[Any], *, now: float, window: float,
    history: Iterable[tuple[float, Mapping[str, bool]]] = (), seeds: Sequence[int] | None = None,
    estimators: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``vecsched.promotion/1`` document of the window ending at ``now``."""
    history = list(history)
    stats = estimator_stats([p for p in pairs if now - window <= p.at <= now])
    for name in estimators:
        stats.setdefault(name, estimator_stats([_placeholder(name)])[name])
    doc: dict[str, Any] = {"format": FORMAT, "window": {"from": _iso(now - window), "to": _iso(now)}}
    if seeds is not None:
        doc["seeds"] = list(seeds)
    doc["estimators"] = {}
    for name, entry in stats.items():
        since = held_since(history, name, now, series_hold(entry))
        doc["estimators"][name] = {
            "approved": bool(since is not None and now - since >= HOLD_SECONDS),
            "held_since": None if since is None else _iso(since),
            **entry,
        }
    return doc


def _placeholder(name: str) -> Any:
    from vecsched.core.pairing import Pair

    return Pair(name, "text", "none", "", 0.0, None, None, 0.0, False)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def store_verdict(backend: Any, *, now: float, window: float) -> dict[str, Any]:
    """Compute the verdict of the window ending ``now`` and keep its hourly summary in ``backend``."""
    history = [(at, v.get("holds", {})) for at, v in backend.verdicts(now - 2 * HOLD_SECONDS)]
    doc = promotion_document(backend.pairs(now - window, now), now=now, window=window, history=history)
    holds = {name: series_hold(entry) for name, entry in doc["estimators"].items()}
    stall = {name: stall_holds(entry) for name, entry in doc["estimators"].items()}
    backend.add_verdict(now, {"holds": holds, "stall_holds": stall})
    return doc


def read_promotion(backend: Any, *, now: float, window: float) -> dict[str, Any]:
    """The document ``vecsched promotion`` prints (the hourly history from the backend)."""
    history = [(at, v.get("holds", {})) for at, v in backend.verdicts(now - 2 * HOLD_SECONDS)]
    return promotion_document(backend.pairs(now - window, now), now=now, window=window, history=history)


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "share":
        return f"{100 * value:.0f}%"
    if kind == "seconds":
        return f"{value:,.0f}s"
    return str(value)


def format_table(doc: Mapping[str, Any]) -> str:
    """The text table of a promotion document: one line per estimator, gentype and series.

    Examples
    --------
    >>> print(format_table({"window": {"from": "a", "to": "b"}, "estimators": {}}).splitlines()[0])
    window a .. b
    """
    lines = [f"window {doc['window']['from']} .. {doc['window']['to']}"]
    if doc.get("seeds") is not None:
        lines[0] += f"  seeds {doc['seeds']}"
    head = f"{'estimator':22} {'gentype':7} {'series':10} {'pairs':>7} {'within':>7} {'p90err':>9} " \
           f"{'cover':>6} {'expired':>8} {'cancel':>7} {'late':>5} {'enough':>6} {'passes':>6}"
    lines.append(head)
    for name, e in doc["estimators"].items():
        for g in GENTYPE_NAMES:
            for ph in SERIES_PHASES:
                s = e[g][ph]
                lines.append(
                    f"{name:22} {g:7} {ph:10} {s['pairs']:>7} {_fmt(s['within_tolerance'], 'share'):>7} "
                    f"{_fmt(s['p90_abs_error'], 'seconds'):>9} {_fmt(s['p90_coverage'], 'share'):>6} "
                    f"{_fmt(s['expired_share'], 'share'):>8} {_fmt(s['cancelled_share'], 'share'):>7} "
                    f"{_fmt(s.get('late_share'), 'share'):>5} "
                    f"{'yes' if s['enough_pairs'] else 'no':>6} {'yes' if s['passes'] else 'no':>6}")
            st = e[g]["stall"]
            lines.append(
                f"{name:22} {g:7} {'stall':10} {st['predictions']:>7} stalls={st['stalls']} "
                f"precision={_fmt(st['precision'], 'share')} recall={_fmt(st['recall'], 'share')} "
                f"fpr={_fmt(st['false_positive_rate'], 'share')} enough={'yes' if st['enough'] else 'no'} "
                f"passes={'yes' if st['passes'] else 'no'}")
        lines.append(f"{name:22} approved={'yes' if e['approved'] else 'no'} held_since={e['held_since'] or '-'}")
    return "\n".join(lines)
