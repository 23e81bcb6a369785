"""Section 7's arriving work of the requests that share the full window, by prefix sums.

A request created at or before now - 300 s has the window [now - 300 s, now]
and the same midpoint as every other such request, and every request created
in that window is inside it. Its arriving work from waiting requests is then
the work of the arrivals ahead of it in queue order whose signature its row
can take, split by one fixed midpoint: per signature, a cumulative sum over
the arrivals sorted by queue position, read at the request's position and
summed over the signatures its row takes. Cost follows requests x signatures
plus arrivals, never requests x arrivals.
"""

from __future__ import annotations

import numpy as np

CELLS_PER_CHUNK = 1 << 21


def prefix_arrivals(
    *,
    takeable: np.ndarray,
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
    n, n_signatures = len(request_row), takeable.shape[1]
    out = np.zeros((2, n))
    if n == 0 or len(arrival_position) == 0:
        return out
    weights = np.stack([np.where(second_half, 0.0, arrival_work), np.where(second_half, arrival_work, 0.0)])
    return prefix_sums(takeable=takeable, request_row=request_row, request_position=request_position,
                       item_position=arrival_position, item_signature=arrival_signature, weights=weights)


def prefix_sums(
    *,
    takeable: np.ndarray,
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
    n, n_signatures = len(request_row), takeable.shape[1]
    out = np.zeros((len(weights), n))
    if n == 0 or len(item_position) == 0:
        return out
    by_position = np.argsort(item_position, kind="stable")
    signature = item_signature[by_position].astype(np.int64)
    weights = weights[:, by_position]
    # How many items lie ahead of each request; requests taken in that order.
    ahead = np.searchsorted(item_position[by_position], request_position, "left")
    order = np.argsort(ahead, kind="stable")
    chunk = max(1, CELLS_PER_CHUNK // max(n_signatures, 1))
    base = np.zeros((len(weights), n_signatures))
    done = 0
    for lo in range(0, n, chunk):
        block = order[lo : lo + chunk]
        out[:, block], done = _chunk(takeable[request_row[block]], ahead[block], signature, weights, base, done)
    return out


def _chunk(takes: np.ndarray, ahead: np.ndarray, signature: np.ndarray, weights: np.ndarray,
           base: np.ndarray, done: int) -> tuple[np.ndarray, int]:
    """One chunk of requests sorted by ``ahead``; ``base`` holds the per-signature sums of the first ``done`` arrivals."""
    n_signatures, width = base.shape[1], len(ahead)
    # Arrivals between the last chunk and this chunk's first request join the base.
    first, last = int(ahead[0]), int(ahead[-1])
    for h in range(len(weights)):
        base[h] += np.bincount(signature[done:first], weights=weights[h, done:first], minlength=n_signatures)
    # An arrival at sorted place t counts for the chunk's requests with ahead > t.
    t = np.arange(first, last)
    since = np.searchsorted(ahead, t, "right")
    out = np.empty((len(weights), width))
    for h in range(len(weights)):
        local = np.bincount(signature[t] * width + since, weights=weights[h, t], minlength=n_signatures * width)
        totals = base[h][None, :] + np.cumsum(local.reshape(n_signatures, width), axis=1).T
        out[h] = np.where(takes, totals, 0.0).sum(axis=1)
    return out, first


def higher_priority_arrivals(
    *,
    takeable: np.ndarray,
    request_row: np.ndarray,
    request_priority: np.ndarray,
    request_created: np.ndarray,
    request_middle: np.ndarray,
    arrival_priority: np.ndarray,
    arrival_created: np.ndarray,
    arrival_signature: np.ndarray,
    arrival_work: np.ndarray,
) -> np.ndarray:
    """Arriving work per half, ``(2, n)``, from arrivals of higher priority, for requests whose window starts at their creation.

    Such a request's window is [created, now], so an arrival ahead of it
    created in the window has a higher priority, or the same priority and
    creation time (those ties are left to the caller). Per priority level of
    the requests, the arrivals above it are summed per signature over their
    creation times, read at the request's creation and midpoint. The loop
    runs over priority levels, not requests.

    Examples
    --------
    >>> higher_priority_arrivals(takeable=np.array([[True]]), request_row=np.array([0, 0]),
    ...     request_priority=np.array([0, 1]), request_created=np.array([10.0, 10.0]),
    ...     request_middle=np.array([20.0, 20.0]), arrival_priority=np.array([1, 2, 0]),
    ...     arrival_created=np.array([12.0, 25.0, 11.0]), arrival_signature=np.array([0, 0, 0]),
    ...     arrival_work=np.array([1.0, 2.0, 4.0])).tolist()
    [[1.0, 0.0], [2.0, 2.0]]
    """
    n = len(request_row)
    out = np.zeros((2, n))
    order = np.argsort(request_priority, kind="stable")
    levels, starts = np.unique(request_priority[order], return_index=True)
    for level, lo, hi in zip(levels, starts, np.r_[starts[1:], n]):
        above = np.flatnonzero(arrival_priority > level)
        if len(above) == 0:
            continue
        block = order[lo:hi]
        # created_j >= x  <=>  -created_j < nextafter(-x, +inf): a strict "ahead" count,
        # read at each request's creation and midpoint in one pass.
        since = prefix_sums(
            takeable=takeable, request_row=np.r_[request_row[block], request_row[block]],
            request_position=np.nextafter(-np.r_[request_created[block], request_middle[block]], np.inf),
            item_position=-arrival_created[above], item_signature=arrival_signature[above],
            weights=np.stack([arrival_work[above], np.ones(len(above))]),
        )
        first = since[:, : len(block)] - since[:, len(block) :]  # (work, count)
        # A difference of sums: a first half with no arrival has exactly no work.
        out[0, block] = np.where(first[1] > 0.5, first[0], 0.0)
        out[1, block] = since[0, len(block) :]
    return out


def row_sums(member: np.ndarray, per_worker: np.ndarray) -> np.ndarray:
    """``member @ per_worker`` for a boolean (row, worker) matrix, in row chunks that bound memory.

    Examples
    --------
    >>> row_sums(np.array([[True, False], [True, True]]), np.array([[1.0], [2.0]])).tolist()
    [[1.0], [3.0]]
    """
    out = np.zeros((len(member), per_worker.shape[1]))
    chunk = max(1, CELLS_PER_CHUNK // max(member.shape[1], 1))
    for lo in range(0, len(member), chunk):
        out[lo : lo + chunk] = member[lo : lo + chunk].astype(np.float64) @ per_worker
    return out
