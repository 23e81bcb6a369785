"""The job's section 7 sums, handed from each cycle's estimate to the next (:mod:`vecsched.core.stall_cache`)."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from vecsched.core.stall_cache import REFRESH_SECONDS, StallSums, check_refresh


class StallRefresh:
    """Keeps the last estimate's :class:`~vecsched.core.stall_cache.StallSums` for the next cycle's.

    Parameters
    ----------
    refresh : float, default 60
        Seconds of a request's age between two computations of its sums; 0:
        every cycle computes every request's (nothing is kept).

    Examples
    --------
    >>> import vecsched
    >>> from vecsched import synthetic
    >>> kept = StallRefresh()
    >>> estimate = kept.wrap(vecsched.estimate)
    >>> snap = synthetic.horde(workers=20, requests=200, seed=1)
    >>> first = estimate(snap)
    >>> len(kept.sums) == len(first.stall_sums)
    True
    """

    def __init__(self, refresh: float = REFRESH_SECONDS):
        self.refresh = check_refresh(refresh)
        self.sums: StallSums | None = None

    def wrap(self, estimate: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """``estimate`` (default :func:`vecsched.estimate`) handed the kept sums, keeping its own; an
        estimate that takes no ``stall_sums`` is returned as it is."""
        from vecsched.core.estimate import estimate as core_estimate

        base = core_estimate if estimate is None else estimate
        try:
            parameters = inspect.signature(base).parameters
        except (TypeError, ValueError):
            parameters = {}
        if "stall_sums" not in parameters:
            return base

        # wraps: the signature stays base's, so the forecast tracker still sees what it may pass.
        @functools.wraps(base)
        def refreshed(snapshot: Any, **kwargs: Any) -> Any:
            estimates = base(snapshot, stall_sums=self.sums if self.refresh > 0 else None,
                             stall_refresh=self.refresh, **kwargs)
            self.sums = getattr(estimates, "stall_sums", None) if self.refresh > 0 else None
            return estimates

        return refreshed
