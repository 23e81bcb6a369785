"""The row sweep of rare columns (stall_sums._row_sweep) and the binned table give the same sums as the pairs."""

from __future__ import annotations

import pytest

from vecsched.core import stall_sums

from .test_stall_sums import test_binned_and_dominance_sums_equal_the_pairs as _equal_the_pairs


@pytest.mark.parametrize("sweep", ["never", "always"])
@pytest.mark.parametrize("read", ["planned", "per_query", "product"])
@pytest.mark.parametrize("seed", range(60))
def test_sums_equal_the_pairs_whichever_items_are_swept(seed: int, read: str, sweep: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # A free sweep takes every item; a dear one none, so the table alone answers (as before the sweep existed).
    monkeypatch.setattr(stall_sums, "COSTS", dict(stall_sums.COSTS, sweep=0.0 if sweep == "always" else 1e12))
    _equal_the_pairs(seed, read, monkeypatch)
