"""The replay's scoring in the simulator: pooled and per-seed promotion documents, and their tables."""

from __future__ import annotations

from pathlib import Path

from benchmarks.promotion_tables import tables
from vecsched.core.replay import disable
from vecsched.simulate import scenario
from vecsched.simulate.replay_scoring import CALIBRATED, NAME, main, score_seeds


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
