"""Every import is declared in pyproject.toml, in the part of it that installs what imports it.

CI installs the project into a brand-new virtualenv; an import that only works because the
machine happens to have the package fails there (and for every user). This test finds it first:
it reads every import of the package, the benchmarks, the tests and the notebooks' code cells,
maps each imported top-level module to the distribution that provides it, and requires that
distribution to be declared (directly, not through another package's dependencies).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
LOCAL = {"vecsched", "benchmarks", "tests", "conftest"}

# Which declared parts a fresh install of each folder has: the package alone (plus the
# driver extra it names in its errors), the benchmarks with `bench`, tests and notebooks with `test`.
WHERE = {
    # prometheus: imported lazily by run --metrics prometheus; replay: numba, imported lazily by the replay loop
    "vecsched": ("postgres", "prometheus", "replay"),
    "benchmarks": ("bench",),
    "tests": ("test",),
    "notebooks": ("test",),
}
TEST_HELPERS = ROOT / "vecsched" / "testing"  # Hypothesis strategies: used by the tests only


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def declared(extras: tuple[str, ...]) -> set[str]:
    project = PYPROJECT["project"]
    names = {_name(r) for r in project["dependencies"]}
    for extra in extras:
        names |= {_name(r) for r in project["optional-dependencies"][extra]}
    return names


def _sources(folder: str):
    base = ROOT / folder
    if folder == "notebooks":
        for path in sorted(base.glob("*.ipynb")):
            book = json.loads(path.read_text(encoding="utf-8"))
            code = "\n".join("".join(c["source"]) for c in book["cells"] if c["cell_type"] == "code")
            yield path, "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    else:
        for path in sorted(base.rglob("*.py")):
            yield path, path.read_text(encoding="utf-8")


def imported_modules(source: str) -> set[str]:
    """Top-level names of the absolute imports in ``source`` (at any depth: lazy imports count)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_imported_modules_reads_lazy_imports() -> None:
    found = imported_modules("import a.b\ndef f():\n    from c import d\n    from . import e\n")
    assert found == {"a", "c"}


@pytest.mark.parametrize("folder", sorted(WHERE))
def test_every_import_is_declared(folder: str) -> None:
    providers = packages_distributions()
    missing = []
    for path, source in _sources(folder):
        allowed = declared(("test",) if TEST_HELPERS in path.parents else WHERE[folder])
        for module in sorted(imported_modules(source) - LOCAL - set(sys.stdlib_module_names)):
            dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
            if not dists:
                missing.append(f"{path.relative_to(ROOT)}: {module} (not installed here either)")
            elif not dists & allowed:
                missing.append(f"{path.relative_to(ROOT)}: {module} from {sorted(dists)}")
    assert not missing, f"imports not declared for {folder} ({', '.join(WHERE[folder]) or 'core'}):\n" + \
        "\n".join(missing)


def test_the_package_needs_no_extra_at_import() -> None:
    # `python -m pip install -e .` then `vecsched run` must work: the core imports only core deps
    # at module level; the optional driver is imported lazily by SQLAlchemy.
    providers = packages_distributions()
    core = declared(())
    for path, source in _sources("vecsched"):
        if TEST_HELPERS in path.parents:
            continue
        tree = ast.parse(source)
        top = set()
        for node in tree.body:
            if isinstance(node, ast.Import):
                top |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                top.add(node.module.split(".")[0])
        for module in top - LOCAL - set(sys.stdlib_module_names):
            dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
            assert dists & core, f"{path.relative_to(ROOT)} imports {module} at module level"
