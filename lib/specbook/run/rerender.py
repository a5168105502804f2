"""`specbook render`: re-execute this project's notebook for a run's experiment on the run's saved data (no
server) and re-render its html, keeping every earlier report in renders/<n>/."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from specbook.core import secrets
from specbook.core.digest import sha256_file_or_none
from specbook.core.errors import RunError
from specbook.report import runindex
from specbook.report.tables import host_summary
from specbook.run.execute import PARAMS_YAML, REPORT_IPYNB, check_kernel, check_notebook, execute
from specbook.run.render import REPORT_HTML, try_render
from specbook.run.result import RunResult, join_errors, raise_if_failed
from specbook.run.scrub import scrub_report
from specbook.run.signals import sigterm_as_interrupt
from specbook.store.fingerprint import hardware_fingerprint
from specbook.store.manifest import Manifest, RenderRecord, iso_utc, read_manifest, utc_now, write_manifest

__all__ = ["RENDERS_DIR", "render_run"]

RENDERS_DIR = "renders"
_HTML_FAILED = "html render failed:"

log = logging.getLogger(__name__)


def _render_notebook(manifest: Manifest, notebook: str | os.PathLike[str] | None) -> Path:
    """The notebook to re-render with: the one asked for, else this project's notebook for the experiment.

    Never the path a run's manifest names: a run folder can come from elsewhere (another checkout, a
    colleague, an older commit), and its recorded notebook is not this code's report (nor code to trust).
    """
    if notebook:
        return Path(notebook).resolve()
    from specbook.experiments.registry import get_experiment

    return get_experiment(manifest.experiment).notebook_path()


def _render_host() -> str:
    """Hostname with CPU and GPU count: hostnames alone repeat across machines (both sides said `vm` here)."""
    row = host_summary(hardware_fingerprint())
    return f"{socket.gethostname()} ({row.get('cpu') or 'cpu?'}, {row['gpus']} GPU{'s' if row['gpus'] != 1 else ''})"


def _keep_previous_report(run_dir: Path) -> str | None:
    """Move report.ipynb / report.html to renders/<n>/ (the next free n); the folder, or None when none exists."""
    current = [run_dir / name for name in (REPORT_IPYNB, REPORT_HTML) if (run_dir / name).exists()]
    if not current:
        return None
    renders = run_dir / RENDERS_DIR
    renders.mkdir(exist_ok=True)
    n = 1 + max((int(p.name) for p in renders.iterdir() if p.name.isdigit()), default=0)
    target = renders / str(n)
    target.mkdir()
    for path in current:
        os.replace(path, target / path.name)
    return f"{RENDERS_DIR}/{n}"


def _failed_only_in_html(manifest: Manifest) -> bool:
    """A run every cell of which ran, marked failed for its html step alone (recorded before that stopped
    failing a run): the runner joined a cell's error before the html's, so an error that starts with the html's
    had none."""
    return (manifest.status == "failed" and manifest.failed_cell is None
            and (manifest.error or "").startswith(_HTML_FAILED))


def _mark_ok(manifest: Manifest) -> None:
    """Every cell of the collection ran: the run is ok (the html error it recorded was the report's, now made)."""
    for part in manifest.parts[-1:]:
        if part.status == "failed" and part.error == manifest.error:
            part.status, part.error = "ok", None
    manifest.status, manifest.error = "ok", None


def render_run(
    run_dir: str | os.PathLike[str],
    notebook: str | os.PathLike[str] | None = None,
    kernel: str | None = None,
    progress: bool = True,
) -> RunResult:
    """Re-execute this project's notebook for the run's experiment on its saved data (reuse_data=True, no
    server) and re-render the html.

    Every earlier report is kept: the one this render replaces moves to renders/<n>/ (report.ipynb, report.html;
    n = 1, 2, ... oldest first), named by the render's record. Each render is appended to manifest.renders, and
    `report_status` / `render_error` say whether report.html now exists. The manifest's status stays the
    collection's, except in a run marked failed only because its html step failed (runs recorded before a
    failed html stopped failing a run): once the report renders, that run is ok.
    """
    run_dir = Path(run_dir).resolve()
    manifest = read_manifest(run_dir)
    nb_path = _render_notebook(manifest, notebook)
    check_notebook(nb_path)
    kernel = kernel or manifest.kernel
    check_kernel(kernel)
    if not (run_dir / PARAMS_YAML).is_file():
        raise RunError(f"{run_dir / PARAMS_YAML}: missing; cannot re-render without the run's params")

    previous = _keep_previous_report(run_dir)
    log.info("re-rendering %s", run_dir)
    with sigterm_as_interrupt():
        failed_cell, error = execute(nb_path, run_dir, kernel, reuse_data=True, progress=progress)
    scrub_report(run_dir, secrets.Scrubber(secrets.env_secret_values(os.environ)))
    html, render_error = try_render(run_dir, f"{manifest.experiment} {manifest.run_id}")
    status = "failed" if error or render_error else "ok"
    manifest.renders.append(
        RenderRecord(
            at=iso_utc(utc_now()),
            host=_render_host(),
            notebook=str(nb_path),
            notebook_sha256=sha256_file_or_none(nb_path),
            status=status,
            failed_cell=failed_cell,
            error=join_errors(error, render_error),
            previous_report=previous,
        )
    )
    # the report now: made whole (ok), or failed (a cell on the saved data, or the html step)
    manifest.report_status = "ok" if html is not None and not error else "failed"
    manifest.render_error = join_errors(error, render_error)
    if html is not None and not error and _failed_only_in_html(manifest):
        _mark_ok(manifest)
    write_manifest(run_dir, manifest)
    runindex.refresh_index_of(run_dir)  # the index the run is listed in shows the new headline
    # the returned manifest carries the render's outcome; the file keeps the collection's status
    view = manifest.model_copy(
        update={"status": status, "failed_cell": failed_cell, "error": join_errors(error, render_error)}
    )
    result = RunResult(run_dir, status, failed_cell, run_dir / REPORT_IPYNB, html, view)
    return raise_if_failed(result, f"render of {run_dir.name}")
