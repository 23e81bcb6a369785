"""Signatures numbered by birth: given queue positions, eligibility numbers them by their first request in
queue order; the numbering is a relabelling of the one by row order, and every figure is the same."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings

import vecsched
from vecsched import synthetic
from vecsched.core import estimate as E
from vecsched.core.arrays import take_rows
from vecsched.core.eligibility import eligibility
from vecsched.core.groups import unpack_words
from vecsched.snapshot.schema import IMAGE, TEXT
from vecsched.testing.strategies import hordes


def _both(snapshot: vecsched.Snapshot):
    """Per gentype with waiting requests: its positions, takes numbered by birth and by row order."""
    batch = E._prepare(snapshot)
    for gentype in (TEXT, IMAGE):
        mine = np.flatnonzero(batch.queue.gentype == gentype)
        if len(mine) == 0:
            continue
        rq, excluded = take_rows(batch.queue, mine), E._excluded_among(batch, mine)
        born = eligibility(batch.workers, rq, gentype, excluded, True, queue_position=batch.position[mine])
        rows = eligibility(batch.workers, rq, gentype, excluded, True)
        yield batch.position[mine], born.competition, rows.competition


def _check(snapshot: vecsched.Snapshot) -> None:
    for position, born, rows in _both(snapshot):
        n = born.n_signatures
        assert n == rows.n_signatures
        birth = np.full(n, np.iinfo(np.int64).max)
        np.minimum.at(birth, born.signature, position)
        assert (np.diff(birth) > 0).all()  # signature 0 is born first, and so on; every one has a request
        # A relabelling of the row-order numbering: appearance maps each signature to its number there.
        np.testing.assert_array_equal(born.appearance[born.signature], rows.signature)
        np.testing.assert_array_equal(np.sort(born.appearance), np.arange(n))
        np.testing.assert_array_equal(rows.appearance, np.arange(n))
        # The same takeable sets, columns permuted.
        permuted = unpack_words(rows.takeable, n)[:, born.appearance]
        np.testing.assert_array_equal(unpack_words(born.takeable, n), permuted)
        np.testing.assert_array_equal(unpack_words(born.class_rows, n),
                                      unpack_words(rows.class_rows, n)[:, born.appearance])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=hordes(max_workers=8, max_requests=16))
def test_signatures_numbered_by_birth_relabel_those_by_row_order(doc: dict[str, Any]) -> None:
    note(json.dumps(doc))
    _check(vecsched.load_snapshot(doc))


def test_signatures_of_a_synthetic_horde_are_numbered_by_birth() -> None:
    _check(synthetic.horde(workers=60, requests=3000, seed=5))


def test_the_estimate_numbers_signatures_by_birth() -> None:
    snapshot = synthetic.horde(workers=60, requests=3000, seed=6)
    est = vecsched.estimate(snapshot, eligible_image_wait=True)
    position = E._prepare(snapshot).position
    for queue in est.competition.by_gentype.values():
        birth = np.full(queue.n_signatures, np.iinfo(np.int64).max)
        np.minimum.at(birth, queue.signature, position[queue.rows])
        assert (np.diff(birth) > 0).all()


def test_queue_positions_of_another_length_are_refused() -> None:
    snapshot = synthetic.horde(workers=10, requests=50, seed=1)
    batch = E._prepare(snapshot)
    mine = np.flatnonzero(batch.queue.gentype == TEXT)
    with pytest.raises(ValueError, match="queue_position"):
        eligibility(batch.workers, take_rows(batch.queue, mine), TEXT, E._excluded_among(batch, mine), True,
                    queue_position=batch.position[mine][:-1])


@pytest.mark.parametrize("image_wait", [False, True])
def test_every_figure_is_the_same_bit_for_bit_whichever_numbering(image_wait: bool, monkeypatch) -> None:
    # Competition's sums are exact integers either way; might_stall orders its columns by row order
    # (TakeTables.appearance), so its float sums add in one order: arriving_work to the last bit.
    from vecsched.synthetic_history import with_history

    snapshot = with_history(synthetic.horde(workers=200, requests=4000, seed=2), seed=2)
    born = vecsched.estimate(snapshot, eligible_image_wait=image_wait).columns

    def by_rows(*args, queue_position=None, **kwargs):
        return eligibility(*args, **kwargs)

    monkeypatch.setattr(E, "eligibility", by_rows)
    rows = vecsched.estimate(snapshot, eligible_image_wait=image_wait).columns
    assert born["arriving_work"].any() and (born["queue_position"] > 0).any()
    for name in born:
        assert born[name].tobytes() == rows[name].tobytes(), name
