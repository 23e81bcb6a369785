"""Competition: counts, jobs and work ahead equal a brute-force sum, whichever path answers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from vecsched.core.competition import competition
from vecsched.core.groups import pack_words


@st.composite
def queues(draw: st.DrawFn):
    n = draw(st.integers(1, 60))
    n_sig = draw(st.integers(1, 8))
    n_class = draw(st.integers(1, 5))
    position = np.array(draw(st.permutations(list(range(0, 3 * n, 3)))))
    signature = np.array(draw(st.lists(st.integers(0, n_sig - 1), min_size=n, max_size=n)))
    jobs = np.array(draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)))
    work = jobs * np.array(draw(st.lists(st.integers(1, 500), min_size=n, max_size=n)))
    takeable = np.array(
        draw(st.lists(st.lists(st.booleans(), min_size=n_sig, max_size=n_sig), min_size=n_class, max_size=n_class))
    )
    members = np.array(sorted(draw(st.sets(st.integers(0, n - 1), min_size=1))))
    klass = np.array(draw(st.lists(st.integers(0, n_class - 1), min_size=len(members), max_size=len(members))))
    return position, signature, klass, takeable, jobs, work, members


@settings(max_examples=300, deadline=None)
@given(queues())
def test_competition_equals_brute_force(queue):
    position, signature, klass, takeable, jobs, work, members = queue
    count, jobs_ahead, work_ahead = competition(
        position, signature, klass, pack_words(takeable), takeable.shape[1], jobs, work, members
    )
    for k, i in enumerate(members):
        ahead = [j for j in range(len(position)) if position[j] < position[i] and takeable[klass[k], signature[j]]]
        assert count[k] == len(ahead)
        assert jobs_ahead[k] == sum(int(jobs[j]) for j in ahead)
        assert work_ahead[k] == sum(int(work[j]) for j in ahead)


def test_every_path_is_taken_on_one_queue():
    # One big signature (searched by members), singletons (listed per class),
    # and a class that takes nearly everything (answered by complement).
    rng = np.random.default_rng(7)
    n = 400
    position = rng.permutation(n)
    signature = np.where(rng.random(n) < 0.5, 0, rng.integers(1, 120, n))
    jobs = rng.integers(1, 4, n)
    work = jobs * rng.integers(1, 300, n)
    takeable = np.zeros((3, 120), dtype=bool)
    takeable[0, 0] = True
    takeable[1, 1:60] = True
    takeable[2, :119] = True
    members = np.arange(0, n, 2)
    klass = rng.integers(0, 3, len(members))
    count, jobs_ahead, work_ahead = competition(
        position, signature, klass, pack_words(takeable), 120, jobs, work, members
    )
    before = position[None, :] < position[members][:, None]
    takes = takeable[klass][:, signature] & before
    np.testing.assert_array_equal(count, takes.sum(1))
    np.testing.assert_array_equal(jobs_ahead, (takes * jobs).sum(1))
    np.testing.assert_array_equal(work_ahead, (takes * work).sum(1))


@pytest.mark.parametrize("block", [1 << 22, 64])
def test_sweep_and_walk_split_one_queue_and_agree_with_brute_force(monkeypatch, block):
    # Classes of one member and scattered takeable sets go to the sweep, big
    # classes to the walk; small blocks make the sweep cut its members and
    # ranks into many blocks.
    from vecsched.core import competition as module

    monkeypatch.setattr(module, "BLOCK", block)
    monkeypatch.setattr(module, "SWEEP_BLOCK", 16 if block == 64 else module.SWEEP_BLOCK)
    monkeypatch.setattr(module, "SWEEP_COST", 1 / 128)  # the split below, whatever the tuned value
    rng = np.random.default_rng(11)
    n, n_sig, n_class = 500, 90, 40
    position = rng.permutation(3 * n)[:n]
    signature = rng.integers(0, n_sig, n)
    jobs = rng.integers(1, 5, n)
    work = jobs * rng.integers(1, 4000, n)
    takeable = rng.random((n_class, n_sig)) < rng.random((n_class, 1))
    members = np.sort(rng.choice(n, 300, replace=False))
    klass = np.where(rng.random(300) < 0.7, rng.integers(0, 3, 300), rng.integers(3, n_class, 300))
    packed = pack_words(takeable)
    swept = module._dense_classes(packed, n_sig, np.bincount(klass, minlength=n_class))[klass]
    assert swept.any() and not swept.all()
    count, jobs_ahead, work_ahead = competition(position, signature, klass, packed, n_sig, jobs, work, members)
    takes = takeable[klass][:, signature] & (position[None, :] < position[members][:, None])
    np.testing.assert_array_equal(count, takes.sum(1))
    np.testing.assert_array_equal(jobs_ahead, (takes * jobs).sum(1))
    np.testing.assert_array_equal(work_ahead, (takes * work).sum(1))


@settings(max_examples=200, deadline=None)
@given(queues(), st.sampled_from([1, 2**44]))
def test_the_sweep_equals_brute_force_with_count_and_jobs_packed_or_apart(queue, scale):
    # SWEEP_COST 0 sends every class that differs from "nothing" and "everything" to the
    # sweep; jobs of 2**44 leave no room to pack the count below them, so those take apart.
    import vecsched.core.competition as C

    position, signature, klass, takeable, jobs, work, members = queue
    jobs = jobs * scale
    work = jobs * 3
    old = C.SWEEP_COST
    try:
        C.SWEEP_COST = 0.0
        count, jobs_ahead, work_ahead = competition(
            position, signature, klass, pack_words(takeable), takeable.shape[1], jobs, work, members
        )
    finally:
        C.SWEEP_COST = old
    for k, i in enumerate(members):
        ahead = [j for j in range(len(position)) if position[j] < position[i] and takeable[klass[k], signature[j]]]
        assert count[k] == len(ahead)
        assert jobs_ahead[k] == sum(int(jobs[j]) for j in ahead)
        assert work_ahead[k] == sum(int(work[j]) for j in ahead)


@settings(max_examples=200, deadline=None)
@given(queues(), st.sampled_from([0.0, 0.5, 2.0]), st.sampled_from([1 << 22, 64]), st.sampled_from([128, 1, 3]))
def test_the_walk_with_signatures_packed_or_walked_equals_brute_force(queue, packed_cost, block, chunk):
    # PACKED_COST 0 packs every signature some class walks, 2 none (a signature is walked by
    # at most every class); BLOCK 64 cuts the packed pass into blocks of a class or two;
    # PREFIX_CHUNK 1 or 3 looks bytes up in chunks that end inside the rows.
    # SWEEP_COST is raised so that every class is walked.
    import vecsched.core.competition as C

    position, signature, klass, takeable, jobs, work, members = queue
    saved = C.PACKED_COST, C.SWEEP_COST, C.BLOCK, C.PREFIX_CHUNK
    taken = []
    real = C._sum_packed
    try:
        C.PACKED_COST, C.SWEEP_COST, C.BLOCK, C.PREFIX_CHUNK = packed_cost, 1e9, block, chunk
        C._sum_packed = lambda *a: taken.append(len(a[0])) or real(*a)
        count, jobs_ahead, work_ahead = competition(
            position, signature, klass, pack_words(takeable), takeable.shape[1], jobs, work, members
        )
    finally:
        C.PACKED_COST, C.SWEEP_COST, C.BLOCK, C.PREFIX_CHUNK = saved
        C._sum_packed = real
    if packed_cost == 2.0:
        assert not taken
    ahead = (position[None, :] < position[members][:, None]) & takeable[klass][:, signature]
    np.testing.assert_array_equal(count, ahead.sum(1))
    np.testing.assert_array_equal(jobs_ahead, (ahead * jobs).sum(1))
    np.testing.assert_array_equal(work_ahead, (ahead * work).sum(1))


def test_the_packed_pass_is_taken_where_most_classes_walk_rare_signatures(monkeypatch):
    # Forty classes of about four members each take random halves of 200 signatures of one
    # request each: against the anchor "nothing", each signature is walked by about half the
    # classes, far above PACKED_COST, so all are packed. The classes are walked, not swept,
    # against "nothing" and "everything" only (the tuned SWEEP_COST would sweep them).
    import vecsched.core.competition as C

    monkeypatch.setattr(C, "SWEEP_COST", 1e9)
    monkeypatch.setattr(C, "MAX_ANCHORS", 2)
    real, calls = C._sum_packed, []
    monkeypatch.setattr(C, "_sum_packed", lambda *a: calls.append(len(a[0])) or real(*a))

    rng = np.random.default_rng(5)
    n_sig, n_class = 200, 40
    position = rng.permutation(n_sig)
    signature = np.arange(n_sig)
    jobs = rng.integers(1, 5, n_sig)
    work = jobs * rng.integers(1, 4000, n_sig)
    takeable = rng.random((n_class, n_sig)) < 0.5
    members = rng.choice(n_sig, 150, replace=False)
    klass = rng.integers(0, n_class, 150)
    class_size = np.bincount(klass, minlength=n_class)
    packed = C._packed_signatures(pack_words(takeable), class_size, np.ones(n_sig, dtype=np.int64))
    assert packed.all()
    count, jobs_ahead, work_ahead = competition(position, signature, klass, pack_words(takeable), n_sig, jobs, work, members)
    assert calls and calls[0] > 150  # the pass ran over the packed signatures' requests (200 if all)
    ahead = (position[None, :] < position[members][:, None]) & takeable[klass][:, signature]
    np.testing.assert_array_equal(count, ahead.sum(1))
    np.testing.assert_array_equal(work_ahead, (ahead * work).sum(1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**40), min_size=3, max_size=3), min_size=1, max_size=30),
       st.sampled_from([1, 2**17, -1]))
@example(items=[[0, 1, 0]], scale=-1)  # a negative field after an empty one, before another: once shared a word
def test_shared_fields_split_back_to_every_fields_partial_sums(items, scale):
    # Fields packed side by side in int64 words: every prefix sum of a word splits into the
    # fields' own prefix sums. Large fields (scale 2**17: totals near 2**62) take a word each;
    # a negative field takes its own word.
    from vecsched.core.competition import _shared_fields, _split_fields

    fields = np.array(items, dtype=np.int64).T
    fields[1] *= scale
    words, shifts = _shared_fields(fields)
    assert sum(len(s) for s in shifts) == 3
    prefix = np.cumsum(words, axis=1)
    np.testing.assert_array_equal(_split_fields(prefix, shifts), np.cumsum(fields, axis=1))


def test_shared_fields_put_small_fields_in_one_word():
    from vecsched.core.competition import _shared_fields

    fields = np.array([[1, 1, 1], [4, 2, 1], [2048, 300, 7]], dtype=np.int64)
    words, shifts = _shared_fields(fields)
    assert words.shape == (1, 3) and shifts == [[0, 2, 5]]


def test_the_packed_pass_with_fields_in_several_words_equals_brute_force():
    # Work of about 2**40 per request leaves no room for count and jobs beside it: the packed
    # pass sums it in a word of its own.
    import vecsched.core.competition as C

    rng = np.random.default_rng(9)
    n_sig, n_class = 150, 30
    position = rng.permutation(n_sig)
    signature = np.arange(n_sig)
    jobs = rng.integers(1, 5, n_sig)
    work = jobs * rng.integers(2**38, 2**40, n_sig)
    takeable = rng.random((n_class, n_sig)) < 0.5
    members = rng.choice(n_sig, 100, replace=False)
    klass = rng.integers(0, n_class, 100)
    fields = np.stack([np.ones(n_sig, dtype=np.int64), jobs, work])
    assert len(C._shared_fields(fields)[1]) == 2
    saved, real, packed = (C.PREFIX_CHUNK, C.SWEEP_COST, C.MAX_ANCHORS), C._sum_packed, []
    try:
        # Every class walked (none swept) against "nothing" or "everything" (no class made an
        # anchor, as in so short a queue each would be); up to 19 bytes of packed requests:
        # chunks of two, the last short.
        C.PREFIX_CHUNK, C.SWEEP_COST, C.MAX_ANCHORS = 2, 1e9, 2
        C._sum_packed = lambda *a: packed.append(len(a[0])) or real(*a)
        count, jobs_ahead, work_ahead = competition(
            position, signature, klass, pack_words(takeable), n_sig, jobs, work, members)
    finally:
        (C.PREFIX_CHUNK, C.SWEEP_COST, C.MAX_ANCHORS), C._sum_packed = saved, real
    assert packed and packed[0] > 100
    ahead = (position[None, :] < position[members][:, None]) & takeable[klass][:, signature]
    np.testing.assert_array_equal(count, ahead.sum(1))
    np.testing.assert_array_equal(jobs_ahead, (ahead * jobs).sum(1))
    np.testing.assert_array_equal(work_ahead, (ahead * work).sum(1))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5), st.integers(0, 200), st.data())
def test_set_bits_lists_the_unpacked_nonzero_cells_in_order(rows, cols, data):
    from vecsched.core.competition import set_bits
    from vecsched.core.groups import unpack_words

    cells = data.draw(st.lists(st.lists(st.booleans(), min_size=cols, max_size=cols), min_size=rows, max_size=rows))
    words = pack_words(np.array(cells, dtype=bool).reshape(rows, cols))
    row, col = set_bits(words)
    expected_row, expected_col = np.nonzero(unpack_words(words, cols))
    np.testing.assert_array_equal(row, expected_row)
    np.testing.assert_array_equal(col, expected_col)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=40), st.integers(0, 3))
def test_born_width_is_one_more_than_the_largest_signature_seen_before_each_rank(signatures, extra):
    from vecsched.core.competition import _born_width

    sig = np.array(signatures, dtype=np.int64)
    n_sig = int(sig.max(initial=-1)) + 1 + extra  # some signatures no request has
    width = _born_width(sig, n_sig)
    assert width.tolist() == [int(sig[:r].max(initial=-1)) + 1 for r in range(len(sig) + 1)]


@pytest.mark.parametrize("n_sig", [1, 7, 8, 9, 63, 64, 65, 130])
def test_a_packed_rows_first_bytes_unpack_to_its_first_signatures(n_sig):
    # The sweep unpacks the bytes holding bits [0, width) of pack_words rows: signature s must be
    # bit s of the uint8 view, as np.unpackbits reads it, whatever the word layout.
    rng = np.random.default_rng(n_sig)
    rows = rng.random((5, n_sig)) < 0.5
    view = pack_words(rows).view(np.uint8)
    for width in range(n_sig + 1):
        got = np.unpackbits(view[:, : -(-width // 8)], axis=1, count=width).view(bool)
        np.testing.assert_array_equal(got, rows[:, :width])


@settings(max_examples=200, deadline=None)
@given(queues(), st.sampled_from([8, 16, 1 << 19]))
def test_the_sweep_with_signatures_numbered_by_birth_equals_brute_force(queue, sweep_block):
    # Numbered by birth, each block reads a prefix of the signatures that grows with the queue; small
    # blocks (SWEEP_BLOCK 8: blocks of 8 members) make blocks start and end between births.
    import vecsched.core.competition as C

    position, signature, klass, takeable, jobs, work, members = queue
    first = np.full(takeable.shape[1], np.iinfo(np.int64).max)
    np.minimum.at(first, signature, position)
    by_birth = np.argsort(first, kind="stable")  # unrequested signatures last
    new_id = np.empty_like(by_birth)
    new_id[by_birth] = np.arange(len(by_birth))
    signature, takeable = new_id[signature], takeable[:, by_birth]
    old = C.SWEEP_COST, C.SWEEP_BLOCK
    try:
        C.SWEEP_COST, C.SWEEP_BLOCK = 0.0, sweep_block
        count, jobs_ahead, work_ahead = competition(
            position, signature, klass, pack_words(takeable), takeable.shape[1], jobs, work, members
        )
    finally:
        C.SWEEP_COST, C.SWEEP_BLOCK = old
    takes = takeable[klass][:, signature] & (position[None, :] < position[members][:, None])
    np.testing.assert_array_equal(count, takes.sum(1))
    np.testing.assert_array_equal(jobs_ahead, (takes * jobs).sum(1))
    np.testing.assert_array_equal(work_ahead, (takes * work).sum(1))
