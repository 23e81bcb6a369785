"""Live progress of one request, read from the horde database for the HTTP status route.

The published cycle is up to one refresh interval old; the horde's own status
route reports progress and kudos as they are now. :class:`DatabaseProgress`
reads them with one indexed SELECT per poll: the ``waiting_prompts`` row and the
counts of its ``processing_gens`` by state. The id is a bound parameter, never
part of the query text.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from vecsched.core.figures import waiting_jobs
from vecsched.service.sql.schema import make_engine, processing_gens, waiting_prompts
from vecsched.snapshot.cells import judge_cells
from vecsched.snapshot.schema import GENTYPES, REQUEST_COLUMNS, REQUIRED, value_problems

log = logging.getLogger(__name__)
_COLUMNS = {col.name: col for col in REQUEST_COLUMNS}
# The row's cells checked on every read: every number, flag and choice, as the cycle's loader checks them
# (its strings and times the route does not read).
_CHECKED = tuple(col.name for col in REQUEST_COLUMNS if col.kind in ("int", "float", "bool", "enum"))


class BadCell(ValueError):
    """A cell of the request's row that the cycle's loader would reject too (its field and why)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"field {field!r}: {message}")
        self.field = field


@dataclass(frozen=True)
class RequestProgress:
    """One request as the database holds it now.

    Examples
    --------
    >>> p = RequestProgress(gentype="text", n=0, jobs=2, kudos=12.5, active=True, faulted=False,
    ...                     processing=0, finished=2, restarted=1, work=200.0)
    >>> p.waiting, p.done
    (0, True)
    >>> from dataclasses import replace
    >>> faulted = replace(p, n=1, faulted=True)
    >>> faulted.done, faulted.finished_ok
    (True, False)
    """

    gentype: str
    n: int
    jobs: int
    kudos: float
    active: bool
    faulted: bool
    processing: int
    finished: int
    restarted: int
    work: float
    """Output of the jobs not yet handed out: tokens (text) or pixel-steps (image)."""

    @property
    def waiting(self) -> int:
        """Jobs neither in flight nor finished (the README's progress rule)."""
        return int(waiting_jobs(self.jobs, self.processing, self.finished))

    @property
    def done(self) -> bool:
        """The horde's ``done``: faulted, or :attr:`finished`.

        The horde's ``WaitingPrompt.is_completed()`` is true first thing for a
        faulted request, and a client's poll stops on ``done`` (horde-sdk's
        ``is_job_complete`` of the check answer returns it): a faulted request
        that said false was polled until the client gave up.
        """
        return self.faulted or self.finished_ok

    @property
    def finished_ok(self) -> bool:
        """Not faulted, and inactive (the horde's word for finished, as the job publishes it) or
        every job finished (nothing left to hand out, nothing in flight)."""
        finished = self.n == 0 and self.processing == 0 and self.finished >= self.jobs
        return not self.faulted and (not self.active or finished)


def _count(state: str) -> Any:
    g = processing_gens
    return (
        sa.select(sa.func.count())
        .where(g.c.wp_id == waiting_prompts.c.id, g.c.state == state)
        .scalar_subquery()
    )


class DatabaseProgress:
    """Reads :class:`RequestProgress` from the horde tables.

    Parameters
    ----------
    engine : Engine or str
        The horde database (the job's ``VECSCHED_DATABASE_URL``).

    Examples
    --------
    >>> import vecsched
    >>> from vecsched.service.sql import import_snapshot
    >>> from vecsched.service.sql.schema import make_engine
    >>> engine = make_engine("sqlite://")
    >>> snap = vecsched.load_snapshot({"format": "vecsched.snapshot/1", "now": "2026-11-29T12:00:00Z",
    ...     "workers": [], "requests": [{"id": "r1", "user_id": "u", "gentype": "text", "n": 1,
    ...     "kudos": 3, "created": "2026-11-29T11:58:00Z", "expiry": "2026-11-29T12:18:00Z"}]})
    >>> _ = import_snapshot(engine, snap)
    >>> got = DatabaseProgress(engine).read("r1")
    >>> got.kudos, got.waiting, got.done, DatabaseProgress(engine).read("nope")
    (3.0, 1, False, None)
    """

    def __init__(self, engine: Any):
        if isinstance(engine, str):
            # The job's engine, so a poll gets its bounds too: a locked table fails it within the
            # lock timeout and a silent server within the connect timeout (the route's 500), never a hang.
            engine = make_engine(engine, pre_ping=False)
        # One statement per read, nothing to commit: autocommit spares the
        # BEGIN/ROLLBACK round trips of a transaction per poll.
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        wp = waiting_prompts.c
        self._sql = sa.select(
            *(wp[name] for name in _CHECKED),
            _count("processing").label("processing"),
            _count("finished").label("finished"),
            _count("faulted").label("restarted"),
        ).where(wp.id == sa.bindparam("rid"))

    def read(self, request_id: str) -> RequestProgress | None:
        """The request's row and job counts now; None when the database does not hold it.

        Parameters
        ----------
        request_id : str

        Returns
        -------
        RequestProgress or None
        """
        with self.engine.connect() as conn:
            row = conn.execute(self._sql, {"rid": request_id}).mappings().first()
        if row is None:
            return None
        try:
            return _progress(row)
        except BadCell as exc:
            # The cycle leaves such a row out; so does the route (no id in the log: see vecsched.service.redact).
            log.warning("a waiting_prompts row read for the status route is left out: %s", exc)
            return None

    def connect_once(self) -> None:
        """Open one connection and release it: an unreachable database, or one that refuses the
        credentials, fails here (its DBAPIError) rather than on the first poll that needs it.

        Examples
        --------
        >>> DatabaseProgress("sqlite://").connect_once()
        """
        with self.engine.connect():
            pass

    def close(self) -> None:
        """Release the engine's connections."""
        self.engine.dispose()


def _value(row: Any, name: str) -> Any:
    """The cell ``name`` of ``row``, typed and checked by the rules the cycle's loader applies (:class:`BadCell`)."""
    col = _COLUMNS[name]
    value = row[name]
    if value is None:
        # A NULL takes the snapshot default, as the loader does (vecsched.service.sql.load).
        if col.default is REQUIRED:
            raise BadCell(name, "is required (NULL in the database)")
        if isinstance(col.default, str) and col.default.startswith("="):
            return _value(row, col.default[1:])
        return col.default
    typed, _, problems = judge_cells(col.kind, [value], choices=col.choices, nullable=True, sql=True)
    problems = problems or value_problems(col, typed)
    if problems:
        raise BadCell(name, problems[0][1])
    return typed[0].item()


def _progress(row: Any) -> RequestProgress:
    cell = {name: _value(row, name) for name in _CHECKED}  # every checked cell judged once, used or not
    n = int(cell["n"])
    gentype = GENTYPES[cell["gentype"]]
    if gentype == "image":
        per_job = float(cell["width"]) * float(cell["height"]) * float(cell["steps"])
    else:
        per_job = float(cell["max_length"])
    return RequestProgress(
        gentype=gentype,
        n=n,
        jobs=int(cell["jobs"]),
        kudos=float(cell["kudos"]),
        active=bool(cell["active"]),
        faulted=bool(cell["faulted"]),
        processing=int(row["processing"] or 0),
        finished=int(row["finished"] or 0),
        restarted=int(row["restarted"] or 0),
        work=n * per_job,
    )
