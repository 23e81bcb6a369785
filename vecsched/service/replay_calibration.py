"""What the job hands dispatch-replay-v1 as ``calibration``: its own recent validated pairs.

Read from the pair store at most once per ``refresh`` seconds (the pairs of a
rolling window change slowly; reading them every cycle would cost a round trip
per series), and handed to :func:`vecsched.estimate` as
``calibration={"dispatch-replay-v1": ...}`` (see :mod:`vecsched.core.calibration`).
"""

from __future__ import annotations

import logging
from typing import Any

from vecsched.core.calibration import from_pairs
from vecsched.core.replay import NAME

log = logging.getLogger(__name__)
REFRESH_SECONDS = 600.0


class ReplayCalibration:
    """A cached ``calibration`` mapping built from a pair backend's window.

    Examples
    --------
    >>> from vecsched.core.pairing import MemoryPairs, Pair
    >>> store = MemoryPairs()
    >>> store.add_pairs([Pair(NAME, "text", "start", "r1", 100.0, 10.0, 70.0, 15.0, False)])
    >>> ReplayCalibration(store, window=3600.0).get(now=200.0)[NAME]["pairs"]["observed"].tolist()
    [15.0]
    """

    def __init__(self, backend: Any, *, window: float, refresh: float = REFRESH_SECONDS):
        self.backend = backend
        self.window = window
        self.refresh = refresh
        self.read_at = float("-inf")
        self.value: dict[str, Any] = {}

    def get(self, *, now: float) -> dict[str, Any]:
        """The calibration mapping for a cycle at ``now`` (the last good one if the store fails)."""
        if now - self.read_at >= self.refresh:
            try:
                every = self.backend.pairs(now - self.window, now)
                self.value = {NAME: from_pairs([p for p in every if p.estimator == NAME], no_capacity=every)}
                self.read_at = now
            except Exception as exc:  # a calibration read never fails a cycle
                log.warning("replay calibration not refreshed: %s", type(exc).__name__)
        return self.value
