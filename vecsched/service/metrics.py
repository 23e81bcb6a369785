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
  the published cycle, and before any cycle published, since the job started:
  alert on a stuck job, or one that never publishes);
* ``horde.request.assignment_pressure.samples``: one per request waiting with
  nothing in flight, in the first published cycle of each clock minute (of
  this process: two job processes sample twice), by ``gentype``, ``evidence``,
  ``might_stall``; with histograms of the pressure figures behind might_stall
  for the same requests (at most :data:`HISTOGRAM_SAMPLE` per gentype and minute);
* ``horde.text.queue_wait_seconds``: creation to first assignment of text
  requests, from the dispatches since the previous published cycle; only a
  dispatch provably its request's first counts (see :meth:`CycleMetrics._queue_wait`).

Samples and queue waits come from published cycles only: a failed or
superseded cycle (nothing a reader sees) records its phases, rows and
rejections, nothing else.
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
# Bucket boundaries (upper bounds, the SDK's explicit-bucket advisory): the SDK's default ones
# (0, 5, 10, 25 ... 10000) put every cycle's duration in one bucket.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
"""Seconds of a cycle's phase: a few ms (publish of a small queue) to a minute (a silent database)."""
COUNT_BUCKETS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
"""Dispatches or returns behind might_stall in its 300 s window: 0 (a bucket of its own) to thousands."""
WORK_BUCKETS = (0.0, 10.0, 30.0, 100.0, 300.0, 1e3, 3e3, 1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7)
"""Normalized work arriving or returned in the window: up to 1e7."""
QUEUE_WAIT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0, 900.0, 1200.0,
                      1800.0, 3600.0)
"""Seconds from creation to first assignment: immediate to past a text request's 20 minutes."""
PRESSURE_HISTOGRAMS = {
    "dispatch_opportunities": ("horde.request.dispatch_opportunities", "{dispatch}", COUNT_BUCKETS),
    "lost_opportunities": ("horde.request.lost_opportunities", "{dispatch}", COUNT_BUCKETS),
    "returned_capacity": ("horde.request.returned_capacity", "{return}", COUNT_BUCKETS),
    "active_preceding_dispatches": ("horde.request.active_preceding_dispatches", "{dispatch}", COUNT_BUCKETS),
    "arriving_work": ("horde.request.arriving_work", "{work}", WORK_BUCKETS),
    "returned_work": ("horde.request.returned_work", "{work}", WORK_BUCKETS),
}
MODES = ("none", "console", "prometheus")


class CycleMetrics:
    """The job's instruments, created once from ``meter`` (default: the global ``vecsched`` meter).

    Examples
    --------
    >>> CycleMetrics().observe_cycle(None, None, now=0.0, interval=5.0)  # no SDK: a no-op
    """

    def __init__(self, meter: Any = None, *, history: float | None = None):
        if history is None:
            from vecsched.service.sql.events import HISTORY_SECONDS

            history = HISTORY_SECONDS
        self.history = float(history)  # seconds of returned dispatches a cycle's load holds
        # Requests created after this have every dispatch in the loads seen since (None: no load yet).
        self._covered_since: float | None = None
        self._loaded_at: float | None = None
        self._assigned: set[str] = set()  # requests seen dispatched: a later dispatch is never their first
        self._window_end: float | None = None  # the previous published cycle: queue waits from dispatches since
        self._sampled_minute: int | None = None  # the clock minute pressure was last sampled in
        if meter is None:
            from opentelemetry import metrics

            meter = metrics.get_meter("vecsched")
        self.duration = meter.create_histogram("vecsched.cycle.duration", unit="s",
                                               description="Seconds per phase of a job cycle",
                                               explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.rows = meter.create_gauge("vecsched.cycle.rows", unit="{row}", description="Rows the cycle loaded")
        self.rejected = meter.create_counter("vecsched.cycle.rows_rejected", unit="{row}",
                                             description="Rows left out for a bad value, by table.field")
        self.samples = meter.create_counter(
            "horde.request.assignment_pressure.samples", unit="{request}",
            description="Waiting requests with nothing in flight, sampled once per clock minute")
        self.pressure = {
            field: meter.create_histogram(name, unit=unit, description=f"might_stall's {field} per sampled request",
                                          explicit_bucket_boundaries_advisory=buckets)
            for field, (name, unit, buckets) in PRESSURE_HISTOGRAMS.items()
        }
        self.queue_wait = meter.create_histogram("horde.text.queue_wait_seconds", unit="s",
                                                 description="Text requests: creation to first assignment",
                                                 explicit_bucket_boundaries_advisory=QUEUE_WAIT_BUCKETS)
        self.published_at: float | None = None
        self.started_at = time.time()  # the age until a cycle publishes: a job that never does still alerts
        meter.create_observable_gauge("vecsched.cycle.age", callbacks=[self._age], unit="s",
                                      description="Seconds since the last published cycle "
                                                  "(before any: since the job started)")

    def _age(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        since = self.started_at if self.published_at is None else self.published_at
        return [Observation(max(time.time() - since, 0.0))]

    def observer(self, interval: float) -> Any:
        """``observe(report, snapshot, estimates)`` for :func:`~vecsched.service.job.run_cycle`."""

        def observe(report: Any, snapshot: Any, estimates: Any) -> None:
            self.observe_cycle(report, estimates, now=report.cycle_time, interval=interval, snapshot=snapshot)

        return observe

    def observe_cycle(self, report: Any, estimates: Any, *, now: float, interval: float,
                      snapshot: Any = None) -> None:
        """Record one cycle: its phases, rows, rejections; if it published, the queue waits since the
        previous published cycle (the first: since ``now - interval``) and, first in its clock minute,
        the pressure samples."""
        if report is None:
            return
        self._cycle(report, estimates)
        if not (report.ok and not report.superseded):
            return
        minute = int(now // 60)
        if estimates is not None and minute != self._sampled_minute:
            self._pressure(estimates)
            self._sampled_minute = minute
        since = now - interval if self._window_end is None else self._window_end
        if snapshot is not None:
            self._queue_wait(snapshot, now, since)
        self._window_end = max(since, now)  # a clock stepping back never opens the same window twice

    def _cycle(self, report: Any, estimates: Any) -> None:
        timings = getattr(estimates, "timings", {}) or {}
        phases = {"load": report.load, "estimate": report.estimate, "publish": report.publish,
                  "stall": timings.get("stall"), "forecasts": timings.get("forecasts")}
        phases["total"] = report.load + report.estimate + report.publish
        for phase, seconds in phases.items():
            # A failed cycle's stages after the one that failed never ran: 0.0, not a time to record.
            if seconds is not None and (report.ok or seconds > 0.0 or phase == "total"):
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

    def _queue_wait(self, snapshot: Any, now: float, since: float) -> None:
        """Record the first assignments of text requests among the dispatches in ``(since, now]``.

        A load holds a returned dispatch only while its return is under
        ``history`` seconds old (the job prunes older ones), so the earliest
        dispatch loaded is not always the request's first. One counts only when
        nothing earlier can be missing: its request was created after the first
        load of an unbroken run of loads (each under ``history`` after the
        previous, so together they held every dispatch since that load's cut),
        and no earlier load showed the request dispatched.

        What it misses: requests created before that cut (at the job's start,
        or after a gap longer than ``history`` between loads, only those created
        in the last ``history`` seconds count), and dispatch rows written to
        the database after the load that should have seen them.
        """
        import pandas as pd

        from vecsched.snapshot.schema import TEXT

        if self._loaded_at is None or now - self._loaded_at > self.history:
            self._covered_since = now - self.history  # what this load holds in full
        self._loaded_at = now
        d = snapshot.dispatches
        ids = d.request_id.astype(str)
        if len(d):
            order = np.lexsort((d.dispatched_at, ids))
            is_first = np.r_[True, ids[order][1:] != ids[order][:-1]]
            rows = order[is_first]  # each request's earliest dispatch loaded
            at = d.dispatched_at[rows]
            seen = pd.Index(ids[rows]).isin(list(self._assigned))  # hashed at once, not a loop per dispatch
            first = ~seen & (d.request_created[rows] > self._covered_since)
            count = rows[first & (at > since) & (at <= now)]
            w = snapshot.workers
            wi = pd.Index(w.id).get_indexer(d.worker_id[count]) if len(count) else np.zeros(0, np.int64)
            text = (wi >= 0) & (w.gentype[np.maximum(wi, 0)] == TEXT) if len(w) else np.zeros(len(count), bool)
            for wait in (d.dispatched_at[count] - d.request_created[count])[text].tolist():
                self.queue_wait.record(max(wait, 0.0))
            self._assigned.update(ids[rows][at <= now].tolist())
        # Forget a request once neither its row nor a dispatch of it is loaded: it can be dispatched no more.
        # Not when a request row was left out for a bad value: it may be one of them.
        if not any(error.table == "requests" for error in snapshot.rejected):
            self._assigned &= set(ids.tolist()) | set(snapshot.requests.id.astype(str).tolist())


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
        import errno

        from vecsched.errors import UserError

        if not 1 <= int(port) <= 65535:
            raise ValueError(f"--metrics-port {port}: not a port number 1..65535")
        try:
            start_http_server(port)
        except OSError as exc:
            why = ("the port is in use (another job's endpoint?)" if exc.errno == errno.EADDRINUSE
                   else exc.strerror or str(exc))
            raise UserError(f"--metrics-port {port}: cannot serve the Prometheus endpoint: {why}; "
                            "choose another port with --metrics-port") from None
        reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    return provider
