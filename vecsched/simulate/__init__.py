"""Simulated hordes: a discrete-event scheduler, named scenarios, and an accuracy harness.

>>> from vecsched.simulate import SCENARIOS
>>> "steady" in SCENARIOS
True
"""

from vecsched.simulate.accuracy import ESTIMATORS, Run, pair_outcomes, run, run_suite, score, table_markdown
from vecsched.simulate.engine import EPOCH, SimJob, SimRequest, SimWorker, Simulation
from vecsched.simulate.scenarios import SCENARIOS, Population, Scenario, build, scenario

__all__ = [
    "EPOCH",
    "ESTIMATORS",
    "SCENARIOS",
    "Population",
    "Run",
    "Scenario",
    "SimJob",
    "SimRequest",
    "SimWorker",
    "Simulation",
    "build",
    "pair_outcomes",
    "run",
    "run_suite",
    "scenario",
    "score",
    "table_markdown",
]
