"""The ``vecsched`` command line.

Every failure a user can cause (a missing file or folder, an unreachable
Redis or database, a bad argument, a missing optional driver) ends in one line
on stderr and a non-zero exit; ``vecsched --debug CMD`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Sequence

from vecsched.arguments import Parser, instant, non_negative_int
from vecsched.errors import SettingError, describe
from vecsched.snapshot.snapshot import SnapshotError

# Modules that add their own subcommands with ``add_commands(subparsers)``.
_COMMAND_MODULES = ("vecsched.service.commands", "vecsched.simulate.commands", "vecsched.service.forecast_commands")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vecsched")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def build_parser() -> Parser:
    """The whole command line: global options and every subcommand.

    Returns
    -------
    Parser

    Examples
    --------
    >>> build_parser().parse_args(["--debug", "synth", "-o", "x.json"]).debug
    True
    """
    parser = Parser(prog="vecsched", description="Queue estimates for an AI Horde.")
    parser.add_argument("--version", action="version", version=f"vecsched {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of a failure instead of one line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("estimate", help="print the estimates of a snapshot file")
    p.add_argument("snapshot", help="snapshot JSON file (vecsched.snapshot/1)")
    p.add_argument("-o", "--output", help="write the estimates document here instead of stdout")
    p.add_argument("--eligible-image-wait", action="store_true",
                   help="image queue_position/wait_time from eligible workers, not horde-wide")
    p.set_defaults(func=_estimate)

    p = sub.add_parser("synth", help="write a synthetic horde snapshot")
    p.add_argument("--workers", type=non_negative_int, default=150, help="worker rows (text and image)")
    p.add_argument("--requests", type=non_negative_int, default=3000, help="request rows (text and image)")
    p.add_argument("--seed", type=int, default=0, help="random seed: the same seed gives the same horde")
    p.add_argument("--now", nargs="?", const="now", metavar="TIME", type=_instant_or_now,
                   help="stamp the snapshot at TIME (ISO 8601 with zone), or at the current time when "
                        "given alone (default: the fixed instant 2026-11-29T12:00:00Z)")
    p.add_argument("-o", "--output", required=True, help="the snapshot JSON file to write")
    p.set_defaults(func=_synth)

    for name in _COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def _instant_or_now(text: str) -> float | str:
    # argparse passes the bare flag's const ("now") through the type too.
    return text if text == "now" else instant(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        0 on success; 1 on a failure, 2 on a usage error (a bad flag, a malformed
        URL or setting) or a file that is not a snapshot (each with one line on stderr).

    Examples
    --------
    >>> main(["estimate", "no-such-file.json"])  # one line on stderr, no traceback
    2
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line
        if args.debug:
            raise
        print(f"vecsched: {describe(exc)}", file=sys.stderr)
        # 2: how the command was called, or an input that is not a snapshot at all; 1: anything else
        return 2 if isinstance(exc, (SnapshotError, SettingError)) else 1


def _estimate(args: argparse.Namespace) -> int:
    from vecsched.core.estimate import estimate
    from vecsched.snapshot.snapshot import load_snapshot

    snapshot = load_snapshot(args.snapshot)
    for error in snapshot.rejected:
        print(f"vecsched: rejected {error}", file=sys.stderr)
    result = estimate(snapshot, eligible_image_wait=args.eligible_image_wait)
    text = json.dumps(result.to_dict(), indent=1, allow_nan=False)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


def _synth(args: argparse.Namespace) -> int:
    import time

    from vecsched.synthetic import horde

    now = time.time() if args.now == "now" else args.now
    horde(workers=args.workers, requests=args.requests, seed=args.seed, now=now).to_json(args.output)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
