"""Named might_stall scenarios (SPEC section 7): the properties the client guide promises.

Each starts from one horde where the signal is true and changes one thing.
The scalar reference must agree on each.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import vecsched
from vecsched.reference import stall_one

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def at(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def dispatch(did: str, ago: float, *, priority: int = 20, created_ago: float = 1000, work: float = 100.0,
             state: str = "s", **kw: Any) -> dict[str, Any]:
    row = {"dispatch_id": did, "worker_id": "w1", "worker_state": state, "request_id": "other-" + did,
           "request_created": at(created_ago), "request_extra_priority": priority,
           "selected_from_priority_queue": False, "priority_user_ids": [], "dispatched_at": at(ago),
           "assigned_work": work}
    row.update(kw)
    return row


def arrival(rid: str, created_ago: float, **kw: Any) -> dict[str, Any]:
    row = {"id": rid, "user_id": "u-" + rid, "gentype": "text", "created": at(created_ago), "expiry": at(-1200),
           "n": 1, "extra_priority": 20, "models": ["m"], "max_length": 500}
    row.update(kw)
    return row


def stalling() -> dict[str, Any]:
    """One single-thread worker kept busy by higher-priority work arriving in both halves.

    Returns: two in each half (100 tokens each); one higher-priority pop still
    active; queued arrivals ahead of i of 500 tokens in each half.
    """
    returned = [dispatch(f"d{k}", ago + 5) for k, ago in enumerate((290, 200, 100, 10))]
    returns = [{"dispatch_id": d["dispatch_id"], "worker_id": "w1", "returned_at": at(ago)}
               for d, ago in zip(returned, (290, 200, 100, 10))]
    return {
        "format": "vecsched.snapshot/1", "now": at(0),
        "workers": [{"id": "w1", "user_id": "owner", "gentype": "text", "last_check_in": at(5), "threads": 1,
                     "speed": 20.0, "models": ["m"], "max_length": 512, "state": "s"}],
        "requests": [
            {"id": "i", "user_id": "me", "gentype": "text", "created": at(900), "expiry": at(-600), "n": 1,
             "models": ["m"], "max_length": 100},
            arrival("a1", 250),
            arrival("a2", 60),
        ],
        "dispatches": returned + [dispatch("active", 3)],
        "capacity_returns": returns,
    }


def figures(doc: dict[str, Any], rid: str = "i") -> dict[str, Any]:
    snap = vecsched.load_snapshot(doc)
    assert snap.rejected == ()
    got = vecsched.estimate(snap).to_dict()["estimates"][rid]
    want = stall_one(snap, rid)
    for name in ("might_stall", "stall_evidence", "dispatch_opportunities", "lost_opportunities",
                 "returned_capacity", "active_preceding_dispatches", "arriving_work", "returned_work"):
        assert got[name] == want[name], (name, got[name], want[name])
    return got


def test_arrivals_outpacing_returns_in_both_halves_with_the_pool_occupied_is_flagged() -> None:
    got = figures(stalling())
    assert got["might_stall"] is True and got["stall_evidence"] == "arrival_outpaces_drain"
    assert got["dispatch_opportunities"] == got["lost_opportunities"] == 5
    assert got["returned_capacity"] == 4 and got["active_preceding_dispatches"] == 1
    assert got["arriving_work"] == 1000.0 and got["returned_work"] == 400.0


def test_a_pre_existing_backlog_cannot_trigger_it() -> None:
    doc = stalling()
    for r in doc["requests"][1:]:
        r["created"] = at(1000)  # the work ahead was there before the window
    got = figures(doc)
    assert got["might_stall"] is False and got["stall_evidence"] == "preceding_arrivals_not_outpacing_drain"
    assert got["arriving_work"] == 0.0


def test_a_burst_confined_to_one_half_cannot_trigger_it() -> None:
    doc = stalling()
    doc["requests"][1]["created"] = at(30)  # both arrivals in the second half
    got = figures(doc)
    assert got["might_stall"] is False and got["stall_evidence"] == "preceding_arrivals_not_outpacing_drain"
    assert got["arriving_work"] == 1000.0


def test_cancelled_unassigned_work_is_not_pressure() -> None:
    doc = stalling()
    doc["requests"][1]["active"] = False  # cancelled before any of it was handed out
    got = figures(doc)
    assert got["might_stall"] is False and got["arriving_work"] == 500.0


def test_history_from_a_workers_old_capability_state_is_ignored() -> None:
    doc = stalling()
    # A pop for lower-priority work would show i's turn can come...
    doc["dispatches"].append(dispatch("low", 20, priority=-5))
    assert figures(doc)["stall_evidence"] == "target_opportunity_seen"
    # ...unless it was popped with other models or another bridge than the worker has now.
    doc["dispatches"][-1]["worker_state"] = "old-models"
    assert figures(doc)["stall_evidence"] == "arrival_outpaces_drain"
    # The same holds for the pops that keep the pool occupied.
    doc = stalling()
    doc["dispatches"][-1]["worker_state"] = "old-models"
    assert figures(doc)["stall_evidence"] == "compatible_capacity_returning"


def test_a_return_whose_dispatch_is_unknown_fails_clear() -> None:
    doc = stalling()
    doc["capacity_returns"].append({"dispatch_id": "never-seen", "worker_id": "w1", "returned_at": at(40)})
    got = figures(doc)
    assert got["might_stall"] is False and got["stall_evidence"] == "incomplete_return_history"


def test_every_dispatch_in_the_window_is_evaluated() -> None:
    doc = stalling()
    many = [dispatch(f"p{k}", 1 + (k % 280), request_id=f"x{k}") for k in range(3000)]
    # The one pop that went to work behind i: last in the list and oldest in time.
    many.append(dispatch("behind", 299, priority=-5))
    doc["dispatches"] = many + doc["dispatches"]
    got = figures(doc)
    assert got["dispatch_opportunities"] == 3006 and got["lost_opportunities"] == 3005
    assert got["stall_evidence"] == "target_opportunity_seen"


def test_a_priority_pass_precedes_unless_it_names_the_owner() -> None:
    doc = stalling()
    doc["dispatches"].append(dispatch("pass", 20, priority=-5, selected_from_priority_queue=True,
                                      priority_user_ids=["someone-else"]))
    assert figures(doc)["stall_evidence"] == "arrival_outpaces_drain"
    doc["dispatches"][-1]["priority_user_ids"] = ["me"]
    assert figures(doc)["stall_evidence"] == "target_opportunity_seen"


def test_while_a_job_is_processing_it_is_false_with_null_evidence() -> None:
    doc = stalling()
    doc["requests"][0]["n"] = 1
    doc["jobs"] = [{"id": "j", "request_id": "i", "worker_id": "w1", "started": at(10), "state": "processing"}]
    got = figures(doc)
    assert got["might_stall"] is False and got["stall_evidence"] is None


@pytest.mark.parametrize(("change", "evidence"), [
    (lambda d: d["workers"][0].update(models=["other"]), "none_eligible"),
    (lambda d: d["requests"][0].update(created=at(100)), "insufficient_window"),
    (lambda d: d["capacity_returns"].__delitem__(slice(0, 2)), "insufficient_replacement"),
    (lambda d: d["dispatches"].pop(), "compatible_capacity_returning"),
])
def test_each_earlier_rule_fails_clear(change, evidence) -> None:
    doc = copy.deepcopy(stalling())
    change(doc)
    got = figures(doc)
    assert got["might_stall"] is False and got["stall_evidence"] == evidence
