"""The floor: one pass reading every input column of a snapshot once.

No estimator can produce every request's figures without reading its input at
least once, so the time of one pass over the same arrays is the limit the
batch is measured against. Numbers, booleans and enums are reduced with one
NumPy reduction each (a read at memory speed); string columns (ids, user ids,
bridge agents, states, targeted worker ids) are hashed once, which is the
least an estimator must do with a string it compares (it reads every byte).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import numpy as np
import pandas as pd

from vecsched.snapshot.snapshot import ListColumn, Snapshot


def _touch(values: np.ndarray) -> tuple[Any, str]:
    if values.dtype == object:
        # Reads every character of every string once.
        return int(pd.util.hash_array(values, categorize=False)[:1].sum()), "strings"
    if values.dtype == bool:
        return int(np.count_nonzero(values)), "numbers"
    return values.sum(), "numbers"


def one_pass(snapshot: Snapshot) -> dict[str, float]:
    """Read every column of every table once; return seconds spent on numbers and on strings.

    Examples
    --------
    >>> from vecsched.synthetic import horde
    >>> sorted(one_pass(horde(workers=10, requests=20)))
    ['numbers', 'strings', 'total']
    """
    spent = {"numbers": 0.0, "strings": 0.0}
    tables = (snapshot.workers, snapshot.requests, snapshot.jobs, snapshot.excluded_pairs)
    start_all = perf_counter()
    for table in tables:
        for name, column in table.columns.items():
            if table is snapshot.excluded_pairs and name == "id":
                continue  # an alias of worker_id, not a column of its own
            arrays = [column.offsets, column.values] if isinstance(column, ListColumn) else [column]
            for values in arrays:
                start = perf_counter()
                _, kind = _touch(np.asarray(values))
                spent[kind] += perf_counter() - start
    spent["total"] = perf_counter() - start_all
    return spent


def input_bytes(snapshot: Snapshot) -> int:
    """Bytes of the snapshot's input arrays (object arrays: the pointers only)."""
    total = 0
    for table in (snapshot.workers, snapshot.requests, snapshot.jobs, snapshot.excluded_pairs):
        for column in table.columns.values():
            arrays = [column.offsets, column.values] if isinstance(column, ListColumn) else [column]
            total += sum(np.asarray(a).nbytes for a in arrays)
    return total
