"""Markdown tables of ``vecsched simulate all ... -o DIR`` promotion files (docs/accuracy.md).

    python benchmarks/promotion_tables.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ("adr-wait", "horde-wide", "compatible-queue-v1", "eligible-share-v1")


def _pct(v):
    return "-" if v is None else f"{100 * v:.0f}%"


def _sec(v):
    return "-" if v is None else f"{v:,.0f}"


def tables(root: Path) -> str:
    series = ["| scenario | gentype | series | pairs | expired | cancelled | "
              + " | ".join(f"{n} within / p90 err (s) / cover" for n in ORDER) + " |",
              "|" + "---|" * (6 + len(ORDER))]
    stalls = ["| scenario | gentype | predictions | stalls | "
              + " | ".join(f"{n} precision / recall / FPR" for n in ORDER[2:]) + " |",
              "|" + "---|" * (4 + 2)]
    seeds = None
    for path in sorted(root.glob("*/promotion.json")):
        doc = json.loads(path.read_text())
        seeds = doc.get("seeds")
        name = path.parent.name
        est = doc["estimators"]
        for g in ("text", "image"):
            first = est[ORDER[-1]][g]
            if first["start"]["pairs"] == 0 and first["stall"]["predictions"] == 0:
                continue
            for ph in ("start", "completion"):
                s0 = first[ph]
                cells = [name, g, ph, str(s0["pairs"]), _pct(s0["expired_share"]), _pct(s0["cancelled_share"])]
                for n in ORDER:
                    s = est[n][g][ph]
                    cells.append(f"{_pct(s['within_tolerance'])} / {_sec(s['p90_abs_error'])} / {_pct(s['p90_coverage'])}")
                series.append("| " + " | ".join(cells) + " |")
            st = first["stall"]
            cells = [name, g, str(st["predictions"]), str(st["stalls"])]
            for n in ORDER[2:]:
                s = est[n][g]["stall"]
                cells.append(f"{_pct(s['precision'])} / {_pct(s['recall'])} / {_pct(s['false_positive_rate'])}")
            stalls.append("| " + " | ".join(cells) + " |")
    return f"Seeds pooled: {seeds}\n\n" + "\n".join(series) + "\n\n" + "\n".join(stalls) + "\n"


if __name__ == "__main__":
    print(tables(Path(sys.argv[1])))
