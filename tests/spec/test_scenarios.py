"""Named scenarios with hand-computed figures, checked on the vectorized estimate and the reference.

Every scenario is a small readable horde; the expected numbers are worked out
in the comments from SPEC.md sections 3 to 6, so a failure names both the rule
and the arithmetic.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pandas as pd
import pytest

import vecsched
from vecsched.reference import estimate_reference

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)
NAN = math.nan
REGEN9 = "AI Horde Worker reGen:9:https://example.org"
PX = 512 * 512 * 30  # output of one default image job, pixel-steps


def at(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def worker(wid: str, **kw: Any) -> dict[str, Any]:
    """An online worker (checked in 10 s ago) serving model ``m``; text at 10 tokens/s unless told."""
    row: dict[str, Any] = {"id": wid, "user_id": "owner", "gentype": "text", "last_check_in": at(10), "models": ["m"]}
    if kw.get("gentype") == "image":
        row.update(speed=1_000_000.0, bridge_agent=REGEN9, models=["AAM XL"])
    else:
        row.update(speed=10.0)
    row.update(kw)
    return row


def request(rid: str, ago: float = 60, **kw: Any) -> dict[str, Any]:
    """A waiting request for model ``m``, one job of 100 tokens, created ``ago`` seconds before now."""
    row: dict[str, Any] = {
        "id": rid,
        "user_id": "client",
        "gentype": "text",
        "created": at(ago),
        "expiry": at(-600),
        "n": 1,
        "models": ["m"],
        "max_length": 100,
    }
    if kw.get("gentype") == "image":
        row.update(models=["AAM XL"])
        del row["max_length"]
    row.update(kw)
    return row


def job(jid: str, rid: str, wid: str, ago: float, state: str = "processing") -> dict[str, Any]:
    return {"id": jid, "request_id": rid, "worker_id": wid, "started": at(ago), "state": state}


def horde(workers=(), requests=(), jobs=(), excluded=()) -> dict[str, Any]:
    return {
        "format": "vecsched.snapshot/1",
        "now": at(0),
        "workers": list(workers),
        "requests": list(requests),
        "jobs": list(jobs),
        "excluded_pairs": [list(p) for p in excluded],
    }


Figures = Callable[..., pd.DataFrame]


@pytest.fixture(params=["reference", "vectorized"])
def figures(request: pytest.FixtureRequest) -> Figures:
    """``figures(doc, eligible_image_wait=False)`` -> the estimates frame, from one implementation."""
    impl = request.param

    def run(doc: dict[str, Any], eligible_image_wait: bool = False) -> pd.DataFrame:
        snapshot = vecsched.load_snapshot(doc)
        assert not snapshot.rejected, [str(e) for e in snapshot.rejected]
        if impl == "reference":
            return estimate_reference(snapshot, eligible_image_wait=eligible_image_wait)
        from vecsched.core.estimate import estimate

        return estimate(snapshot, eligible_image_wait=eligible_image_wait).to_frame()

    run.impl = impl  # type: ignore[attr-defined]
    return run


def expect(frame: pd.DataFrame, rid: str, **want: Any) -> None:
    """Assert the named figures of request ``rid`` (floats to 1e-9 relative, NaN == NaN)."""
    assert rid in frame.index, f"{rid!r} has no estimate; estimates for {list(frame.index)}"
    row = frame.loc[rid]
    for name, value in want.items():
        got = row[name]
        if isinstance(value, float):
            if math.isnan(value):
                assert math.isnan(got), f"{rid}.{name}: expected unknown (NaN), got {got!r}"
            else:
                assert got == pytest.approx(value, rel=1e-9), f"{rid}.{name}: expected {value!r}, got {got!r}"
        elif isinstance(value, bool):
            assert bool(got) is value, f"{rid}.{name}: expected {value!r}, got {got!r}"
        else:
            assert got == value, f"{rid}.{name}: expected {value!r}, got {got!r}"


# -- section 5: the eligibility-aware text wait -----------------------------------------------


def test_idle_model_reports_a_short_wait_however_deep_other_queues_are(figures: Figures) -> None:
    backlog = [request(f"big{k:02d}", ago=600 - k, models=["busy"]) for k in range(50)]
    doc = horde(
        workers=[worker("wbusy", models=["busy"]), worker("widle", models=["idle"], speed=20.0)],
        requests=backlog + [request("mine", ago=10, models=["idle"], max_length=200)],
    )
    f = figures(doc)
    # Only widle serves "idle": nothing competes; 200 tokens at 20 tokens/s.
    expect(f, "mine", eligible_workers=1, eligible_worker_threads=1, queue_position=0,
           wait_time=10.0, ahead_wait=0.0, fallback=False, is_possible=True)
    # Horde-wide it sits behind all 50: (50*100 + 200) / (mean 15 tokens/s * min(2 threads, 51 jobs)).
    expect(f, "mine", horde_queue_position=50, horde_wait_time=5200 / 30)


@pytest.mark.parametrize("speed, wait, ahead", [(10.0, 30.0, 20.0), (40.0, 7.5, 5.0)])
def test_a_fast_worker_shortens_the_wait(figures: Figures, speed: float, wait: float, ahead: float) -> None:
    doc = horde(
        workers=[worker("w", speed=speed)],
        requests=[request("a", ago=300), request("b", ago=200), request("mine", ago=100)],
    )
    # Two 100-token jobs ahead plus 100 own, one thread: 300/speed; ahead alone 200/speed.
    expect(figures(doc), "mine", queue_position=2, wait_time=wait, ahead_wait=ahead)


def test_chat_request_does_not_compete_with_plain_request_whose_workers_take_no_chat(figures: Figures) -> None:
    doc = horde(
        workers=[worker("plain", chat_mode="none"), worker("chatty", chat_mode="only", threads=4)],
        requests=[request("chat", ago=300, is_chat=True), request("mine", ago=100)],
    )
    f = figures(doc)
    expect(f, "mine", eligible_workers=1, eligible_worker_threads=1, queue_position=0, wait_time=10.0,
           horde_queue_position=1)
    expect(f, "chat", eligible_workers=1, eligible_worker_threads=4, queue_position=0)


def test_chat_request_competes_when_an_eligible_worker_opts_in(figures: Figures) -> None:
    doc = horde(
        workers=[worker("both", chat_mode="opt_in")],
        requests=[request("chat", ago=300, is_chat=True), request("mine", ago=100)],
    )
    # 100 chat tokens ahead + 100 own on one 10 tokens/s thread.
    expect(figures(doc), "mine", queue_position=1, wait_time=20.0, ahead_wait=10.0)


def test_request_over_a_workers_max_length_is_not_taken_by_it(figures: Figures) -> None:
    doc = horde(
        workers=[worker("short", max_length=256), worker("long", max_length=1024, threads=3)],
        requests=[request("big", ago=300, max_length=512), request("small", ago=100, max_length=100)],
    )
    f = figures(doc)
    expect(f, "big", eligible_workers=1, eligible_worker_threads=3)
    # Both take "small"; "big" competes through "long" (could take 512 <= 1024).
    expect(f, "small", eligible_workers=2, eligible_worker_threads=4, queue_position=1)
    only_short = horde(
        workers=[worker("short", max_length=256)],
        requests=[request("big", ago=300, max_length=512), request("small", ago=100, max_length=100)],
    )
    f = figures(only_short)
    expect(f, "big", eligible_workers=0, fallback=True, is_possible=False)
    expect(f, "small", eligible_workers=1, queue_position=0, wait_time=10.0, horde_queue_position=1)


def test_chat_limits_apply_in_place_of_text_limits(figures: Figures) -> None:
    w = worker("w", chat_mode="opt_in", max_length=100, max_context_length=1024,
               chat_max_length=500, chat_max_context_length=4096)
    doc = horde(
        workers=[w],
        requests=[
            request("chat", ago=300, is_chat=True, max_length=400, max_context_length=2048),
            request("long", ago=200, max_length=400),
            request("fits", ago=100, max_length=80, max_context_length=1024),
        ],
    )
    f = figures(doc)
    expect(f, "chat", eligible_workers=1, queue_position=0, wait_time=40.0)
    expect(f, "long", eligible_workers=0, fallback=True)  # 400 > text max_length 100
    # "fits" competes with "chat" (400 <= chat 500), not with "long": (400 + 80) / 10.
    expect(f, "fits", eligible_workers=1, queue_position=1, wait_time=48.0, ahead_wait=40.0)


def test_chat_only_worker_neither_serves_nor_counts_against_plain_requests(figures: Figures) -> None:
    doc = horde(
        workers=[worker("only", chat_mode="only", threads=4, speed=50.0), worker("plain", chat_mode="none")],
        requests=[request("chat", ago=300, is_chat=True, max_length=500), request("mine", ago=100)],
    )
    f = figures(doc)
    expect(f, "mine", eligible_workers=1, eligible_worker_threads=1, queue_position=0, wait_time=10.0,
           ahead_wait=0.0)
    # Horde-wide the chat-only worker does count: (500 + 100) / (mean 30 * min(5, 2)).
    expect(f, "mine", horde_queue_position=1, horde_wait_time=10.0)


def test_worker_without_samples_counts_at_10_tokens_per_second(figures: Figures) -> None:
    doc = horde(workers=[worker("new", speed=None)], requests=[request("mine", max_length=150)])
    expect(figures(doc), "mine", wait_time=15.0, horde_wait_time=15.0)


@pytest.mark.parametrize(
    "threads, wait, ahead",
    [
        # T=4, J=1, n=2: S=40 scaled by min(1, 3/4) -> 30; (100+200)/30; ahead 100/(40*1/4)
        (4, 10.0, 10.0),
        # T=1: no scaling; (100+200)/10; ahead 100/10
        (1, 30.0, 10.0),
        # T=2: (J+n)/T = 3/2 -> 1; 300/20; ahead 100/(20*1/2)
        (2, 15.0, 10.0),
    ],
)
def test_thread_scaling_when_fewer_jobs_than_threads(figures: Figures, threads: int, wait: float, ahead: float) -> None:
    doc = horde(workers=[worker("w", threads=threads)], requests=[request("a", ago=300), request("mine", n=2)])
    expect(figures(doc), "mine", eligible_worker_threads=threads, queue_position=1, wait_time=wait, ahead_wait=ahead)


def test_horde_wide_fallback_when_no_thread_is_eligible(figures: Figures) -> None:
    doc = horde(
        workers=[worker("w1", speed=10.0), worker("w2", speed=30.0, threads=2)],
        requests=[request("a", ago=300, n=2), request("mine", models=["nobody"], max_length=50)],
    )
    # (2*100 + 50) / (mean 20 * min(3 threads, 3 jobs)) = 250 / 60
    expect(figures(doc), "mine", eligible_workers=0, eligible_worker_threads=0, is_possible=False,
           fallback=True, queue_position=1, horde_queue_position=1,
           wait_time=250 / 60, horde_wait_time=250 / 60, ahead_wait=NAN)


def test_no_online_worker_leaves_the_wait_unknown(figures: Figures) -> None:
    doc = horde(workers=[worker("gone", last_check_in=at(301))], requests=[request("mine")])
    expect(figures(doc), "mine", eligible_workers=0, fallback=True, wait_time=NAN, horde_wait_time=NAN,
           ahead_wait=NAN, queue_position=0)


def test_online_window_includes_300_seconds(figures: Figures) -> None:
    doc = horde(workers=[worker("edge", last_check_in=at(300))], requests=[request("mine")])
    expect(figures(doc), "mine", eligible_workers=1)


def test_eligible_workers_measured_at_speed_zero_leave_the_wait_unknown(figures: Figures) -> None:
    doc = horde(workers=[worker("stuck", speed=0.0)], requests=[request("a", ago=300), request("mine")])
    f = figures(doc)
    expect(f, "a", eligible_workers=1, wait_time=NAN, ahead_wait=0.0, horde_wait_time=NAN)
    expect(f, "mine", eligible_workers=1, wait_time=NAN, ahead_wait=NAN, fallback=False)


# -- section 3: gates ---------------------------------------------------------------------------

SMALL = "Aurore-Reveil/Koto-Small-7B-IT"  # floor 5
MID = "Austism/chronos-hermes-13b"  # floor 4
BIG = "Aeala/Enterredaas-33b"  # floor 3


def test_chat_speed_gate_uses_the_first_models_floor(figures: Figures) -> None:
    doc = horde(
        workers=[
            worker("big35", models=[BIG], speed=3.5, chat_mode="opt_in"),  # floor 3: fast
            worker("mid35", models=[MID], speed=3.5, chat_mode="opt_in"),  # floor 4: slow
            worker("mid45", models=[MID], speed=4.5, chat_mode="opt_in"),  # floor 4: fast
            worker("small45", models=[SMALL, BIG], speed=4.5, chat_mode="opt_in"),  # first model: floor 5
            worker("new", models=[SMALL], speed=None, chat_mode="opt_in"),  # assumed 10: fast
        ],
        requests=[
            request("chat", models=[], is_chat=True, slow_workers=True),
            request("gated", ago=50, models=[], slow_workers=False),
            request("ungated", ago=40, models=[], slow_workers=True),
        ],
    )
    f = figures(doc)
    expect(f, "chat", eligible_workers=3, eligible_worker_threads=3)  # big35, mid45, new
    expect(f, "gated", eligible_workers=3)
    expect(f, "ungated", eligible_workers=5)


def test_chat_speed_gate_falls_back_when_no_fast_chat_worker_is_online(figures: Figures) -> None:
    workers = [
        worker("slow", models=[SMALL], speed=2.0, chat_mode="opt_in", threads=2),
        worker("fast_offline", models=[SMALL], speed=30.0, chat_mode="opt_in", last_check_in=at(1000)),
        worker("fast_plain", models=[SMALL], speed=30.0, chat_mode="none"),
    ]
    doc = horde(workers=workers, requests=[request("chat", models=[SMALL], is_chat=True, slow_workers=False)])
    # Only "slow" passes the other gates; the gate falls back: 100 / (2*2 scaled by 1/2).
    expect(figures(doc), "chat", eligible_workers=1, eligible_worker_threads=2, fallback=False, wait_time=50.0)
    workers[1]["last_check_in"] = at(10)
    doc = horde(workers=workers, requests=[request("chat", models=[SMALL], is_chat=True, slow_workers=False)])
    expect(figures(doc), "chat", eligible_workers=1, eligible_worker_threads=1, wait_time=100 / 30)


def test_maintenance_serves_only_its_owner(figures: Figures) -> None:
    doc = horde(
        workers=[worker("fix", user_id="alice", maintenance=True)],
        requests=[request("hers", user_id="alice"), request("his", ago=30, user_id="bob")],
    )
    f = figures(doc)
    expect(f, "hers", eligible_workers=1, wait_time=10.0)
    # Horde-wide figures still count the maintenance worker: (100 + 100) / (10 * min(1, 2)).
    expect(f, "his", eligible_workers=0, fallback=True, is_possible=False, wait_time=20.0)


def test_paused_worker_is_never_eligible(figures: Figures) -> None:
    doc = horde(workers=[worker("nap", paused=True, user_id="alice")], requests=[request("hers", user_id="alice")])
    expect(figures(doc), "hers", eligible_workers=0, is_possible=False, fallback=True, horde_wait_time=10.0)


def test_nsfw_and_trusted_gates(figures: Figures) -> None:
    doc = horde(
        workers=[worker("sfw", nsfw=False), worker("trusted", owner_trusted=True)],
        requests=[
            request("lewd", nsfw=True),
            request("careful", trusted_workers=True),
            request("any"),
        ],
    )
    f = figures(doc)
    expect(f, "lewd", eligible_workers=1)
    expect(f, "careful", eligible_workers=1)
    expect(f, "any", eligible_workers=2)


@pytest.mark.parametrize(
    "targets, blacklist, eligible",
    [
        (["w1"], False, 1),
        (["ghost"], False, 0),
        (["w1", "w2"], False, 2),
        (["w1"], True, 1),
        (["ghost"], True, 2),
        (["w1", "w2"], True, 0),
        ([], True, 2),
    ],
)
def test_allowlist_and_blacklist_targeting(figures: Figures, targets: list[str], blacklist: bool, eligible: int) -> None:
    doc = horde(
        workers=[worker("w1"), worker("w2")],
        requests=[request("mine", worker_ids=targets, worker_blacklist=blacklist)],
    )
    expect(figures(doc), "mine", eligible_workers=eligible)


def test_excluded_pairs_remove_only_that_pair(figures: Figures) -> None:
    doc = horde(
        workers=[worker("w1"), worker("w2", threads=3)],
        requests=[request("mine"), request("other", ago=30)],
        excluded=[("w1", "mine"), ("ghost", "other"), ("w2", "ghost")],
    )
    f = figures(doc)
    expect(f, "mine", eligible_workers=1, eligible_worker_threads=3)
    expect(f, "other", eligible_workers=2, eligible_worker_threads=4)


def test_validated_backends_need_a_validated_bridge(figures: Figures) -> None:
    doc = horde(
        workers=[
            worker("horde", bridge_agent="AI Horde Worker:1:https://x"),
            worker("aphrodite", bridge_agent="AI Horde Worker~aphrodite~oai:2.1:https://x"),
            worker("tabby", bridge_agent="TabbyAPI"),
            worker("kobold", bridge_agent="koboldcpp:1.70:https://x"),
            worker("default"),  # unknown:0:unknown
        ],
        requests=[request("picky", validated_backends=True), request("easy", ago=30)],
    )
    f = figures(doc)
    expect(f, "picky", eligible_workers=3)
    expect(f, "easy", eligible_workers=5)


def test_models_overlap_or_request_names_none(figures: Figures) -> None:
    doc = horde(
        workers=[worker("a", models=["x", "y"]), worker("b", models=["z"]), worker("none", models=[])],
        requests=[request("xz", models=["z", "q"]), request("any", models=[]), request("q", models=["q"])],
    )
    f = figures(doc)
    expect(f, "xz", eligible_workers=1)
    expect(f, "any", eligible_workers=3)
    expect(f, "q", eligible_workers=0, fallback=True)


# -- image gates -----------------------------------------------------------------------------------


def image_worker(wid: str, **kw: Any) -> dict[str, Any]:
    return worker(wid, gentype="image", **kw)


def image_request(rid: str, **kw: Any) -> dict[str, Any]:
    return request(rid, gentype="image", **kw)


def test_image_max_pixels(figures: Figures) -> None:
    doc = horde(
        workers=[image_worker("w", max_pixels=262_144)],
        requests=[image_request("fits", width=512, height=512), image_request("over", width=576, height=512)],
    )
    f = figures(doc)
    expect(f, "fits", eligible_workers=1)
    expect(f, "over", eligible_workers=0, is_possible=False, fallback=False)


def test_image_slow_and_extra_slow_workers(figures: Figures) -> None:
    doc = horde(
        workers=[
            image_worker("slow", speed=499_999.0),
            image_worker("edge", speed=500_000.0),
            image_worker("xslow", extra_slow_worker=True),
        ],
        requests=[
            image_request("strict", slow_workers=False, extra_slow_workers=False),
            image_request("slow_ok", slow_workers=True, extra_slow_workers=False),
            image_request("all", slow_workers=True, extra_slow_workers=True),
        ],
    )
    f = figures(doc)
    expect(f, "strict", eligible_workers=1)
    expect(f, "slow_ok", eligible_workers=2)
    expect(f, "all", eligible_workers=3)


# (request fields, allow flag or None, first reGen version with the capability)
OPTIONS = {
    "source_image": ({"source_image": True}, "allow_img2img", 1),
    "img2img": ({"source_image": True, "source_processing": "img2img"}, "allow_img2img", 1),
    "post_processing": ({"post_processing": 2}, "allow_post_processing", 1),
    "controlnet": ({"control_type": True}, "allow_controlnet", 1),
    "loras": ({"loras": True}, "allow_lora", 2),
    "tis": ({"tis": True}, None, 2),
    "hires_fix": ({"hires_fix": True}, None, 1),
    "tiling": ({"tiling": True}, None, 1),
    "transparent": ({"transparent": True}, "allow_sdxl_controlnet", 8),
    "extra_source_images": ({"extra_source_images": True}, None, 5),
    "r2": ({"r2": True}, None, 1),
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_image_option_needs_allow_flag_and_bridge_capability(figures: Figures, option: str) -> None:
    fields, allow, since = OPTIONS[option]
    flags = {allow: True} if allow else {}
    workers = [
        image_worker("ok", bridge_agent=f"AI Horde Worker reGen:{since}.0.1:x", **flags),
        image_worker("old", bridge_agent=f"AI Horde Worker reGen:{since - 1}:x", **flags),
        image_worker("other_bridge", bridge_agent=f"SomeBridge:{since}:x", **flags),
    ]
    if allow:
        workers.append(image_worker("not_allowed", bridge_agent=REGEN9, **{allow: False}))
    doc = horde(workers=workers, requests=[image_request("mine", **{"r2": False, **fields})])
    expect(figures(doc), "mine", eligible_workers=1, eligible_worker_threads=1)
    plain = horde(workers=workers, requests=[image_request("mine", r2=False)])
    expect(figures(plain), "mine", eligible_workers=len(workers))


def test_painting_needs_allow_flag_capability_and_an_inpainting_model(figures: Figures) -> None:
    doc = horde(
        workers=[
            image_worker("inpaints", models=["AAM XL", "Deliberate Inpainting"]),
            image_worker("no_inpaint_model", models=["AAM XL"]),
            image_worker("not_allowed", models=["AAM XL", "Deliberate Inpainting"], allow_painting=False),
            image_worker("no_img2img", models=["AAM XL", "Deliberate Inpainting"], allow_img2img=False),
            image_worker("old_bridge", models=["AAM XL", "Deliberate Inpainting"], bridge_agent="AI Horde Worker reGen:0:x"),
        ],
        requests=[
            image_request("inpaint", source_processing="inpainting", source_image=True),
            image_request("outpaint", source_processing="outpainting", source_image=True, ago=30),
            image_request("txt2img", ago=20),
        ],
    )
    f = figures(doc)
    expect(f, "inpaint", eligible_workers=1)
    expect(f, "outpaint", eligible_workers=1)
    expect(f, "txt2img", eligible_workers=4)  # r2 by default: the version-0 bridge has none


@pytest.mark.parametrize("processing", ["img2img", "inpainting"])
def test_source_processing_without_a_source_image_is_not_img2img(figures: Figures, processing: str) -> None:
    # SPEC section 3, image rule 9: only a source image makes a request img2img.
    doc = horde(
        workers=[
            image_worker("no_img2img", models=["AAM XL", "Deliberate Inpainting"], allow_img2img=False),
            image_worker("img2img", models=["AAM XL", "Deliberate Inpainting"]),
        ],
        requests=[
            image_request("no_source", source_processing=processing, r2=False),
            image_request("with_source", source_processing=processing, source_image=True, r2=False, ago=30),
        ],
    )
    f = figures(doc)
    expect(f, "no_source", eligible_workers=2)
    expect(f, "with_source", eligible_workers=1)


def test_image_keeps_horde_wide_queue_unless_switched_on(figures: Figures) -> None:
    doc = horde(
        workers=[image_worker("sd", models=["AAM XL"], speed=None), image_worker("xl", models=["2DN"], speed=2_000_000.0, threads=3)],
        requests=[
            image_request("other", ago=300, models=["2DN"], n=2),
            image_request("mine", models=["AAM XL"], steps=20),
        ],
    )
    horde_wait = (2 * PX + 512 * 512 * 20) / (1_500_000.0 * min(4, 3))
    f = figures(doc)
    expect(f, "mine", eligible_workers=1, queue_position=1, horde_queue_position=1, wait_time=horde_wait,
           horde_wait_time=horde_wait, ahead_wait=NAN, fallback=False)
    # Eligibility-aware: "other" names a model "sd" lacks, so nothing competes.
    f = figures(doc, eligible_image_wait=True)
    expect(f, "mine", queue_position=0, wait_time=512 * 512 * 20 / 1_000_000.0, ahead_wait=0.0,
           horde_wait_time=horde_wait, fallback=False)


def test_image_fallback_only_when_eligibility_aware(figures: Figures) -> None:
    doc = horde(workers=[image_worker("w", max_pixels=0)], requests=[image_request("mine")])
    expect(figures(doc), "mine", eligible_workers=0, fallback=False, wait_time=PX / 1_000_000.0)
    expect(figures(doc, eligible_image_wait=True), "mine", fallback=True, wait_time=PX / 1_000_000.0,
           ahead_wait=NAN)


# -- in flight and progress ------------------------------------------------------------------------


def test_in_flight_part_of_the_wait(figures: Figures) -> None:
    doc = horde(
        workers=[worker("w", speed=10.0)],
        requests=[request("mine", n=1, jobs=4)],  # waiting = 4 - 2 processing - 1 finished
        jobs=[
            job("j1", "mine", "w", ago=4),  # 100/10 - 4 = 6 s left
            job("j2", "mine", "ghost", ago=1),  # unknown worker: assumed 10 -> 9 s left
            job("j3", "mine", "w", ago=60, state="finished"),
            job("j4", "mine", "w", ago=30, state="faulted"),
            job("j6", "mine", "ghost", ago=40, state="faulted"),
            job("j5", "ghost-request", "w", ago=0),
        ],
    )
    # 100 own tokens / 10 + the longest remaining in-flight time 9.
    expect(figures(doc), "mine", wait_time=19.0, horde_wait_time=19.0, ahead_wait=0.0,
           processing=2, finished=1, restarted=2, waiting=1, is_possible=True)


def test_in_flight_job_past_its_estimate_adds_nothing(figures: Figures) -> None:
    doc = horde(workers=[worker("w")], requests=[request("mine")], jobs=[job("j", "mine", "w", ago=500)])
    expect(figures(doc), "mine", wait_time=10.0, processing=1, waiting=0)


def test_in_flight_job_on_a_worker_at_speed_zero_makes_the_wait_unknown(figures: Figures) -> None:
    doc = horde(
        workers=[worker("w"), worker("stuck", speed=0.0, last_check_in=at(1000))],
        requests=[request("mine")],
        jobs=[job("j", "mine", "stuck", ago=1)],
    )
    expect(figures(doc), "mine", wait_time=NAN, horde_wait_time=NAN, ahead_wait=0.0, eligible_workers=1)


def test_is_possible_with_a_job_in_flight_and_no_eligible_worker(figures: Figures) -> None:
    doc = horde(
        workers=[worker("gone", last_check_in=at(900))],
        requests=[request("mine", n=1, jobs=2), request("stalled", ago=30, n=1, jobs=2)],
        jobs=[job("j", "mine", "gone", ago=2), job("k", "stalled", "gone", ago=2, state="finished")],
    )
    f = figures(doc)
    expect(f, "mine", eligible_workers=0, is_possible=True, processing=1, fallback=True, wait_time=NAN)
    expect(f, "stalled", eligible_workers=0, is_possible=False, processing=0, finished=1, waiting=1)


# -- section 6 and queue order ---------------------------------------------------------------------


def test_horde_wide_figures_per_gentype_and_queue_order(figures: Figures) -> None:
    doc = horde(
        workers=[
            worker("t1", speed=10.0),
            worker("t2", speed=30.0, threads=2, paused=True),  # paused still counts horde-wide
            worker("t3", speed=50.0, last_check_in=at(400)),  # offline: does not
            image_worker("i1"),
        ],
        requests=[
            request("late_vip", ago=10, extra_priority=10, max_length=50),
            request("b", ago=100),
            request("a", ago=100),  # same priority and created as "b": id order puts "a" first
            request("early", ago=200, n=2),
            image_request("img", ago=500),  # image queue: never counted for text
            request("gone", ago=1000, expiry=at(1)),  # expired: not waiting
            request("done", ago=1000, n=0),
            request("off", ago=1000, active=False),
            request("bad", ago=1000, faulted=True),
        ],
    )
    f = figures(doc)
    assert list(f.index) == ["late_vip", "b", "a", "early", "img"]
    # Order: late_vip, early, a, b. Mean speed (10+30)/2 = 20, threads 3.
    expect(f, "late_vip", horde_queue_position=0, horde_wait_time=50 / (20 * 1))
    expect(f, "early", horde_queue_position=1, horde_wait_time=(50 + 200) / (20 * 3))
    expect(f, "a", horde_queue_position=2, horde_wait_time=(250 + 100) / (20 * 3))
    expect(f, "b", horde_queue_position=3, horde_wait_time=(350 + 100) / (20 * 3))
    expect(f, "img", horde_queue_position=0, horde_wait_time=PX / 1_000_000.0)
    # Eligibility-aware: only t1 serves them (t2 paused), one thread, and every one competes.
    expect(f, "b", eligible_workers=1, queue_position=3, wait_time=450 / 10, ahead_wait=350 / 10)


def test_bridge_version_is_its_leading_integer(figures: Figures, request: pytest.FixtureRequest) -> None:
    # Decision: capabilities by "the leading integer of its version" ("9.1.0" -> 9).
    doc = horde(
        workers=[image_worker("beta", bridge_agent="AI Horde Worker reGen:5-beta:x")],
        requests=[image_request("mine", extra_source_images=True)],
    )
    expect(figures(doc), "mine", eligible_workers=1)


def test_simulator_needs_img2img_only_for_a_source_image() -> None:
    # The simulator hands out jobs by the same SPEC rule the estimates follow.
    from vecsched.simulate.engine import EPOCH, SimRequest, SimWorker, Simulation

    sim = Simulation(seed=0)
    w = SimWorker("w", "u", 1, ("AAM XL",), true_speed=1e6, allow_img2img=False,
                  bridge_agent=REGEN9)
    sim.add_worker(w)
    from vecsched.snapshot.schema import SOURCE_PROCESSING

    img2img = SOURCE_PROCESSING.index("img2img")
    alone = SimRequest("alone", "u2", 1, EPOCH, n=1, models=("AAM XL",), source_processing=img2img)
    sourced = SimRequest("sourced", "u2", 1, EPOCH, n=1, models=("AAM XL",), source_processing=img2img,
                         source_image=True)
    assert sim.eligible(w, alone)
    assert not sim.eligible(w, sourced)
