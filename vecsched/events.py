"""Recording the horde's scheduling events (SPEC section 7) from the horde's own code.

The horde calls :func:`record_dispatch` when a worker pops a job and
:func:`record_capacity_return` when the job's thread is free again. Neither
call blocks nor raises: the event goes into a bounded in-process queue, and a
background thread writes batches into the ``dispatches``,
``dispatch_priority_users`` and ``capacity_returns`` tables. When the queue is
full, an event is malformed or a write fails, the event is dropped and counted
by reason (:attr:`EventRecorder.dropped`, and the OpenTelemetry counter
``vecsched.events.dropped``); the might_stall figures then fail clear
(a return without its dispatch is "incomplete history").

Examples
--------
>>> import tempfile, os
>>> from vecsched.events import EventRecorder
>>> path = os.path.join(tempfile.mkdtemp(), "horde.sqlite")
>>> recorder = EventRecorder(f"sqlite:///{path}")
>>> recorder.record_dispatch("d1", worker_id="w1", request_id="r1", request_created=0.0,
...                          dispatched_at=5.0, assigned_work=80)
True
>>> recorder.record_capacity_return("d1", worker_id="w1", returned_at=20.0)
True
>>> recorder.close()
>>> recorder.written, dict(recorder.dropped)
(2, {})
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import queue
import threading
import time
import weakref
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Iterable

log = logging.getLogger("vecsched.events")

DROP_REASONS = ("queue_full", "invalid", "write_failed", "closed")
DEFAULT_QUEUE_SIZE = 10_000
BATCH = 500


INT64 = (-(2**63), 2**63 - 1)


def _instant(value: float | datetime | None) -> datetime:
    if value is None:
        return datetime.now(timezone.utc)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a naive datetime")
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        # Years 1-9999 only: nanoseconds or milliseconds passed as seconds overflow here (OSError,
        # OverflowError or ValueError by platform), and the caller's call returns False.
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    raise ValueError("not a time")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("not a string")
    # Neither database stores a NUL or a lone surrogate: refused here, one event, not its whole batch.
    if "\x00" in value:
        raise ValueError("a NUL character")
    value.encode("utf-8")  # UnicodeEncodeError (a ValueError) for a lone surrogate
    return value


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError("not an integer")
    if not INT64[0] <= int(value) <= INT64[1]:
        raise ValueError("out of range")
    return int(value)


def _flag(value: Any) -> bool:
    if isinstance(value, str) or value not in (0, 1):  # True/False, 0/1 and NumPy's bools
        raise ValueError("not true or false")
    return bool(value)


class EventRecorder:
    """A bounded queue and a background writer into the event tables of one database.

    Parameters
    ----------
    database : str or Engine
        SQLAlchemy URL or engine of the horde database; the event tables are
        created if missing.
    maxsize : int
        Events the queue holds; beyond it an event is dropped (``queue_full``).
    """

    def __init__(self, database: Any, *, maxsize: int = DEFAULT_QUEUE_SIZE):
        from vecsched.service.sql.schema import make_engine

        # No connection here: the caller is the horde's pop path. The writer creates the tables at its
        # first batch, and a database that does not answer costs the writer, never the caller.
        self.engine = make_engine(database) if isinstance(database, str) else database
        self._tables_ready = False
        self.maxsize = maxsize
        self.dropped: Counter[str] = Counter()
        self.written = 0
        self._closed = False
        self._start_writer()
        _LIVE.add(self)
        atexit.register(_close_at_exit, weakref.ref(self))

    def _start_writer(self) -> None:
        self.queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(maxsize=self.maxsize)
        # A flag, not a marker in the queue: a full queue could refuse the marker and leave the writer running.
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vecsched-events", daemon=True)
        self._thread.start()

    # -- the calls the horde makes -----------------------------------------------------
    def record_dispatch(
        self,
        dispatch_id: str,
        *,
        worker_id: str,
        request_id: str,
        request_created: float | datetime,
        assigned_work: float,
        dispatched_at: float | datetime | None = None,
        worker_state: str = "",
        request_extra_priority: int = 0,
        selected_from_priority_queue: bool = False,
        priority_user_ids: Iterable[str] = (),
    ) -> bool:
        """Queue one worker pop; False when it was dropped. Never blocks, never raises.

        ``assigned_work`` is in work units (tokens, or megapixel-steps for image);
        times are epoch seconds or aware datetimes (default: now).
        """
        try:
            work = float(assigned_work)
            if not (math.isfinite(work) and work >= 0):
                raise ValueError("assigned_work")
            row = {
                "dispatch_id": _text(dispatch_id),
                "worker_id": _text(worker_id),
                "worker_state": _text(worker_state),
                "request_id": _text(request_id),
                "request_created": _instant(request_created),
                "request_extra_priority": _integer(request_extra_priority),
                "selected_from_priority_queue": _flag(selected_from_priority_queue),
                "dispatched_at": _instant(dispatched_at),
                "assigned_work": work,
                "priority_user_ids": [_text(u) for u in priority_user_ids],
            }
        except Exception:  # noqa: BLE001 - any malformed field drops the event, never raises into the pop
            return self._drop("invalid")
        return self._put("dispatch", row)

    def record_capacity_return(
        self, dispatch_id: str, *, worker_id: str, returned_at: float | datetime | None = None
    ) -> bool:
        """Queue one capacity return (the pop's thread is free again); False when dropped."""
        try:
            row = {"dispatch_id": _text(dispatch_id), "worker_id": _text(worker_id),
                   "returned_at": _instant(returned_at)}
        except Exception:  # noqa: BLE001 - as record_dispatch
            return self._drop("invalid")
        return self._put("return", row)

    # -- lifecycle -------------------------------------------------------------------------
    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued event was written or dropped; False on timeout."""
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.queue.unfinished_tasks

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the writer; later events are dropped (``closed``).

        Events still queued when ``timeout`` runs out are dropped and counted (``closed``), never lost
        unseen. Every recorder is closed this way when the interpreter exits.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout  # one bound for the whole close
        self.flush(timeout)
        self._stop.set()
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        # What is still queued is taken out before it is counted, so the writer (if a slow write still
        # holds it) can never write an event this counts as dropped.
        left = 0
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
            self.queue.task_done()
            left += 1
        if left:
            log.warning("%d scheduling events were not written before the recorder closed", left)
            self._drop("closed", left)

    # -- internals -------------------------------------------------------------------------
    def _drop(self, reason: str, n: int = 1) -> bool:
        self.dropped[reason] += n
        try:
            from opentelemetry import metrics

            metrics.get_meter("vecsched").create_counter(
                "vecsched.events.dropped", unit="{event}",
                description="Scheduling events dropped before reaching the database, by reason",
            ).add(n, {"reason": reason})
        except Exception:  # noqa: BLE001 - counting must never fail the caller
            pass
        return False

    def _put(self, kind: str, row: dict[str, Any]) -> bool:
        if self._closed:
            return self._drop("closed")
        try:
            self.queue.put_nowait((kind, row))
        except queue.Full:
            return self._drop("queue_full")
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = [self.queue.get(timeout=0.1)]
            except queue.Empty:
                continue
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write_or_split(batch)
            finally:
                for _ in batch:
                    self.queue.task_done()

    def _write_or_split(self, batch: list[tuple[str, dict[str, Any]]]) -> None:
        """Write ``batch``; if it fails for its data, each event alone, so one bad event drops only itself."""
        import sqlalchemy.exc as sa_exc

        try:
            self._write(batch)
            self.written += len(batch)
            return
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            # The database is away: one event at a time would wait out a connect timeout each.
            failed, reason = batch, type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - the writer must outlive a bad write
            reason = type(exc).__name__
            failed = batch if len(batch) == 1 else [event for event in batch if not self._write_alone(event)]
        if failed:
            log.warning("writing %d scheduling events failed: %s", len(failed), reason)
            self._drop("write_failed", len(failed))

    def _write_alone(self, event: tuple[str, dict[str, Any]]) -> bool:
        try:
            self._write([event])
        except Exception:  # noqa: BLE001 - counted by the caller
            return False
        self.written += 1
        return True

    def _write(self, batch: list[tuple[str, dict[str, Any]]]) -> None:
        from vecsched.service.sql.schema import capacity_returns, dispatch_priority_users, dispatches, init_db

        if not self._tables_ready:
            init_db(self.engine)  # a failure drops this batch (write_failed); the next one tries again
            self._tables_ready = True

        pops = [row for kind, row in batch if kind == "dispatch"]
        users = [{"dispatch_id": row["dispatch_id"], "position": k, "user_id": u}
                 for row in pops for k, u in enumerate(row["priority_user_ids"])]
        returns = [row for kind, row in batch if kind == "return"]
        with self.engine.begin() as conn:
            for table, rows in ((dispatches, pops), (dispatch_priority_users, users), (capacity_returns, returns)):
                if rows:
                    clean = [{c.name: r[c.name] for c in table.columns} for r in rows]
                    conn.execute(_insert_ignoring_repeats(conn, table), clean)


def _insert_ignoring_repeats(conn: Any, table: Any) -> Any:
    """An INSERT that skips a row whose key is already stored (a retried call records once)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        return insert(table).on_conflict_do_nothing()
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing()
    return table.insert()


_default: EventRecorder | None = None
_default_lock = threading.Lock()
_LIVE: "weakref.WeakSet[EventRecorder]" = weakref.WeakSet()


def _close_at_exit(ref: "weakref.ref[EventRecorder]") -> None:
    recorder = ref()
    if recorder is not None:
        recorder.close()


def _after_fork_in_child() -> None:
    # A recorder configured before a fork (a preloading WSGI server) has no writer thread in the child, and
    # the parent's queued events are the parent's to write: the child starts empty, on new connections.
    for recorder in list(_LIVE):
        if not recorder._closed:
            recorder.engine.dispose(close=False)
            recorder._start_writer()


os.register_at_fork(after_in_child=_after_fork_in_child)


def configure(database: Any = None, *, maxsize: int = DEFAULT_QUEUE_SIZE) -> EventRecorder:
    """Set up the recorder the module-level functions use (default: the configured database).

    Examples
    --------
    >>> import tempfile, os
    >>> recorder = configure("sqlite:///" + os.path.join(tempfile.mkdtemp(), "horde.sqlite"))
    >>> record_capacity_return("d9", worker_id="w1", returned_at=1.0)
    True
    >>> recorder.close()
    """
    global _default
    from vecsched.service.config import default_database_url

    with _default_lock:
        if _default is not None:
            _default.close()
        _default = EventRecorder(database if database is not None else default_database_url(), maxsize=maxsize)
        return _default


RETRY_CONFIGURE_SECONDS = 60.0
_failed_at = -math.inf


def _recorder() -> EventRecorder | None:
    global _failed_at
    if _default is None:
        if time.monotonic() - _failed_at < RETRY_CONFIGURE_SECONDS:
            return None  # a recorder that cannot be made is tried again a minute later, not at every pop
        try:
            configure()
        except Exception as exc:  # noqa: BLE001 - recording never raises into the horde
            _failed_at = time.monotonic()
            log.warning("scheduling events cannot be recorded: %s", type(exc).__name__)
            return None
    return _default


def record_dispatch(dispatch_id: str, **fields: Any) -> bool:
    """Record a worker pop through the module's recorder (:meth:`EventRecorder.record_dispatch`)."""
    recorder = _recorder()
    if recorder is None:
        return False
    try:
        return recorder.record_dispatch(dispatch_id, **fields)
    except Exception:  # noqa: BLE001 - a missing or unknown keyword; recording never raises into the horde
        return recorder._drop("invalid")


def record_capacity_return(dispatch_id: str, **fields: Any) -> bool:
    """Record a capacity return through the module's recorder (:meth:`EventRecorder.record_capacity_return`)."""
    recorder = _recorder()
    if recorder is None:
        return False
    try:
        return recorder.record_capacity_return(dispatch_id, **fields)
    except Exception:  # noqa: BLE001 - as record_dispatch
        return recorder._drop("invalid")
