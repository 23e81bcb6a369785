"""``vecsched top``: the current cycle's requests, longest wait first.

Reads the whole current cycle from the store (one HGETALL on Redis, one
SELECT on SQL); an operator's view, not a hot path.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from vecsched.service.payload import decode_payload
from vecsched.service.store.base import Reading, Store
from vecsched.service.store.redis import RedisStore
from vecsched.service.store.sql import SQLStore

COLUMNS = ("gentype", "queue_position", "wait_time", "eligible_workers", "fallback", "might_stall")
"""What ``top`` shows per request (``might_stall`` once the payload carries it)."""


def current_payloads(store: Store) -> tuple[Reading | None, dict[str, str]]:
    """The current cycle and every request payload it holds.

    Parameters
    ----------
    store : Store
        A :class:`~vecsched.service.store.redis.RedisStore` or :class:`~vecsched.service.store.sql.SQLStore`.

    Returns
    -------
    (Reading or None, dict)
        The cycle (None when none was published) and request id to payload.

    Examples
    --------
    >>> from vecsched.service.store.base import Cycle
    >>> store = SQLStore("sqlite://")
    >>> _ = store.publish(Cycle(1.0, 5.0, ["r1"], ["[1,1.0]"]))
    >>> current_payloads(store)[1]
    {'r1': '[1,1.0]'}
    """
    if isinstance(store, RedisStore):
        return _redis_payloads(store)
    if isinstance(store, SQLStore):
        return _sql_payloads(store)
    raise TypeError(f"cannot list the requests of a {type(store).__name__}")


def _redis_payloads(store: RedisStore) -> tuple[Reading | None, dict[str, str]]:
    current = store.read_current()
    if current is None:
        return None, {}
    return current, store.payloads(current.cycle_id)


def _sql_payloads(store: SQLStore) -> tuple[Reading | None, dict[str, str]]:
    import sqlalchemy as sa

    from vecsched.service.store.sql import vs_current, vs_status

    current = store.read_current()
    if current is None:
        return None, {}
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(vs_status.c.request_id, vs_status.c.payload)
            .join(vs_current, vs_current.c.cycle_id == vs_status.c.cycle_id)
            .where(vs_current.c.slot == 0)
        ).all()
    return current, dict(rows)


def top_frame(payloads: dict[str, str], *, gentype: str | None = None, limit: int = 20) -> pd.DataFrame:
    """Waiting requests, longest ``wait_time`` first (unknown waits last), ``limit`` of them.

    Parameters
    ----------
    payloads : dict
        Request id to payload, as :func:`current_payloads` returns.
    gentype : {"text", "image"}, optional
        Only this gentype.
    limit : int, default 20
        Rows kept; 0 keeps every row.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``id``; the :data:`COLUMNS` the payloads carry.

    Examples
    --------
    >>> rows = {"a": "[1,1.0,0,1,2,1,1,5.0,2.0,1,5.0,0,1,0,0,0]",
    ...         "b": "[1,1.0,0,3,6,1,2,41.6,20.0,4,50.0,0,1,0,0,0]",
    ...         "c": '{"ended":"done"}'}
    >>> top_frame(rows)[["queue_position", "wait_time"]].to_dict("index")
    {'b': {'queue_position': 2, 'wait_time': 41.6}, 'a': {'queue_position': 1, 'wait_time': 5.0}}
    """
    # Ended requests (published as {"ended": ...}) wait no more: not listed.
    records = [dict(decode_payload(p), id=rid) for rid, p in payloads.items() if not p.startswith("{")]
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=["id", *COLUMNS])
    frame = frame.set_index("id")
    if gentype is not None:
        frame = frame[frame["gentype"] == gentype]
    frame = frame.sort_values("wait_time", ascending=False, na_position="last", kind="stable")
    keep = [c for c in COLUMNS if c in frame.columns]
    frame = frame[keep]
    return frame.head(limit) if limit else frame


def render(frame: pd.DataFrame, reading: Reading) -> str:
    """A terminal table of ``frame`` under a line naming the cycle.

    Parameters
    ----------
    frame : pandas.DataFrame
        From :func:`top_frame`.
    reading : Reading
        The cycle it came from.

    Returns
    -------
    str

    Examples
    --------
    >>> frame = top_frame({"a": "[1,1.0,0,1,2,1,1,5.0,2.0,1,5.0,0,1,0,0,0]"})
    >>> print(render(frame, Reading("1.0|5.0|x", 1.0, 5.0, None)).splitlines()[0])
    cycle 1970-01-01T00:00:01Z: 1 requests shown, longest wait first
    """
    from vecsched.snapshot.times import iso

    head = f"cycle {iso(reading.time)}: {len(frame)} requests shown, longest wait first"
    if frame.empty:
        return head + "\n(no waiting request)"
    shown = frame.copy()
    shown["wait_time"] = shown["wait_time"].map(lambda v: "unknown" if pd.isna(v) else f"{v:.0f}s")
    return head + "\n" + shown.to_string()


def as_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """``frame`` as JSON-ready records (``id`` first, unknown waits as null).

    Parameters
    ----------
    frame : pandas.DataFrame
        From :func:`top_frame`.

    Returns
    -------
    list of dict

    Examples
    --------
    >>> as_records(top_frame({"a": "[1,1.0,0,1,2,1,1,null,2.0,1,5.0,1,1,0,0,0]"}))[0]["wait_time"] is None
    True
    """
    out = frame.reset_index().astype(object).where(frame.reset_index().notna(), None)
    return out.to_dict("records")


__all__ = ["COLUMNS", "as_records", "current_payloads", "render", "top_frame"]
