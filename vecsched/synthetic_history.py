"""A realistic scheduling history for a synthetic horde (SPEC section 7's events).

Every thread of every online worker pops a job, works it at the worker's
speed, returns the capacity and pops again after a short overhead, for the
last :data:`HISTORY_SECONDS`; its last pop is still active when it has not
finished by ``now``. A few workers changed their capability state (models or
bridge) during that time, so their earlier pops carry the old state; a few
pops came from a worker's priority pass. Popped work looks like the queue's:
the same priorities and job sizes. Everything is drawn at once, per pop, with
NumPy; no loop runs over workers or pops.
"""

from __future__ import annotations

import numpy as np

from vecsched.core import rules
from vecsched.snapshot.schema import IMAGE, TEXT
from vecsched.snapshot.snapshot import ListColumn, Snapshot

HISTORY_SECONDS = 330.0
OVERHEAD_SECONDS = (0.5, 3.0)  # between a return and the thread's next pop
STATE_CHANGE_SHARE = 0.02  # workers whose capability state changed in the window
PRIORITY_PASS_SHARE = 0.05  # pops taken in a worker's priority pass
MAX_POPS_PER_THREAD = 400


def with_history(snapshot: Snapshot, seed: int = 0) -> Snapshot:
    """``snapshot`` with a drawn history of dispatches and capacity returns.

    Parameters
    ----------
    snapshot : Snapshot
        A horde (workers and requests); its events are replaced.
    seed : int
        Seed of the history's own generator.

    Returns
    -------
    Snapshot

    Examples
    --------
    >>> from vecsched.synthetic import horde
    >>> snap = with_history(horde(workers=20, requests=100, seed=1), seed=1)
    >>> len(snap.dispatches) > 0, snap.rejected
    (True, ())
    >>> set(snap.capacity_returns.dispatch_id) <= set(snap.dispatches.dispatch_id)
    True
    """
    rng = np.random.default_rng([seed, 0x57A11])
    now = snapshot.now
    w = snapshot.workers
    online = np.flatnonzero(now - w.last_check_in <= rules.ONLINE_WINDOW_SECONDS) if len(w) else np.zeros(0, np.int64)
    thread_worker = np.repeat(online, w.threads[online])
    if len(thread_worker) == 0:
        return snapshot.with_events({}, {})
    job_work, priorities, users = _queue_shape(snapshot)
    gentype = w.gentype[thread_worker]
    speed = np.where(np.isnan(w.speed[thread_worker]),
                     np.where(gentype == TEXT, rules.ASSUMED_TEXT_SPEED, rules.ASSUMED_IMAGE_SPEED),
                     w.speed[thread_worker])
    speed = np.maximum(speed, 1e-9)

    # Pops per thread: enough to cover the history at the thread's typical job time.
    typical = np.array([np.median(job_work[g]) if len(job_work[g]) else 1.0 for g in (TEXT, IMAGE)])
    per_job = typical[gentype] * np.where(gentype == IMAGE, 1e6, 1.0) / speed + np.mean(OVERHEAD_SECONDS)
    count = np.minimum(np.ceil(HISTORY_SECONDS / per_job).astype(np.int64) + 2, MAX_POPS_PER_THREAD)
    thread = np.repeat(np.arange(len(thread_worker)), count)
    g = gentype[thread]
    work = _sample(rng, job_work, g)
    unit = np.where(g == IMAGE, 1e6, 1.0)
    duration = work * unit / speed[thread] * rng.lognormal(0.0, 0.25, len(thread))
    step = duration + rng.uniform(*OVERHEAD_SECONDS, len(thread))
    # Each thread's pops follow one another from a random phase before the history.
    first = np.r_[0, np.cumsum(count)[:-1]]
    elapsed = np.cumsum(step) - np.repeat(np.cumsum(step)[first] - step[first], count)
    start = now - HISTORY_SECONDS - rng.uniform(0.0, 1.0, len(thread_worker)) * per_job
    popped = np.repeat(start, count) + elapsed - step
    keep = popped <= now
    popped, thread, work, duration, g = popped[keep], thread[keep], work[keep], duration[keep], g[keep]
    worker = thread_worker[thread]
    returned = popped + duration

    n = len(popped)
    ids = np.char.add("hist-d", np.arange(n).astype(str)).astype(object)
    state = w.state[worker].astype(object)
    changed = rng.random(len(w)) < STATE_CHANGE_SHARE
    change_at = now - rng.uniform(0.0, HISTORY_SECONDS, len(w))
    old = changed[worker] & (popped < change_at[worker])
    state[old] = np.char.add(state[old].astype(str), "~before").astype(object)
    priority_pass = rng.random(n) < PRIORITY_PASS_SHARE
    pass_users = _sample(rng, users, np.zeros(int(priority_pass.sum()), np.int64)) if len(users[0]) else []
    user_lists = ListColumn(np.r_[0, np.cumsum(priority_pass)].astype(np.int64), np.asarray(pass_users, dtype=object))
    dispatches = {
        "dispatch_id": ids,
        "worker_id": w.id[worker],
        "worker_state": state,
        "request_id": np.char.add("hist-r", np.arange(n).astype(str)).astype(object),
        "request_created": popped - rng.exponential(60.0, n),
        "request_extra_priority": _sample(rng, priorities, g),
        "selected_from_priority_queue": priority_pass,
        "priority_user_ids": user_lists,
        "dispatched_at": popped,
        "assigned_work": work,
    }
    done = returned <= now
    returns = {"dispatch_id": ids[done], "worker_id": w.id[worker[done]], "returned_at": returned[done]}
    return snapshot.with_events(dispatches, returns)


def _queue_shape(snapshot: Snapshot) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per gentype, the queue's job sizes (work units) and priorities; and its users."""
    r = snapshot.requests
    per_job = np.where(r.gentype == TEXT, r.max_length.astype(np.float64),
                       r.width.astype(np.float64) * r.height * r.steps / 1e6)
    defaults = (np.array([80.0]), np.array([7.86432]))
    work = [per_job[r.gentype == g] if (r.gentype == g).any() else defaults[g] for g in (TEXT, IMAGE)]
    priorities = [r.extra_priority[r.gentype == g] if (r.gentype == g).any() else np.zeros(1, np.int64)
                  for g in (TEXT, IMAGE)]
    users = [np.unique(r.user_id.astype(str)).astype(object) if len(r) else np.array(["u"], dtype=object)]
    return work, priorities, users


def _sample(rng: np.random.Generator, pools: list[np.ndarray], which: np.ndarray) -> np.ndarray:
    """For each entry of ``which``, a random value of ``pools[which]``."""
    out = np.empty(len(which), dtype=pools[0].dtype)
    for g, pool in enumerate(pools):  # one draw per pool (gentype), not per value
        mine = np.flatnonzero(which == g)
        out[mine] = pool[rng.integers(0, len(pool), len(mine))]
    return out
