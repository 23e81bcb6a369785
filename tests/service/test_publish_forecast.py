"""Publishing an approved forecast (issue 13, item 4), on the machine's real Redis.

A forecast reaches clients only for an estimator whose promotion verdict is
approved, and only with ``--publish-forecast NAME``; otherwise every answer is
exactly what it was.
"""

from __future__ import annotations

import json
import logging
import time

import pytest

import vecsched
from vecsched.service.forecast_job import recorder_for
from vecsched.service.http import StatusService
from vecsched.service.http.serve import announce_publication
from vecsched.service.job import run_cycle
from vecsched.service.read import ForecastPublication, status

from tests.service.conftest import IDS, horde_document

NAME = "dispatch-replay-v1"
FORECAST = {"start_p50": 100.0, "start_p90": 160.0, "completion_p50": 300.0, "completion_p90": 420.0,
            "predicted_stall": False}


@pytest.fixture(name="horde")
def _horde(redis_store):
    """One cycle published to Redis; the replay's first-sighting forecast of ``normal`` recorded 10 s before."""
    snapshot = vecsched.load_snapshot(horde_document())
    assert run_cycle(lambda now: snapshot, redis_store, lambda: snapshot.now, interval=5.0).ok
    recorder = recorder_for(redis_store)
    # Redis expires the record by its own clock, days past the 2026-11-29 horde: keep it an hour.
    recorder.record_forecasts([(IDS["normal"], "text", time.time() + 3600.0, {NAME: FORECAST})],
                              now=snapshot.now - 10.0)
    return redis_store, recorder.backend, snapshot.now


def _verdicts(backend, now: float, hours: int, holds: bool = True, name: str = NAME) -> None:
    for h in range(hours + 1):
        backend.add_verdict(now - (hours - h) * 3600.0, {"holds": {name: holds, "eligible-share-v1": False}})


def _services(store, now: float):
    plain = StatusService(store=store, clock=lambda: now + 1.0)
    published = StatusService(store=store, clock=lambda: now + 1.0,
                              publish=ForecastPublication.for_store(NAME, store))
    return plain, published


def _answers(service: StatusService) -> dict:
    out = {}
    for key in ("normal", "behind", "fallback", "inflight", "faulted", "done"):
        out[key] = (service.horde("text_status", IDS[key]).body, service.own(IDS[key]).body)
    return out


@pytest.mark.parametrize("history", ["none", "23 hours", "not holding", "another estimator", "verdicts stopped"])
def test_an_unapproved_estimator_changes_nothing_for_clients(horde, history) -> None:
    store, backend, now = horde
    if history == "23 hours":
        _verdicts(backend, now, 23)
    elif history == "not holding":
        _verdicts(backend, now, 30, holds=False)
    elif history == "another estimator":
        _verdicts(backend, now, 30, name="eligible-share-v1")
    elif history == "verdicts stopped":
        _verdicts(backend, now - 3 * 3600.0, 30)
    plain, published = _services(store, now)
    assert not published.publish.approved(now + 1.0)
    assert _answers(published) == _answers(plain)
    assert status(IDS["normal"], store=store, now=now + 1.0, publish=published.publish) == \
        status(IDS["normal"], store=store, now=now + 1.0)


def test_an_approved_forecast_is_the_horde_wait_with_the_adr_wait_beside_it(horde) -> None:
    store, backend, now = horde
    _verdicts(backend, now, 24)
    plain, published = _services(store, now)
    assert published.publish.approved(now + 1.0)
    before, after = plain.horde("text_status", IDS["normal"]), published.horde("text_status", IDS["normal"])
    # Forecast 10 s before the cycle, read 1 s after it: 11 s of the 300 s have passed.
    assert after.body["wait_time"] == 289 != before.body["wait_time"]
    assert after.headers["X-Vecsched-Wait"] == NAME
    assert {k: v for k, v in after.body.items() if k != "wait_time"} == \
        {k: v for k, v in before.body.items() if k != "wait_time"}
    own = published.own(IDS["normal"]).body
    assert own["wait_time"] == 289
    assert own["adr_wait_time"] == plain.own(IDS["normal"]).body["wait_time"]
    assert own["forecast"]["estimator"] == NAME
    assert own["forecast"]["completion_p90"] == pytest.approx(409.0)
    assert own["forecast"]["start_p50"] == pytest.approx(89.0)
    # A request without a recorded forecast, and ended ones, answer as before.
    for key in ("behind", "faulted", "done"):
        assert published.horde("text_status", IDS[key]).body == plain.horde("text_status", IDS[key]).body
        assert published.own(IDS[key]).body == plain.own(IDS[key]).body


def test_a_forecast_counts_down_to_zero_and_approval_is_reread(horde) -> None:
    store, backend, now = horde
    publication = ForecastPublication.for_store(NAME, store, refresh=60.0)
    assert publication.forecast(IDS["normal"], now) is None
    _verdicts(backend, now, 24)
    assert publication.forecast(IDS["normal"], now + 30.0) is None  # the last look is still fresh
    got = publication.forecast(IDS["normal"], now + 400.0)
    assert got["completion_p50"] == 0.0 and got["completion_p90"] == pytest.approx(10.0)


def test_serve_says_once_at_startup_whether_the_forecast_is_published_without_ids(horde, caplog) -> None:
    store, backend, now = horde
    with caplog.at_level(logging.INFO, logger="vecsched.http"):
        assert not announce_publication(NAME, store, now=now)
        _verdicts(backend, now, 24)
        assert announce_publication(NAME, store, now=now)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "not approved" in messages[0] and "clients keep the ADR wait" in messages[0]
    assert "approved" in messages[1] and "not approved" not in messages[1]
    assert not any(rid in m for m in messages for rid in IDS.values())


def test_the_status_command_takes_the_same_option(horde, redis_prefix, capsys) -> None:
    from tests.conftest import REDIS_BASE
    from vecsched.cli import main

    store, backend, now = horde
    # The command reads the wall clock, days past the 2026-11-29 cycle: --max-age keeps it current.
    args = ["status", IDS["normal"], "--redis", REDIS_BASE, "--prefix", redis_prefix, "--max-age", "1e12"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(args + ["--publish-forecast", NAME]) == 0
    assert json.loads(capsys.readouterr().out) == plain  # no verdict yet
    _verdicts(backend, time.time(), 24)
    assert main(args + ["--publish-forecast", NAME]) == 0
    got = json.loads(capsys.readouterr().out)
    # Approved: the forecast, made days ago by the wall clock, has counted down to 0.
    assert got["wait_time"] == 0 and got["adr_wait_time"] == plain["wait_time"]
    assert got["forecast"]["estimator"] == NAME
    with pytest.raises(SystemExit):
        main(["status", IDS["normal"], "--publish-forecast", "adr-wait"])


def test_redis_keeps_every_hourly_verdict_even_when_they_say_the_same(redis_store) -> None:
    backend = recorder_for(redis_store).backend
    for h in range(3):
        backend.add_verdict(h * 3600.0, {"holds": {NAME: True}})
    assert backend.verdicts(0.0) == [(h * 3600.0, {"holds": {NAME: True}}) for h in range(3)]


@pytest.mark.parametrize("record", ["not json", '{"completion_p50": 1.0}', "[]"])
def test_an_unreadable_forecast_record_leaves_the_adr_answer(horde, record) -> None:
    store, backend, now = horde
    _verdicts(backend, now, 24)
    backend.client.hset(backend.key(IDS["normal"]), f"forecast:{NAME}", record)
    plain, published = _services(store, now)
    assert published.publish.approved(now + 1.0)
    assert published.horde("text_status", IDS["normal"]).body == plain.horde("text_status", IDS["normal"]).body
    assert published.own(IDS["normal"]).body == plain.own(IDS["normal"]).body


def test_a_request_faulted_since_the_cycle_gets_no_published_forecast_on_the_own_path(horde) -> None:
    """Its answer is the one without publication: not waiting (position 0, wait 0), no forecast."""
    store, backend, now = horde
    _verdicts(backend, now, 24)
    publication = ForecastPublication.for_store(NAME, store)
    faulted = {"waiting": 0, "processing": 0, "finished": 0, "restarted": 1, "done": False, "faulted": True}
    plain = status(IDS["normal"], store=store, now=now + 1.0, progress=faulted)
    got = status(IDS["normal"], store=store, now=now + 1.0, progress=faulted, publish=publication)
    assert got == plain and "forecast" not in got
    assert (got["queue_position"], got["wait_time"], got["is_possible"]) == (0, 0, False)


def test_a_day_without_verdicts_is_not_a_day_of_holding(horde) -> None:
    from vecsched.service.read import approved_by_verdicts

    store, backend, now = horde
    # The job judged at the start and the end of the day only: no run of holding hours in between.
    sparse = [(now - 24 * 3600.0, {"holds": {NAME: True}}), (now, {"holds": {NAME: True}})]
    assert not approved_by_verdicts(sparse, NAME, now)
    backend.add_verdict(now - 24 * 3600.0, {"holds": {NAME: True}})
    backend.add_verdict(now, {"holds": {NAME: True}})
    assert ForecastPublication.for_store(NAME, store).forecast(IDS["normal"], now + 1.0) is None
    _verdicts(backend, now, 24)  # the hours between filled in
    assert ForecastPublication.for_store(NAME, store).forecast(IDS["normal"], now + 1.0) is not None


def test_an_approval_is_withdrawn_when_the_verdicts_cannot_be_read_for_longer_than_one_is_current(horde) -> None:
    store, backend, now = horde
    _verdicts(backend, now, 24)
    publication = ForecastPublication.for_store(NAME, store, refresh=60.0)
    assert publication.approved(now)

    def down(since):
        raise ConnectionError("verdicts unreadable")

    publication.backend.verdicts = down
    assert publication.approved(now + 3600.0)  # within the age a verdict stays current
    assert not publication.approved(now + 3 * 3600.0)
    assert not publication.approved(now + 3 * 86400.0)


def test_a_late_forecast_counts_down_from_its_making_as_it_was_scored(horde) -> None:
    store, backend, now = horde
    _verdicts(backend, now, 24)
    rid, t0 = "late-one", now - 60.0
    # First seen at t0, made off the cycle 50 s later: its 300 s completion p50 runs from t0 + 50.
    recorder_for(store).record_forecasts([(rid, "text", time.time() + 3600.0, {NAME: FORECAST})], now=t0 + 50.0,
                                         first_seen=[t0])
    got = ForecastPublication.for_store(NAME, store).forecast(rid, now)
    assert got["completion_p50"] == pytest.approx(290.0) and got["start_p50"] == pytest.approx(90.0)


def test_the_stall_prediction_is_published_only_once_the_stall_signal_meets_its_bars(horde) -> None:
    from vecsched.core.pairing import Pair
    from vecsched.core.promotion import store_verdict

    store, backend, now = horde
    _verdicts(backend, now, 24)  # the four series held for a day; the stall signal was never judged
    got = ForecastPublication.for_store(NAME, store).forecast(IDS["normal"], now + 1.0)
    assert got["completion_p50"] is not None and "predicted_stall" not in got
    backend.add_verdict(now + 1.0, {"holds": {NAME: True}, "stall_holds": {NAME: True}})
    got = ForecastPublication.for_store(NAME, store).forecast(IDS["normal"], now + 2.0)
    assert got["predicted_stall"] is False
    # store_verdict judges the signal: every stall predicted, none seen (precision 0) holds nothing.
    backend.add_pairs([Pair(NAME, g, "stall", f"{g}{k}", now, None, None, 0.0, True) for g in ("text", "image")
                       for k in range(3)])
    store_verdict(backend, now=now + 3.0, window=3600.0)
    assert backend.verdicts(now + 3.0)[-1][1]["stall_holds"][NAME] is False
