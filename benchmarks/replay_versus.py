"""Before/after table of dispatch-replay-v1 from two trees of ``replay_scoring -o`` output (docs/replay.md, round 6).

    python benchmarks/replay_versus.py BEFORE_DIR AFTER_DIR [SCENARIO ...]

Each DIR holds ``SCENARIO/promotion.json`` (pooled over its seeds) as
``python -m vecsched.simulate.replay_scoring SCENARIO ... -o DIR/SCENARIO``
writes it. One row per scenario and gentype: start and completion series of
``dispatch-replay-v1+conformal`` (within tolerance, 90th-percentile |p50
error|, p90 coverage) and the stall signal (precision / recall / FPR),
before -> after.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAME = "dispatch-replay-v1+conformal"


def _series(s: dict) -> str:
    return f"{100 * s['within_tolerance']:.0f}%, {s['p90_abs_error']:.0f} s, {100 * s['p90_coverage']:.0f}%"


def _stall(s: dict) -> str:
    return f"{100 * s['precision']:.0f} / {100 * s['recall']:.0f} / {100 * s['false_positive_rate']:.0f}%"


def rows(before: Path, after: Path, scenarios: list[str]) -> list[str]:
    """Markdown rows: scenario, gentype, start, completion, stall (before -> after)."""
    out = []
    for sc in scenarios:
        b = json.loads((before / sc / "promotion.json").read_text())["estimators"][NAME]
        a = json.loads((after / sc / "promotion.json").read_text())["estimators"][NAME]
        for g in ("text", "image"):
            if not a[g]["start"]["pairs"]:
                continue
            cells = [f"{_series(b[g][ph])} -> {_series(a[g][ph])}" for ph in ("start", "completion")]
            cells.append(f"{_stall(b[g]['stall'])} -> {_stall(a[g]['stall'])}")
            out.append(f"| {sc} | {g} | " + " | ".join(cells) + " |")
    return out


def main(argv: list[str]) -> int:
    """Print the table (see the module docstring)."""
    before, after, *scenarios = argv
    scenarios = scenarios or ["steady", "image_mix", "targeted"]
    print("| scenario | gentype | start: within, p90 err, cover | completion | stall precision / recall / FPR |")
    print("|---|---|---|---|---|")
    print("\n".join(rows(Path(before), Path(after), scenarios)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
