"""Production-like scoring: one forecast per request at first sighting, pooled seeds, promotion.json."""

from __future__ import annotations

import json
from collections import Counter

from vecsched.cli import main
from vecsched.core.promotion import estimator_stats
from vecsched.simulate import scenario
from vecsched.simulate.accuracy import run
from vecsched.simulate.production import FirstSightings


def test_each_request_is_scored_once_from_its_first_sighting() -> None:
    sightings = FirstSightings()
    first_seen: dict[str, float] = {}

    def watch(snapshot, estimates):
        for rid in estimates.request_id.tolist():
            first_seen.setdefault(rid, float(snapshot.now))
        sightings(snapshot, estimates)

    result = run(scenario("steady", text_workers=8, image_workers=4), 2, 3, every=30, warmup=60, tail=300,
                 on_snapshot=watch)
    pairs = sightings.outcomes(result.sim)
    forecasts = [p for p in pairs if p.phase == "forecast"]
    assert Counter((p.estimator, p.request_id) for p in forecasts).most_common(1)[0][1] == 1
    assert {p.request_id for p in forecasts} == set(first_seen)
    assert all(p.at == first_seen[p.request_id] for p in forecasts)
    starts = [p for p in pairs if p.phase == "start" and p.estimator == "eligible-share-v1"]
    assert starts
    for p in starts:  # observed = the simulated first assignment minus the first sighting
        r = result.sim.requests[p.request_id]
        assert abs(p.observed - (r.started_at - first_seen[p.request_id])) < 1e-6
    stalls = [p for p in pairs if p.phase == "stall" and p.observed == 1.0]
    assert all(result.sim.requests[p.request_id].status == "expired" for p in stalls)


def test_cli_writes_promotion_json_pooled_over_seeds(tmp_path, capsys) -> None:
    out = tmp_path / "sim"
    # seed 2 named twice is one run: its pairs counted twice could alone have made a series "enough"
    assert main(["simulate", "steady", "--minutes", "1", "--seed", "1", "--seed", "2", "--seed", "2",
                 "--every", "30", "--tail", "120", "-o", str(out)]) == 0
    doc = json.loads((out / "promotion.json").read_text())
    assert doc["format"] == "vecsched.promotion/1" and doc["seeds"] == [1, 2]
    from vecsched.core.forecasts import ESTIMATORS

    assert set(doc["estimators"]) == {"adr-wait", "horde-wide", *ESTIMATORS}
    assert {"compatible-queue-v1", "eligible-share-v1"} <= set(ESTIMATORS)
    entry = doc["estimators"]["eligible-share-v1"]
    assert entry["approved"] is False and entry["text"]["start"]["enough_pairs"] is False
    assert "promotion, one forecast per request" in capsys.readouterr().out


def test_a_late_estimator_is_scored_from_the_first_sighting_at_its_own_cadence() -> None:
    """``late``/``every``: the estimator's forecasts come only from snapshots ``every`` seconds apart."""
    late_name = "eligible-share-v1"
    sightings = FirstSightings(late=(late_name,), every=60.0)
    first_seen: dict[str, float] = {}
    rows: dict[tuple[float, str], dict] = {}

    def watch(snapshot, estimates):
        now = float(snapshot.now)
        for k, rid in enumerate(estimates.request_id.tolist()):
            first_seen.setdefault(rid, now)
            rows[now, rid] = estimates.forecasts[late_name].row(k)
        sightings(snapshot, estimates)

    result = run(scenario("steady", text_workers=8, image_workers=4), 6, 3, every=30, warmup=60, tail=300,
                 on_snapshot=watch)
    times = sorted({t for t, _ in rows})
    ticks = times[::2]  # 60 s apart, snapshots every 30 s
    pairs = sightings.outcomes(result.sim)
    made = {p.request_id: p for p in pairs if p.phase == "forecast" and p.estimator == late_name}
    assert set(made) == set(first_seen)
    assert all(p.at == first_seen[rid] for rid, p in made.items())  # the true first sighting, never the making
    late_s = {rid: p.late for rid, p in made.items()}
    assert set(late_s.values()) == {0.0, 30.0}
    for rid, late in late_s.items():
        assert first_seen[rid] + late in ticks
    others = [p for p in pairs if p.phase == "forecast" and p.estimator == "compatible-queue-v1"]
    assert others and all(p.late == 0.0 for p in others)
    # A late start p50 is the tick's forecast moved onto the first sighting's clock, or a miss (None)
    # when the request had left the queue (or started) before the tick.
    checked = missed = 0
    for p in pairs:
        if p.estimator != late_name or p.phase != "start" or late_s[p.request_id] == 0.0:
            continue
        tick = first_seen[p.request_id] + late_s[p.request_id]
        row = rows.get((tick, p.request_id))
        if row is None or p.at < tick:
            assert p.p50 is None
            missed += 1
        else:
            want = row["start_p50"]
            assert p.p50 == (None if want is None else want + late_s[p.request_id])
            checked += want is not None
    assert checked and missed
    stats = estimator_stats(pairs)
    assert 0.0 < stats[late_name]["text"]["start"]["late_share"] < 1.0
    assert stats["compatible-queue-v1"]["text"]["start"]["late_share"] == 0.0
