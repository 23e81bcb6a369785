"""Cost of the forecasts stage beside the other stages (docs/forecasts.md): python benchmarks/forecasts_cost.py"""
import time, vecsched, numpy as np
from vecsched import synthetic
for w, r in ((150, 3000), (2000, 50000)):
    s = synthetic.horde(workers=w, requests=r, seed=0)
    ids = s.requests.id
    skip = ids[: int(len(ids) * 0.99)]  # a cycle where 1% of the queue is new
    def best(**kw):
        out = {}
        for k in range(2):
            e = vecsched.estimate(s, **kw)
            for st, v in e.timings.items():
                out[st] = min(out.get(st, 9e9), v)
        return out
    full, job = best(), best(forecast_skip=skip)
    rest = sum(v for k, v in full.items() if k != "forecasts")
    print(f"{w}x{r}: other stages {rest:.3f}s, forecasts all {full['forecasts']:.3f}s, forecasts for 1% new {job['forecasts']:.3f}s")
