"""The notebooks run top to bottom on their small default sizes, and are committed executed:
an analyst browsing the repository sees their tables and plots, on a page small enough to load."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert {p.name for p in NOTEBOOKS} >= {"explore_snapshot.ipynb", "accuracy.ipynb"}


MAX_NOTEBOOK_BYTES = 400_000
"""A committed notebook, plots included, stays readable on a repository page."""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_executed_and_small(path):
    assert path.stat().st_size <= MAX_NOTEBOOK_BYTES, f"{path.name}: {path.stat().st_size} bytes"
    book = nbformat.read(path, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    # every code cell ran, in order, without an error, and the plots are there
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_top_to_bottom(path):
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:  # re-execute from scratch, not from the committed outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    # A failing cell raises CellExecutionError naming the cell and the error.
    NotebookClient(book, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    # every notebook draws at least one figure
    assert any("image/png" in o.get("data", {}) for o in outputs)


def test_accuracy_notebook_legend_names_only_what_is_plotted():
    book = nbformat.read(NOTEBOOKS[0].parent / "accuracy.ipynb", as_version=4)
    setup = book.cells[1].source
    # the default scenario has both gentypes, and a gentype with no pairs draws no legend entry
    assert '"steady"' in setup.split("\n")[0]
    assert "if d.empty" in "".join(c.source for c in book.cells)
