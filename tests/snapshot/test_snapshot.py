"""The JSON interchange format round-trips exactly: to_dict -> load_snapshot -> to_dict."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, note, settings

from vecsched.testing.strategies import hordes

import vecsched  # noqa: E402
from vecsched.reference import estimate_reference  # noqa: E402

HAND_MADE: dict[str, Any] = {
    "format": "vecsched.snapshot/1",
    "now": "2026-11-29T12:00:00.250Z",
    "workers": [
        {"id": "w1", "user_id": "u1", "gentype": "text", "last_check_in": "2026-11-29T13:59:30+02:00",
         "models": ["Aeala/Enterredaas-33b", "m"], "speed": None, "chat_mode": "opt_in", "chat_max_length": 1024},
        {"id": "i1", "user_id": "u2", "gentype": "image", "last_check_in": "2026-11-29T11:59:59.5Z",
         "models": ["AAM XL"], "speed": 1234567.5, "bridge_agent": "AI Horde Worker reGen:9.1.0:https://x",
         "state": "abc", "extra_slow_worker": True, "max_pixels": 1048576},
    ],
    "requests": [
        {"id": "r1", "user_id": "c", "gentype": "text", "created": "2026-11-29T11:58:00Z",
         "expiry": "2026-11-29T12:18:00Z", "n": 2, "jobs": 3, "models": ["m"], "worker_ids": ["w1", "ghost"],
         "worker_blacklist": True, "is_chat": True, "extra_priority": -3},
        {"id": "r2", "user_id": "c", "gentype": "image", "created": "2026-11-29T11:58:00.001Z",
         "expiry": "2026-11-29T12:18:00Z", "n": 1, "source_processing": "outpainting", "post_processing": 2,
         "r2": False, "width": 768, "height": 1024, "steps": 7},
    ],
    "jobs": [{"id": "j1", "request_id": "r1", "worker_id": "ghost", "started": "2026-11-29T11:59:00Z",
              "state": "faulted"}],
    "excluded_pairs": [["w1", "r1"], ["ghost", "r2"]],
    "dispatches": [{"dispatch_id": "d1", "worker_id": "w1", "worker_state": "s1", "request_id": "r0",
                    "request_created": "2026-11-29T11:57:00Z", "request_extra_priority": 2,
                    "selected_from_priority_queue": True, "priority_user_ids": ["c", "x"],
                    "dispatched_at": "2026-11-29T11:58:30Z", "assigned_work": 80.0}],
    "capacity_returns": [{"dispatch_id": "d1", "worker_id": "w1", "returned_at": "2026-11-29T11:59:10Z"}],
}


def round_trip(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    first = vecsched.load_snapshot(doc)
    assert not first.rejected, [str(e) for e in first.rejected]
    once = first.to_dict()
    # Through JSON text, as a file would carry it.
    twice = vecsched.load_snapshot(json.loads(json.dumps(once))).to_dict()
    return once, twice


def test_hand_made_snapshot_round_trips_exactly() -> None:
    once, twice = round_trip(HAND_MADE)
    assert once == twice
    # Defaults were filled and values normalised on the way in.
    w1 = once["workers"][0]
    assert w1["last_check_in"] == "2026-11-29T11:59:30Z"
    assert w1["speed"] is None and w1["chat_max_length"] == 1024 and w1["chat_max_context_length"] == 2048
    assert once["now"] == "2026-11-29T12:00:00.250000Z"
    assert once["requests"][1]["created"] == "2026-11-29T11:58:00.001000Z"
    assert once["excluded_pairs"] == [["w1", "r1"], ["ghost", "r2"]]
    assert once["dispatches"] == HAND_MADE["dispatches"]


def test_file_round_trip(tmp_path: Path) -> None:
    snap = vecsched.load_snapshot(HAND_MADE)
    path = tmp_path / "snap.json"
    text = snap.to_json(path)
    assert path.read_text(encoding="utf-8") == text
    again = vecsched.load_snapshot(path)
    assert again.to_dict() == snap.to_dict()
    assert again.now == snap.now
    np.testing.assert_array_equal(again.workers.last_check_in, snap.workers.last_check_in)
    np.testing.assert_array_equal(again.requests.created, snap.requests.created)


def test_estimates_survive_the_round_trip() -> None:
    snap = vecsched.load_snapshot(HAND_MADE)
    again = vecsched.load_snapshot(snap.to_dict())
    pd.testing.assert_frame_equal(estimate_reference(again), estimate_reference(snap), check_exact=True)


def test_round_trip_detects_a_change() -> None:
    # The comparison must be able to fail: a one-microsecond change is visible.
    once, _ = round_trip(HAND_MADE)
    changed = json.loads(json.dumps(HAND_MADE))
    changed["requests"][1]["created"] = "2026-11-29T11:58:00.001001Z"
    assert round_trip(changed)[0] != once


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(doc=hordes())
def test_round_trip_property(doc: dict[str, Any]) -> None:
    note(json.dumps(doc))
    once, twice = round_trip(doc)
    assert once == twice
    snap = vecsched.load_snapshot(doc)
    again = vecsched.load_snapshot(once)
    assert again.now == snap.now
    for table in ("workers", "requests", "jobs"):
        a, b = getattr(snap, table), getattr(again, table)
        for name, col in a.columns.items():
            other = b.columns[name]
            if isinstance(col, vecsched.ListColumn):
                got = again.model_lists(table) if name == "models" else other.tolist()
                want = snap.model_lists(table) if name == "models" else col.tolist()
                assert got == want, (table, name)
            elif col.dtype.kind == "f":
                # Times and speeds come back bit for bit (NaN where null).
                assert np.array_equal(col, other, equal_nan=True), (table, name)
            else:
                assert np.array_equal(col, other), (table, name)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(doc=hordes())
def test_frames_are_readable_views(doc: dict[str, Any]) -> None:
    snap = vecsched.load_snapshot(doc)
    frames = snap.to_frames()
    assert len(frames["workers"]) == len(doc["workers"])
    assert len(frames["requests"]) == len(doc["requests"])
    assert frames["workers"]["models"].tolist() == [w["models"] for w in doc["workers"]]
    for w, speed in zip(doc["workers"], frames["workers"]["speed"].tolist()):
        assert (w["speed"] is None and math.isnan(speed)) or w["speed"] == speed


def test_a_snapshot_pickles_and_copies_and_estimates_the_same() -> None:
    # Analysts keep snapshots in notebooks and hand them to worker processes: unpickling a
    # table recursed without end (its column lookup ran before its columns were set).
    import copy
    import pickle

    from vecsched.synthetic import horde
    from vecsched.synthetic_history import with_history

    snapshot = with_history(horde(workers=30, requests=300, seed=4), seed=4)
    for again in (pickle.loads(pickle.dumps(snapshot)), copy.deepcopy(snapshot), copy.copy(snapshot)):
        assert again.to_dict() == snapshot.to_dict()
        assert vecsched.estimate(again).to_frame().equals(vecsched.estimate(snapshot).to_frame())


def test_a_wait_that_overflows_is_null_and_the_document_is_strict_json(tmp_path) -> None:
    # A legal speed of 5e-324 made the waits infinite, and to_json and `vecsched estimate` wrote the
    # bare token Infinity: JavaScript's JSON.parse, Go and jq refuse the whole document.
    import json

    import vecsched
    from vecsched.cli import main

    now = "2026-11-29T12:00:00Z"
    doc = {"format": "vecsched.snapshot/1", "now": now,
           "workers": [{"id": "w", "user_id": "u", "gentype": "text", "last_check_in": now, "models": ["m"],
                        "speed": 5e-324}, {"id": "v", "user_id": "u", "gentype": "image", "last_check_in": now,
                                           "speed": 1e308}, {"id": "x", "user_id": "u", "gentype": "image",
                                                             "last_check_in": now, "speed": 1e308}],
           "requests": [{"id": "r", "user_id": "q", "gentype": "text", "n": 1, "created": "2026-11-29T11:59:00Z",
                         "expiry": "2026-11-29T12:10:00Z", "models": ["m"]}]}

    def strict(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    estimates = vecsched.estimate(vecsched.load_snapshot(doc))
    parsed = json.loads(estimates.to_json(), parse_constant=strict)
    assert parsed["estimates"]["r"]["wait_time"] is None
    assert parsed["horde"]["image"]["mean_speed"] is None  # two speeds of 1e308 average to inf
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "e.json"
    assert main(["estimate", str(path), "-o", str(out)]) == 0
    json.loads(out.read_text(), parse_constant=strict)
