"""The replay's scoring in the simulator: pooled and per-seed promotion documents, and their tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.promotion_tables import tables
from vecsched.core.pairing import Pair
from vecsched.core.replay import disable
from vecsched.simulate import scenario
from vecsched.simulate.replay_scoring import CALIBRATED, NAME, documents, main, score_seeds


def test_per_seed_documents_split_the_pooled_pairs_and_tables_show_every_estimator(tmp_path: Path) -> None:
    small = scenario("steady", text_workers=5, image_workers=0)
    try:
        pooled, per_seed = score_seeds(small, 1, [1, 2])
        assert sorted(per_seed) == [1, 2] and [d["seeds"] for d in per_seed.values()] == [[1], [2]]
        for name in (NAME, CALIBRATED, "eligible-share-v1", "adr-wait"):
            for phase in ("start", "completion"):
                total = pooled["estimators"][name]["text"][phase]["pairs"]
                assert total > 0
                assert sum(d["estimators"][name]["text"][phase]["pairs"] for d in per_seed.values()) == total
        assert main(["steady", "--minutes", "0.5", "--seed", "3", "--seed", "4", "-o", str(tmp_path)]) == 0
    finally:
        disable()
    assert sorted(p.parent.name for p in tmp_path.glob("*/promotion.json")) == ["seed-3", "seed-4"]
    text = tables(tmp_path)
    assert text.startswith("Seeds: [3, 4]")
    header = text.splitlines()[2]
    assert f"{NAME} within" in header and f"{CALIBRATED} within" in header and "adr-wait within" in header
    assert sum(line.startswith("| seed-3 | text | start") for line in text.splitlines()) == 1


def test_a_series_with_late_forecasts_shows_its_late_share() -> None:
    from benchmarks.promotion_tables import _series_cell

    series = {"within_tolerance": 0.8, "p90_abs_error": 95.0, "p90_coverage": 0.9}
    assert _series_cell({**series, "late_share": 0.0}) == "80% / 95 / 90%"
    assert _series_cell(series) == "80% / 95 / 90%"
    assert _series_cell({**series, "late_share": 0.25}) == "80% / 95 / 90% / late 25%"


def _pairs(seed: int, error: float, n: int = 200) -> list[Pair]:
    """``n`` start pairs of one seed, observed up to ``error`` seconds after a 100 s p50."""
    return [Pair(NAME, "text", "start", f"{seed}:r{i}", 0.0, 100.0, 160.0, 100.0 + error * i / n, False)
            for i in range(n)]


def test_a_calibration_pool_widens_each_seeds_p90_from_other_runs_never_its_own() -> None:
    scored = _pairs(1, 10.0) + _pairs(3, 10.0)
    try:
        alone = documents(scored, [1, 3])[1][1]["estimators"][CALIBRATED]["text"]["start"]
        # Seed 1's later waits are 10 s past the p50; only a pool with a long tail (seed 2) can widen its p90.
        own_copy = documents(scored, [1, 3], pool=_pairs(1, 0.0))[1][1]["estimators"][CALIBRATED]["text"]["start"]
        pooled = documents(scored, [1, 3], pool=_pairs(2, 400.0))[1][1]["estimators"][CALIBRATED]["text"]["start"]
    finally:
        disable()
    assert own_copy == alone  # the pool's copy of the scored seed is never learned from
    assert alone["p90_coverage"] < 0.95 and pooled["p90_coverage"] == 1.0


def test_rescoring_a_dump_gives_the_runs_documents_and_refuses_another_scenarios_dump(tmp_path: Path) -> None:
    run, again, dump = tmp_path / "run", tmp_path / "again", tmp_path / "steady.pkl"
    try:
        assert main(["steady", "--minutes", "0.5", "--seed", "3", "-o", str(run), "--dump", str(dump)]) == 0
        assert main(["steady", "--rescore", str(dump), "--calibrate-with", str(dump), "-o", str(again)]) == 0
        with pytest.raises(SystemExit, match="a dump of scenario 'steady', not 'targeted'"):
            main(["targeted", "--rescore", str(dump)])
        (tmp_path / "junk.pkl").write_bytes(b"not a pickle")
        with pytest.raises(SystemExit, match="junk.pkl: not a replay_scoring dump"):
            main(["steady", "--rescore", str(tmp_path / "junk.pkl")])
    finally:
        disable()
    for name in ("promotion.json", "seed-3/promotion.json"):
        assert json.loads((again / name).read_text()) == json.loads((run / name).read_text())


def test_a_counterfactual_world_switches_off_its_one_mechanism_and_is_kept_in_the_dump(tmp_path: Path) -> None:
    import pickle

    from vecsched.simulate.scenarios import build, counterfactual

    def horde(world: str):
        sim, _ = build(counterfactual(scenario("steady"), world), 3, minutes=2.0, warmup=60.0)
        sim.run_until(sim.now + 180.0)
        return sim

    as_is, no_kudos, no_churn = horde("as-is"), horde("no-kudos"), horde("no-churn")
    assert any(r.base_priority > 0 for r in as_is.requests.values())
    assert len(no_kudos.requests) and all(r.base_priority == 0 for r in no_kudos.requests.values())
    kinds = lambda sim: {e["kind"] for e in sim.log}  # noqa: E731
    joins = lambda sim: sum(e["kind"] == "worker_join" for e in sim.log)  # noqa: E731
    # The founding workers join in both; only churn adds others, or changes a worker's models.
    assert {"worker_leave", "worker_models"} & kinds(as_is) and joins(as_is) > joins(no_churn)
    assert not {"worker_leave", "worker_models"} & kinds(no_churn)
    with pytest.raises(KeyError, match="unknown world 'no-users'"):
        counterfactual(scenario("steady"), "no-users")
    with pytest.raises(ValueError, match="has none"):
        counterfactual(scenario("steady", realism=None), "no-bursts")
    dump = tmp_path / "nokudos.pkl"
    try:
        assert main(["steady", "--minutes", "0.5", "--seed", "3", "--world", "no-bursts", "--dump", str(dump)]) == 0
    finally:
        disable()
    assert pickle.loads(dump.read_bytes())["world"] == "no-bursts"


def test_a_null_forecast_is_filled_from_other_seeds_requests_no_capacity_could_serve_never_its_own() -> None:
    from vecsched.core.calibration import NO_CAPACITY_SOURCE
    from vecsched.simulate.replay_scoring import cross_calibrated

    def unserved(seed: int, observed: float) -> list[Pair]:
        return [Pair(NO_CAPACITY_SOURCE, "text", "start", f"{seed}:u{i}", 0.0, None, None, observed, True)
                for i in range(60)]

    nulls = [Pair(NAME, "text", "start", f"1:r{i}", 0.0, None, None, 250.0, True) for i in range(3)]
    pairs = nulls + _pairs(2, 10.0) + unserved(1, 10.0) + unserved(2, 300.0)
    got = {p.request_id: p for p in cross_calibrated(pairs) if p.request_id.startswith("1:r")}
    assert [got[f"1:r{i}"].p50 for i in range(3)] == [300.0] * 3  # seed 2's, not seed 1's own 10 s
    # A pool's copy of the scored seed is not learned from either; without other seeds' outcomes, unknown.
    alone = {p.request_id: p for p in cross_calibrated(nulls + unserved(1, 10.0), pool=unserved(1, 5.0))}
    assert alone["1:r0"].p50 is None and alone["1:r0"].p90 is None
    # A late forecast whose request started before it was made is a miss, and the fill (made, in the
    # job, when a forecast is) never turns it into a hit; one made in time is filled as any other.
    late = [Pair(NAME, "text", "start", "1:miss", 0.0, None, None, 10.0, True, late=30.0),
            Pair(NAME, "text", "start", "1:made", 0.0, None, None, 250.0, True, late=30.0)]
    got = {p.request_id: p for p in cross_calibrated(late + _pairs(2, 10.0) + unserved(2, 300.0))}
    assert (got["1:miss"].p50, got["1:miss"].p90) == (None, None)
    assert got["1:made"].p50 == 300.0 + 30.0  # on the first sighting's clock
