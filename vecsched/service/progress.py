"""Live progress of one request, read from the horde database for the HTTP status route.

The published cycle is up to one refresh interval old; the horde's own status
route reports progress and kudos as they are now. :class:`DatabaseProgress`
reads them with one indexed SELECT per poll: the ``waiting_prompts`` row and the
counts of its ``processing_gens`` by state. The id is a bound parameter, never
part of the query text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from vecsched.core.figures import waiting_jobs
from vecsched.service.sql.schema import make_engine, processing_gens, waiting_prompts
from vecsched.snapshot.schema import REQUEST_COLUMNS

_DEFAULTS = {col.name: col.default for col in REQUEST_COLUMNS}


@dataclass(frozen=True)
class RequestProgress:
    """One request as the database holds it now.

    Examples
    --------
    >>> p = RequestProgress(gentype="text", n=0, jobs=2, kudos=12.5, active=True, faulted=False,
    ...                     processing=0, finished=2, restarted=1, work=200.0)
    >>> p.waiting, p.done
    (0, True)
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
            engine = make_engine(engine) if engine.startswith("sqlite") else sa.create_engine(engine)
        # One statement per read, nothing to commit: autocommit spares the
        # BEGIN/ROLLBACK round trips of a transaction per poll. (No pre-ping
        # either: a dropped connection fails one read and is then replaced.)
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        wp = waiting_prompts.c
        self._sql = sa.select(
            wp.gentype, wp.n, wp.jobs, wp.kudos, wp.active, wp.faulted,
            wp.max_length, wp.width, wp.height, wp.steps,
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
        return _progress(row)

    def close(self) -> None:
        """Release the engine's connections."""
        self.engine.dispose()


def _value(row: Any, name: str) -> Any:
    value = row[name]
    # A NULL takes the snapshot default, as the loader does; a required one counts as 0.
    if value is None:
        default = _DEFAULTS[name]
        value = default if isinstance(default, (int, float, bool)) else 0
    return value


def _progress(row: Any) -> RequestProgress:
    n = int(_value(row, "n"))
    jobs = row["jobs"]
    jobs = n if jobs is None else int(jobs)
    gentype = str(row["gentype"] or "")
    if gentype == "image":
        per_job = float(_value(row, "width")) * float(_value(row, "height")) * float(_value(row, "steps"))
    else:
        per_job = float(_value(row, "max_length"))
    return RequestProgress(
        gentype=gentype,
        n=n,
        jobs=jobs,
        kudos=max(float(_value(row, "kudos")), 0.0),
        active=bool(_value(row, "active")),
        faulted=bool(_value(row, "faulted")),
        processing=int(row["processing"] or 0),
        finished=int(row["finished"] or 0),
        restarted=int(row["restarted"] or 0),
        work=n * per_job,
    )
