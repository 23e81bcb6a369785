"""might_stall (SPEC section 7): the vectorized pass equals the scalar reference on drawn hordes with histories.

The generator must reach every evidence value; the counts over the examples
are asserted after the run. More examples:
``VECSCHED_EQUIVALENCE_EXAMPLES=5000 python -m pytest tests/spec/test_stall_equivalence.py``.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter

from pathlib import Path

from hypothesis import HealthCheck, example, given, note, settings

import vecsched
from vecsched.core.stall import EVIDENCE
from vecsched.reference import STALL_FIELDS, stall_reference
from vecsched.testing.strategies import stall_hordes

EXAMPLES = max(500, int(os.environ.get("VECSCHED_EQUIVALENCE_EXAMPLES", "500")))
TIE_BREAK = {"preceding_arrivals_not_outpacing_drain", "arrival_outpaces_drain"}
# Hordes the generator drew (found with hypothesis.find) that reach the two rarest evidence values. The
# derandomized draw reaches them alone, but not in every run of the whole suite (CI once drew no
# preceding_arrivals_not_outpacing_drain in 500 examples), so they also run as explicit examples.
REACH_EXAMPLES = json.loads((Path(__file__).parent / "stall_reach_examples.json").read_text())


def _tie(halves: tuple) -> bool:
    """Arriving and returned work of a half equal up to rounding: either evidence may stand."""
    arriving, returned = halves
    return any(math.isclose(a, r, rel_tol=1e-12) and a != r for a, r in zip(arriving, returned))


def _same(name: str, got, want) -> bool:
    if name in ("arriving_work", "returned_work"):
        return math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-9)
    if name == "stall_evidence":
        return (None if got is None or (isinstance(got, float) and math.isnan(got)) else str(got)) == want
    return got == want


def check(doc: dict, seen: Counter) -> None:
    snap = vecsched.load_snapshot(doc)
    got = vecsched.estimate(snap).to_dict()["estimates"]
    want = stall_reference(snap)
    assert list(got) == list(want.index)
    for rid, row in want.iterrows():
        seen[row["stall_evidence"]] += 1
        bad = [f for f in STALL_FIELDS if not _same(f, got[rid][f], row[f])]
        if bad and set(bad) <= {"might_stall", "stall_evidence"} and _tie(row["_halves"]):
            assert {got[rid]["stall_evidence"], row["stall_evidence"]} <= TIE_BREAK
            continue
        if bad:
            note(json.dumps(doc))
        assert not bad, f"request {rid!r}: " + ", ".join(
            f"{f}: vectorized {got[rid][f]!r} reference {row[f]!r}" for f in bad
        )


def test_stall_equals_reference_and_reaches_every_evidence() -> None:
    seen: Counter = Counter()

    # Derandomized: the assertion below is about the generator's reach, so it must judge the
    # same examples on every run (a random draw of 500 once missed the rarest evidence).
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(doc=stall_hordes())
    def run(doc: dict) -> None:
        check(doc, seen)

    for doc in REACH_EXAMPLES:
        run = example(doc=doc)(run)

    run()
    print("evidence counts:", dict(seen))
    missing = [e for e in EVIDENCE if seen[e] == 0]
    assert not missing, f"the generator never reached {missing}; counts {dict(seen)}"


def _tied_horde(seed: int) -> dict:
    """Requests made in a few instants (a transaction's now()), across priorities, models and workers."""
    import numpy as np

    from vecsched.snapshot.times import iso

    rng = np.random.default_rng(seed)
    now = 1_800_000_000.0
    models = ["a", "b", "c"]
    workers = [{"id": f"w{k}", "user_id": f"o{k}", "gentype": "text", "last_check_in": iso(now - 5),
                "models": list(rng.choice(models, size=rng.integers(1, 3), replace=False)),
                "speed": float(rng.uniform(5, 30)), "threads": int(rng.integers(1, 3)),
                "max_length": int(rng.choice([256, 512]))} for k in range(4)]
    instants = now - rng.choice([20.0, 140.0, 260.0, 400.0], size=3, replace=False)
    requests = [{"id": f"r{k:03d}", "user_id": f"u{k % 5}", "gentype": "text", "n": int(rng.integers(1, 3)),
                 "created": iso(float(rng.choice(instants))), "expiry": iso(now + 600),
                 "extra_priority": int(rng.choice([0, 0, 5])), "max_length": int(rng.choice([100, 400])),
                 "models": [str(rng.choice(models))]} for k in range(int(rng.integers(20, 60)))]
    return {"format": "vecsched.snapshot/1", "now": iso(now), "workers": workers, "requests": requests}


def test_requests_made_at_one_instant_equal_the_reference() -> None:
    # Ties on (priority, created) are summed per tie and signature since a review found their pairs
    # listed one by one (8,000 requests of one instant: 8.7 s and 3.2 GB): the sums must not move.
    seen: Counter = Counter()
    for seed in range(40):
        check(_tied_horde(seed), seen)
    assert seen["none_eligible"] < sum(seen.values())  # the hordes are served, so the ties are summed
