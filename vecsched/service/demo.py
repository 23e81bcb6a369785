"""A living demo horde in the embedded SQLite file, for ``vecsched run`` out of the box.

The simulator (:mod:`vecsched.simulate`) plays a horde on the wall clock:
workers check in, requests arrive, are taken, finish, fault and expire. Before
each cycle the demo advances it to the cycle's instant and writes it into the
horde tables, so the job loads, estimates and publishes exactly as it would
against a real horde database, and ``vecsched db dump`` sees the same rows.

Only a file the demo owns is driven: it marks the file in a table of its own,
and never writes to a database that holds rows it did not put there.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import sqlalchemy as sa

from vecsched.snapshot.snapshot import Snapshot

log = logging.getLogger("vecsched.demo")

DEMO_SCENARIO = "steady"
"""The simulated situation: both gentypes, steady load, moderate churn."""
DEMO_LOAD = 0.5
"""Arrival work over the workers' true capacity (``Population.capacity``), per gentype.

Lighter than the scenario's own 0.85, so that the demo's queue stays a few hundred deep: at
10, 20 and 30 simulated minutes (seeds 0-2) 70-360 requests wait, bursts come and go, and 1-3%
expire; at 0.85, 150-1,300 wait (about 8,000 made a cycle on SQLite outgrow the 5 s interval). (Before 2026-12-03 load counted generation speed alone and
bursts added two thirds on top, so the demo ran at 0.25, which now leaves 30-90 waiting.)"""
WARMUP = 180.0
"""Seconds simulated before the first cycle, so queues and speed samples exist."""
MAX_CATCH_UP = 600.0
"""A clock jump longer than this (a laptop waking up) starts a new horde
rather than simulating every missed second."""
KEEP_ENDED = 900.0
"""Seconds the simulator keeps a finished request (the snapshot's event window)."""
KEEP_DONE = 300.0
"""Seconds a finished request's row stays in the database (its status reads done)."""

_marker = sa.Table("vs_demo", sa.MetaData(), sa.Column("scenario", sa.String(), primary_key=True))


def is_demo(engine: Any) -> bool:
    """Whether the database is the demo's own: marked by it, or holding no horde at all.

    Parameters
    ----------
    engine : sqlalchemy.engine.Engine

    Returns
    -------
    bool

    Examples
    --------
    >>> from vecsched.service.sql import make_engine
    >>> is_demo(make_engine("sqlite://"))
    True
    """
    from vecsched.service.sql import is_empty

    if sa.inspect(engine).has_table(_marker.name):
        return True
    return is_empty(engine)


def forget_demo(engine: Any) -> None:
    """Drop the demo's mark: the file now holds someone's own horde (``db load``).

    Parameters
    ----------
    engine : sqlalchemy.engine.Engine

    Examples
    --------
    >>> from vecsched.service.sql import make_engine
    >>> forget_demo(make_engine("sqlite://"))
    """
    _marker.drop(engine, checkfirst=True)


def mark_demo(engine: Any) -> None:
    """Mark the database as the demo's own (its rows may be replaced by the demo).

    Parameters
    ----------
    engine : sqlalchemy.engine.Engine

    Examples
    --------
    >>> from vecsched.service.sql import make_engine
    >>> mark_demo(make_engine("sqlite://"))
    """
    _marker.create(engine, checkfirst=True)


class DemoHorde:
    """``loader(now) -> Snapshot`` that keeps a simulated horde current in a SQL database.

    Parameters
    ----------
    engine : sqlalchemy.engine.Engine
        The embedded database the demo owns (see :func:`is_demo`).
    now : float
        Epoch seconds at which the horde should look current first.
    seed : int, default 0
        The simulation's seed.

    Examples
    --------
    >>> from vecsched.service.sql import make_engine
    >>> engine = make_engine("sqlite://")
    >>> demo = DemoHorde(engine, now=1.8e9)
    >>> snapshot = demo(1.8e9 + 5)
    >>> len(snapshot.workers) > 0 and len(snapshot.requests) > 0
    True
    """

    def __init__(self, engine: Any, *, now: float, seed: int = 0):
        from vecsched.service.sql import init_db

        self.engine = engine
        self.seed = seed
        init_db(engine)
        mark_demo(engine)
        self._start(now)

    def _start(self, now: float) -> None:
        from vecsched.simulate.scenarios import build, scenario

        demo = scenario(DEMO_SCENARIO, text_load=DEMO_LOAD, image_load=DEMO_LOAD)
        # Ids of this start only: a restart on the old file must not meet the forecasts
        # recorded under the last horde's ids (recorded once per id, they would pair with
        # the new horde's outcomes).
        self.sim, _ = build(demo, self.seed, math.inf, warmup=WARMUP, start=now - WARMUP,
                            ids=f"demo/{self.seed}/{now!r}")

    def __call__(self, now: float) -> Snapshot:
        """Advance the horde to ``now``, write it into the database, and load it back.

        Parameters
        ----------
        now : float
            Epoch seconds, the cycle's instant.

        Returns
        -------
        Snapshot
        """
        from vecsched.service.sql import import_snapshot, load_horde

        if now - self.sim.now > MAX_CATCH_UP:
            log.info("the clock jumped %.0fs: starting a new demo horde", now - self.sim.now)
            self._start(now)
        self.sim.run_until(now)
        self._forget_the_past()
        import_snapshot(self.engine, self.sim.snapshot(), replace=True)
        self._keep_finished_rows()
        return load_horde(self.engine, now)

    def _keep_finished_rows(self) -> None:
        # A horde keeps a finished request's row (inactive) for a while, so its
        # status reads "done"; the simulator's snapshot holds waiting ones only.
        # Its finished jobs stay beside it, as the horde's do: without them the row
        # read "done" with one generation still waiting, and the forecast tracker,
        # seeing an inactive request that finished no job, recorded a cancellation.
        from datetime import datetime, timezone

        from vecsched.service.sql import processing_gens, waiting_prompts
        from vecsched.snapshot.schema import GENTYPES, JOB_STATES

        def at(t: float) -> datetime:
            return datetime.fromtimestamp(t, tz=timezone.utc)

        done = [r for r in self.sim.requests.values()
                if r.status == "done" and r.completed_at >= self.sim.now - KEEP_DONE]
        rows = [{"id": r.id, "user_id": r.user_id, "gentype": GENTYPES[r.gentype], "created": at(r.created),
                 "expiry": at(r.expiry), "n": 0, "jobs": r.jobs, "active": False, "faulted": False}
                for r in done]
        jobs = [{"id": job.id, "wp_id": r.id, "worker_id": job.worker.id, "started": at(job.started),
                 "state": JOB_STATES[job.state]}
                for r in done for job in (self.sim.jobs[j] for j in r.job_ids if j in self.sim.jobs)]
        if rows:
            with self.engine.begin() as conn:
                conn.execute(waiting_prompts.insert(), rows)
                if jobs:
                    conn.execute(processing_gens.insert(), jobs)

    def _forget_the_past(self) -> None:
        # The demo runs for days: keep only what a snapshot still shows.
        sim = self.sim
        sim.log.clear()
        cut = sim.now - KEEP_ENDED
        from vecsched.snapshot.times import iso

        cut_iso = iso(cut)
        sim.dispatches = [d for d in sim.dispatches if d["dispatched_at"] >= cut_iso]
        sim.capacity_returns = [c for c in sim.capacity_returns if c["returned_at"] >= cut_iso]
        ended = [rid for rid, r in sim.requests.items()
                 if r.status != "waiting" and _ended_at(r) < cut
                 and all(sim.jobs[j].ended is not None for j in r.job_ids)]
        for rid in ended:
            sim._chat_cache.pop(rid, None)
            for jid in sim.requests.pop(rid).job_ids:
                sim.jobs.pop(jid, None)


def _ended_at(r: Any) -> float:
    times = [t for t in (r.completed_at, r.expired_at, r.cancelled_at) if t is not None]
    return max(times) if times else math.inf
