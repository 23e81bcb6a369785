"""Eligibility's small helpers, against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vecsched.core.eligibility import _classes_present
from vecsched.testing.strategies import keyed_rows


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(1, 4), st.randoms(use_true_random=False),
       st.sampled_from([1, 2, 8]))
def test_classes_present_lists_each_class_among_each_groups_workers_once(n_groups, n_columns, n_class, rnd, few):
    import vecsched.core.eligibility as E

    final = np.array([[rnd.random() < 0.4 for _ in range(n_columns)] for _ in range(n_groups)], dtype=bool)
    groups = np.array(rnd.sample(range(20), n_groups))
    column_class = np.array([rnd.randrange(n_class) for _ in range(n_columns)])
    want = sorted({int(groups[g] * n_class + column_class[w]) for g in range(n_groups) for w in range(n_columns) if final[g, w]})
    old, E.FEW_MEMBERS = E.FEW_MEMBERS, few  # 1, 2: classes past the first members take the reduction
    try:
        got = _classes_present(final, groups, column_class, n_class)
    finally:
        E.FEW_MEMBERS = old
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


@pytest.mark.parametrize("block_elements", [64, 1 << 23])
def test_special_workers_read_from_kept_blocks_as_evaluated_afresh(monkeypatch, block_elements):
    """Kept blocks (some over a few worker columns only) give each special row the workers row_words evaluates anew."""
    import vecsched.core.eligibility as E
    import vecsched.core.estimate as estimate_module
    from vecsched.snapshot.schema import IMAGE, TEXT
    from vecsched.synthetic import horde

    monkeypatch.setattr(E, "BLOCK_ELEMENTS", block_elements)  # 64: a group or two per block
    batch = estimate_module._prepare(horde(workers=120, requests=1500, seed=3))
    subsets = 0
    for gentype in (TEXT, IMAGE):
        mine = np.flatnonzero(batch.queue.gentype == gentype)
        kept = estimate_module._eligibility(batch, gentype, mine, True)
        lazy = estimate_module._eligibility(batch, gentype, mine, False)
        rows = np.arange(kept.n_groups, kept.n_groups + kept.n_special)[::-1]  # out of block order
        assert len(rows)
        np.testing.assert_array_equal(kept.row_words(rows), lazy.row_words(rows))
        subsets += sum(1 for g, columns, final in _kept_blocks(E, batch, gentype, mine) if len(columns) < len(kept.worker_rows))
    assert subsets  # the column-subset path was taken


def _kept_blocks(E, batch, gentype, mine):
    """The special blocks eligibility keeps for ``mine``, formed again step by step."""
    from vecsched.core.arrays import take_rows
    from vecsched.core.estimate import _excluded_among

    wk, rq = batch.workers, take_rows(batch.queue, mine)
    gates = E._GENTYPE_GATES[gentype]
    cols = gates.columns(wk, rq)
    sets = E._model_sets(wk, rq, cols.worker_rows)
    flags = E._flag_tables(wk, cols, gates)
    shared = E._shared_groups(wk, cols, sets, flags)
    excluded = _excluded_among(batch, mine)
    special = E._special_groups(wk, rq, cols, shared.group_of, excluded, False)
    return E._special_sums(wk, rq, cols, sets, flags, special, excluded, shared.w_values, keep_workers=True).blocks


def test_shared_sums_by_pairs_in_small_blocks_equal_those_of_one_block(monkeypatch):
    """Groups summed per (overlap row, flag row) pair a few words at a time give every figure bit for bit."""
    import vecsched.core.eligibility as E
    import vecsched.core.estimate as estimate_module
    from vecsched.snapshot.schema import IMAGE, TEXT
    from vecsched.synthetic import horde

    batch = estimate_module._prepare(horde(workers=120, requests=1500, seed=5))
    for gentype in (TEXT, IMAGE):
        mine = np.flatnonzero(batch.queue.gentype == gentype)
        whole = estimate_module._eligibility(batch, gentype, mine, False)
        monkeypatch.setattr(E, "SUM_BLOCK_WORDS", 3)  # a group or so per block: the pair path
        blocks = estimate_module._eligibility(batch, gentype, mine, False)
        monkeypatch.undo()
        for name in ("workers", "threads", "throughput", "row"):
            np.testing.assert_array_equal(getattr(blocks, name), getattr(whole, name))
