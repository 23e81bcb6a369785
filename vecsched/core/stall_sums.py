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
from dataclasses import dataclass

import numpy as np

CELLS_PER_PRODUCT = 1 << 22
PAIR_COST = 8.0  # a pair within a bin against a cell of the table
MAX_BINS = 1024
BINS_PER_READ = 4
SPARSE_BELOW = 0.03  # a row's stored side this dense or less is read column by column
BANDS = 32
MIN_BAND_ITEMS = 16  # a light band holds at least this many items between its levels


@dataclass(frozen=True)
class RowSets:
    """A boolean (row, column) matrix with its sparser side in compressed rows.

    ``complement``: the compressed side is the columns a row does not hold.
    ``indptr`` / ``indices`` are empty when neither side is sparse enough to be
    read column by column (:data:`SPARSE_BELOW`).
    """

    matrix: np.ndarray
    complement: bool
    indptr: np.ndarray
    indices: np.ndarray

    @property
    def sparse(self) -> bool:
        return len(self.indptr) > 0


def row_sets(matrix: np.ndarray | RowSets) -> RowSets:
    """``matrix`` with its sparser side compressed when it is sparse enough.

    Examples
    --------
    >>> held = np.ones((2, 20), dtype=bool)
    >>> held[1, 3] = False
    >>> s = row_sets(held)
    >>> s.complement, s.indptr.tolist(), s.indices.tolist()
    (True, [0, 0, 1], [3])
    """
    if isinstance(matrix, RowSets):
        return matrix
    density = float(matrix.mean()) if matrix.size else 0.0
    complement = density > 0.5
    empty = np.zeros(0, np.int64)
    if min(density, 1.0 - density) > SPARSE_BELOW:
        return RowSets(matrix, complement, empty, empty)
    row, col = np.nonzero(~matrix if complement else matrix)
    return RowSets(matrix, complement, np.searchsorted(row, np.arange(len(matrix) + 1)), col.astype(np.int64))


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
    query_x = np.atleast_2d(query_x)
    n_t, n = query_x.shape
    out = np.zeros((len(weights), n_t, n))
    e = len(item_x)
    if n == 0 or e == 0:
        return out
    sets = row_sets(sets)
    order = np.argsort(item_x, kind="stable")
    xs, col, w = item_x[order], item_col[order].astype(np.int64), weights[:, order].astype(np.float64)
    below = np.searchsorted(xs, query_x, "left")
    # Bins balance the table (columns x bins) against the pairs within a bin (queries x items per bin).
    n_bins = int(np.clip(np.sqrt(PAIR_COST * n_t * n * e / (sets.matrix.shape[1] * len(weights) + 1)), 1, min(e, MAX_BINS)))
    step = -(-e // n_bins)
    full = below // step
    # Single precision when every weight is a count whose sums stay below 2**24 (exact); else double.
    exact32 = bool(np.all(w == np.rint(w)) and np.abs(w).sum(axis=1).max() < 2**24)
    table = _table(sets.matrix.shape[1], col, w, n_bins, step).astype(np.float32 if exact32 else np.float64)
    # A threshold above every item reads each row's totals.
    everything = np.all(below == e, axis=1)
    rows, row_at = np.unique(query_row, return_inverse=True)
    totals = sets.matrix[rows].astype(table.dtype) @ table.reshape(len(table), -1, len(w))[:, -1] if everything.any() else None
    some = np.flatnonzero(~everything)
    if len(some):
        part = np.zeros((len(w), len(some), n))
        _read(part, table, sets, query_row, full[some])
        out[:, some] = part
    for t in np.flatnonzero(everything):
        out[:, t] = totals[row_at.ravel()].T
        full[t] = below[t]  # no pair left to add
    # The items between the boundary and each threshold, pair by pair.
    flat, item = expand_ranges(full.ravel() * step, below.ravel())
    row = np.tile(query_row, n_t)[flat]
    held = sets.matrix[row, col[item]]
    flat, item = flat[held], item[held]
    for m in range(len(w)):
        out[m] += np.bincount(flat, weights=w[m, item], minlength=n_t * n).reshape(n_t, n)
    return out


def _table(n_cols: int, col: np.ndarray, w: np.ndarray, n_bins: int, step: int) -> np.ndarray:
    """``table[c, b * nw + m]``: the sum of ``w[m]`` over the first ``b * step`` items of column ``c``."""
    n_w = len(w)
    cell = col * (n_bins + 1) + np.arange(len(col)) // step + 1
    table = np.stack([np.bincount(cell, weights=w[m], minlength=n_cols * (n_bins + 1)) for m in range(n_w)], axis=-1)
    return np.cumsum(table.reshape(n_cols, n_bins + 1, n_w), axis=1).reshape(n_cols, -1)


def _read(out: np.ndarray, table: np.ndarray, sets: RowSets, query_row: np.ndarray, full: np.ndarray) -> None:
    """Each (query, threshold)'s row of ``sets`` times the table at its boundary."""
    if not sets.sparse:
        _read_table(out, table, sets.matrix, query_row, full)
        return
    n_w, n_t, n = out.shape
    table = table.reshape(-1, n_w)
    n_cells = table.shape[0] // max(sets.matrix.shape[1], 1)
    rows, cell = np.tile(query_row, n_t), full.ravel()
    flat = out.reshape(n_w, n_t * n)
    # Column by column over the stored side, a chunk of (query, threshold)s at a time.
    sizes = sets.indptr[rows + 1] - sets.indptr[rows]
    per_chunk = max(1, CELLS_PER_PRODUCT // max(int(sizes.max(initial=1)), 1))
    for lo in range(0, len(rows), per_chunk):
        f = np.arange(lo, min(lo + per_chunk, len(rows)))
        i, j = expand_ranges(sets.indptr[rows[f]], sets.indptr[rows[f] + 1])
        values = table[sets.indices[j] * n_cells + cell[f[i]]]
        for m in range(n_w):
            flat[m, f] = np.bincount(i, weights=values[:, m], minlength=len(f))
    if sets.complement:
        flat[:] = table.reshape(-1, n_cells, n_w).sum(axis=0)[cell].T - flat


def _read_table(out: np.ndarray, table: np.ndarray, sets: np.ndarray, query_row: np.ndarray, full: np.ndarray) -> None:
    """Each (query, threshold)'s row of ``sets`` times the table at its boundary.

    Queries are taken by runs of :data:`BINS_PER_READ` boundaries: one product
    per run of the queries' rows with those boundaries' columns, so each query
    costs a few columns rather than every boundary of every row.
    """
    n_w, n_t, n = out.shape
    n_cols = table.shape[0]
    table = table.reshape(n_cols, -1, n_w)
    rows, cell = np.tile(query_row, n_t), full.ravel()
    order = np.argsort(cell, kind="stable")
    edges = np.searchsorted(cell[order], np.arange(0, table.shape[1] + BINS_PER_READ, BINS_PER_READ))
    flat = out.reshape(n_w, n_t * n)
    chunk = max(1, CELLS_PER_PRODUCT // max(n_cols, 1))
    for b, (lo, hi) in enumerate(itertools.pairwise(edges)):
        first = b * BINS_PER_READ
        block = table[:, first : first + BINS_PER_READ].reshape(n_cols, -1)
        for start in range(lo, hi, chunk):
            q = order[start : min(hi, start + chunk)]
            sums = (sets[rows[q]].astype(table.dtype) @ block).reshape(len(q), -1, n_w)
            flat[:, q] = sums[np.arange(len(q)), cell[q] - first].T


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
    band_top = levels[top][band]
    by_band = np.argsort(band[level_at], kind="stable")
    bounds = np.searchsorted(band[level_at][by_band], np.arange(band[-1] + 2))
    for b in range(band[-1] + 1):
        q = by_band[bounds[b] : bounds[b + 1]]
        high = band_top[b == band][0]
        above = item_level > high
        out[:, :, q] = binned_sums(sets=sets, query_row=query_row[q], query_x=query_x[:, q], item_col=item_col[above],
                                   item_x=item_x[above], weights=weights[:, above])
        between = np.flatnonzero(~above & (item_level > query_level[q].min()))
        if len(between):
            _pairs_above(out, q, between, sets, query_row, query_level, query_x, item_col, item_level, item_x, weights)
    return out


def _pairs_above(out, q, between, sets, query_row, query_level, query_x, item_col, item_level, item_x, weights) -> None:
    """Add the items of ``between`` whose level is above the query's, pair by pair, for the queries ``q``."""
    by_level = between[np.argsort(item_level[between], kind="stable")]
    first = np.searchsorted(item_level[by_level], query_level[q], "right")
    i, j = expand_ranges(first, np.full(len(q), len(by_level)))
    qq, item = q[i], by_level[j]
    held = sets.matrix[query_row[qq], item_col[item]]
    qq, item = qq[held], item[held]
    for t in range(query_x.shape[0]):
        low = item_x[item] < query_x[t, qq]
        for m in range(len(weights)):
            out[m, t] += np.bincount(qq[low], weights=weights[m, item[low]], minlength=out.shape[2])
