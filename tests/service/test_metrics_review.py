"""Telemetry review: queue waits counted once, only for published cycles, and the job's own figures."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import vecsched
from vecsched.service.job import CycleReport
from vecsched.service.metrics import CycleMetrics

T0 = datetime(2026, 11, 29, 12, 0, 1, tzinfo=timezone.utc)  # 1 s into a clock minute
T = T0.timestamp()


def _iso(seconds_before_t: float) -> str:
    return (T0 - timedelta(seconds=seconds_before_t)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _dispatch(did: str, rid: str, created: float, at: float) -> dict:
    """A dispatch of ``rid`` (created ``created`` s before T) ``at`` s before T, to the text worker."""
    return {"dispatch_id": did, "worker_id": "w", "request_id": rid, "request_created": _iso(created),
            "dispatched_at": _iso(at), "assigned_work": 1}


def _snap(now: float, dispatches: list[dict]) -> vecsched.Snapshot:
    """The snapshot a cycle ``now`` s before T loads: a text worker and the given dispatches."""
    return vecsched.load_snapshot({
        "format": "vecsched.snapshot/1", "now": _iso(now),
        "workers": [{"id": "w", "user_id": "u", "gentype": "text", "last_check_in": _iso(now + 1),
                     "models": ["m"]}],
        "requests": [], "dispatches": dispatches})


def _published(at: float) -> CycleReport:
    return CycleReport(cycle_time=at, ok=True)


def _waits(reader: InMemoryMetricReader) -> list[tuple[int, float]]:
    data = reader.get_metrics_data()
    out = []
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == "horde.text.queue_wait_seconds":
                    out += [(p.count, p.sum) for p in metric.data.data_points]
    return out


def _cycle(metrics: CycleMetrics, before_t: float, dispatches: list[dict]) -> None:
    snap = _snap(before_t, dispatches)
    metrics.observe_cycle(_published(snap.now), None, now=snap.now, interval=5.0, snapshot=snap)


def test_a_requests_second_dispatch_is_not_a_first_assignment_once_the_first_is_pruned(reader) -> None:
    """r5 (two jobs): d1 700 s before T, returned 690 s before; the cycle at T no longer loads d1.

    The earliest loaded dispatch was taken as the first: d2 counted a second first assignment of 798 s.
    """
    reader, meter = reader
    metrics = CycleMetrics(meter)
    d1 = _dispatch("d1", "r5", created=800, at=700)
    d2 = _dispatch("d2", "r5", created=800, at=2)
    _cycle(metrics, 699, [d1])
    _cycle(metrics, 400, [d1])  # returned 290 s ago: still loaded
    _cycle(metrics, 100, [d1])
    _cycle(metrics, 0, [d2])  # returned 690 s ago: past the loaded history
    assert _waits(reader) == [(1, pytest.approx(100.0))]


def test_a_long_wait_first_assigned_after_the_loaded_history_is_still_counted(reader) -> None:
    """Seen continuously since before its creation, a request waiting 898 s has its first assignment recorded."""
    reader, meter = reader
    metrics = CycleMetrics(meter)
    for before_t in (1000, 700, 400, 100):
        _cycle(metrics, before_t, [])
    _cycle(metrics, 0, [_dispatch("d1", "r6", created=900, at=2)])
    assert _waits(reader) == [(1, pytest.approx(898.0))]


def test_a_request_older_than_what_the_first_cycle_loads_is_not_counted(reader) -> None:
    """Its first assignment may be a pruned dispatch: rather miss it than count it twice."""
    reader, meter = reader
    metrics = CycleMetrics(meter)
    _cycle(metrics, 0, [_dispatch("d2", "r7", created=800, at=2), _dispatch("d3", "r8", created=300, at=1)])
    assert _waits(reader) == [(1, pytest.approx(299.0))]


def _samples(reader: InMemoryMetricReader) -> int:
    data = reader.get_metrics_data()
    return sum(p.value for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
               for metric in sm.metrics if metric.name == "horde.request.assignment_pressure.samples"
               for p in metric.data.data_points)


@pytest.fixture(scope="module")
def queue():
    """A horde with waiting requests, its estimates and the number of pressure samples one minute holds."""
    from vecsched.synthetic import horde
    from vecsched.synthetic_history import with_history

    snap = with_history(horde(workers=30, requests=200, seed=5), seed=5)
    est = vecsched.estimate(snap)
    frame = est.to_frame()
    waiting = int(frame.stall_evidence.notna().sum())
    assert waiting > 0
    return snap, est, waiting


@pytest.mark.parametrize("report", [CycleReport(T, ok=True, superseded=True), CycleReport(T, error="OSError: x")],
                         ids=["superseded", "failed"])
def test_a_cycle_that_published_nothing_records_no_pressure_samples_nor_queue_waits(reader, queue, report) -> None:
    reader, meter = reader
    snap, est, _ = queue
    waits = _snap(0, [_dispatch("d1", "r1", created=60, at=1)])
    CycleMetrics(meter).observe_cycle(report, est, now=T, interval=5.0, snapshot=waits)
    assert _samples(reader) == 0 and _waits(reader) == []


def test_pressure_is_sampled_once_per_clock_minute_however_close_the_cycles(reader, queue) -> None:
    """``now % 60 < interval`` let two cycles 3 s apart (a retry, ``--once`` twice) both sample."""
    reader, meter = reader
    snap, est, waiting = queue
    metrics = CycleMetrics(meter)
    base = snap.now - snap.now % 60
    for t in (base, base + 3.0, base + 4.0, base + 50.0):
        metrics.observe_cycle(CycleReport(t, ok=True), est, now=t, interval=5.0)
    assert _samples(reader) == waiting
    metrics.observe_cycle(CycleReport(base + 61.0, ok=True), est, now=base + 61.0, interval=5.0)
    assert _samples(reader) == 2 * waiting  # a new minute, though not its first interval


@pytest.mark.parametrize("gap, expected", [(1.0, [(1, pytest.approx(298.0))]),
                                           (12.0, [(3, pytest.approx(298.0 + 303.0 + 308.0))])],
                         ids=["closer-than-interval", "longer-than-interval"])
def test_queue_waits_come_from_the_dispatches_since_the_previous_published_cycle(reader, gap, expected) -> None:
    """A window of ``interval`` by the clock counted r1 twice 1 s apart and lost r2 12 s apart."""
    reader, meter = reader
    metrics = CycleMetrics(meter)
    # r1 2 s before T, r2 3 s after, r0 8 s after; all created 300 s before T
    snap = _snap(0, [_dispatch("d0", "r0", 300, -8), _dispatch("d1", "r1", 300, 2), _dispatch("d2", "r2", 300, -3)])
    for t in (T, T + gap):
        metrics.observe_cycle(_published(t), None, now=t, interval=5.0, snapshot=snap)
    assert _waits(reader) == expected


def _age(reader: InMemoryMetricReader) -> list[float]:
    data = reader.get_metrics_data()
    return [p.value for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
            for metric in sm.metrics if metric.name == "vecsched.cycle.age" for p in metric.data.data_points]


def test_the_age_counts_from_the_jobs_start_until_a_cycle_publishes(reader) -> None:
    """Absent until the first good cycle, the age never alerted on a job that never published."""
    import time

    reader, meter = reader
    metrics = CycleMetrics(meter)
    time.sleep(0.2)
    metrics.observe_cycle(CycleReport(time.time(), error="OSError: database down"), None, now=time.time(),
                          interval=5.0)
    (age,) = _age(reader)
    assert 0.2 <= age < 60
    time.sleep(0.1)
    (later,) = _age(reader)
    assert later >= age + 0.1  # still growing: nothing published


def _durations(reader: InMemoryMetricReader) -> dict[str, tuple[int, float]]:
    data = reader.get_metrics_data()
    return {p.attributes["phase"]: (p.count, p.sum) for rm in (data.resource_metrics if data else ())
            for sm in rm.scope_metrics for metric in sm.metrics if metric.name == "vecsched.cycle.duration"
            for p in metric.data.data_points}


def test_a_failed_cycle_records_the_time_its_failing_stage_took(reader) -> None:
    """A load that hung and raised was recorded as 0 s (load and total): the slow failures vanished."""
    import time

    from vecsched.service.job import run_cycle
    from vecsched.service.store.sql import SQLStore

    reader, meter = reader
    metrics = CycleMetrics(meter)

    def hang(now):
        time.sleep(0.3)
        raise TimeoutError("database silent")

    report = run_cycle(hang, SQLStore("sqlite://"), time.time, interval=5.0, observe=metrics.observer(5.0))
    assert not report.ok and report.load >= 0.3
    durations = _durations(reader)
    assert durations["load"][1] >= 0.3 and durations["total"][1] >= 0.3
    assert "estimate" not in durations and "publish" not in durations  # never reached


def test_a_cycle_failing_in_its_estimate_records_the_load_and_the_estimate_so_far(reader) -> None:
    import time

    from vecsched.service.job import run_cycle
    from vecsched.service.store.sql import SQLStore

    reader, meter = reader
    snap = _snap(0, [])

    def slow_failure(snapshot):
        time.sleep(0.2)
        raise MemoryError("too big")

    report = run_cycle(lambda now: snap, SQLStore("sqlite://"), lambda: T, interval=5.0, estimate=slow_failure,
                       observe=CycleMetrics(meter).observer(5.0))
    assert not report.ok and report.estimate >= 0.2
    durations = _durations(reader)
    assert durations["estimate"][1] >= 0.2 and durations["total"][1] >= 0.2 + durations["load"][1] * 0.999
    assert "publish" not in durations


def test_every_histogram_has_buckets_fit_to_what_it_measures(reader, queue) -> None:
    """The SDK's default boundaries (0, 5, 10, 25 ... 10000) put every cycle's duration in one bucket."""
    from vecsched.service import metrics as m

    reader, meter = reader
    snap, est, _ = queue
    metrics = CycleMetrics(meter)
    for seconds in (0.007, 0.03, 0.3, 3.0, 45.0):
        metrics.duration.record(seconds, {"phase": "load"})
    report = CycleReport(snap.now, ok=True, load=0.03, estimate=0.3, publish=3.0)  # load: a filled bucket
    metrics.observe_cycle(report, est, now=snap.now, interval=5.0)
    for wait in (3.0, 40.0, 400.0, 1100.0):
        metrics.queue_wait.record(wait)
    bounds, filled = {}, {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    if hasattr(p, "explicit_bounds"):
                        bounds[metric.name] = tuple(p.explicit_bounds)
                        if p.attributes.get("phase", "load") == "load":
                            filled[metric.name] = sum(1 for c in p.bucket_counts if c)
    assert bounds["vecsched.cycle.duration"] == m.DURATION_BUCKETS
    assert bounds["horde.text.queue_wait_seconds"] == m.QUEUE_WAIT_BUCKETS
    for field, (name, _unit, buckets) in m.PRESSURE_HISTOGRAMS.items():
        assert bounds[name] == buckets, field
    assert filled["vecsched.cycle.duration"] == 5 and filled["horde.text.queue_wait_seconds"] == 4
    assert m.DURATION_BUCKETS[0] <= 0.005 and m.DURATION_BUCKETS[-1] >= 60
    assert m.QUEUE_WAIT_BUCKETS[-1] >= 1200 and m.WORK_BUCKETS[-1] >= 1e7 and m.COUNT_BUCKETS[-1] >= 1000


@pytest.mark.parametrize("port", ["70000", "0", "-1", "http"])
def test_a_metrics_port_outside_1_to_65535_is_a_usage_error(port, capsys) -> None:
    """70000 was taken and failed at run time with an OverflowError."""
    from vecsched.cli import build_parser

    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["run", "--metrics", "prometheus", "--metrics-port", port])
    assert exit.value.code == 2
    assert "--metrics-port" in capsys.readouterr().err


def test_a_metrics_port_in_use_is_named_with_its_option_and_no_traceback(tmp_path) -> None:
    """It printed 'vecsched: Address already in use', naming neither the port nor the option."""
    import socket
    import subprocess
    import sys

    pytest.importorskip("opentelemetry.exporter.prometheus")
    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        out = subprocess.run([sys.executable, "-m", "vecsched", "run", "--once", "--metrics", "prometheus",
                              "--metrics-port", str(port), "--db", f"sqlite:///{tmp_path / 'h.sqlite'}"],
                             capture_output=True, text=True, timeout=300)
    finally:
        held.close()
    assert out.returncode != 0
    assert f"--metrics-port {port}" in out.stderr and "in use" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
