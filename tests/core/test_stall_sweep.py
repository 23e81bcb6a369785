"""The row sweep of rare columns (stall_sums._row_sweep) and the binned table give the same sums as the pairs."""

from __future__ import annotations

import pytest

from vecsched.core import stall_sums

from .test_stall_sums import test_binned_and_dominance_sums_equal_the_pairs as _equal_the_pairs


@pytest.mark.parametrize("sweep", ["never", "always", "always_in_segments"])
@pytest.mark.parametrize("read", ["planned", "per_query", "product"])
@pytest.mark.parametrize("seed", range(60))
def test_sums_equal_the_pairs_whichever_items_are_swept(seed: int, read: str, sweep: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # A free sweep takes every item; a dear one none, so the table alone answers (as before the sweep existed).
    monkeypatch.setattr(stall_sums, "COSTS", dict(stall_sums.COSTS, sweep=1e12 if sweep == "never" else 0.0))
    if sweep == "always_in_segments":  # byte tables of eight items at a time, rows one at a time
        monkeypatch.setattr(stall_sums, "SWEEP_TABLE_CELLS", 1)
        monkeypatch.setattr(stall_sums, "SWEEP_CELLS", 1)
    _equal_the_pairs(seed, read, monkeypatch)
