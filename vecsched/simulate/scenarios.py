"""Named scenarios: who serves, who asks, and what changes over a simulated run.

A :class:`Scenario` is a set of knobs over one shared population model
(workers and requests drawn with the shapes of the public horde: Zipf model
popularity, mostly single-model text workers, speeds spread over an order of
magnitude, a long kudos tail of priorities) plus an optional ``setup`` hook
that adds what makes the scenario special (a burst, a lone worker, a drought).
Arrival rates are set from a target load: ``load = 1`` means requests arrive
as fast as the whole gentype's true capacity could serve them, that capacity
being what the simulator's own job times and gaps let its threads finish
(:meth:`Population.capacity`), not their generation speed alone.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable

from vecsched.snapshot.schema import CHAT_NONE, CHAT_ONLY, CHAT_OPT_IN, IMAGE, TEXT
from vecsched.core.rules import model_table
from vecsched.simulate.engine import EPOCH, SimRequest, SimWorker, Simulation
from vecsched.simulate.realism import Realism
from vecsched.simulate.realism import apply as apply_realism
from vecsched.simulate.realism import arrivals as realistic_arrivals
from vecsched.simulate.realism import churn as realistic_churn

_ID_NAMESPACE = uuid.UUID("6f1d2c9e-3b7a-5e40-9c1d-7a2b4e8f0c31")  # vecsched's own, for uuid5 ids

_TEXT_LENGTHS = ((80, 3), (120, 5), (160, 8), (200, 12), (240, 12), (256, 15), (300, 15), (400, 10), (512, 20))
_TEXT_CONTEXTS = ((1024, 10), (2048, 30), (4096, 35), (8192, 22), (16384, 3))
_WORKER_LENGTHS = ((256, 5), (512, 60), (1024, 35))
_WORKER_CONTEXTS = ((2048, 5), (4096, 15), (8192, 40), (16384, 40))
_THREADS = ((1, 75), (2, 15), (3, 4), (4, 6))
_TEXT_BRIDGES = (
    ("KoboldCppEmbedWorker:2:https://github.com/LostRuins/koboldcpp", 45),
    ("AI Horde Worker~aphrodite~oai:24:https://github.com/Haidra-Org/AI-Horde-Worker", 25),
    ("TabbyAPI:1:https://github.com/theroyallab/tabbyAPI", 10),
    ("text-generation-webui:1:unknown", 20),
)
_IMAGE_SIZES = ((512, 40), (768, 25), (832, 5), (1024, 30))
_IMAGE_STEPS = ((20, 25), (25, 25), (30, 35), (40, 10), (50, 5))
_MAX_PIXELS = ((512 * 512, 10), (768 * 768, 20), (1024 * 1024, 40), (1536 * 1536, 30))
_REGEN_MAJOR = ((4, 5), (7, 10), (8, 25), (9, 60))


@dataclass(frozen=True)
class Scenario:
    """One named simulated situation. Every field has a default; see :data:`SCENARIOS`.

    ``setup(sim, ctx)`` runs once after the population is drawn; ``ctx`` is a
    :class:`Population` that draws more workers and requests the same way.
    """

    name: str
    description: str
    text_workers: int = 40
    image_workers: int = 0
    text_load: float = 0.85  # arrival rate / true capacity of the gentype (Population.capacity)
    image_load: float = 0.85
    text_models: int = 12  # distinct models in use per gentype
    image_models: int = 10
    zipf: float = 1.1
    any_model_share: float = 0.08  # requests naming no model
    chat_share: float = 0.3  # text requests that are chat
    chat_worker_modes: tuple[float, float, float] = (0.45, 0.4, 0.15)  # none, opt_in, only
    text_speed: tuple[float, float] = (14.0, 0.55)  # median tokens/s, log sigma
    image_speed: tuple[float, float] = (1.3e6, 0.5)
    unsampled_share: float = 0.05  # workers that join with no speed samples
    no_slow_share: float = 0.15  # requests with slow_workers false
    target_share: float = 0.02
    blacklist_share: float = 0.3
    exclude_share: float = 0.02
    cancel_share: float = 0.08  # requests whose user gives up after a while
    priority_share: float = 0.3
    join_per_min: float = 0.3
    leave_per_min: float = 0.3
    model_change_per_min: float = 0.2
    image_options: float = 1.0  # scale of the image option shares
    setup: Callable[[Simulation, "Population"], None] | None = None
    # Kudos priorities, early stops, bursty arrivals... (vecsched.simulate.realism); None: the plain model.
    realism: Realism | None = Realism()


@lru_cache(maxsize=1)
def _reference_models() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Text models with a known size, image models, and inpainting image models (sorted)."""
    text, image = model_table("text"), model_table("image")
    text_names = tuple(sorted(text.loc[text["parameters"].fillna(0) > 0, "name"]))
    paint = image["inpainting"].astype(str) == "True"
    return text_names, tuple(sorted(image.loc[~paint, "name"])), tuple(sorted(image.loc[paint, "name"]))


def _choice(rng: random.Random, table: tuple[tuple[Any, float], ...]) -> Any:
    values, weights = zip(*table)
    return rng.choices(values, weights)[0]


@dataclass
class Population:
    """Draws workers and requests for one scenario, from the simulation's generator."""

    sim: Simulation
    scenario: Scenario
    text_models: list[str] = field(default_factory=list)
    image_models: list[str] = field(default_factory=list)
    paint_models: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    user_priority: dict[str, int] = field(default_factory=dict)
    rates: dict[int, float] = field(default_factory=dict)  # mean arrivals per second, per gentype (build)
    ids: str | None = None  # the namespace of UUID ids (see build); None: short serial ids
    reserved_models: set[str] = field(default_factory=set)  # fed by a scenario's own stream only
    _n: int = 0

    def __post_init__(self) -> None:
        rng = self.sim.rng
        text_all, image_all, paint_all = _reference_models()
        sc = self.scenario
        self.text_models = rng.sample(text_all, sc.text_models)
        self.image_models = rng.sample(image_all, max(sc.image_models - 1, 1))
        self.paint_models = rng.sample(paint_all, 2)
        self.image_models.insert(1, self.paint_models[0])
        self.users = [f"u{k:04d}" for k in range(400)]
        for u in self.users:
            if rng.random() < sc.priority_share:
                self.user_priority[u] = int(rng.lognormvariate(math.log(300), 1.2))

    # -- helpers --------------------------------------------------------------------
    def _next_id(self, prefix: str) -> str:
        self._n += 1
        serial = f"{prefix}{self._n:06d}"
        return serial if self.ids is None else str(uuid.uuid5(_ID_NAMESPACE, f"{self.ids}/{serial}"))

    def popular(self, gentype: int, k: int = 1) -> list[str]:
        """``k`` distinct models by popularity (Zipf over the scenario's models)."""
        names = self.text_models if gentype == TEXT else self.image_models
        weights = [1.0 / (i + 1) ** self.scenario.zipf for i in range(len(names))]
        out: list[str] = []
        while len(out) < min(k, len(names)):
            m = self.sim.rng.choices(names, weights)[0]
            if m not in out:
                out.append(m)
        return out

    def user(self) -> str:
        weights = [1.0 / (i + 1) ** 0.8 for i in range(len(self.users))]
        return self.sim.rng.choices(self.users, weights)[0]

    # -- workers ---------------------------------------------------------------------
    def worker(self, gentype: int, **override: Any) -> SimWorker:
        """Draw one worker (not yet added)."""
        rng, sc = self.sim.rng, self.scenario
        owner = self.user() if rng.random() < 0.3 else f"o{rng.randrange(10**6):06d}"
        common = dict(
            id=self._next_id("w"),
            user_id=owner,
            gentype=gentype,
            threads=_choice(rng, _THREADS),
            owner_trusted=rng.random() < 0.7,
            maintenance=rng.random() < 0.02,
            paused=rng.random() < 0.01,
            nsfw=rng.random() < 0.85,
            priority_user_ids=(owner,),
        )
        if gentype == TEXT:
            med, sigma = sc.text_speed
            none, opt_in, _ = sc.chat_worker_modes
            u = rng.random()
            mode = CHAT_NONE if u < none else CHAT_OPT_IN if u < none + opt_in else CHAT_ONLY
            max_length = _choice(rng, _WORKER_LENGTHS)
            ctx = _choice(rng, _WORKER_CONTEXTS)
            kw = dict(
                models=tuple(self.popular(TEXT, 1 if rng.random() < 0.9 else 2)),
                true_speed=rng.lognormvariate(math.log(med), sigma),
                bridge_agent=_choice(rng, _TEXT_BRIDGES),
                max_length=max_length,
                max_context_length=ctx,
                chat_mode=mode,
            )
        else:
            med, sigma = sc.image_speed
            regen = rng.random() < 0.9
            agent = (
                f"AI Horde Worker reGen:{_choice(rng, _REGEN_MAJOR)}.1.0:https://github.com/Haidra-Org"
                if regen
                else "unknown:0:unknown"
            )
            kw = dict(
                models=tuple(self.popular(IMAGE, rng.choice((1, 2, 3, 5)))),
                threads=rng.choice((1, 1, 1, 2)),
                true_speed=rng.lognormvariate(math.log(med), sigma),
                bridge_agent=agent,
                max_pixels=_choice(rng, _MAX_PIXELS),
                allow_img2img=rng.random() < 0.85,
                allow_painting=rng.random() < 0.75,
                allow_post_processing=rng.random() < 0.85,
                allow_controlnet=rng.random() < 0.4,
                allow_sdxl_controlnet=rng.random() < 0.2,
                allow_lora=rng.random() < 0.6,
                extra_slow_worker=rng.random() < 0.03,
            )
        common.update(kw)
        common.update(override)
        w = SimWorker(**common)
        if rng.random() >= sc.unsampled_share:
            # A worker that has run before reports the mean of its recent jobs.
            w.samples = [w.true_speed * math.exp(rng.gauss(0, self.sim.noise)) for _ in range(5)]
        return w

    # -- requests --------------------------------------------------------------------
    def request(self, gentype: int, **override: Any) -> SimRequest:
        """Draw one request created now (not yet added)."""
        rng, sc, now = self.sim.rng, self.scenario, self.sim.now
        uid = self.user()
        u = rng.random()
        models: tuple[str, ...]
        if u < sc.any_model_share:
            models = ()
        elif u < 0.9:
            models = tuple(self.popular(gentype, 1))
        else:
            models = tuple(self.popular(gentype, rng.choice((2, 3))))
        common: dict[str, Any] = dict(
            id=self._next_id("r"),
            user_id=uid,
            gentype=gentype,
            created=now,
            models=models,
            base_priority=self.user_priority.get(uid, 0),
            slow_workers=rng.random() >= sc.no_slow_share,
            trusted_workers=rng.random() < 0.05,
            nsfw=rng.random() < 0.25,
        )
        if gentype == TEXT:
            common.update(
                n=1 if rng.random() < 0.9 else rng.choice((2, 3)),
                max_length=_choice(rng, _TEXT_LENGTHS),
                max_context_length=_choice(rng, _TEXT_CONTEXTS),
                is_chat=rng.random() < sc.chat_share,
                validated_backends=rng.random() < 0.1,
            )
        else:
            side = _choice(rng, _IMAGE_SIZES)
            s = sc.image_options
            img2img = rng.random() < 0.1 * s
            processing = 0
            if img2img:
                processing = rng.choice((1, 1, 1, 2, 3))
                if processing in (2, 3):
                    common["models"] = (self.paint_models[0],)
            common.update(
                n=rng.choice((1, 1, 2, 4)),
                width=side,
                height=_choice(rng, _IMAGE_SIZES) if rng.random() < 0.3 else side,
                steps=_choice(rng, _IMAGE_STEPS),
                source_image=img2img,
                source_processing=processing,
                loras=rng.random() < 0.15 * s,
                tis=rng.random() < 0.04 * s,
                control_type=rng.random() < 0.03 * s,
                post_processing=1 if rng.random() < 0.12 * s else 0,
                hires_fix=rng.random() < 0.08 * s,
                tiling=rng.random() < 0.01 * s,
                transparent=rng.random() < 0.01 * s,
                extra_slow_workers=rng.random() < 0.1,
            )
        if rng.random() < sc.target_share:
            pool = [w.id for w in self.sim.workers.values() if w.online and w.gentype == gentype]
            if pool:
                common["worker_ids"] = tuple(rng.sample(pool, min(len(pool), rng.choice((1, 2, 3)))))
                common["worker_blacklist"] = rng.random() < sc.blacklist_share
        if rng.random() < sc.exclude_share:
            pool = [w.id for w in self.sim.workers.values() if w.online and w.gentype == gentype]
            if pool:
                common["excluded"] = (rng.choice(pool),)
        common.update(override)
        return SimRequest(**common)

    def capacity(self, gentype: int, samples: int = 1000, workers: list[SimWorker] | None = None,
                 **override: Any) -> float:
        """Requests per second the gentype's serving workers finish when kept busy: its true capacity.

        Each thread finishes one request per ``n`` times the seconds a job
        keeps it from popping (:meth:`Simulation.thread_seconds`: the job as
        the simulator runs it, realism's prompt time and early stops included,
        the gap before the next pop, faults), averaged over ``samples``
        requests drawn as arrivals are; summed over the threads of the online
        workers that are neither paused nor in maintenance. Draws from the
        simulation's generator and puts it back, as :meth:`mean_work` does.
        ``workers`` and ``override`` (request fields): one worker's capacity for one stream.
        """
        sim = self.sim
        if workers is None:
            workers = [w for w in sim.workers.values()
                       if w.online and w.gentype == gentype and not w.paused and not w.maintenance]
        saved = sim.rng.getstate(), self._n
        try:
            drawn = [self.request(gentype, **override) for _ in range(samples)]
            return sum(w.threads / (sum(r.n * sim.thread_seconds(w, r) for r in drawn) / samples)
                       for w in workers)
        finally:
            sim.rng.setstate(saved[0])
            self._n = saved[1]

    def arrival_rate(self, gentype: int, load: float) -> float:
        """Requests per second that make ``load`` of the gentype's :meth:`capacity`."""
        return load * self.capacity(gentype)

    def mean_work(self, gentype: int, samples: int = 400) -> float:
        """Mean output of one request (all its jobs), by drawing from a side generator."""
        saved = self.sim.rng.getstate(), self._n
        try:
            total = 0.0
            for _ in range(samples):
                r = self.request(gentype)
                total += r.n * r.output
            return total / samples
        finally:
            self.sim.rng.setstate(saved[0])
            self._n = saved[1]

    # -- processes -------------------------------------------------------------------
    def arrivals(self, gentype: int, rate: float, until: float, start: float | None = None,
                 **override: Any) -> None:
        """A Poisson stream of ``rate`` requests per second from ``start`` to ``until``."""
        if rate <= 0:
            return
        sim = self.sim

        def fire() -> None:
            if sim.now >= until:
                return
            r = self.request(gentype, **override)
            sim.add_request(r)
            if sim.rng.random() < self.scenario.cancel_share:
                sim.at(sim.now + sim.rng.uniform(20, 900), sim.cancel, r.id)
            sim.at(sim.now + sim.rng.expovariate(rate), fire)

        first = sim.now if start is None else start
        sim.at(first + sim.rng.expovariate(rate), fire)

    def churn(self, until: float) -> None:
        """Workers join, leave and change models as Poisson processes."""
        sim, sc = self.sim, self.scenario
        gentypes = [g for g, n in ((TEXT, sc.text_workers), (IMAGE, sc.image_workers)) if n]

        def process(rate_per_min: float, act: Callable[[], None]) -> None:
            if rate_per_min <= 0:
                return
            rate = rate_per_min / 60.0

            def fire() -> None:
                if sim.now >= until:
                    return
                act()
                sim.at(sim.now + sim.rng.expovariate(rate), fire)

            sim.at(sim.now + sim.rng.expovariate(rate), fire)

        def online(g: int) -> list[SimWorker]:
            return [w for w in sim.workers.values() if w.online and w.gentype == g]

        for g in gentypes:
            process(sc.join_per_min, lambda g=g: sim.add_worker(self._fresh(self.worker(g))))
            process(sc.leave_per_min, lambda g=g: (ws := online(g)) and sim.remove_worker(sim.rng.choice(ws).id))
            process(
                sc.model_change_per_min,
                lambda g=g: (ws := online(g)) and sim.change_models(
                    sim.rng.choice(ws).id, tuple(self.popular(g, 1 if g == TEXT else 2))
                ),
            )

    def _fresh(self, w: SimWorker) -> SimWorker:
        # A worker joining mid-run is new more often than not: no samples yet.
        if self.sim.rng.random() < 0.5:
            w.samples = []
        return w


def build(scenario: Scenario, seed: int, minutes: float, warmup: float = 180.0,
          tail: float = 0.0, *, start: float = EPOCH, ids: str | None = None) -> tuple[Simulation, Population]:
    """A simulation with the scenario's population and processes scheduled.

    Arrivals and churn run from ``start`` (epoch seconds) through ``warmup +
    minutes * 60 + tail`` seconds (``minutes`` may be infinite: a horde that
    never stops); nothing has happened yet (call ``sim.run_until``).

    ``ids`` names the run: worker and request ids are then UUIDs, as the horde's
    are, the same for the same ``ids`` and distinct across runs (a demo that
    restarts on its old database must not reuse the ids its forecasts were
    recorded under). Without it ids are short serials (``r000001``), as the
    scoring and its dumps have always had them.
    """
    sim = Simulation(seed, start=start)
    pop = Population(sim, scenario, ids=ids)
    if scenario.realism is not None:
        apply_realism(sim, pop, scenario.realism)
    end = sim.now + warmup + minutes * 60.0 + tail
    for g, count in ((TEXT, scenario.text_workers), (IMAGE, scenario.image_workers)):
        names = pop.text_models if g == TEXT else pop.image_models
        for k in range(count):
            # The first workers cover every model in use once, as a live horde
            # rarely queues much for a model nobody has served in a while; the
            # rest follow popularity.
            w = pop.worker(g)
            if k < len(names) and names[k] not in w.models:
                w.models = (names[k], *w.models[1:])
                w.derive()
            sim.add_worker(w)
    for g, count, load in (
        (TEXT, scenario.text_workers, scenario.text_load),
        (IMAGE, scenario.image_workers, scenario.image_load),
    ):
        if not count:
            continue
        rate = pop.arrival_rate(g, load)
        pop.rates[g] = rate
        if scenario.realism is not None:
            realistic_arrivals(pop, scenario.realism, g, rate, end)
        else:
            pop.arrivals(g, rate, end)
    if scenario.realism is not None:
        realistic_churn(pop, scenario.realism, end)
    else:
        pop.churn(end)
    if scenario.setup is not None:
        scenario.setup(sim, pop)
    return sim, pop


# -- the suite ----------------------------------------------------------------------------


def _burst(sim: Simulation, pop: Population) -> None:
    # A minute after the warm-up, the most popular model (about 30% of the
    # traffic) gets four times its usual stream for three minutes.
    model = pop.text_models[0]
    start = sim.now + 240.0
    pop.arrivals(TEXT, 3 * 0.3 * pop.rates[TEXT], start + 180.0, start=start, models=(model,))


LONE_LOAD = 0.3
"""The lone worker's own stream as a share of its capacity: mostly idle, so its users wait seconds."""


def _lone_idle(sim: Simulation, pop: Population) -> None:
    # One worker alone serves a rare model whose requests trickle in, while the
    # rest of the horde starts with ten minutes of backlog and stays overloaded:
    # the lone worker's users wait seconds, not the backlog.
    for _ in range(int(600 * pop.capacity(TEXT))):
        sim.add_request(pop.request(TEXT))
    model = "koboldcpp/lonely-7b"
    w = pop.worker(TEXT, models=(model,), threads=1, true_speed=18.0, chat_mode=CHAT_OPT_IN,
                   maintenance=False, paused=False, max_length=1024, max_context_length=16384,
                   nsfw=True, owner_trusted=True, bridge_agent=_TEXT_BRIDGES[0][0])
    sim.add_worker(w)
    # Its rate from its capacity (a fixed one request per 20 s was 112% of it under realism's job
    # lengths), and only from its own stream: the main stream draws among the other served models.
    stream = {"models": (model,), "worker_ids": (), "excluded": ()}
    pop.reserved_models.add(model)
    pop.arrivals(TEXT, LONE_LOAD * pop.capacity(TEXT, workers=[w], **stream), sim.now + 3600 * 3, **stream)


def _drought(sim: Simulation, pop: Population) -> None:
    # From the end of the warm-up, a fifth of the workers leave every two minutes.
    def leave() -> None:
        online = [w for w in sim.workers.values() if w.online]
        for w in sim.rng.sample(online, len(online) // 5):
            sim.remove_worker(w.id)

    for k in range(4):
        sim.at(sim.now + 180.0 + 120.0 * k, leave)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("steady", "steady load on both gentypes, moderate churn",
                 text_workers=40, image_workers=25),
        Scenario("burst", "a three-minute burst of 4x traffic on the most popular text model",
                 setup=_burst),
        Scenario("lone_idle", "one idle worker serves a rare model beside deep queues elsewhere",
                 text_load=1.05, any_model_share=0.0, leave_per_min=0.0, model_change_per_min=0.0,
                 setup=_lone_idle),
        Scenario("chat_heavy", "mostly chat traffic, few chat workers",
                 chat_share=0.85, chat_worker_modes=(0.75, 0.18, 0.07), text_load=0.7),
        Scenario("slow_unsampled", "many workers below the speed floor, many with no samples",
                 text_speed=(6.0, 0.6), unsampled_share=0.4, no_slow_share=0.4, join_per_min=1.0,
                 leave_per_min=1.0),
        Scenario("drought", "workers leave: a fifth of them every two minutes",
                 text_load=0.7, join_per_min=0.0, leave_per_min=0.0, setup=_drought),
        Scenario("targeted", "many requests target or block specific workers",
                 target_share=0.35, blacklist_share=0.4),
        Scenario("image_mix", "image only, with options (img2img, inpainting, loras, controlnet)",
                 text_workers=0, image_workers=35, image_options=2.5),
    )
}
"""The named scenario suite."""


def scenario(name: str, **changes: Any) -> Scenario:
    """The scenario ``name`` of :data:`SCENARIOS`, with fields changed.

    Examples
    --------
    >>> scenario("steady", text_workers=10).text_workers
    10
    """
    try:
        base = SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
    return replace(base, **changes)


# What one mechanism of the horde is worth to a forecast's error: the same scenario with it switched
# off (docs/accuracy.md, "Where the image tail comes from"). Fields of the scenario, then of its realism.
WORLDS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "as-is": ({}, {}),
    "no-kudos": ({}, {"anonymous_share": 1.0}),  # every user anonymous: one priority, no jumping ahead
    "no-churn": ({"join_per_min": 0.0, "leave_per_min": 0.0, "model_change_per_min": 0.0}, {}),
    "no-bursts": ({}, {"burst_per_hour": 0.0}),
}


def counterfactual(base: Scenario, world: str) -> Scenario:
    """``base`` in one of the :data:`WORLDS`: one mechanism switched off, everything else as it was.

    Examples
    --------
    >>> counterfactual(scenario("steady"), "no-kudos").realism.anonymous_share
    1.0
    >>> counterfactual(scenario("steady"), "no-churn").leave_per_min
    0.0
    """
    try:
        fields, realism = WORLDS[world]
    except KeyError:
        raise KeyError(f"unknown world {world!r}; known: {', '.join(WORLDS)}") from None
    if realism and base.realism is None:
        raise ValueError(f"world {world!r} changes the realism of a scenario that has none")
    changed = replace(base, **fields)
    return replace(changed, realism=replace(base.realism, **realism)) if realism else changed
