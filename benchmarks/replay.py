"""dispatch-replay-v1 beside the SPEC 3-6 estimate on one synthetic horde (docs/replay.md).

    PYTHONPATH=$PWD python benchmarks/replay.py [WORKERS] [REQUESTS] [RUNS] [IMAGE_FUTURES]

Runs :func:`vecsched.estimate` with only the replay registered, so the
``forecasts`` stage is the replay alone (eligible sets included); SPEC 3-6 is
the sum of sections 3 to 6's stages (might_stall, section 7, is printed apart:
it was counted in SPEC 3-6 here before 2026-12-03); ``cpu`` is the replay's own
CPU time (``time.process_time`` around its ``compute``: the steadier figure on
a shared machine). The first run may include numba's compile or cache load.
``IMAGE_FUTURES``: the replay's ``spread`` for image (default: the setting's
default; docs/replay.md, "Round 6").
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import vecsched
from benchmarks.report import STAGES as SPEC_STAGES
from vecsched import synthetic
from vecsched.core import forecasts as F
from vecsched.core import replay as RP


@dataclass
class CpuTimed:
    """An estimator that runs ``inner`` and keeps the process's CPU seconds of each ``compute``."""

    inner: Any
    seconds: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    def compute(self, snapshot: Any, eligibility: Any, calibration: Any) -> Any:
        start = time.process_time()
        out = self.inner.compute(snapshot, eligibility, calibration)
        self.seconds.append(time.process_time() - start)
        return out


def main(workers: int = 2000, requests: int = 50000, runs: int = 3, image_futures: int = 0) -> None:
    """Print one line per run: SPEC 3-6 seconds, replay seconds (wall, and CPU), their ratio."""
    snapshot = synthetic.horde(workers=workers, requests=requests, seed=0)
    saved = dict(F.ESTIMATORS)
    F.ESTIMATORS.clear()
    settings = RP.ReplaySettings(spread=(1, image_futures)) if image_futures else RP.ReplaySettings()
    timed = CpuTimed(RP.DispatchReplayV1(settings=settings))
    F.register(timed)
    try:
        for run in range(runs):
            t = time.perf_counter()
            est = vecsched.estimate(snapshot)
            total = time.perf_counter() - t
            spec = sum(est.timings.get(k, 0.0) for k in SPEC_STAGES)
            replay = est.timings["forecasts"]
            print(f"run {run}: SPEC 3-6 stages {spec:.2f} s, dispatch-replay-v1 {replay:.2f} s "
                  f"(cpu {timed.seconds[-1]:.2f} s, ratio {replay / spec:.2f}), "
                  f"might_stall {est.timings.get('stall', 0.0):.2f} s, total {total:.2f} s")
    finally:
        F.ESTIMATORS.clear()
        F.ESTIMATORS.update(saved)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
