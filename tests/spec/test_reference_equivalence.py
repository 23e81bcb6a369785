"""The vectorized estimate equals the scalar reference, field by field, on drawn hordes.

Run more examples with ``VECSCHED_EQUIVALENCE_EXAMPLES=5000 python -m pytest
tests/test_reference_equivalence.py``; never fewer than 500.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, note, settings

from vecsched.testing.strategies import hordes

import vecsched  # noqa: E402
from vecsched.reference import FIELDS, estimate_reference  # noqa: E402

settings.register_profile(
    "vecsched-equivalence",
    max_examples=max(500, int(os.environ.get("VECSCHED_EQUIVALENCE_EXAMPLES", "500"))),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
EQUIVALENCE = settings.get_profile("vecsched-equivalence")

INT_FIELDS = {
    "eligible_workers",
    "eligible_worker_threads",
    "queue_position",
    "horde_queue_position",
    "waiting",
    "processing",
    "finished",
    "restarted",
}
FLOAT_FIELDS = {"wait_time", "ahead_wait", "horde_wait_time"}


def vectorized_frame(snapshot: vecsched.Snapshot, eligible_image_wait: bool) -> pd.DataFrame:
    from vecsched.core.estimate import estimate

    return estimate(snapshot, eligible_image_wait=eligible_image_wait).to_frame()


def same_value(name: str, a: Any, b: Any) -> bool:
    if name in FLOAT_FIELDS:
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        # rel 1e-9; the tiny absolute slack covers results that cancel to ~0
        # (remaining in-flight time), where summation order alone moves the last bits.
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if name in INT_FIELDS:
        return int(a) == int(b)
    if name == "gentype":
        return str(a) == str(b)
    return bool(a) == bool(b)


def first_difference(got: pd.DataFrame, want: pd.DataFrame) -> str | None:
    """A readable description of the first request whose figures differ, or None."""
    if list(got.index) != list(want.index):
        return f"request ids differ:\n  vectorized {list(got.index)}\n  reference  {list(want.index)}"
    missing = [f for f in FIELDS if f not in got.columns]
    if missing:
        return f"vectorized frame lacks columns {missing}"
    for rid in want.index:
        g, w = got.loc[rid], want.loc[rid]
        bad = [f for f in FIELDS if not same_value(f, g[f], w[f])]
        if bad:
            lines = [f"request {rid!r}: {len(bad)} field(s) differ"]
            for f in FIELDS:
                mark = "  <--" if f in bad else ""
                lines.append(f"  {f:24} vectorized={g[f]!r:24} reference={w[f]!r}{mark}")
            return "\n".join(lines)
    return None


def check_dtypes(got: pd.DataFrame, want: pd.DataFrame) -> None:
    for name in INT_FIELDS:
        assert np.issubdtype(got[name].dtype, np.integer), (name, got[name].dtype)
        assert want[name].dtype == np.int64
    for name in FLOAT_FIELDS:
        assert got[name].dtype == np.float64 and want[name].dtype == np.float64, name
    for name in ("is_possible", "fallback"):
        assert got[name].dtype == bool and want[name].dtype == bool, name


@pytest.mark.parametrize("eligible_image_wait", [False, True], ids=["image-horde-wide", "image-eligible"])
@EQUIVALENCE
@given(doc=hordes())
def test_vectorized_equals_reference(doc: dict[str, Any], eligible_image_wait: bool) -> None:
    note(json.dumps(doc))
    snapshot = vecsched.load_snapshot(doc)
    assert not snapshot.rejected, [str(e) for e in snapshot.rejected]
    want = estimate_reference(snapshot, eligible_image_wait=eligible_image_wait)
    got = vectorized_frame(snapshot, eligible_image_wait)
    diff = first_difference(got, want)
    assert diff is None, diff
    check_dtypes(got, want)


def test_difference_report_names_the_field() -> None:
    # The comparison itself must be able to fail: a changed float is reported.
    frame = pd.DataFrame(
        {f: [0] for f in FIELDS} | {"gentype": ["text"], "wait_time": [1.0], "ahead_wait": [np.nan],
                                    "horde_wait_time": [2.0], "is_possible": [True], "fallback": [False]},
        index=pd.Index(["r"], name="id"),
    )
    assert first_difference(frame, frame.copy()) is None
    other = frame.copy()
    other["wait_time"] = 1.0 + 1e-6
    assert "wait_time" in first_difference(other, frame)
    other = frame.copy()
    other["ahead_wait"] = 0.0
    assert "ahead_wait" in first_difference(other, frame)
