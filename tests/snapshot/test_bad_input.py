"""Bad rows are left out with an error naming row, id and field; the rest is unaffected.

And input that is not a snapshot at all fails with one clear message (exit 2
from the command line, no traceback).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import vecsched
from vecsched import SnapshotError
from vecsched.reference import estimate_reference


def at(hhmmss: str) -> str:
    return f"2026-11-29T{hhmmss}Z"


def base_horde() -> dict[str, Any]:
    """Three text workers, two image workers, five requests and jobs that all interact."""
    return {
        "format": "vecsched.snapshot/1",
        "now": at("12:00:00"),
        "workers": [
            {"id": "w1", "user_id": "u1", "gentype": "text", "last_check_in": at("11:59:00"), "models": ["m"], "speed": 12.0},
            {"id": "w2", "user_id": "u2", "gentype": "text", "last_check_in": at("11:59:30"), "models": ["m", "n"], "threads": 2},
            {"id": "w3", "user_id": "u3", "gentype": "text", "last_check_in": at("11:58:00"), "models": ["n"], "chat_mode": "opt_in"},
            {"id": "i1", "user_id": "u1", "gentype": "image", "last_check_in": at("11:59:00"), "models": ["AAM XL"],
             "bridge_agent": "AI Horde Worker reGen:9:x", "speed": 800000.0},
            {"id": "i2", "user_id": "u4", "gentype": "image", "last_check_in": at("11:59:00"), "models": ["AAM XL"],
             "bridge_agent": "AI Horde Worker reGen:9:x", "threads": 2},
        ],
        "requests": [
            {"id": "r1", "user_id": "c1", "gentype": "text", "created": at("11:50:00"), "expiry": at("12:20:00"), "n": 2, "models": ["m"]},
            {"id": "r2", "user_id": "c2", "gentype": "text", "created": at("11:51:00"), "expiry": at("12:20:00"), "n": 1,
             "models": ["n"], "is_chat": True, "max_length": 200},
            {"id": "r3", "user_id": "c1", "gentype": "text", "created": at("11:52:00"), "expiry": at("12:20:00"), "n": 1},
            {"id": "r4", "user_id": "c3", "gentype": "image", "created": at("11:53:00"), "expiry": at("12:20:00"), "n": 1,
             "models": ["AAM XL"]},
            {"id": "r5", "user_id": "c3", "gentype": "image", "created": at("11:54:00"), "expiry": at("12:20:00"), "n": 3},
        ],
        "jobs": [
            {"id": "j1", "request_id": "r1", "worker_id": "w1", "started": at("11:59:55")},
            {"id": "j2", "request_id": "r4", "worker_id": "i2", "started": at("11:59:58")},
            {"id": "j3", "request_id": "r3", "worker_id": "w2", "started": at("11:59:00"), "state": "finished"},
        ],
        "excluded_pairs": [["w2", "r3"]],
    }


# (case, table, position, bad row, field). Rows are inserted at ``position`` so the error's
# row number is checked to point into the file, not into the kept rows.
W = base_horde()["workers"][0]
R = base_horde()["requests"][0]
J = base_horde()["jobs"][0]
BAD_ROWS = [
    ("negative threads", "workers", 1, {**W, "id": "bad", "threads": -1}, "threads"),
    ("zero threads", "workers", 1, {**W, "id": "bad", "threads": 0}, "threads"),
    ("too many threads", "workers", 1, {**W, "id": "bad", "threads": 51}, "threads"),
    ("negative worker max_length", "workers", 2, {**W, "id": "bad", "max_length": -5}, "max_length"),
    ("negative chat_max_context_length", "workers", 2, {**W, "id": "bad", "chat_max_context_length": -1}, "chat_max_context_length"),
    ("negative max_pixels", "workers", 0, {**W, "id": "bad", "gentype": "image", "max_pixels": -1}, "max_pixels"),
    ("negative request max_length", "requests", 1, {**R, "id": "bad", "max_length": -1}, "max_length"),
    ("negative request max_context_length", "requests", 1, {**R, "id": "bad", "max_context_length": -2048}, "max_context_length"),
    ("negative n", "requests", 2, {**R, "id": "bad", "n": -1}, "n"),
    ("negative jobs", "requests", 2, {**R, "id": "bad", "jobs": -1}, "jobs"),
    ("negative width", "requests", 0, {**R, "id": "bad", "gentype": "image", "width": -512}, "width"),
    ("unknown worker gentype", "workers", 1, {**W, "id": "bad", "gentype": "video"}, "gentype"),
    ("unknown request gentype", "requests", 1, {**R, "id": "bad", "gentype": "audio"}, "gentype"),
    ("worker models not a list", "workers", 1, {**W, "id": "bad", "models": "m"}, "models"),
    ("request models not a list", "requests", 1, {**R, "id": "bad", "models": {"m": 1}}, "models"),
    ("model list with a number", "requests", 1, {**R, "id": "bad", "models": ["m", 7]}, "models"),
    ("infinite speed", "workers", 1, {**W, "id": "bad", "speed": float("inf")}, "speed"),
    ("NaN speed", "workers", 1, {**W, "id": "bad", "speed": float("nan")}, "speed"),
    ("negative speed", "workers", 1, {**W, "id": "bad", "speed": -3.0}, "speed"),
    ("speed as text", "workers", 1, {**W, "id": "bad", "speed": "fast"}, "speed"),
    ("unparsable created", "requests", 1, {**R, "id": "bad", "created": "yesterday"}, "created"),
    ("unparsable check-in", "workers", 1, {**W, "id": "bad", "last_check_in": "2026-13-45T99:00:00Z"}, "last_check_in"),
    ("check-in without zone", "workers", 1, {**W, "id": "bad", "last_check_in": "2026-11-29T11:59:00"}, "last_check_in"),
    ("expiry without zone", "requests", 1, {**R, "id": "bad", "expiry": "2026-11-29T12:20:00"}, "expiry"),
    ("job start without zone", "jobs", 1, {**J, "id": "bad", "started": "2026-11-29T11:59:55"}, "started"),
    ("unknown job state", "jobs", 1, {**J, "id": "bad", "state": "running"}, "state"),
    ("duplicate worker id", "workers", 3, {**W, "threads": 7, "speed": 99.0}, "id"),
    ("duplicate request id", "requests", 3, {**R, "n": 9, "extra_priority": 100}, "id"),
    ("duplicate job id", "jobs", 3, {**J, "request_id": "r2"}, "id"),
    ("six targeted workers", "requests", 1, {**R, "id": "bad", "worker_ids": ["w1", "w2", "w3", "a", "b", "c"]}, "worker_ids"),
    ("missing required id", "requests", 1, {k: v for k, v in R.items() if k != "id"}, "id"),
    ("missing required models", "workers", 1, {k: v for k, v in W.items() if k not in ("models", "id")} | {"id": "bad"}, "models"),
    ("bool as int", "workers", 1, {**W, "id": "bad", "threads": True}, "threads"),
]


def with_bad_row(table: str, position: int, row: dict[str, Any]) -> dict[str, Any]:
    doc = base_horde()
    doc[table].insert(position, copy.deepcopy(row))
    return doc


def frames(snapshot: vecsched.Snapshot) -> list[tuple[str, pd.DataFrame]]:
    from vecsched.core.estimate import estimate

    out = []
    for eiw in (False, True):
        out.append((f"reference eiw={eiw}", estimate_reference(snapshot, eligible_image_wait=eiw)))
        out.append((f"vectorized eiw={eiw}", estimate(snapshot, eligible_image_wait=eiw).to_frame()))
    return out


@pytest.mark.parametrize("case, table, position, row, field", BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_bad_row_is_named_and_left_out(case: str, table: str, position: int, row: dict[str, Any], field: str) -> None:
    doc = with_bad_row(table, position, row)
    snapshot = vecsched.load_snapshot(doc)
    assert len(snapshot.rejected) == 1, [str(e) for e in snapshot.rejected]
    error = snapshot.rejected[0]
    assert (error.table, error.row, error.field) == (table, position, field)
    expected_id = row.get("id") if isinstance(row.get("id"), str) else None
    assert error.id == expected_id
    text = str(error)
    assert f"{table}[{position}]" in text and repr(field) in text and error.message in text
    if expected_id is not None:
        assert repr(expected_id) in text
    # Every other row loads and every other request's figures are as if the bad row were absent.
    clean = vecsched.load_snapshot(base_horde())
    assert len(getattr(snapshot, table)) == len(getattr(clean, table))
    for (name, got), (_, want) in zip(frames(snapshot), frames(clean)):
        pd.testing.assert_frame_equal(got, want, check_exact=True, obj=name)


def test_bad_rows_in_several_tables_are_all_reported() -> None:
    doc = base_horde()
    doc["workers"].append({**W, "id": "bw", "threads": -1})
    doc["requests"].append({**R, "id": "br", "n": -1})
    doc["requests"].append("not an object")
    doc["jobs"].append({**J, "id": "bj", "started": "then"})
    doc["excluded_pairs"].append(["only-one"])
    snapshot = vecsched.load_snapshot(doc)
    found = {(e.table, e.row, e.field) for e in snapshot.rejected}
    assert found == {
        ("workers", 5, "threads"),
        ("requests", 5, "n"),
        ("requests", 6, "row"),
        ("jobs", 3, "started"),
        ("excluded_pairs", 1, "pair"),
    }
    clean = vecsched.load_snapshot(base_horde())
    for (name, got), (_, want) in zip(frames(snapshot), frames(clean)):
        pd.testing.assert_frame_equal(got, want, check_exact=True, obj=name)


def test_bad_row_from_columns_too() -> None:
    # The columnar path shares the value rules of the JSON path.
    snapshot = vecsched.Snapshot.from_columns(
        "2026-11-29T12:00:00Z",
        workers={
            "id": ["a", "b"], "user_id": ["u", "u"], "gentype": ["text", "text"],
            "last_check_in": [1.0, 2.0], "threads": [1, -4], "models": [["m"], ["m"]],
        },
        requests={},
    )
    assert [(e.table, e.row, e.id, e.field) for e in snapshot.rejected] == [("workers", 1, "b", "threads")]
    assert list(snapshot.workers.id) == ["a"]


# -- not a snapshot at all -------------------------------------------------------------------------

NOT_SNAPSHOTS = {
    "not json": "this is not json {",
    "json list": "[1, 2, 3]",
    "wrong format": json.dumps({"format": "vecsched.estimates/1", "now": "2026-11-29T12:00:00Z"}),
    "no format": json.dumps({"now": "2026-11-29T12:00:00Z", "workers": []}),
    "no now": json.dumps({"format": "vecsched.snapshot/1", "workers": []}),
    "now without zone": json.dumps({"format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00"}),
    "workers not a list": json.dumps({"format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z", "workers": {}}),
    "pairs not a list": json.dumps(
        {"format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z", "excluded_pairs": "w1,r1"}
    ),
    "binary": "\udcff\udcfe",
}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "snap.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return path


@pytest.mark.parametrize("case", sorted(NOT_SNAPSHOTS))
def test_not_a_snapshot_raises_one_clear_error(tmp_path: Path, case: str) -> None:
    path = write(tmp_path, case, NOT_SNAPSHOTS[case])
    with pytest.raises(SnapshotError) as info:
        vecsched.load_snapshot(path)
    message = str(info.value)
    assert message and "\n" not in message
    assert "Traceback" not in message


def test_missing_file_raises_snapshot_error(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="cannot read"):
        vecsched.load_snapshot(tmp_path / "absent.json")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vecsched", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("case", ["not json", "wrong format", "workers not a list", "missing file"])
def test_cli_exits_2_without_traceback_on_a_file_that_is_not_a_snapshot(tmp_path: Path, case: str) -> None:
    path = tmp_path / "absent.json" if case == "missing file" else write(tmp_path, case, NOT_SNAPSHOTS[case])
    result = run_cli("estimate", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vecsched: "), result.stderr


def test_cli_reports_bad_rows_and_estimates_the_rest(tmp_path: Path) -> None:
    doc = with_bad_row("requests", 1, {**R, "id": "bad", "n": -1})
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(doc))
    result = run_cli("estimate", str(path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "requests[1]" in result.stderr and "'bad'" in result.stderr and "'n'" in result.stderr
    estimates = json.loads(result.stdout)["estimates"]
    assert "bad" not in estimates and {"r1", "r2", "r3", "r4", "r5"} <= set(estimates)


def test_one_rows_nanoseconds_do_not_reject_another_rows_far_time() -> None:
    """A time with nanoseconds once put the whole column at nanosecond resolution, where 2999 overflows."""
    doc = base_horde()
    doc["requests"][0]["expiry"] = "2999-01-01T00:00:00Z"
    doc["requests"][1]["created"] = "2026-11-29T11:51:00.123456789Z"
    doc["requests"][2]["created"] = "now"
    snap = vecsched.load_snapshot(doc)
    assert [(e.id, e.field) for e in snap.rejected] == [("r3", "created")]
    expiry = dict(zip(snap.requests.id, snap.requests.expiry))
    created = dict(zip(snap.requests.id, snap.requests.created))
    assert expiry["r1"] == 32472144000.0 and created["r2"] == pd.Timestamp("2026-11-29T11:51:00.123456Z").timestamp()


def test_null_in_an_optional_field_is_its_default_as_sql_null_is() -> None:
    """Files written from data frames or database rows carry null for a gap: a null where no null is
    meant takes the field's default (the SQL loader's rule for NULL), and a null required field is
    "required"; speed keeps null's meaning (no samples)."""
    doc = base_horde()
    with_nulls = copy.deepcopy(doc)
    for row in with_nulls["workers"]:
        row.update({key: None for key in ("threads", "owner_trusted", "chat_mode", "max_pixels", "nsfw")
                    if key not in row})
    for row in with_nulls["requests"]:
        row.update({key: None for key in ("max_length", "slow_workers", "worker_ids", "kudos", "jobs")
                    if key not in row})
    with_nulls["workers"][0]["speed"] = None  # nullable: no samples, not the default
    doc["workers"][0].pop("speed")
    got, want = vecsched.load_snapshot(with_nulls), vecsched.load_snapshot(doc)
    assert list(got.rejected) == [] and list(want.rejected) == []
    for (name, left), (_, right) in zip(frames(got), frames(want)):
        pd.testing.assert_frame_equal(left, right, check_exact=True, obj=name)
    required = copy.deepcopy(doc)
    required["requests"][1]["created"] = None
    snap = vecsched.load_snapshot(required)
    assert [(e.id, e.field, e.message) for e in snap.rejected] == [("r2", "created", "is required")]
