"""Executing a book notebook with papermill on the project's kernel.

The checks made before any run folder exists (the kernel is registered, the notebook has its `parameters`
cell), the params file the kernel reads, papermill's notebook saves made atomic, and the cell that failed named
in the source notebook's terms (papermill's report.ipynb holds one injected cell more).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.diskwrite import write_text_atomic
from specbook.core.errors import RunError, keep_cause
from specbook.core.params import dump_params
from specbook.core.progress import console as console_progress
from specbook.run.kernels import IPCKernelManager
from specbook.store.manifest import FailedCell

if TYPE_CHECKING:
    from nbformat import NotebookNode
    from papermill.exceptions import PapermillExecutionError
    from pydantic import BaseModel

__all__ = [
    "NOTEBOOK_PARAMETERS",
    "PARAMS_YAML",
    "REPORT_IPYNB",
    "atomic_notebook_writes",
    "check_kernel",
    "check_notebook",
    "execute",
    "failed_cell_from",
    "kernel_params_file",
    "last_started_cell",
]

# The names a book notebook's `parameters` cell must define (the runner injects their values).
NOTEBOOK_PARAMETERS = ("params_file", "run_dir", "reuse_data")
REPORT_IPYNB = "report.ipynb"
PARAMS_YAML = "params.yaml"


# --------------------------------------------------------------------------------------------------
# Checks made before any folder exists


def check_kernel(kernel: str) -> None:
    """The Jupyter kernel must be registered; say how to register it if not."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(kernel)
    except NoSuchKernel:
        raise RunError(
            f"Jupyter kernel {kernel!r} is not registered; register it for this environment with:\n"
            f"  python -m ipykernel install --sys-prefix --name {kernel}"
        ) from None


def _parameters_cell_index(nb: NotebookNode) -> int | None:
    for i, cell in enumerate(nb.cells):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return i
    return None


def check_notebook(path: str | os.PathLike[str]) -> None:
    """A book notebook exists and has a `parameters` cell defining params_file, run_dir, reuse_data."""
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path}: notebook not found")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # nbformat raises several unrelated types for a bad file
        raise RunError(f"{path}: not a readable notebook: {exc}") from None
    idx = _parameters_cell_index(nb)
    if idx is None:
        raise RunError(
            f"{path}: no cell tagged 'parameters' (it must define {', '.join(NOTEBOOK_PARAMETERS)})"
        )
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    if idx != first_code:
        raise RunError(f"{path}: the 'parameters' cell must be the first code cell (it is cell {idx})")
    source = nb.cells[idx].source
    missing = [n for n in NOTEBOOK_PARAMETERS if not re.search(rf"^\s*{n}\s*=", source, re.MULTILINE)]
    if missing:
        raise RunError(f"{path}: the 'parameters' cell does not define {', '.join(missing)}")


# --------------------------------------------------------------------------------------------------
# The cell that failed


def _source_index(report_index: int | None, source_nb_path: Path) -> int | None:
    """Index in the source notebook of a cell of report.ipynb (papermill inserts one cell)."""
    import nbformat

    if report_index is None:
        return None
    params_idx = _parameters_cell_index(nbformat.read(source_nb_path, as_version=4))
    injected_at = 0 if params_idx is None else params_idx + 1  # papermill's injected-parameters cell
    if report_index == injected_at:
        return None
    return report_index - 1 if report_index > injected_at else report_index


def _first_line(source: str) -> str:
    return next((ln.strip() for ln in source.splitlines() if ln.strip()), "")[:200]


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ARROW = re.compile(r"^-+>\s*\d+\s?(?P<code>.*)$")


def _failing_call(traceback: list[str] | None, source: str) -> str | None:
    """The line of the cell that raised: the first `---->` line of IPython's traceback is the cell's own frame
    (the call that failed), where the cell's first line is an import that did not."""
    for chunk in traceback or []:
        for line in _ANSI.sub("", str(chunk)).splitlines():
            m = _ARROW.match(line.strip())
            if m and m.group("code").strip():
                return m.group("code").strip()[:200]
    return None


def failed_cell_from(exc: PapermillExecutionError, source_nb_path: Path) -> FailedCell:
    """The cell papermill reports as raising, with its index mapped back to the source notebook."""
    return FailedCell(
        report_index=exc.cell_index,
        notebook_index=_source_index(exc.cell_index, source_nb_path),
        exec_count=exc.exec_count,
        first_line=_first_line(exc.source or ""),
        failing_line=_failing_call(getattr(exc, "traceback", None), exc.source or ""),
        ename=str(exc.ename),
        evalue=keep_cause(str(exc.evalue)),
    )


def last_started_cell(exc: BaseException, report: Path, source_nb_path: Path) -> FailedCell | None:
    """For a dead kernel or a timeout (no error output): the last cell papermill started."""
    import nbformat

    try:
        nb = nbformat.read(report, as_version=4)
    except Exception:  # no report written yet: nothing to point at
        return None
    started = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and c.metadata.get("papermill", {}).get("start_time")
    ]
    if not started:
        return None
    cell = nb.cells[started[-1]]
    return FailedCell(
        report_index=started[-1],
        notebook_index=_source_index(started[-1], source_nb_path),
        exec_count=cell.get("execution_count"),
        first_line=_first_line(cell.source),
        ename=type(exc).__name__,
        evalue=keep_cause(str(exc)),
    )


# --------------------------------------------------------------------------------------------------
# Execution


class _AtomicLocalHandler:
    """papermill's local file handler with its writes made atomic (specbook.core.diskwrite): papermill rewrites the
    output notebook after every cell, and a write cut by a full disk would leave it truncated."""

    def __init__(self, local: Any):
        self._local = local

    def __getattr__(self, name: str) -> Any:
        return getattr(self._local, name)

    def write(self, buf: str, path: str) -> None:
        write_text_atomic(path, buf)


@contextmanager
def atomic_notebook_writes(run_dir: Path) -> Iterator[None]:
    """Inside, papermill writes every notebook under run_dir through the atomic writer."""
    from papermill.iorw import papermill_io

    local = papermill_io.get_handler(REPORT_IPYNB)
    entry = (str(run_dir) + os.sep, _AtomicLocalHandler(local))
    papermill_io._handlers.insert(0, entry)  # papermill's own registry (register() has no removal)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            papermill_io._handlers.remove(entry)


@contextmanager
def kernel_params_file(params: BaseModel, run_dir: Path, hidden: bool) -> Iterator[Path]:
    """The params file the kernel reads: the run folder's params.yaml, or, when secrets were hidden in it, an
    unredacted copy in a private temporary folder (mode 0700) removed when the notebook ends, so the servers
    get the real values and the run folder never holds them."""
    if not hidden:
        yield run_dir / PARAMS_YAML
        return
    private = Path(tempfile.mkdtemp(prefix="specbook-params-"))
    try:
        path = private / PARAMS_YAML
        path.touch(mode=0o600)
        dump_params(params, path, redact=False)
        yield path
    finally:
        shutil.rmtree(private, ignore_errors=True)


def execute(
    notebook: Path, run_dir: Path, kernel: str, reuse_data: bool, progress: bool, params_file: Path | None = None
) -> tuple[FailedCell | None, str | None]:
    """Run the notebook into run_dir/report.ipynb. Returns (failed cell, error), both None when ok.

    `params_file` defaults to the run folder's params.yaml (see kernel_params_file for when it is not)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    parameters = {
        "params_file": str(params_file or run_dir / PARAMS_YAML),
        "run_dir": str(run_dir),
        "reuse_data": reuse_data,
    }
    try:
        with console_progress(run_dir / "logs" / "progress.log"), atomic_notebook_writes(run_dir):
            papermill.execute_notebook(
                str(notebook),
                str(run_dir / REPORT_IPYNB),
                parameters=parameters,
                kernel_name=kernel,
                progress_bar=progress,
                cwd=str(run_dir),
                kernel_manager_class=IPCKernelManager,
            )
    except PapermillExecutionError as exc:
        failed = failed_cell_from(exc, notebook)
        return failed, failed.describe()
    except Exception as exc:  # a dead kernel or a timeout: still finalize what we have
        failed = last_started_cell(exc, run_dir / REPORT_IPYNB, notebook)
        detail = f"{type(exc).__name__}: {exc}"
        return failed, (f"{detail} (last started: {failed.describe()})" if failed else detail)
    return None, None
