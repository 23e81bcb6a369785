"""Merged worker columns (forecasts.merged_columns) against the shared threads they replace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vecsched import synthetic
from vecsched.core import forecasts as F
from tests.core.test_forecasts_rework import _queues


@st.composite
def sets_and_threads(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n_sets, width = draw(st.integers(1, 20)), draw(st.integers(1, 30))
    # Few distinct columns, so that workers alike are common.
    kinds = draw(hnp.arrays(bool, (n_sets, draw(st.integers(1, 6)))))
    masks = kinds[:, draw(hnp.arrays(np.int64, width, elements=st.integers(0, kinds.shape[1] - 1)))]
    threads = draw(hnp.arrays(np.int64, width, elements=st.integers(1, 50)))
    return masks, threads


@settings(max_examples=300, deadline=None)
@given(case=sets_and_threads(), merge_below=st.sampled_from([0.0, 0.5, 0.9, 1.0]))
def test_merged_columns_keep_every_shared_thread_count(case: tuple[np.ndarray, np.ndarray], merge_below: float) -> None:
    masks, threads = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(F, "MERGE_BELOW", merge_below)
        merged, summed = F.merged_columns(masks, threads)
    assert merged.dtype == bool and summed.dtype == np.float64 and merged.shape == (len(masks), len(summed))
    # Brute force: T(A_a & A_b) worker by worker, for every pair of sets.
    want = np.array([[sum(int(t) for t, x, y in zip(threads, a, b) if x and y) for b in masks] for a in masks])
    got = (merged * summed) @ merged.T.astype(np.float64)
    np.testing.assert_array_equal(got, want)
    if merged.shape[1] < masks.shape[1]:  # merged: no column twice, none empty
        assert merged.any(axis=0).all()
        assert len(np.unique(merged, axis=1).T) == merged.shape[1]


@pytest.mark.parametrize("wanted_share", [None, 0.01])
def test_merging_or_not_gives_the_same_sums(wanted_share: float | None) -> None:
    snapshot = synthetic.horde(workers=60, requests=1500, seed=5)
    for inp, new, _ in _queues(snapshot):
        m = len(new.rows)
        wanted = None if wanted_share is None else np.random.default_rng(0).random(m) < wanted_share
        sums = {}
        for merge_below in (0.0, 1.0):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(F, "MERGE_BELOW", merge_below)
                sums[merge_below] = F.shared_work_ahead(inp, new, wanted)
        for g, w in zip(sums[1.0], sums[0.0]):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-9)
