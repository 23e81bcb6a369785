"""OpenTelemetry instruments of the forecast loop, created with the API only.

Bounded labels: ``estimator`` (registered names), ``gentype``, ``phase``,
``reason``; never a request or worker id. Without an SDK configured (the
might_stall work wires it for ``run --metrics``) every call is a no-op.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

DROP_REASONS = ("queue_full", "store_error", "processing_error")


@lru_cache(maxsize=1)
def _instruments() -> tuple[Any, Any]:
    from opentelemetry import metrics

    meter = metrics.get_meter("vecsched")
    errors = meter.create_histogram(
        "vecsched.forecast.validation_error",
        unit="s",
        description="Absolute error of validated p50 forecasts (start, completion)",
    )
    dropped = meter.create_counter(
        "vecsched.forecast.events_dropped",
        unit="{event}",
        description="Forecast and outcome events dropped before reaching the store, by reason",
    )
    return errors, dropped


def observe_pairs(pairs: Sequence[Any]) -> None:
    """Record the absolute p50 error of each validated start or completion pair.

    Examples
    --------
    >>> observe_pairs([])
    """
    errors, _ = _instruments()
    for p in pairs:
        if p.phase in ("start", "completion") and p.p50 is not None:
            errors.record(abs(p.p50 - p.observed),
                          {"estimator": p.estimator, "gentype": p.gentype, "phase": p.phase})


def count_dropped(reason: str, n: int = 1) -> None:
    """Count ``n`` dropped events under ``reason`` (one of :data:`DROP_REASONS`).

    Examples
    --------
    >>> count_dropped("queue_full")
    """
    if reason not in DROP_REASONS:
        raise ValueError(f"unknown drop reason {reason!r}")
    _instruments()[1].add(n, {"reason": reason})
