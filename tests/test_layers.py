"""The layer contract of docs/architecture.md, checked by import-linter so CI fails on a break.

The contracts live in pyproject.toml (``[tool.importlinter]``): core and snapshot
never import the service or the simulator, the packages form layers, and no
import cycle exists anywhere in ``vecsched`` (imports inside functions included).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RUN = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))"
)


def _lint(config: Path) -> subprocess.CompletedProcess[str]:
    # The worktree's package, not an installed copy, is the one analysed.
    env = {"PYTHONPATH": str(ROOT), "PATH": "", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-c", _RUN, str(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_layer_contracts_hold() -> None:
    done = _lint(ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("do not import the service", "layers:", "no import cycle"):
        assert name in done.stdout  # each contract was checked, not skipped


def test_a_broken_contract_fails_the_check(tmp_path: Path) -> None:
    # The core does read the snapshot: forbidding it must fail, so a real break would too.
    config = tmp_path / "broken.toml"
    config.write_text(
        "[tool.importlinter]\n"
        'root_package = "vecsched"\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "core without snapshot"\n'
        'type = "forbidden"\n'
        'source_modules = ["vecsched.core"]\n'
        'forbidden_modules = ["vecsched.snapshot"]\n'
    )
    done = _lint(config)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "BROKEN" in done.stdout
