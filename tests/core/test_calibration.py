"""The calibrated p90: a log score per cell, backing off coarse-wards, never below the p50."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vecsched.core import calibration as C
from vecsched.core.forecasts import provisional_p90
from vecsched.snapshot.schema import IMAGE, TEXT


def _pairs(p50: np.ndarray, observed: np.ndarray, threads: np.ndarray | None = None, *, gentype: str = "text",
           phase: str = "start") -> dict[str, np.ndarray]:
    out = {"gentype": np.full(len(p50), gentype, dtype=object), "phase": np.full(len(p50), phase, dtype=object),
           "p50": np.asarray(p50, dtype=np.float64), "observed": np.asarray(observed, dtype=np.float64)}
    if threads is not None:
        out["threads"] = np.asarray(threads)
    return out


def _multiplicative(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """p50s over every band, errors proportional to p50 + 60 s (as the replay's grow with its p50)."""
    p50 = rng.uniform(0.0, 2000.0, n)
    observed = (p50 + 60.0) * np.exp(0.4 * rng.standard_normal(n)) - 60.0
    return p50, np.maximum(observed, 0.0)


def _p90(p50: np.ndarray, calibration: dict, *, gentype: int = TEXT, phase: str = "start") -> np.ndarray:
    n = len(p50)
    return C.calibrated_p90(np.asarray(p50, dtype=np.float64), phase=phase, gentype=np.full(n, gentype),
                            calibration=calibration)


@pytest.mark.parametrize("seed", [0, 1])
def test_multiplicative_errors_are_covered_at_both_ends_of_every_p50_band(seed: int) -> None:
    # An additive score gives one margin per band: it over-covers a band's short p50s and
    # under-covers its long ones (the last band, 900 s and up, most). The log score does neither.
    rng = np.random.default_rng(seed)
    p50, observed = _multiplicative(rng, 40_000)
    calibration = {"pairs": _pairs(p50, observed), "min_pairs": 100, "level": 0.9}
    fresh, truth = _multiplicative(rng, 40_000)
    p90 = _p90(fresh, calibration)
    for low, high in ((0, 30), (30, 60), (60, 150), (200, 300), (300, 450), (750, 900), (900, 1200), (1700, 2000)):
        part = (fresh >= low) & (fresh < high)
        assert 0.86 <= np.mean(truth[part] <= p90[part]) <= 0.94, (low, high)


def test_the_score_and_its_inverse() -> None:
    p50 = np.array([0.0, 10.0, 100.0, 1000.0])
    for q in (0.0, 0.1, 1.0):
        assert C.log_score(C.bound(p50, q), p50) == pytest.approx(np.full(4, q))
    # The offset is a setting: 0 gives a purely relative score.
    assert C.bound(np.array([100.0]), math.log(1.5), offset=0.0).tolist() == pytest.approx([150.0])
    p90 = _p90(np.array([100.0]), {"pairs": _pairs(np.full(50, 100.0), np.full(50, 150.0)), "min_pairs": 10,
                                   "offset": 0.0})
    assert p90.tolist() == pytest.approx([150.0])


def test_level_is_the_conformal_rank_of_the_log_score() -> None:
    observed = 100.0 + np.arange(1.0, 100.0)  # 99 pairs at p50 100 s
    for level, rank in ((0.9, 90), (0.92, 92), (C.LEVEL, math.ceil(100 * C.LEVEL))):
        p90 = _p90(np.array([100.0]), {"pairs": _pairs(np.full(99, 100.0), observed), "min_pairs": 1,
                                       "level": level})
        assert p90.tolist() == pytest.approx([100.0 + rank]), level


def test_cells_back_off_from_p50_band_to_gentype_and_phase_to_provisional() -> None:
    # Ratios (observed + 60) / (p50 + 60): 2.0 in p50 band 60-300 s (300 pairs), 1.5 in band 0-60 s
    # (100 pairs), 1.25 in band 300-900 s (20 pairs), nothing from 900 s on.
    def at(p50: float, ratio: float, n: int) -> tuple[np.ndarray, np.ndarray]:
        return np.full(n, p50), np.full(n, (p50 + 60.0) * ratio - 60.0)

    parts = [at(100.0, 2.0, 300), at(30.0, 1.5, 100), at(500.0, 1.25, 20)]
    p50, observed = (np.concatenate(c) for c in zip(*parts))
    calibration = {"pairs": _pairs(p50, observed), "min_pairs": 100, "level": 0.5}
    ask = np.array([150.0, 10.0, 600.0, 1000.0])
    pooled = 2.0  # the gentype's 420 pairs: the median ratio
    expected = [210.0 * 2.0 - 60.0,      # its band: 300 pairs
                70.0 * 1.5 - 60.0,       # its band: 100 pairs, just enough
                660.0 * pooled - 60.0,   # band 300-900: 20 pairs, the gentype's
                1060.0 * pooled - 60.0]  # no pairs from 900 s on: the gentype's
    assert _p90(ask, calibration).tolist() == pytest.approx(expected)
    # Thread counts in the pairs change nothing: the cells are p50 bands.
    threaded = {**calibration, "pairs": {**calibration["pairs"], "threads": np.r_[np.full(300, 8), np.full(120, 2)]}}
    assert _p90(ask, threaded).tolist() == pytest.approx(expected)
    # Too few pairs for the gentype as a whole: provisional everywhere.
    assert _p90(ask, {**calibration, "min_pairs": 421}).tolist() == provisional_p90(ask).tolist()
    # No pairs for the gentype or the phase: the provisional margin.
    assert _p90(ask, calibration, gentype=IMAGE).tolist() == provisional_p90(ask).tolist()
    assert _p90(ask, calibration, phase="completion").tolist() == provisional_p90(ask).tolist()


def test_a_cell_is_used_from_min_pairs_on() -> None:
    pairs = _pairs(np.full(200, 100.0), np.full(200, 220.0))  # ratio 280 / 160
    enough = _p90(np.array([100.0]), {"pairs": pairs, "min_pairs": 200})
    short = _p90(np.array([100.0]), {"pairs": pairs, "min_pairs": 201})
    assert enough.tolist() == pytest.approx([220.0]) and short.tolist() == [160.0]
    assert C.MIN_PAIRS == 200  # the service's default (from_pairs passes no min_pairs)
    # NaN p50s or observations are no pairs: they do not count towards min_pairs.
    holed = _pairs(np.r_[np.full(199, 100.0), np.nan], np.r_[np.full(199, 220.0), 220.0])
    assert _p90(np.array([100.0]), {"pairs": holed, "min_pairs": 200}).tolist() == [160.0]


def test_a_nan_p50_keeps_a_nan_p90_and_takes_no_cell() -> None:
    pairs = _pairs(np.full(500, 10.0), np.full(500, 500.0))
    got = _p90(np.array([np.nan, 10.0]), {"pairs": pairs, "min_pairs": 10})
    assert math.isnan(got[0]) and got[1] == pytest.approx(500.0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 400), spread=st.floats(0.0, 3.0),
       bias=st.floats(-2.0, 1.0), min_pairs=st.integers(1, 300), level=st.floats(0.5, 0.99))
def test_the_p90_is_never_below_the_p50(seed: int, n: int, spread: float, bias: float, min_pairs: int,
                                        level: float) -> None:
    # Even where every observation beat its p50 (negative scores): q is clipped at 0.
    rng = np.random.default_rng(seed)
    p50 = rng.uniform(0.0, 3000.0, n)
    observed = np.maximum((p50 + 60.0) * np.exp(bias + spread * rng.standard_normal(n)) - 60.0, 0.0)
    threads = rng.integers(0, 30, n)
    ask = np.r_[rng.uniform(0.0, 3000.0, 50), 0.0, np.nan]
    got = _p90(ask, {"pairs": _pairs(p50, observed, threads), "min_pairs": min_pairs, "level": level})
    assert (got[:-1] >= ask[:-1]).all() and math.isnan(got[-1])


def test_a_late_forecast_calibrates_as_if_made_on_time():
    """A forecast made 30 s after the first sighting (its pairs moved onto the first sighting's clock by
    candidate_pairs) teaches the calibration exactly what the same forecast made on time would."""
    import json

    from vecsched.core.pairing import candidate_pairs

    rng = np.random.default_rng(5)
    on_time, late = [], []
    for k in range(300):
        p50 = float(rng.uniform(5, 600))
        started = str(1030.0 + float(rng.uniform(1, 900)))
        doc = {"start_p50": p50, "start_p90": p50 * 2, "completion_p50": None, "completion_p90": None,
               "predicted_stall": False, "gentype": "text"}
        made_at_first_sight = json.dumps({**doc, "forecasted_at": 1030.0})
        made_late = json.dumps({**doc, "forecasted_at": 1000.0, "late_s": 30.0})  # first seen at 1000
        on_time += [p for _, p in candidate_pairs(f"r{k}", {"forecast:x": made_at_first_sight, "started_at": started})]
        late += [p for _, p in candidate_pairs(f"r{k}", {"forecast:x": made_late, "started_at": started})]
    assert {p.late for p in late} == {30.0} and {p.late for p in on_time} == {0.0}
    assert np.allclose([p.p50 - 30.0 for p in late if p.phase == "start"], [p.p50 for p in on_time if p.phase == "start"])
    a, b = C.from_pairs(on_time, min_pairs=1)["pairs"], C.from_pairs(late, min_pairs=1)["pairs"]
    assert np.allclose(a["p50"], b["p50"]) and np.allclose(a["observed"], b["observed"])
