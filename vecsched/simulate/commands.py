"""``vecsched simulate``: run one scenario of the suite and score the estimates on it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def add_commands(subparsers: Any) -> None:
    """Add the ``simulate`` subcommand to the ``vecsched`` command line."""
    from vecsched.arguments import non_negative_float, positive_float, seconds
    from vecsched.simulate import SCENARIOS

    p = subparsers.add_parser(
        "simulate",
        help="simulate a horde scenario and measure estimate accuracy",
        description="Simulate SCENARIO, estimate every --every seconds, print the accuracy table. "
        "Scenarios: " + "; ".join(f"{k}: {v.description}" for k, v in SCENARIOS.items()),
    )
    p.add_argument("scenario", choices=[*SCENARIOS, "all"], help="scenario name, or 'all' for the suite")
    p.add_argument("--minutes", type=positive_float, default=10.0, help="measured window in minutes")
    p.add_argument("--seed", type=int, action="append",
                   help="random seed (the same seed gives the same run); repeat for several: "
                   "promotion.json pools them (default 0)")
    p.add_argument("--every", type=seconds, default=30.0, help="seconds between snapshots")
    p.add_argument("--tail", type=non_negative_float, default=1200.0, help="seconds simulated after the window so outcomes resolve")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="write events.jsonl, snapshots/, pairs.csv, accuracy.md (first seed) and promotion.json here")
    p.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    import pandas as pd

    from vecsched.core.promotion import format_table
    from vecsched.simulate import SCENARIOS, table_markdown
    from vecsched.simulate.production import run_seeds

    seeds = args.seed or [0]
    args.seed = seeds[0]
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    tables = {}
    for name in names:
        out = os.path.join(args.output, name) if args.output and len(names) > 1 else args.output
        snap_dir = None
        if out:
            snap_dir = os.path.join(out, "snapshots")
            os.makedirs(snap_dir, exist_ok=True)
        counter = [0]

        def save(snapshot: Any, estimates: Any) -> None:
            if snap_dir:
                counter[0] += 1
                snapshot.to_json(os.path.join(snap_dir, f"{counter[0]:04d}.json"))
                estimates.to_json(os.path.join(snap_dir, f"{counter[0]:04d}.estimates.json"))

        first_seed = [True]

        def save_first(snapshot: Any, estimates: Any) -> None:
            if first_seed[0]:
                save(snapshot, estimates)

        doc, runs = run_seeds(name, args.minutes, seeds, every=args.every, tail=args.tail,
                              on_snapshot=save_first, on_run=lambda _r: first_seed.__setitem__(0, False))
        result = runs[0]
        tables[name] = result.table
        text = table_markdown(result.table)
        print(f"## {name}: {SCENARIOS[name].description}\n\n{text}\n")
        print(f"promotion, one forecast per request at first sighting:\n{format_table(doc)}\n")
        if out:
            with open(os.path.join(out, "promotion.json"), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(doc, indent=1) + "\n")
        if out:
            with open(os.path.join(out, "events.jsonl"), "w", encoding="utf-8") as fh:
                for event in result.sim.log:
                    fh.write(json.dumps(event, separators=(",", ":")) + "\n")
            result.pairs.to_csv(os.path.join(out, "pairs.csv"), index=False)
            with open(os.path.join(out, "accuracy.md"), "w", encoding="utf-8") as fh:
                fh.write(f"{name}, seed {args.seed}, {args.minutes:g} minutes\n\n{text}\n")
    if args.output and len(names) > 1:
        stacked = pd.concat(tables, names=["scenario"])
        with open(os.path.join(args.output, "accuracy.md"), "w", encoding="utf-8") as fh:
            fh.write(table_markdown(stacked) + "\n")
    sys.stdout.flush()
    return 0
