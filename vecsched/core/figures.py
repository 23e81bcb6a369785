"""Waits from the sums (SPEC.md section 5): the one place the wait formulas are written.

Also the one place of the ``waiting`` progress count, which the status route
computes from the database's live counts.

The batch (:mod:`vecsched.core.estimate`) and the prospective answer
(:mod:`vecsched.core.prospective`) both call these, so a request created right
after an answer is told the same ``ahead_wait`` by its first cycle.
"""

from __future__ import annotations

import numpy as np


def ahead_wait(
    work_ahead: np.ndarray, jobs_ahead: np.ndarray, threads: np.ndarray, throughput: np.ndarray
) -> np.ndarray:
    """Seconds until the competing work ahead is done: 0 with nothing ahead, NaN with no throughput.

    The eligible workers serve at most ``jobs_ahead`` jobs at once, so the rate
    is ``throughput * min(1, jobs_ahead / threads)``.

    Examples
    --------
    >>> import numpy as np
    >>> ahead_wait(np.array([0, 400, 400]), np.array([0, 2, 2]), np.array([4, 4, 4]), np.array([40.0, 40.0, 0.0]))
    array([ 0., 20., nan])
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = throughput * np.minimum(1.0, jobs_ahead / threads)
        ahead = np.where(jobs_ahead == 0, 0.0, work_ahead / rate)
    ahead[(throughput == 0) & (jobs_ahead > 0)] = np.nan
    return ahead


def wait_time(
    work_ahead: np.ndarray,
    jobs_ahead: np.ndarray,
    own_work: np.ndarray,
    own_jobs: np.ndarray,
    threads: np.ndarray,
    throughput: np.ndarray,
    in_flight: np.ndarray,
) -> np.ndarray:
    """Seconds until a request's own jobs are done: the work ahead and its own, then its jobs in flight.

    Examples
    --------
    >>> import numpy as np
    >>> wait_time(np.array([400]), np.array([2]), np.array([200]), np.array([1]), np.array([4]),
    ...           np.array([40.0]), np.array([0.0]))
    array([20.])
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = throughput * np.minimum(1.0, (jobs_ahead + own_jobs) / threads)
        wait = (work_ahead + own_work) / rate + in_flight
    wait[throughput == 0] = np.nan
    return wait


def waiting_jobs(jobs: np.ndarray, processing: np.ndarray, finished: np.ndarray) -> np.ndarray:
    """Jobs of a request neither in flight nor finished (its ``waiting`` progress count).

    Examples
    --------
    >>> import numpy as np
    >>> waiting_jobs(np.array([3, 2]), np.array([1, 1]), np.array([0, 2]))
    array([2, 0])
    """
    return np.maximum(jobs - processing - finished, 0)
