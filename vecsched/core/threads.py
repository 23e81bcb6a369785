"""BLAS threads for one estimate: one thread where the matrix products are small.

The estimate's matrix products (model-set overlaps, sums over worker
declarations) are small next to its other work. OpenBLAS splits each over
every core anyway, and when another process holds a core its threads wait on
each other: on the 2-core benchmark machine with a core kept busy, the
150 x 3,000 estimate took 0.55 s with default threading and 0.39 s with one
BLAS thread, and 2,000 x 50,000 5.6 s against 4.9 s (benchmarks/README.md,
"BLAS threads"). Above :data:`ONE_THREAD_BELOW` (workers x requests) the
products grow and the default is kept.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from functools import lru_cache
from typing import Any

ONE_THREAD_BELOW = 1_000_000_000
"""Hordes with fewer workers x requests than this run their products on one BLAS thread."""


@lru_cache(maxsize=1)
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def blas_threads(workers: int, requests: int) -> AbstractContextManager[Any]:
    """A context in which BLAS runs on one thread if the horde is small, else unchanged.

    Examples
    --------
    >>> with blas_threads(workers=150, requests=3000):
    ...     pass
    """
    if workers * requests >= ONE_THREAD_BELOW:
        return nullcontext()
    return one_blas_thread()


def one_blas_thread() -> AbstractContextManager[Any]:
    """A context in which BLAS runs on one thread, whatever the horde's size.

    For loops of many small products (competition's sweep: a few rows times a
    (signatures x 3) matrix per block), which a second thread cannot speed up
    and which stall whenever another process holds a core.
    """
    return _controller().limit(limits=1, user_api="blas")
