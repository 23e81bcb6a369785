"""A list per row, stored flat: the shape of every list column (models, targets).

A pure helper with no knowledge of the loader, so the core's grouping code can
use it without importing :mod:`vecsched.snapshot.snapshot`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np


@dataclass(frozen=True)
class ListColumn:
    """A list per row, stored flat: row ``i`` is ``values[offsets[i]:offsets[i+1]]``.

    Models are stored as ``int32`` codes into :attr:`Snapshot.model_names`;
    targeted worker ids as strings.
    """

    offsets: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def owners(self) -> np.ndarray:
        """The row index of every value (same length as :attr:`values`)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths)

    def take(self, rows: np.ndarray) -> "ListColumn":
        """The lists of ``rows`` (a boolean mask or integer indices), in that order."""
        rows = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = np.repeat(self.offsets[:-1][rows] - offsets[:-1], lengths)
        return ListColumn(offsets, self.values[np.arange(offsets[-1]) + starts])

    def tolist(self) -> list[list[Any]]:
        values = self.values.tolist()
        offs = self.offsets.tolist()
        return [values[a:b] for a, b in zip(offs[:-1], offs[1:])]

    @classmethod
    def from_lists(cls, lists: Iterable[Iterable[Any]], dtype: Any = object) -> "ListColumn":
        lists = [list(x) for x in lists]
        lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
        offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = [v for x in lists for v in x]
        values = np.empty(len(flat), dtype=dtype)
        values[:] = flat
        return cls(offsets, values)
