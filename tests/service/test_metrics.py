"""Telemetry (SPEC section 10) through the SDK's in-memory reader: names, values, bounded attributes only."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import vecsched
from vecsched.service.job import CycleReport, run_cycle
from vecsched.service.metrics import ATTRIBUTE_KEYS, CycleMetrics
from vecsched.service.store.sql import SQLStore
from vecsched.synthetic import horde
from vecsched.synthetic_history import with_history


def _points(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    out: dict[str, list] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def test_a_cycle_reports_its_phases_rows_rejections_pressure_and_waits(reader, tmp_path) -> None:
    reader, meter = reader
    snap = with_history(horde(workers=60, requests=600, seed=4), seed=4)
    doc = snap.to_dict()
    doc["requests"][0]["n"] = -1  # one bad row
    snap = vecsched.load_snapshot(doc)
    now = snap.now - snap.now % 60  # the first cycle of a clock minute
    metrics = CycleMetrics(meter)
    store = SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")
    report = run_cycle(lambda t: snap, store, lambda: now, interval=5.0, observe=metrics.observer(5.0))
    assert report.ok
    points = _points(reader)
    expected = {"vecsched.cycle.duration", "vecsched.cycle.rows", "vecsched.cycle.rows_rejected",
                "vecsched.cycle.age", "horde.request.assignment_pressure.samples",
                "horde.request.dispatch_opportunities", "horde.request.lost_opportunities",
                "horde.request.returned_capacity", "horde.request.active_preceding_dispatches",
                "horde.request.arriving_work", "horde.request.returned_work"}
    assert expected <= set(points)
    phases = {p.attributes["phase"] for p in points["vecsched.cycle.duration"]}
    assert {"load", "estimate", "stall", "publish", "total"} <= phases
    assert points["vecsched.cycle.rows"][0].value == len(snap.workers) + len(snap.requests) + len(snap.jobs)
    rejected = {p.attributes["reason"]: p.value for p in points["vecsched.cycle.rows_rejected"]}
    assert rejected == {"requests.n": 1}
    # One sample per waiting request with nothing in flight, by gentype and evidence.
    est = vecsched.estimate(snap)
    frame = est.to_frame()
    waiting = frame[frame.stall_evidence.notna()]
    samples = points["horde.request.assignment_pressure.samples"]
    assert sum(p.value for p in samples) == len(waiting)
    for p in samples:
        mine = waiting[(waiting.gentype == p.attributes["gentype"]) &
                       (waiting.stall_evidence == p.attributes["evidence"])]
        assert p.value == len(mine) and p.attributes["might_stall"] == (p.attributes["evidence"] == "arrival_outpaces_drain")
    hist = points["horde.request.dispatch_opportunities"]
    assert sum(p.count for p in hist) == len(waiting)
    assert sum(p.sum for p in hist) == int(waiting.dispatch_opportunities.sum())
    assert 0 <= points["vecsched.cycle.age"][0].value < 3600 * 24 * 365 * 100
    # Never an attribute outside the bounded set.
    for name, pts in points.items():
        for p in pts:
            assert set(p.attributes) <= ATTRIBUTE_KEYS, (name, dict(p.attributes))


def test_pressure_is_sampled_only_in_a_minutes_first_published_cycle(reader, tmp_path) -> None:
    reader, meter = reader
    snap = with_history(horde(workers=30, requests=200, seed=5), seed=5)
    metrics = CycleMetrics(meter)
    store = SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")
    base = snap.now - snap.now % 60
    for t in (base + 5.0, base + 10.0, base + 30.0):  # the first of this process's cycles in the minute samples
        run_cycle(lambda now: snap, store, lambda t=t: t, interval=5.0, observe=metrics.observer(5.0))
    frame = vecsched.estimate(snap).to_frame()
    samples = _points(reader)["horde.request.assignment_pressure.samples"]
    assert sum(p.value for p in samples) == int(frame.stall_evidence.notna().sum())


def test_text_queue_wait_from_first_dispatches_seen_since_the_last_cycle(reader) -> None:
    reader, meter = reader
    doc = {"format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z",
           "workers": [{"id": "w", "user_id": "u", "gentype": "text", "last_check_in": "2026-11-29T11:59:59Z",
                        "models": ["m"]}],
           "requests": [],
           "dispatches": [
               {"dispatch_id": "a", "worker_id": "w", "request_id": "r1", "request_created": "2026-11-29T11:59:00Z",
                "dispatched_at": "2026-11-29T11:59:58Z", "assigned_work": 1},
               {"dispatch_id": "b", "worker_id": "w", "request_id": "r2", "request_created": "2026-11-29T11:58:00Z",
                "dispatched_at": "2026-11-29T11:58:30Z", "assigned_work": 1},
               {"dispatch_id": "c", "worker_id": "w", "request_id": "r2", "request_created": "2026-11-29T11:58:00Z",
                "dispatched_at": "2026-11-29T11:59:57Z", "assigned_work": 1}]}
    snap = vecsched.load_snapshot(doc)
    published = CycleReport(snap.now, ok=True)
    CycleMetrics(meter).observe_cycle(published, None, now=snap.now, interval=5.0, snapshot=snap)
    (point,) = _points(reader)["horde.text.queue_wait_seconds"]
    assert point.count == 1 and point.sum == pytest.approx(58.0)  # r2's first assignment was long ago


def test_cli_once_prints_one_cycles_metrics_as_json(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'horde.sqlite'}"
    out = subprocess.run([sys.executable, "-m", "vecsched", "run", "--once", "--metrics", "console", "--db", db],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    start = out.stdout.index("{")
    doc = json.loads(out.stdout[start:])
    names = {m["name"] for rm in doc["resource_metrics"] for sm in rm["scope_metrics"] for m in sm["metrics"]}
    assert {"vecsched.cycle.duration", "vecsched.cycle.rows"} <= names


def test_a_good_cycle_of_an_empty_queue_resets_the_age_and_a_failed_one_does_not(reader, tmp_path) -> None:
    """The age once reset only when a cycle published a request: a quiet horde looked like a stuck job."""
    import time

    reader, meter = reader
    metrics = CycleMetrics(meter)
    store = SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")
    empty = horde(workers=5, requests=0, seed=1)
    report = run_cycle(lambda t: empty, store, time.time, interval=5.0, observe=metrics.observer(5.0))
    assert report.ok and report.published == 0
    assert _points(reader)["vecsched.cycle.age"][0].value < 60
    at = metrics.published_at

    def broken(t):
        raise OSError("database down")

    assert not run_cycle(broken, store, time.time, interval=5.0, observe=metrics.observer(5.0)).ok
    assert metrics.published_at == at
