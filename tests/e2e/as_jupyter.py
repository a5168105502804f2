"""Executing a book notebook the way Jupyter runs it (nbclient, cwd notebooks/, no papermill injection)."""

from __future__ import annotations

import re
from pathlib import Path

from nbclient import NotebookClient

from specbook.core.paths import project_root
from specbook.run.kernels import IPCKernelManager

NOTEBOOKS = project_root() / "notebooks"


def set_parameters(nb, **values: str) -> None:
    """Edit the parameters cell as a person would: replace the right-hand side of each named assignment."""
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    for name, value in values.items():
        cell.source, n = re.subn(rf"^{name} = .*$", f"{name} = {value}", cell.source, count=1, flags=re.MULTILINE)
        assert n == 1, f"the parameters cell has no line '{name} = ...'"


def execute_as_jupyter(nb, timeout: int) -> None:
    NotebookClient(nb, kernel_name="specbook", timeout=timeout, kernel_manager_class=IPCKernelManager,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()


def outputs_text(nb) -> str:
    return "\n".join(str(o.get("text", "")) + str((o.get("data") or {}).get("text/html", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def notebook_path(name: str) -> Path:
    return NOTEBOOKS / f"{name}.ipynb"
