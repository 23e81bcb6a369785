"""A discrete-event simulation of one AI Horde queue (or both), for measuring estimates.

The simulator keeps its own state in plain Python objects: it is an offline
tool, and per-event work on a few hundred workers and some thousands of
requests is cheaper as scalar code than as array rebuilds. Every random draw
comes from one seeded :class:`random.Random`, events are ordered by
``(time, sequence)`` and no iteration touches an unordered set, so a run is a
pure function of its scenario and seed.

What it models (issue 5):

* requests arrive as Poisson streams, with model popularity, lengths and gates
  drawn from the packaged reference lists;
* workers pop in queue order (``extra_priority`` desc, ``created``, id); every
  waiting request gains +50 priority every 10 s (a global tick, as the horde's
  periodic job does); a pop takes the first waiting request the worker is
  eligible for under SPEC section 3, after a pass over its priority users;
* a job occupies one thread for output / speed seconds, the speed varying per
  job; the worker's reported speed is the mean of its recent jobs (null until
  its first job completes), so unsampled workers are judged at the assumed speed;
* workers join, leave and change models; jobs occasionally fault and go back
  to the queue; requests expire 20 minutes after creation unless started
  (a dispatch refreshes the expiry) and some users cancel.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np

from vecsched.reference import passes_image_limits, passes_shared_gates, passes_text_gates
from vecsched.snapshot.schema import CHAT_MODES, CHAT_NONE, GENTYPES, IMAGE, SOURCE_PROCESSING, TEXT
from vecsched.core.rules import (
    ASSUMED_IMAGE_SPEED,
    ASSUMED_TEXT_SPEED,
    IMAGE_SLOW_SPEED,
    bridge_capabilities,
    OPTION_BIT,
    image_options_used,
    inpainting_models,
    options_served,
    parse_bridge_agents,
    text_model_parameters,
    text_speed_floor,
)
from vecsched.snapshot.snapshot import Snapshot
from vecsched.snapshot.times import iso

EPOCH = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc).timestamp()
EXPIRY_SECONDS = 1200.0  # a request not started within 20 minutes expires
AGING_PERIOD = 10.0  # every 10 s ...
AGING_STEP = 50  # ... each waiting request gains 50 priority
EVENT_WINDOW = 900.0  # dispatches and returns kept in snapshots (SPEC: at least 10 minutes)
OFFLINE_KEEP = 600.0  # a departed worker stays in snapshots (offline) this long
CHECK_IN_PERIOD = 60.0  # workers check in at least this often while present
FAULT_SPAN = (0.1, 1.0)  # a faulted job ends after this share of its time

_ENUM_NAMES = {"gentype": GENTYPES, "chat_mode": CHAT_MODES, "source_processing": SOURCE_PROCESSING}


def _reference_row(item: SimWorker | SimRequest, names: tuple[str, ...]) -> dict[str, Any]:
    """Snapshot columns as :mod:`vecsched.reference` reads a row (enums by name), so that
    the simulator's gates can be the reference's own predicates. A plain dict: the gates
    read it many times per event."""
    row = {name: getattr(item, name) for name in (*names, "model_set")}
    for name, labels in _ENUM_NAMES.items():
        if name in row:
            row[name] = labels[row[name]]
    return row


@dataclass(eq=False)
class SimWorker:
    """One worker: its declaration (snapshot columns) and its simulated state."""

    id: str
    user_id: str
    gentype: int
    models: tuple[str, ...]
    true_speed: float
    threads: int = 1
    owner_trusted: bool = False
    maintenance: bool = False
    paused: bool = False
    nsfw: bool = True
    bridge_agent: str = "unknown:0:unknown"
    max_length: int = 512
    max_context_length: int = 2048
    chat_mode: int = CHAT_NONE
    chat_max_length: int | None = None
    chat_max_context_length: int | None = None
    max_pixels: int = 262144
    allow_img2img: bool = True
    allow_painting: bool = True
    allow_post_processing: bool = True
    allow_controlnet: bool = False
    allow_sdxl_controlnet: bool = False
    allow_lora: bool = False
    extra_slow_worker: bool = False
    priority_user_ids: tuple[str, ...] = ()
    samples: list[float] = field(default_factory=list)  # recent measured speeds
    # simulated state
    online: bool = False
    joined_at: float = 0.0
    left_at: float | None = None
    check_phase: float = 0.0
    busy: int = 0
    poll_pending: bool = False
    state_version: int = 0
    # derived once per declaration change
    model_set: frozenset[str] = frozenset()
    options: int = 0  # rules.OPTION_BIT bits of the image options it serves
    floor: float = 0.0

    def __post_init__(self) -> None:
        if self.chat_max_length is None:
            self.chat_max_length = self.max_length
        if self.chat_max_context_length is None:
            self.chat_max_context_length = self.max_context_length
        self.derive()
        self.row = _reference_row(self, _WORKER_FIELDS)

    def __setattr__(self, name: str, value: Any) -> None:
        # A declaration may change mid-run (models, chat mode): its row follows at once.
        object.__setattr__(self, name, value)
        row = self.__dict__.get("row")
        if row is not None and name in row:
            labels = _ENUM_NAMES.get(name)
            row[name] = value if labels is None else labels[value]

    def derive(self) -> None:
        """Recompute what eligibility reads from the declaration."""
        self.model_set = frozenset(self.models)
        names, versions = parse_bridge_agents(np.array([self.bridge_agent], dtype=object))
        caps = bridge_capabilities(str(names[0]), int(versions[0]))
        if self.gentype == TEXT:
            params = text_model_parameters().get(self.models[0], 0.0) if self.models else 0.0
            if not params == params:  # NaN in the reference list: unknown size
                params = 0.0
            self.floor = float(text_speed_floor(np.asarray([params], dtype=float))[0])
        else:
            self.floor = IMAGE_SLOW_SPEED
            can_paint = any(m in inpainting_models() for m in self.models)
            self.options = int(options_served(self, caps, can_paint))

    @property
    def speed(self) -> float | None:
        """The reported speed: mean of recent jobs, None with no samples yet."""
        return sum(self.samples) / len(self.samples) if self.samples else None

    @property
    def effective_speed(self) -> float:
        s = self.speed
        if s is None:
            return ASSUMED_TEXT_SPEED if self.gentype == TEXT else ASSUMED_IMAGE_SPEED
        return s

    @property
    def state(self) -> str:
        return f"{self.id}.{self.state_version}"

    def slow(self) -> bool:
        return self.effective_speed < self.floor


@dataclass(eq=False)
class SimRequest:
    """One request: its snapshot columns and what happened to it."""

    id: str
    user_id: str
    gentype: int
    created: float
    n: int
    models: tuple[str, ...] = ()
    base_priority: int = 0
    slow_workers: bool = True
    trusted_workers: bool = False
    nsfw: bool = False
    worker_blacklist: bool = False
    worker_ids: tuple[str, ...] = ()
    max_length: int = 80
    max_context_length: int = 2048
    is_chat: bool = False
    validated_backends: bool = False
    width: int = 512
    height: int = 512
    steps: int = 30
    extra_slow_workers: bool = False
    source_image: bool = False
    loras: bool = False
    tis: bool = False
    control_type: bool = False
    hires_fix: bool = False
    tiling: bool = False
    transparent: bool = False
    extra_source_images: bool = False
    source_processing: int = 0
    post_processing: int = 0
    r2: bool = True
    excluded: tuple[str, ...] = ()
    # simulated state
    jobs: int = 0
    expiry: float = 0.0
    status: str = "waiting"  # waiting | done | expired | cancelled
    queued: bool = False
    started_at: float | None = None
    completed_at: float | None = None
    expired_at: float | None = None
    cancelled_at: float | None = None
    job_ids: list[str] = field(default_factory=list)
    finished_jobs: int = 0
    # derived
    model_set: frozenset[str] = frozenset()
    options: int = 0  # rules.OPTION_BIT bits of the image options it uses
    key: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        self.jobs = self.jobs or self.n
        self.expiry = self.expiry or self.created + EXPIRY_SECONDS
        self.model_set = frozenset(self.models)
        tick = math.floor(self.created / AGING_PERIOD)
        # Aging adds the same +50 to every waiting request at each tick, so the
        # queue order is fixed at arrival: priority now = base + 50 * (ticks since
        # created), and the common term drops out of every comparison.
        self.key = (-(self.base_priority - AGING_STEP * tick), self.created, self.id)
        self.row = _reference_row(self, _REQUEST_FIELDS)
        if self.gentype == IMAGE:
            used = image_options_used(self)
            self.options = sum(int(bit) for name, bit in OPTION_BIT.items() if used[name])

    def priority(self, now: float) -> int:
        """``extra_priority`` at ``now``, aging included."""
        ticks = math.floor(now / AGING_PERIOD) - math.floor(self.created / AGING_PERIOD)
        return self.base_priority + AGING_STEP * max(ticks, 0)

    @property
    def output(self) -> float:
        """Output of one job: tokens (text) or pixel-steps (image)."""
        if self.gentype == TEXT:
            return float(self.max_length)
        return float(self.width * self.height * self.steps)

    @property
    def work(self) -> float:
        """Work of one job in the interchange unit: tokens or megapixel-steps."""
        return self.output if self.gentype == TEXT else self.output / 1e6


@dataclass(eq=False)
class SimJob:
    id: str
    request: SimRequest
    worker: SimWorker
    started: float
    dispatch_id: str
    state: int = 0  # 0 processing, 1 finished, 2 faulted
    ended: float | None = None


class Simulation:
    """The event loop and the horde state.

    Build one from a :class:`~vecsched.simulate.Scenario` with
    :func:`~vecsched.simulate.simulate`, or directly: add workers with
    :meth:`add_worker`, requests with :meth:`add_request`, timed actions with
    :meth:`at`, then :meth:`run_until`.

    Examples
    --------
    >>> from vecsched.simulate.engine import Simulation, SimWorker, SimRequest, EPOCH
    >>> sim = Simulation(seed=1, noise=0.0, overhead=(0.0, 0.0), poll_delay=0.0)
    >>> sim.add_worker(SimWorker("w1", "u1", 0, ("m",), true_speed=20.0))
    >>> sim.add_request(SimRequest("r1", "u2", 0, EPOCH, n=1, models=("m",), max_length=200))
    >>> sim.run_until(EPOCH + 60)
    >>> r = sim.requests["r1"]
    >>> r.status, r.completed_at - r.created
    ('done', 10.0)
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        start: float = EPOCH,
        noise: float = 0.25,
        overhead: tuple[float, float] = (0.3, 1.5),
        fault_rate: float = 0.01,
        poll_delay: float = 1.0,
    ) -> None:
        self.rng = random.Random(seed)
        self.now = start
        self.start = start
        self.noise = noise  # sigma of the log of per-job speed variation
        self.overhead = overhead  # seconds between a thread freeing and its next pop
        self.fault_rate = fault_rate
        self.poll_delay = poll_delay  # an idle worker notices new work within this
        # Optional (worker, request, per-job speed) -> (seconds, recorded speed);
        # None: output / speed (vecsched.simulate.realism sets one).
        self.job_time: Callable[[SimWorker, SimRequest, float], tuple[float, float]] | None = None
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self.workers: dict[str, SimWorker] = {}
        self.requests: dict[str, SimRequest] = {}
        self.jobs: dict[str, SimJob] = {}
        # queue per gentype, per model (None: requests naming no model); sorted keys
        self._queues: tuple[dict[str | None, list[tuple[Any, ...]]], ...] = ({}, {})
        self._by_user: dict[str, dict[str, SimRequest]] = {}
        self._idle: tuple[dict[str, SimWorker], dict[str, SimWorker]] = ({}, {})
        self._fast_version = 0  # bumps when a worker's slow status or presence changes
        self._chat_cache: dict[str, tuple[int, bool]] = {}
        self.log: list[dict[str, Any]] = []
        self.dispatches: list[dict[str, Any]] = []
        self.capacity_returns: list[dict[str, Any]] = []
        self._job_seq = itertools.count(1)

    # -- scheduling ---------------------------------------------------------------
    def at(self, when: float, action: Callable[..., None], *args: Any) -> None:
        """Run ``action(*args)`` at simulated time ``when`` (epoch seconds)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), action, args))

    def run_until(self, until: float) -> None:
        """Process every event up to and including ``until``; leave ``now`` there."""
        heap = self._heap
        while heap and heap[0][0] <= until:
            when, _, action, args = heapq.heappop(heap)
            self.now = when
            action(*args)
        self.now = max(self.now, until)

    def _record(self, kind: str, **fields: Any) -> None:
        if "gentype" in fields:
            fields["gentype"] = GENTYPES[fields["gentype"]]
        self.log.append({"t": self.now, "time": iso(self.now), "kind": kind, **fields})

    # -- workers ------------------------------------------------------------------
    def add_worker(self, worker: SimWorker) -> None:
        """A worker joins now and starts popping."""
        worker.online = True
        worker.joined_at = self.now
        worker.left_at = None
        worker.check_phase = self.rng.uniform(0, CHECK_IN_PERIOD)
        self.workers[worker.id] = worker
        self._fast_version += 1
        self._record("worker_join", worker_id=worker.id, gentype=worker.gentype)
        self._wake_all(worker.gentype)
        self._schedule_poll(worker, self.rng.uniform(0, self.poll_delay))

    def remove_worker(self, worker_id: str) -> None:
        """A worker stops popping; jobs it holds finish, then it is gone."""
        w = self.workers.get(worker_id)
        if w is None or not w.online:
            return
        w.online = False
        w.left_at = self.now
        self._idle[w.gentype].pop(w.id, None)
        self._fast_version += 1
        self._record("worker_leave", worker_id=w.id, gentype=w.gentype)
        self._wake_all(w.gentype)

    def change_models(self, worker_id: str, models: tuple[str, ...]) -> None:
        """The worker restarts with other models: a new capability state."""
        w = self.workers.get(worker_id)
        if w is None or not w.online:
            return
        w.models = tuple(models)
        w.state_version += 1
        w.derive()
        self._fast_version += 1
        self._record("worker_models", worker_id=w.id, models=list(models))
        self._wake_all(w.gentype)
        self._schedule_poll(w, self.rng.uniform(0, self.poll_delay))

    def _wake_all(self, gentype: int) -> None:
        # Presence and slow status feed the chat fallback of other workers'
        # eligibility, so a change there lets every idle worker look again.
        idle = self._idle[gentype]
        for w in list(idle.values()):
            self._schedule_poll(w, self.rng.uniform(0, self.poll_delay))
        idle.clear()

    def _schedule_poll(self, w: SimWorker, delay: float) -> None:
        if not w.poll_pending:
            w.poll_pending = True
            self.at(self.now + delay, self._poll, w)

    # -- requests -----------------------------------------------------------------
    def add_request(self, r: SimRequest) -> None:
        """A request arrives now (``r.created`` should be ``now``)."""
        self.requests[r.id] = r
        self._record("arrival", request_id=r.id, gentype=r.gentype, n=r.n, user_id=r.user_id)
        self._enqueue(r)
        self.at(r.expiry, self._expire, r)
        idle = self._idle[r.gentype]
        for w in list(idle.values()):
            if self.eligible(w, r):
                del idle[w.id]
                self._schedule_poll(w, self.rng.uniform(0, self.poll_delay))

    def cancel(self, request_id: str) -> None:
        """The user cancels: unassigned work leaves the queue; jobs in flight run on."""
        r = self.requests.get(request_id)
        if r is None or r.status != "waiting":
            return
        self._dequeue(r)
        r.status = "cancelled"
        r.cancelled_at = self.now
        self._record("cancellation", request_id=r.id, gentype=r.gentype, started=r.started_at is not None)

    def _enqueue(self, r: SimRequest) -> None:
        if r.queued:
            return
        queues = self._queues[r.gentype]
        for m in r.models or (None,):
            bisect.insort(queues.setdefault(m, []), r.key)
        self._by_user.setdefault(r.user_id, {})[r.id] = r
        r.queued = True

    def _dequeue(self, r: SimRequest) -> None:
        if not r.queued:
            return
        queues = self._queues[r.gentype]
        for m in r.models or (None,):
            lst = queues[m]
            k = bisect.bisect_left(lst, r.key)
            if k < len(lst) and lst[k] == r.key:
                del lst[k]
        self._by_user[r.user_id].pop(r.id, None)
        r.queued = False

    def _expire(self, r: SimRequest) -> None:
        if r.status != "waiting" or r.n == 0:
            return
        if r.expiry > self.now:  # refreshed by a dispatch since this was scheduled
            self.at(r.expiry, self._expire, r)
            return
        self._dequeue(r)
        r.status = "expired"
        r.expired_at = self.now
        self._record("expiry", request_id=r.id, gentype=r.gentype, started=r.started_at is not None)

    # -- eligibility (SPEC section 3) ----------------------------------------------
    def eligible(self, w: SimWorker, r: SimRequest) -> bool:
        """May worker ``w`` be handed a job of request ``r`` now? (SPEC section 3)."""
        if not self._passes_other_gates(w, r):
            return False
        if r.gentype == TEXT:
            if w.slow():
                if r.is_chat:
                    return not self._chat_has_fast(r)
                return r.slow_workers
            return True
        if w.effective_speed < IMAGE_SLOW_SPEED and not r.slow_workers:
            return False
        return True

    def _passes_other_gates(self, w: SimWorker, r: SimRequest) -> bool:
        """Every gate but the speed gates: the simulated state here, the declarations
        by the reference's own predicates (SPEC section 3), the image options by their bits."""
        if w.gentype != r.gentype or not w.online or w.paused:
            return False
        if r.status != "waiting" or r.n <= 0:
            return False
        if r.excluded and w.id in r.excluded:
            return False
        if not passes_shared_gates(w.row, r.row):
            return False
        if r.gentype == TEXT:
            return passes_text_gates(w.row, r.row)
        return passes_image_limits(w.row, r.row) and not (r.options & ~w.options)

    def _chat_has_fast(self, r: SimRequest) -> bool:
        cached = self._chat_cache.get(r.id)
        if cached is not None and cached[0] == self._fast_version:
            return cached[1]
        found = any(
            w.online and not w.slow() and self._passes_other_gates(w, r) for w in self.workers.values()
        )
        self._chat_cache[r.id] = (self._fast_version, found)
        return found

    # -- the worker loop ------------------------------------------------------------
    def _poll(self, w: SimWorker) -> None:
        w.poll_pending = False
        if not w.online or w.busy >= w.threads:
            return
        picked, from_priority = self._pick(w)
        if picked is None:
            self._idle[w.gentype][w.id] = w
            return
        self._dispatch(w, picked, from_priority)
        if w.busy < w.threads:  # another free thread pops right after
            self._schedule_poll(w, 0.2 * self.rng.uniform(*self.overhead))

    def _pick(self, w: SimWorker) -> tuple[SimRequest | None, bool]:
        if w.paused:
            return None, False  # a paused worker is handed decoys, never real jobs
        best: SimRequest | None = None
        for uid in w.priority_user_ids:  # the worker's priority pass first
            for r in self._by_user.get(uid, {}).values():
                if r.queued and self.eligible(w, r) and (best is None or r.key < best.key):
                    best = r
        if best is not None or w.maintenance:
            return best, best is not None
        queues = self._queues[w.gentype]
        requests = self.requests
        for m in (*w.models, None):
            for key in queues.get(m, ()):
                if best is not None and key >= best.key:
                    break
                r = requests[key[2]]
                if self.eligible(w, r):
                    best = r
                    break
        return best, False

    def _dispatch(self, w: SimWorker, r: SimRequest, from_priority: bool) -> None:
        now = self.now
        r.n -= 1
        if r.n == 0:
            self._dequeue(r)
        if r.started_at is None:
            r.started_at = now
            self._record("start", request_id=r.id, gentype=r.gentype, worker_id=w.id)
        r.expiry = max(r.expiry, now + EXPIRY_SECONDS)
        k = next(self._job_seq)
        job = SimJob(f"j{k:06d}", r, w, now, f"d{k:06d}")
        self.jobs[job.id] = job
        r.job_ids.append(job.id)
        w.busy += 1
        dispatch = {
            "dispatch_id": job.dispatch_id,
            "worker_id": w.id,
            "worker_state": w.state,
            "request_id": r.id,
            "request_created": iso(r.created),
            "request_extra_priority": r.priority(now),
            "selected_from_priority_queue": from_priority,
            "priority_user_ids": list(w.priority_user_ids),
            "dispatched_at": iso(now),
            "assigned_work": r.work,
        }
        self.dispatches.append(dispatch)
        self._record("dispatch", request_id=r.id, gentype=r.gentype, worker_id=w.id, job_id=job.id,
                     dispatch=dispatch)
        duration, speed = self.job_seconds(w, r)
        if self.fault_rate and self.rng.random() < self.fault_rate:
            self.at(now + self.rng.uniform(*FAULT_SPAN) * duration, self._end_job, job, False, speed)
        else:
            self.at(now + duration, self._end_job, job, True, speed)

    def job_seconds(self, w: SimWorker, r: SimRequest) -> tuple[float, float]:
        """Draw one job of ``r`` on ``w``: its seconds, and the speed the horde then records."""
        speed = w.true_speed * math.exp(self.rng.gauss(0.0, self.noise)) if self.noise else w.true_speed
        if self.job_time is not None:
            return self.job_time(w, r, speed)
        return r.output / speed, speed

    def thread_seconds(self, w: SimWorker, r: SimRequest) -> float:
        """Draw the seconds one thread of ``w`` is kept from popping by one job of ``r``, on average.

        The job (:meth:`job_seconds`) and the gap before the thread pops again,
        plus the expected cost of faults: a faulted job held its thread for
        part of its time and is handed out again.
        """
        busy = self.job_seconds(w, r)[0]
        gap = sum(self.overhead) / 2.0
        lost = (sum(FAULT_SPAN) / 2.0 * busy + gap) * self.fault_rate / (1.0 - self.fault_rate)
        return busy + gap + lost

    def _end_job(self, job: SimJob, ok: bool, speed: float) -> None:
        w, r = job.worker, job.request
        job.ended = self.now
        w.busy -= 1
        self.capacity_returns.append(
            {"dispatch_id": job.dispatch_id, "worker_id": w.id, "returned_at": iso(self.now)}
        )
        self._record("capacity_return", request_id=r.id, gentype=r.gentype, worker_id=w.id,
                     job_id=job.id, dispatch_id=job.dispatch_id)
        if ok:
            job.state = 1
            was_slow = w.slow()
            w.samples.append(speed)
            del w.samples[:-10]
            if w.slow() != was_slow:
                self._fast_version += 1
            r.finished_jobs += 1
            self._record("job_done", request_id=r.id, gentype=r.gentype, worker_id=w.id, job_id=job.id)
            if r.status == "waiting" and r.finished_jobs >= r.jobs:
                r.status = "done"
                r.completed_at = self.now
                self._record("completion", request_id=r.id, gentype=r.gentype)
        else:
            job.state = 2
            self._record("job_fault", request_id=r.id, gentype=r.gentype, worker_id=w.id, job_id=job.id)
            if r.status == "waiting":  # the horde hands the job out again
                r.n += 1
                self._enqueue(r)
                self._wake_all(r.gentype)
        if w.online:
            self._schedule_poll(w, self.rng.uniform(*self.overhead))
        else:
            self._idle[w.gentype].pop(w.id, None)

    # -- snapshots ----------------------------------------------------------------
    def last_check_in(self, w: SimWorker, now: float) -> float:
        """Deterministic check-in time: the latest check-in tick not after ``now``."""
        end = now if w.online else min(now, w.left_at or now)
        k = math.floor((end - w.joined_at - w.check_phase) / CHECK_IN_PERIOD)
        t = w.joined_at + w.check_phase + k * CHECK_IN_PERIOD
        return t if t >= w.joined_at else w.joined_at

    def snapshot(self, *, window: float = EVENT_WINDOW) -> Snapshot:
        """The horde at ``now`` as a :class:`~vecsched.Snapshot` (events included).

        Workers that left within the last 10 minutes stay in it with their last
        check-in, as a horde keeps them until they time out; active requests
        (waiting, or with jobs in flight) and their jobs are in it, with the
        aged ``extra_priority``.
        """
        now = self.now
        wcols: dict[str, list[Any]] = {k: [] for k in _WORKER_FIELDS + ("last_check_in", "speed", "state")}
        for w in self.workers.values():
            if not w.online and (w.left_at is None or now - w.left_at > OFFLINE_KEEP):
                continue
            for k in _WORKER_FIELDS:
                wcols[k].append(getattr(w, k))
            wcols["last_check_in"].append(self.last_check_in(w, now))
            s = w.speed
            wcols["speed"].append(math.nan if s is None else s)
            wcols["state"].append(w.state)
        wcols["models"] = [list(m) for m in wcols["models"]]
        rcols: dict[str, list[Any]] = {k: [] for k in _REQUEST_FIELDS + ("expiry", "extra_priority")}
        jcols: dict[str, list[Any]] = {"id": [], "request_id": [], "worker_id": [], "started": [], "state": []}
        pairs: dict[str, list[str]] = {"worker_id": [], "request_id": []}
        for r in self.requests.values():
            if r.status != "waiting":
                continue
            for k in _REQUEST_FIELDS:
                rcols[k].append(getattr(r, k))
            rcols["expiry"].append(r.expiry)
            rcols["extra_priority"].append(r.priority(now))
            for wid in r.excluded:
                pairs["worker_id"].append(wid)
                pairs["request_id"].append(r.id)
            for jid in r.job_ids:
                job = self.jobs[jid]
                jcols["id"].append(job.id)
                jcols["request_id"].append(r.id)
                jcols["worker_id"].append(job.worker.id)
                jcols["started"].append(job.started)
                jcols["state"].append(job.state)
        rcols["models"] = [list(m) for m in rcols["models"]]
        rcols["worker_ids"] = [list(m) for m in rcols["worker_ids"]]
        cut = iso(now - window)
        # ISO strings of one format compare in time order.
        dispatches = [d for d in self.dispatches if d["dispatched_at"] >= cut]
        returns = [c for c in self.capacity_returns if c["returned_at"] >= cut]
        def arr(values: list[Any], dtype: Any) -> Any:
            return np.asarray(values, dtype=dtype)

        workers = {k: (v if k == "models" else _as_array(k, v)) for k, v in wcols.items()}
        requests = {k: (v if k in ("models", "worker_ids") else _as_array(k, v)) for k, v in rcols.items()}
        jobs = {
            "id": arr(jcols["id"], object),
            "request_id": arr(jcols["request_id"], object),
            "worker_id": arr(jcols["worker_id"], object),
            "started": arr(jcols["started"], float),
            "state": arr(jcols["state"], np.int8),
        }
        return Snapshot.from_columns(now, workers, requests, jobs, pairs, dispatches=dispatches,
                                     capacity_returns=returns)


_WORKER_FIELDS = (
    "id", "user_id", "gentype", "owner_trusted", "threads", "maintenance", "paused", "nsfw", "models",
    "bridge_agent", "max_length", "max_context_length", "chat_mode", "chat_max_length",
    "chat_max_context_length", "max_pixels", "allow_img2img", "allow_painting", "allow_post_processing",
    "allow_controlnet", "allow_sdxl_controlnet", "allow_lora", "extra_slow_worker",
)
_REQUEST_FIELDS = (
    "id", "user_id", "gentype", "created", "n", "jobs", "models", "slow_workers", "trusted_workers",
    "nsfw", "worker_blacklist", "worker_ids", "max_length", "max_context_length", "is_chat",
    "validated_backends", "width", "height", "steps", "extra_slow_workers", "source_image", "loras", "tis",
    "control_type", "hires_fix", "tiling", "transparent", "extra_source_images", "source_processing",
    "post_processing", "r2",
)
_ENUMS = ("gentype", "chat_mode", "source_processing")
_STRS = ("id", "user_id", "bridge_agent", "state")


def _as_array(name: str, values: list[Any]) -> Any:
    if name in _ENUMS:
        return np.asarray(values, dtype=np.int8)
    if name in _STRS:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.asarray(values)
