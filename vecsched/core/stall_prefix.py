"""Section 7's arriving work of the requests that share the full window, by prefix sums.

A request created at or before now - 300 s has the window [now - 300 s, now]
and the same midpoint as every other such request, and every request created
in that window is inside it. Its arriving work from waiting requests is then
the work of the arrivals ahead of it in queue order whose signature its row
can take, split by one fixed midpoint: per signature, a cumulative sum over
the arrivals sorted by queue position, read at the request's position and
summed over the signatures its row takes, by the binned matrix products of
:mod:`vecsched.core.stall_sums`. Cost follows rows x signatures x bins plus
requests x arrivals per bin, never requests x arrivals.
"""

from __future__ import annotations

import numpy as np

from vecsched.core.stall_sums import RowSets, binned_sums


def prefix_arrivals(
    *,
    takeable: np.ndarray | RowSets,
    request_row: np.ndarray,
    request_position: np.ndarray,
    arrival_position: np.ndarray,
    arrival_signature: np.ndarray,
    arrival_work: np.ndarray,
    second_half: np.ndarray,
) -> np.ndarray:
    """Arriving work per half, ``(2, len(request_row))``, of requests sharing one window.

    ``takeable[r, s]``: row ``r`` can take signature ``s``; each request has
    its row and its queue position; each arrival (a request created in the
    window) its position, signature, work, and whether it falls in the second
    half. An arrival counts for a request when its position is lower and the
    request's row takes its signature.

    Examples
    --------
    >>> prefix_arrivals(takeable=np.array([[True, False]]), request_row=np.array([0, 0]),
    ...     request_position=np.array([1, 3]), arrival_position=np.array([0, 2, 1]),
    ...     arrival_signature=np.array([0, 0, 1]), arrival_work=np.array([1.0, 2.0, 4.0]),
    ...     second_half=np.array([False, True, False])).tolist()
    [[1.0, 1.0], [0.0, 2.0]]
    """
    n = len(request_row)
    out = np.zeros((2, n))
    if n == 0 or len(arrival_position) == 0:
        return out
    weights = np.stack([np.where(second_half, 0.0, arrival_work), np.where(second_half, arrival_work, 0.0)])
    return prefix_sums(takeable=takeable, request_row=request_row, request_position=request_position,
                       item_position=arrival_position, item_signature=arrival_signature, weights=weights)


def prefix_sums(
    *,
    takeable: np.ndarray | RowSets,
    request_row: np.ndarray,
    request_position: np.ndarray,
    item_position: np.ndarray,
    item_signature: np.ndarray,
    weights: np.ndarray,
) -> np.ndarray:
    """``out[m, k]``: the sum of ``weights[m]`` over items with position below request k's whose signature k's row takes.

    Examples
    --------
    >>> prefix_sums(takeable=np.array([[True, False]]), request_row=np.array([0]),
    ...     request_position=np.array([5]), item_position=np.array([1, 2, 9]),
    ...     item_signature=np.array([0, 1, 0]), weights=np.array([[1.0, 1.0, 1.0]])).tolist()
    [[1.0]]
    """
    # The binned products of stall_sums: rows x signatures x bins, never requests x signatures.
    return binned_sums(sets=takeable, query_row=request_row, query_x=request_position[None, :],
                       item_col=item_signature, item_x=item_position, weights=np.asarray(weights, np.float64))[:, 0]


def takeable_rows(member_words: np.ndarray, worker_signatures: np.ndarray) -> np.ndarray:
    """Per packed row of workers, the OR of those workers' takeable signatures (SPEC section 3, end), as words.

    ``member_words`` are :func:`~vecsched.core.groups.pack_words` rows over the
    gentype's usable workers; ``worker_signatures[w]`` the signatures worker
    ``w``'s take class could take (``Takes.class_rows[Takes.worker_class]``).
    The same rule as ``Takes.takeable`` (a row takes what the take classes of
    its eligible workers could take), read from the rows' workers eight at a
    time: per run of eight workers, the 256 ORs of their rows are tabulated
    once and each row ORs in the one its byte of membership names. Cost:
    workers / 8 x (256 + rows) rows of words.

    Examples
    --------
    >>> from vecsched.core.groups import pack_words
    >>> member = pack_words(np.array([[True, False, True], [False, True, False]]))
    >>> takeable_rows(member, np.array([[1], [2], [4]], dtype=np.uint64)).ravel().tolist()
    [5, 2]
    """
    n_workers, n_words = worker_signatures.shape
    out = np.zeros((len(member_words), n_words), dtype=worker_signatures.dtype)
    # Byte j of a packed row holds workers 8j .. 8j + 7, the first in the high bit (np.packbits).
    as_bytes = np.ascontiguousarray(member_words).view(np.uint8)
    n_runs = -(-n_workers // 8)
    padded = np.zeros((n_runs * 8, n_words), dtype=worker_signatures.dtype)
    padded[:n_workers] = worker_signatures
    table = np.zeros((256, n_words), dtype=worker_signatures.dtype)
    for run in range(n_runs):  # runs of eight workers, not workers: each step serves every row
        eight = padded[run * 8 : run * 8 + 8]
        for b in range(8):  # table[v] = OR of the rows whose bits v sets, built by doubling
            table[1 << b : 2 << b] = table[: 1 << b] | eight[7 - b]
        byte = as_bytes[:, run]
        users = np.flatnonzero(byte)
        if 3 * len(users) > len(byte):  # most rows use the run: one gather and an in-place OR (table[0] is 0)
            np.bitwise_or(out, np.take(table, byte, axis=0), out=out)
        else:  # few do: only theirs (a scatter costs about three gathers per row)
            out[users] |= table[byte[users]]
    return out
