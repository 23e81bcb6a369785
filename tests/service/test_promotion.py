"""The promotion verdict's arithmetic equals a plain reference (SPEC section 8's bars)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vecsched.service.forecasts_store import Pair
from vecsched.service.promotion import (
    held_since,
    promotion_document,
    series_stats,
    stall_stats,
)

seconds = st.floats(0, 5000, allow_nan=False)
maybe = st.one_of(st.none(), seconds)
triples = st.lists(st.tuples(maybe, maybe, seconds), max_size=60)


def plain_series(rows):
    n = len(rows)
    if n == 0:
        return {"pairs": 0, "within_tolerance": None, "p90_abs_error": None, "p90_coverage": None, "passes": False}
    errors = sorted(math.inf if p50 is None else abs(p50 - o) for p50, _, o in rows)
    within = sum(1 for p50, _, o in rows if p50 is not None and abs(p50 - o) <= max(60.0, 0.5 * o)) / n
    k = math.ceil(0.9 * n) - 1
    p90_error = errors[k] if errors[k] != math.inf else None
    if all(p90 is None for _, p90, _ in rows):
        coverage = None
    else:
        coverage = sum(1 for _, p90, o in rows if p90 is not None and o <= p90) / n
    passes = (within >= 0.8 and p90_error is not None and p90_error <= 120
              and coverage is not None and 0.85 <= coverage <= 0.95)
    return {"pairs": n, "within_tolerance": within, "p90_abs_error": p90_error, "p90_coverage": coverage,
            "passes": passes}


@settings(max_examples=400, deadline=None)
@given(rows=triples)
def test_series_equals_plain_reference(rows) -> None:
    def col(i):
        return np.array([np.nan if r[i] is None else r[i] for r in rows], dtype=float)

    got = series_stats(col(0), col(1), np.array([r[2] for r in rows], dtype=float))
    want = plain_series(rows)
    for key, value in want.items():
        if isinstance(value, float):
            assert math.isclose(got[key], value, rel_tol=1e-12, abs_tol=1e-12), key
        else:
            assert got[key] == value, (key, got[key], value)
    assert got["enough_pairs"] is (len(rows) >= 10_000)


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=60))
def test_stall_equals_plain_reference(rows) -> None:
    got = stall_stats(np.array([p for p, _ in rows], dtype=bool), np.array([o for _, o in rows], dtype=bool))
    tp = sum(1 for p, o in rows if p and o)
    fp = sum(1 for p, o in rows if p and not o)
    fn = sum(1 for p, o in rows if not p and o)
    tn = sum(1 for p, o in rows if not p and not o)
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    fpr = fp / (fp + tn) if fp + tn else None
    assert (got["predictions"], got["stalls"]) == (len(rows), tp + fn)
    assert (got["precision"], got["recall"], got["false_positive_rate"]) == (precision, recall, fpr)
    assert got["passes"] == (precision is not None and precision >= 0.6 and recall is not None and recall >= 0.8
                             and fpr is not None and fpr <= 0.1)


@settings(max_examples=300, deadline=None)
@given(hours=st.lists(st.booleans(), max_size=40), now_holds=st.booleans())
def test_held_since_is_the_unbroken_run_ending_now(hours, now_holds) -> None:
    now = 3600.0 * (len(hours) + 1)
    history = [(3600.0 * (k + 1), {"x": h}) for k, h in enumerate(hours)]
    got = held_since(history, "x", now, now_holds)
    if not now_holds:
        assert got is None
        return
    since = now
    for at, h in reversed(history):
        if not h["x"]:
            break
        since = at
    assert got == since


def test_approved_needs_every_series_passing_with_enough_pairs_for_a_day() -> None:
    # 10,000 perfect pairs per series: passes and enough; coverage 90% from p90s set so.
    pairs = []
    for g in ("text", "image"):
        for ph in ("start", "completion"):
            for k in range(10_000):
                p90 = 200.0 if k % 10 else 50.0  # 10% not covered
                pairs.append(Pair("good", g, ph, f"{g}{ph}{k}", 1000.0, 100.0, p90, 100.0, False))
    history = [(1000.0 - 3600.0 * h, {"good": True}) for h in range(1, 25)]
    doc = promotion_document(pairs, now=1000.0, window=86400.0, history=history)
    entry = doc["estimators"]["good"]
    assert entry["text"]["start"]["passes"] and entry["text"]["start"]["enough_pairs"]
    assert entry["text"]["start"]["p90_coverage"] == 0.9
    assert entry["approved"] is True
    doc = promotion_document(pairs, now=1000.0, window=86400.0, history=history[:20])
    assert doc["estimators"]["good"]["approved"] is False
    assert doc["format"] == "vecsched.promotion/1" and set(doc["window"]) == {"from", "to"}
    assert set(entry["text"]["start"]) == {"pairs", "within_tolerance", "p90_abs_error", "p90_coverage",
                                           "expired_share", "cancelled_share", "late_share", "enough_pairs", "passes"}
    assert set(entry["image"]["stall"]) == {"predictions", "stalls", "precision", "recall",
                                            "false_positive_rate", "enough", "passes"}


def test_cli_prints_the_document_and_the_table(tmp_path, capsys) -> None:
    import json
    import time

    from vecsched.cli import main
    from vecsched.service.forecasts_sql import SQLPairs

    url = f"sqlite:///{tmp_path / 'p.sqlite'}"
    now = time.time()
    SQLPairs(url).add_pairs([Pair("eligible-share-v1", "text", "start", "r1", now - 60, 10.0, 70.0, 20.0, False)])
    assert main(["promotion", "--db", url, "--json", "--window", "1h"]) == 0
    doc = json.loads(capsys.readouterr().out)
    series = doc["estimators"]["eligible-share-v1"]["text"]["start"]
    assert series["pairs"] == 1 and series["within_tolerance"] == 1.0 and series["p90_abs_error"] == 10.0
    assert main(["promotion", "--db", url]) == 0
    assert "eligible-share-v1" in capsys.readouterr().out
    assert main(["promotion", "--redis", "redis://127.0.0.1:1/0"]) == 1  # no traceback, an error line
    assert "cannot read" in capsys.readouterr().err
    # A database error is one line too, without the driver's hint and background link.
    assert main(["promotion", "--db", "postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vecsched: cannot read") and len(err.strip().splitlines()) == 1 and "sqlalche.me" not in err


def test_stall_holds_needs_passing_and_enough_for_both_gentypes() -> None:
    from vecsched.core.promotion import stall_holds

    good, thin, bad = ({"passes": True, "enough": True}, {"passes": True, "enough": False},
                       {"passes": False, "enough": True})
    assert stall_holds({"text": {"stall": good}, "image": {"stall": good}})
    assert not stall_holds({"text": {"stall": good}, "image": {"stall": thin}})
    assert not stall_holds({"text": {"stall": bad}, "image": {"stall": good}})
