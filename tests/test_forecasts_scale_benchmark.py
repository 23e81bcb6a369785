"""Smoke test of benchmarks.forecasts_scale at toy sizes: it runs both trees and their checksums agree.

No timing assertions: the machine is shared and noisy.
"""

from __future__ import annotations

import json
import os

from benchmarks.forecasts_scale import exponents, main


def test_toy_sweep_of_two_trees_agrees(capsys):
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert main([tree, tree, "--workers", "20", "--requests", "200,400", "--rounds", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["requests"] for s in out["sizes"]] == [200, 400]
    for size in out["sizes"]:
        assert size["checksum_rel_diff"] == 0.0
        assert size["before"]["cpu_s"] > 0 and size["after"]["cpu_s"] > 0
    assert set(out["cpu_exponent"]) == {"before", "after"}


def test_exponents_recover_a_power_law():
    x = [1e3, 2e3, 4e3, 8e3]
    fit = exponents(x, [3e-6 * v**1.2 for v in x])
    assert abs(fit["all"] - 1.2) < 1e-3 and abs(fit["upper_half"] - 1.2) < 1e-3
