"""The grouping helpers: codes equal exactly when rows are alike, overlaps exact on both paths."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import vecsched.core.groups as groups
from vecsched.core.groups import (
    PLANE_BITS,
    bit_sums,
    factorize_rows,
    holders,
    or_by_lists,
    row_codes,
    or_rows_by_bits,
    or_rows_by_pairs,
    or_rows_dense,
    overlap_matrix,
    pack_words,
    pick_columns,
    set_codes,
    transpose_words,
    unique_rows,
    unpack_words,
)
from vecsched.testing.strategies import keyed_rows
from vecsched.snapshot.snapshot import ListColumn

small_lists = st.lists(st.lists(st.integers(0, 12), max_size=6), min_size=1, max_size=30)


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.integers(-2, 2)), min_size=1, max_size=50))
def test_factorize_rows_codes_equal_iff_rows_equal(rows):
    cols = [np.array(c) for c in zip(*rows)]
    codes, first = factorize_rows(*cols)
    for i in range(len(rows)):
        assert rows[first[codes[i]]] == rows[i]
        for j in range(len(rows)):
            assert (codes[i] == codes[j]) == (rows[i] == rows[j])


@given(small_lists)
def test_set_codes_ignore_order_and_repeats_and_keep_zero_for_empty(lists):
    codes = set_codes(ListColumn.from_lists(lists, dtype=np.int64), 13)
    for i, a in enumerate(lists):
        assert (codes[i] == 0) == (len(a) == 0)
        for j, b in enumerate(lists):
            assert (codes[i] == codes[j]) == (set(a) == set(b))


@settings(max_examples=200)
@given(small_lists, st.lists(st.lists(st.integers(0, 12), max_size=12), min_size=1, max_size=30))
def test_overlap_matrix_is_exact(left, right):
    want = np.array([[bool(set(a) & set(b)) for b in right] for a in left])
    got = overlap_matrix(ListColumn.from_lists(left, np.int64), ListColumn.from_lists(right, np.int64), 13)
    np.testing.assert_array_equal(got, want)


def test_overlap_matrix_takes_both_paths_and_agrees():
    # Few long lists on the right make the incidence product cheaper than the join.
    rng = np.random.default_rng(3)
    left = [list(rng.integers(0, 40, rng.integers(0, 3))) for _ in range(60)]
    right = [list(rng.integers(0, 40, 30)) for _ in range(60)]
    want = np.array([[bool(set(a) & set(b)) for b in right] for a in left])
    dense = overlap_matrix(ListColumn.from_lists(left, np.int64), ListColumn.from_lists(right, np.int64), 40)
    sparse_left = [x[:1] for x in left]
    want_sparse = np.array([[bool(set(a) & set(b)) for b in [r[:2] for r in right]] for a in sparse_left])
    sparse = overlap_matrix(
        ListColumn.from_lists(sparse_left, np.int64), ListColumn.from_lists([r[:2] for r in right], np.int64), 40
    )
    np.testing.assert_array_equal(dense, want)
    np.testing.assert_array_equal(sparse, want_sparse)


@given(st.lists(st.lists(st.booleans(), min_size=70, max_size=70), min_size=1, max_size=20))
def test_pack_words_round_trip_and_unique_rows(rows):
    matrix = np.array(rows, dtype=bool)
    words = pack_words(matrix)
    np.testing.assert_array_equal(unpack_words(words, matrix.shape[1]), matrix)
    first, inverse = unique_rows(words)
    np.testing.assert_array_equal(matrix[first][inverse], matrix)
    assert len(first) == len({tuple(r) for r in rows})


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 9), st.integers(1, 150), st.integers(0, 2**32 - 1), st.booleans())
def test_pick_columns_equals_packing_the_picked_columns(n_rows, n_cols, seed, tiny_blocks):
    rng = np.random.default_rng(seed)
    matrix = rng.random((n_rows, n_cols)) < 0.4
    columns = rng.choice(n_cols, size=int(rng.integers(0, n_cols + 1)), replace=False)
    block = groups.PICK_BLOCK
    groups.PICK_BLOCK = 3 if tiny_blocks else block  # rows spread over blocks, or one block
    try:
        picked = pick_columns(pack_words(matrix), columns)
    finally:
        groups.PICK_BLOCK = block
    assert picked.dtype == np.uint64
    assert picked.tobytes() == pack_words(matrix[:, columns]).tobytes()


@settings(max_examples=200)
@given(keyed_rows())
def test_or_rows_dense_equals_the_or_of_each_keys_rows(case):
    matrix, key, source, n_keys, want = case
    got = unpack_words(or_rows_dense(key, source, pack_words(matrix), n_keys), matrix.shape[1])
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200)
@given(keyed_rows())
def test_or_rows_by_bits_reads_little_endian_source_bits(case):
    matrix, key, source, n_keys, want = case
    member = np.zeros((n_keys, len(matrix)), dtype=bool)
    member[key, source] = True
    key_bits = np.packbits(member, axis=1, bitorder="little")
    got = unpack_words(or_rows_by_bits(key_bits, pack_words(matrix)), matrix.shape[1])
    np.testing.assert_array_equal(got, want)


def test_or_rows_dense_tabulates_busy_runs_and_ors_quiet_ones_alike():
    # Run 0 serves 600 keys x 8 sources (tabulated), the last run a handful of pairs.
    rng = np.random.default_rng(5)
    matrix = rng.random((21, 130)) < 0.3
    dense_pairs = [(k, s) for k in range(600) for s in range(8) if rng.random() < 0.9]
    quiet_pairs = [(int(rng.integers(0, 600)), int(rng.integers(8, 21))) for _ in range(40)]
    key = np.array([k for k, _ in dense_pairs + quiet_pairs])
    source = np.array([s for _, s in dense_pairs + quiet_pairs])
    want = np.zeros((600, 130), dtype=bool)
    np.logical_or.at(want, key, matrix[source])
    got = unpack_words(or_rows_dense(key, source, pack_words(matrix), 600), 130)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200)
@given(keyed_rows())
def test_or_rows_by_pairs_equals_the_or_of_each_keys_rows(case):
    matrix, key, source, n_keys, want = case
    got = unpack_words(or_rows_by_pairs(key, source, pack_words(matrix), n_keys), matrix.shape[1])
    np.testing.assert_array_equal(got, want)


def test_or_rows_by_key_agrees_on_few_sources_per_key_among_many():
    # Groups ORing a few of many model-key rows: the pair-by-pair path; a busy table: the dense one.
    from vecsched.core.eligibility import _or_rows_by_key

    rng = np.random.default_rng(7)
    for n_sources, per_key, n_keys in ((3000, 3, 4000), (30, 40, 2000)):
        matrix = rng.random((n_sources, 100)) < 0.2
        key = np.repeat(np.arange(n_keys), rng.integers(0, per_key + 1, n_keys))
        source = rng.integers(0, len(matrix), len(key))
        want = np.zeros((n_keys, 100), dtype=bool)
        np.logical_or.at(want, key, matrix[source])
        distinct, of = _or_rows_by_key(key, source, pack_words(matrix), n_keys)
        np.testing.assert_array_equal(unpack_words(distinct, 100)[of], want)


@given(small_lists, small_lists)
def test_or_by_lists_over_holders_is_the_overlap(left, right):
    want = np.array([[bool(set(a) & set(b)) for b in right] for a in left], dtype=bool)
    rows = holders(ListColumn.from_lists(right, np.int64), 13)
    got = unpack_words(or_by_lists(ListColumn.from_lists(left, np.int64), rows), len(right))
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200)
@given(
    st.lists(st.lists(st.booleans(), min_size=1, max_size=150), min_size=1, max_size=12),
    st.integers(0, 2**32),
)
def test_bit_sums_add_the_values_of_the_set_bits(rows, seed):
    width = min(len(r) for r in rows)
    matrix = np.array([r[:width] for r in rows], dtype=bool)
    rng = np.random.default_rng(seed)
    values = np.stack([np.ones(width), rng.integers(1, 9, width).astype(float), rng.random(width) * 100], axis=1)
    got = bit_sums(pack_words(matrix), values)
    want = matrix.astype(float) @ values
    np.testing.assert_array_equal(got[:, :2], want[:, :2])  # integers: exact
    np.testing.assert_allclose(got[:, 2], want[:, 2], rtol=1e-12)


@settings(max_examples=200)
@given(
    st.lists(st.lists(st.booleans(), min_size=1, max_size=150), min_size=1, max_size=12),
    st.integers(0, 2**32),
    st.sampled_from([1, 2, 2**PLANE_BITS, 2**PLANE_BITS + 1, 2**40]),
)
def test_bit_sums_of_integer_columns_are_exact_by_planes_or_tables(rows, seed, top):
    # Columns of small integers go to bit planes, others (or any with a value past the
    # planes) to the byte tables; either way integer sums are exact.
    width = min(len(r) for r in rows)
    matrix = np.array([r[:width] for r in rows], dtype=bool)
    rng = np.random.default_rng(seed)
    values = np.stack(
        [np.ones(width), rng.integers(0, top, width).astype(float), np.zeros(width), rng.integers(0, 2, width) * 255.0],
        axis=1,
    )
    got = bit_sums(pack_words(matrix), values)
    np.testing.assert_array_equal(got, matrix.astype(float) @ values)


@given(st.lists(st.lists(st.integers(0, 3), min_size=3, max_size=3), min_size=1, max_size=40))
def test_row_codes_equal_iff_rows_equal(rows):
    words = np.array(rows, dtype=np.uint64) << np.uint64(62)  # differences in the top bits only
    codes, first = row_codes(words)
    want, want_first = factorize_rows(*words.T.astype(np.int64))
    np.testing.assert_array_equal(codes, want)
    np.testing.assert_array_equal(first, want_first)


def test_row_codes_stay_exact_when_hashes_collide(monkeypatch):
    import vecsched.core.groups as groups

    monkeypatch.setattr(groups, "_row_hashes", lambda w: [np.zeros(len(w), np.int64)] * 2)
    words = np.array([[1, 2], [3, 4], [1, 2]], dtype=np.uint64)
    codes, first = groups.row_codes(words)
    np.testing.assert_array_equal(words[first[codes]], words)
    assert len(first) == 2


def test_or_rows_by_pairs_agrees_with_many_sources_per_key():
    # Above FEW_SOURCES sources per key the rows are reduced per key instead of source by source.
    rng = np.random.default_rng(3)
    matrix = rng.random((50, 130)) < 0.1
    for per_key in (3, 40):
        key = np.repeat(np.arange(20), per_key)
        source = rng.integers(0, 50, len(key))
        want = np.zeros((25, 130), dtype=bool)
        np.logical_or.at(want, key, matrix[source])
        got = unpack_words(or_rows_by_pairs(key, source, pack_words(matrix), 25), 130)
        np.testing.assert_array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 140), st.integers(0, 140), st.integers(0, 2**32 - 1))
def test_transpose_words_packs_the_transposed_bits(n_rows, n_cols, seed):
    matrix = np.random.default_rng(seed).random((n_rows, n_cols)) < 0.4
    got = transpose_words(pack_words(matrix), n_cols)
    assert got.shape == (n_cols, -(-max(n_rows, 1) // 64))
    np.testing.assert_array_equal(unpack_words(got, n_rows), matrix.T)


@settings(max_examples=100)
@given(keyed_rows(), st.integers(1, 2), st.sampled_from([1, 2, 64]))
def test_or_rows_agree_when_rows_are_ored_a_slice_of_words_at_a_time(case, width, runs_per_table):
    import vecsched.core.groups as G

    matrix, key, source, n_keys, want = case
    wide = np.concatenate([matrix, ~matrix, matrix], axis=1)  # three or more words per row
    member = np.zeros((n_keys, len(matrix)), dtype=bool)
    member[key, source] = True
    old = G.WORDS_PER_SLICE, G.RUNS_PER_TABLE
    try:  # slices of a word or two; a table per run, per two runs, or one for every run
        G.WORDS_PER_SLICE, G.RUNS_PER_TABLE = width, runs_per_table
        distinct, of = G.or_distinct_by_bits(np.packbits(member, axis=1, bitorder="little"), pack_words(wide))
        by_pairs = G.or_rows_by_pairs(key, source, pack_words(wide), n_keys)
    finally:
        G.WORDS_PER_SLICE, G.RUNS_PER_TABLE = old
    want_wide = (member[:, :, None] & wide[None, :, :]).any(axis=1)
    np.testing.assert_array_equal(unpack_words(distinct, wide.shape[1])[of], want_wide)
    np.testing.assert_array_equal(unpack_words(by_pairs, wide.shape[1]), want_wide)


@settings(max_examples=100)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=8), min_size=1, max_size=4),
       st.booleans())
def test_distinct_stacked_rows_codes_the_stack_as_row_codes_does(parts, collide):
    import vecsched.core.groups as groups

    arrays = [np.array(p, dtype=np.uint64).reshape(-1, 2) << np.uint64(62) for p in parts]
    stacked = np.concatenate(arrays)
    old = groups._row_hashes
    try:
        if collide:  # every row hashed alike: the exact fallback
            groups._row_hashes = lambda w: [np.zeros(len(w), np.int64)]
        distinct, codes = groups.distinct_stacked_rows(arrays)
    finally:
        groups._row_hashes = old
    want, _ = factorize_rows(*stacked.T.astype(np.int64))
    np.testing.assert_array_equal(codes, want)
    np.testing.assert_array_equal(distinct[codes], stacked)


def test_byte_subset_sums_in_int64_are_exact_where_float64_rounds():
    from vecsched.core.groups import byte_subset_sums

    weights = np.array([[2**60 + 1, 3, 2**59 + 5]], dtype=np.int64)
    table = byte_subset_sums(weights, dtype=np.int64)
    assert table.dtype == np.int64
    assert int(table[0, 0b10100000]) == 2**60 + 1 + 2**59 + 5
    assert int(table[0, 0b11100000]) == 2**60 + 1 + 3 + 2**59 + 5
    np.testing.assert_array_equal(byte_subset_sums(weights % 1000, dtype=np.int64),
                                  byte_subset_sums((weights % 1000).astype(float)).astype(np.int64))



@settings(max_examples=100)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=6), min_size=1, max_size=4),
       st.lists(st.integers(0, 10**6), max_size=20), st.booleans(), st.integers(1, 3))
def test_stacked_rows_code_any_positions_as_row_codes_does(parts, picks, collide, compare_words):
    import vecsched.core.groups as groups

    arrays = [np.array(p, dtype=np.uint64).reshape(-1, 2) << np.uint64(62) for p in parts]
    stacked = np.concatenate(arrays)
    old = groups._row_hashes, groups.COMPARE_WORDS
    try:
        groups.COMPARE_WORDS = compare_words  # compared a row or two at a time
        if collide:  # every row hashed alike: the exact fallback
            groups._row_hashes = lambda w: [np.zeros(len(w), np.int64)]
        stack = groups.StackedRows.of(arrays[:1]).extended(arrays[1:])  # grown part by part
        at = np.array([p % len(stacked) for p in picks] if len(stacked) else [], dtype=np.int64)
        codes, first = stack.codes(at)
    finally:
        groups._row_hashes, groups.COMPARE_WORDS = old
    assert len(stack) == len(stacked)
    np.testing.assert_array_equal(stack.take(at), stacked[at])
    want_codes, want_first = groups.row_codes(stacked[at])
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(first, want_first)


@settings(max_examples=100)
@given(
    st.lists(st.lists(st.booleans(), min_size=1, max_size=150), min_size=1, max_size=12),
    st.integers(0, 2**32), st.integers(1, 5), st.sampled_from([1, 7, 1 << 16]),
)
def test_bit_summer_sums_each_row_alike_in_any_block(rows, seed, block_rows, sum_elements):
    # Rows summed a block at a time, with temporaries of a few elements, read exactly what
    # bit_sums gives all rows at once: a row's float sum depends on that row alone.
    import vecsched.core.groups as G

    width = min(len(r) for r in rows)
    words = pack_words(np.array([r[:width] for r in rows], dtype=bool))
    rng = np.random.default_rng(seed)
    values = np.stack([np.ones(width), rng.integers(1, 9, width).astype(float), rng.random(width) * 100], axis=1)
    whole = bit_sums(words, values)
    old = G.SUM_ELEMENTS
    try:
        G.SUM_ELEMENTS = sum_elements
        summer = G.bit_summer(values, words.shape[1])
        blocks = np.concatenate([summer(words[a : a + block_rows]) for a in range(0, len(words), block_rows)])
    finally:
        G.SUM_ELEMENTS = old
    np.testing.assert_array_equal(blocks, whole)


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(-3, 40)), max_size=60), st.sampled_from([1, 8, 41, 2**61]))
def test_sorted_pairs_order_as_lexsort(pairs, vocabulary_size):
    # Codes below the vocabulary's size sort as one integer each; values outside it (negative, too
    # large) or a product past int64 take lexsort itself: both give lexsort's order.
    from vecsched.core.groups import _sorted_pairs

    pairs.sort(key=lambda p: p[0])  # owners come sorted, as ListColumn.owners() gives them
    owners = np.array([p[0] for p in pairs], dtype=np.int64)
    values = np.array([p[1] for p in pairs], dtype=np.int64)
    order = np.lexsort((values, owners))
    got_owners, got_values = _sorted_pairs(owners, values, vocabulary_size)
    np.testing.assert_array_equal(got_owners, owners[order])
    np.testing.assert_array_equal(got_values, values[order])
