"""Value rules shared by every source of rows: ranges, dtype limits, enum codes."""

from __future__ import annotations

import numpy as np
import pytest

import vecsched

NOW = "2026-11-29T12:00:00Z"


def _request(**fields):
    row = {"id": "r", "user_id": "u", "gentype": "text", "n": 1,
           "created": "2026-11-29T11:00:00Z", "expiry": "2026-11-29T13:00:00Z"}
    row.update(fields)
    return row


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"n": 2**31}, "n"),  # past int32: must not crash the load
        ({"max_length": 2**40}, "max_length"),
        ({"gentype": "image", "width": 2**32}, "width"),  # would wrap pixels to 0
        ({"gentype": "image", "steps": 10**6}, "steps"),
        ({"post_processing": 2**33}, "post_processing"),
    ],
)
def test_too_large_integers_are_row_errors(fields, field):
    snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1", "now": NOW,
                                   "requests": [_request(id="bad", **fields), _request(id="good")]})
    assert [(e.id, e.field) for e in snap.rejected] == [("bad", field)]
    assert list(snap.requests.id) == ["good"]


def test_from_columns_rejects_what_its_dtype_cannot_hold_instead_of_wrapping():
    snap = vecsched.Snapshot.from_columns(
        1e9,
        {"id": ["w1", "w2"], "user_id": ["u", "u"], "gentype": ["text", "text"],
         "last_check_in": [1e9, 1e9], "models": [["m"], ["m"]], "threads": np.array([2**32 + 1, 2])},
        {},
    )
    assert [(e.id, e.field) for e in snap.rejected] == [("w1", "threads")]
    assert snap.workers.threads.tolist() == [2] and snap.workers.threads.dtype == np.int32


@pytest.mark.parametrize("gentype", [np.array([0, 5], dtype=np.int8), ["text", "video"]])
def test_enum_codes_and_names_outside_the_choices_reject_only_their_row(gentype):
    snap = vecsched.Snapshot.from_columns(
        1e9,
        {"id": ["w1", "w2"], "user_id": ["u", "u"], "gentype": gentype,
         "last_check_in": [1e9, 1e9], "models": [["m"], ["m"]]},
        {},
    )
    assert [(e.id, e.field) for e in snap.rejected] == [("w2", "gentype")]
    assert list(snap.workers.id) == ["w1"]
