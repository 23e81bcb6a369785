"""Markdown tables of ``vecsched simulate all ... -o DIR`` promotion files (docs/accuracy.md).

    python benchmarks/promotion_tables.py DIR

One row per ``DIR/*/promotion.json`` (a scenario of ``simulate all``, or a
seed of ``python -m vecsched.simulate.replay_scoring ... -o DIR``), every
estimator the files hold side by side. A series whose forecasts were partly
made after the request's first sighting (the replay off the main cycle,
``--replay-every``) shows that share as ``late N%`` after its coverage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ("adr-wait", "horde-wide", "compatible-queue-v1", "eligible-share-v1", "dispatch-replay-v1",
         "dispatch-replay-v1+conformal")
SCORED_ONLY = 2  # the first ORDER entries forecast no stall


def _pct(v):
    return "-" if v is None else f"{100 * v:.0f}%"


def _sec(v):
    return "-" if v is None else f"{v:,.0f}"


def _series_cell(s: dict) -> str:
    """within / p90 error / coverage, and the late share where some forecasts were late."""
    cell = f"{_pct(s['within_tolerance'])} / {_sec(s['p90_abs_error'])} / {_pct(s['p90_coverage'])}"
    late = s.get("late_share")
    return cell + f" / late {_pct(late)}" if late else cell


def tables(root: Path) -> str:
    paths = sorted(root.glob("*/promotion.json"), key=lambda p: _natural(p.parent.name))
    held = set.intersection(*(set(json.loads(p.read_text())["estimators"]) for p in paths)) if paths else set()
    order = [n for n in ORDER if n in held]
    series = ["| run | gentype | series | pairs | expired | cancelled | "
              + " | ".join(f"{n} within / p90 err (s) / cover" for n in order) + " |",
              "|" + "---|" * (6 + len(order))]
    stalling = [n for n in order if n not in ORDER[:SCORED_ONLY]]
    stalls = ["| run | gentype | predictions | stalls | "
              + " | ".join(f"{n} precision / recall / FPR" for n in stalling) + " |",
              "|" + "---|" * (4 + len(stalling))]
    seeds = []
    for path in paths:
        doc = json.loads(path.read_text())
        seeds += [s for s in doc.get("seeds") or [] if s not in seeds]
        name = path.parent.name
        est = doc["estimators"]
        for g in ("text", "image"):
            first = est["eligible-share-v1" if "eligible-share-v1" in est else order[-1]][g]
            if first["start"]["pairs"] == 0 and first["stall"]["predictions"] == 0:
                continue
            for ph in ("start", "completion"):
                s0 = first[ph]
                cells = [name, g, ph, str(s0["pairs"]), _pct(s0["expired_share"]), _pct(s0["cancelled_share"])]
                for n in order:
                    cells.append(_series_cell(est[n][g][ph]))
                series.append("| " + " | ".join(cells) + " |")
            st = first["stall"]
            cells = [name, g, str(st["predictions"]), str(st["stalls"])]
            for n in stalling:
                s = est[n][g]["stall"]
                cells.append(f"{_pct(s['precision'])} / {_pct(s['recall'])} / {_pct(s['false_positive_rate'])}")
            stalls.append("| " + " | ".join(cells) + " |")
    return f"Seeds: {seeds}\n\n" + "\n".join(series) + "\n\n" + "\n".join(stalls) + "\n"


def _natural(name: str) -> tuple:
    """``seed-5`` before ``seed-11``; other names alphabetically."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail), "") if tail.isdigit() else (name, -1, name)


if __name__ == "__main__":
    print(tables(Path(sys.argv[1])))
