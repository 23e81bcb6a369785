"""One BLAS thread for every estimate.

The estimate's matrix products (model-set overlaps, sums over worker
declarations, competition's sweep, the forecasts' blocks) are many and small
next to its other work. OpenBLAS splits each over every core anyway, and
when another process holds a core (on a job machine, the status route's
server) its threads wait on each other:

- 150 x 3,000 with a core kept busy: 0.55 s with default threading, 0.39 s on
  one thread; 2,000 x 50,000: 5.6 s against 4.9 s (benchmarks/README.md,
  "BLAS threads");
- at 20,000 x 1,000,000 under load, competition's sweep 108 s against 12 s
  and the forecasts 213 s against 28 s of CPU (docs/speed.md, round four and
  "Forecasts at scale");
- the whole estimate at 20,000 x 100,000, the two taking turns in one process
  under load: 12.5 and 12.2 s by default against 9.6 and 11.0 s on one thread.

Until 2026-12-03 hordes above 10^9 workers x requests kept the default; no
measurement ever showed the second thread helping there.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def one_blas_thread() -> AbstractContextManager[Any]:
    """A context in which BLAS runs on one thread (restored on exit).

    Examples
    --------
    >>> with one_blas_thread():
    ...     pass
    """
    return _controller().limit(limits=1, user_api="blas")
