"""What the HTTP routes answer, as plain data: the mapping into the AI Horde's shapes.

Nothing here knows Flask: :func:`horde_answer` turns one store reading, the
database's live progress and the cycle's horde totals into an :class:`Answer`
(status code, JSON body, headers), so every case is testable without a server.

The horde's shapes (horde-sdk 0.33.3, models ``RequestStatusKobold``,
``RequestStatusStable`` and ``RequestStatusCheck``) require ``wait_time``,
``queue_position``, ``kudos``, ``waiting``, ``processing``, ``finished``,
``restarted`` and ``done``; every answer of :func:`horde_answer` carries them.
Where vecsched has no figure, the horde's own defaults stand in:
``wait_time`` 0 with ``is_possible`` false when no worker is online,
``might_stall`` false when the cycle carries no stall verdict, ``kudos`` 0 when
the database no longer holds the request, ``generations`` ``[]`` (the horde
merges its own). ``is_possible``, optional in those shapes, is left out for a
request newer than the cycle while nothing of it is in flight (not known yet).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from vecsched.core.figures import wait_time
from vecsched.service.payload import decode_payload
from vecsched.service.read import _ended, cycle_age  # the one decoder of ENDED_PAYLOADS, the one staleness rule
from vecsched.service.progress import RequestProgress
from vecsched.service.store.base import Reading
from vecsched.snapshot.times import iso as _iso

MAX_ID_LENGTH = 1024
"""Longer ids answer 404 without a lookup: no horde id is anywhere near this long."""

SHAPES: dict[str, tuple[str, bool]] = {
    # shape -> (gentype the horde serves on that path, carries ``generations``)
    "text_status": ("text", True),
    "image_status": ("image", True),
    "image_check": ("image", False),
}


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status code, JSON body, extra headers.

    Examples
    --------
    >>> Answer(404, {"message": "x", "rc": "RequestNotFound"}).status
    404
    """

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def error(status: int, rc: str, message: str, headers: Mapping[str, str] | None = None) -> Answer:
    """The horde's error body ``{"message": ..., "rc": ...}``.

    Examples
    --------
    >>> error(404, "RequestNotFound", "no such request").body
    {'message': 'no such request', 'rc': 'RequestNotFound'}
    """
    return Answer(status, {"message": message, "rc": rc}, dict(headers or {}))


def not_found() -> Answer:
    """404 for an id neither the cycle nor the database knows (the id is not echoed)."""
    return error(404, "RequestNotFound", "The request was not found.")


def usable_id(request_id: str) -> bool:
    """Whether an id is worth a lookup: not empty, not absurdly long, no NUL, valid UTF-8.

    PostgreSQL text cannot hold a NUL (the query fails with a DataError), and
    no horde id does (the horde answers 404 for an id that is not a UUID), so
    such an id is unknown on every database alike.

    Examples
    --------
    >>> usable_id("0b4f2d5e-7e34-4d7c-9d0a-1f1f2a3b4c5d"), usable_id("x" * 5000), usable_id("\\udcff")
    (True, False, False)
    >>> usable_id("abc\\x00def")
    False
    """
    if not request_id or len(request_id) > MAX_ID_LENGTH or "\0" in request_id:
        return False
    try:
        request_id.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def horde_id(request_id: str) -> str:
    """The id as the horde's status paths read it: any spelling of a UUID is its canonical form.

    The horde parses the path's id as a UUID (upper case, no dashes, braces and
    ``urn:uuid:`` all name the same request) and its database holds the
    canonical spelling, as the job's tables do. An id that is no UUID is kept
    as given: vecsched's own ids are data (the horde would answer 404).

    Examples
    --------
    >>> horde_id("0B4F2D5E7E344D7C9D0A1F1F2A3B4C5D")
    '0b4f2d5e-7e34-4d7c-9d0a-1f1f2a3b4c5d'
    >>> horde_id("{0b4f2d5e-7e34-4d7c-9d0a-1f1f2a3b4c5d}"), horde_id("r1")
    ('0b4f2d5e-7e34-4d7c-9d0a-1f1f2a3b4c5d', 'r1')
    """
    try:
        return str(uuid.UUID(request_id))
    except ValueError:
        return request_id


def is_stale(reading: Reading | None, now: float, max_age: float | None) -> bool:
    """No cycle, or the cycle is further from ``now`` than ``max_age`` (default three refresh intervals), either way.

    Examples
    --------
    >>> r = Reading("100.0|5.0|ab", 100.0, 5.0, None)
    >>> is_stale(r, 110.0, None), is_stale(r, 116.0, None), is_stale(None, 0.0, None)
    (False, True, True)
    >>> is_stale(r, 84.0, None)  # stamped 16 s ahead: the clock went back
    True
    """
    if reading is None:
        return True
    return cycle_age(reading, now, max_age)[1]


def holds_figures(reading: Reading | None) -> bool:
    """Whether the cycle holds the request's figures (it was waiting when the cycle ran).

    Examples
    --------
    >>> holds_figures(Reading("c", 1.0, 5.0, "[3,1.0]")), holds_figures(Reading("c", 1.0, 5.0, '{"ended":"done"}'))
    (True, False)
    >>> holds_figures(Reading("c", 1.0, 5.0, None)), holds_figures(None)
    (False, False)
    """
    return reading is not None and bool(reading.value) and _ended(reading.value) is None


def stale_answer(reading: Reading | None) -> Answer:
    """503 with ``Retry-After`` (one refresh interval) and rc ``EstimatesStale``."""
    retry = 5 if reading is None else max(1, math.ceil(reading.interval))
    message = "No current estimates: the last published cycle is stale." if reading else "No cycle published yet."
    return error(503, "EstimatesStale", message, {"Retry-After": str(retry)})


def ended_answer(*, shape: str, row: RequestProgress | None) -> Answer | None:
    """The answer for a request the database says no longer waits, read without any cycle; None otherwise.

    A finished or faulted request's answer needs no queue figure, so a stale
    cycle (the job stopped) need not hold its client polling a 503: horde-sdk
    waits for ``done``. A request that still waits (or that the database does
    not hold) gets None: only a fresh cycle can answer it.

    Examples
    --------
    >>> row = RequestProgress(gentype="text", n=0, jobs=1, kudos=12.0, active=True, faulted=False,
    ...                       processing=0, finished=1, restarted=0, work=0.0)
    >>> got = ended_answer(shape="text_status", row=row)
    >>> got.status, got.body["done"], got.body["wait_time"], got.body["kudos"]
    (200, True, 0, 12.0)
    >>> ended_answer(shape="image_check", row=row).status, ended_answer(shape="text_status", row=None)
    (404, None)
    """
    if row is None or _waiting(row):
        return None
    gentype_of_path, with_generations = SHAPES[shape]
    if row.gentype != gentype_of_path:
        return not_found()
    body = _known(None, row)
    body["kudos"] = float(row.kudos)
    if with_generations:
        body["generations"] = []
    return Answer(200, body)


UNAVAILABLE_RETRY_SECONDS = 5
"""``Retry-After`` of :func:`unavailable_answer`: the store's interval is not known while it cannot be read."""


def unavailable_answer() -> Answer:
    """503 with ``Retry-After`` and rc ``StoreUnavailable``: the publication store cannot be reached now.

    Examples
    --------
    >>> got = unavailable_answer()
    >>> got.status, got.body["rc"], got.headers
    (503, 'StoreUnavailable', {'Retry-After': '5'})
    """
    return error(503, "StoreUnavailable", "The estimates cannot be read now; retry.",
                 {"Retry-After": str(UNAVAILABLE_RETRY_SECONDS)})


def horde_answer(
    *,
    shape: str,
    reading: Reading,
    row: RequestProgress | None,
    read_totals: Callable[[], Reading | None],
) -> Answer:
    """The horde-shaped answer for one request, from a fresh cycle and the live row.

    Parameters
    ----------
    shape : str
        A key of :data:`SHAPES`.
    reading : Reading
        The store's current cycle and the request's payload (value None when the
        cycle lacks it); the caller has checked it is fresh.
    row : RequestProgress or None
        The database's row now; None when the database does not hold it, or was
        not asked (the cycle holds the request: progress and ``kudos`` are the cycle's).
    read_totals : callable
        Returns the current cycle's horde totals (``store.read_meta``); called only
        for a request newer than the cycle.

    Returns
    -------
    Answer
        200 with the horde's fields; 404 when neither source knows the id, or it
        is of the other gentype; 409 ``CycleChanged`` when the totals came from a
        newer cycle than the reading (the caller reads again).

    Examples
    --------
    >>> r = Reading("100.0|5.0|ab", 100.0, 5.0, "[1,100.0,0,3,6,1,2,41.6,20.0,4,50.0,0,1,0,0,0]")
    >>> got = horde_answer(shape="text_status", reading=r, row=None, read_totals=lambda: None).body
    >>> got["queue_position"], got["wait_time"], got["kudos"], got["generations"]
    (2, 42, 0.0, [])
    """
    gentype_of_path, with_generations = SHAPES[shape]
    ended = _ended(reading.value)
    if ended is not None and row is None:
        # The cycle saw it leave the queue and the database has let it go since:
        # nothing left to report but a flag, and no gentype to check the path by.
        return not_found()
    figures = decode_payload(reading.value) if reading.value and ended is None else None
    gentype = figures["gentype"] if figures else (row.gentype if row else None)
    if gentype is None or gentype != gentype_of_path:
        return not_found()
    if figures is None and row is not None and _waiting(row):
        totals = read_totals()
        if totals is None or totals.cycle_id != reading.cycle_id:
            return error(409, "CycleChanged", "The cycle changed during the read.")
        horde = (totals.value or {}).get("horde") or {}
        body = _newer_than_cycle(row, horde.get(gentype) or {})
    else:
        body = _known(figures, row)
    if row is not None:
        body["kudos"] = float(row.kudos)
    else:
        # The cycle's (payload version 3 on); 0 when neither source has it.
        body["kudos"] = float((figures or {}).get("kudos") or 0.0)
    if with_generations:
        body["generations"] = []
    return Answer(200, body, {"X-Vecsched-Cycle": _iso(reading.time)})


def _waiting(row: RequestProgress) -> bool:
    return row.active and not row.faulted and row.n > 0


def _progress_fields(figures: Mapping[str, Any] | None, row: RequestProgress | None) -> dict[str, Any]:
    if row is not None:
        return {
            "waiting": row.waiting, "processing": row.processing, "finished": row.finished,
            "restarted": row.restarted, "done": row.done, "faulted": row.faulted,
        }
    assert figures is not None
    out = {name: int(figures[name]) for name in ("waiting", "processing", "finished", "restarted")}
    # Published requests were waiting when the cycle ran.
    out.update(done=False, faulted=False)
    return out


def _known(figures: Mapping[str, Any] | None, row: RequestProgress | None) -> dict[str, Any]:
    """A request the cycle holds, or one the database holds that is no longer waiting."""
    body = _progress_fields(figures, row)
    if figures is not None:
        body["eligible_workers"] = int(figures["eligible_workers"])
        body["eligible_worker_threads"] = int(figures["eligible_worker_threads"])
    if body["done"] or body["faulted"] or figures is None:
        # Nothing of it waits any more: no position, no wait.
        body.update(queue_position=0, wait_time=0, might_stall=False)
        body["is_possible"] = not body["faulted"] and (body["done"] or body["processing"] > 0)
        return body
    wait = figures["wait_time"]
    body["queue_position"] = int(figures["queue_position"])
    # No worker of the gentype online: the wait is unknown; 0 is the horde's default.
    body["wait_time"] = 0 if wait is None else int(round(wait))
    body["is_possible"] = bool(figures["is_possible"]) or body["processing"] > 0
    # The estimator's verdict when the cycle carries one (SPEC section 7: only
    # while nothing is in flight); else the horde's default, false.
    body["might_stall"] = bool(figures.get("might_stall") or False) and body["processing"] == 0
    return body


def _newer_than_cycle(row: RequestProgress, totals: Mapping[str, Any]) -> dict[str, Any]:
    """A waiting request the cycle does not hold yet: the horde-wide figures (SPEC section 6).

    It is the newest request, so every queued request of its gentype is ahead
    of it; its eligibility is not known until the next cycle, so ``is_possible``
    is left out (SPEC section 9: omit, never invent; horde-sdk's field is
    optional) unless a job of it is in flight. Online threads of the gentype
    say nothing of its models, size or gates, and the cycle's prospective state
    would need the request's models and worker lists, more tables per poll.
    """
    body = _progress_fields(None, row)
    ahead_requests = int(totals.get("queued_requests") or 0)
    jobs_ahead = int(totals.get("queued_jobs") or 0)
    threads = int(totals.get("online_threads") or 0)
    speed = totals.get("mean_speed")
    # Totals carry image work in megapixel-steps; speeds are pixel-steps/s.
    scale = 1e6 if row.gentype == "image" else 1.0
    work_ahead = float(totals.get("queued_work") or 0) * scale
    wait = 0
    if threads > 0 and speed:
        # SPEC section 5's wait, over the whole gentype (its eligibility is not known yet)
        seconds = wait_time(np.array([work_ahead]), np.array([jobs_ahead]), np.array([row.work]),
                            np.array([row.n]), np.array([threads]), np.array([float(speed) * threads]),
                            np.zeros(1))
        wait = int(round(float(seconds[0])))
    body.update(queue_position=ahead_requests, wait_time=wait, might_stall=False)
    if row.processing > 0:
        body["is_possible"] = True  # SPEC section 4: a job in flight makes it possible
    return body
