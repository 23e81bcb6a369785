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
from typing import Any, Sequence

from vecsched.errors import describe
from vecsched.snapshot.snapshot import SnapshotError

# Modules that add their own subcommands with ``add_commands(subparsers)``.
_COMMAND_MODULES = ("vecsched.service.commands", "vecsched.simulate.commands", "vecsched.service.forecast_commands")


class Formatter(argparse.HelpFormatter):
    """Help that shows each option's default (when it has a meaningful one).

    Examples
    --------
    >>> p = Parser(prog="x")
    >>> _ = p.add_argument("--n", type=int, default=3, help="how many")
    >>> "how many (default: 3)" in p.format_help()
    True
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, and whose help shows defaults.

    Subparsers made from it are of the same class (argparse's default).

    Examples
    --------
    >>> Parser(prog="x").formatter_class is Formatter
    True
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:
        """Exit 2 with one line: what is wrong and where the help is (argparse's hook).

        Parameters
        ----------
        message : str

        Returns
        -------
        typing.NoReturn
        """
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0.

    Parameters
    ----------
    text : str
        The argument as typed.

    Returns
    -------
    int

    Examples
    --------
    >>> non_negative_int("3")
    3
    >>> non_negative_int("-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: -1 is not an integer >= 0
    """
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not an integer >= 0")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0.

    Parameters
    ----------
    text : str
        The argument as typed.

    Returns
    -------
    float

    Examples
    --------
    >>> positive_float("2.5")
    2.5
    >>> positive_float("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 0 is not a number > 0
    """
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} is not a number > 0")
    return value


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
    p.add_argument("--now", nargs="?", const="now", metavar="TIME",
                   help="stamp the snapshot at TIME (ISO 8601 with zone), or at the current time when "
                        "given alone (default: the fixed instant 2026-11-29T12:00:00Z)")
    p.add_argument("-o", "--output", required=True, help="the snapshot JSON file to write")
    p.set_defaults(func=_synth)

    for name in _COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        0 on success; 1 on a failure, 2 on a usage error or a file that is not a
        snapshot (each with one line on stderr).

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
        # 2: the input is not a snapshot at all; 1: anything else
        return 2 if isinstance(exc, SnapshotError) else 1


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
    import time

    from vecsched.synthetic import horde

    now = time.time() if args.now == "now" else args.now
    horde(workers=args.workers, requests=args.requests, seed=args.seed, now=now).to_json(args.output)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
