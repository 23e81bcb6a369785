"""might_stall's takeable signatures, ORed from each row's eligible workers, equal the eligibility stage's.

The image stage forms them itself (``Takes.takeable`` is formed only where
competition reads it); both follow the rule of SPEC section 3, end: a row
takes what the take classes of its eligible workers could take.
"""

from __future__ import annotations

import numpy as np
import pytest

import vecsched.core.estimate as estimate_module
from vecsched.core.stall_prefix import takeable_rows
from vecsched.synthetic import horde


@pytest.mark.parametrize("seed", range(3))
def test_takeable_rows_equal_the_eligibility_stage(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def check(columns, batch, snapshot, gentype, mine, elig, *found):
        rows = np.arange(elig.n_groups + elig.n_special)
        takes = elig.competition
        got = takeable_rows(elig.row_words(rows), takes.class_rows[takes.worker_class])
        assert np.array_equal(got, takes.takeable[rows])
        seen.append((gentype, elig.n_special))

    monkeypatch.setattr(estimate_module, "_stall", check)
    estimate_module.estimate(horde(workers=120, requests=1500, seed=seed))
    assert len(seen) == 2 and any(n_special for _, n_special in seen)


def test_either_way_of_forming_takeable_rows_gives_the_same_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    from vecsched.core import stall as stall_module
    from vecsched.synthetic_history import with_history

    snapshot = with_history(horde(workers=60, requests=600, seed=1), seed=1)
    by_workers = estimate_module.estimate(snapshot).columns
    monkeypatch.setattr(stall_module, "TAKEABLE_WORD_ORS", -1)  # always Takes.takeable
    by_keys = estimate_module.estimate(snapshot).columns
    for name in (*stall_module.INT_COLUMNS, *stall_module.FLOAT_COLUMNS, "might_stall", "stall_evidence"):
        assert np.array_equal(by_workers[name], by_keys[name]), name
    assert by_workers["arriving_work"].any()
