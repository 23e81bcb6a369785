"""``vecsched promotion [--window 24h] [--json] [--db/--redis/--prefix]``: the promotion verdict."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any


def parse_duration(text: str) -> float:
    """Seconds of ``24h``, ``90m``, ``3600s``, ``2d`` or a plain number of seconds.

    Examples
    --------
    >>> parse_duration("24h"), parse_duration("90m"), parse_duration("15")
    (86400.0, 5400.0, 15.0)
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 24h, 90m, 3600s)")
    value = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if value <= 0:
        raise argparse.ArgumentTypeError("the window must be positive")
    return value


def add_commands(sub: Any) -> None:
    p = sub.add_parser("promotion", help="the shadow forecasts' promotion verdict per estimator (SPEC section 8)")
    p.add_argument("--window", type=parse_duration, default="24h", help="rolling window")
    p.add_argument("--json", action="store_true", help="print the vecsched.promotion/1 document")
    p.add_argument("--db", help="database URL (default: $VECSCHED_DATABASE_URL or the SQLite file)")
    p.add_argument("--redis", help="Redis URL (default: $REDIS_URL; none: the database)")
    p.add_argument("--prefix", help="Redis key prefix (default: $VECSCHED_REDIS_PREFIX or vecsched)")
    p.set_defaults(func=_promotion)


def _promotion(args: argparse.Namespace) -> int:
    from vecsched.service.commands import command_store
    from vecsched.service.forecast_job import recorder_for
    from vecsched.core.promotion import format_table, read_promotion
    from vecsched.errors import SettingError, describe

    try:
        recorder = recorder_for(command_store(args, reading=True))  # a report never makes the file it reads
        doc = read_promotion(recorder.backend, now=time.time(), window=args.window)
    except Exception as exc:  # noqa: BLE001 - no traceback reaches a CLI user
        print(f"vecsched: cannot read the forecast pairs: {describe(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, SettingError) else 1  # a malformed URL: how it was called, as elsewhere
    print(json.dumps(doc, indent=1) if args.json else format_table(doc))
    return 0
