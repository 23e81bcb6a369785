"""Outcomes reported by the horde's own code: never blocks, never raises (SPEC.md section 8).

The horde calls these where the events happen (a worker pops a job, a request
completes, expires or is cancelled). Each call puts one event on a bounded
in-process queue and returns at once; a background thread writes batches to
the forecast store, where they pair with the recorded forecasts in any order.
A full queue or a failing store drops the event and counts why
(``vecsched.forecast.events_dropped``, attribute ``reason``: ``queue_full``,
``store_error``, ``processing_error``).

Examples
--------
>>> from vecsched import outcomes
>>> from vecsched.service.forecasts_store import ForecastRecorder, MemoryPairs
>>> writer = outcomes.configure(ForecastRecorder(MemoryPairs()))
>>> outcomes.record_start("r1", gentype="text", at=1.7e9)
True
>>> writer.flush(5.0)
True
>>> writer.recorder.backend.record("r1")["started_at"]
'1700000000.0'
>>> outcomes.configure(None)
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from typing import Any

from vecsched.service.forecast_metrics import count_dropped

log = logging.getLogger("vecsched.outcomes")

DEFAULT_QUEUE_SIZE = 10_000
BATCH = 500


class OutcomeWriter:
    """A bounded queue and the daemon thread that drains it into a :class:`ForecastRecorder`.

    Parameters
    ----------
    recorder : ForecastRecorder
    maxsize : int
        Events the queue holds; one more is dropped (``queue_full``).
    """

    def __init__(self, recorder: Any, maxsize: int = DEFAULT_QUEUE_SIZE):
        self.recorder = recorder
        self.queue: queue.Queue[tuple[str, str, Any, Any]] = queue.Queue(maxsize=maxsize)
        self.dropped: dict[str, int] = {}
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vecsched-outcomes", daemon=True)
        self._thread.start()

    def submit(self, request_id: Any, field: str, at: Any, expiry: Any = None) -> bool:
        """Queue one event; False (and counted) when the queue is full."""
        try:
            self._idle.clear()
            self.queue.put_nowait((request_id, field, at, expiry))
            return True
        except queue.Full:
            self._drop("queue_full")
            return False

    def _drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n
        try:
            count_dropped(reason, n)
        except Exception:  # noqa: BLE001 - telemetry must not take the writer down
            pass

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                first = self.queue.get(timeout=0.2)
            except queue.Empty:
                self._idle.set()
                continue
            batch = [first]
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            self._write(batch)
            if self.queue.empty():
                self._idle.set()

    def _write(self, batch: list[tuple[str, str, Any, Any]]) -> None:
        rows, bad = [], 0
        for rid, field, at, expiry in batch:
            try:
                row = (str(rid), field, float(at), None if expiry is None else float(expiry))
                # inf or nan would fail the batch in the store (or leave a record that never expires)
                # and, written once, block the request's real outcome: dropped alone, here.
                if not math.isfinite(row[2]) or (row[3] is not None and not math.isfinite(row[3])):
                    raise ValueError("not a finite time")
                row[0].encode("utf-8")  # a lone surrogate no store can hold
                rows.append(row)
            except Exception:  # noqa: BLE001 - a malformed event is dropped alone, never raised
                bad += 1
        if bad:
            self._drop("processing_error", bad)
        if not rows:
            return
        try:
            self.recorder.record_outcomes(rows)
        except Exception as exc:  # noqa: BLE001
            reason = "store_error" if _is_store_error(exc) else "processing_error"
            self._drop(reason, len(rows))
            log.debug("outcome batch dropped (%s)", reason, exc_info=True)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the queue is drained (tests, shutdown); True when it was."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.queue.empty() and self._idle.wait(0.05) and self.queue.empty():
                return True
        return False

    def close(self) -> None:
        """Stop the thread (events still queued are dropped)."""
        self._stop.set()
        self._thread.join(timeout=5.0)


def _is_store_error(exc: BaseException) -> bool:
    import redis

    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:  # pragma: no cover
        SQLAlchemyError = ()  # type: ignore[assignment,misc]
    return isinstance(exc, (redis.RedisError, SQLAlchemyError, OSError, ConnectionError, TimeoutError))


_writer: OutcomeWriter | None = None
_lock = threading.Lock()


def configure(recorder: Any | None, maxsize: int = DEFAULT_QUEUE_SIZE) -> OutcomeWriter | None:
    """Send outcomes to ``recorder`` from now on (None stops the writer).

    Without a call, the first outcome builds a recorder on the configured
    store (``REDIS_URL`` / ``VECSCHED_DATABASE_URL``, as the job does).
    """
    global _writer
    with _lock:
        if _writer is not None:
            _writer.close()
        _writer = OutcomeWriter(recorder, maxsize) if recorder is not None else None
        return _writer


def _current() -> OutcomeWriter | None:
    global _writer
    if _writer is None:
        with _lock:
            if _writer is None:
                try:
                    from vecsched.service.forecast_job import recorder_for
                    from vecsched.service.config import open_store

                    _writer = OutcomeWriter(recorder_for(open_store()))
                except Exception:  # noqa: BLE001
                    return None
    return _writer


def _submit(request_id: Any, field: str, at: Any, expiry: Any = None) -> bool:
    try:
        writer = _current()
        if writer is None:
            count_dropped("store_error")
            return False
        return writer.submit(request_id, field, time.time() if at is None else at, expiry)
    except Exception:  # noqa: BLE001 - the caller is the horde: never raise into it
        return False


def record_start(request_id: str, *, gentype: str | None = None, at: float | None = None) -> bool:
    """A first worker assignment of ``request_id`` at ``at`` (epoch s; default now). True when queued."""
    return _submit(request_id, "started_at", at)


def record_completion(request_id: str, *, gentype: str | None = None, at: float | None = None) -> bool:
    """Every job of ``request_id`` finished at ``at``. True when queued."""
    return _submit(request_id, "completed_at", at)


def record_expiry(request_id: str, *, gentype: str | None = None, at: float | None = None) -> bool:
    """``request_id`` expired at ``at`` without any job started. True when queued."""
    return _submit(request_id, "expired_without_start", at)


def record_cancellation(request_id: str, *, at: float | None = None) -> bool:
    """``request_id`` was cancelled at ``at``. True when queued."""
    return _submit(request_id, "cancelled_at", at)
