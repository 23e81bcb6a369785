"""The binned sums behind might_stall (SPEC section 7) equal a sum over every (query, item) pair."""

from __future__ import annotations

import numpy as np
import pytest

from vecsched.core import stall_sums
from vecsched.core.stall_sums import binned_sums, dominance_sums


def _brute(sets, query_row, query_level, query_x, item_col, item_level, item_x, weights) -> np.ndarray:
    out = np.zeros((len(weights),) + query_x.shape)
    for t in range(query_x.shape[0]):
        for q in range(query_x.shape[1]):
            held = sets[query_row[q], item_col] & (item_x < query_x[t, q]) & (item_level > query_level[q])
            out[:, t, q] = weights[:, held].sum(axis=1)
    return out


@pytest.mark.parametrize("read", ["planned", "per_query", "product"])
@pytest.mark.parametrize("seed", range(60))
def test_binned_and_dominance_sums_equal_the_pairs(seed: int, read: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Either way of reading the table, whatever the plan would choose.
    if read != "planned":
        costs = dict(stall_sums.COSTS, product=0.0 if read == "product" else 1e9)
        monkeypatch.setattr(stall_sums, "COSTS", costs)
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(1, 9), int(rng.choice([1, 3, 6, 60]))
    # Dense rows, and sparse ones read column by column, stored as they are or as their complement,
    # in one matrix or row by row.
    density = rng.choice([0.01, 0.5, 0.99], rows) if seed % 4 == 1 else rng.choice([0.01, 0.5, 0.99])
    sets = rng.random((rows, cols)) < np.broadcast_to(density, (rows,))[:, None]
    # Sizes that reach one bin, many bins, light priority bands and heavy ones.
    n = int(rng.choice([0, 1, 40, 700]))
    e = int(rng.choice([0, 1, 30, 3000]))
    query_row = rng.integers(0, rows, n)
    query_x = rng.choice([0.0, 1.0, 2.0, 4.5, 9.0], (3, n)) + (rng.random((3, n)) < 0.3) * rng.random((3, n))
    if seed % 5 == 2:
        query_x = np.sort(query_x, axis=0)  # thresholds ascending per query, as section 7 reads them
    if seed % 3 == 0:
        query_x[2] = np.inf  # a threshold above every item: each row's totals
    query_level = np.where(rng.random(n) < 0.6, 0, rng.integers(-3, 200, n))
    item_col, item_x = rng.integers(0, cols, e), rng.choice([0.0, 1.0, 2.0, 4.5], e) + rng.random(e) * (seed % 2)
    item_level = np.where(rng.random(e) < 0.6, 0, rng.integers(-3, 200, e))
    weights = rng.integers(0, 5, (2, e)).astype(np.float64)
    common = {"sets": sets, "query_row": query_row, "query_x": query_x, "item_col": item_col, "item_x": item_x,
              "weights": weights}
    lowest = np.full(n, np.iinfo(np.int64).min)
    assert np.array_equal(binned_sums(**common), _brute(sets, query_row, lowest, query_x, item_col, item_level,
                                                        item_x, weights))
    got = dominance_sums(**common, query_level=query_level, item_level=item_level)
    assert np.array_equal(got, _brute(sets, query_row, query_level, query_x, item_col, item_level, item_x, weights))


def test_compact_cuts_to_a_row_major_matrix() -> None:
    # Every read gathers rows of the cut matrix; gathered from a column-major one, each cell was a
    # cache line of its own, which made the 20,000 x 1,000,000 stage about 3x slower (same sums).
    rng = np.random.default_rng(0)
    matrix = rng.random((50, 40)) < 0.5
    query_row = rng.integers(0, 50, 30)
    item_col = rng.choice([1, 5, 7, 30], 100)
    cut, local_row, local_col = stall_sums._compact(stall_sums.row_sets(matrix), query_row, item_col)
    assert cut.matrix.flags.c_contiguous
    assert cut.matrix.shape == (len(np.unique(query_row)), 4)
    np.testing.assert_array_equal(cut.matrix[local_row, local_col[:30]], matrix[query_row, item_col[:30]])


@pytest.mark.parametrize("seed", range(20))
def test_packed_count_rows_come_back_exactly_beside_float_rows(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, cols, n, e = 5, 40, 300, 2000
    sets = rng.random((rows, cols)) < 0.4
    query_row, item_col = rng.integers(0, rows, n), rng.integers(0, cols, e)
    query_x = np.sort(rng.random((2, n)) * 10, axis=0)
    item_x = rng.random(e) * 10
    # Work (not counts), small counts, and counts whose pair packs into about 2**51: the top bits in use.
    weights = np.stack([rng.random(e) * 3, rng.integers(0, 2, e), rng.integers(0, 4, e), rng.integers(0, 2**20, e),
                        rng.integers(0, 2**10, e), rng.random(e)]).astype(np.float64)
    packed, pairs = stall_sums.pack_counts(weights)
    assert len(pairs) == 2 and len(packed) == 4  # (1, 2) and (3, 4) travel as one row each
    got = binned_sums(sets=sets, query_row=query_row, query_x=query_x, item_col=item_col, item_x=item_x, weights=weights)
    lowest = np.full(n, np.iinfo(np.int64).min)
    want = _brute(sets, query_row, lowest, query_x, item_col, np.zeros(e, np.int64), item_x, weights)
    assert np.array_equal(got[1:5], want[1:5])
    assert np.allclose(got[[0, 5]], want[[0, 5]], rtol=1e-12, atol=1e-9)


def test_counts_whose_packed_sums_would_pass_2_to_the_53_stay_apart() -> None:
    big = np.full(4, 2.0**40)
    weights = np.stack([big, big, np.array([0.5, 0.0, 0.0, 0.0])])
    packed, pairs = stall_sums.pack_counts(weights)
    assert pairs == [] and np.array_equal(packed, weights)
    # Counts alone, summing below 2**24, run in single precision and are left as they are.
    small = np.ones((3, 4))
    assert stall_sums.pack_counts(small)[1] == []
