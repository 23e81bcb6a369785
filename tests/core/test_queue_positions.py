"""Queue order (SPEC section 3): priority descending, then created ascending, then id ascending."""

from __future__ import annotations

import numpy as np
import pytest

from vecsched.core.arrays import queue_positions


@pytest.mark.parametrize("one_width", [False, True])
@pytest.mark.parametrize("ascii_only", [True, False])
def test_queue_positions_break_ties_by_id_as_python_orders_the_strings(ascii_only, one_width):
    # Ids tie on (priority, created) in runs; ASCII ids are compared as bytes, any other
    # set as text: both must give Python's order of the strings. Ids of one width (as
    # UUIDs) take the joined-bytes path, any other the conversion of each id.
    rng = np.random.default_rng(3)
    letters = list("abAZ09-") + ([] if ascii_only else ["é", "ä", "\u00ff", "Ω"])
    ids = np.array(sorted({"".join(rng.choice(letters, 5 if one_width else rng.integers(1, 6))) for _ in range(400)}),
                   dtype=object)
    rng.shuffle(ids)
    n = len(ids)
    priority = rng.integers(0, 3, n)
    created = rng.integers(0, 4, n).astype(float)
    position = queue_positions(priority, created, ids)
    expected = sorted(range(n), key=lambda k: (-priority[k], created[k], ids[k]))
    assert position[expected].tolist() == list(range(n))


def test_fixed_width_ids_of_one_width_are_the_bytes_numpy_converts():
    from vecsched.core.arrays import _fixed_width

    ids = np.array(["b-9", "a\x00z", "AZ0", "aaa"], dtype=object)
    np.testing.assert_array_equal(_fixed_width(ids), ids.astype(np.bytes_))
    assert _fixed_width(ids).dtype == np.dtype("S3")
    mixed = np.array(["ab", "c", "éa"], dtype=object)
    assert _fixed_width(mixed).dtype.kind == "U"
    np.testing.assert_array_equal(_fixed_width(np.array([12, 3], dtype=object)), np.array([12, 3], dtype=object).astype(np.bytes_))
