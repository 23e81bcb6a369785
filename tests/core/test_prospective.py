"""The prospective request is told what its first published estimate will say (SPEC section 6)."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vecsched
from vecsched.core.prospective import answer_prospective, build_prospective_state

from vecsched.testing.strategies import hordes, requests


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hordes(), st.data())
def test_answer_equals_the_estimate_once_created(doc, data):
    snapshot = vecsched.load_snapshot(doc)
    # Image requests are only answered when the cycle ran eligibility-aware image waits.
    state = build_prospective_state(snapshot, vecsched.estimate(snapshot, eligible_image_wait=True))
    ask = data.draw(requests(target_ids=[w["id"] for w in doc["workers"]] + ["ghost"]))
    ask.update(id="zz-prospective", n=1, active=True, faulted=False, created=doc["now"])
    ask["expiry"] = "2999-01-01T00:00:00Z"
    answer = answer_prospective(state, ask)
    created = copy.deepcopy(doc)
    created["requests"].append(ask)
    row = vecsched.estimate(vecsched.load_snapshot(created), eligible_image_wait=True).to_frame().loc["zz-prospective"]
    assert answer["eligible_workers"] == row.eligible_workers
    assert answer["eligible_worker_threads"] == row.eligible_worker_threads
    if row.eligible_worker_threads == 0:
        assert answer["ahead_wait"] is None
    elif math.isnan(row.ahead_wait):
        assert answer["ahead_wait"] is None
    else:
        assert answer["ahead_wait"] == pytest.approx(row.ahead_wait, rel=1e-9, abs=1e-9)
        assert answer["queue_position"] == row.queue_position


def test_image_is_not_answered_without_eligibility_aware_image_waits():
    doc = {"format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z",
           "workers": [{"id": "w", "user_id": "u", "gentype": "image", "models": ["m"],
                        "last_check_in": "2026-11-29T11:59:00Z", "bridge_agent": "AI Horde Worker reGen:9:x"}]}
    snapshot = vecsched.load_snapshot(doc)
    ask = {"gentype": "image", "models": ["m"]}
    assert answer_prospective(build_prospective_state(snapshot), ask)["ahead_wait"] is None
    aware = build_prospective_state(snapshot, vecsched.estimate(snapshot, eligible_image_wait=True))
    assert answer_prospective(aware, ask) == {
        "eligible_workers": 1, "eligible_worker_threads": 1, "ahead_wait": 0.0, "queue_position": 0}


def test_a_bad_prospective_request_is_named():
    snapshot = vecsched.load_snapshot({"format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z"})
    with pytest.raises(vecsched.SnapshotError, match="max_length"):
        answer_prospective(build_prospective_state(snapshot), {"gentype": "text", "max_length": -5})
