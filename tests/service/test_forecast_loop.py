"""The forecast loop on the real servers: first write wins, pairing in any order, drops, TTLs, the job."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import secrets
import subprocess
import sys
import textwrap
import time
from collections import Counter
from typing import Iterator

import pytest

from vecsched.service.forecasts_store import ForecastRecorder, MemoryPairs, RedisPairs

REDIS = "redis://127.0.0.1:6379/0"
FORECAST = {"start_p50": 30.0, "start_p90": 90.0, "completion_p50": 60.0, "completion_p90": 120.0,
            "predicted_stall": False}


@pytest.fixture
def redis_pairs() -> Iterator[RedisPairs]:
    backend = RedisPairs(REDIS, prefix="vs-test-fc-" + secrets.token_hex(5))
    try:
        backend.client.ping()
    except Exception as exc:  # pragma: no cover
        pytest.skip(f"Redis not reachable: {exc}")
    yield backend
    backend.drop_all()


@pytest.fixture(params=["redis", "sql", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path) -> Iterator[object]:
    if request.param == "redis":
        yield request.getfixturevalue("redis_pairs")
    elif request.param == "sql":
        from vecsched.service.forecasts_sql import SQLPairs

        yield SQLPairs(f"sqlite:///{tmp_path / 'pairs.sqlite'}")
    else:
        yield MemoryPairs()


def _race(prefix: str, name: str, barrier: object, value: float) -> None:
    backend = RedisPairs(REDIS, prefix=prefix)
    recorder = ForecastRecorder(backend)
    forecast = dict(FORECAST, start_p50=value, completion_p50=value)
    barrier.wait()  # type: ignore[attr-defined]
    for k in range(50):
        recorder.record_forecasts([(f"r{k}", "text", time.time() + 600, {"a": forecast, "b": forecast})],
                                  now=value)


def test_two_processes_racing_keep_one_whole_forecast(redis_pairs: RedisPairs) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_race, args=(redis_pairs.prefix, "x", barrier, float(v))) for v in (1000.0, 2000.0)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for k in range(50):
        record = redis_pairs.record(f"r{k}")
        a, b = json.loads(record["forecast:a"]), json.loads(record["forecast:b"])
        # Each field whole from one writer: its p50 matches its own forecasted_at.
        assert a["start_p50"] == a["forecasted_at"] and b["start_p50"] == b["forecasted_at"]
    pairs = redis_pairs.pairs(0, 1e12)
    counted = Counter((p.estimator, p.request_id) for p in pairs if p.phase == "forecast")
    assert len(counted) == 100 and set(counted.values()) == {1}


EVENT_SETS = {
    # outcome events -> the pairs each estimator must get, exactly once
    "completed": ([("started_at", 130.0), ("completed_at", 160.0)], {"forecast", "start", "completion", "stall"}),
    "expired": ([("expired_without_start", 700.0)], {"forecast", "stall"}),
    "cancelled_after_start": ([("started_at", 130.0), ("cancelled_at", 140.0)], {"forecast", "start", "stall", "cancelled"}),
    "cancelled_unstarted": ([("cancelled_at", 140.0)], {"forecast", "cancelled"}),
}


@pytest.mark.parametrize("case", sorted(EVENT_SETS))
def test_every_order_pairs_and_validates_once(backend: object, case: str) -> None:
    outcomes, want = EVENT_SETS[case]
    t0 = round(time.time())  # records live until expiry + grace: times must be current
    events = [("forecast", None)] + [(kind, t0 + at) for kind, at in outcomes]
    for n, order in enumerate(itertools.permutations(events)):
        rid = f"{case}-{n}"
        recorder = ForecastRecorder(backend)  # type: ignore[arg-type]
        for kind, at in list(order) + list(order):  # every event twice: duplicates change nothing
            if kind == "forecast":
                recorder.record_forecasts([(rid, "image", t0 + 700.0, {"x": FORECAST, "y": FORECAST})],
                                          now=t0 + 100.0)
            else:
                recorder.record_outcomes([(rid, kind, at, t0 + 700.0)])
        got = Counter((p.estimator, p.phase) for p in backend.pairs(0, 1e12) if p.request_id == rid)  # type: ignore[attr-defined]
        assert got == Counter({(e, ph): 1 for e in ("x", "y") for ph in want}), (order, got)
        by_phase = {p.phase: p for p in backend.pairs(0, 1e12) if p.request_id == rid and p.estimator == "x"}  # type: ignore[attr-defined]
        if "start" in want:
            assert by_phase["start"].observed == 30.0 and by_phase["start"].p50 == 30.0
        if "completion" in want:
            assert by_phase["completion"].observed == 60.0
        if "stall" in want:
            assert by_phase["stall"].observed == (1.0 if case == "expired" else 0.0)
            assert by_phase["stall"].gentype == "image"


def test_a_pair_whose_store_failed_is_stored_by_the_next_write(backend: object) -> None:
    # The claim came first: when adding the pairs then failed (a Redis timeout), every later write
    # found them claimed, and the start and stall pairs were lost for good.
    real_add = backend.add_pairs  # type: ignore[attr-defined]

    def failing(pairs: object) -> None:
        raise ConnectionError("the store timed out")

    recorder = ForecastRecorder(backend)  # type: ignore[arg-type]
    observed: list[object] = []
    recorder.observe = observed.extend
    t0 = time.time()
    recorder.record_forecasts([("r", "text", t0 + 700.0, {"x": FORECAST})], now=t0 + 100.0)
    backend.add_pairs = failing  # type: ignore[attr-defined]
    with pytest.raises(ConnectionError):
        recorder.record_outcomes([("r", "started_at", t0 + 130.0, t0 + 700.0)])
    backend.add_pairs = real_add  # type: ignore[attr-defined]
    recorder.record_outcomes([("r", "started_at", t0 + 130.0, t0 + 700.0)])  # the job's next cycle
    recorder.record_outcomes([("r", "started_at", t0 + 130.0, t0 + 700.0)])  # and one more: no repeats
    got = Counter(p.phase for p in backend.pairs(0, 1e12))  # type: ignore[attr-defined]
    assert got == Counter({"forecast": 1, "start": 1, "stall": 1})
    assert Counter(p.phase for p in observed) == got  # counted once each, by the write that claimed it


def test_two_writers_that_saw_different_outcomes_store_one_pair(backend: object) -> None:
    # Pairs are stored before they are claimed; one writer saw the expiry (stall observed 1), another
    # the start (stall observed 0), and both read the record before either stored: Redis kept both
    # versions (its members differ) until each pair was stored once per request and phase.
    import threading

    class Gate:
        def __init__(self, inner: object, barrier: threading.Barrier) -> None:
            self.inner, self.barrier = inner, barrier

        def write(self, writes: object) -> object:
            out = self.inner.write(writes)  # type: ignore[attr-defined]
            self.barrier.wait(10)
            return out

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    t0 = time.time()
    ForecastRecorder(backend).record_forecasts([("r", "text", t0 + 700.0, {"x": FORECAST})], now=t0 + 100.0)  # type: ignore[arg-type]
    barrier = threading.Barrier(2)
    writers = [ForecastRecorder(Gate(backend, barrier)) for _ in range(2)]  # type: ignore[arg-type]
    events = [("r", "expired_without_start", t0 + 700.0, t0 + 700.0), ("r", "started_at", t0 + 705.0, t0 + 700.0)]
    threads = [threading.Thread(target=w.record_outcomes, args=([e],)) for w, e in zip(writers, events)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    got = Counter(p.phase for p in backend.pairs(0, 1e12))  # type: ignore[attr-defined]
    assert got["stall"] == 1 and got["forecast"] == 1


def test_start_before_the_first_sighting_pairs_no_start(backend: object) -> None:
    recorder = ForecastRecorder(backend)  # type: ignore[arg-type]
    t0 = time.time()
    recorder.record_outcomes([("early", "started_at", t0 + 90.0, None)])
    recorder.record_forecasts([("early", "text", t0 + 700.0, {"x": FORECAST})], now=t0 + 100.0)
    recorder.record_outcomes([("early", "completed_at", t0 + 150.0, None)])
    phases = sorted(p.phase for p in backend.pairs(0, 1e12))  # type: ignore[attr-defined]
    assert phases == ["completion", "forecast"]


def test_ttl_covers_expiry_plus_grace_and_never_shrinks(redis_pairs: RedisPairs) -> None:
    recorder = ForecastRecorder(redis_pairs)
    now = time.time()
    recorder.record_forecasts([("t1", "text", now + 1200, {"x": FORECAST})], now=now)
    key = redis_pairs.key("t1")
    ttl = redis_pairs.client.ttl(key)
    assert 1200 + 600 - 5 <= ttl <= 1200 + 600 + 1
    recorder.record_outcomes([("t1", "started_at", now + 10, None)])  # wants only now + 610
    assert redis_pairs.client.ttl(key) >= 1200 + 600 - 5
    # An outcome first (no expiry known) lives past its time; the forecast then extends it.
    recorder.record_outcomes([("t2", "cancelled_at", now, None)])
    assert 590 <= redis_pairs.client.ttl(redis_pairs.key("t2")) <= 601
    recorder.record_forecasts([("t2", "text", now + 3000, {"x": FORECAST})], now=now)
    assert redis_pairs.client.ttl(redis_pairs.key("t2")) >= 3000 + 600 - 5


def test_an_outcome_at_no_finite_time_is_dropped_alone(redis_pairs: RedisPairs) -> None:
    # inf and nan passed float(): the store's script failed after its first writes, so the whole
    # batch counted as dropped, its good outcomes paired nothing, and the bad record never expired.
    from vecsched import outcomes

    recorder = ForecastRecorder(redis_pairs)
    now = time.time()
    recorder.record_forecasts([(f"o{k}", "text", now + 600, {"x": FORECAST}) for k in range(4)], now=now)
    writer = outcomes.configure(recorder)
    try:
        for rid, at in (("o0", now + 10), ("o1", float("inf")), ("o2", float("nan")), ("o3", now + 20)):
            assert outcomes.record_start(rid, at=at)
        assert writer.flush()
        assert writer.dropped == {"processing_error": 2}
    finally:
        outcomes.configure(None)
    started = {p.request_id for p in redis_pairs.pairs(0, 1e12) if p.phase == "start"}
    assert started == {"o0", "o3"}
    assert all(redis_pairs.client.ttl(redis_pairs.key(f"o{k}")) > 0 for k in range(4))


def test_outcomes_api_never_blocks_and_counts_a_full_queue() -> None:
    import threading

    from vecsched import outcomes

    gate = threading.Event()

    class Slow:
        def record_outcomes(self, rows):
            gate.wait(10)

    writer = outcomes.configure(Slow(), maxsize=2)  # type: ignore[arg-type]
    try:
        started = time.perf_counter()
        results = [outcomes.record_start(f"r{k}", gentype="text", at=1.0) for k in range(10)]
        assert time.perf_counter() - started < 0.5
        assert results.count(False) >= 7 and writer.dropped.get("queue_full", 0) == results.count(False)
    finally:
        gate.set()
        outcomes.configure(None)


def test_stopped_redis_drops_events_with_a_counted_reason(private_redis) -> None:
    from vecsched import outcomes

    recorder = ForecastRecorder(RedisPairs(private_redis.url, prefix="fault"))
    writer = outcomes.configure(recorder)
    try:
        t0 = round(time.time())
        assert outcomes.record_start("r1", gentype="text", at=t0)
        assert writer.flush(10)
        assert float(recorder.backend.record("r1")["started_at"]) == t0
        private_redis.stop()
        for k in range(3):  # never raises into the caller
            assert outcomes.record_completion(f"r{k}", gentype="text", at=t0 + 20) is True
        assert outcomes.record_cancellation("r9", at="not a time") is True
        assert writer.flush(30)
        assert writer.dropped == {"store_error": 3, "processing_error": 1}
    finally:
        outcomes.configure(None)


def test_dropped_counter_reaches_opentelemetry() -> None:
    # In a child process: the global meter provider is set once per process.
    code = textwrap.dedent("""
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        from vecsched.service.forecast_metrics import count_dropped
        count_dropped("queue_full"); count_dropped("store_error", 3)
        data = reader.get_metrics_data()
        points = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == "vecsched.forecast.events_dropped":
                        for p in m.data.data_points:
                            points[p.attributes["reason"]] = p.value
        print(sorted(points.items()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('queue_full', 1), ('store_error', 3)]"


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


def _snapshot(now: float, requests: list, jobs: list) -> object:
    import vecsched

    return vecsched.load_snapshot({
        "format": "vecsched.snapshot/1", "now": _iso(now),
        "workers": [{"id": "w1", "user_id": "o", "gentype": "text", "speed": 10.0, "threads": 1,
                     "models": ["m"], "last_check_in": _iso(now - 10), "max_length": 512}],
        "requests": requests, "jobs": jobs})


def _req(rid: str, t0: float, **kw: object) -> dict:
    return {"id": rid, "user_id": "u", "gentype": "text", "models": ["m"], "max_length": 100,
            "created": _iso(t0 - 5), "expiry": _iso(t0 + kw.pop("expires_in", 600)), "n": 1, "jobs": 1, **kw}


def test_the_job_records_first_sightings_and_derives_outcomes(redis_store) -> None:
    from vecsched.service.forecast_job import ForecastTracker, recorder_for
    from vecsched.service.job import run_cycle
    from vecsched.service.promotion import read_promotion

    t0 = round(time.time())
    a, b, c = _req("a", t0), _req("b", t0), _req("c", t0, expires_in=40)
    cycles = [
        (t0, [a, b, c], []),
        # a assigned at t0 + 20; b gone before its expiry, unstarted: cancelled
        (t0 + 30, [dict(a, n=0), c], [{"id": "j1", "request_id": "a", "worker_id": "w1",
                                       "started": _iso(t0 + 20), "state": "processing"}]),
        # a's only job finished: completed; c past expiry, never started: expired
        (t0 + 60, [dict(a, n=0), c], [{"id": "j1", "request_id": "a", "worker_id": "w1",
                                       "started": _iso(t0 + 20), "state": "finished"}]),
    ]
    tracker = ForecastTracker(recorder_for(redis_store))
    for now, requests, jobs in cycles:
        snap = _snapshot(now, requests, jobs)
        report = run_cycle(lambda _now, s=snap: s, redis_store, lambda n=now: n, forecasts=tracker)
        assert report.ok, report.error
    backend = tracker.recorder.backend
    record = backend.record("a")
    assert json.loads(record["forecast:eligible-share-v1"])["forecasted_at"] == t0
    assert float(record["started_at"]) == t0 + 20 and float(record["completed_at"]) == t0 + 60
    assert "cancelled_at" in backend.record("b") and "expired_without_start" in backend.record("c")
    pairs = {(p.estimator, p.request_id, p.phase): p for p in backend.pairs(0, 1e12)}
    for name in ("compatible-queue-v1", "eligible-share-v1", "adr-wait", "horde-wide"):
        assert pairs[(name, "a", "start")].observed == 20.0
        assert pairs[(name, "a", "completion")].observed == 60.0
        assert pairs[(name, "c", "stall")].observed == 1.0
        assert (name, "b", "cancelled") in pairs and (name, "b", "stall") not in pairs
    # a second tracker (another process) records nothing new over the first forecasts
    other = ForecastTracker(recorder_for(redis_store))
    other.observe(_snapshot(t0 + 5, [a, b, c], []), __import__("vecsched").estimate(_snapshot(t0 + 5, [a, b, c], [])),
                  t0 + 5)
    assert json.loads(backend.record("a")["forecast:eligible-share-v1"])["forecasted_at"] == t0
    doc = read_promotion(backend, now=t0 + 61, window=86400)
    text = doc["estimators"]["eligible-share-v1"]["text"]
    assert text["start"]["pairs"] == 1 and text["completion"]["pairs"] == 1
    assert text["stall"]["predictions"] == 2 and text["stall"]["stalls"] == 1
    assert text["start"]["expired_share"] == pytest.approx(1 / 3)
    assert text["start"]["cancelled_share"] == pytest.approx(1 / 3)


def test_sql_records_expire_and_pairs_leave_the_window(tmp_path) -> None:
    from vecsched.service.forecasts_sql import SQLPairs

    backend = SQLPairs(f"sqlite:///{tmp_path / 'p.sqlite'}")
    recorder = ForecastRecorder(backend)
    recorder.record_forecasts([("old", "text", 1000.0, {"x": FORECAST})], now=900.0)  # lives to 1600
    recorder.record_forecasts([("new", "text", 5000.0, {"x": FORECAST})], now=4000.0)
    backend.trim(3000.0, now=2000.0)
    assert backend.record("old") == {} and "forecast:x" in backend.record("new")
    assert [p.request_id for p in backend.pairs(0, 1e12)] == ["new"]


def test_a_256_byte_request_id_is_recorded_on_postgresql_and_old_tables_are_widened(pg_url) -> None:
    """The loader takes ids of 256 bytes; a varchar(255) column once failed every cycle's whole batch of records."""
    import sqlalchemy as sa

    from vecsched.service.forecasts_sql import SQLPairs

    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:  # a table as an older vecsched made it
        conn.execute(sa.text("CREATE TABLE vs_forecast_fields (request_id varchar(255), field varchar(255), "
                             "value text NOT NULL, expires_at float NOT NULL, PRIMARY KEY (request_id, field))"))
    long_id = "r" * 256
    recorder = ForecastRecorder(SQLPairs(engine))
    recorder.record_forecasts([(long_id, "text", 1000.0, {"x": FORECAST}), ("short", "text", 1000.0, {"x": FORECAST})],
                              now=900.0)
    backend = SQLPairs(engine)
    assert "forecast:x" in backend.record(long_id) and "forecast:x" in backend.record("short")
    engine.dispose()


def _cycles(store, tracker, cycles) -> None:
    from vecsched.service.job import run_cycle

    for now, requests, jobs in cycles:
        snap = _snapshot(now, requests, jobs)
        report = run_cycle(lambda _now, s=snap: s, store, lambda n=now: n, forecasts=tracker)
        assert report.ok, report.error


def _job(jid: str, rid: str, started: float, state: str) -> dict:
    return {"id": jid, "request_id": rid, "worker_id": "w1", "started": _iso(started), "state": state}


def test_an_expiry_the_horde_moves_on_is_followed_and_the_record_outlives_it(redis_store) -> None:
    # The horde refreshes a request's expiry (now + 20 min) as it hands out a job. Judged by the first
    # sighting's expiry, a two-job request was dropped before its completion, and one refreshed before
    # its start was declared expired while still waiting.
    from vecsched.service.forecast_job import ForecastTracker, recorder_for

    t0 = round(time.time())
    two = _req("two", t0, expires_in=300, n=2, jobs=2)
    late = _req("late", t0, expires_in=100)
    refreshed = lambda r, at: dict(r, expiry=_iso(at + 1200))  # noqa: E731
    tracker = ForecastTracker(recorder_for(redis_store))
    _cycles(redis_store, tracker, [
        (t0, [two, late], []),
        (t0 + 240, [refreshed(dict(two, n=1), t0 + 240), refreshed(late, t0 + 90)],
         [_job("j1", "two", t0 + 240, "processing")]),
        (t0 + 950, [refreshed(dict(two, n=0), t0 + 940), refreshed(dict(late, n=0), t0 + 90)],
         [_job("j1", "two", t0 + 240, "finished"), _job("j2", "two", t0 + 940, "processing"),
          _job("j3", "late", t0 + 900, "processing")]),
        (t0 + 1000, [refreshed(dict(two, n=0), t0 + 940)],
         [_job("j1", "two", t0 + 240, "finished"), _job("j2", "two", t0 + 940, "finished")]),
    ])
    backend = tracker.recorder.backend
    pairs = {(p.request_id, p.phase): p for p in backend.pairs(0, 1e12) if p.estimator == "eligible-share-v1"}
    assert pairs[("two", "completion")].observed == 1000.0 and pairs[("two", "start")].observed == 240.0
    assert pairs[("late", "start")].observed == 900.0 and pairs[("late", "stall")].observed == 0.0
    assert "expired_without_start" not in backend.record("late")
    # The record lives past the moved expiry (t0 + 940 + 1200) plus the grace, not the first one's.
    assert backend.client.ttl(backend.key("two")) > 940 + 1200 + 600 - (time.time() - t0) - 5


def test_a_quick_start_on_a_clock_behind_the_jobs_still_pairs(redis_store) -> None:
    # The horde's clock 3 s behind the job's: a request first seen jobless started "before" its sighting.
    from vecsched.service.forecast_job import ForecastTracker, recorder_for

    t0 = round(time.time())
    quick, already = _req("quick", t0), _req("already", t0)
    tracker = ForecastTracker(recorder_for(redis_store))
    _cycles(redis_store, tracker, [
        (t0, [quick, dict(already, n=0)], [_job("j0", "already", t0 - 30, "processing")]),
        (t0 + 5, [dict(quick, n=0), dict(already, n=0)],
         [_job("j1", "quick", t0 - 1, "processing"), _job("j0", "already", t0 - 30, "processing")]),
    ])
    pairs = {(p.request_id, p.phase): p for p in tracker.recorder.backend.pairs(0, 1e12)
             if p.estimator == "eligible-share-v1"}
    assert pairs[("quick", "start")].observed == 0.0 and pairs[("quick", "stall")].observed == 0.0
    # One already assigned when first seen still has no start to predict.
    assert ("already", "start") not in pairs and ("already", "stall") not in pairs


def test_a_forecast_the_store_failed_to_write_is_kept_as_late_from_its_first_sighting(redis_store) -> None:
    from vecsched.service.forecast_job import ForecastTracker, recorder_for

    t0 = round(time.time())
    r = _req("r", t0)
    tracker = ForecastTracker(recorder_for(redis_store))
    backend = tracker.recorder.backend
    write, failures = backend.write, iter([True])

    def flaky(writes):
        if next(failures, False):
            raise ConnectionError("store blip")
        return write(writes)

    backend.write = flaky
    _cycles(redis_store, tracker, [(t0, [r], []), (t0 + 30, [r], [])])
    doc = json.loads(backend.record("r")["forecast:eligible-share-v1"])
    assert doc["forecasted_at"] == t0 and doc["late_s"] == 30.0
    assert tracker.unrecorded.empty


def test_the_replay_calibration_is_read_once_per_refresh_and_not_at_all_without_the_replay(redis_store) -> None:
    from vecsched.core.replay import disable, enable
    from vecsched.service.forecast_job import ForecastTracker, recorder_for

    t0 = round(time.time())
    tracker = ForecastTracker(recorder_for(redis_store))
    backend = tracker.recorder.backend
    reads, pairs = [], backend.pairs
    backend.pairs = lambda since, until: reads.append(since) or pairs(since, until)
    cycles = [(t0 + 5 * k, [_req(f"r{k}", t0)], []) for k in range(5)]
    _cycles(redis_store, tracker, cycles)
    assert reads == [t0 - 86_400.0]  # the hourly verdict's read; the estimate read nothing
    reads.clear()
    enable()
    try:
        _cycles(redis_store, tracker, [(t0 + 30 + 5 * k, [_req(f"s{k}", t0)], []) for k in range(5)])
    finally:
        disable()
    assert len(reads) == 1


def test_a_finished_row_without_its_jobs_completes_and_a_rejected_row_is_not_cancelled(redis_store) -> None:
    # The demo kept a finished request's row (inactive, n = 0) without its jobs: the tracker took
    # "inactive, no finished job" for a cancellation, the status route read the same row as done.
    # And a row the loader rejected for one cycle was taken for gone, so cancelled for good.
    from vecsched.service.forecast_job import ForecastTracker, recorder_for
    from vecsched.service.job import run_cycle

    t0 = round(time.time())
    d, e = _req("d", t0), _req("e", t0)
    job = {"id": "je", "request_id": "e", "worker_id": "w1", "started": _iso(t0 + 10), "state": "processing"}
    cycles = [
        (t0, [d, e], []),
        (t0 + 30, [dict(d, n=0, active=False), dict(e, n=0, kudos=-1)], [dict(job)]),  # e's row: a bad cell
        (t0 + 60, [dict(e, n=0)], [dict(job, state="finished")]),
    ]
    tracker = ForecastTracker(recorder_for(redis_store))
    for now, requests, jobs in cycles:
        snap = _snapshot(now, requests, jobs)
        assert run_cycle(lambda _now, s=snap: s, redis_store, lambda n=now: n, forecasts=tracker).ok
    backend = tracker.recorder.backend
    assert float(backend.record("d")["completed_at"]) == t0 + 30 and "cancelled_at" not in backend.record("d")
    assert float(backend.record("e")["completed_at"]) == t0 + 60 and "cancelled_at" not in backend.record("e")


def test_readers_of_a_fresh_forecast_database_make_no_tables_and_race_no_writer(pg_url) -> None:
    # vecsched promotion (a report) ran CREATE TABLE in whatever database it read, the horde's
    # included, and several first readers on a fresh PostgreSQL raced the job's CREATE TABLE
    # (duplicate key on pg_type): that cycle's forecasts were then recorded late.
    import threading

    import sqlalchemy as sa

    from vecsched.service.forecasts_sql import SQLPairs, fields_table

    readers = [SQLPairs(pg_url) for _ in range(4)]
    assert readers[0].pairs(0, 1e12) == [] and readers[0].verdicts(0) == [] and readers[0].record("r") == {}
    assert not sa.inspect(readers[0].engine).has_table(fields_table.name)
    writers = [ForecastRecorder(SQLPairs(pg_url)) for _ in range(2)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(readers) + len(writers))

    def read(backend: SQLPairs) -> None:
        barrier.wait()
        try:
            backend.pairs(0, 1e12), backend.verdicts(0)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    def write(recorder: ForecastRecorder) -> None:
        barrier.wait()
        try:
            recorder.record_forecasts([("r", "text", time.time() + 700.0, {"x": FORECAST})], now=time.time())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(b,)) for b in readers]
    threads += [threading.Thread(target=write, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert [p.phase for p in readers[0].pairs(0, 1e12)] == ["forecast"]
    for backend in [*readers, *(w.backend for w in writers)]:
        backend.engine.dispose()


@pytest.mark.parametrize("kind", ["redis", "postgresql", "sqlite"])
def test_a_restarted_job_still_records_the_outcomes_of_requests_in_flight(request, tmp_path, kind) -> None:
    # Tracking lived in memory: after a restart the requests in flight got no completion, and those that
    # expired or were cancelled meanwhile no stall or cancellation, at every deploy.
    from vecsched.service.forecast_job import ForecastTracker, recorder_for
    from vecsched.service.job import run_cycle
    from vecsched.service.store.sql import SQLStore

    if kind == "redis":
        store = request.getfixturevalue("redis_store")
    else:
        store = SQLStore(request.getfixturevalue("pg_url") if kind == "postgresql" else f"sqlite:///{tmp_path / 'j.sqlite'}")
    t0 = round(time.time())
    a, b, c = _req("a", t0), _req("b", t0), _req("c", t0, expires_in=40)
    job = {"id": "j1", "request_id": "a", "worker_id": "w1", "started": _iso(t0 + 20), "state": "processing"}
    before = [(t0, [a, b, c], []), (t0 + 30, [dict(a, n=0), b, c], [job])]
    after = [(t0 + 60, [dict(a, n=0)], [dict(job, state="finished")])]  # b cancelled, c expired, a done
    for tracker, cycles in ((ForecastTracker(recorder_for(store)), before),
                            (ForecastTracker(recorder_for(store)), after)):  # the second: a new process
        for now, requests, jobs in cycles:
            snap = _snapshot(now, requests, jobs)
            assert run_cycle(lambda _now, s=snap: s, store, lambda n=now: n, forecasts=tracker).ok
    backend = tracker.recorder.backend
    assert float(backend.record("a")["completed_at"]) == t0 + 60
    assert "cancelled_at" in backend.record("b") and "expired_without_start" in backend.record("c")
    phases = {(p.request_id, p.phase) for p in backend.pairs(0, 1e12) if p.estimator == "eligible-share-v1"}
    assert {("a", "completion"), ("b", "cancelled"), ("c", "stall")} <= phases
    assert json.loads(backend.record("a")["forecast:eligible-share-v1"])["forecasted_at"] == t0  # not re-forecast
    if kind != "redis":
        store.close()
