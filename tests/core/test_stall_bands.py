"""Light priority bands summed in one pass (stall_sums._band_sums) or by a call each give the sums of the pairs."""

from __future__ import annotations

import pytest

from vecsched.core import stall_sums

from .test_stall_sums import test_binned_and_dominance_sums_equal_the_pairs as _equal_the_pairs


@pytest.mark.parametrize("bands", ["one_pass", "a_call_each"])
@pytest.mark.parametrize("seed", range(60))
def test_sums_equal_the_pairs_however_light_bands_are_summed(seed: int, bands: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The choice follows how many columns the light items fill (COMPACT_BELOW): all or none force either way.
    monkeypatch.setattr(stall_sums, "COMPACT_BELOW", 1.0 if bands == "one_pass" else -1.0)
    _equal_the_pairs(seed, "planned", monkeypatch)
