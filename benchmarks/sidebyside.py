"""Checkouts of vecsched taking turns in one run, each in its own subprocess.

The machine is shared, so a speed change is judged by ratios measured at the
same time: each tree runs ``child`` (Python source) with ``PYTHONPATH`` = the
tree and its folder as working directory; the child prepares, prints one JSON
line, then answers every ``go`` line on stdin with one JSON line of figures.
Turns alternate which tree goes first, so neither always follows the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def _start(tree: str, child: str, argv: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    return subprocess.Popen([sys.executable, "-c", child, *argv], cwd=os.path.abspath(tree), env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _turn(process: subprocess.Popen[str], command: str = "go") -> dict[str, Any]:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(command + "\n")
    process.stdin.flush()
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"a benchmark child stopped (exit {process.wait()})")
    return json.loads(line)


def take_turns(
    trees: dict[str, str], child: str, argv: list[str], rounds: int, finish: str | None = None
) -> tuple[dict, dict]:
    """``(ready, turns)``: per tree name, its first JSON line and the list of its turns' figures.

    ``finish``: a last command line sent to each child after the turns; its
    JSON answer is appended to that child's turns.
    """
    processes = {name: _start(tree, child, argv) for name, tree in trees.items()}
    try:
        ready = {name: json.loads(p.stdout.readline()) for name, p in processes.items()}  # type: ignore[union-attr]
        turns: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for k in range(rounds):
            order = list(trees) if k % 2 == 0 else list(reversed(list(trees)))
            for name in order:
                turns[name].append(_turn(processes[name]))
        for name in trees if finish else ():
            turns[name].append(_turn(processes[name], finish))
    finally:
        for p in processes.values():
            p.stdin.close()  # type: ignore[union-attr]
            p.wait()
    return ready, turns
