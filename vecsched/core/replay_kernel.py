"""The event loop of ``dispatch-replay-v1`` (:mod:`vecsched.core.replay`), over flat arrays.

Dispatch is sequential by nature: which request a thread takes depends on what
every earlier pop took, so NumPy cannot vectorize it. The loop is written over
NumPy arrays in the subset of Python that numba compiles; :func:`loop_for`
runs it compiled for large queues (tens of times faster, see docs/replay.md)
and interpreted for small ones, where compiling would cost more than it saves.

Requests are numbered in queue order (0 first), so a smaller number is a
higher priority. Each *queue* (an eligible worker set, split by the owners that
some worker serves in its priority pass) holds its requests in a min-heap of
those numbers; a free thread compares only the heads of its worker's queues
(a tight loop over one small array), never the requests behind them, and
skips at once when none of them holds anything. A worker with many queues
(``WALK_FROM``) instead walks the heads of all queues in number order from
where it last took one, and stops at the first of its own (:func:`_walk`).
"""

from __future__ import annotations

import numpy as np

# Below this many numbered requests the loop runs interpreted: compiling costs
# seconds once per machine (then cached on disk), importing numba about one.
COMPILE_FROM = 2_000
# Columns serving at least this many queues find their next request by walking the queues' heads in
# number order (_walk), the others over their queue list. At 2,000 x 50,000 the walk halves the image
# loop (2,000 queues a column, some 80 heads walked a pick) and slows text's by about a third (300
# queues a column, half the walks given up): a step of the walk reads scattered memory.
WALK_FROM = 512
_KERNEL = ("_before", "_sift_up", "_sift_down", "heap_push", "heap_pop", "_lowest_bit", "_mark_head", "_pop_head",
           "_push", "_first", "_walk", "_pick", "_member_bits", "replay_loop")
_compiled: dict[str, object] = {}


def loop_for(n_requests: int):  # type: ignore[no-untyped-def]
    """The replay loop to run for ``n_requests`` numbered requests: compiled when worth it and numba is there.

    The functions of the loop are plain Python; the first large replay compiles
    them all with numba (each compiled function calls the compiled others).
    """
    if not _compiled and n_requests >= COMPILE_FROM:
        try:
            from numba import njit
        except ImportError:  # pragma: no cover - numba is a declared dependency
            return replay_loop
        compiled = {name: njit(cache=True, nogil=True, error_model="numpy")(globals()[name]) for name in _KERNEL}
        _compiled.update(compiled)
        globals().update(compiled)  # numba resolves the helpers through the module's globals
    return _compiled.get("replay_loop", replay_loop)


def jit(function):  # type: ignore[no-untyped-def]
    """Mark ``function`` as part of the kernel (compiled together by :func:`loop_for`)."""
    return function


@jit
def _before(keys, vals, a, b):  # type: ignore[no-untyped-def]
    # Ties of key go to the smaller value: a replay is a pure function of its input.
    return keys[a] < keys[b] or (keys[a] == keys[b] and vals[a] < vals[b])


@jit
def _sift_up(keys, vals, base, k):  # type: ignore[no-untyped-def]
    while k > 0:
        parent = (k - 1) >> 1
        if not _before(keys, vals, base + k, base + parent):
            break
        keys[base + parent], keys[base + k] = keys[base + k], keys[base + parent]
        vals[base + parent], vals[base + k] = vals[base + k], vals[base + parent]
        k = parent


@jit
def _sift_down(keys, vals, base, size, k):  # type: ignore[no-untyped-def]
    while True:
        child = 2 * k + 1
        if child >= size:
            break
        if child + 1 < size and _before(keys, vals, base + child + 1, base + child):
            child += 1
        if not _before(keys, vals, base + child, base + k):
            break
        keys[base + child], keys[base + k] = keys[base + k], keys[base + child]
        vals[base + child], vals[base + k] = vals[base + k], vals[base + child]
        k = child


@jit
def heap_push(keys, vals, base, size, key, val):  # type: ignore[no-untyped-def]
    """Push (key, val) on the heap stored at ``keys[base:base+size]``; returns the new size."""
    keys[base + size] = key
    vals[base + size] = val
    _sift_up(keys, vals, base, size)
    return size + 1


@jit
def heap_pop(keys, vals, base, size):  # type: ignore[no-untyped-def]
    """Remove the smallest entry of the heap at ``base``; returns the new size."""
    size -= 1
    keys[base] = keys[base + size]
    vals[base] = vals[base + size]
    _sift_down(keys, vals, base, size, 0)
    return size


BIG = np.iinfo(np.int64).max  # head of an empty queue
# Bit sets (the heads, each column's queues) hold 32 bits per int64 word: no operation on them can
# overflow, so the same code runs compiled and interpreted (NumPy scalars warn on overflow).
WORD_SHIFT = 5
WORD_MASK = 31
WORD_BITS = 1 << WORD_SHIFT


@jit
def _lowest_bit(x):  # type: ignore[no-untyped-def]
    """The index of the lowest set bit of ``x`` (0 < x < 2**32), by halving."""
    n = 0
    if x & 0xFFFF == 0:
        n += 16
        x >>= 16
    if x & 0xFF == 0:
        n += 8
        x >>= 8
    if x & 0xF == 0:
        n += 4
        x >>= 4
    if x & 0x3 == 0:
        n += 2
        x >>= 2
    if x & 0x1 == 0:
        n += 1
    return n


@jit
def _mark_head(old, new, heads, summary):  # type: ignore[no-untyped-def]
    """A queue's head moved from ``old`` to ``new`` (BIG: none): keep the bit set of heads and its summary.

    ``summary`` bit ``j``: word ``j`` of ``heads`` is not zero. Nothing to
    keep when no column walks (``heads`` empty).
    """
    if len(heads) == 0:
        return
    if old != BIG:
        j = old >> WORD_SHIFT
        heads[j] &= ~(1 << (old & WORD_MASK))
        if heads[j] == 0:
            summary[j >> WORD_SHIFT] &= ~(1 << (j & WORD_MASK))
    if new != BIG:
        j = new >> WORD_SHIFT
        heads[j] |= 1 << (new & WORD_MASK)
        summary[j >> WORD_SHIFT] |= 1 << (j & WORD_MASK)


@jit
def _pop_head(q, qkeys, qvals, qbase, qsize, head, nonempty, qc_ptr, col_of, heads, summary):  # type: ignore[no-untyped-def]
    """Remove queue ``q``'s first request; keep ``head``, the heads' bit set and the columns' counts of non-empty queues.

    The new head comes after the old one, so no column's ``floor`` moves.
    """
    old = head[q]
    qsize[q] = heap_pop(qkeys, qvals, qbase[q], qsize[q])
    if qsize[q] > 0:
        head[q] = qvals[qbase[q]]
        _mark_head(old, head[q], heads, summary)
        return
    head[q] = BIG
    _mark_head(old, BIG, heads, summary)
    for k in range(qc_ptr[q], qc_ptr[q + 1]):
        nonempty[col_of[k]] -= 1


@jit
def _push(r, q, qkeys, qvals, qbase, qsize, head, nonempty, qc_ptr, col_of, heads, summary, floor):  # type: ignore[no-untyped-def]
    """Request ``r`` joins queue ``q``; when it heads the queue, the columns serving it may now find it below their ``floor``."""
    was_empty = qsize[q] == 0
    old = head[q]
    qsize[q] = heap_push(qkeys, qvals, qbase[q], qsize[q], r, r)
    head[q] = qvals[qbase[q]]
    if head[q] == old:
        return
    _mark_head(old, r, heads, summary)
    if not was_empty and len(heads) == 0:
        return
    for k in range(qc_ptr[q], qc_ptr[q + 1]):
        c = col_of[k]
        if was_empty:
            nonempty[c] += 1
        if r < floor[c]:
            floor[c] = r


@jit
def _first(lists, lo, hi, head):  # type: ignore[no-untyped-def]
    """The queue among ``lists[lo:hi]`` whose head comes first (-1: all empty)."""
    best, best_q = BIG, -1
    for k in range(lo, hi):
        q = lists[k]
        if head[q] < best:
            best, best_q = head[q], q
    return best_q


@jit
def _walk(c, budget, heads, summary, floor, member, queue_of):  # type: ignore[no-untyped-def]
    """The queue of column ``c`` whose head comes first, by walking the heads from ``floor[c]`` up (-1: past ``budget`` steps).

    The heads of the non-empty queues are distinct request numbers, so the
    first head (in number order) of a queue the column serves is the smallest
    head among its queues: what :func:`_first` finds over the column's list.
    No queue of the column has a head below ``floor[c]``, so the heads of
    other columns' queues left waiting ahead (requests few workers serve) are
    not walked again. Words of heads are reached through the summary's bits;
    each summary word, word of heads and head passed over counts one step.
    """
    steps = 0
    r0 = floor[c]
    j0 = r0 >> WORD_SHIFT
    i = j0 >> WORD_SHIFT
    words = summary[i] & ~((1 << (j0 & WORD_MASK)) - 1)
    while True:
        while words != 0:
            j = i * WORD_BITS + _lowest_bit(words)
            word = heads[j]
            if j == j0:
                word &= ~((1 << (r0 & WORD_MASK)) - 1)
            while word != 0:
                r = j * WORD_BITS + _lowest_bit(word)
                q = queue_of[r]
                if (member[c, q >> WORD_SHIFT] >> (q & WORD_MASK)) & 1:
                    return q
                steps += 1
                word &= word - 1
            steps += 1
            if steps > budget:
                return -1
            words &= words - 1
        steps += 1
        i += 1
        if i >= len(summary) or steps > budget:
            return -1
        words = summary[i]


@jit
def _pick(w, t, column, cq_ptr, cq, wp_ptr, wp, qkeys, qvals, qbase, qsize, head, nonempty, qc_ptr, col_of,
          heads, summary, floor, member, queue_of, walk_from, left, deadline, leave, start, turn, gave_up):  # type: ignore[no-untyped-def]
    """Worker ``w``'s next request at ``t`` and its queue: its priority pass first, then every queue it serves.

    The first request of the column's queues is the first of their heads.
    A column with at least ``walk_from`` queues looks for it among all
    queues' heads in number order from its ``floor`` (few heads lie between,
    most often), and past a quarter as many steps as it has queues over its
    queue list, as every other column does; the head found becomes its ``floor``.
    A first request found expired (its deadline passed before any job of it
    was handed out) or cancelled (its ``leave`` time passed, ``gave_up``) leaves
    its queue, ``turn`` keeps when (for a cancelled one: when it would have
    started), and the search starts again.
    """
    c = column[w]
    while True:
        q = _first(wp, wp_ptr[w], wp_ptr[w + 1], head)
        if q < 0 and nonempty[c] > 0:
            n = cq_ptr[c + 1] - cq_ptr[c]
            # Past a quarter of the list, a failed walk costs the list about once more at most.
            q = _walk(c, n >> 2, heads, summary, floor, member, queue_of) if n >= walk_from else -1
            if q < 0:
                q = _first(cq, cq_ptr[c], cq_ptr[c + 1], head)
            if q >= 0:
                floor[c] = head[q]
        if q < 0:
            return -1, -1
        r = head[q]
        if start[r] >= 0 or (deadline[r] > t and leave[r] > t):
            return r, q
        turn[r] = t
        left[r] = 0
        gave_up[r] = deadline[r] > t
        _pop_head(q, qkeys, qvals, qbase, qsize, head, nonempty, qc_ptr, col_of, heads, summary)


@jit
def _member_bits(cq_ptr, cq, n_q):  # type: ignore[no-untyped-def]
    """Each column's queues as a bit set: row ``c``, bit ``q`` (32 bits a word)."""
    n_col = len(cq_ptr) - 1
    member = np.zeros((max(1, n_col), max(1, (n_q + WORD_BITS - 1) // WORD_BITS)), dtype=np.int64)
    for c in range(n_col):
        for k in range(cq_ptr[c], cq_ptr[c + 1]):
            q = cq[k]
            member[c, q >> WORD_SHIFT] |= 1 << (q & WORD_MASK)
    return member


@jit
def replay_loop(  # type: ignore[no-untyped-def]
    free_at, thread_worker, speed, column, cq_ptr, cq, qc_ptr, qc, wp_ptr, wp,
    queue_of, qbase, qcap, jobs, output, arrival, deadline, leave,
    horizon, poll, overhead, gone, walk_from,
):
    """Replay dispatch; per request (first assignment, completion, turn, jobs left, cancelled), -1 where none.

    ``free_at``/``thread_worker``: one entry per thread (seconds from now it
    frees, its worker). Workers that serve exactly the same queues share a
    *column*: ``column`` per worker, ``cq`` (CSR by column) its queues, and
    ``qc`` (CSR by queue) the columns serving each queue.
    ``wp`` (CSR by worker): the queues of the worker's priority pass. Per
    request (queue order): ``queue_of``, ``jobs`` to hand out, ``output`` per
    job, ``arrival`` (seconds from now), ``deadline`` (expiry) and ``leave``
    (when its user cancels it if nothing of it has started; inf: never).
    ``qbase``/``qcap`` lay the queues' heaps out in one array. A thread with
    nothing to take polls again after ``poll`` seconds, or at the next arrival
    when later. The loop ends at ``horizon``. A request that starts before the
    replay (a job in flight) has an infinite deadline: only a first assignment
    can be missed. ``gone`` (per worker): when the worker leaves the horde; a
    thread of it that frees at or after that takes nothing more (inf: stays).
    Columns with at least ``walk_from`` queues find their next request by
    walking the queues' heads (:func:`_walk`), the others over their queue
    list; both find the same request.
    """
    n_req = len(jobs)
    n_q = len(qbase)
    n_col = len(cq_ptr) - 1
    start = np.full(n_req, -1.0)
    done = np.full(n_req, -1.0)
    turn = np.full(n_req, -1.0)
    gave_up = np.zeros(n_req, dtype=np.bool_)
    left = jobs.copy()
    qkeys = np.zeros(max(1, int(qcap.sum())), dtype=np.int64)
    qvals = np.zeros(max(1, int(qcap.sum())), dtype=np.int64)
    qsize = np.zeros(n_q, dtype=np.int64)
    head = np.full(n_q, BIG, dtype=np.int64)
    nonempty = np.zeros(max(1, n_col), dtype=np.int64)
    col_of = qc  # per queue (CSR by qc_ptr): the columns serving it
    walks = False
    for c in range(n_col):
        walks = walks or cq_ptr[c + 1] - cq_ptr[c] >= walk_from
    n_words = (n_req + WORD_BITS - 1) // WORD_BITS + 1 if walks else 0
    heads = np.zeros(n_words, dtype=np.int64)  # bit r: r heads a queue (kept only when some column walks)
    summary = np.zeros((n_words + WORD_BITS - 1) // WORD_BITS, dtype=np.int64)  # bit j: heads[j] != 0
    member = _member_bits(cq_ptr, cq, n_q) if walks else np.zeros((0, 1), dtype=np.int64)
    floor = np.zeros(max(1, n_col), dtype=np.int64)  # per column: none of its queues has a head below
    tkeys = free_at.copy()
    tvals = thread_worker.copy()
    tsize = 0
    for k in range(len(free_at)):
        tsize = heap_push(tkeys, tvals, 0, tsize, free_at[k], thread_worker[k])
    order = np.argsort(arrival, kind="mergesort")
    next_arrival = 0
    while tsize > 0:
        t = tkeys[0]
        w = tvals[0]
        tsize = heap_pop(tkeys, tvals, 0, tsize)
        if t > horizon:
            break
        if t >= gone[w]:  # its worker has left: the thread is dropped, its job (if any) done
            continue
        while next_arrival < n_req and arrival[order[next_arrival]] <= t:
            r = order[next_arrival]
            if queue_of[r] >= 0:
                _push(r, queue_of[r], qkeys, qvals, qbase, qsize, head, nonempty, qc_ptr, col_of, heads, summary, floor)
            next_arrival += 1
        r, q = _pick(w, t, column, cq_ptr, cq, wp_ptr, wp, qkeys, qvals, qbase, qsize, head, nonempty,
                     qc_ptr, col_of, heads, summary, floor, member, queue_of, walk_from, left, deadline, leave, start, turn,
                     gave_up)
        if r < 0:
            wake = t + poll
            if next_arrival < n_req and arrival[order[next_arrival]] > wake:
                wake = arrival[order[next_arrival]]
            tsize = heap_push(tkeys, tvals, 0, tsize, wake, w)
            continue
        if start[r] < 0:
            start[r] = t
        finish = t + output[r] / speed[w] if speed[w] > 0 else np.inf
        if finish > done[r]:
            done[r] = finish
        left[r] -= 1
        if left[r] == 0:
            _pop_head(q, qkeys, qvals, qbase, qsize, head, nonempty, qc_ptr, col_of, heads, summary)
        tsize = heap_push(tkeys, tvals, 0, tsize, finish + overhead, w)
    return start, done, turn, left, gave_up
