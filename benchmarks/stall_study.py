"""What the offline stall-signal studies share: seed sets, the signal's three rates, and the command line.

``replay_stall_margin``, ``replay_stall_views`` and ``replay_spread`` each score a
scenario with extra replays beside dispatch-replay-v1 (``run``, which dumps the
first forecasts) and then read dumps in a study of their own; the rates and the
``run`` arguments must mean the same in all three, so they are defined here once.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

SETS = {0: "0/11/23", 11: "0/11/23", 23: "0/11/23", 5: "5/17/29", 17: "5/17/29", 29: "5/17/29",
        41: "41/53/67", 53: "41/53/67", 67: "41/53/67", 71: "71/83/97", 83: "71/83/97", 97: "71/83/97"}


def signal(predicted: np.ndarray, stalled: np.ndarray) -> tuple[float, float, float]:
    """Precision, recall, false-positive rate.

    >>> signal(np.array([True, True, False, False]), np.array([True, False, True, False]))
    (0.5, 0.5, 0.5)
    """
    tp, fp = int((predicted & stalled).sum()), int((predicted & ~stalled).sum())
    fn, tn = int((~predicted & stalled).sum()), int((~predicted & ~stalled).sum())
    return tp / max(tp + fp, 1), tp / max(tp + fn, 1), fp / max(fp + tn, 1)


def best_recall(score: np.ndarray, stalled: np.ndarray, fpr_max: float = 0.10) -> float:
    """The best recall of ``score >= threshold`` over thresholds (between distinct scores) with FPR <= ``fpr_max``.

    >>> best_recall(np.array([5.0, 4.0, 3.0, 2.0]), np.array([True, False, True, False]), fpr_max=0.5)
    1.0
    >>> best_recall(np.array([5.0, 4.0, 3.0, 2.0]), np.array([True, False, True, False]), fpr_max=0.0)
    0.5
    >>> best_recall(np.array([5.0, 5.0, 3.0]), np.array([True, False, True]), fpr_max=0.0)
    0.0
    """
    order = np.argsort(-score, kind="stable")
    ordered = score[order]
    tp, fp = np.cumsum(stalled[order]), np.cumsum(~stalled[order])
    cut = np.r_[ordered[1:] != ordered[:-1], True]  # a threshold takes every tie or none
    ok = cut & (fp / max((~stalled).sum(), 1) <= fpr_max)
    return float(tp[ok].max() / max(stalled.sum(), 1)) if ok.any() else 0.0


def study_parser(prog: str, studies: Sequence[str]) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """``run SCENARIO [--minutes M] [--seed S ...] --dump F`` and, per name in ``studies``, ``NAME DUMP [DUMP ...]``.

    Returns the parser and each study's subparser (for options of its own).

    >>> args = study_parser("x", ["rules"])[0].parse_args(["run", "steady", "--dump", "f.pkl"])
    >>> (args.command, args.scenario, args.minutes, args.seed, args.dump)
    ('run', 'steady', 10.0, None, 'f.pkl')
    >>> study_parser("x", ["rules"])[0].parse_args(["rules", "a.pkl", "b.pkl"]).dumps
    ['a.pkl', 'b.pkl']
    """
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="score a scenario with the study's replays beside dispatch-replay-v1")
    run.add_argument("scenario")
    run.add_argument("--minutes", type=float, default=10.0)
    run.add_argument("--seed", type=int, action="append", help="repeatable; default 0")
    run.add_argument("--dump", required=True, help="pickle to write the first forecasts to")
    subparsers = {name: sub.add_parser(name, help="read dumps") for name in studies}
    for study in subparsers.values():
        study.add_argument("dumps", nargs="+")
    return parser, subparsers
