"""Eligibility's small helpers, against brute force."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vecsched.core.eligibility import _classes_present
from vecsched.testing.strategies import keyed_rows


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(1, 4), st.randoms(use_true_random=False))
def test_classes_present_lists_each_class_among_each_groups_workers_once(n_groups, n_columns, n_class, rnd):
    final = np.array([[rnd.random() < 0.4 for _ in range(n_columns)] for _ in range(n_groups)], dtype=bool)
    groups = np.array(rnd.sample(range(20), n_groups))
    column_class = np.array([rnd.randrange(n_class) for _ in range(n_columns)])
    want = sorted({int(groups[g] * n_class + column_class[w]) for g in range(n_groups) for w in range(n_columns) if final[g, w]})
    got = _classes_present(final, groups, column_class, n_class)
    assert sorted(got.tolist()) == want
    assert len(got) == len(want)


@settings(max_examples=200, deadline=None)
@given(keyed_rows(max_keys=12, max_rows=9, max_pairs=60))
def test_or_combinations_gives_each_keys_or_from_distinct_rows(case):
    from vecsched.core.eligibility import _or_combinations
    from vecsched.core.groups import StackedRows, pack_words, unpack_words

    matrix, key, source, n_keys, want = case
    stack, first, of = _or_combinations(key, source, StackedRows.of([pack_words(matrix)]), np.arange(len(matrix)), n_keys)
    distinct = stack.take(first)
    np.testing.assert_array_equal(unpack_words(distinct, 70)[of], want)
    assert len({r.tobytes() for r in distinct}) == len(distinct)  # no two distinct rows alike


@settings(max_examples=200, deadline=None)
@given(keyed_rows(max_keys=12, max_rows=19, max_pairs=60), st.sampled_from(["bits", "pairs", "segments"]))
def test_or_rows_by_key_bits_ors_each_keys_sources_on_every_path(case, path):
    import vecsched.core.eligibility as E
    from vecsched.core.groups import pack_words, unpack_words

    matrix, key, source, n_keys, want = case
    member = np.zeros((n_keys, len(matrix)), dtype=bool)
    member[key, source] = True
    # Thresholds that force the eight-at-a-time OR, the pair-by-pair OR or the sorted segments.
    limits = {"bits": (0, 1 << 27), "pairs": (1 << 23, 1 << 27), "segments": (0, 0)}[path]
    old = E.BLOCK_ELEMENTS, E.WORDS_PER_DENSE_RUN, E.DENSE_TABLE_BYTES
    try:
        E.WORDS_PER_DENSE_RUN, E.DENSE_TABLE_BYTES = limits
        distinct, of = E._or_rows_by_key_bits(np.packbits(member, axis=1, bitorder="little"), pack_words(matrix))
    finally:
        E.BLOCK_ELEMENTS, E.WORDS_PER_DENSE_RUN, E.DENSE_TABLE_BYTES = old
    np.testing.assert_array_equal(unpack_words(distinct, matrix.shape[1])[of], want)
