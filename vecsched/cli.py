"""The ``vecsched`` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Sequence

from vecsched.snapshot.snapshot import SnapshotError

# Modules that add their own subcommands with ``add_commands(subparsers)``.
_COMMAND_MODULES = ("vecsched.service.commands", "vecsched.simulate.commands", "vecsched.service.forecast_commands")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vecsched", description="Queue estimates for an AI Horde.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("estimate", help="print the estimates of a snapshot file")
    p.add_argument("snapshot", help="snapshot JSON file (vecsched.snapshot/1)")
    p.add_argument("-o", "--output", help="write the estimates document here instead of stdout")
    p.add_argument("--eligible-image-wait", action="store_true", help="eligibility-aware image waits")
    p.set_defaults(func=_estimate)

    p = sub.add_parser("synth", help="write a synthetic horde snapshot")
    p.add_argument("--workers", type=int, default=150)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=_synth)

    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_commands(sub)

    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SnapshotError as exc:
        print(f"vecsched: {exc}", file=sys.stderr)
        return 2


def _estimate(args: argparse.Namespace) -> int:
    from . import estimate, load_snapshot

    snapshot = load_snapshot(args.snapshot)
    for error in snapshot.rejected:
        print(f"vecsched: rejected {error}", file=sys.stderr)
    result = estimate(snapshot, eligible_image_wait=args.eligible_image_wait)
    text = json.dumps(result.to_dict(), indent=1)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from vecsched.synthetic import horde

    horde(workers=args.workers, requests=args.requests, seed=args.seed).to_json(args.output)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
