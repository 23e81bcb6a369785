"""Section 7's sums kept from one cycle to the next, each request's refreshed once a minute of its age.

The sums behind might_stall (pops, returns and arriving work over each
request's window) are most of a cycle's cost, and the horde's own status path
does not recompute them at every poll either: it keeps a request's worker
availability and its assignment pressure for 60 s. The job does the same, but
per request and staggered: a request's sums are computed at its first sighting
and again each time its age passes a multiple of ``refresh`` seconds (and when
its window reaches the 120 s that section 7 needs), so each cycle computes
about ``interval / refresh`` of the queue, never all of it at once.

What is not kept is judged live, every cycle: whether a job is in flight, the
eligible threads T (evidence compares counts with T), the window's length, and
the evidence itself, from the kept sums and those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

REFRESH_SECONDS = 60.0  # as long as the horde keeps a request's availability and pressure


def check_refresh(refresh: float) -> float:
    """``refresh`` as a float, or a ValueError that says what it must be (0: every cycle)."""
    if isinstance(refresh, bool) or not isinstance(refresh, (int, float)) or not math.isfinite(refresh) or refresh < 0:
        raise ValueError(f"stall_refresh must be a finite number of seconds >= 0 (0: every cycle), not {refresh!r}")
    return float(refresh)


@dataclass(frozen=True)
class StallSums:
    """Per request looked at by section 7's sums: when they were computed, and what they were.

    Attributes
    ----------
    ids : pandas.Index
        Request ids (unique).
    created, evaluated_at : ndarray of float64
        Each request's creation time, and the cycle time its sums were computed at.
    counts : ndarray of int64, shape (2, n)
        Matched returns per half of the window.
    halves : ndarray of float64, shape (4, n)
        Arriving work per half, then returned work per half.
    incomplete : ndarray of bool
        A return whose dispatch is unknown was seen.
    figures : ndarray of int64, shape (4, n)
        ``dispatch_opportunities``, ``lost_opportunities``, ``returned_capacity``,
        ``active_preceding_dispatches``.

    Examples
    --------
    >>> sums = StallSums.of(["a", "b"], created=np.array([0.0, 50.0]), evaluated_at=np.array([10.0, 55.0]),
    ...                     counts=np.zeros((2, 2), np.int64), halves=np.zeros((4, 2)),
    ...                     incomplete=np.zeros(2, bool), figures=np.zeros((4, 2), np.int64))
    >>> found, kept = sums.kept(np.array(["a", "b", "c"], dtype=object), np.array([0.0, 50.0, 70.0]), now=65.0,
    ...                         refresh=60.0)
    >>> kept.tolist()  # a: its age passed 60 s since; b: still in its first minute; c: never seen
    [False, True, False]
    """

    ids: pd.Index
    created: np.ndarray
    evaluated_at: np.ndarray
    counts: np.ndarray
    halves: np.ndarray
    incomplete: np.ndarray
    figures: np.ndarray

    @classmethod
    def of(cls, ids, **arrays: np.ndarray) -> StallSums:
        """Sums of the requests ``ids``, their arrays as given."""
        return cls(ids=pd.Index(np.asarray(ids, dtype=object)), **arrays)

    @classmethod
    def empty(cls) -> StallSums:
        return cls.of([], created=np.zeros(0), evaluated_at=np.zeros(0), counts=np.zeros((2, 0), np.int64),
                      halves=np.zeros((4, 0)), incomplete=np.zeros(0, bool), figures=np.zeros((4, 0), np.int64))

    def __len__(self) -> int:
        return len(self.ids)

    def kept(self, ids: np.ndarray, created: np.ndarray, *, now: float, refresh: float,
             min_window: float = 120.0) -> tuple[np.ndarray, np.ndarray]:
        """``(found, kept)``: each request's position in these sums (-1: none) and whether they still hold at ``now``.

        Sums hold while the request's age has passed no multiple of
        ``refresh`` since they were computed, its window has not reached
        ``min_window`` since, its creation time is the one they were computed
        for and the clock has not gone back. ``refresh`` 0: none holds.
        """
        found = self.ids.get_indexer(ids) if len(self) and len(ids) else np.full(len(ids), -1, np.int64)
        found = np.asarray(found, np.int64)
        if refresh <= 0 or not len(ids) or not len(self):
            # No sums kept (a cycle of an empty queue): none holds, and none may be indexed.
            return found, np.zeros(len(ids), bool)
        at = np.where(found >= 0, self.evaluated_at[found], np.inf)
        same = (found >= 0) & (self.created[found] == created)
        age_now, age_then = now - created, at - created
        same_minute = np.floor(age_now / refresh) == np.floor(age_then / refresh)
        same_side = (age_now < min_window) == (age_then < min_window)
        return found, same & (at <= now) & same_minute & same_side

    @staticmethod
    def concat(parts: list[StallSums | None]) -> StallSums:
        """One :class:`StallSums` of ``parts`` (their ids disjoint; None: none), in order."""
        parts = [p for p in parts if p is not None]
        if not parts:
            return StallSums.empty()
        return StallSums.of(
            np.concatenate([p.ids.to_numpy(dtype=object) for p in parts]),
            created=np.concatenate([p.created for p in parts]),
            evaluated_at=np.concatenate([p.evaluated_at for p in parts]),
            counts=np.concatenate([p.counts for p in parts], axis=1),
            halves=np.concatenate([p.halves for p in parts], axis=1),
            incomplete=np.concatenate([p.incomplete for p in parts]),
            figures=np.concatenate([p.figures for p in parts], axis=1),
        )
