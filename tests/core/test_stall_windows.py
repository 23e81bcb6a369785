"""might_stall's two paths (SPEC section 7) meet at a request created exactly 300 s ago.

Requests created before now - 300 s share one window and midpoint; those
created later read sums below their own creation and midpoint. A request
created at now - 300 s exactly belongs to either path; each figure must equal
the scalar reference whichever it takes, with requests on both sides of the
edge, above and at the lowest priority.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import vecsched
from vecsched.reference import STALL_FIELDS, stall_one

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def at(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def horde(edge_priority: int) -> dict:
    """Two workers, pops and returns in both halves of every window, requests around the 300 s edge."""
    workers = [{"id": f"w{k}", "user_id": "owner", "gentype": "text", "last_check_in": at(5), "threads": 1,
                "speed": 20.0, "models": ["m"], "max_length": 512, "state": "s"} for k in (1, 2)]
    requests = [{"id": rid, "user_id": "u-" + rid, "gentype": "text", "created": at(ago), "expiry": at(-1200),
                 "n": 1, "extra_priority": prio, "models": ["m"], "max_length": 100}
                for rid, ago, prio in (("edge", 300, edge_priority), ("before", 300.5, 0), ("after", 299.5, 0),
                                       ("late", 100, 10), ("now", 0, 0))]
    dispatches, returns = [], []
    for k, ago in enumerate((299.75, 299.25, 250, 200, 160, 120, 60, 20, 3)):
        did = f"d{k}"
        dispatches.append({"dispatch_id": did, "worker_id": f"w{1 + k % 2}", "worker_state": "s",
                           "request_id": "gone-" + did, "request_created": at(ago + (1 if k % 3 else 200)),
                           "request_extra_priority": (0, 10, 20)[k % 3], "selected_from_priority_queue": False,
                           "priority_user_ids": [], "dispatched_at": at(ago), "assigned_work": 100.0 + k})
        if ago > 10:
            returns.append({"dispatch_id": did, "worker_id": f"w{1 + k % 2}", "returned_at": at(ago - 5)})
    # A pop at now of a request created at now: created at "now"'s creation, not after it.
    dispatches.append({"dispatch_id": "at-now", "worker_id": "w1", "worker_state": "s", "request_id": "gone-at-now",
                       "request_created": at(0), "request_extra_priority": 20, "selected_from_priority_queue": False,
                       "priority_user_ids": [], "dispatched_at": at(0), "assigned_work": 50.0})
    return {"format": "vecsched.snapshot/1", "now": at(0), "workers": workers, "requests": requests,
            "dispatches": dispatches, "capacity_returns": returns}


@pytest.mark.parametrize("edge_priority", [0, 10])
def test_a_request_created_exactly_300_s_ago_matches_the_reference(edge_priority: int) -> None:
    """Also a request created at now, with a pop whose request was created at the same instant."""
    snap = vecsched.load_snapshot(horde(edge_priority))
    assert snap.rejected == ()
    got = vecsched.estimate(snap).to_dict()["estimates"]
    for rid in ("edge", "before", "after", "late", "now"):
        want = stall_one(snap, rid)
        if rid != "now":  # the sums are exercised ("now" has a window of no length)
            assert want["returned_capacity"] > 0 and want["dispatch_opportunities"] > 0
        for name in STALL_FIELDS:
            assert got[rid][name] == pytest.approx(want[name]), (rid, name, got[rid][name], want[name])
