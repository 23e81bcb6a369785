"""Two sets of replay_scoring outputs side by side, old -> new, per estimator (docs/accuracy.md).

    python benchmarks/promotion_compare.py OLD_ROOT NEW_ROOT [SEEDS ...]

Each root holds ``SEEDS/SCENARIO/promotion.json`` (pooled seeds), as
``python -m vecsched.simulate.replay_scoring ... -o ROOT/SEEDS/SCENARIO`` writes
them. Prints five Markdown tables of the start series, completion coverage and the stall signal, one
row per (seeds, scenario, gentype) present in both roots, one column per
estimator: share within tolerance, 90th percentile of |p50 error| (s), p90
coverage (start and completion), and stall precision / recall / FPR; each cell ``old -> new``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ("adr-wait", "horde-wide", "compatible-queue-v1", "eligible-share-v1", "dispatch-replay-v1",
         "dispatch-replay-v1+conformal")
NO_P90 = ("adr-wait", "horde-wide")  # give no p90 and no stall prediction


def _pct(v):
    return "-" if v is None else f"{100 * v:.0f}%"


def _sec(v):
    return "-" if v is None else f"{v:,.0f}"


METRICS = (
    ("start: within tolerance", ORDER, lambda g: _pct(g["start"]["within_tolerance"])),
    ("start: 90th percentile of |p50 error| (s)", ORDER, lambda g: _sec(g["start"]["p90_abs_error"])),
    ("start: p90 coverage", ORDER[len(NO_P90):], lambda g: _pct(g["start"]["p90_coverage"])),
    ("completion: p90 coverage", ORDER[len(NO_P90):], lambda g: _pct(g["completion"]["p90_coverage"])),
    ("stall: precision / recall / FPR", ORDER[len(NO_P90):],
     lambda g: "/".join(_pct(g["stall"][k]) for k in ("precision", "recall", "false_positive_rate"))),
)


def _rows(old: Path, new: Path, seed_sets: list[str]):
    for seeds in seed_sets:
        for path in sorted((new / seeds).glob("*/promotion.json")):
            before = old / seeds / path.parent.name / "promotion.json"
            if not before.exists():
                continue
            a, b = json.loads(before.read_text())["estimators"], json.loads(path.read_text())["estimators"]
            for g in ("text", "image"):
                if b["eligible-share-v1"][g]["start"]["pairs"] == 0:
                    continue
                yield seeds, path.parent.name, g, a, b


def tables(old: Path, new: Path, seed_sets: list[str]) -> str:
    rows = list(_rows(old, new, seed_sets))
    out = []
    for title, names, cell in METRICS:
        out += [f"{title}, old -> new:", "",
                "| seeds | scenario | gentype | pairs | stalls | " + " | ".join(names) + " |",
                "|" + "---|" * (5 + len(names))]
        for seeds, scenario, g, a, b in rows:
            ref_a, ref_b = a["eligible-share-v1"][g], b["eligible-share-v1"][g]
            cells = [seeds, scenario, g, f"{ref_a['start']['pairs']} -> {ref_b['start']['pairs']}",
                     f"{ref_a['stall']['stalls']} -> {ref_b['stall']['stalls']}"]
            cells += [f"{cell(a[n][g])} -> {cell(b[n][g])}" for n in names]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    old_root, new_root = Path(sys.argv[1]), Path(sys.argv[2])
    sets = sys.argv[3:] or sorted(p.name for p in new_root.iterdir() if p.is_dir())
    print(tables(old_root, new_root, sets))
