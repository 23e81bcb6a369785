"""Production-like scoring: one forecast per request at first sighting, pooled seeds, promotion.json."""

from __future__ import annotations

import json
from collections import Counter

from vecsched.cli import main
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
    assert main(["simulate", "steady", "--minutes", "1", "--seed", "1", "--seed", "2", "--every", "30",
                 "--tail", "120", "-o", str(out)]) == 0
    doc = json.loads((out / "promotion.json").read_text())
    assert doc["format"] == "vecsched.promotion/1" and doc["seeds"] == [1, 2]
    from vecsched.core.forecasts import ESTIMATORS

    assert set(doc["estimators"]) == {"adr-wait", "horde-wide", *ESTIMATORS}
    assert {"compatible-queue-v1", "eligible-share-v1"} <= set(ESTIMATORS)
    entry = doc["estimators"]["eligible-share-v1"]
    assert entry["approved"] is False and entry["text"]["start"]["enough_pairs"] is False
    assert "promotion, one forecast per request" in capsys.readouterr().out
