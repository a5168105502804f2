"""What a run or a render returns, and the error raised when it did not end ok (carrying the result)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specbook.core.errors import NotebookExecutionError
from specbook.store.manifest import FailedCell, Manifest

__all__ = ["RunResult", "join_errors", "raise_if_failed"]


@dataclass
class RunResult:
    run_dir: Path
    status: str
    failed_cell: FailedCell | None
    report_ipynb: Path
    report_html: Path | None
    manifest: Manifest


def join_errors(*errors: str | None) -> str | None:
    parts = [e for e in errors if e]
    return "; ".join(parts) if parts else None


def raise_if_failed(result: RunResult, what: str) -> RunResult:
    """The result when it is ok; else NotebookExecutionError naming the run folder and the report."""
    if result.status == "ok":
        return result
    detail = result.manifest.error or "unknown error"
    err = NotebookExecutionError(
        f"{what} failed: {detail}\n  run folder: {result.run_dir}\n  report: {result.report_html or result.report_ipynb}"
    )
    err.result = result  # type: ignore[attr-defined]  # the CLI prints the folder from it
    raise err
