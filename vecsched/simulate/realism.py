"""What makes the simulated horde less flattering to estimators (issue 12).

The base simulator runs every job for exactly output / speed, polls almost at
once, draws models by popularity whatever is served, and has users of nearly
equal priority. The public horde differs in ways that hurt every estimate:

* ``extra_priority`` is kudos: 0 for anonymous users, thousands for most
  registered ones and up to 10^6 and more for a few, so later arrivals of a
  rich user jump ahead for hours (aging adds only 50 every 10 s);
* text jobs stop early (most outputs are shorter than ``max_length``) and
  first process the prompt, which takes longer with more context; the
  worker's reported speed is what the horde measures: tokens per second of
  the whole job;
* image time is not linear in pixel-steps: larger images cost more per
  pixel, models differ, and loading, hires fix and post-processing add time;
* idle workers poll every 1-5 s with jitter, and pop again a few seconds after
  a job ends;
* arrivals come in bursts on a daily cycle, and most requests name a model
  that is being served (what users see offered), the rest anything;
* impatient users cancel with a hazard that grows with waiting;
* workers leave and join in waves (an owner's several workers, a model's
  host), not one at a time.

Everything draws from the simulation's seeded generator, so runs stay
deterministic. :func:`apply` switches it on for a built simulation.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Any

from vecsched.snapshot.schema import IMAGE, TEXT



@dataclass(frozen=True)
class Realism:
    """The knobs of :func:`apply` (defaults: a plausible public horde)."""

    anonymous_share: float = 0.55
    kudos_median: float = 2_000.0
    kudos_sigma: float = 2.3  # lognormal: about 1 user in 100 above 10^5, a few above 10^6
    full_length_share: float = 0.3  # text outputs that run to max_length
    early_stop: tuple[float, float] = (0.1, 1.0)  # the others stop at this share of it
    context_used: tuple[float, float] = (0.2, 0.95)  # of max_context_length, for the prompt
    prompt_speedup: tuple[float, float] = (15.0, 60.0)  # prompt tokens/s per generated token/s
    image_size_exponent: float = 0.3  # seconds per pixel-step grow as pixels ** this
    image_overhead: tuple[float, float] = (1.0, 4.0)  # seconds: load, VAE, upload
    poll: float = 5.0  # idle workers poll every 0 .. this seconds (jittered)
    pop_gap: tuple[float, float] = (0.5, 5.0)  # seconds between a job's end and the next pop
    burst_per_hour: float = 4.0
    burst_minutes: tuple[float, float] = (2.0, 8.0)
    burst_factor: float = 3.0
    daily_amplitude: float = 0.35
    served_share: float = 0.9  # requests whose model is drawn among those being served
    impatient_share: float = 0.35
    patience_scale: float = 600.0  # Weibull scale (s) ...
    patience_shape: float = 1.8  # ... and shape > 1: the hazard grows with waiting
    wave_size: tuple[int, int] = (1, 4)


def kudos(rng: Any, r: Realism) -> int:
    """One user's ``extra_priority``: 0 when anonymous, else lognormal kudos."""
    if rng.random() < r.anonymous_share:
        return 0
    return int(rng.lognormvariate(math.log(r.kudos_median), r.kudos_sigma))


def _model_factor(models: tuple[str, ...]) -> float:
    # A stable per-model cost factor (0.7 .. 1.8): heavier architectures take longer per step.
    if not models:
        return 1.0
    digest = hashlib.sha256(models[0].encode()).digest()
    return 0.7 + 1.1 * digest[0] / 255.0


def job_time(realism: Realism, rng: Any, w: Any, r: Any, speed: float) -> tuple[float, float]:
    """Seconds one job takes on ``w`` at per-job ``speed``, and the speed the horde then records."""
    if r.gentype == TEXT:
        tokens = float(r.max_length)
        if rng.random() >= realism.full_length_share:
            tokens = max(1.0, round(tokens * rng.uniform(*realism.early_stop)))
        prompt = r.max_context_length * rng.uniform(*realism.context_used)
        seconds = prompt / (speed * rng.uniform(*realism.prompt_speedup)) + tokens / speed + rng.uniform(0.2, 1.0)
        return seconds, tokens / seconds
    pixels = r.width * r.height
    seconds = r.output / speed * (pixels / 262144.0) ** realism.image_size_exponent * _model_factor(w.models)
    if r.hires_fix:
        seconds *= 1.6
    seconds += rng.uniform(*realism.image_overhead) + (2.0 if r.post_processing else 0.0)
    return seconds, r.output / seconds


def _served_model(sim: Any, gentype: int, reserved: frozenset[str] = frozenset()) -> str | None:
    """A model drawn by the online threads serving it (None when nothing is served).

    ``reserved``: models a scenario feeds with a stream of its own (``lone_idle``'s), never drawn here.
    """
    weights: dict[str, float] = {}
    for w in sim.workers.values():
        if w.online and w.gentype == gentype and not w.paused:
            for m in w.models:
                if m not in reserved:
                    weights[m] = weights.get(m, 0.0) + w.threads / len(w.models)
    if not weights:
        return None
    names = sorted(weights)
    return sim.rng.choices(names, [weights[m] for m in names])[0]


def burst_share(realism: Realism) -> float:
    """The long-run share of time :func:`arrivals` spends in a burst.

    Bursts start as a Poisson process and a new one resets the end, so a
    moment is in a burst when the latest start is younger than that burst's
    length D: P = 1 - E[exp(-lambda D)], D uniform over ``burst_minutes``.
    """
    per_minute = realism.burst_per_hour / 60.0
    low, high = realism.burst_minutes
    if per_minute <= 0:  # a horde without bursts (the counterfactual of a study) is always calm
        return 0.0
    if high <= low:
        return 1.0 - math.exp(-per_minute * low)
    return 1.0 - (math.exp(-per_minute * low) - math.exp(-per_minute * high)) / (per_minute * (high - low))


def arrivals(pop: Any, realism: Realism, gentype: int, rate: float, until: float) -> None:
    """Bursty, daily-cycle arrivals at a mean of ``rate`` per second, models following what is served."""
    if rate <= 0:
        return
    sim = pop.sim
    calm_rate = rate / (1.0 + burst_share(realism) * (realism.burst_factor - 1.0))
    state = {"burst_until": -math.inf}

    def current_rate() -> float:
        day = 1.0 + realism.daily_amplitude * math.sin(2.0 * math.pi * (sim.now % 86400.0) / 86400.0)
        return calm_rate * day * (realism.burst_factor if sim.now < state["burst_until"] else 1.0)

    def burst() -> None:
        if sim.now >= until:
            return
        state["burst_until"] = sim.now + 60.0 * sim.rng.uniform(*realism.burst_minutes)
        sim.at(sim.now + sim.rng.expovariate(realism.burst_per_hour / 3600.0), burst)

    def fire() -> None:
        if sim.now >= until:
            return
        r = pop.request(gentype)
        painting = gentype == IMAGE and r.source_processing in (2, 3)  # keeps its inpainting model
        if len(r.models) == 1 and not painting and sim.rng.random() < realism.served_share:
            model = _served_model(sim, gentype, frozenset(pop.reserved_models))
            if model is not None:
                r = replace(r, models=(model,))  # derived fields (model set, gate row) follow
        sim.add_request(r)
        if sim.rng.random() < realism.impatient_share:
            patience = sim.rng.weibullvariate(realism.patience_scale, realism.patience_shape)
            sim.at(sim.now + patience, _give_up, sim, r)
        sim.at(sim.now + sim.rng.expovariate(current_rate()), fire)

    if realism.burst_per_hour > 0:
        sim.at(sim.now + sim.rng.expovariate(realism.burst_per_hour / 3600.0), burst)
    sim.at(sim.now + sim.rng.expovariate(current_rate()), fire)


def _give_up(sim: Any, r: Any) -> None:
    # Someone watching progress does not cancel; someone still waiting does.
    if r.started_at is None:
        sim.cancel(r.id)


def churn(pop: Any, realism: Realism, until: float) -> None:
    """Workers leave and join in waves; models change one worker at a time."""
    sim, sc = pop.sim, pop.scenario
    gentypes = [g for g, n in ((TEXT, sc.text_workers), (IMAGE, sc.image_workers)) if n]
    mean_wave = sum(realism.wave_size) / 2.0

    def process(rate_per_min: float, act: Any) -> None:
        if rate_per_min <= 0:
            return

        def fire() -> None:
            if sim.now >= until:
                return
            act()
            sim.at(sim.now + sim.rng.expovariate(rate_per_min / 60.0), fire)

        sim.at(sim.now + sim.rng.expovariate(rate_per_min / 60.0), fire)

    def online(g: int) -> list[Any]:
        return [w for w in sim.workers.values() if w.online and w.gentype == g]

    def leave_wave(g: int) -> None:
        ws = online(g)
        if not ws:
            return
        first = sim.rng.choice(ws)
        size = sim.rng.randint(*realism.wave_size)
        # The same owner's workers, or the hosts of the same model, go together.
        kin = [w for w in ws if w is not first and (w.user_id == first.user_id or w.models[:1] == first.models[:1])]
        for w in [first, *sim.rng.sample(kin, min(len(kin), size - 1))]:
            sim.remove_worker(w.id)

    def join_wave(g: int) -> None:
        for _ in range(sim.rng.randint(*realism.wave_size)):
            sim.add_worker(pop._fresh(pop.worker(g)))

    for g in gentypes:
        process(sc.join_per_min / mean_wave, lambda g=g: join_wave(g))
        process(sc.leave_per_min / mean_wave, lambda g=g: leave_wave(g))
        process(sc.model_change_per_min, lambda g=g: (ws := online(g)) and sim.change_models(
            sim.rng.choice(ws).id, tuple(pop.popular(g, 1 if g == TEXT else 2))))


def apply(sim: Any, pop: Any, realism: Realism) -> None:
    """Switch a built simulation to realistic priorities, job times and polling."""
    for u in pop.users:
        pop.user_priority[u] = kudos(sim.rng, realism)
    sim.poll_delay = realism.poll
    sim.overhead = realism.pop_gap
    sim.job_time = lambda w, r, speed: job_time(realism, sim.rng, w, r, speed)
