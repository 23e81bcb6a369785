"""Competition (SPEC.md section 5): what waits ahead of each request that its workers could take.

Request j competes with i when j is ahead of i and its signature is one that
i's eligible workers could take. Requests whose workers could take the same
signatures form a *competition class*. For a member at queue position p we
need, over the class's signatures, the number, jobs and work of the requests
before p.

For each (class, signature) pair the cheaper side is walked:

* a signature with fewer requests than the class has members contributes its
  requests to a per-class list, sorted once, that members search;
* otherwise each member searches the signature's own prefix sums.

So a pair costs ``min(requests of the signature, members of the class)``.
Where a class could take nearly everything, it is answered as "everything
ahead, less what it could not take", which walks the (small) complement.
Takeable sets stay bit-packed and are unpacked a block of classes at a time.

Classes of few members that differ from both in many signatures are not
walked: their members are answered by one sweep over queue order (per block
of members, running per-signature sums times each member's takeable row),
which costs a multiply-add per (member, signature) instead of several vector
operations per walked pair.
"""

from __future__ import annotations

import numpy as np

from vecsched.core.groups import byte_subset_sums, pack_words, transpose_words, unpack_words

# Elements per temporary block (pairs, entries, unpacked rows).
BLOCK = 1 << 22


def competition(
    position: np.ndarray,
    signature: np.ndarray,
    competition_class: np.ndarray,
    class_takeable: np.ndarray,
    n_signatures: int,
    jobs: np.ndarray,
    work: np.ndarray,
    members: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, jobs and work of the competing requests ahead of each of ``members``.

    Parameters
    ----------
    position, signature, jobs, work : ndarray
        One entry per queued request of one gentype (positions: any
        order-preserving numbers, distinct).
    competition_class : ndarray
        The class of each of ``members``.
    class_takeable : ndarray of uint64, shape (classes, words)
        Bit-packed (see :func:`vecsched.core.groups.pack_words`): the signatures
        each class could take. Rows no member has are ignored (``estimate``
        passes every distinct takeable row, used or not).
    n_signatures : int
        How many signatures the packed rows hold.
    members : ndarray
        Indices (into the queued requests) of the requests to answer for.

    Examples
    --------
    >>> import numpy as np
    >>> from vecsched.core.groups import pack_words
    >>> count, jobs, work = competition(
    ...     position=np.array([0, 1, 2]), signature=np.array([0, 1, 0]),
    ...     competition_class=np.array([0]), class_takeable=pack_words(np.array([[True, False]])),
    ...     n_signatures=2, jobs=np.array([1, 1, 1]), work=np.array([10, 20, 30]),
    ...     members=np.array([2]))
    >>> int(count[0]), int(jobs[0]), int(work[0])
    (1, 1, 10)
    """
    n = len(position)
    out = tuple(np.zeros(len(members), dtype=np.int64) for _ in range(3))
    if n == 0 or len(members) == 0:
        return out  # type: ignore[return-value]
    by_position = _distinct_order(position)
    rank = np.empty(n, dtype=np.int64)
    rank[by_position] = np.arange(n)
    dense = _dense_classes(class_takeable, n_signatures, np.bincount(competition_class, minlength=len(class_takeable)))
    swept = dense[competition_class]
    if swept.any():
        # Thousands of products of a few rows each: on one BLAS thread (vecsched.core.threads).
        answered = _sweep(
            rank[members[swept]], competition_class[swept], class_takeable, n_signatures,
            signature[by_position], np.stack([np.ones(n), jobs[by_position], work[by_position]]),
        )
        for j in range(3):
            out[j][swept] = answered[:, j]
    walked = ~swept
    if walked.any():
        used, klass = np.unique(competition_class[walked], return_inverse=True)
        answered = _walk(rank, signature, klass.ravel(), class_takeable[used], n_signatures, jobs, work, members[walked])
        for j in range(3):
            out[j][walked] = answered[j]
    return out  # type: ignore[return-value]


# A swept member costs about this many walked pairs per signature (see _dense_classes):
# measured on the realistic horde, 1/128 beat 1/16 at 2,000 x 50,000 (0.28 s against
# 0.34 s) and at 20,000 x 1,000,000 (35 s against 81 s, loaded machine). Round six
# (PACKED_COST 1/14 beside it, text inputs pickled, settings in turns in one process, CPU
# medians of 7 runs): 1/256 took 0.91 / 0.87 / 0.86 / 0.83 of 1/128's time at 2,000 x
# 50k / 100k / 200k / 400k, 1.03 on the adversarial 50k, 0.93 at 20,000 x 1M (3 runs). The
# sweep's cost per member grows with the signatures, the walk's per class with the queue.
SWEEP_COST = 1 / 256
# Unpacked elements per block of swept members (float64): 2**19 beat 2**18 and 2**20 on the
# 1M text competition inputs (sweep alone, one thread: 1.53 s against 1.67 and 1.65 s).
SWEEP_BLOCK = 1 << 19


def _dense_classes(class_takeable: np.ndarray, n_signatures: int, class_size: np.ndarray) -> np.ndarray:
    """Which classes are answered by the sweep over queue order rather than by walking pairs.

    Walking a class costs a few vector operations per (member or request,
    signature) pair of its difference from "nothing" or "everything"; the sweep
    costs one multiply-add per (member, signature), many times cheaper, but
    over every signature. Classes with few members and large differences
    (every class of a horde whose requests name random model sets, and most
    small classes of a realistic one) go to the sweep.
    """
    taken = np.bitwise_count(class_takeable).sum(axis=1, dtype=np.int64)
    difference = np.minimum(taken, n_signatures - taken)
    return class_size * n_signatures * SWEEP_COST < difference


def _sweep(
    at: np.ndarray,
    member_class: np.ndarray,
    class_takeable: np.ndarray,
    n_signatures: int,
    sig_in_order: np.ndarray,
    weights_in_order: np.ndarray,
) -> np.ndarray:
    """Count, jobs and work ahead of members at ranks ``at``, by one pass over queue order.

    Members are taken in queue order, a block at a time. ``running`` holds,
    per signature, the count, jobs and work of the requests before the block;
    each member adds its takeable row times ``running`` (a matrix product) and
    the takeable requests between the block's start and itself. Sums of
    integers in float64 stay exact below 2**53. ``weights_in_order`` is
    (3, requests): count, jobs and work of each rank.

    Each weight is its own matrix-vector product: OpenBLAS multiplies a few
    rows by a (signatures x 3) matrix about 1.5x slower than by three vectors
    (0.68 against 3 x 0.15 ns per row element, one thread). Count and jobs
    share one vector where they fit (:func:`_count_under_jobs`).
    """
    count, jobs, work = weights_in_order
    shift = _count_under_jobs(jobs)
    if shift is not None:
        both = _sweep_columns(at, member_class, class_takeable, n_signatures, sig_in_order,
                              np.stack([jobs * 2.0**shift + count, work]))
        return np.stack([*_split_count_jobs(both[:, 0], shift), both[:, 1]], axis=1)
    return _sweep_columns(at, member_class, class_takeable, n_signatures, sig_in_order, weights_in_order)


def _count_under_jobs(jobs: np.ndarray) -> int | None:
    """The shift that lets one float64 weight carry jobs and a count of requests, or None.

    Jobs go above ``shift`` bits and the count below (a count of these
    requests is below 2**shift); where the jobs' total leaves every partial
    sum an integer below 2**53, the sums are exact. Split them again with
    :func:`_split_count_jobs`.
    """
    shift = len(jobs).bit_length()
    return shift if float(jobs.sum()) * 2.0**shift + len(jobs) < 2.0**53 else None


def _split_count_jobs(both: np.ndarray, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """``(count, jobs)`` of integer sums of :func:`_count_under_jobs`' shared weight."""
    return both & ((1 << shift) - 1), both >> shift


def _sweep_columns(
    at: np.ndarray,
    member_class: np.ndarray,
    class_takeable: np.ndarray,
    n_signatures: int,
    sig_in_order: np.ndarray,
    weights_in_order: np.ndarray,
) -> np.ndarray:
    """:func:`_sweep` for any (k, requests) weights: (members, k) sums, rounded to integers.

    A block reads only the signatures born (first requested, in queue order)
    before its last member: ``running`` is zero at any other, and the
    requests between the block's start and its last member have signatures
    born before it. Those are the columns below :func:`_born_width` of the
    block's last rank, a prefix of each packed row; where signatures are
    numbered by birth (as :func:`vecsched.core.eligibility.eligibility` numbers
    them when given queue positions) the prefix holds little else. The columns
    cut are zero, so the sums are the same whatever the numbering.
    """
    k = len(weights_in_order)
    order = _distinct_order(at)
    at, member_class = at[order], member_class[order]
    width_at = _born_width(sig_in_order, n_signatures)
    answered = np.zeros((len(at), k))
    running = np.zeros((k, n_signatures))
    done = 0  # ranks below ``done`` are in ``running``
    # Blocks small enough for the unpacked rows to stay in cache.
    step = max(8, SWEEP_BLOCK // max(n_signatures, 1))
    # One buffer for every block's float rows: a fresh array per block (megabytes) took fresh pages,
    # and converting into them cost twice as much as into pages already touched.
    row_buffer = np.empty(step * max(n_signatures, 1))
    a = 0
    while a < len(at):
        start = int(at[a])
        # A block spans at most ``step`` members and BLOCK / step ranks.
        stop = min(a + step, int(np.searchsorted(at, start + max(BLOCK // step, 1), side="left")))
        stop = max(stop, a + 1)
        # The requests since the last block, added row by row: a bincount per block
        # would pay (signatures x 3) per block, about 9,000 blocks at 1M requests.
        for j in range(k):
            np.add.at(running[j], sig_in_order[done:start], weights_in_order[j, done:start])
        done = start
        last = int(at[stop - 1])
        width = int(width_at[last])  # every signature the block reads is below it
        # Only the bytes holding the first ``width`` bits are unpacked (signature s: bit s of the bytes).
        words = np.take(class_takeable, member_class[a:stop], axis=0).view(np.uint8)[:, : -(-width // 8)]
        bits = np.unpackbits(words, axis=1, count=width)
        rows = row_buffer[: (stop - a) * width].reshape(stop - a, width)
        np.copyto(rows, bits)
        # The requests between the block's start and each member, picked from the bytes (an eighth
        # of the float rows' memory to gather from) and masked before one conversion.
        between = np.arange(start, last)
        picked = np.take(bits, sig_in_order[start:last], axis=1)
        picked &= between[None, :] < at[a:stop, None]
        takes = picked.astype(np.float64)
        for j in range(k):
            answered[a:stop, j] = rows @ running[j, :width] + takes @ weights_in_order[j, start:last]
        a = stop
    out = np.empty_like(answered)
    out[order] = answered
    return np.rint(out).astype(np.int64)


def _born_width(sig_in_order: np.ndarray, n_signatures: int) -> np.ndarray:
    """``width[r]``: one more than the largest signature of the requests at ranks below ``r`` (0 if none), r = 0..n.

    Signatures whose first request (their *birth*) comes at rank ``r`` or later
    are all at least ``width[r]`` or never read before ``r``. Sorting the
    signatures by birth and taking a running maximum of their ids gives the
    width after each birth; a rank reads the last birth before it.

    Examples
    --------
    >>> _born_width(np.array([1, 0, 1, 3]), 5).tolist()
    [0, 2, 2, 2, 4]
    """
    n = len(sig_in_order)
    birth = np.full(n_signatures, n, dtype=np.int64)
    np.minimum.at(birth, sig_in_order, np.arange(n))
    by_birth = np.argsort(birth, kind="stable")
    # widest[c]: the width once the first c births are in (0 before any).
    widest = np.r_[0, np.maximum.accumulate(by_birth + 1)].astype(np.int64)
    # Births strictly below r: searchsorted(born, r, "left") of them.
    return widest[np.searchsorted(birth[by_birth], np.arange(n + 1), side="left")]


def _walk(
    rank: np.ndarray,
    signature: np.ndarray,
    competition_class: np.ndarray,
    class_takeable: np.ndarray,
    n_signatures: int,
    jobs: np.ndarray,
    work: np.ndarray,
    members: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, jobs and work ahead of ``members`` by walking (class, signature) pairs (module docstring).

    ``rank`` is each queued request's place in queue order (0..n-1).
    """
    n = len(rank)
    out = tuple(np.zeros(len(members), dtype=np.int64) for _ in range(3))
    by_position = np.empty(n, dtype=np.int64)
    by_position[rank] = np.arange(n)  # rank is a permutation of 0..n-1
    at = rank[members]
    stride = n + 1

    # Requests sorted by (signature, rank), with per-signature prefix sums.
    by_sig = _distinct_order(signature.astype(np.int64) * stride + rank)
    sig_sorted_key = signature[by_sig].astype(np.int64) * stride + rank[by_sig]
    sig_cum_jobs = np.r_[0, np.cumsum(jobs[by_sig])]
    sig_cum_work = np.r_[0, np.cumsum(work[by_sig])]
    sig_start = np.searchsorted(signature[by_sig], np.arange(n_signatures + 1))
    sig_size = np.diff(sig_start)
    rank_by_sig = rank[by_sig]

    # Each class is answered as an *anchor* plus a difference: the anchor's
    # counts come from one pass over the queue, the difference is walked per
    # signature. Anchors "nothing" and "everything" give the direct and the
    # complement walks; a few more, drawn from the classes, cut the walk where
    # many classes take nearly the same signatures.
    anchors, anchor_of = _choose_anchors(class_takeable, n_signatures, n)
    renumber = np.argsort(anchor_of, kind="stable")
    new_id = np.empty_like(renumber)
    new_id[renumber] = np.arange(len(renumber))
    class_takeable, anchor_of = class_takeable[renumber], anchor_of[renumber]
    competition_class = new_id[competition_class]

    n_classes = len(class_takeable)
    class_size = np.bincount(competition_class, minlength=n_classes)
    class_last = np.zeros(n_classes, dtype=np.int64)
    np.maximum.at(class_last, competition_class, at)
    sig_first_rank = np.full(n_signatures, n, dtype=np.int64)
    present = sig_size > 0
    sig_first_rank[present] = rank[by_sig][sig_start[:-1][present]]
    # Members grouped by class, in queue order within a class.
    by_class = _distinct_order(competition_class.astype(np.int64) * stride + at)
    class_start = np.r_[0, np.cumsum(class_size)]
    sig_in_order = signature[by_position]
    weights_in_order = (jobs[by_position], work[by_position])

    class_takeable, anchors, packed_sums = _pack_apart(
        class_takeable, anchors, anchor_of, class_size, sig_size, sig_in_order, weights_in_order,
        by_class, class_start, at,
    )
    step = max(1, BLOCK // max(n_signatures, 1))
    anchor_bounds = np.searchsorted(anchor_of, np.arange(len(anchors) + 1))
    for k, anchor in enumerate(anchors):
        lo, hi = anchor_bounds[k], anchor_bounds[k + 1]
        if lo == hi:
            continue
        base = _prefix_counts(unpack_words(anchor[None, :], n_signatures)[0], sig_in_order, weights_in_order)
        for first in range(lo, hi, step):
            classes = np.arange(first, min(first + step, hi))
            words = class_takeable[classes]
            block_members = by_class[class_start[classes[0]] : class_start[classes[-1] + 1]]
            local = np.full(len(members), -1, dtype=np.int64)
            local[block_members] = np.arange(len(block_members))
            ahead = at[block_members]
            result = np.stack([base[0][ahead], base[1][ahead], base[2][ahead]])
            for sign, walk_words in ((1, words & ~anchor), (-1, anchor & ~words)):
                pair_class, pair_sig = set_bits(walk_words)
                pair_class = classes[pair_class]
                # A signature whose first request comes after a class's last member adds nothing.
                useful = sig_first_rank[pair_sig] < class_last[pair_class]
                pair_class, pair_sig = pair_class[useful], pair_sig[useful]
                small = sig_size[pair_sig] <= class_size[pair_class]
                sums = np.zeros((3, len(block_members)), dtype=np.int64)
                _sum_small(
                    pair_class[small], pair_sig[small], sig_start, rank_by_sig, weights_in_order,
                    by_class, class_start, at, local, sums,
                )
                _sum_large(
                    pair_class[~small], pair_sig[~small], by_class, class_start, at, stride,
                    sig_sorted_key, sig_start, sig_cum_jobs, sig_cum_work, local, sums,
                )
                result += sign * sums
            for j in range(3):
                out[j][block_members] = result[j] + packed_sums[j][block_members]
    return out  # type: ignore[return-value]


# A class's packed pass costs about this many walked entries per request of the packed
# signatures (a bit gathered and packed, and a byte-table lookup per weight and eight
# requests, against an entry listed, sorted and searched); see _packed_signatures. Measured
# on the text inputs of 2,000 x 50k / 200k / 400k and 20,000 x 1M, all settings in turns in
# one process: 1/10 was neutral at 50k (1/16 cost 9% there), best or tied above. Round six
# made the packed pass cheaper (one int64 weight, rows transposed): 1/14 then took 0.93-0.95
# of 1/10's time at 50k-200k and 0.87-0.89 at 400k; 1/28 and 1/40 lost at 50k.
PACKED_COST = 1 / 14


def _pack_apart(
    class_takeable: np.ndarray,
    anchors: np.ndarray,
    anchor_of: np.ndarray,
    class_size: np.ndarray,
    sig_size: np.ndarray,
    sig_in_order: np.ndarray,
    weights_in_order: tuple[np.ndarray, np.ndarray],
    by_class: np.ndarray,
    class_start: np.ndarray,
    at: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(class_takeable, anchors, sums)``: the packed signatures answered, and cleared from the walk.

    Signatures whose difference from the anchors most classes would walk
    (:func:`_packed_signatures`) are summed for every member by
    :func:`_sum_packed`; the rows and anchors returned no longer hold them, so
    the walk adds the rest.
    """
    packed = _packed_signatures(class_takeable ^ anchors[anchor_of], class_size, sig_size)
    if not packed.any():
        return class_takeable, anchors, np.zeros((3, len(at)), dtype=np.int64)
    sums = _sum_packed(np.flatnonzero(packed[sig_in_order]), class_takeable, len(sig_size), sig_in_order,
                       weights_in_order, by_class, class_start, at)
    keep = ~pack_words(packed[None, :])[0]
    return class_takeable & keep, anchors & keep, sums


def _packed_signatures(difference: np.ndarray, class_size: np.ndarray, sig_size: np.ndarray) -> np.ndarray:
    """Which signatures the walk leaves to :func:`_sum_packed` (boolean, one per signature).

    ``difference`` (classes x words, packed) holds the signatures each class
    would walk. Walking signature ``s`` costs, for each class that walks it,
    about ``min(requests of s, members of the class)`` entries (module
    docstring); packing it costs its requests x ``PACKED_COST`` for every
    class, walked or not. The signatures of requests naming several models are
    mostly of one request each and walked by many classes: those are packed.
    """
    n_classes, n_words = difference.shape
    n_signatures = len(sig_size)
    walked = np.zeros(n_signatures, dtype=np.int64)
    step = max(1, BLOCK // max(n_signatures, 1))
    for a in range(0, n_classes, step):
        bits = np.unpackbits(difference[a : a + step].view(np.uint8), axis=1, count=n_signatures)
        walked += (np.minimum(sig_size[None, :], class_size[a : a + step, None]) * bits).sum(axis=0)
    return walked > n_classes * sig_size * PACKED_COST


def _sum_packed(
    ranks: np.ndarray,
    class_takeable: np.ndarray,
    n_signatures: int,
    sig_in_order: np.ndarray,
    weights_in_order: tuple[np.ndarray, np.ndarray],
    by_class: np.ndarray,
    class_start: np.ndarray,
    at: np.ndarray,
) -> np.ndarray:
    """Count, jobs and work ahead of each member among the requests at ``ranks`` (sorted) its class takes.

    Per block of classes, each class's takeable requests among ``ranks`` are
    packed eight to a byte, in queue order; a table of each byte value's
    weights (:func:`vecsched.core.groups.byte_subset_sums`) turns a byte into
    its sums, and their running sum along the bytes answers a member by the
    bytes before its place plus the masked byte at it. Cost: classes x
    ``len(ranks)`` / 8 per weight, whatever the classes take. Weights are
    integers, summed in int64 (exact); count, jobs and work share one int64
    where their totals fit side by side (:func:`_shared_fields`).
    """
    out = np.zeros((3, len(at)), dtype=np.int64)
    if len(ranks) == 0:  # the packed signatures have no request in the queue
        return out
    fields = np.stack([np.ones(len(ranks), dtype=np.int64), weights_in_order[0][ranks].astype(np.int64),
                       weights_in_order[1][ranks].astype(np.int64)])
    words, shifts = _shared_fields(fields)
    table = byte_subset_sums(words, dtype=np.int64)  # (words, bytes x 256)
    n_bytes = table.shape[1] // 256
    # The packed requests' bits per class: each request's column of classes (rows
    # transposed once), gathered in queue order and transposed back, 64 classes (a
    # word) at a time. No bit is unpacked: unpacking, gathering and packing again
    # moved classes x len(ranks) bytes.
    by_signature = transpose_words(class_takeable, n_signatures)  # (signatures, class words)
    columns = sig_in_order[ranks]
    # Blocks of classes whose running sums (classes x bytes, int64) hold about BLOCK elements.
    step = 64 * max(1, BLOCK // (64 * n_bytes))
    for first in range(0, len(class_takeable), step):
        classes = np.arange(first, min(first + step, len(class_takeable)))
        by_request = np.take(by_signature[:, first // 64 : classes[-1] // 64 + 1], columns, axis=0)
        rows = transpose_words(by_request, len(classes))
        rows = rows.view(np.uint8)[: len(classes), :n_bytes]
        live = np.flatnonzero(rows.any(axis=1))  # classes taking none of them add nothing
        who = _members_of(classes[live], by_class, class_start)
        if len(who) == 0:
            continue
        row_of = np.repeat(np.arange(len(live)), class_start[classes[live] + 1] - class_start[classes[live]])
        sums = _packed_prefix(rows[live], table, row_of, np.searchsorted(ranks, at[who]))
        out[:, who] = _split_fields(sums, shifts)
    return out


def _shared_fields(fields: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
    """``(words, shifts)``: non-negative integer ``fields`` (k, items) packed side by side into int64 weights.

    Field ``f`` goes into a word at a shift above the bits the totals of the
    fields below it need, so every partial sum of the word is the fields'
    partial sums side by side, exact while the top field's total stays below
    2**63. Fields are placed in order, a new word starting where the next would
    not fit. ``shifts[w]`` lists word ``w``'s fields' shifts; a field with a
    negative weight gets a word of its own (shift 0). Split with :func:`_split_fields`.
    """
    words, shifts = [], []
    used = 0  # bits of the current word in use
    for values in fields:
        # A field with a negative weight shares no word: 64 bits start a word and fill it.
        bits = int(values.sum()).bit_length() if values.min(initial=0) >= 0 else 64
        if not words or used + bits > 63:
            words.append(np.zeros(fields.shape[1], dtype=np.int64))
            shifts.append([])
            used = 0
        words[-1] += values << used
        shifts[-1].append(used)
        used += bits
    return np.stack(words), shifts


def _split_fields(sums: np.ndarray, shifts: list[list[int]]) -> np.ndarray:
    """The fields' sums (k, queries) from :func:`_shared_fields`' words' sums (words, queries)."""
    out = []
    for word, at in zip(sums, shifts):
        bounds = at[1:] + [64]
        for low, high in zip(at, bounds):
            out.append(word >> low if high >= 64 else (word >> low) & ((1 << (high - low)) - 1))
    return np.stack(out)


# Bytes of packed items whose table entries (2 KiB per byte, int64) are read together: 128
# bytes of table stay in a core's L2 cache while every row reads them.
PREFIX_CHUNK = 128


def _packed_prefix(rows: np.ndarray, table: np.ndarray, row_of: np.ndarray, place: np.ndarray) -> np.ndarray:
    """Per weight and query, the sum over the first ``place`` packed items of row ``row_of`` (``table``'s dtype).

    Each row's bytes are looked up a chunk of bytes at a time for every row
    (the chunk's table stays in cache; a whole row at a time reads the whole
    table per row) into a (rows, bytes) array, summed along the bytes:
    NumPy's running sum along the last axis costs about 1 ns an element, along
    the first 4-12 ns (measured, 64 and 512 rows).
    """
    n_rows, n_bytes = rows.shape
    byte, below = place >> 3, place & 7
    # The items of the query's own byte that come before it (np.packbits: first item = high bit).
    head = (0xFF00 >> below).astype(np.uint8)
    inside = byte < n_bytes
    # intp indices: np.take converts any other index array to intp first.
    partial = np.zeros(len(place), dtype=np.intp)
    partial[inside] = rows[row_of[inside], byte[inside]] & head[inside]
    partial += np.minimum(byte, n_bytes - 1) * 256
    offset = np.arange(n_bytes, dtype=np.intp) * 256
    out = np.empty((len(table), len(place)), dtype=table.dtype)
    running = np.empty((n_rows, n_bytes + 1), dtype=table.dtype)  # column k: the bytes before byte k
    running[:, 0] = 0
    for j, weights in enumerate(table):
        for first in range(0, n_bytes, PREFIX_CHUNK):
            chunk = slice(first, first + PREFIX_CHUNK)
            running[:, 1 + first : 1 + first + PREFIX_CHUNK] = np.take(weights, rows[:, chunk] + offset[chunk])
        np.cumsum(running, axis=1, out=running)
        out[j] = running[row_of, byte] + np.where(inside, np.take(weights, partial), 0)
    return out


def set_bits(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(row, column)`` of every set bit of packed rows (:func:`vecsched.core.groups.pack_words`), row-major.

    The pairs ``np.nonzero(unpack_words(words, n))`` gives, but only the
    non-zero words are unpacked: once the packed signatures are out, the
    walk's differences are sparse (1% of their bits set at 2,000 x 400,000), and
    unpacking every bit cost classes x signatures.

    Examples
    --------
    >>> set_bits(pack_words(np.array([[False, True], [True, True]])))
    (array([0, 1, 1]), array([1, 0, 1]))
    """
    row, word = np.nonzero(words)
    bits = np.unpackbits(np.ascontiguousarray(words[row, word]).view(np.uint8).reshape(-1, 8), axis=1)
    which, bit = np.nonzero(bits)
    return row[which], word[which] * 64 + bit


def _distinct_order(keys: np.ndarray) -> np.ndarray:
    """The order that sorts ``keys``, which are distinct, so that any sort gives this one order.

    NumPy's default (unstable) sort of integers is several times faster than
    its stable one (1.6 ms against 9 ms for 130,000 keys); with no ties the
    two agree.
    """
    return np.argsort(keys)


MAX_ANCHORS = 128


def _choose_anchors(class_takeable: np.ndarray, n_signatures: int, queue_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Anchor rows (packed) and each class's nearest anchor (fewest differing signatures).

    Rows 0 and 1 are "nothing" and "everything". Further anchors are classes
    drawn with probability proportional to their current distance (as in
    k-means++ seeding, from a fixed seed; results never depend on it, only
    speed); drawing stops when an anchor would save less walking than the
    pass over the queue it costs.
    """
    n_words = class_takeable.shape[1]
    everything = np.zeros((1, n_words), dtype=np.uint64)
    everything[:] = _all_ones(n_signatures, n_words)
    anchors = [np.zeros(n_words, dtype=np.uint64), everything[0]]
    taken = np.bitwise_count(class_takeable).sum(axis=1, dtype=np.int64)
    best = np.minimum(taken, n_signatures - taken)
    anchor_of = np.where(taken <= n_signatures - taken, 0, 1).astype(np.int64)
    rng = np.random.default_rng(20261129)
    while len(anchors) < MAX_ANCHORS and best.sum() > 0:
        pick = int(rng.choice(len(best), p=best / best.sum()))
        distance = np.bitwise_count(class_takeable ^ class_takeable[pick]).sum(axis=1, dtype=np.int64)
        closer = distance < best
        # An anchor's pass over the queue costs a few vector operations per
        # request, a walked pair several times more: it pays above n / 8 pairs.
        if int((best - distance)[closer].sum()) * 8 < queue_length:
            break
        anchor_of[closer] = len(anchors)
        best = np.where(closer, distance, best)
        anchors.append(class_takeable[pick].copy())
    return np.array(anchors), anchor_of


def _all_ones(n_bits: int, n_words: int) -> np.ndarray:
    """Packed words with the first ``n_bits`` bits set."""
    return pack_words(np.ones((1, n_bits), dtype=bool))[0][:n_words] if n_bits else np.zeros(n_words, np.uint64)


def _prefix_counts(
    takeable: np.ndarray, sig_in_order: np.ndarray, weights_in_order: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, jobs and work of the takeable requests before each rank (length n + 1)."""
    takes = takeable[sig_in_order]
    count = np.r_[0, np.cumsum(takes, dtype=np.int64)]
    jobs = np.r_[0, np.cumsum(np.where(takes, weights_in_order[0], 0), dtype=np.int64)]
    work = np.r_[0, np.cumsum(np.where(takes, weights_in_order[1], 0), dtype=np.int64)]
    return count, jobs, work


def _sum_small(
    pair_class: np.ndarray,
    pair_sig: np.ndarray,
    sig_start: np.ndarray,
    rank_by_sig: np.ndarray,
    weights_in_order: tuple[np.ndarray, np.ndarray],
    by_class: np.ndarray,
    class_start: np.ndarray,
    at: np.ndarray,
    local: np.ndarray,
    sums: np.ndarray,
) -> None:
    """Pairs whose signature is smaller than the class: list the signature's requests per class.

    Each entry is one integer, class above and rank below ``shift`` bits: the
    entries are sorted as values (no argsort, no permutation gathered) and each
    entry's weights are read by its rank, from arrays of queue length.
    """
    if len(pair_class) == 0:
        return
    shift = len(rank_by_sig).bit_length()  # every rank is below 2**shift
    sizes = sig_start[pair_sig + 1] - sig_start[pair_sig]
    offsets = np.r_[0, np.cumsum(sizes)[:-1]]
    entry = np.repeat(sig_start[pair_sig] - offsets, sizes) + np.arange(int(sizes.sum()))
    key = np.repeat(pair_class.astype(np.int64) << shift, sizes) | rank_by_sig[entry]
    key.sort()  # one entry per (class, request): distinct
    ranks = key & ((1 << shift) - 1)
    cum_jobs = np.r_[0, np.cumsum(weights_in_order[0][ranks])]
    cum_work = np.r_[0, np.cumsum(weights_in_order[1][ranks])]
    classes = np.unique(pair_class)
    who = _members_of(classes, by_class, class_start)
    member_class = np.repeat(classes.astype(np.int64) << shift, class_start[classes + 1] - class_start[classes])
    found = np.searchsorted(key, member_class | at[who])
    begin = np.searchsorted(key, member_class)
    where = local[who]
    sums[0, where] += found - begin
    sums[1, where] += cum_jobs[found] - cum_jobs[begin]
    sums[2, where] += cum_work[found] - cum_work[begin]


def _sum_large(
    pair_class: np.ndarray,
    pair_sig: np.ndarray,
    by_class: np.ndarray,
    class_start: np.ndarray,
    at: np.ndarray,
    stride: int,
    sig_sorted_key: np.ndarray,
    sig_start: np.ndarray,
    sig_cum_jobs: np.ndarray,
    sig_cum_work: np.ndarray,
    local: np.ndarray,
    sums: np.ndarray,
) -> None:
    """Pairs whose class is smaller than the signature: each member searches the signature."""
    if len(pair_class) == 0:
        return
    sizes = class_start[pair_class + 1] - class_start[pair_class]
    total = int(sizes.sum())
    offsets = np.r_[0, np.cumsum(sizes)[:-1]]
    who = by_class[np.repeat(class_start[pair_class] - offsets, sizes) + np.arange(total)]
    sig = np.repeat(pair_sig, sizes)
    found = np.searchsorted(sig_sorted_key, sig * stride + at[who])
    begin = sig_start[sig]
    where = local[who]
    for k, values in enumerate(
        (found - begin, sig_cum_jobs[found] - sig_cum_jobs[begin], sig_cum_work[found] - sig_cum_work[begin])
    ):
        sums[k] += np.bincount(where, weights=values, minlength=sums.shape[1]).astype(np.int64)


def _members_of(classes: np.ndarray, by_class: np.ndarray, class_start: np.ndarray) -> np.ndarray:
    """The members of ``classes`` (sorted class codes), grouped by class."""
    sizes = class_start[classes + 1] - class_start[classes]
    offsets = np.r_[0, np.cumsum(sizes)[:-1]]
    return by_class[np.repeat(class_start[classes] - offsets, sizes) + np.arange(int(sizes.sum()))]
