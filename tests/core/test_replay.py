"""dispatch-replay-v1: hand-computed tiny hordes, a plain scalar replay on random hordes, calibrated p90s."""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

import vecsched
from vecsched import reference as R
from vecsched.core import forecasts as F
from vecsched.core import replay as RP
from vecsched.core.calibration import LEVEL, calibrated_p90, conformal_quantile
from vecsched.snapshot.schema import IMAGE, TEXT
from vecsched.testing.strategies import histories, hordes


@pytest.fixture(autouse=True, scope="module")
def _replay_registered():
    """The replay is opt-in: registered for this module's tests only."""
    RP.enable()
    yield
    RP.disable()


NOW = "2026-11-29T12:00:00Z"
def _settings(**changes: Any) -> RP.ReplaySettings:
    """Replay settings without the served and calm views (weights 0) and one future: the plain replay the scalar reference replays."""
    return RP.ReplaySettings(**{"served_view": (0.0, 0.0), "calm_view": (0.0, 0.0), "spread": (1, 1), **changes})


PLAIN = _settings(arrival_window=0.0, poll=3.0, overhead=0.0)


def _t(seconds: float) -> str:
    from vecsched.snapshot.times import iso

    return iso(vecsched.load_snapshot(_doc([], [])).now + seconds)


def _doc(workers, requests, jobs=(), dispatches=()):  # type: ignore[no-untyped-def]
    return {"format": "vecsched.snapshot/1", "now": NOW, "workers": list(workers), "requests": list(requests),
            "jobs": list(jobs), "dispatches": list(dispatches)}


def _worker(wid, models, speed=10.0, threads=1, user="o"):  # type: ignore[no-untyped-def]
    return {"id": wid, "user_id": user, "gentype": "text", "speed": speed, "threads": threads, "models": models,
            "last_check_in": _t(-30), "max_length": 512}


def _request(rid, models, age, n=1, length=100, life=1200.0, user="u", priority=0):  # type: ignore[no-untyped-def]
    return {"id": rid, "user_id": user, "gentype": "text", "n": n, "max_length": length, "models": models,
            "created": _t(-age), "expiry": _t(-age + life), "extra_priority": priority}


def _replay(doc: dict, settings: RP.ReplaySettings = PLAIN) -> dict[str, dict[str, Any]]:
    """The replay's forecast per request id, run with ``settings``."""
    original = F.ESTIMATORS[RP.NAME]
    F.register(RP.DispatchReplayV1(settings=settings))
    try:
        est = vecsched.estimate(vecsched.load_snapshot(doc))
    finally:
        F.register(original)
    f = est.forecasts[RP.NAME]
    return {rid: f.row(k) for k, rid in enumerate(est.request_id)}


# -- hand-computed hordes ---------------------------------------------------------------------


def test_two_models_each_worker_takes_its_own_queue_in_order() -> None:
    # A (10 tok/s) serves m1: r1 0-10 s, r2 10-20 s. B (20 tok/s) serves m2: r3 0-10 s.
    doc = _doc([_worker("A", ["m1"]), _worker("B", ["m2"], speed=20.0)],
               [_request("r1", ["m1"], 60), _request("r2", ["m1"], 30), _request("r3", ["m2"], 10, length=200)])
    got = _replay(doc)
    assert [got[r]["start_p50"] for r in ("r1", "r2", "r3")] == [0.0, 10.0, 0.0]
    assert [got[r]["completion_p50"] for r in ("r1", "r2", "r3")] == [10.0, 20.0, 10.0]
    assert not any(got[r]["predicted_stall"] for r in got)


def test_jobs_in_flight_hold_their_thread_and_jobs_spread_over_threads() -> None:
    # A has 2 threads; one is busy 5 s more (a 100-token job started 5 s ago at 10 tok/s).
    # r1 has 3 jobs: 0-10 on the free thread, 5-15 on the other, 10-20 on the first again.
    doc = _doc([_worker("A", ["m"], threads=2)],
               [_request("r1", ["m"], 60, n=3), _request("old", ["m"], 300, n=0), _request("r2", ["m"], 10)],
               jobs=[{"id": "j", "request_id": "old", "worker_id": "A", "started": _t(-5), "state": "processing"}])
    got = _replay(doc)
    assert got["r1"]["start_p50"] == 0.0 and got["r1"]["completion_p50"] == 20.0
    assert got["r2"]["start_p50"] == 15.0 and got["r2"]["completion_p50"] == 25.0


def test_priority_then_age_and_the_priority_pass_first() -> None:
    # Queue order: hi (priority 100) before old before vip; A's priority pass takes vip first.
    dispatch = {"dispatch_id": "d", "worker_id": "A", "worker_state": "", "request_id": "x",
                "request_created": _t(-900), "request_extra_priority": 0, "selected_from_priority_queue": False,
                "priority_user_ids": ["vip"], "dispatched_at": _t(-100), "assigned_work": 1}
    doc = _doc([_worker("A", ["m"])],
               [_request("old", ["m"], 60), _request("hi", ["m"], 10, priority=100),
                _request("vip", ["m"], 5, user="vip")], dispatches=[dispatch])
    got = _replay(doc)
    assert [got[r]["start_p50"] for r in ("vip", "hi", "old")] == [0.0, 10.0, 20.0]
    doc["dispatches"] = []
    got = _replay(doc)
    assert [got[r]["start_p50"] for r in ("hi", "old", "vip")] == [0.0, 10.0, 20.0]


def test_a_request_that_expires_unstarted_is_a_stall_and_frees_its_turn() -> None:
    # A is busy until 10 s; r1 expires at 5 s: a stall, and r2 starts at 10 s, not 20 s.
    doc = _doc([_worker("A", ["m"])],
               [_request("r1", ["m"], 1195), _request("r2", ["m"], 60), _request("busy", ["m"], 1000, n=0)],
               jobs=[{"id": "j", "request_id": "busy", "worker_id": "A", "started": _t(0), "state": "processing"}])
    got = _replay(doc)
    assert got["r1"]["predicted_stall"] and got["r1"]["start_p50"] == 10.0
    assert got["r2"]["start_p50"] == 10.0 and not got["r2"]["predicted_stall"]


def test_a_start_within_the_stall_margin_of_expiry_is_a_stall_with_the_same_p50s() -> None:
    # One thread: r2 starts at 100 s with 380 s left, within 300 thread-seconds / 1 thread of its
    # expiry: a stall (text's default margin); r3 starts at 200 s with 530 s left: not one (it was
    # under the old 800).
    doc = _doc([_worker("A", ["m"], speed=1.0)],
               [_request("r1", ["m"], 30), _request("r2", ["m"], 20, life=400.0),
                _request("r3", ["m"], 10, life=540.0)])
    got = _replay(doc)
    assert [got[r]["start_p50"] for r in ("r1", "r2", "r3")] == [0.0, 100.0, 200.0]
    assert [got[r]["predicted_stall"] for r in ("r1", "r2", "r3")] == [False, True, False]
    # A narrower margin, none, or only image's: r2 is no stall, and no p50 moves.
    for margin in ((200.0, 0.0), (0.0, 0.0), (0.0, 300.0)):
        other = _replay(doc, _settings(arrival_window=0.0, poll=3.0, overhead=0.0, stall_margin=margin))
        assert not any(other[r]["predicted_stall"] for r in other)
        assert all(other[r]["start_p50"] == got[r]["start_p50"] and other[r]["completion_p50"] == got[r]["completion_p50"]
                   for r in got)


def test_a_request_cancelled_ahead_frees_its_place_and_keeps_its_own_forecast() -> None:
    # At 0.01 cancellations per second, the three leave at 96.2, 26.9 and 192.5 s (RP.leave_times).
    # A takes r1 at 0 (100 s); at 100 s r2 has been cancelled: it would have started then, and
    # r3 starts at 100 s instead of 200 s.
    doc = _doc([_worker("A", ["m"], speed=1.0)],
               [_request("r1", ["m"], 30), _request("r2", ["m"], 20), _request("r3", ["m"], 10)])
    plain = _replay(doc)
    assert [plain[r]["start_p50"] for r in ("r1", "r2", "r3")] == [0.0, 100.0, 200.0]
    got = _replay(doc, _settings(arrival_window=0.0, poll=3.0, overhead=0.0, cancel_hazard=(0.01, 0.0)))
    assert [got[r]["start_p50"] for r in ("r1", "r2", "r3")] == [0.0, 100.0, 100.0]
    assert not any(got[r]["predicted_stall"] for r in got)
    assert got["r3"]["completion_p50"] == 200.0 and got["r2"]["completion_p50"] >= 100.0
    # Image's hazard does not touch text; the calibration's hazard replaces the setting.
    assert _replay(doc, _settings(arrival_window=0.0, poll=3.0, overhead=0.0, cancel_hazard=(0.0, 0.01))) == plain
    original = F.ESTIMATORS[RP.NAME]
    F.register(RP.DispatchReplayV1(settings=_settings(arrival_window=0.0, poll=3.0, overhead=0.0)))
    try:
        est = vecsched.estimate(vecsched.load_snapshot(doc), calibration={RP.NAME: {"cancel_hazard": [0.01, 0.0]}})
    finally:
        F.register(original)
    assert est.forecasts[RP.NAME].start_p50.tolist() == [got[r]["start_p50"] for r in est.request_id]


def test_no_eligible_thread_is_unknown_and_a_stall() -> None:
    got = _replay(_doc([_worker("A", ["m"])], [_request("r", ["other"], 10)]))
    assert got["r"]["start_p50"] is None and got["r"]["completion_p50"] is None and got["r"]["predicted_stall"]


def test_no_eligible_thread_takes_the_waits_of_recent_requests_no_capacity_could_serve() -> None:
    from types import SimpleNamespace as P

    from vecsched.core.calibration import MIN_NO_CAPACITY, NO_CAPACITY_SOURCE, from_pairs

    doc = _doc([_worker("A", ["m"])], [_request("served", ["m"], 10), _request("r", ["other"], 10)])
    # compatible-queue-v1's null forecasts (no capacity when seen) that did start, 100-199 s later, and their
    # completions; the replay's own pairs leave the served request's forecast as it was.
    unserved = [P(estimator=NO_CAPACITY_SOURCE, gentype="text", phase=phase, p50=None, observed=float(o))
                for phase in ("start", "completion") for o in range(100 + (phase == "completion") * 50,
                                                                     200 + (phase == "completion") * 50)]
    plain = vecsched.estimate(vecsched.load_snapshot(doc)).forecasts[RP.NAME]
    est = vecsched.estimate(vecsched.load_snapshot(doc),
                            calibration={RP.NAME: from_pairs([], no_capacity=unserved, cancel_hazard=[0.0, 0.0])})
    f = est.forecasts[RP.NAME]
    at = {rid: k for k, rid in enumerate(est.request_id)}
    assert f.start_p50[at["r"]] == 149.5 and f.start_p90[at["r"]] == pytest.approx(189.1)
    assert f.completion_p50[at["r"]] == 199.5 and bool(f.predicted_stall[at["r"]])
    assert f.start_p50[at["served"]] == plain.start_p50[at["served"]]
    # Too few such outcomes (or none of the gentype): unknown, as without them.
    thin = from_pairs([], no_capacity=unserved[: MIN_NO_CAPACITY - 1], cancel_hazard=[0.0, 0.0])
    assert np.isnan(vecsched.estimate(vecsched.load_snapshot(doc), calibration={RP.NAME: thin})
                    .forecasts[RP.NAME].start_p50[at["r"]])


def test_recent_arrivals_repeat_forward_and_age() -> None:
    # A (1 tok/s) runs `late` (3 jobs of 100 s) from 0, then `new`, then `tail`.
    doc = _doc([_worker("A", ["m"], speed=1.0)],
               [_request("late", ["m"], 150, n=3, length=100), _request("new", ["m"], 100, length=100),
                _request("tail", ["m"], 50, length=100)])
    plain = _replay(doc)
    assert [plain[r]["start_p50"] for r in ("late", "new", "tail")] == [0.0, 300.0, 400.0]
    repeated = _replay(doc, _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=0.0))
    # Copies of `late` (+150 s), `new` (+200 s), `tail` (+250 s) all rank after the existing three.
    assert [repeated[r]["start_p50"] for r in ("late", "new", "tail")] == [0.0, 300.0, 400.0]
    # A high-priority arrival (`vip`, 10 s ago) jumps the queue, and so do its copies:
    # vip 0-100, late 100-300, vip's copy (arrived +290 s) 300-400, late 400-500,
    # new 500-600, vip's second copy (+590 s) 600-700, tail 700.
    doc["requests"].append(_request("vip", ["m"], 10, length=100, priority=10_000))
    jumped = _replay(doc, _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=0.0))
    assert jumped["vip"]["start_p50"] == 0.0
    assert [jumped[r]["start_p50"] for r in ("late", "new", "tail")] == [100.0, 500.0, 700.0]
    assert jumped["late"]["completion_p50"] == 500.0
    # With upstream's aging (+5/s for every waiting request) the copies, 300 s late,
    # rank 1,500 lower: still ahead of priority 0, so nothing changes here ...
    aged = _replay(doc, _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=5.0))
    assert [aged[r]["start_p50"] for r in ("late", "new", "tail")] == [100.0, 500.0, 700.0]
    # ... but at 40/s (12,000 per window) they fall behind everything waiting now.
    fast = _replay(doc, _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=40.0))
    assert [fast[r]["start_p50"] for r in ("late", "new", "tail")] == [100.0, 400.0, 500.0]


# -- the scalar replay ------------------------------------------------------------------------


def replay_reference(snapshot: Any, settings: RP.ReplaySettings) -> dict[str, dict[str, Any]]:
    """A plain replay, straight from the rules: every free thread scans every available request."""
    p = R.prepare(snapshot)
    out: dict[str, dict[str, Any]] = {}
    for gentype in ("text", "image"):
        out.update(_reference_gentype(snapshot, p, gentype, settings))
    return out


def _reference_gentype(snapshot: Any, p: Any, gentype: str, s: RP.ReplaySettings) -> dict[str, dict[str, Any]]:
    now = p.now
    workers = [w for w in p.workers if w["gentype"] == gentype and R.is_online(w, now) and not w["paused"]]
    waiting = [r for r in p.waiting if r["gentype"] == gentype]
    eligible = {r["id"]: {w["id"] for w in workers if R.is_eligible(w, r, p.ctx)} for r in waiting}
    started = {r["id"] for r in waiting if p.jobs_by_request.get(r["id"])}
    reach = [0.0 if r["id"] in started else r["expiry"] - now for r in waiting if eligible[r["id"]]]
    horizon = min(s.max_horizon, max(reach, default=0.0))
    entries = []  # [rank key, id, user, jobs, output, arrival, deadline, eligible]
    for pos, r in enumerate(waiting):
        deadline = math.inf if r["id"] in started else r["expiry"] - now
        entries.append([(-r["extra_priority"], r["created"] - now, pos, 0), r, r["n"], 0.0, deadline])
    for pos, r in enumerate(waiting):
        age = now - r["created"]
        if s.arrival_window <= 0 or age > s.arrival_window:
            continue
        k = 1
        while k * s.arrival_window - age <= horizon:
            shift = k * s.arrival_window
            key = (-(r["extra_priority"] - s.aging_per_second * shift), shift - age, len(waiting) + pos, math.inf)
            entries.append([key, r, r["jobs"], shift - age, shift - age + r["expiry"] - r["created"]])
            k += 1
    entries.sort(key=lambda e: e[0])
    return _reference_loop(snapshot, p, workers, entries, eligible, started, horizon, s)


def _seconds(output: float, speed: float) -> float:
    return output / speed if speed > 0 else math.inf


def _reference_leave(entries, hazard):  # type: ignore[no-untyped-def]
    """When each entry (in queue order) is cancelled: the k-th takes the k-th golden-ratio quantile."""
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    out = []
    for k, e in enumerate(entries):
        u = ((k + 1) * golden) % 1.0
        out.append(math.inf if hazard <= 0 or math.isinf(e[4]) else e[3] - math.log(1.0 - u) / hazard)
    return out


def _reference_timing(snapshot, workers, speed, gentype, s):  # type: ignore[no-untyped-def]
    """Speeds giving each worker's measured job durations, and the mean pop gap (ReplaySettings.measured_timing)."""
    code = TEXT if gentype == "text" else IMAGE
    returned = {c["dispatch_id"]: c["returned_at"] for c in R.event_rows(snapshot, "capacity_returns")}
    index = {w["id"]: k for k, w in enumerate(workers)}
    rows = [d for d in R.event_rows(snapshot, "dispatches") if d["worker_id"] in index]
    jobs = []  # (worker, seconds, nominal seconds, returned at)
    for d in rows:
        k = index[d["worker_id"]]
        if d["dispatch_id"] in returned and speed[k] > 0:
            seconds = returned[d["dispatch_id"]] - d["dispatched_at"]
            nominal = d["assigned_work"] * (1.0 if code == TEXT else 1e6) / speed[k]
            if seconds > 0 and nominal > 0:
                jobs.append((k, seconds, nominal, returned[d["dispatch_id"]]))
    if code not in s.measured_timing or not jobs:
        return speed, s.overhead
    pooled = sum(j[1] for j in jobs) / sum(j[2] for j in jobs)
    out = []
    for k, v in enumerate(speed):
        mine = [j for j in jobs if j[0] == k]
        prior = s.prior_jobs * (sum(j[2] for j in mine) / len(mine) if mine else 1.0)
        out.append(v / ((sum(j[1] for j in mine) + prior * pooled) / (sum(j[2] for j in mine) + prior)))
    gaps = []
    for k, _, _, back in jobs:
        later = [d["dispatched_at"] - back for d in rows if index[d["worker_id"]] == k and d["dispatched_at"] >= back]
        if later and min(later) <= s.gap_cap:
            gaps.append(min(later))
    return out, (sum(gaps) / len(gaps) if gaps else s.overhead)


def _reference_loop(snapshot, p, workers, entries, eligible, started, horizon, s):  # type: ignore[no-untyped-def]
    now = p.now
    index = {w["id"]: k for k, w in enumerate(workers)}
    speed, overhead = _reference_timing(snapshot, workers, [R.effective_speed(w) for w in workers],
                                        workers[0]["gentype"] if workers else "text", s)
    # A worker silent for longer than absent_after has left: it takes nothing.
    threads = [0 if s.absent_after is not None and now - w["last_check_in"] > s.absent_after else w["threads"]
               for w in workers]
    favoured: dict[str, tuple[float, list[str]]] = {}
    for d in R.event_rows(snapshot, "dispatches"):
        if d["worker_id"] not in favoured or d["dispatched_at"] >= favoured[d["worker_id"]][0]:
            favoured[d["worker_id"]] = (d["dispatched_at"], list(d.get("priority_user_ids") or []))
    heap = []
    for k, w in enumerate(workers):
        busy = sorted(max(0.0, _seconds(R.job_output(p.request_by_id[j["request_id"]]), speed[k]) - (now - j["started"]))
                      for j in p.jobs if j["worker_id"] == w["id"] and j["state"] == "processing"
                      and j["request_id"] in p.request_by_id)[: threads[k]]
        heap += [(t, k) for t in busy] + [(0.0, k)] * max(0, threads[k] - len(busy))
    heapq.heapify(heap)
    left = [e[2] for e in entries]
    start, done = [None] * len(entries), [-1.0] * len(entries)
    leave = _reference_leave(entries, s.cancel_hazard[0 if workers[0]["gentype"] == "text" else 1] if workers else 0.0)
    gone = [False] * len(entries)  # cancelled in the replay: start is when a thread reached it
    arrivals = sorted(e[3] for e in entries)
    while heap:
        t, k = heapq.heappop(heap)
        if t > horizon:
            break
        wid = workers[k]["id"]
        users = favoured.get(wid, ("", []))[1]
        while True:
            ok = [j for j, e in enumerate(entries) if left[j] > 0 and e[3] <= t and wid in eligible[e[1]["id"]]
                  and (start[j] is not None or e[4] > t) and not gone[j]]
            mine = [j for j in ok if entries[j][1]["user_id"] in users]
            pick = (mine or ok or [None])[0]
            if pick is None or start[pick] is not None or leave[pick] > t:
                break
            gone[pick], start[pick], left[pick] = True, t, 0
        if pick is None:
            later = [a for a in arrivals if a > t]
            heapq.heappush(heap, (max(t + s.poll, later[0]) if later else t + s.poll, k))
            continue
        start[pick] = t if start[pick] is None else start[pick]
        finish = t + (R.job_output(entries[pick][1]) / speed[k] if speed[k] > 0 else math.inf)
        done[pick] = max(done[pick], finish)
        left[pick] -= 1
        heapq.heappush(heap, (finish + overhead, k))
    code = 0 if not workers or workers[0]["gentype"] == "text" else 1
    margin = s.stall_margin[code] if code < len(s.stall_margin) else 0.0
    out = {}
    for j, e in enumerate(entries):
        if e[0][3] == math.inf:
            continue
        rid = e[1]["id"]
        # Started within stall_margin / (its eligible threads) seconds of expiry: a stall as well.
        threads = sum(int(w["threads"]) for w in workers if w["id"] in eligible[rid])
        near = margin > 0 and start[j] is not None and start[j] >= e[4] - margin / max(threads, 1)
        out[rid] = {"start": 0.0 if rid in started else start[j],
                    "done": done[j] if left[j] == 0 and not gone[j] else None,
                    "inflight": R.in_flight_part(e[1], p),
                    "stall": rid not in started and (start[j] is None or not eligible[rid] or near)}
    return out


def _check_against_reference(doc: dict, settings: RP.ReplaySettings) -> None:
    # The scalar replay repeats no served-at-once copies (their own tests pin them): the generated histories
    # pop requests that the queue no longer holds (processing, or of the other gentype), which would be such copies.
    settings = replace(settings, served_arrivals=())
    snapshot = vecsched.load_snapshot(doc)
    want = replay_reference(snapshot, settings)
    got = _replay(doc, settings)
    assert set(got) == set(want)
    for rid, w in want.items():
        g = got[rid]
        assert g["predicted_stall"] == w["stall"], (rid, g, w)
        if w["start"] is not None and not w["stall"]:
            assert g["start_p50"] == pytest.approx(w["start"], abs=1e-6), (rid, g, w)
        if w["done"] is not None and not w["stall"]:
            if math.isnan(w["inflight"]):  # a job of it on a worker measured at speed 0: unknown
                assert g["completion_p50"] is None, (rid, g, w)
            else:
                assert g["completion_p50"] == pytest.approx(max(w["done"], w["inflight"]), abs=1e-6), (rid, g, w)


REPLAYS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@REPLAYS
@given(doc=hordes(max_workers=6, max_requests=12))
def test_replay_equals_the_scalar_replay(doc: dict) -> None:
    note(json.dumps(doc))
    _check_against_reference(doc, _settings(arrival_window=0.0, poll=2.0, overhead=0.5))


@REPLAYS
@given(doc=hordes(max_workers=5, max_requests=10))
def test_replay_with_repeated_arrivals_equals_the_scalar_replay(doc: dict) -> None:
    note(json.dumps(doc))
    _check_against_reference(doc, _settings(arrival_window=400.0, poll=2.0, overhead=0.5, aging_per_second=5.0))


@REPLAYS
@given(data=st.data())
def test_measured_timing_and_absent_workers_equal_the_scalar_replay(data: st.DataObject) -> None:
    doc = data.draw(histories(data.draw(hordes(max_workers=5, max_requests=10))))
    note(json.dumps(doc))
    _check_against_reference(doc, _settings(arrival_window=400.0, poll=2.0, overhead=0.5, aging_per_second=5.0,
                                                    measured_timing=(TEXT, IMAGE), absent_after=120.0, gap_cap=10.0))


@REPLAYS
@given(doc=hordes(max_workers=5, max_requests=10))
def test_cancellations_equal_the_scalar_replay(doc: dict) -> None:
    note(json.dumps(doc))
    _check_against_reference(doc, _settings(arrival_window=400.0, poll=2.0, overhead=0.5, aging_per_second=5.0,
                                                    cancel_hazard=(2e-3, 2e-3)))


@pytest.fixture
def compiled_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every replay runs the numba-compiled loop (small ones run interpreted by default)."""
    from vecsched.core import replay_kernel as K

    monkeypatch.setattr(K, "COMPILE_FROM", 0)
    assert K.loop_for(0) is not K._KERNEL and "replay_loop" in K._compiled


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(doc=hordes(max_workers=5, max_requests=10))
def test_the_compiled_loop_equals_the_scalar_replay(compiled_loop: None, doc: dict) -> None:
    note(json.dumps(doc))
    _check_against_reference(doc, _settings(arrival_window=400.0, poll=2.0, overhead=0.5, aging_per_second=5.0,
                                                    cancel_hazard=(2e-3, 2e-3)))


@pytest.fixture
def walking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every column finds its next request by walking the queues' heads (by default only long lists do)."""
    from vecsched.core import replay_kernel as K

    monkeypatch.setattr(K, "WALK_FROM", 0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_walking_the_heads_equals_the_scalar_replay(walking: None, data: st.DataObject) -> None:
    doc = data.draw(histories(data.draw(hordes(max_workers=5, max_requests=10))))
    note(json.dumps(doc))
    _check_against_reference(doc, _settings(arrival_window=400.0, poll=2.0, overhead=0.5, aging_per_second=5.0,
                                                    cancel_hazard=(2e-3, 2e-3)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_compiled_loop_walking_the_heads_equals_the_scalar_replay(compiled_loop: None, walking: None,
                                                                      data: st.DataObject) -> None:
    doc = data.draw(histories(data.draw(hordes(max_workers=5, max_requests=10))))
    note(json.dumps(doc))
    _check_against_reference(doc, _settings(arrival_window=400.0, poll=2.0, overhead=0.5, aging_per_second=5.0,
                                                    cancel_hazard=(2e-3, 2e-3)))


@pytest.mark.parametrize("seed", [0, 1])
def test_walking_the_heads_and_scanning_the_lists_forecast_alike(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """A synthetic horde with a history (priority passes, served-at-once copies): every field equal, bit for bit."""
    from vecsched import synthetic
    from vecsched.core import replay_kernel as K
    from vecsched.synthetic_history import with_history

    snapshot = with_history(synthetic.horde(workers=30, requests=400, seed=seed), seed=seed)
    forecasts = []
    for walk_from in (0, 10 ** 9):
        monkeypatch.setattr(K, "WALK_FROM", walk_from)
        forecasts.append(vecsched.estimate(snapshot).forecasts[RP.NAME])
    walked, scanned = forecasts
    for name in ("start_p50", "start_p90", "completion_p50", "completion_p90", "predicted_stall"):
        np.testing.assert_array_equal(getattr(walked, name), getattr(scanned, name))


def test_lowest_bit_of_every_32_bit_word() -> None:
    from vecsched.core.replay_kernel import _lowest_bit

    rng = np.random.default_rng(0)
    words = np.concatenate([1 << np.arange(32), rng.integers(1, 1 << 32, 200)]).astype(np.int64)
    assert [_lowest_bit(w) for w in words] == [int(w & -w).bit_length() - 1 for w in words]


def _heads_and_members(heads: dict[int, int], column_queues: list[int], n_req: int = 200, n_q: int = 70):
    """Bit sets of the kernel for hand-placed heads (request -> its queue) and one column's queues."""
    from vecsched.core import replay_kernel as K

    words = np.zeros(n_req // K.WORD_BITS + 1, dtype=np.int64)
    summary = np.zeros(len(words) // K.WORD_BITS + 1, dtype=np.int64)
    queue_of = np.full(n_req, -1, dtype=np.int64)
    for r, q in heads.items():
        K._mark_head(K.BIG, r, words, summary)
        queue_of[r] = q
    member = K._member_bits(np.array([0, len(column_queues)]), np.array(column_queues, dtype=np.int64), n_q)
    return words, summary, member, queue_of


def test_the_walk_finds_the_columns_first_head_from_its_floor_and_gives_up_past_its_budget() -> None:
    from vecsched.core import replay_kernel as K

    # Heads 3 (queue 5), 40 (queue 9), 95 (queue 64, the column's) and 130 (queue 33, the column's).
    words, summary, member, queue_of = _heads_and_members({3: 5, 40: 9, 95: 64, 130: 33}, [33, 64])
    floor = np.zeros(1, dtype=np.int64)
    assert K._walk(0, 100, words, summary, floor, member, queue_of) == 64
    floor[0] = 96  # nothing of the column below 96: the walk starts there
    assert K._walk(0, 100, words, summary, floor, member, queue_of) == 33
    floor[0] = 0
    assert K._walk(0, 2, words, summary, floor, member, queue_of) == -1  # 3 and 40 and their words are past 2 steps
    K._mark_head(95, K.BIG, words, summary)  # queue 64 emptied: its word is zero again
    assert words[95 // K.WORD_BITS] == 0 and K._walk(0, 100, words, summary, floor, member, queue_of) == 33


def _dense_queues(q: Any, masks: np.ndarray, pass_worker: np.ndarray, pass_user: np.ndarray) -> tuple[np.ndarray, ...]:
    """The layout of ``RP._queues`` built the plain way: dense matrices, np.unique over rows, argsort."""
    names = list(q.user_names)
    codes = np.array([names.index(u) if u in names else -1 for u in pass_user], dtype=np.int64)
    wp_worker, wp_user = pass_worker[codes >= 0], codes[codes >= 0]
    favoured = np.zeros(len(names) + 1, dtype=bool)
    favoured[wp_user] = True
    user = np.where(favoured[q.user], q.user, -1)
    has = q.set_of >= 0
    pairs, inverse = np.unique(np.stack([q.set_of[has], user[has]], axis=1), axis=0, return_inverse=True)
    queue_of = np.full(len(q.set_of), -1, dtype=np.int64)
    queue_of[has] = inverse.ravel()
    capacity = np.bincount(queue_of[has], minlength=len(pairs))
    membership = masks[pairs[:, 0]].T
    first, column = RP.unique_rows(RP.pack_words(np.ascontiguousarray(membership)))
    c_idx, q_idx = np.nonzero(membership[first])
    cq_ptr = np.concatenate([[0], np.cumsum(np.bincount(c_idx, minlength=len(first)))])
    qq, qc = np.nonzero(membership[first].T)
    qc_ptr = np.concatenate([[0], np.cumsum(np.bincount(qq, minlength=len(pairs)))])
    w_idx, wq_idx = np.nonzero(membership)
    key = wp_worker * (len(names) + 1) + wp_user
    in_pass = (pairs[wq_idx, 1] >= 0) & np.isin(w_idx * (len(names) + 1) + pairs[wq_idx, 1], key)
    wp_ptr = np.concatenate([[0], np.cumsum(np.bincount(w_idx[in_pass], minlength=masks.shape[1]))])
    return (queue_of, np.cumsum(capacity) - capacity, capacity, column, cq_ptr, q_idx, qc_ptr, qc, wp_ptr,
            wq_idx[in_pass])


@pytest.mark.parametrize("n_sets, n_requests", [(12, 300), (6000, 40)])  # the second ranks its keys by sorting
def test_the_queue_layout_equals_the_dense_construction(n_sets: int, n_requests: int) -> None:
    rng = np.random.default_rng(n_sets)
    n_workers, n_users = 37, 9
    masks = rng.random((n_sets, n_workers)) < 0.3
    masks[:, 5] = masks[:, 6]  # workers 5 and 6 share a column
    user_names = np.array([f"u{k}" for k in range(n_users)], dtype=object)
    set_of = np.where(rng.random(n_requests) < 0.1, -1, rng.integers(0, n_sets, n_requests))
    user = np.where(rng.random(n_requests) < 0.1, -1, rng.integers(0, n_users, n_requests))  # -1: a served copy
    q = RP._Queue(rank_of_row=np.arange(n_requests), set_of=set_of, user=user, user_names=user_names,
                  **{k: np.zeros(n_requests) for k in ("jobs", "output", "arrival", "deadline", "leave")})
    pass_worker = np.sort(rng.integers(0, n_workers, 15))
    pass_user = np.array([f"u{k}" for k in rng.integers(0, n_users + 3, 15)], dtype=object)  # some wait for nothing
    got = RP._queues(q, masks, pass_worker, pass_user)
    want = _dense_queues(q, masks, pass_worker, pass_user)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_the_priority_pass_is_each_workers_latest_dispatch() -> None:
    doc = _doc([_worker("a", ["m"]), _worker("b", ["m"]), _worker("c", ["m"])], [],
               dispatches=[{"dispatch_id": "d1", "worker_id": "b", "request_id": "x", "request_created": _t(-300),
                            "priority_user_ids": ["old"], "dispatched_at": _t(-200), "assigned_work": 1},
                           {"dispatch_id": "d2", "worker_id": "b", "request_id": "y", "request_created": _t(-300),
                            "priority_user_ids": ["p", "q"], "dispatched_at": _t(-100), "assigned_work": 1},
                           {"dispatch_id": "d3", "worker_id": "zz", "request_id": "y", "request_created": _t(-300),
                            "priority_user_ids": ["z"], "dispatched_at": _t(-100), "assigned_work": 1}])
    snapshot = vecsched.load_snapshot(doc)
    worker, users = RP._priority_pass(snapshot, np.array(["c", "b", "a"], dtype=object))
    assert worker.tolist() == [1, 1] and users.tolist() == ["p", "q"]


# -- calibrated p90 ---------------------------------------------------------------------------


def _pairs(rng: np.random.Generator, n: int, gentype: str = "text", phase: str = "start") -> dict[str, np.ndarray]:
    """Pairs whose error grows with the p50 and shrinks with the eligible threads (as the replay's do)."""
    p50 = rng.uniform(0.0, 1500.0, n)
    threads = np.where(rng.random(n) < 0.2, 0, rng.integers(1, 40, n))  # a fifth on fallback
    spread = (30.0 + 0.6 * p50) / np.sqrt(1.0 + threads)
    observed = np.maximum(p50 + spread * rng.standard_normal(n) + 0.2 * spread, 0.0)
    return {"gentype": np.full(n, gentype, dtype=object), "phase": np.full(n, phase, dtype=object),
            "p50": p50, "observed": observed, "threads": threads}


def _coverage(p90: np.ndarray, observed: np.ndarray) -> float:
    return float(np.mean(observed <= p90))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_conformal_p90_covers_90_percent_where_the_provisional_margin_does_not(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Exchangeable pairs: the level is the coverage (the default's margin above 0.9 is for runs that differ).
    calibration = {"pairs": _pairs(rng, 20_000), "min_pairs": 100, "level": 0.9}
    fresh = _pairs(rng, 20_000)
    gentype = np.full(len(fresh["p50"]), TEXT)
    p90 = calibrated_p90(fresh["p50"], phase="start", gentype=gentype, calibration=calibration)
    assert 0.87 <= _coverage(p90, fresh["observed"]) <= 0.93
    # Per p50 band too: the cells condition on the p50 (thread counts in the pairs are ignored).
    for low, high in ((0, 60), (60, 300), (300, 900), (900, 2000)):
        band = (fresh["p50"] >= low) & (fresh["p50"] < high)
        assert 0.85 <= _coverage(p90[band], fresh["observed"][band]) <= 0.95, (low, high)
    provisional = F.provisional_p90(fresh["p50"])
    few = fresh["threads"] == 0
    assert not 0.85 <= _coverage(provisional[few], fresh["observed"][few]) <= 0.95


def test_calibration_keeps_gentypes_and_phases_apart_and_falls_back() -> None:
    rng = np.random.default_rng(5)
    text_start = _pairs(rng, 5_000)
    pairs = {k: np.asarray(v) for k, v in text_start.items()}
    p50 = np.array([100.0, 100.0, 100.0])
    gentype = np.array([TEXT, IMAGE, TEXT])
    got = calibrated_p90(p50, phase="start", gentype=gentype, calibration={"pairs": pairs})
    assert got[0] != 160.0 and got[1] == 160.0  # image: no pairs, provisional
    completion = calibrated_p90(p50, phase="completion", gentype=gentype,
                                calibration={"pairs": pairs})
    assert completion.tolist() == [160.0, 160.0, 160.0]  # no completion pairs
    scarce = calibrated_p90(p50, phase="start", gentype=gentype,
                            calibration={"pairs": pairs, "min_pairs": 100_000})
    assert scarce.tolist() == [160.0, 160.0, 160.0]
    assert calibrated_p90(p50, phase="start", gentype=gentype, calibration=None).tolist() == [160.0] * 3
    assert math.isinf(conformal_quantile(np.zeros(5)))


def test_the_replay_takes_its_p90_from_the_calibration_it_is_handed() -> None:
    doc = _doc([_worker("A", ["m"])], [_request("r1", ["m"], 60), _request("r2", ["m"], 30)])
    snap = vecsched.load_snapshot(doc)
    plain = vecsched.estimate(snap).forecasts[RP.NAME]
    assert plain.start_p90.tolist() == F.provisional_p90(plain.start_p50).tolist()
    n = 1_000
    pairs = {"gentype": ["text"] * n, "phase": ["start"] * n, "p50": np.full(n, 5.0),
             "observed": 5.0 + np.linspace(0.0, 20.0, n), "threads": np.ones(n, dtype=int)}
    tuned = vecsched.estimate(snap, calibration={RP.NAME: {"pairs": pairs}}).forecasts[RP.NAME]
    assert tuned.start_p50.tolist() == plain.start_p50.tolist()
    # The ceil(1001 x level)-th of 1,000 errors on a p50 of 5 s, as a ratio of p50 + 60 s (the log score).
    k = math.ceil(1001 * LEVEL)
    ratio = (5.0 + 60.0 + 20.0 * (k - 1) / 999) / 65.0
    assert tuned.start_p90 == pytest.approx((tuned.start_p50 + 60.0) * ratio - 60.0, abs=0.01)


def test_requests_served_at_once_repeat_forward_on_the_worker_that_took_them() -> None:
    # `gone` (created 100 s ago, priority 10,000) was popped by A 90 s ago and waits no more:
    # only the dispatch shows it. Its copies arrive at +200 s and +500 s and go first:
    # late 0-100, 100-200, copy 200-300, late 300-400, new 400-500, copy 500-600, tail 600.
    dispatch = {"dispatch_id": "d", "worker_id": "A", "worker_state": "", "request_id": "gone",
                "request_created": _t(-100), "request_extra_priority": 10_000, "selected_from_priority_queue": False,
                "priority_user_ids": [], "dispatched_at": _t(-90), "assigned_work": 100}
    doc = _doc([_worker("A", ["m"], speed=1.0)],
               [_request("late", ["m"], 150, n=3, length=100), _request("new", ["m"], 100, length=100),
                _request("tail", ["m"], 50, length=100)], dispatches=[dispatch])
    on = _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=0.0, served_arrivals=(TEXT,))
    got = _replay(doc, on)
    assert [got[r]["start_p50"] for r in ("late", "new", "tail")] == [0.0, 400.0, 600.0]
    assert got["late"]["completion_p50"] == 400.0
    off = _replay(doc, _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=0.0))
    assert [off[r]["start_p50"] for r in ("late", "new", "tail")] == [0.0, 300.0, 400.0]  # text: off by default



def test_served_at_once_copies_go_to_any_worker_offering_the_same_models_with_served_peers() -> None:
    # A and B both offer model `m`; B's max_length (50) keeps it off the waiting requests (length 100),
    # so only A serves `first` (3 jobs) and then `second`. `gone`, served at once by A, comes back at
    # +150 s: pinned to A it waits for A and takes its turn (first: 0-100, 100-200, copy 200-300,
    # first 300-400, second from 400); with served_peers B, idle, takes it at +150 and `second`
    # starts at 300.
    dispatch = {"dispatch_id": "d", "worker_id": "A", "worker_state": "", "request_id": "gone",
                "request_created": _t(-150), "request_extra_priority": 10_000, "selected_from_priority_queue": False,
                "priority_user_ids": [], "dispatched_at": _t(-140), "assigned_work": 100}
    short = dict(_worker("B", ["m"], speed=1.0), max_length=50)
    doc = _doc([_worker("A", ["m"], speed=1.0), short],
               [_request("first", ["m"], 400, n=3, length=100), _request("second", ["m"], 399, length=100)],
               dispatches=[dispatch])
    pinned = _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=0.0,
                               served_arrivals=(TEXT,), served_peers=())
    got = _replay(doc, pinned)
    assert (got["first"]["completion_p50"], got["second"]["start_p50"]) == (400.0, 400.0)
    got = _replay(doc, replace(pinned, served_peers=(TEXT,)))
    assert (got["first"]["completion_p50"], got["second"]["start_p50"]) == (300.0, 300.0)


def test_text_p50s_blend_in_the_served_view_and_stalls_stay_the_replays() -> None:
    # The doc of test_requests_served_at_once_repeat_forward_on_the_worker_that_took_them: this
    # replay (text: no served arrivals) starts new and tail at 300 and 400 s, the served view (the
    # copies of `gone` go first) at 400 and 600 s; 0.4 of the view: 340 and 480 s.
    dispatch = {"dispatch_id": "d", "worker_id": "A", "worker_state": "", "request_id": "gone",
                "request_created": _t(-100), "request_extra_priority": 10_000, "selected_from_priority_queue": False,
                "priority_user_ids": [], "dispatched_at": _t(-90), "assigned_work": 100}
    doc = _doc([_worker("A", ["m"], speed=1.0)],
               [_request("late", ["m"], 150, n=3, length=100), _request("new", ["m"], 100, length=100),
                _request("tail", ["m"], 50, length=100, life=560.0)], dispatches=[dispatch])
    plain = _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=0.0, stall_margin=(0.0, 0.0))
    own, view = _replay(doc, plain), _replay(doc, RP.served_view(plain, TEXT))
    assert [view[r]["start_p50"] for r in ("new", "tail")] == [400.0, 600.0]
    got = _replay(doc, replace(plain, served_view=(0.4, 0.0)))
    assert [got[r]["start_p50"] for r in ("late", "new", "tail")] == pytest.approx([0.0, 340.0, 480.0])
    assert got["new"]["completion_p50"] == pytest.approx(0.6 * own["new"]["completion_p50"]
                                                         + 0.4 * view["new"]["completion_p50"])
    # `tail` expires at +510 s: a stall in the view only, so not one here.
    assert view["tail"]["predicted_stall"] and not own["tail"]["predicted_stall"]
    assert [got[r]["predicted_stall"] for r in got] == [own[r]["predicted_stall"] for r in got]
    assert RP.ReplaySettings().served_view[TEXT] == 0.4 and RP.ReplaySettings().served_view[IMAGE] == 0.0


def test_p50s_blend_in_the_calm_view_without_repeated_arrivals() -> None:
    # test_recent_arrivals_repeat_forward_and_age's horde with `vip`: repeating the window, new and
    # tail start at 500 and 700 s (vip's copies jump ahead); without repeated arrivals (the calm
    # view) at 400 and 500 s; a quarter of the calm view: 475 and 650 s.
    doc = _doc([_worker("A", ["m"], speed=1.0)],
               [_request("late", ["m"], 150, n=3, length=100), _request("new", ["m"], 100, length=100),
                _request("tail", ["m"], 50, length=100), _request("vip", ["m"], 10, length=100, priority=10_000)])
    repeated = _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=0.0)
    calm = _replay(doc, replace(repeated, arrival_window=0.0))
    assert [calm[r]["start_p50"] for r in ("new", "tail")] == [400.0, 500.0]
    got = _replay(doc, replace(repeated, calm_view=(0.25, 0.0)))
    assert [got[r]["start_p50"] for r in ("late", "new", "tail")] == pytest.approx([100.0, 475.0, 650.0])
    assert RP.ReplaySettings().calm_view == (0.0, 0.25)  # image only by default


# -- a spread of futures (round 6) ------------------------------------------------------------


def test_one_future_is_the_plain_replay_and_the_first_future_is_unperturbed() -> None:
    doc = _doc([_worker("A", ["m"], speed=1.0), _worker("B", ["m"], speed=2.0, threads=2)],
               [_request("late", ["m"], 150, n=3, length=100), _request("new", ["m"], 100, length=100),
                _request("tail", ["m"], 50, length=100), _request("vip", ["m"], 10, length=100, priority=10_000)])
    repeated = _settings(arrival_window=300.0, poll=3.0, overhead=0.0, aging_per_second=5.0)
    plain = _replay(doc, repeated)
    assert _replay(doc, replace(repeated, spread=(1, 1))) == plain
    assert _replay(doc, replace(repeated, spread=(7, 7), spread_member=0)) == plain
    snapshot = vecsched.load_snapshot(doc)
    assert RP.futures(snapshot, TEXT, replace(repeated, spread=(1, 1)), np.ones(2, dtype=np.int64), 4, 900.0) == [RP.Future()]


def _churning_horde() -> dict:
    """Twelve text workers, three of them silent for 200 s (left lately), and a queue with recent arrivals."""
    workers = [_worker(f"w{k}", ["m"], speed=5.0 + k, threads=1 + k % 2) for k in range(12)]
    for w in workers[:3]:
        w["last_check_in"] = _t(-200)
    requests = [_request(f"r{k}", ["m"], 10 * k + 5, length=400, life=600.0, priority=k % 3) for k in range(30)]
    return _doc(workers, requests)


def test_the_futures_are_a_function_of_the_snapshot() -> None:
    doc = _churning_horde()
    s = _settings(arrival_window=150.0, spread=(7, 7))
    a, b = (RP.futures(vecsched.load_snapshot(doc), TEXT, s, np.arange(12) % 3, 20, 600.0) for _ in range(2))
    assert len(a) == 7 and a[0] == RP.Future()
    for x, y in zip(a[1:], b[1:]):
        assert x.rate == y.rate and np.array_equal(x.gone, y.gone) and np.array_equal(x.join_at, y.join_at)
        assert np.array_equal(x.join_worker, y.join_worker) and np.array_equal(x.speed, y.speed)
    # Some worker leaves in some future (3 of 12 left lately), and rates straddle 1.
    assert any(np.isfinite(f.gone).any() for f in a[1:])
    assert min(f.rate for f in a[1:]) < 1.0 < max(f.rate for f in a[1:])
    assert RP.churn_rate(vecsched.load_snapshot(doc), TEXT, s) == pytest.approx(3 / (180.0 * 9))
    assert _replay(doc, s) == _replay(doc, s)


def _two_requests_one_worker() -> dict:
    # A (1 tok/s) runs x 0-100 s; y (expires at 150 s) starts at 100 s, unless A leaves before.
    # The horizon is x's expiry, 180 s.
    return _doc([_worker("A", ["m"], speed=1.0)],
                [_request("x", ["m"], 20, length=100, life=200.0), _request("y", ["m"], 10, length=100, life=160.0)])


def test_the_stall_is_the_share_of_futures_in_which_the_request_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    # Five futures; in two of them A leaves at 50 s, so its thread, free at 100 s, takes nothing more
    # and y never starts (its start: the horizon, 180 s). Median start 100 s; a stall share 2/5.
    stays, leaves = RP.Future(), RP.Future(gone=np.array([50.0]))
    monkeypatch.setattr(RP, "futures", lambda *a, **k: [stays, leaves, stays, leaves, stays])
    doc = _two_requests_one_worker()
    base = _settings(arrival_window=0.0, poll=3.0, overhead=0.0, spread=(5, 5), stall_margin=(0.0, 0.0),
                     spread_quantile=0.5)
    gone = _replay(doc, replace(base, spread_member=1))
    assert gone["y"]["predicted_stall"] and gone["y"]["start_p50"] == 180.0
    at_40 = _replay(doc, replace(base, stall_share=0.4))
    assert at_40["y"]["predicted_stall"] and not at_40["x"]["predicted_stall"]
    assert at_40["y"]["start_p50"] == 100.0 and at_40["x"]["start_p50"] == 0.0
    at_50 = _replay(doc, replace(base, stall_share=0.5))
    assert not at_50["y"]["predicted_stall"]
    # The 0.8 quantile of the starts is a future where y never starts.
    assert _replay(doc, replace(base, spread_quantile=0.8))["y"]["start_p50"] == 180.0
    # Without a quantile the p50s are the first future's (the plain replay, in :func:`RP.futures`).
    monkeypatch.setattr(RP, "futures", lambda *a, **k: [leaves, stays, stays])
    assert _replay(doc, replace(base, spread_quantile=None))["y"]["start_p50"] == 180.0


def test_a_thread_that_joins_takes_the_next_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # A second thread of A's kind joins at 20 s and takes y at once.
    joined = RP.Future(join_at=np.array([20.0]), join_worker=np.array([0]))
    monkeypatch.setattr(RP, "futures", lambda *a, **k: [RP.Future(), joined])
    got = _replay(_two_requests_one_worker(), _settings(arrival_window=0.0, poll=3.0, overhead=0.0, spread=(2, 2),
                                                        spread_member=1))
    assert got["y"]["start_p50"] == 20.0 and got["y"]["completion_p50"] == 120.0


def _silenced(doc: dict, wid: str) -> dict:
    out = json.loads(json.dumps(doc))
    for w in out["workers"]:
        if w["id"] == wid:
            w["last_check_in"] = _t(-200)
    return out


def _leaves_at_once(wid: str) -> Any:
    def futures(snapshot: Any, gentype: int, settings: RP.ReplaySettings, *rest: Any) -> list[RP.Future]:
        rows = RP._worker_columns(snapshot, gentype, settings.absent_after)[0]
        gone = np.where(snapshot.workers.id[rows].astype(str) == wid, 0.0, np.inf)
        return [RP.Future(), RP.Future(gone=gone)]
    return futures


def _check_leaving(data: st.DataObject) -> None:
    doc = data.draw(hordes(max_workers=5, max_requests=10))
    online = [w["id"] for w in doc["workers"] if w.get("last_check_in", NOW) >= _t(-120)]
    assume(online)
    wid = data.draw(st.sampled_from(online))
    note(json.dumps(doc))
    s = _settings(arrival_window=400.0, poll=2.0, overhead=0.5, aging_per_second=5.0, absent_after=120.0)
    original = RP.futures
    RP.futures = _leaves_at_once(wid)
    try:
        got = _replay(doc, replace(s, spread=(2, 2), spread_member=1))
    finally:
        RP.futures = original
    assert got == _replay(_silenced(doc, wid), s)


@REPLAYS
@given(data=st.data())
def test_a_worker_that_leaves_at_once_is_a_worker_that_has_left(data: st.DataObject) -> None:
    _check_leaving(data)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_compiled_loop_drops_the_threads_of_a_worker_that_left(compiled_loop: None, data: st.DataObject) -> None:
    _check_leaving(data)
