"""The order of many strings by code point, computed by NumPy on their UTF-8 bytes.

UTF-8 keeps code point order byte for byte, so sorting the encoded cells as
unsigned bytes orders them as Python's ``sorted`` does, without a Python
comparison per pair (about 16 per cell for 50,000 random ids). The cells are
sorted by their first 8 bytes as one big-endian integer; only the rows that
tie are sorted again by their next 8 bytes, until no two rows tie or the
longest cell is used up (the rows still tied are equal, and keep their
order: the sort is stable).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_CHUNK = 8  # bytes per sort key: one uint64


def code_point_order(cells: list[Any]) -> np.ndarray | None:
    """The stable order of ``cells`` by code point, or None when a cell is not a NUL-free valid ``str``.

    Equal to ``sorted(range(len(cells)), key=cells.__getitem__)`` for such
    cells. Bytes past a cell's end read as 0, below every byte of a cell
    without NUL, so a cell sorts before the longer cells it begins.

    Parameters
    ----------
    cells : list of str
        The keys, as read.

    Returns
    -------
    ndarray of int64 or None
        None, when there are two cells or more, for a cell that is not a
        ``str``, holds a NUL or a lone surrogate (not valid UTF-8): sort those
        some other way.

    Examples
    --------
    >>> code_point_order(["b", "a", "ab", "", "a"]).tolist()
    [3, 1, 4, 2, 0]
    >>> code_point_order(["a\\x00", "a"]) is None
    True
    """
    n = len(cells)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    try:
        data = "\x00".join(cells).encode("utf-8")  # the NULs between cells mark where each ends
    except (TypeError, UnicodeEncodeError):
        return None
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 0)
    if len(ends) != n - 1:  # a NUL inside a cell
        return None
    starts = np.zeros(n, dtype=np.int64)
    starts[1:] = ends + 1
    stops = np.full(n, len(buf), dtype=np.int64)
    stops[:-1] = ends
    padded = np.zeros(len(buf) + 1, dtype=np.uint8)  # a zero byte after the last cell, as after the others
    padded[: len(buf)] = buf
    longest = int((stops - starts).max())
    # Cells of one width (uuid ids) are the rows of a matrix: their bytes need no gather.
    grid = padded.reshape(n, longest + 1) if len(padded) == n * (longest + 1) else None

    def chunk(rows: np.ndarray | None, at: int) -> np.ndarray:
        """Bytes ``at`` .. ``at + 8`` of the cells ``rows`` (None: all) as one big-endian integer each (0 past the end)."""
        if grid is not None:
            part = grid[:, at:at + _CHUNK] if rows is None else grid[rows, at:at + _CHUNK]
            taken = np.zeros((len(part), _CHUNK), dtype=np.uint8)
            taken[:, : part.shape[1]] = part
        else:
            first, stop = (starts, stops) if rows is None else (starts[rows], stops[rows])
            taken = np.empty((len(first), _CHUNK), dtype=np.uint8)
            # One byte column at a time: the temporaries are a column of positions, never (rows, 8) of them.
            for byte in range(_CHUNK):
                position = first + (at + byte)
                taken[:, byte] = padded[np.where(position < stop, position, len(buf))]  # the zero byte after the data
        return taken.view(">u8").ravel().astype(np.uint64)

    key = chunk(None, 0)
    order = np.argsort(key, kind="stable")
    key = key[order]
    opens = np.ones(n, dtype=bool)  # a row (in sorted position) that starts a run of tied rows
    opens[1:] = key[1:] != key[:-1]
    at = _CHUNK
    while at < longest:
        run = np.cumsum(opens) - 1
        tied = np.flatnonzero(np.bincount(run)[run] > 1)
        if not len(tied):
            break
        rows, runs = order[tied], run[tied]
        key = chunk(rows, at)
        again = np.lexsort((key, runs))  # within each run (runs ascend), by the next bytes; stable
        order[tied], key = rows[again], key[again]
        opens[tied[1:]] |= key[1:] != key[:-1]  # a new run where the bytes differ, within a run or not
        at += _CHUNK
    return order
