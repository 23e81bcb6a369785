"""Queue order (SPEC section 3): priority descending, then created ascending, then id ascending."""

from __future__ import annotations

import numpy as np
import pytest

from vecsched.core.arrays import queue_positions


@pytest.mark.parametrize("ascii_only", [True, False])
def test_queue_positions_break_ties_by_id_as_python_orders_the_strings(ascii_only):
    # Ids tie on (priority, created) in runs; ASCII ids are compared as bytes, any other
    # set as text: both must give Python's order of the strings.
    rng = np.random.default_rng(3)
    letters = list("abAZ09-") + ([] if ascii_only else ["é", "ä", "\u00ff", "Ω"])
    ids = np.array(sorted({"".join(rng.choice(letters, rng.integers(1, 6))) for _ in range(400)}), dtype=object)
    rng.shuffle(ids)
    n = len(ids)
    priority = rng.integers(0, 3, n)
    created = rng.integers(0, 4, n).astype(float)
    position = queue_positions(priority, created, ids)
    expected = sorted(range(n), key=lambda k: (-priority[k], created[k], ids[k]))
    assert position[expected].tolist() == list(range(n))
