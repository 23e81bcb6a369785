"""Sums over events seen through a request's eligibility row, below thresholds, by binned matrix products.

Section 7 asks, per request, for sums over the events (dispatches, returns,
arrivals) whose column (worker or takeable signature) its row holds and whose
time lies below the request's own thresholds, and sometimes whose priority
lies above the request's. :func:`binned_sums` answers the first kind for every
request at once: the events, sorted by time, are cut into bins; per column,
the cumulative sums at each bin boundary form a table. A request reads its
row of memberships times the table at the boundary just below its threshold
(matrix products over a few boundaries at a time, or column by column over a
row's few held or missing columns, :class:`RowSets`), and adds the few events
between that boundary and the threshold pair by pair. The products are
exact for counts (memberships are 0 or 1, every partial sum an integer below
2**24 in single precision) and differ from a scalar sum of other weights only
by rounding. :func:`dominance_sums` adds the priority condition by bands of
priority levels. Cost follows columns x bins plus requests x (columns read +
events per bin), never requests x events.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from vecsched.core.groups import byte_subset_sums

CELLS_PER_PRODUCT = 1 << 22
SWEEP_CELLS = 1 << 22  # (row, item) cells a row sweep holds at once
SWEEP_TABLE_CELLS = 1 << 22  # byte-table entries (items / 8 x 256 x weights) a row sweep builds at once
# Rough costs (ns) of the steps binned_sums weighs: a pair within a bin; a column read for one query
# (dense row) or a stored column read (sparse row); a table cell built; a multiply-add of a product;
# an (item, row) cell of a row sweep (:func:`_row_sweep`), per weight.
COSTS = {"pair": 16.0, "column": 2.7, "stored": 8.0, "cell": 3.0, "product": 0.12, "sweep": 1.0}
MAX_BINS = 1024
READ_CELLS = 1 << 18  # membership cells a read gathers and converts at once: a few hundred rows, held in cache
COMPACT_BELOW = 0.7  # columns some item falls in, at most this share of all: the matrix is cut to them
SPARSE_BELOW = 0.03  # a row's stored side this dense or less is read column by column
BANDS = 32
MIN_BAND_ITEMS = 16  # a light band holds at least this many items between its levels
DENSE_PAIR_CELLS = 1 << 20  # (query, item) cells of a light band judged at once
BAND_TABLE_CELLS = 1 << 23  # most cells of the light bands' one table (_band_sums)
PAIRS_PER_CHUNK = 1 << 20  # (query, item) pairs listed at once (_add_held_pairs): temporaries under 100 MB


@dataclass(frozen=True)
class RowSets:
    """A boolean (row, column) matrix with each row's sparser side in compressed rows.

    Per row, ``complement`` says the stored columns are those it does not hold;
    ``dense`` rows store nothing (neither side is few enough to be read column
    by column, :data:`SPARSE_BELOW`) and are read by matrix products.
    """

    matrix: np.ndarray
    dense: np.ndarray
    complement: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray


def row_sets(matrix: np.ndarray | RowSets) -> RowSets:
    """``matrix`` with each row's sparser side compressed when it is sparse enough.

    Examples
    --------
    >>> held = np.ones((3, 40), dtype=bool)
    >>> held[1, 3] = False
    >>> held[2, 20:] = False
    >>> s = row_sets(held)
    >>> s.dense.tolist(), s.complement.tolist(), s.indptr.tolist(), s.indices.tolist()
    ([False, False, True], [True, True, False], [0, 0, 1, 1], [3])
    """
    if isinstance(matrix, RowSets):
        return matrix
    n_cols = matrix.shape[1]
    held = np.count_nonzero(matrix, axis=1)
    complement = held * 2 > n_cols
    stored = np.where(complement, n_cols - held, held)
    dense = stored > SPARSE_BELOW * n_cols
    sparse = np.flatnonzero(~dense)
    row, col = np.nonzero(matrix[sparse] ^ complement[sparse, None])
    sizes = np.zeros(len(matrix), np.int64)
    sizes[sparse] = np.bincount(row, minlength=len(sparse))
    return RowSets(matrix, dense, complement, np.r_[0, np.cumsum(sizes)], col.astype(np.int64))


def binned_sums(
    *,
    sets: np.ndarray | RowSets,
    query_row: np.ndarray,
    query_x: np.ndarray,
    item_col: np.ndarray,
    item_x: np.ndarray,
    weights: np.ndarray,
) -> np.ndarray:
    """``out[m, t, q]``: the sum of ``weights[m]`` over items with ``item_x < query_x[t, q]`` whose column ``sets[query_row[q]]`` holds.

    Examples
    --------
    >>> binned_sums(sets=np.array([[True, False]]), query_row=np.array([0, 0]),
    ...     query_x=np.array([[5.0, 1.0]]), item_col=np.array([0, 1, 0]),
    ...     item_x=np.array([1.0, 2.0, 9.0]), weights=np.array([[1.0, 1.0, 1.0]])).tolist()
    [[[1.0, 0.0]]]
    """
    packed, pairs = pack_counts(weights)
    out = _binned_sums(sets=sets, query_row=query_row, query_x=np.atleast_2d(query_x), item_col=item_col,
                       item_x=item_x, weights=packed)
    return unpack_counts(out, len(weights), pairs)


def pack_counts(weights: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, float]]]:
    """``weights`` with pairs of count rows packed into one row each, when the sums are in double precision anyway.

    A sum's cost follows its weights (table cells, reads, pairs). Two rows of counts
    (non-negative integers) ``a`` and ``b`` travel as ``a + base * b``, ``base`` the power of two
    above ``a``'s total, while ``base * (b's total + 1) <= 2**53``: every partial sum is then an
    integer that double precision holds exactly, and :func:`unpack_counts` splits it back. Calls
    whose weights are all counts below 2**24 run in single precision (:func:`binned_sums`),
    exact and as narrow, and are left as they are. Returns ``(packed, pairs)``: the rows not
    packed first, then one row per pair, and the pairs as (low row, high row, base).

    Examples
    --------
    >>> packed, pairs = pack_counts(np.array([[1.0, 0.0, 2.0], [0.5, 0.5, 0.0], [0.0, 3.0, 1.0]]))
    >>> packed.tolist(), pairs
    ([[0.5, 0.5, 0.0], [1.0, 12.0, 6.0]], [(0, 2, 4.0)])
    >>> unpack_counts(packed[:, None, :], 3, pairs)[:, 0].tolist()
    [[1.0, 0.0, 2.0], [0.5, 0.5, 0.0], [0.0, 3.0, 1.0]]
    """
    w = np.asarray(weights, dtype=np.float64)
    counts = np.all((w == np.rint(w)) & (w >= 0), axis=1)
    totals = w.sum(axis=1)
    if len(w) < 2 or (counts.all() and totals.max() < 2**24) or np.count_nonzero(counts) < 2:
        return w, []
    pairs: list[tuple[int, int, float]] = []
    free = list(np.flatnonzero(counts))
    while len(free) >= 2:
        low, high = free.pop(0), free.pop(0)
        base = 2.0 ** math.ceil(math.log2(totals[low] + 1))
        if base * (totals[high] + 1) <= 2.0**53:
            pairs.append((int(low), int(high), base))
    rest = _unpaired(len(w), pairs)
    return np.concatenate([w[rest], *(w[[low]] + base * w[[high]] for low, high, base in pairs)]), pairs


def unpack_counts(out: np.ndarray, n_weights: int, pairs: list[tuple[int, int, float]]) -> np.ndarray:
    """The sums of the ``n_weights`` rows :func:`pack_counts` packed, from the sums ``out[m, ...]`` of its rows."""
    if not pairs:
        return out
    rest = _unpaired(n_weights, pairs)
    full = np.empty((n_weights,) + out.shape[1:])
    full[rest] = out[: len(rest)]
    for k, (low, high, base) in enumerate(pairs):
        packed = out[len(rest) + k]
        full[high] = np.floor(packed / base)
        full[low] = packed - full[high] * base
    return full


def _unpaired(n_weights: int, pairs: list[tuple[int, int, float]]) -> list[int]:
    """The rows :func:`pack_counts` left as they were, in order: the first rows of its output."""
    paired = {r for low, high, _ in pairs for r in (low, high)}
    return [r for r in range(n_weights) if r not in paired]


def _binned_sums(*, sets: np.ndarray | RowSets, query_row: np.ndarray, query_x: np.ndarray, item_col: np.ndarray,
                 item_x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """:func:`binned_sums` of 2-d ``query_x``, its weights as given."""
    n_t, n = query_x.shape
    out = np.zeros((len(weights), n_t, n))
    e = len(item_x)
    if n == 0 or e == 0:
        return out
    sets = row_sets(sets)
    rare = _rare_items(sets.matrix.shape[1], query_row, n_t * n, item_col, len(weights))
    if rare.any():  # swept; the others' columns hold more items than a sweep would make rare
        kept = np.flatnonzero(~rare)
        swept = _row_sweep(sets.matrix, query_row, query_x, item_col[rare], item_x[rare], weights[:, rare])
        return swept + _binned_sums(sets=sets, query_row=query_row, query_x=query_x, item_col=item_col[kept],
                                    item_x=item_x[kept], weights=weights[:, kept])
    sets, query_row, item_col = _compact(sets, query_row, item_col)
    order = np.argsort(item_x, kind="stable")
    xs, col = np.take(item_x, order), np.take(item_col, order).astype(np.int64)
    w = _reorder(weights, order)
    below = np.searchsorted(xs, query_x, "left")
    rows, row_at = bounded_unique(query_row, len(sets.matrix))
    # A threshold above every item reads each row's totals.
    everything = np.all(below == e, axis=1)
    some = np.flatnonzero(~everything)
    product, n_bins = _plan(sets, rows, len(some) * n, e, len(w))
    step = -(-e // n_bins)
    full = below // step
    # Single precision when every weight is a count whose sums stay below 2**24 (exact); else double.
    exact32 = bool(np.all(w == np.rint(w)) and np.abs(w).sum(axis=1).max() < 2**24)
    table = _table(sets.matrix.shape[1], col, w, n_bins, step, np.float32 if exact32 else np.float64)
    totals = rows_product(sets.matrix, rows, table[-1]) if everything.any() else None
    if len(some):
        part = np.zeros((len(w), len(some), n))
        if product:
            _read_product(part, table, sets.matrix, rows, row_at.ravel(), full[some])
        else:
            _read(part, table, sets, query_row, full[some])
        out[:, some] = part
    for t in np.flatnonzero(everything):
        out[:, t] = totals[row_at.ravel()].T
        full[t] = below[t]  # no pair left to add
    # The items between the boundary and each threshold, pair by pair.
    _add_held_pairs(out.reshape(len(w), n_t * n), sets.matrix, np.tile(query_row, n_t), full.ravel() * step,
                    below.ravel(), col, w)
    return out


def _rare_items(n_cols: int, query_row: np.ndarray, n_reads: int, item_col: np.ndarray, n_weights: int) -> np.ndarray:
    """Which items fall in columns that hold too few items to be worth a column of every query's read.

    Kept in the table, a column costs every (query, threshold) a read; swept
    (:func:`_row_sweep`), each of its items costs one cell per distinct queried
    row and weight (a read takes its few weights in one product), and the read
    is narrower only if the table is then cut to the other columns. Columns of few items (a signature one request names, as most requests
    naming several models have) are cheaper swept: without this their count,
    which grows with the queue, multiplied every query's read.
    """
    per_col = np.bincount(item_col, minlength=n_cols)
    n_rows = np.count_nonzero(np.bincount(query_row))
    rare_col = per_col * n_rows * n_weights * COSTS["sweep"] < n_reads * COSTS["column"]
    # A read narrows only when the table is cut to its columns (_compact): sweeping a few items of
    # columns the table keeps anyway (a worker with one pop) saves nothing and costs every queried row.
    if np.count_nonzero(~rare_col & (per_col > 0)) > COMPACT_BELOW * n_cols:
        return np.zeros(len(item_col), bool)
    return rare_col[item_col]


def _row_sweep(matrix: np.ndarray, query_row: np.ndarray, query_x: np.ndarray, item_col: np.ndarray,
               item_x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """:func:`binned_sums` by running sums over the items in ``x`` order, one row of ``matrix`` per queried row.

    Cost: distinct queried rows x items (no table, no pairs), for the few items
    of rare columns, in segments of items whose byte tables stay small.

    Examples
    --------
    >>> _row_sweep(np.array([[True, False], [True, True]]), np.array([1, 0, 1]), np.array([[2.5, 9.0, 1.5]]),
    ...     np.array([0, 1, 1]), np.array([1.0, 2.0, 0.5]), np.array([[1.0, 10.0, 100.0]])).tolist()
    [[[111.0, 1.0, 101.0]]]
    """
    out = np.zeros((len(weights),) + query_x.shape)
    order = np.argsort(item_x, kind="stable")
    col, w = np.take(item_col, order), _reorder(weights, order)
    below = np.searchsorted(np.take(item_x, order), query_x, "left")
    rows, row_at = bounded_unique(query_row, len(matrix))
    step = max(8, SWEEP_TABLE_CELLS // (256 * len(w)) // 8 * 8)
    for lo in range(0, len(col), step):
        hi = min(lo + step, len(col))
        _sweep_segment(out, matrix, rows, row_at.ravel(), np.clip(below - lo, 0, hi - lo), col[lo:hi], w[:, lo:hi])
    return out


def _sweep_segment(out: np.ndarray, matrix: np.ndarray, rows: np.ndarray, row_at: np.ndarray, below: np.ndarray,
                   col: np.ndarray, w: np.ndarray) -> None:
    """Add to ``out[m, t, q]`` the weights of the first ``below[t, q]`` items whose column row ``rows[row_at[q]]`` holds.

    A row's memberships of the items are packed eight to a byte; a table holds,
    per byte and each of its 256 values, the weights of the items it sets. A row's
    running sums then add one table entry per eight items, and a query reads its
    row's sum at the byte just below its threshold plus the first bits of the next.
    """
    n_w, e = w.shape
    n_bytes = -(-e // 8)
    tables = byte_subset_sums(w)
    first_bits = np.array([(0xFF00 >> k) & 0xFF for k in range(8)], np.intp)  # a byte's first k items
    whole, bit = below // 8, below % 8
    partial = np.minimum(whole, n_bytes - 1)
    chunk = max(1, SWEEP_CELLS // e)
    by_row = np.argsort(row_at, kind="stable")
    bounds = np.searchsorted(row_at[by_row], np.arange(0, len(rows) + chunk, chunk))
    for j, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        first = j * chunk
        packed = np.packbits(np.take(np.take(matrix, rows[first : first + chunk], axis=0), col, axis=1), axis=1)
        cell = packed.astype(np.intp) + np.arange(n_bytes) * 256
        q = by_row[lo:hi]
        local = row_at[q] - first
        # The table entry of each query's partial byte, its first bits only.
        tail = (packed[local[None, :], partial[:, q]] & first_bits[bit[:, q]]) + partial[:, q] * 256
        running = np.zeros((len(packed), n_bytes + 1))
        for m in range(n_w):
            np.cumsum(np.take(tables[m], cell), axis=1, out=running[:, 1:])
            out[m][:, q] += running[local[None, :], whole[:, q]] + np.take(tables[m], tail)


def bounded_unique(values: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for integers in ``[0, bound)``, by marking rather than sorting.

    Row and column numbers are bounded by their matrix; the stage takes their distinct values
    hundreds of times per estimate, and a sort of each was a tenth of its time.

    Examples
    --------
    >>> [a.tolist() for a in bounded_unique(np.array([3, 1, 3, 0]), 5)]
    [[0, 1, 3], [2, 1, 2, 0]]
    """
    present = np.zeros(bound, bool)
    present[values] = True
    at = np.cumsum(present, dtype=np.int64) - 1
    return np.flatnonzero(present), at[values]


def rows_product(matrix: np.ndarray, rows: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``matrix[rows] @ right`` for a boolean ``matrix``, a cache-sized block of rows at a time (:data:`READ_CELLS`).

    Examples
    --------
    >>> rows_product(np.array([[True, False], [True, True]]), np.array([1, 1, 0]), np.array([[1.0], [2.0]])).tolist()
    [[3.0], [3.0], [1.0]]
    """
    out = np.empty((len(rows), right.shape[1]), right.dtype)
    chunk = max(1, READ_CELLS // max(matrix.shape[1], 1))
    for lo in range(0, len(rows), chunk):
        np.matmul(np.take(matrix, rows[lo : lo + chunk], axis=0).astype(right.dtype), right, out=out[lo : lo + chunk])
    return out


def _reorder(weights: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``weights[:, order]`` as contiguous doubles: gathered as rows of the transpose (about 5x faster than along axis 1)."""
    return np.ascontiguousarray(np.take(weights.T, order, axis=0).T, dtype=np.float64)


def _held(matrix: np.ndarray, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """``matrix[row, col]``, by ``np.take`` on the flat matrix: two to three times faster than fancy indexing here.

    Examples
    --------
    >>> _held(np.array([[True, False], [False, True]]), np.array([0, 1, 1]), np.array([0, 0, 1])).tolist()
    [True, False, True]
    """
    return np.take(matrix.reshape(-1), row * matrix.shape[1] + col)


def _add_held_pairs(out: np.ndarray, matrix: np.ndarray, range_row: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                    col: np.ndarray, w: np.ndarray, items: np.ndarray | None = None) -> None:
    """``out[:, r] +=`` the weights ``w[:, j]`` of the entries ``j`` in ``range(lo[r], hi[r])`` whose column ``col[j]``
    row ``range_row[r]`` of ``matrix`` holds; entry ``j`` stands for item ``items[j]`` when ``items`` is given.

    A chunk of whole ranges at a time, about :data:`PAIRS_PER_CHUNK` pairs: listed at once, the pairs' index
    arrays were the estimate's peak memory (20,000 x 1,000,000: 46M pairs of image's shared window, about
    2.5 GB of int64 temporaries). A range's held entries stay one run of one chunk, summed as before.

    Examples
    --------
    >>> out = np.zeros((1, 2))
    >>> _add_held_pairs(out, np.array([[True, False]]), np.array([0, 0]), np.array([0, 1]), np.array([2, 2]),
    ...                 np.array([0, 1]), np.array([[1.0, 2.0]]))
    >>> out.tolist()
    [[1.0, 0.0]]
    """
    ends = np.cumsum(np.maximum(hi - lo, 0))
    first = 0
    while first < len(lo):
        done = int(ends[first - 1]) if first else 0
        last = max(int(np.searchsorted(ends, done + PAIRS_PER_CHUNK, "right")), first + 1)
        flat, entry = expand_ranges(lo[first:last], hi[first:last])
        flat += first
        j = entry if items is None else np.take(items, entry)
        held = _held(matrix, np.take(range_row, flat), np.take(col, j))
        _add_runs(out, flat[held], np.take(w, j[held], axis=1))
        first = last


def _add_runs(out: np.ndarray, target: np.ndarray, values: np.ndarray) -> None:
    """``out[:, target[i]] += values[:, i]``, ``target`` grouped in runs of equal values, each value in one run.

    One sum per run (``np.add.reduceat``) instead of one ``bincount`` per weight; ``values`` hold
    one weight per row, so each run is summed along contiguous memory (about three times faster
    than runs of rows of a ``(pairs, weights)`` array).

    Examples
    --------
    >>> out = np.zeros((1, 3))
    >>> _add_runs(out, np.array([2, 2, 0]), np.array([[1.0, 2.0, 4.0]]))
    >>> out.tolist()
    [[4.0, 0.0, 3.0]]
    """
    if len(target) == 0:
        return
    starts = np.flatnonzero(np.r_[True, target[1:] != target[:-1]])
    out[:, target[starts]] += np.add.reduceat(values, starts, axis=1)


def _compact(sets: RowSets, query_row: np.ndarray, item_col: np.ndarray) -> tuple[RowSets, np.ndarray, np.ndarray]:
    """``sets`` cut to the queried rows and the columns items fall in, when that drops many columns.

    A column no item falls in adds nothing to any sum; reading it costs as much as any other.
    The cut matrix is row-major, as every read gathers its rows: ``matrix[rows][:, present]``
    came out column-major, and a row gathered from it touched one cache line per cell (at
    20,000 x 1,000,000 without history one read of the shared window took most of the stage).
    """
    present, local_col = bounded_unique(item_col, sets.matrix.shape[1])
    if len(present) > COMPACT_BELOW * sets.matrix.shape[1]:
        return sets, query_row, item_col
    rows, query_row = bounded_unique(query_row, len(sets.matrix))
    cut = np.take(np.take(sets.matrix, rows, axis=0), present, axis=1)
    return row_sets(cut), query_row.ravel(), local_col.ravel()


def _plan(sets: RowSets, rows: np.ndarray, n_queries: int, n_items: int, n_weights: int) -> tuple[bool, int]:
    """How to read the table, and how many bins: whichever costs less by :data:`COSTS`.

    Bins balance the table reads against the pairs within a bin (queries x
    items per bin). Read per query, a query costs its row's columns (or its
    stored side); read as one product of every queried row with the whole
    table, a row costs columns x bins, whatever its queries.
    """
    n_cols = sets.matrix.shape[1]
    pair = COSTS["pair"] * n_queries * n_items / 2
    dense = sets.dense[rows]
    per_query_cols = n_cols * dense.mean() + COSTS["stored"] / COSTS["column"] * (1 - dense.mean()) * (
        (sets.indptr[rows + 1] - sets.indptr[rows]).mean())
    cell = COSTS["cell"] * n_cols * n_weights
    bins_q = np.sqrt(pair / cell)
    cost_q = COSTS["column"] * n_queries * per_query_cols + 2 * np.sqrt(pair * cell)
    cell_p = cell + COSTS["product"] * len(rows) * n_cols * n_weights
    bins_p = np.sqrt(pair / cell_p)
    cost_p = 2 * np.sqrt(pair * cell_p)
    product = cost_p < cost_q
    return bool(product), int(np.clip(bins_p if product else bins_q, 1, min(n_items, MAX_BINS)))


def _read_product(out: np.ndarray, table: np.ndarray, sets: np.ndarray, rows: np.ndarray, row_at: np.ndarray,
                  full: np.ndarray) -> None:
    """Each (query, threshold)'s row of ``sets`` times the table at its boundary, from products of whole rows.

    ``rows`` are the distinct queried rows, ``row_at`` each query's place among them.
    """
    n_w, n_t, n = out.shape
    n_cells = len(table)
    table = table.transpose(1, 0, 2).reshape(table.shape[1], -1)  # (columns, cells x weights)
    flat = out.reshape(n_w, n_t * n)
    at, cell = np.tile(row_at, n_t), full.ravel()
    chunk = max(1, CELLS_PER_PRODUCT // max(table.shape[1], 1))
    order = np.argsort(at, kind="stable")
    bounds = np.searchsorted(at[order], np.arange(0, len(rows) + chunk, chunk))
    for j, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        first = j * chunk
        product = (np.take(sets, rows[first : first + chunk], axis=0).astype(table.dtype) @ table).reshape(-1, n_cells, n_w)
        q = order[lo:hi]
        flat[:, q] = product[at[q] - first, cell[q]].T


def _table(n_cols: int, col: np.ndarray, w: np.ndarray, n_bins: int, step: int, dtype: type) -> np.ndarray:
    """``table[b, c, m]``: the sum of ``w[m]`` over the first ``b * step`` items of column ``c``.

    Boundaries outermost, so the running sum adds whole contiguous rows, one boundary at a
    time: ``np.cumsum`` along the outer axis is about ten times slower than these row adds.
    """
    n_w = len(w)
    cell = ((np.arange(len(col)) // step + 1) * n_cols + col) * n_w
    table = np.bincount((cell[None, :] + np.arange(n_w)[:, None]).ravel(), weights=w.ravel(),
                        minlength=(n_bins + 1) * n_cols * n_w).astype(dtype, copy=False)
    table = table.reshape(n_bins + 1, n_cols * n_w)
    for b in range(1, n_bins + 1):
        np.add(table[b], table[b - 1], out=table[b])
    return table.reshape(n_bins + 1, n_cols, n_w)


def _read(out: np.ndarray, table: np.ndarray, sets: RowSets, query_row: np.ndarray, full: np.ndarray) -> None:
    """Each (query, threshold)'s row of ``sets`` times the table at its boundary.

    Dense rows by products (:func:`_read_table`); the others column by column
    over their stored side, a chunk of (query, threshold)s at a time.
    """
    n_w, n_t, n = out.shape
    rows, cell = np.tile(query_row, n_t), full.ravel()
    flat = out.reshape(n_w, n_t * n)
    dense = sets.dense[rows]
    if dense.any():
        _read_table(flat, table, sets.matrix, rows, cell, np.flatnonzero(dense))
    sparse = np.flatnonzero(~dense)
    if len(sparse) == 0:
        return
    n_cols = table.shape[1]
    by_cell = table.reshape(-1, n_w)
    sizes = sets.indptr[rows[sparse] + 1] - sets.indptr[rows[sparse]]
    ends = np.cumsum(sizes)
    per_chunk = CELLS_PER_PRODUCT // 4
    lo = 0
    while lo < len(sparse):
        hi = max(int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + per_chunk, "right")), lo + 1)
        f = sparse[lo:hi]
        i, j = expand_ranges(sets.indptr[rows[f]], sets.indptr[rows[f] + 1])
        values = np.take(by_cell, np.take(cell, f[i]) * n_cols + np.take(sets.indices, j), axis=0)
        _add_runs(flat, f[i], np.ascontiguousarray(values.T))  # the cells read, not the table, made weight rows
        lo = hi
    flip = sparse[sets.complement[rows[sparse]]]
    if len(flip):
        cells, at = bounded_unique(cell[flip], len(table))  # the boundaries read, not every one
        totals = table[cells].sum(axis=1, dtype=np.float64)
        flat[:, flip] = totals[at].T - flat[:, flip]


def _read_table(flat: np.ndarray, table: np.ndarray, sets: np.ndarray, rows: np.ndarray, cell: np.ndarray,
                which: np.ndarray) -> None:
    """``flat[:, q]``: row ``rows[q]`` of ``sets`` times the table at boundary ``cell[q]``, for the ``q`` in ``which``.

    Queries sorted by boundary are gathered and converted a chunk at a time (one call for
    hundreds of rows, few enough to stay in cache, :data:`READ_CELLS`), then each run of queries at one boundary is one product of its
    slice with that boundary's table: per boundary a product, no gather or conversion of
    its own (those per-boundary calls were a third of the read).
    """
    n_w = flat.shape[0]
    order = which[np.argsort(cell[which], kind="stable")]
    cells = cell[order]
    chunk = max(1, READ_CELLS // max(table.shape[1], 1))
    for lo in range(0, len(order), chunk):
        q, c = order[lo : lo + chunk], cells[lo : lo + chunk]
        held = np.take(sets, np.take(rows, q), axis=0).astype(table.dtype)
        sums = np.empty((len(q), n_w), table.dtype)
        starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        for a, z in zip(starts.tolist(), np.r_[starts[1:], len(q)].tolist()):  # boundaries, not queries
            np.matmul(held[a:z], table[c[a]], out=sums[a:z])
        flat[:, q] = sums.T


def expand_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) for every i and every j in ``range(lo[i], hi[i])`` (an empty range gives nothing).

    Examples
    --------
    >>> [a.tolist() for a in expand_ranges(np.array([2, 0, 5]), np.array([4, 0, 6]))]
    [[0, 0, 2], [2, 3, 5]]
    """
    sizes = np.maximum(hi - lo, 0)
    i = np.repeat(np.arange(len(lo)), sizes)
    first = np.r_[0, np.cumsum(sizes)[:-1]]
    return i, np.arange(int(sizes.sum())) - np.repeat(first - lo, sizes)


def dominance_sums(
    *,
    sets: np.ndarray | RowSets,
    query_row: np.ndarray,
    query_level: np.ndarray,
    query_x: np.ndarray,
    item_col: np.ndarray,
    item_level: np.ndarray,
    item_x: np.ndarray,
    weights: np.ndarray,
) -> np.ndarray:
    """Like :func:`binned_sums`, over the items whose level is above the query's (``item_level > query_level``).

    Query levels are cut into bands; within a band, the items above its top
    level count for every query through :func:`binned_sums`, and the items
    between a query's level and the top, pair by pair. A level with many
    queries closes its band, so its queries have no such pair.

    Examples
    --------
    >>> dominance_sums(sets=np.array([[True]]), query_row=np.array([0, 0]), query_level=np.array([0, 1]),
    ...     query_x=np.array([[5.0, 5.0]]), item_col=np.array([0, 0, 0]), item_level=np.array([1, 2, 0]),
    ...     item_x=np.array([1.0, 2.0, 3.0]), weights=np.array([[1.0, 10.0, 100.0]])).tolist()
    [[[11.0, 10.0]]]
    """
    query_x = np.atleast_2d(query_x)
    n_t, n = query_x.shape
    out = np.zeros((len(weights), n_t, n))
    if n == 0 or len(item_x) == 0:
        return out
    sets = row_sets(sets)
    levels, level_at = np.unique(query_level, return_inverse=True)
    level_at = level_at.ravel()
    sorted_levels = np.sort(item_level)
    at_or_below = np.searchsorted(sorted_levels, levels, "right")
    budget = max(MIN_BAND_ITEMS, len(item_x) // BANDS)
    heavy = np.bincount(level_at, minlength=len(levels)) >= max(1, n // BANDS)
    # Level k tops its band when it is heavy or the next level starts a new budget of items.
    top = heavy | np.r_[at_or_below[1:] // budget != at_or_below[:-1] // budget, True]
    band = np.r_[0, np.cumsum(top)[:-1]]
    by_band = np.argsort(band[level_at], kind="stable")
    bounds = np.searchsorted(band[level_at][by_band], np.arange(band[-1] + 2))
    tops = levels[top]
    heavy_band = heavy[top]  # a band closed by a heavy level holds that level's queries alone
    light = np.flatnonzero(~heavy_band[band[level_at]])
    fused = len(light) > 0 and _fuse_light_bands(sets, item_col, item_level > tops[~heavy_band].min())
    for b in np.flatnonzero(heavy_band if fused else np.ones(len(tops), bool)):
        q = by_band[bounds[b] : bounds[b + 1]]
        above = item_level > tops[b]
        out[:, :, q] = binned_sums(sets=sets, query_row=query_row[q], query_x=query_x[:, q], item_col=item_col[above],
                                   item_x=item_x[above], weights=weights[:, above])
    if fused:
        light_bands, local = bounded_unique(band[level_at][light], len(tops))  # the light bands, numbered among them
        out[:, :, light] = _band_sums(sets, local, tops[light_bands], query_row[light], query_x[:, light], item_col,
                                      item_level, item_x, weights)
    for b in range(band[-1] + 1):
        q = by_band[bounds[b] : bounds[b + 1]]
        between = np.flatnonzero((item_level <= tops[b]) & (item_level > query_level[q].min()))
        if len(between):
            _pairs_above(out, q, between, sets, query_row, query_level, query_x, item_col, item_level, item_x, weights)
    return out


def _fuse_light_bands(sets: RowSets, item_col: np.ndarray, light_items: np.ndarray) -> bool:
    """Whether the light bands are summed in one pass (:func:`_band_sums`) rather than by a call each.

    One pass wins when one cut narrows its table (arrivals fall in a few of the signature
    columns); where the items fill nearly every column (pops by workers), a call per band reads
    fewer columns, as its own sweep and cut drop the workers with few pops above its top.
    """
    present = np.count_nonzero(np.bincount(item_col[light_items], minlength=sets.matrix.shape[1]))
    return present <= COMPACT_BELOW * sets.matrix.shape[1]


def _band_sums(sets: RowSets, query_band: np.ndarray, tops: np.ndarray, query_row: np.ndarray, query_x: np.ndarray,
               item_col: np.ndarray, item_level: np.ndarray, item_x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``out[m, t, q]``: :func:`binned_sums` of the items above ``tops[query_band[q]]``, for every band in one pass.

    Light bands hold a few hundred queries each; a call of :func:`binned_sums` per band
    sorted, cut and planned its items again each time, and swept many of them (a worker
    holds few pops above a high priority). Here each item is listed once per band it
    counts for, the bands' lists one after another in ``x`` order, and one table holds,
    per band, the sums at every ``step`` items of its list (a step per band, balancing its
    table against its queries' pairs); a query reads its band's boundary just below its
    threshold over its band's columns only (:func:`_columns_by_level`) and adds the items of
    its list between the two pair by pair.
    Items of rare columns (:func:`_rare_items`) are swept band by band, as before.
    """
    n_t, n = query_x.shape
    n_bands, n_w = len(tops), len(weights)
    out = np.zeros((n_w, n_t, n))
    rare = _rare_items(sets.matrix.shape[1], query_row, n_t * n, item_col, n_w)
    if rare.any():
        bands, band_at = bounded_unique(query_band, n_bands)
        by_band = np.argsort(band_at, kind="stable")
        bounds = np.searchsorted(band_at[by_band], np.arange(len(bands) + 1))
        for k, b in enumerate(bands):  # bands, not requests: a few dozen
            q = by_band[bounds[k] : bounds[k + 1]]
            its = np.flatnonzero(rare & (item_level > tops[b]))
            if len(its):
                out[:, :, q] = _row_sweep(sets.matrix, query_row[q], query_x[:, q], item_col[its], item_x[its],
                                          weights[:, its])
    kept = np.flatnonzero(~rare & (item_level > tops[0]))
    if len(kept) == 0:
        return out
    sets, query_row, col = _compact(sets, query_row, item_col[kept])
    rows, query_row = bounded_unique(query_row, len(sets.matrix))  # the queried rows only, reordered below
    matrix, col, width = _columns_by_level(np.take(sets.matrix, rows, axis=0), col, item_level[kept], tops)
    order = np.argsort(item_x[kept], kind="stable")
    xs, col = np.take(item_x[kept], order), np.take(col, order).astype(np.int64)
    w = _reorder(weights, kept[order])
    # Entry (band b, item j) for every band whose top is below the item's level; band-major, x order within.
    slot = np.searchsorted(tops, item_level[kept][order], "left")  # the item counts for bands b < slot
    item, band = expand_ranges(np.zeros(len(xs), np.int64), slot)
    by_band = np.argsort(band, kind="stable")
    item, band = item[by_band], band[by_band]
    seg = np.searchsorted(band, np.arange(n_bands + 1))  # band b's list: entries seg[b] .. seg[b + 1]
    size = np.diff(seg)
    # The query's place in its band's list: its entries below the threshold (x ranks order entries within a band).
    key = band * (len(xs) + 1) + item
    below = np.searchsorted(key, query_band * (len(xs) + 1) + np.searchsorted(xs, query_x, "left"), "left")
    n_cols = matrix.shape[1]
    per_band = np.bincount(query_band, minlength=n_bands) * n_t
    pair, cell = COSTS["pair"] * per_band / 2, COSTS["cell"] * n_cols * n_w
    step = np.maximum(1, np.rint(np.sqrt(cell * size / np.maximum(pair, 1e-9)))).astype(np.int64)
    cells = np.sum(size // step + 1) * n_cols * n_w
    if cells > BAND_TABLE_CELLS:  # a table within bounds: longer steps, more pairs
        step = step * -(-cells // BAND_TABLE_CELLS)
    boundaries = size // step
    first_cell = np.r_[0, np.cumsum(boundaries + 1)]
    exact32 = bool(np.all(w == np.rint(w)) and np.abs(w).sum(axis=1).max() < 2**24)
    table = _band_table(first_cell, boundaries, seg, step, band, item, col, w, n_cols, np.float32 if exact32 else np.float64)
    start = seg[query_band]
    full = (below - start) // step[query_band]
    part = np.zeros((n_w, n_t, n))
    flat_part = part.reshape(n_w, n_t * n)
    rows, cells, bands = np.tile(query_row, n_t), (first_cell[query_band] + full).ravel(), np.tile(query_band, n_t)
    by_band = np.argsort(bands, kind="stable")
    bounds = np.searchsorted(bands[by_band], np.arange(n_bands + 1))
    for b in np.flatnonzero((np.diff(bounds) > 0) & (width > 0)):  # bands, not requests: each reads its columns only
        _read_table(flat_part, table[:, : width[b]], matrix[:, : width[b]], rows, cells, by_band[bounds[b] : bounds[b + 1]])
    _add_held_pairs(flat_part, matrix, rows, (start + full * step[query_band]).ravel(), below.ravel(), col, w, item)
    return out + part


def _columns_by_level(matrix: np.ndarray, col: np.ndarray, level: np.ndarray, tops: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(matrix, col, width)``: columns ordered by the highest level of their items, so band b's are the first ``width[b]``.

    A band counts the items above its top, which fall in fewer columns the higher the top; each
    band's queries then read only that prefix of their rows (as a call per band read its own cut).

    Examples
    --------
    >>> m, c, w = _columns_by_level(np.array([[True, False, True]]), np.array([0, 2, 2]), np.array([1, 5, 0]), np.array([0, 3]))
    >>> m.tolist(), c.tolist(), w.tolist()
    ([[True, True, False]], [1, 0, 0], [2, 1])
    """
    highest = np.full(matrix.shape[1], np.iinfo(np.int64).min)
    np.maximum.at(highest, col, level.astype(np.int64))
    by_level = np.argsort(highest, kind="stable")[::-1]  # highest first
    place = np.empty(len(by_level), np.int64)
    place[by_level] = np.arange(len(by_level))
    width = len(highest) - np.searchsorted(np.sort(highest), tops, "right")
    return np.ascontiguousarray(matrix[:, by_level]), place[col], width


def _band_table(first_cell, boundaries, seg, step, band, item, col, w, n_cols, dtype) -> np.ndarray:
    """``table[first_cell[b] + k, c, m]``: the sum of ``w[m]`` over the first ``k * step[b]`` entries of band b's list in column c."""
    n_w = len(w)
    at = np.arange(len(item)) - seg[band]
    k = at // step[band] + 1
    inside = k <= boundaries[band]
    cell = ((first_cell[band[inside]] + k[inside]) * n_cols + col[item[inside]]) * n_w
    table = np.bincount((cell[None, :] + np.arange(n_w)[:, None]).ravel(), weights=w[:, item[inside]].ravel(),
                        minlength=first_cell[-1] * n_cols * n_w).astype(dtype, copy=False)
    table = table.reshape(first_cell[-1], n_cols * n_w)
    for k in range(1, int(boundaries.max(initial=0)) + 1):  # boundaries, not items: each step adds every band's row
        rows = first_cell[:-1][boundaries >= k] + k
        table[rows] += table[rows - 1]
    return table.reshape(first_cell[-1], n_cols, n_w)


def _pairs_above(out, q, between, sets, query_row, query_level, query_x, item_col, item_level, item_x, weights) -> None:
    """Add the items of ``between`` whose level is above the query's, for the queries ``q``.

    A band's queries and its items between levels are few (a few hundred each): every
    (query, item) cell is judged in dense blocks, the held cells below each threshold summed by
    one product per threshold, rather than listed pair by pair (several times slower per pair).
    """
    by_level = between[np.argsort(item_level[between], kind="stable")]
    first = np.searchsorted(item_level[by_level], query_level[q], "right")
    cols, xs = np.take(item_col, by_level), np.take(item_x, by_level)
    by_item = np.ascontiguousarray(np.take(weights, by_level, axis=1).T)
    # The block of the queries' rows, then of the items' columns: both bounded.
    chunk = max(1, DENSE_PAIR_CELLS // max(len(by_level), sets.matrix.shape[1], 1))
    for lo in range(0, len(q), chunk):
        b = q[lo : lo + chunk]
        # held[k, j]: query b[k]'s row holds item j's column and the item's level is above the query's.
        held = np.take(np.take(sets.matrix, np.take(query_row, b), axis=0), cols, axis=1)
        held &= np.arange(len(by_level))[None, :] >= first[lo : lo + chunk, None]
        for t in range(query_x.shape[0]):
            below = held & (xs[None, :] < query_x[t, b][:, None])
            out[:, t, b] += (below.astype(np.float64) @ by_item).T
