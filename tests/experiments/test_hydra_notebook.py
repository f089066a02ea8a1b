"""The sweep notebook executes top to bottom on the committed table."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]


def test_sweep_notebook_executes() -> None:
    nb = nbformat.read(ROOT / "notebooks" / "sweep_figures.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outs), "the figures were drawn"
