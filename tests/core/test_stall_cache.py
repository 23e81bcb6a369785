"""Section 7's sums kept across cycles (vecsched.core.stall_cache): when they hold, and what is judged live."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import vecsched
import vecsched.core.stall as stall_module
from vecsched.core.stall import INT_COLUMNS
from vecsched.core.stall_cache import StallSums
from vecsched.reference import STALL_FIELDS, stall_one
from vecsched.synthetic import horde
from vecsched.synthetic_history import with_history

from tests.core.test_stall_windows import horde as edge_horde

FIGURES = (*INT_COLUMNS, "arriving_work", "returned_work")


def sums_of(ids, created, evaluated_at) -> StallSums:
    n = len(ids)
    return StallSums.of(ids, created=np.asarray(created, float), evaluated_at=np.asarray(evaluated_at, float),
                        counts=np.zeros((2, n), np.int64), halves=np.zeros((4, n)), incomplete=np.zeros(n, bool),
                        figures=np.zeros((4, n), np.int64))


def test_sums_hold_until_the_requests_age_passes_a_multiple_of_the_refresh() -> None:
    sums = sums_of(["a"], [1000.0], [1000.0 + 130.0])  # computed at age 130 s: in its third minute
    ids, created = np.array(["a"], dtype=object), np.array([1000.0])
    for age, holds in ((130.0, True), (179.9, True), (180.0, False), (400.0, False)):
        found, kept = sums.kept(ids, created, now=1000.0 + age, refresh=60.0)
        assert found.tolist() == [0] and kept.tolist() == [holds], age


@pytest.mark.parametrize(("why", "created", "evaluated_age", "age", "refresh"), [
    ("the window reaches 120 s", 1000.0, 90.0, 125.0, 100.0),   # same 100 s step, but now a full window
    ("another request with this id", 1001.0, 10.0, 12.0, 60.0),  # created differs from what they were for
    ("the clock went back", 1000.0, 30.0, 20.0, 60.0),
    ("refresh 0: every cycle", 1000.0, 10.0, 10.0, 0.0),
])
def test_sums_do_not_hold(why: str, created: float, evaluated_age: float, age: float, refresh: float) -> None:
    sums = sums_of(["a"], [1000.0], [1000.0 + evaluated_age])
    _, kept = sums.kept(np.array(["a"], dtype=object), np.array([created]), now=1000.0 + age, refresh=refresh)
    assert kept.tolist() == [False], why


def test_a_request_never_seen_has_no_sums() -> None:
    found, kept = sums_of(["a"], [0.0], [5.0]).kept(np.array(["b"], dtype=object), np.array([0.0]), now=6.0,
                                                    refresh=60.0)
    assert found.tolist() == [-1] and kept.tolist() == [False]


@pytest.mark.parametrize("refresh", [-1.0, float("nan"), float("inf"), True, "60"])
def test_a_refresh_that_is_not_a_number_of_seconds_is_refused(refresh) -> None:
    snap = vecsched.load_snapshot(edge_horde(0))
    with pytest.raises(ValueError, match="stall_refresh"):
        vecsched.estimate(snap, stall_refresh=refresh)


def test_sums_that_are_not_an_estimates_are_refused() -> None:
    snap = vecsched.load_snapshot(edge_horde(0))
    with pytest.raises(TypeError, match="stall_sums"):
        vecsched.estimate(snap, stall_sums={"a": 1})


@pytest.fixture(scope="module")
def history_horde():
    return with_history(horde(workers=300, requests=6000, seed=7), seed=7)


def test_the_next_cycle_computes_only_the_requests_due_and_keeps_the_rest(history_horde) -> None:
    """Five seconds on: rows due are SPEC 7 at the new instant; the others keep the earlier sums."""
    first = vecsched.estimate(history_horde)
    later = dataclasses.replace(history_horde, now=history_horde.now + 5.0)
    cached = vecsched.estimate(later, stall_sums=first.stall_sums)
    fresh = vecsched.estimate(later)
    a, b, c = first.to_frame(), cached.to_frame(), fresh.to_frame()
    sums = cached.stall_sums
    at = pd.Series(sums.evaluated_at, index=sums.ids)
    computed, held = at.index[at == later.now], at.index[at < later.now]
    assert len(computed) > 20 and len(held) > 10 * len(computed)  # about 5 s of every 60 s of age
    for name in FIGURES:
        np.testing.assert_allclose(b.loc[computed, name], c.loc[computed, name], rtol=1e-9, err_msg=name)
        np.testing.assert_array_equal(b.loc[held, name], a.loc[held, name], err_msg=name)
    # The evidence is judged at the new instant: equal to the first cycle's where threads and jobs did not move.
    same = held[(a.loc[held, "eligible_worker_threads"] == b.loc[held, "eligible_worker_threads"])
                & (a.loc[held, "processing"] == b.loc[held, "processing"])]
    assert len(same) > 0.9 * len(held)
    assert (b.loc[same, "stall_evidence"].fillna("") == a.loc[same, "stall_evidence"].fillna("")).all()
    assert (b.loc[computed, "stall_evidence"].fillna("") == c.loc[computed, "stall_evidence"].fillna("")).all()


def test_held_sums_are_judged_with_the_threads_and_jobs_of_now(monkeypatch) -> None:
    """Same instant, other threads and a job in flight: no sum is computed, and every row is the reference's."""
    raw = edge_horde(0)
    first = vecsched.estimate(vecsched.load_snapshot(raw))
    raw["workers"][0]["threads"] = 8  # T: 2 -> 9, more than either half's returns
    raw["jobs"] = [{"id": "j1", "request_id": "late", "worker_id": "w2", "started": raw["now"],
                    "state": "processing"}]
    snap = vecsched.load_snapshot(raw)
    assert snap.rejected == ()

    def no_sums(*args, **kwargs):
        raise AssertionError("sums computed although every request's held")

    monkeypatch.setattr(stall_module, "_sums", no_sums)
    got = vecsched.estimate(snap, stall_sums=first.stall_sums).to_dict()["estimates"]
    evidence = {}
    for rid in ("edge", "before", "after", "late", "now"):
        want = stall_one(snap, rid)
        for name in STALL_FIELDS:
            assert got[rid][name] == pytest.approx(want[name]), (rid, name, got[rid][name], want[name])
        evidence[rid] = got[rid]["stall_evidence"]
    assert evidence["late"] is None  # its job is in flight
    assert "insufficient_replacement" in evidence.values()


def test_the_job_hands_each_cycles_sums_to_the_next(history_horde, monkeypatch) -> None:
    from vecsched.service.job import run_cycle
    from vecsched.service.stall_refresh import StallRefresh
    from vecsched.service.store.sql import SQLStore

    computed: list[int] = []
    real = stall_module._sums
    monkeypatch.setattr(stall_module, "_sums", lambda context, elig, looked: (computed.append(len(looked)),
                                                                            real(context, elig, looked))[1])
    store = SQLStore("sqlite://")
    for refresh, expect_fewer in ((60.0, True), (0.0, False)):
        kept, computed[:] = StallRefresh(refresh), []
        for step in (0.0, 5.0):
            snap = dataclasses.replace(history_horde, now=history_horde.now + step)
            report = run_cycle(lambda now, snap=snap: snap, store, lambda snap=snap: snap.now, stall=kept)
            assert report.ok, report.error
        first, second = sum(computed[:2]), sum(computed[2:])
        assert (second < first / 5) if expect_fewer else (second >= first * 0.95), (refresh, computed)


@pytest.mark.parametrize("refresh", [60.0, 0.0])
def test_the_service_keeps_sums_across_its_cycles_unless_told_not_to(history_horde, monkeypatch, refresh) -> None:
    import itertools
    import threading

    from vecsched.service.job import run_service
    from vecsched.service.store.sql import SQLStore

    computed: list[int] = []
    real = stall_module._sums
    monkeypatch.setattr(stall_module, "_sums", lambda context, elig, looked: (computed.append(len(looked)),
                                                                            real(context, elig, looked))[1])
    stop, loads = threading.Event(), []
    ticks = itertools.count()

    def load(now):
        loads.append(now)
        if len(loads) >= 2:
            stop.set()
        return dataclasses.replace(history_horde, now=now)

    run_service(load, SQLStore("sqlite://"), interval=0.05, clock=lambda: history_horde.now + 5.0 * next(ticks),
                stop=stop, install_signals=False, stall_refresh=refresh)
    assert len(computed) >= 4  # two gentypes, two cycles
    first, second = sum(computed[:2]), sum(computed[2:4])
    assert (second < first / 5) if refresh else (second >= first * 0.95), computed


def test_a_cycle_of_an_empty_queue_leaves_the_next_cycles_computable() -> None:
    """A queue that drained handed on empty sums; indexing them failed every later cycle until a restart."""
    from vecsched.service.stall_refresh import StallRefresh

    estimate = StallRefresh(60.0).wrap(vecsched.estimate)
    empty = estimate(horde(workers=0, requests=0, seed=1))
    assert len(empty.stall_sums) == 0
    back = horde(workers=20, requests=200, seed=1)
    got = estimate(back).to_frame()
    want = vecsched.estimate(back).to_frame()
    pd.testing.assert_frame_equal(got, want)
    assert StallSums.empty().kept(np.array(["r1"], dtype=object), np.array([0.0]), now=1.0, refresh=60.0)[1].tolist() == [False]
