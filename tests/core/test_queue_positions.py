"""Queue order (SPEC section 3): priority descending, then created ascending, then id ascending."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(0, 40),
    priorities=st.sampled_from(["few", "far apart", "float"]),
    times=st.sampled_from(["few", "signed zeros and infinities", "one not a number"]),
    key_bits=st.sampled_from([63, 9, 5]),
    seed=st.integers(0, 2**32 - 1),
)
def test_one_key_sort_gives_lexsorts_order(rows, priorities, times, key_bits, seed):
    # Every way through _priority_created_order (the key of priorities as they are, of their
    # ranks, and lexsort itself for keys too wide, floats and NaN) keeps lexsort's order,
    # ties in row order. A narrow KEY_BITS sends small inputs down the wide-key ways.
    from vecsched.core import arrays

    rng = np.random.default_rng(seed)
    if priorities == "few":
        priority = rng.integers(0, 3, rows)
    elif priorities == "far apart":
        priority = rng.choice([-(2**62), 0, 7, 2**62], rows)
    else:
        priority = rng.integers(0, 3, rows).astype(float)
    if times == "few":
        created = rng.integers(0, 4, rows).astype(float)
    else:
        created = rng.choice([0.0, -0.0, 2.5, -np.inf, np.inf], rows)
        if times == "one not a number" and rows:
            created[rng.integers(rows)] = np.nan
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arrays, "KEY_BITS", key_bits)
        got = arrays._priority_created_order(priority, created)
    np.testing.assert_array_equal(got, np.lexsort((created, -priority)))


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(2, 60),
    id_kind=st.sampled_from(["uuid", "shared prefix", "short", "repeated", "not ascii", "one run"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_tied_ids_order_as_python_orders_them_whichever_way_is_taken(rows, id_kind, seed):
    # Ties on (priority, created) are ordered by id, equal ids by row. Ids whose first eight
    # bytes differ within a run are ordered by those bytes (_prefix_order); ids sharing them
    # (a common prefix, repeats) and non-ASCII ids take the full comparison.
    rng = np.random.default_rng(seed)
    hexdigits = np.array(list("0123456789abcdef"))
    if id_kind in ("uuid", "one run"):
        ids = ["".join(rng.choice(hexdigits, 36)) for _ in range(rows)]
    elif id_kind == "shared prefix":
        ids = ["request-" + "".join(rng.choice(hexdigits, int(rng.integers(0, 3)))) for _ in range(rows)]
    elif id_kind == "short":
        ids = ["".join(rng.choice(hexdigits, int(rng.integers(1, 4)))) for _ in range(rows)]
    elif id_kind == "repeated":
        ids = list(rng.choice(["b", "a", "a\x00", "ab"], rows))
    else:
        ids = ["".join(rng.choice(list("aé\u00ffΩ"), 9)) for _ in range(rows)]
    ids = np.array(ids, dtype=object)
    priority = np.zeros(rows, dtype=np.int64) if id_kind == "one run" else rng.integers(0, 2, rows)
    created = np.zeros(rows) if id_kind == "one run" else rng.integers(0, 3, rows).astype(float)
    position = queue_positions(priority, created, ids)
    expected = sorted(range(rows), key=lambda k: (-priority[k], created[k], ids[k], k))
    assert position[expected].tolist() == list(range(rows))
