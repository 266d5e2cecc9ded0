"""The notebook ``experiments/notebooks/inspect_plan.ipynb`` executes from top to bottom (nbclient,
a real Jupyter kernel), and is committed without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = (
    Path(__file__).resolve().parent.parent / "experiments" / "notebooks" / "inspect_plan.ipynb"
)


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(not c.outputs and c.execution_count is None for c in code)


def test_notebook_executes_and_shows_tables_and_figures():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )  # fmt: skip
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) >= 4  # the four figures
    assert any("Costliest ops" in h for h in html)  # Plan._repr_html_
    assert any("PlanDiff" in h for h in html)
    assert any("megatron" in h for h in html)  # the compare table
