"""Competition (SPEC.md section 5): what waits ahead of each request that its workers could take.

Request j competes with i when j is ahead of i and its signature is one that
i's eligible workers could take. Requests whose workers could take the same
signatures form a *competition class*. For a member at queue position p the
figures are, over the class's signatures s, the number, jobs and work of the
requests of signature s before p:

* per signature, requests are kept sorted by position with prefix sums, so
  each (member, signature) pair is one ``searchsorted`` and three lookups;
  all such pairs of the small classes are answered in a few large batches;
* a class whose pairs would outnumber the queue itself (many members, many
  signatures) is answered with one pass of prefix sums over the queue.
"""

from __future__ import annotations

import numpy as np

# Pairs answered per batch; bounds the temporary arrays.
PAIRS_PER_BATCH = 1 << 22


def competition(
    position: np.ndarray,
    signature: np.ndarray,
    competition_class: np.ndarray,
    class_takeable: np.ndarray,
    jobs: np.ndarray,
    work: np.ndarray,
    members: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, jobs and work of the competing requests ahead of each of ``members``.

    Parameters
    ----------
    position, signature, jobs, work : ndarray
        One entry per queued request of one gentype (positions: any order-preserving numbers).
    competition_class : ndarray
        The class of each of ``members``.
    class_takeable : ndarray of bool, shape (classes, signatures)
        The signatures each class could take.
    members : ndarray
        Indices (into the queued requests) of the requests to answer for.

    Examples
    --------
    >>> import numpy as np
    >>> count, jobs, work = competition(
    ...     position=np.array([0, 1, 2]), signature=np.array([0, 1, 0]),
    ...     competition_class=np.array([0]), class_takeable=np.array([[True, False]]),
    ...     jobs=np.array([1, 1, 1]), work=np.array([10, 20, 30]), members=np.array([2]))
    >>> int(count[0]), int(jobs[0]), int(work[0])
    (1, 1, 10)
    """
    n = len(position)
    count_ahead = np.zeros(len(members), dtype=np.int64)
    jobs_ahead = np.zeros(len(members), dtype=np.int64)
    work_ahead = np.zeros(len(members), dtype=np.int64)
    if n == 0 or len(members) == 0:
        return count_ahead, jobs_ahead, work_ahead
    # Rank positions 0..n-1 within this queue so they can index arrays.
    by_position = np.argsort(position, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[by_position] = np.arange(n)
    at = rank[members]

    # Requests sorted by (signature, position), with per-signature prefix sums.
    by_sig = np.lexsort((rank, signature))
    stride = n + 1
    sorted_key = signature[by_sig].astype(np.int64) * stride + rank[by_sig]
    cum_jobs = np.r_[0, np.cumsum(jobs[by_sig])]
    cum_work = np.r_[0, np.cumsum(work[by_sig])]
    n_sig = class_takeable.shape[1]
    sig_start = np.searchsorted(signature[by_sig], np.arange(n_sig))

    # Each class's signatures, as a flat list with offsets.
    class_of_pair, sig_of_pair = np.nonzero(class_takeable)
    sig_offsets = np.searchsorted(class_of_pair, np.arange(len(class_takeable) + 1))
    sig_count = np.diff(sig_offsets)

    # Decide per class: pairs (members x signatures) or one pass over the queue.
    n_members = np.bincount(competition_class, minlength=len(class_takeable))
    last = np.zeros(len(class_takeable), dtype=np.int64)
    np.maximum.at(last, competition_class, at)
    dense = n_members * sig_count * 4 > last + 1
    pairs_member = np.flatnonzero(~dense[competition_class] & (sig_count[competition_class] > 0))
    _answer_by_pairs(
        pairs_member,
        at,
        competition_class,
        sig_offsets,
        sig_count,
        sig_of_pair,
        sorted_key,
        stride,
        sig_start,
        cum_jobs,
        cum_work,
        (count_ahead, jobs_ahead, work_ahead),
    )

    # Queue order, for the classes answered with one pass.
    sig_in_order = signature[by_position]
    jobs_in_order = jobs[by_position]
    work_in_order = work[by_position]
    for q in np.flatnonzero(dense & (n_members > 0)):
        who = np.flatnonzero(competition_class == q)
        end = int(last[q])
        takes = class_takeable[q][sig_in_order[:end]]
        count_ahead[who] = np.r_[0, np.cumsum(takes)][at[who]]
        jobs_ahead[who] = np.r_[0, np.cumsum(np.where(takes, jobs_in_order[:end], 0))][at[who]]
        work_ahead[who] = np.r_[0, np.cumsum(np.where(takes, work_in_order[:end], 0))][at[who]]
    return count_ahead, jobs_ahead, work_ahead


def _answer_by_pairs(
    who: np.ndarray,
    at: np.ndarray,
    competition_class: np.ndarray,
    sig_offsets: np.ndarray,
    sig_count: np.ndarray,
    sig_of_pair: np.ndarray,
    sorted_key: np.ndarray,
    stride: int,
    sig_start: np.ndarray,
    cum_jobs: np.ndarray,
    cum_work: np.ndarray,
    out: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Answer ``who`` by one ``searchsorted`` per (member, signature of its class) pair."""
    if len(who) == 0:
        return
    count_ahead, jobs_ahead, work_ahead = out
    per_member = sig_count[competition_class[who]]
    ends = np.cumsum(per_member)
    a = 0
    while a < len(who):
        b = int(np.searchsorted(ends, (ends[a - 1] if a else 0) + PAIRS_PER_BATCH, side="right"))
        b = max(b, a + 1)
        batch = who[a:b]
        reps = per_member[a:b]
        total = int(reps.sum())
        member_of_pair = np.repeat(np.arange(len(batch)), reps)
        first_pair = np.r_[0, np.cumsum(reps)[:-1]]
        within = np.arange(total) - np.repeat(first_pair, reps)
        sigs = sig_of_pair[np.repeat(sig_offsets[competition_class[batch]], reps) + within]
        found = np.searchsorted(sorted_key, sigs * stride + np.repeat(at[batch], reps))
        starts = sig_start[sigs]
        count_ahead[batch] = np.add.reduceat(found - starts, first_pair)
        jobs_ahead[batch] = np.add.reduceat(cum_jobs[found] - cum_jobs[starts], first_pair)
        work_ahead[batch] = np.add.reduceat(cum_work[found] - cum_work[starts], first_pair)
        a = b
