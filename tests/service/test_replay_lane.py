"""The replay off the main cycle: cadence, true first sightings, late forecasts, the late share.

The clock is injected (cycle times are chosen, never read), the lane's thread
is either not started (the tests call ``run_pending`` where the thread would)
or held by events, and the stores are the real ones: SQLite, PostgreSQL and
Redis, each under its own schema or key prefix.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from typing import Any, Iterator

import numpy as np
import pytest

import vecsched
from vecsched.core import replay
from vecsched.core.forecasts import ESTIMATORS, FORECAST_FIELDS
from vecsched.core.pairing import ForecastRecorder, MemoryPairs
from vecsched.core.promotion import format_table, read_promotion
from vecsched.service.job import forecast_tracker, run_cycle, run_service
from vecsched.service.store.sql import SQLStore

NAME = replay.NAME
OTHERS = ("compatible-queue-v1", "eligible-share-v1", "adr-wait", "horde-wide")
FORECAST = {"start_p50": 30.0, "start_p90": 90.0, "completion_p50": 60.0, "completion_p90": 120.0,
            "predicted_stall": False}


@pytest.fixture(autouse=True)
def replay_registered() -> Iterator[None]:
    replay.enable()
    yield
    replay.disable()


@pytest.fixture(params=["sqlite", "postgresql", "redis"])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Any]:
    if request.param == "redis":
        yield request.getfixturevalue("redis_store")
        return
    url = f"sqlite:///{tmp_path / 'job.sqlite'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    sql_store = SQLStore(url)
    yield sql_store
    sql_store.close()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


def _req(rid: str, t0: float, **kw: Any) -> dict:
    return {"id": rid, "user_id": "u", "gentype": "text", "models": ["m"], "max_length": 100,
            "created": _iso(t0 - 5), "expiry": _iso(t0 + 600), "n": 1, "jobs": 1, **kw}


def _snapshot(now: float, requests: list, jobs: list = ()) -> Any:
    return vecsched.load_snapshot({
        "format": "vecsched.snapshot/1", "now": _iso(now),
        "workers": [{"id": "w1", "user_id": "o", "gentype": "text", "speed": 10.0, "threads": 1,
                     "models": ["m"], "last_check_in": _iso(now - 10), "max_length": 512}],
        "requests": requests, "jobs": list(jobs)})


def _forecast(backend: Any, rid: str, name: str = NAME) -> dict | None:
    text = backend.record(rid).get(f"forecast:{name}")
    return None if text is None else json.loads(text)


def test_a_deferred_replay_equals_the_replay_inside_the_estimate() -> None:
    from vecsched import synthetic

    snap = synthetic.horde(workers=20, requests=300, seed=3)
    inline = vecsched.estimate(snap)
    deferred = vecsched.estimate(snap, defer=(NAME,))
    assert NAME not in deferred.forecasts and inline.deferred is None
    later = ESTIMATORS[NAME].compute(snap, deferred.deferred, None)
    for field in FORECAST_FIELDS:
        np.testing.assert_array_equal(getattr(later, field), getattr(inline.forecasts[NAME], field))
    for name in inline.forecasts.keys() - {NAME}:  # the others, and every figure, unchanged
        for field in FORECAST_FIELDS:
            np.testing.assert_array_equal(getattr(deferred.forecasts[name], field),
                                          getattr(inline.forecasts[name], field))
    for column, values in inline.columns.items():
        np.testing.assert_array_equal(deferred.columns[column], values)


def test_cadence_first_sightings_and_late_forecasts(store: Any) -> None:
    t0 = float(round(time.time()))
    tracker = forecast_tracker(store, replay_every=30.0)
    lane, backend = tracker.lane, tracker.recorder.backend
    # Each cycle: the requests waiting; e waits at +40 only, and is gone (cancelled) at +50.
    waiting = {0: "a", 10: "ab", 20: "abc", 30: "abcd", 40: "abcde", 50: "abcd", 60: "abcd", 70: "abcd"}
    taken = []
    for dt, ids in waiting.items():
        now = t0 + dt
        snap = _snapshot(now, [_req(r, t0) for r in ids])
        report = run_cycle(lambda _now, s=snap: s, store, lambda n=now: n, forecasts=tracker)
        assert report.ok, report.error
        # The cycle itself never records the replay: its first sightings are owed to the lane.
        assert all(_forecast(backend, r) is None for r in ids if r in lane.owed().index)
        if lane.run_pending():
            taken.append(dt)
    assert taken == [0, 30, 60] and lane.replays == 3  # every 30 s of cycle time, not every cycle
    late = {r: _forecast(backend, r) for r in "abcde"}
    for r, first, late_s in (("a", 0, 0), ("b", 10, 20), ("c", 20, 10), ("d", 30, 0), ("e", 40, 20)):
        assert late[r]["forecasted_at"] == t0 + first and late[r]["late_s"] == late_s, r
        # every other estimator was recorded at the same, true, first sighting
        assert _forecast(backend, r, "eligible-share-v1")["forecasted_at"] == t0 + first
        assert "late_s" not in _forecast(backend, r, "eligible-share-v1")
    assert late["b"]["start_p50"] is not None and not late["b"].get("missed")
    # e left the queue before the replay at +60 reached it: a missed forecast, not none
    assert late["e"]["missed"] is True and late["e"]["start_p50"] is None
    assert lane.owed().empty
    doc = read_promotion(backend, now=t0 + 71, window=86400.0)
    text = {name: doc["estimators"][name]["text"]["start"] for name in (NAME, *OTHERS)}
    assert text[NAME]["late_share"] == pytest.approx(3 / 5)  # b, c and e of a to e
    assert all(text[name]["late_share"] == 0.0 for name in OTHERS)
    assert text[NAME]["cancelled_share"] == pytest.approx(1 / 5)  # e, scored like the others
    lines = [line for line in format_table(doc).splitlines() if line.startswith(NAME) and " start " in line]
    assert " 60% " in lines[0]  # the late column of the table


def test_late_forecasts_are_scored_from_the_first_sighting(store: Any) -> None:
    from vecsched.service.forecast_job import recorder_for

    recorder = recorder_for(store)
    t0 = float(round(time.time()))
    first, made, expiry = t0 + 100, t0 + 130, t0 + 700
    for rid in ("on-time", "early-start"):
        recorder.record_forecasts([(rid, "image", expiry, {"x": FORECAST})], now=first)
        recorder.record_forecasts([(rid, "image", expiry, {NAME: FORECAST})], now=made, first_seen=[first])
    recorder.record_outcomes([("on-time", "started_at", t0 + 160, expiry), ("on-time", "completed_at", t0 + 200, expiry),
                              ("early-start", "started_at", t0 + 120, expiry)])
    pairs = {(p.estimator, p.request_id, p.phase): p for p in recorder.backend.pairs(0, 1e12)}
    start = pairs[(NAME, "on-time", "start")]
    # observed from the first sighting, as for x; p50 and p90 moved by the 30 s of lateness
    assert (start.observed, start.p50, start.p90) == (60.0, 60.0, 120.0)
    assert pairs[("x", "on-time", "start")].observed == 60.0
    assert pairs[(NAME, "on-time", "completion")].p50 == 90.0
    # started before the late forecast was made: a miss, and no stall pair it could not lose
    assert pairs[(NAME, "early-start", "start")].p50 is None
    assert (NAME, "early-start", "stall") not in pairs and ("x", "early-start", "stall") in pairs
    assert pairs[(NAME, "on-time", "forecast")].late == 30.0 and pairs[("x", "on-time", "forecast")].late == 0.0
    image = read_promotion(recorder.backend, now=t0 + 300, window=86400.0)["estimators"]
    assert image[NAME]["image"]["start"]["late_share"] == 1.0 and image["x"]["image"]["start"]["late_share"] == 0.0
    assert image[NAME]["image"]["start"]["within_tolerance"] == 0.5  # the early start counts as a miss


class _Held:
    """The real replay, held at its start until released (to see the cycle go on without it)."""

    name = NAME

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.inner = ESTIMATORS[NAME]

    def compute(self, snapshot: Any, eligibility: Any, calibration: Any) -> Any:
        self.entered.set()
        assert self.release.wait(60), "never released"
        return self.inner.compute(snapshot, eligibility, calibration)


def test_the_main_cycle_never_waits_for_the_replay(tmp_path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'job.sqlite'}")
    held = ESTIMATORS[NAME] = _Held()
    tracker = forecast_tracker(store, replay_every=0.001)
    tracker.lane.start()
    try:
        t0 = float(round(time.time()))
        for k, ids in enumerate(("ab", "abc", "abcd")):
            snap = _snapshot(t0 + 5 * k, [_req(r, t0) for r in ids])
            report = run_cycle(lambda _now, s=snap: s, store, lambda n=t0 + 5 * k: n, forecasts=tracker)
            assert report.ok and report.published == len(ids)
            assert held.entered.wait(60)  # the replay of the first cycle is running, and stays held
        assert not held.release.is_set() and store.read_status("d") is not None
        assert _forecast(tracker.recorder.backend, "a") is None
    finally:
        held.release.set()
        tracker.lane.stop()
        store.close()
    # The held replay recorded its own cycle's requests; the latest offer (the third cycle) ran after it.
    assert tracker.lane.replays == 2 and tracker.lane.owed().empty
    assert _forecast(tracker.recorder.backend, "a")["late_s"] == 0.0
    assert _forecast(tracker.recorder.backend, "c")["late_s"] == 5.0


def test_an_offer_without_deferred_inputs_is_never_taken() -> None:
    from vecsched.service.replay_lane import ReplayLane

    lane = ReplayLane(ForecastRecorder(MemoryPairs()), (NAME,), every=0.0)
    snap = _snapshot(1000.0, [_req("a", 1000.0)])
    assert not lane.offer(snap, vecsched.estimate(snap), 1000.0)  # the replay ran in the cycle
    assert lane.offer(snap, vecsched.estimate(snap, defer=(NAME,)), 1000.0)


def test_run_service_starts_and_stops_the_lane(tmp_path, monkeypatch) -> None:
    from vecsched.service.replay_lane import ReplayLane

    calls = []
    for method in ("start", "stop"):
        real = getattr(ReplayLane, method)
        monkeypatch.setattr(ReplayLane, method, lambda self, _real=real, _name=method: (calls.append(_name), _real(self)))
    stop = threading.Event()
    stop.set()
    run_service(lambda now: _snapshot(now, []), SQLStore(f"sqlite:///{tmp_path / 's.sqlite'}"), stop=stop,
                install_signals=False, replay_every=60.0)
    assert calls == ["start", "stop"]
    assert not [t for t in threading.enumerate() if t.name == "vecsched-replay"]


def test_replay_every_setting() -> None:
    from vecsched.errors import UserError
    from vecsched.service.config import replay_every

    assert replay_every({"VECSCHED_REPLAY_EVERY": " 120 "}) == 120.0 and replay_every({}) is None
    for bad in ("0", "-5", "soon", "inf"):
        with pytest.raises(UserError):
            replay_every({"VECSCHED_REPLAY_EVERY": bad})


def test_cli_replay_every_implies_the_replay_and_runs_it_off_the_cycle(monkeypatch, tmp_path) -> None:
    from vecsched.cli import main
    from vecsched.service import job

    seen: dict[str, Any] = {}

    def fake_service(load: Any, store: Any, **kwargs: Any) -> None:
        seen.update(kwargs, registered=NAME in ESTIMATORS)

    replay.disable()
    monkeypatch.setattr(job, "run_service", fake_service)
    db = f"sqlite:///{tmp_path / 'h.sqlite'}"
    assert main(["run", "--no-demo", "--db", db, "--replay-every", "90"]) == 0
    assert seen["replay_every"] == 90.0 and seen["registered"]
    replay.disable()
    monkeypatch.setenv("VECSCHED_REPLAY_EVERY", "45")
    assert main(["run", "--no-demo", "--db", db]) == 0
    assert seen["replay_every"] is None and not seen["registered"]  # the setting alone turns nothing on
    assert main(["run", "--no-demo", "--db", db, "--replay"]) == 0
    assert seen["replay_every"] == 45.0


def test_an_estimate_that_cannot_defer_keeps_the_replay_in_the_cycle_and_owes_nothing(tmp_path) -> None:
    from vecsched.service.forecast_job import ForecastTracker
    from vecsched.service.replay_lane import ReplayLane

    recorder = ForecastRecorder(MemoryPairs())
    tracker = ForecastTracker(recorder, lane=ReplayLane(recorder, (NAME,), every=0.0))
    snap = _snapshot(1000.0, [_req("a", 1000.0)])
    store = SQLStore(f"sqlite:///{tmp_path / 'job.sqlite'}")
    # An estimate without forecast_skip/defer: the tracker cannot ask it to defer the replay.
    report = run_cycle(lambda _now: snap, store, lambda: 1000.0, estimate=lambda s: vecsched.estimate(s),
                       forecasts=tracker)
    store.close()
    assert report.ok, report.error
    assert tracker.lane.owed().empty and tracker.lane.run_pending() == 0
    recorded = _forecast(recorder.backend, "a")
    assert recorded["forecasted_at"] == 1000.0 and "late_s" not in recorded


def test_the_owed_list_stays_bounded() -> None:
    """Owed requests are let go once their record is gone (expiry + grace), and all of them when no
    deferred estimator is registered (nothing could ever record them)."""
    from vecsched.service.replay_lane import ReplayLane

    lane = ReplayLane(ForecastRecorder(MemoryPairs(), grace=60.0), (NAME,), every=0.0)
    lane.owe(["a", "b"], ["text", "text"], np.array([1100.0, 2000.0]), 1000.0)
    lane.owe(["c"], ["text"], np.array([3000.0]), 1161.0)  # a: 1100 + 60 < 1161
    assert sorted(lane.owed().index) == ["b", "c"]
    replay.disable()
    snap = _snapshot(1200.0, [_req("b", 1200.0), _req("c", 1200.0)])
    assert lane.offer(snap, vecsched.estimate(snap, defer=(NAME,)), 1200.0)
    assert lane.run_pending() == 0 and len(lane.owed()) == 0


def test_an_estimate_that_cannot_defer_runs_the_replay_itself(tmp_path) -> None:
    """A custom estimate taking forecast_skip and calibration but not defer is called without it."""
    seen = []

    def custom(snapshot, *, forecast_skip=None, calibration=None):
        seen.append(forecast_skip is not None)
        return vecsched.estimate(snapshot, forecast_skip=forecast_skip, calibration=calibration)

    tracker = forecast_tracker(SQLStore(f"sqlite:///{tmp_path / 'c.sqlite'}"), replay_every=60.0)
    snap = _snapshot(1000.0, [_req("a", 1000.0)])
    estimates = tracker.wrap(custom)(snap)
    assert seen == [True] and estimates.deferred is None and NAME in estimates.forecasts
    assert not tracker.lane.offer(snap, estimates, 1000.0)


def test_requests_still_owed_at_stop_are_recorded_missed() -> None:
    """At stop, what no replay reached is a miss (as at the end of a simulated run), never left for a
    restarted job to forecast from a later first sighting."""
    from vecsched.service.replay_lane import ReplayLane

    backend = MemoryPairs()
    lane = ReplayLane(ForecastRecorder(backend), (NAME,), every=60.0)
    lane.owe(["a"], ["text"], np.array([2000.0]), 1000.0)
    lane.owe(["b"], ["text"], np.array([2000.0]), 1005.0)
    lane.stop()
    assert len(lane.owed()) == 0
    for rid, late in (("a", 5.0), ("b", 0.0)):
        doc = _forecast(backend, rid)
        assert doc["missed"] is True and doc["start_p50"] is None
        assert doc["forecasted_at"] == {"a": 1000.0, "b": 1005.0}[rid] and doc.get("late_s") == late


def test_a_first_sighting_the_store_missed_is_owed_to_the_lane_from_that_sighting(tmp_path) -> None:
    # A cycle that failed to record its new requests is retried by the next one, which stamps the
    # other estimators at the true first sighting (late_s after it); the lane was owed the request
    # at the retry's time, so the replay's forecast looked on time from a later snapshot.
    class DownOnce(MemoryPairs):
        down = True

        def write(self, writes: Any) -> Any:
            if self.down:
                self.down = False
                raise ConnectionError("the store is down")
            return super().write(writes)

    t0 = float(round(time.time()))
    tracker = forecast_tracker(SQLStore(f"sqlite:///{tmp_path / 'job.sqlite'}"), replay_every=1000.0)
    tracker.recorder.backend = backend = DownOnce()
    published = SQLStore(f"sqlite:///{tmp_path / 'pub.sqlite'}")
    for now in (t0, t0 + 30):
        snap = _snapshot(now, [_req("r1", t0)])
        run_cycle(lambda _now, s=snap: s, published, lambda n=now: n, forecasts=tracker)
    published.close()
    assert tracker.lane.owed().loc["r1", "first_seen"] == t0
    tracker.lane.run_pending()
    for name in (NAME, "eligible-share-v1"):
        forecast = _forecast(backend, "r1", name)
        assert (forecast["forecasted_at"], forecast["late_s"]) == (t0, 30.0), name
