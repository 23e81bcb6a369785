"""What every publication store gives: one whole cycle, never a mix (SPEC section 9).

A cycle is written under keys (or rows) of its own, and only then does one
atomic step switch the ``current`` pointer to it; a cycle that fails half-way
was never pointed at, so readers keep the last good one.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class Cycle:
    """One cycle's publication: per-request payloads, horde totals, prospective state.

    The id defaults to :func:`make_cycle_id` of ``time`` and ``interval``.

    Examples
    --------
    >>> c = Cycle(100.0, 5.0, ["r1"], ["[1,100.0]"])
    >>> parse_cycle_id(c.id)[:2]
    (100.0, 5.0)
    """

    time: float
    interval: float
    request_ids: Sequence[str]
    payloads: Sequence[str]
    horde: dict[str, Any] = field(default_factory=dict)
    prospective: bytes = b""
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", make_cycle_id(self.time, self.interval))


@dataclass(frozen=True)
class Reading:
    """What a store read returned: the current cycle's id, time, interval and one value.

    Examples
    --------
    >>> Reading("100.0|5.0|ab", 100.0, 5.0, None).interval
    5.0
    """

    cycle_id: str
    time: float
    interval: float
    value: Any


def make_cycle_id(t: float, interval: float) -> str:
    """``time|interval|token``: readers learn the cycle time from the id alone.

    Parameters
    ----------
    t : float
        The cycle time, epoch seconds.
    interval : float
        The refresh interval, seconds.

    Returns
    -------
    str
        A new id; the random token tells apart two cycles of the same time.

    Examples
    --------
    >>> parse_cycle_id(make_cycle_id(1700000000.25, 5.0))[:2]
    (1700000000.25, 5.0)
    """
    return f"{t!r}|{interval!r}|{secrets.token_hex(4)}"


def parse_cycle_id(cycle_id: str | bytes) -> tuple[float, float, str]:
    """The time, interval and token a cycle id carries.

    Parameters
    ----------
    cycle_id : str or bytes
        An id made by :func:`make_cycle_id` (bytes as Redis returns it).

    Returns
    -------
    tuple of (float, float, str)
        ``(time, interval, token)``.

    Examples
    --------
    >>> parse_cycle_id(b"1700000000.5|5.0|0a1b2c3d")
    (1700000000.5, 5.0, '0a1b2c3d')
    """
    if isinstance(cycle_id, bytes):
        cycle_id = cycle_id.decode()
    t, interval, token = cycle_id.split("|")
    return float(t), float(interval), token


@runtime_checkable
class Store(Protocol):
    """What the job and the readers need of a publication store.

    :class:`RedisStore` and :class:`SQLStore` implement it; every read returns
    None while no cycle was ever published.

    Examples
    --------
    >>> from vecsched.service.store.sql import SQLStore
    >>> isinstance(SQLStore("sqlite://"), Store)
    True
    """

    def publish(self, cycle: Cycle) -> bool:
        """Write ``cycle`` whole, then make it current.

        Parameters
        ----------
        cycle : Cycle

        Returns
        -------
        bool
            False when a newer cycle was already current (nothing switched).
        """
        ...

    def read_status(self, request_id: str) -> Reading | None:
        """The current cycle and one request's payload (value None if the cycle lacks it).

        Parameters
        ----------
        request_id : str

        Returns
        -------
        Reading or None
        """
        ...

    def read_current(self) -> Reading | None:
        """The current cycle alone (value None), as cheaply as the store can.

        Returns
        -------
        Reading or None
        """
        ...

    def read_prospective(self) -> Reading | None:
        """The current cycle and its prospective-request state (bytes).

        Returns
        -------
        Reading or None
        """
        ...

    def read_meta(self) -> Reading | None:
        """The current cycle and its horde totals.

        Returns
        -------
        Reading or None
        """
        ...

    def close(self) -> None:
        """Release the store's connections."""
        ...


def _reading(got: Any, convert: Any) -> Reading | None:
    if not got:
        return None
    cycle_id, value = got[0], got[1] if len(got) > 1 else None
    cycle_id = cycle_id.decode() if isinstance(cycle_id, bytes) else cycle_id
    t, interval, _ = parse_cycle_id(cycle_id)
    return Reading(cycle_id, t, interval, convert(value))


def now() -> float:
    """Wall-clock epoch seconds (the default clock).

    Returns
    -------
    float

    Examples
    --------
    >>> now() > 1.6e9
    True
    """
    return time.time()
