"""Shadow forecasts (SPEC section 8): the vectorized estimators equal the scalar reference."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings

import vecsched
from vecsched.core import forecasts as F
from vecsched.reference import FORECAST_FIELDS, forecasts_reference
from vecsched.testing.strategies import hordes

EXAMPLES = settings(
    max_examples=max(300, int(os.environ.get("VECSCHED_EQUIVALENCE_EXAMPLES", "300"))),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def check_equal(snapshot: vecsched.Snapshot) -> None:
    got = vecsched.estimate(snapshot).to_frame()
    want = forecasts_reference(snapshot)
    assert list(got.index) == list(want.index)
    for column in want.columns:
        for rid, w, g in zip(want.index, want[column], got[column]):
            if column.endswith("predicted_stall"):
                if bool(w) != bool(g):
                    # Only an exact tie of start p90 and expiry may flip on summation order.
                    p90 = want.loc[rid, column.replace("predicted_stall", "start_p90")]
                    left = snapshot.requests.expiry[list(snapshot.requests.id).index(rid)] - snapshot.now
                    assert math.isclose(p90, left, rel_tol=1e-9), (rid, column, g, w)
            else:
                assert _close(float(g), float(w)), (rid, column, g, w)


@EXAMPLES
@given(doc=hordes())
def test_forecasts_equal_reference(doc: dict) -> None:
    note(json.dumps(doc))
    check_equal(vecsched.load_snapshot(doc))


@pytest.mark.parametrize("path", ["_by_sets", "_by_blocks"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=hordes(max_workers=8, max_requests=14))
def test_both_summation_paths_equal_reference(doc: dict, path: str) -> None:
    # Each of the two ways of summing the shares must hold on its own.
    original = (F._by_sets, F._by_blocks)
    chosen = getattr(F, path)
    F._by_sets = F._by_blocks = chosen
    try:
        check_equal(vecsched.load_snapshot(doc))
    finally:
        F._by_sets, F._by_blocks = original


def _doc(workers, requests):
    return {"format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z", "workers": workers, "requests": requests}


def _worker(wid, models, speed=10.0, threads=1):
    return {"id": wid, "user_id": "o", "gentype": "text", "speed": speed, "threads": threads, "models": models,
            "last_check_in": "2026-11-29T11:59:30Z", "max_length": 512}


def _request(rid, models, created, n=1, length=100, expiry="2026-11-29T12:20:00Z"):
    return {"id": rid, "user_id": "u", "gentype": "text", "n": n, "max_length": length, "models": models,
            "created": created, "expiry": expiry}


def test_share_charges_only_the_shared_threads() -> None:
    # a is served by w1 (1 thread) and w2 (3 threads); b only by w2. b's wait counts
    # 3/4 of a's work: the share of a's threads that b's worker holds.
    snap = vecsched.load_snapshot(_doc(
        [_worker("w1", ["x"], threads=1), _worker("w2", ["x", "y"], threads=3)],
        [_request("a", ["x"], "2026-11-29T11:50:00Z", n=4, length=100),
         _request("b", ["y"], "2026-11-29T11:55:00Z", n=1, length=100)]))
    est = vecsched.estimate(snap)
    frame = est.to_frame()
    share = frame.loc["b"]
    # ahead: 3 jobs x 100 tokens = 300 tokens; throughput 30 tok/s, 3 threads, 3 jobs ahead
    assert share["forecast.eligible-share-v1.start_p50"] == pytest.approx(300 / 30)
    assert share["forecast.eligible-share-v1.completion_p50"] == pytest.approx(400 / 30)
    # compatible-queue-v1: horde-wide 400 tokens ahead at v=10 tok/s/thread x min(T=3, 4 jobs)
    assert share["forecast.compatible-queue-v1.start_p50"] == pytest.approx(400 / 30)
    assert share["forecast.compatible-queue-v1.completion_p50"] == pytest.approx(500 / 30)
    assert share["forecast.compatible-queue-v1.start_p90"] == pytest.approx(400 / 30 + 60)
    doc = est.to_dict()["estimates"]["b"]["forecasts"]
    assert set(doc) >= {"compatible-queue-v1", "eligible-share-v1"}
    assert set(doc["eligible-share-v1"]) == set(FORECAST_FIELDS)


def test_no_capacity_predicts_a_stall_with_null_figures() -> None:
    snap = vecsched.load_snapshot(_doc([_worker("w1", ["x"])], [_request("a", ["nobody"], "2026-11-29T11:50:00Z")]))
    entry = vecsched.estimate(snap).to_dict()["estimates"]["a"]["forecasts"]
    for name in ("compatible-queue-v1", "eligible-share-v1"):
        assert entry[name]["predicted_stall"] is True
        assert entry[name]["start_p50"] is None and entry[name]["completion_p90"] is None


def test_stall_when_p90_reaches_expiry() -> None:
    # start p50 = 0 (nothing ahead): p90 = 60 s. An expiry 59 s away is a predicted stall; 61 s is not.
    for seconds, stall in ((59, True), (61, False)):
        snap = vecsched.load_snapshot(_doc(
            [_worker("w1", ["x"])],
            [_request("a", ["x"], "2026-11-29T11:50:00Z", expiry=f"2026-11-29T12:0{seconds // 60}:{seconds % 60:02d}Z")]))
        f = vecsched.estimate(snap).forecasts
        for name in ("compatible-queue-v1", "eligible-share-v1"):
            assert bool(f[name].predicted_stall[0]) is stall, (name, seconds)


def test_registry_runs_an_added_estimator() -> None:
    class Constant:
        name = "constant-test"

        def compute(self, snapshot, eligibility, calibration):
            k = len(eligibility)
            return F.provisional(np.full(k, 5.0), np.full(k, float(calibration or 7.0)), eligibility.seconds_left)

    F.register(Constant())
    try:
        snap = vecsched.load_snapshot(_doc([_worker("w1", ["x"])], [_request("a", ["x"], "2026-11-29T11:50:00Z")]))
        est = vecsched.estimate(snap)
        assert est.to_dict()["estimates"]["a"]["forecasts"]["constant-test"]["completion_p50"] == 7.0
    finally:
        del F.ESTIMATORS["constant-test"]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=hordes(max_workers=8, max_requests=14))
def test_skipped_requests_change_nothing_for_the_others(doc: dict) -> None:
    # The job asks only for requests it has not recorded: the others' values must not move.
    snapshot = vecsched.load_snapshot(doc)
    full = vecsched.estimate(snapshot).to_frame()
    skip = list(full.index[::2])
    part = vecsched.estimate(snapshot, forecast_skip=skip).to_frame()
    keep = [rid for rid in full.index if rid not in skip]
    cols = [c for c in full.columns if c.startswith("forecast.")]
    pd_testing = __import__("pandas").testing
    pd_testing.assert_frame_equal(part.loc[keep, cols], full.loc[keep, cols], rtol=1e-9)
