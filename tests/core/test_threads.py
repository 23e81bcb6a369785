"""Every estimate runs its BLAS products on one thread, and gives the threads back."""

from __future__ import annotations

from threadpoolctl import threadpool_info

import vecsched
from vecsched import synthetic
from vecsched.core import estimate as estimate_module
from vecsched.core.threads import one_blas_thread


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_one_blas_thread_inside_and_the_default_restored_after() -> None:
    before = _blas_threads()
    with one_blas_thread():
        assert _blas_threads() and all(n == 1 for n in _blas_threads())
    assert _blas_threads() == before


def test_estimate_computes_on_one_thread_whatever_the_size(monkeypatch) -> None:
    # The size used to decide (default threading above 10^9 workers x requests); it must not now.
    seen = []
    compute = estimate_module.compute

    def spy(snapshot, options):
        seen.append(_blas_threads())
        return compute(snapshot, options)

    monkeypatch.setattr(estimate_module, "compute", spy)
    vecsched.estimate(synthetic.horde(workers=20, requests=100, seed=1))
    assert seen and all(n == 1 for n in seen[0])
