"""One BLAS thread for small hordes' products, the default for large ones."""

from __future__ import annotations

from threadpoolctl import threadpool_info

import vecsched
from vecsched import synthetic
from vecsched.core import estimate as estimate_module
from vecsched.core.threads import ONE_THREAD_BELOW, blas_threads


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_small_hordes_run_blas_on_one_thread_and_large_ones_unchanged() -> None:
    before = _blas_threads()
    with blas_threads(workers=150, requests=3000):
        assert all(n == 1 for n in _blas_threads())
    assert _blas_threads() == before
    with blas_threads(workers=ONE_THREAD_BELOW, requests=1):
        assert _blas_threads() == before


def test_estimate_computes_under_the_cap(monkeypatch) -> None:
    seen = []
    compute = estimate_module.compute

    def spy(snapshot, options):
        seen.append(_blas_threads())
        return compute(snapshot, options)

    monkeypatch.setattr(estimate_module, "compute", spy)
    vecsched.estimate(synthetic.horde(workers=20, requests=100, seed=1))
    assert seen and all(n == 1 for n in seen[0])
