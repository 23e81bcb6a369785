"""OpenTelemetry metrics of the job (SPEC.md section 10): the SDK wiring and the cycle's instruments.

Instruments are created with the API (``opentelemetry.metrics.get_meter``), so
without an SDK they cost nothing. :func:`setup_metrics` installs the SDK for
``vecsched run --metrics console|prometheus|none``.

Labels are bounded: ``gentype``, ``evidence``, ``might_stall``, ``phase`` and
``reason`` (``table.field`` of a rejected row: a fixed set). Never a request,
worker, model or prompt id.

Metrics:

* ``vecsched.cycle.duration`` (s; ``phase``: load, estimate, stall, forecasts,
  publish, total), ``vecsched.cycle.rows`` (rows loaded),
  ``vecsched.cycle.rows_rejected`` (``reason``), ``vecsched.cycle.age`` (s since
  the published cycle: alert on a stuck job);
* ``horde.request.assignment_pressure.samples``: one per request waiting with
  nothing in flight, in the first cycle of each clock minute (stateless, so
  several job processes agree), by ``gentype``, ``evidence``, ``might_stall``;
  with histograms of the pressure figures behind might_stall for the same
  requests (at most :data:`HISTOGRAM_SAMPLE` per gentype and minute);
* ``horde.text.queue_wait_seconds``: creation to first assignment of text
  requests, from the dispatches seen since the previous cycle.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import numpy as np

log = logging.getLogger("vecsched.metrics")

ATTRIBUTE_KEYS = frozenset({"gentype", "evidence", "might_stall", "phase", "reason"})
PHASES = ("load", "estimate", "stall", "forecasts", "publish", "total")
HISTOGRAM_SAMPLE = 2000
PRESSURE_HISTOGRAMS = {
    "dispatch_opportunities": ("horde.request.dispatch_opportunities", "{dispatch}"),
    "lost_opportunities": ("horde.request.lost_opportunities", "{dispatch}"),
    "returned_capacity": ("horde.request.returned_capacity", "{return}"),
    "active_preceding_dispatches": ("horde.request.active_preceding_dispatches", "{dispatch}"),
    "arriving_work": ("horde.request.arriving_work", "{work}"),
    "returned_work": ("horde.request.returned_work", "{work}"),
}
MODES = ("none", "console", "prometheus")


class CycleMetrics:
    """The job's instruments, created once from ``meter`` (default: the global ``vecsched`` meter).

    Examples
    --------
    >>> CycleMetrics().observe_cycle(None, None, now=0.0, interval=5.0)  # no SDK: a no-op
    """

    def __init__(self, meter: Any = None):
        if meter is None:
            from opentelemetry import metrics

            meter = metrics.get_meter("vecsched")
        self.duration = meter.create_histogram("vecsched.cycle.duration", unit="s",
                                               description="Seconds per phase of a job cycle")
        self.rows = meter.create_gauge("vecsched.cycle.rows", unit="{row}", description="Rows the cycle loaded")
        self.rejected = meter.create_counter("vecsched.cycle.rows_rejected", unit="{row}",
                                             description="Rows left out for a bad value, by table.field")
        self.samples = meter.create_counter(
            "horde.request.assignment_pressure.samples", unit="{request}",
            description="Waiting requests with nothing in flight, sampled once per clock minute")
        self.pressure = {
            field: meter.create_histogram(name, unit=unit, description=f"might_stall's {field} per sampled request")
            for field, (name, unit) in PRESSURE_HISTOGRAMS.items()
        }
        self.queue_wait = meter.create_histogram("horde.text.queue_wait_seconds", unit="s",
                                                 description="Text requests: creation to first assignment")
        self.published_at: float | None = None
        meter.create_observable_gauge("vecsched.cycle.age", callbacks=[self._age], unit="s",
                                      description="Seconds since the last published cycle")

    def _age(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        if self.published_at is None:
            return []
        return [Observation(max(time.time() - self.published_at, 0.0))]

    def observer(self, interval: float) -> Any:
        """``observe(report, snapshot, estimates)`` for :func:`~vecsched.service.job.run_cycle`."""

        def observe(report: Any, snapshot: Any, estimates: Any) -> None:
            self.observe_cycle(report, estimates, now=report.cycle_time, interval=interval, snapshot=snapshot)

        return observe

    def observe_cycle(self, report: Any, estimates: Any, *, now: float, interval: float,
                      snapshot: Any = None) -> None:
        """Record one cycle: its phases, rows, rejections; the pressure samples in a minute's first cycle."""
        if report is not None:
            self._cycle(report, estimates)
        if estimates is not None and _first_cycle_of_minute(now, interval):
            self._pressure(estimates)
        if snapshot is not None:
            self._queue_wait(snapshot, now, interval)

    def _cycle(self, report: Any, estimates: Any) -> None:
        timings = getattr(estimates, "timings", {}) or {}
        phases = {"load": report.load, "estimate": report.estimate, "publish": report.publish,
                  "stall": timings.get("stall"), "forecasts": timings.get("forecasts")}
        phases["total"] = report.load + report.estimate + report.publish
        for phase, seconds in phases.items():
            if seconds is not None:
                self.duration.record(float(seconds), {"phase": phase})
        self.rows.set(int(report.workers + report.requests + report.jobs))
        reasons: dict[str, int] = {}
        for error in report.rejected:
            reason = f"{error.table}.{error.field}"
            reasons[reason] = reasons.get(reason, 0) + 1
        for reason, n in reasons.items():
            self.rejected.add(n, {"reason": reason})
        # An empty queue is published too (a cycle of no requests); a superseded cycle is not.
        if report.ok and not report.superseded:
            self.published_at = report.cycle_time

    def _pressure(self, estimates: Any) -> None:
        from vecsched.core.stall import EVIDENCE
        from vecsched.snapshot.schema import GENTYPES

        cols = estimates.columns
        evidence = cols["stall_evidence"].astype(np.int64)
        sampled = np.flatnonzero(evidence >= 0)  # waiting with nothing in flight
        gentype = cols["gentype"].astype(np.int64)
        key = gentype[sampled] * len(EVIDENCE) + evidence[sampled]
        keys, counts = np.unique(key, return_counts=True)
        for k, n in zip(keys.tolist(), counts.tolist()):
            g, e = divmod(k, len(EVIDENCE))
            self.samples.add(n, {"gentype": GENTYPES[g], "evidence": EVIDENCE[e],
                                 "might_stall": EVIDENCE[e] == "arrival_outpaces_drain"})
        rng = np.random.default_rng(0)
        for g, name in enumerate(GENTYPES):
            mine = sampled[gentype[sampled] == g]
            if len(mine) > HISTOGRAM_SAMPLE:
                mine = np.sort(rng.choice(mine, HISTOGRAM_SAMPLE, replace=False))
            for field, instrument in self.pressure.items():
                for value in cols[field][mine].tolist():  # bounded: HISTOGRAM_SAMPLE per minute
                    instrument.record(value, {"gentype": name})

    def _queue_wait(self, snapshot: Any, now: float, interval: float) -> None:
        import pandas as pd

        from vecsched.snapshot.schema import TEXT

        d = snapshot.dispatches
        if len(d) == 0:
            return
        # First assignment: the earliest dispatch of its request among those loaded.
        order = np.lexsort((d.dispatched_at, d.request_id.astype(str)))
        ids = d.request_id[order].astype(str)
        is_first = np.r_[True, ids[1:] != ids[:-1]]
        rows = order[is_first]
        recent = (d.dispatched_at[rows] > now - interval) & (d.dispatched_at[rows] <= now)
        rows = rows[recent]
        w = snapshot.workers
        at = pd.Index(w.id).get_indexer(d.worker_id[rows]) if len(rows) else np.zeros(0, np.int64)
        text = (at >= 0) & (w.gentype[np.maximum(at, 0)] == TEXT) if len(w) else np.zeros(len(rows), bool)
        for wait in (d.dispatched_at[rows] - d.request_created[rows])[text].tolist():
            self.queue_wait.record(max(wait, 0.0))


def _first_cycle_of_minute(now: float, interval: float) -> bool:
    """True for the first cycle in a clock minute: every job process decides alike, with no state.

    Examples
    --------
    >>> _first_cycle_of_minute(120.0, 5.0), _first_cycle_of_minute(124.9, 5.0), _first_cycle_of_minute(125.0, 5.0)
    (True, True, False)
    """
    return (now % 60.0) < max(interval, 1e-9)


def setup_metrics(mode: str, *, port: int = 9464, export_seconds: float = 60.0) -> Any:
    """Install the OpenTelemetry SDK for ``mode``; returns the meter provider (None for ``none``).

    ``console`` writes the SDK's JSON export to standard output every
    ``export_seconds`` and at shutdown; ``prometheus`` serves a scrape endpoint
    on ``port`` (needs the ``prometheus`` extra).

    Examples
    --------
    >>> setup_metrics("none") is None
    True
    """
    if mode not in MODES:
        raise ValueError(f"--metrics must be one of {', '.join(MODES)}")
    if mode == "none":
        return None
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    if mode == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

        reader: Any = PeriodicExportingMetricReader(ConsoleMetricExporter(out=sys.stdout),
                                                    export_interval_millis=export_seconds * 1000)
    else:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import start_http_server
        except ImportError:
            raise ValueError("--metrics prometheus needs the extra: pip install 'vecsched[prometheus]'") from None
        start_http_server(port)
        reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    return provider
