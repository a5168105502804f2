"""The book runner: validate params, make the run folder, execute the notebook, render the report.

A run folder holds params.yaml (validated, resolved), manifest.json, report.ipynb, report.html,
data/*.parquet (raw frames the notebook saved), logs/*.log (server logs) and servers.jsonl.
A failed cell still leaves all of it: papermill saves the notebook with the error cell, the html
is rendered from it and the manifest names the cell.

Notebooks run with cwd = the run folder, so anything a cell writes by relative path stays in it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook import __version__
from specbook.core import secrets
from specbook.core.digest import sha256_bytes, sha256_file_or_none
from specbook.core.diskwrite import write_atomic, write_text_atomic
from specbook.core.errors import DiskFullError, NotebookExecutionError, RunError, keep_cause
from specbook.core.params import dump_params, load_params, params_display_name
from specbook.core.paths import outputs_dir, project_root
from specbook.core.progress import console as console_progress
from specbook.report import runindex
from specbook.report.tables import host_summary
from specbook.run import hostlock, resume, runguard
from specbook.run.kernels import IPCKernelManager
from specbook.store.fingerprint import git_info, hardware_fingerprint, library_versions, python_info
from specbook.store.manifest import (
    MANIFEST_NAME,
    FailedCell,
    Manifest,
    RenderRecord,
    RunPart,
    iso_utc,
    read_manifest,
    run_status,
    utc_now,
    write_manifest,
)
from specbook.store.runstore import SERVERS_NAME, RunContext
from specbook.store.units import done_units, set_aside_unfinished, units_of

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "NOTEBOOK_PARAMETERS",
    "RunContext",
    "RunResult",
    "check_kernel",
    "check_notebook",
    "list_runs",
    "make_run_dir",
    "render_html",
    "render_run",
    "resume_experiment",
    "run_experiment",
]

# The names a book notebook's `parameters` cell must define (the runner injects their values).
NOTEBOOK_PARAMETERS = ("params_file", "run_dir", "reuse_data")
REPORT_IPYNB = "report.ipynb"
REPORT_HTML = "report.html"
PARAMS_YAML = "params.yaml"
RUN_TIME_FORMAT = "%Y%m%dT%H%M%SZ"

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_dir: Path
    status: str
    failed_cell: FailedCell | None
    report_ipynb: Path
    report_html: Path | None
    manifest: Manifest


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


def _parameters_cell_index(nb: Any) -> int | None:
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
# Run folder


def _check_inputs(params: Any) -> None:
    """Every path the params name (workload files, a flip folder, log globs) before the run folder is made."""
    check = getattr(params, "check_inputs", None)
    if check is not None:
        check()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-.") or "params"


def make_run_dir(
    experiment_dir: str | os.PathLike[str], started: datetime, params_name: str, short_sha: str
) -> Path:
    """Create `<UTC time>-<params name>-<short sha>/` under experiment_dir; never reuse a folder (-2, -3 ...)."""
    base = Path(experiment_dir)
    base.mkdir(parents=True, exist_ok=True)
    stem = f"{started.strftime(RUN_TIME_FORMAT)}-{_slug(params_name)}-{short_sha}"
    for n in range(1, 10_000):
        cand = base / (stem if n == 1 else f"{stem}-{n}")
        try:
            cand.mkdir()  # atomic: two runners started in the same second cannot share a folder
            return cand
        except FileExistsError:
            continue
    raise RunError(f"{base}: too many run folders named {stem}-*")


def _relative_to_root(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(project_root().resolve()))
    except ValueError:
        return str(path.resolve())


# --------------------------------------------------------------------------------------------------
# Execution and rendering


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


def _failed_cell_from(exc: Any, source_nb_path: Path) -> FailedCell:
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


def _last_started_cell(exc: BaseException, report: Path, source_nb_path: Path) -> FailedCell | None:
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


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (what `timeout` and job schedulers send) takes the Ctrl-C path.

    Ctrl-C lets nbclient interrupt the kernel, so the running cell's `with` blocks stop its servers,
    and lets the runner finalize the manifest; a bare SIGTERM would skip both.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
def _atomic_notebook_writes(run_dir: Path) -> Iterator[None]:
    """Inside, papermill writes every notebook under run_dir through the atomic writer."""
    from papermill.iorw import papermill_io

    local = papermill_io.get_handler("report.ipynb")
    entry = (str(run_dir) + os.sep, _AtomicLocalHandler(local))
    papermill_io._handlers.insert(0, entry)  # papermill's own registry (register() has no removal)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            papermill_io._handlers.remove(entry)


def _execute(
    notebook: Path, run_dir: Path, kernel: str, reuse_data: bool, progress: bool, params_file: Path | None = None
) -> tuple[FailedCell | None, str | None]:
    """Run the notebook into run_dir/report.ipynb. Returns (failed cell, error), both None when ok.

    `params_file` defaults to the run folder's params.yaml (see _kernel_params_file for when it is not)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    parameters = {
        "params_file": str(params_file or run_dir / PARAMS_YAML),
        "run_dir": str(run_dir),
        "reuse_data": reuse_data,
    }
    try:
        with console_progress(run_dir / "logs" / "progress.log"), _atomic_notebook_writes(run_dir):
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
        failed = _failed_cell_from(exc, notebook)
        return failed, failed.describe()
    except Exception as exc:  # a dead kernel or a timeout: still finalize what we have
        failed = _last_started_cell(exc, run_dir / REPORT_IPYNB, notebook)
        detail = f"{type(exc).__name__}: {exc}"
        return failed, (f"{detail} (last started: {failed.describe()})" if failed else detail)
    return None, None


_EMPTY_SCRIPT = re.compile(r'<script[^>]*\ssrc=""[^>]*>\s*</script>\s*')
# nbconvert's loader that imports mermaid.js from a CDN when a page holds a mermaid diagram: no report holds one,
# and a report names no URL it could fetch
_MERMAID_LOADER = re.compile(r'<script type="module">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*</script>\s*',
                             re.DOTALL)


def offline_html(body: str) -> str:
    """A rendered report without nbconvert's script tags that load nothing and without its CDN mermaid loader."""
    return _MERMAID_LOADER.sub("", _EMPTY_SCRIPT.sub("", body))


def render_html(report_ipynb: str | os.PathLike[str], title: str | None = None) -> Path:
    """report.html beside the notebook, inputs hidden: the report shows results, not code."""
    import nbformat
    from nbconvert import HTMLExporter

    from specbook.report import view as report_view

    src = Path(report_ipynb)
    # No MathJax or require.js from a CDN: a report must read offline (none uses math or JS widgets).
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True,
                            mathjax_url="", require_js_url="")
    # from_filename would overwrite the title with the file name ("report")
    resources = {"metadata": {"name": title or src.stem, "path": str(src.parent)}}
    body, _ = exporter.from_notebook_node(nbformat.read(src, as_version=4), resources=resources)
    # every report, whatever its experiment, gets its table of contents here, once
    return write_text_atomic(src.with_suffix(".html"), report_view.with_toc(offline_html(body)))


def _try_render(run_dir: Path, title: str) -> tuple[Path | None, str | None]:
    report = run_dir / REPORT_IPYNB
    if not report.exists():
        return None, None
    try:
        return render_html(report, title), None
    except Exception as exc:  # a render failure must not hide the run's own status
        hint = ""
        if "No template sub-directory" in str(exc):  # seen on a GPU host with nbconvert installed by pip --target
            hint = (" (nbconvert's templates are not on the Jupyter data path; where nbconvert was installed with "
                    "`pip install --target DIR`, add DIR/share/jupyter to JUPYTER_PATH; the executed report.ipynb "
                    "is kept: `specbook render RUN_DIR` makes the html later)")
        return None, f"html render failed: {type(exc).__name__}: {exc}{hint}"


def _collect_servers(manifest: Manifest, run_dir: Path) -> None:
    # a torn servers.jsonl line (a runner killed mid-append) is skipped and said; the other servers stay
    read = RunContext(run_dir).read_servers()
    manifest.servers = read.records
    manifest.engine_versions = {s.name: s.versions for s in read.records}
    manifest.warnings = [w for w in manifest.warnings if not w.startswith(SERVERS_NAME + ":")] + read.skipped
    executor = run_dir / "data" / "executor.json"  # the Ray cluster a run's units ran on (specbook.executors)
    if executor.is_file():
        try:
            manifest.executor = json.loads(executor.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            manifest.warnings.append(f"data/executor.json: unreadable, cluster not recorded: {exc}")


def _record_report(manifest: Manifest, html: Path | None, render_error: str | None) -> None:
    """Whether report.html exists now; a failed html step is the report's state, never the run's status."""
    manifest.report_status = "ok" if html is not None else ("failed" if render_error else None)
    manifest.render_error = render_error


def _join_errors(*errors: str | None) -> str | None:
    parts = [e for e in errors if e]
    return "; ".join(parts) if parts else None


def _raise_if_failed(result: RunResult, what: str) -> RunResult:
    if result.status == "ok":
        return result
    detail = result.manifest.error or "unknown error"
    err = NotebookExecutionError(
        f"{what} failed: {detail}\n  run folder: {result.run_dir}\n  report: {result.report_html or result.report_ipynb}"
    )
    err.result = result  # type: ignore[attr-defined]  # the CLI prints the folder from it
    raise err


# --------------------------------------------------------------------------------------------------
# Secrets: nothing the run folder holds shows one (specbook.core.secrets); the kernel still gets the real values


@dataclass
class _Shown:
    """What the run folder shows of the params, overrides and command line, and the scrubber for free text."""

    params: dict[str, Any]
    overrides: list[str]
    command: list[str]
    params_hash: str
    hidden_in_params: bool
    scrub: secrets.Scrubber


def _shown(params: Any, overrides: list[str], command: list[str]) -> _Shown:
    """Params, overrides and command with their secrets hidden; the values found (and the launching
    environment's secrets) become a scrubber for everything else the run writes."""
    plain = params.model_dump(mode="json")
    found: set[str] = set()
    params_shown = secrets.redact_data(plain, found)
    overrides_shown = [secrets.redact_override(o, found) for o in overrides]
    command_shown = secrets.redact_argv(command, found)
    scrub = secrets.Scrubber(found | secrets.env_secret_values(os.environ))
    params_shown = scrub.data(params_shown)  # a secret's value in a free-text field (a description) too
    # the hash of what is shown: a hash of the secret itself would let a reader test guesses of it offline
    canonical = json.dumps(params_shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _Shown(params=params_shown, overrides=[scrub(o) for o in overrides_shown],
                  command=[scrub(c) for c in command_shown], params_hash=sha256_bytes(canonical),
                  hidden_in_params=params_shown != plain, scrub=scrub)


@contextmanager
def _kernel_params_file(params: Any, run_dir: Path, hidden: bool) -> Iterator[Path]:
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


def _scrub_tree(obj: Any, scrub: secrets.Scrubber) -> Any:
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, dict):  # embedded images are base64: a match there would be chance and break the image
        return {k: (v if k.startswith("image/") and k != "image/svg+xml" else _scrub_tree(v, scrub))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub_tree(v, scrub) for v in obj]
    return obj


def _scrub_report(run_dir: Path, scrub: secrets.Scrubber) -> None:
    """Hide known secrets and URL passwords in the executed notebook (before the html is rendered from it):
    a cell may print what the kernel's real params hold; the summary blocks too."""
    _scrub_summaries(run_dir, scrub)
    report = run_dir / REPORT_IPYNB
    try:
        nb = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    clean = _scrub_tree(nb, scrub)
    if clean != nb:
        write_text_atomic(report, json.dumps(clean, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def _scrub_summaries(run_dir: Path, scrub: secrets.Scrubber) -> None:
    """Hide known secrets and URL passwords in the summary blocks the kernel saved: their question is built
    from the kernel's real params (a description may name a mirror with its password)."""
    for path in [run_dir / "summary.json", *sorted((run_dir / "reanalyses").glob("*.summary.json"))]:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        clean = scrub.data(doc)
        if clean != doc:
            write_text_atomic(path, json.dumps(clean, indent=1, ensure_ascii=False) + "\n")


def _scrub_manifest(manifest: Manifest, scrub: secrets.Scrubber) -> None:
    manifest.error = scrub(manifest.error) if manifest.error else manifest.error
    if manifest.failed_cell is not None:
        manifest.failed_cell = FailedCell.model_validate(_scrub_tree(manifest.failed_cell.model_dump(), scrub))


def _write_manifest(run_dir: Path, manifest: Manifest, scrub: secrets.Scrubber) -> None:
    """The manifest with every known secret value hidden wherever it appears (params.description, errors, the
    servers' records), not only under a secret name."""
    write_manifest(run_dir, Manifest.model_validate(scrub.data(manifest.model_dump(mode="json"))))


def _dump_params_shown(params: Any, path: Path, scrub: secrets.Scrubber) -> None:
    """params.yaml with secrets hidden by name (dump_params) and by value (a description that repeats one)."""
    dump_params(params, path)
    if scrub:
        text = path.read_text(encoding="utf-8")
        if scrub(text) != text:
            write_text_atomic(path, scrub(text))


# Files the by-value scrub leaves alone: binary frames and images (the report notebook has its own pass, which
# spares embedded images)
_NOT_SCRUBBED = frozenset({".parquet", ".png", ".jpg", ".jpeg", ".gif", ".pdf", ".ipynb"})


def _scrub_run_files(run_dir: Path, scrub: secrets.Scrubber) -> list[str]:
    """Every text file of the run folder (JSON, JSONL, YAML, logs, html) with the known secret values hidden;
    the files it changed. A file no value occurs in is not rewritten."""
    if not scrub:
        return []
    needles = [v.encode("utf-8") for v in scrub.values]
    changed = []
    for path in sorted(run_dir.rglob("*")):
        if not path.is_file() or path.suffix in _NOT_SCRUBBED or path.is_symlink():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if not any(n in data for n in needles):
            continue
        text = scrub(data.decode("utf-8", "surrogateescape"))
        write_atomic(path, lambda tmp, text=text: tmp.write_bytes(text.encode("utf-8", "surrogateescape")))
        changed.append(str(path.relative_to(run_dir)))
    return changed


def run_experiment(
    name: str,
    params_file: str | os.PathLike[str],
    overrides: list[str] | tuple[str, ...] = (),
    outputs_root: str | os.PathLike[str] | None = None,
    notebook: str | os.PathLike[str] | None = None,
    kernel: str = "specbook",
    progress: bool = True,
    host_lock: str = "wait",
) -> RunResult:
    """Run experiment `name` with the params in `params_file`; raises NotebookExecutionError if a cell fails.

    Params (every path they name among them), notebook and kernel are checked before the run folder is made,
    so bad input leaves nothing. `host_lock`: "wait" for the host lock (specbook.run.hostlock), "no-wait" (refused
    while another run holds it) or "off" (recorded in the manifest).
    """
    from specbook.experiments.registry import get_experiment

    spec = get_experiment(name)
    params = load_params(spec.params_model, params_file, list(overrides))
    _check_inputs(params)
    nb_path = Path(notebook).resolve() if notebook else spec.notebook_path()
    check_notebook(nb_path)
    check_kernel(kernel)

    git = git_info(project_root())
    started = utc_now()
    t0 = time.monotonic()
    params_name = params_display_name(params, params_file)
    root = Path(outputs_root) if outputs_root else outputs_dir()
    run_dir = make_run_dir(root / name, started, params_name, git.short_sha).resolve()
    shown = _shown(params, list(overrides), list(sys.argv))
    _dump_params_shown(params, run_dir / PARAMS_YAML, shown.scrub)
    RunContext(run_dir)  # data/ and logs/ exist before the first cell runs

    manifest = Manifest(
        run_id=run_dir.name,
        experiment=name,
        started_at=iso_utc(started),
        params_file=_relative_to_root(Path(params_file)),
        overrides=shown.overrides,
        params_name=params_name,
        params=shown.params,
        params_hash=shown.params_hash,
        notebook=str(nb_path),
        notebook_sha256=sha256_file_or_none(nb_path),
        kernel=kernel,
        command=shown.command,
        runner={"hostname": socket.gethostname(), "pid": os.getpid()},
        git=git,
        specbook_version=__version__,
        python=python_info(),
        libraries=library_versions(),
        hardware=hardware_fingerprint(),
        parts=[RunPart(started_at=iso_utc(started), host=socket.gethostname(), pid=os.getpid(), git_sha=git.sha)],
    )
    _write_manifest(run_dir, manifest, shown.scrub)
    _reserve_space(run_dir)
    return _collect(name, manifest, run_dir, nb_path, kernel, params, shown, progress, t0, host_lock)


def resume_experiment(
    run_dir: str | os.PathLike[str],
    overrides: list[str] | tuple[str, ...] = (),
    experiment: str | None = None,
    allow_params_change: bool = False,
    allow_git_change: bool = False,
    notebook: str | os.PathLike[str] | None = None,
    kernel: str | None = None,
    progress: bool = True,
    host_lock: str = "wait",
) -> RunResult:
    """Continue an abandoned, failed or interrupted run in its own folder (`specbook run --resume`).

    The units its collect finished are kept and skipped (specbook.store.units), what unfinished ones left is set
    aside in unfinished/<n>/, the same schedule runs on; the manifest gains a part. Params come from the run's
    params.yaml: a value redacted there must be given again with `overrides` (`-p field=value`).
    """
    from specbook.experiments.registry import get_experiment

    run_dir = Path(run_dir).resolve()
    manifest = read_manifest(run_dir)
    status = run_status(manifest)
    spec = get_experiment(manifest.experiment)
    units = units_of(manifest.experiment)
    params_path = run_dir / PARAMS_YAML
    if not params_path.is_file():
        raise RunError(f"{params_path}: missing; cannot resume without the run's params")
    params = load_params(spec.params_model, params_path, list(overrides))
    _check_inputs(params)
    shown = _shown(params, list(overrides), list(sys.argv))
    git = git_info(project_root())
    forced = resume.check_resumable(manifest, status, experiment=experiment, params_hash=shown.params_hash,
                                    git_sha=git.sha, allow_params_change=allow_params_change,
                                    allow_git_change=allow_git_change)
    if units is None:
        raise RunError(f"{run_dir}: experiment {manifest.experiment!r} does not declare its units of work "
                       "(specbook.store.units.register_units); it cannot be resumed")
    resume.check_redacted(params.model_dump(mode="json"), run_dir)
    nb_path = Path(notebook).resolve() if notebook else spec.notebook_path()
    check_notebook(nb_path)
    kernel = kernel or manifest.kernel
    check_kernel(kernel)

    if shown.params_hash != manifest.params_hash:  # allowed on purpose (forced): the folder shows what runs now
        _dump_params_shown(params, params_path, shown.scrub)
        manifest.params, manifest.params_hash = shown.params, shown.params_hash
    ctx = RunContext(run_dir)
    set_aside = set_aside_unfinished(ctx, units)
    # a torn servers.jsonl line leaves the file with the unit it belonged to: the manifest still says so
    manifest.warnings += [f"{set_aside['folder']}/{SERVERS_NAME}: torn or damaged line set aside: {name}"
                          for name in set_aside.get("servers", []) if name.startswith("(unreadable line")]
    started = utc_now()
    t0 = time.monotonic()
    if not manifest.parts:  # a run recorded before parts existed: its first start was one part
        first = manifest.model_dump()
        manifest.parts.append(RunPart(started_at=first["started_at"], ended_at=first["ended_at"],
                                      duration_s=first["duration_s"], host=manifest.runner.get("hostname"),
                                      pid=manifest.runner.get("pid"), git_sha=manifest.git.sha, status=status,
                                      error=manifest.error))
    else:
        manifest.parts[-1].status = status  # "abandoned" is derived when the watchdog could not write it
    manifest.parts.append(RunPart(
        started_at=iso_utc(started), host=socket.gethostname(), pid=os.getpid(), git_sha=git.sha,
        resumed_from=status, kept_units=len(done_units(ctx, units)), set_aside=set_aside.get("folder"),
        overrides=shown.overrides, forced=forced))
    manifest.status, manifest.error, manifest.failed_cell, manifest.ended_at = "running", None, None, None
    manifest.runner = {"hostname": socket.gethostname(), "pid": os.getpid()}
    _write_manifest(run_dir, manifest, shown.scrub)
    _reserve_space(run_dir)
    log.info("resuming %s (%s; %d finished units kept%s)", run_dir.name, status, manifest.parts[-1].kept_units,
             f"; set aside: {set_aside['folder']}" if set_aside else "")
    return _collect(manifest.experiment, manifest, run_dir, nb_path, kernel, params, shown, progress, t0, host_lock)


def _collect(name: str, manifest: Manifest, run_dir: Path, nb_path: Path, kernel: str, params: Any, shown: _Shown,
             progress: bool, t0: float, host_lock: str = "wait") -> RunResult:
    """Execute the notebook collecting (servers run) under the run guard and finalize the manifest."""
    log.info("run folder: %s", run_dir)
    guard: runguard.Guard | None = None
    try:
        with hostlock.held(run_dir, wait=host_lock != "no-wait", enabled=host_lock != "off",
                           say=log.info) as lock:
            manifest.host_lock = lock.record()
            if lock.waited_for:
                log.info("host lock taken after %.1f s", lock.waited_s)
                _write_manifest(run_dir, manifest, shown.scrub)
            with runguard.guarded(run_dir) as guard, \
                    _kernel_params_file(params, run_dir, shown.hidden_in_params) as kernel_params:
                failed_cell, error = _execute(nb_path, run_dir, kernel, reuse_data=False, progress=progress,
                                              params_file=kernel_params)
    except hostlock.HostBusyError as exc:  # nothing ran: the folder says why
        manifest.status, manifest.error = "failed", str(exc)
        _finalize(manifest, run_dir, t0, shown.scrub)
        raise
    except BaseException as exc:  # Ctrl-C or SIGTERM: keep what was measured, record it, let it through
        _quiet_interrupted_cell_task()
        _recover_staged(guard, run_dir)
        manifest.status = "interrupted"
        manifest.failed_cell = _last_started_cell(exc, run_dir / REPORT_IPYNB, nb_path)
        _scrub_report(run_dir, shown.scrub)
        html, render_error = _try_render(run_dir, f"{name} {run_dir.name}")
        _record_report(manifest, html, render_error)
        how = guard.describe() if guard is not None else ""
        manifest.error = (f"interrupted: {type(exc).__name__} {exc}".strip()
                          + (f" ({how})" if how and how not in str(exc) else ""))
        _finalize(manifest, run_dir, t0, shown.scrub)
        raise
    _recover_staged(guard, run_dir)
    manifest.failed_cell = failed_cell
    _scrub_report(run_dir, shown.scrub)
    html, render_error = _try_render(run_dir, f"{name} {run_dir.name}")
    # the html is the report's state, not the run's: every cell ran, so the run is ok (`specbook render` retries)
    manifest.status = "failed" if error else "ok"
    manifest.error = error
    _record_report(manifest, html, render_error)
    _finalize(manifest, run_dir, t0, shown.scrub)
    result = RunResult(run_dir, manifest.status, failed_cell, run_dir / REPORT_IPYNB, html, manifest)
    return _raise_if_failed(result, f"run of {name}")


class _InterruptedCellTask(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for nbclient's cell task that ended in the cell's own
    KeyboardInterrupt: the runner waited for that cell to finish (runguard), so its error reply arrived after the
    runner's KeyboardInterrupt had left nbclient, and nothing will read it; at exit asyncio would print the
    whole cell traceback under the run's "interrupted"."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (str(record.msg).startswith("Task exception was never retrieved")
                    and type(exc).__name__ == "CellExecutionError"
                    and getattr(exc, "ename", None) == "KeyboardInterrupt")


def _quiet_interrupted_cell_task() -> None:
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _InterruptedCellTask) for f in asyncio_log.filters):
        asyncio_log.addFilter(_InterruptedCellTask())


def _recover_staged(guard: runguard.Guard | None, run_dir: Path) -> None:
    """Units the Ray executor staged on this host and the ended kernel did not merge: their server records and
    logs into the run folder (a kernel stopped right after Ctrl-C tore its servers down)."""
    if guard is None:
        return
    from specbook.executors.staging import recover_interrupted

    try:
        keys = recover_interrupted(guard.token, RunContext(run_dir))
    except (OSError, ValueError) as exc:
        log.warning("could not recover the staged units of %s: %s", run_dir, exc)
        return
    if keys:
        log.info("recovered the server records and logs of %d unit(s) the kernel had not merged: %s",
                 len(keys), ", ".join(keys))


# Space kept in the run folder for its last manifest: freed when a full disk refused it, so the run still ends
# saying `failed` (and why) instead of staying `running` on disk
RESERVE_NAME = ".space-reserve"
RESERVE_BYTES = 256 * 1024


def _reserve_space(run_dir: Path) -> None:
    with contextlib.suppress(OSError):  # a disk already too full for it: the run finds out on its first write
        with open(run_dir / RESERVE_NAME, "wb") as fh:
            fh.write(b"\0" * RESERVE_BYTES)


def _release_space(run_dir: Path) -> None:
    (run_dir / RESERVE_NAME).unlink(missing_ok=True)


def _finalize(manifest: Manifest, run_dir: Path, t0: float, scrub: secrets.Scrubber | None = None) -> None:
    scrub = scrub or secrets.Scrubber()
    try:
        _finish(manifest, run_dir, t0, scrub)
    except DiskFullError as exc:  # the files before it are whole; the manifest must still say how the run ended
        _release_space(run_dir)
        manifest.status = "failed"
        manifest.error = _join_errors(manifest.error, str(exc))
        if manifest.parts:
            manifest.parts[-1].status, manifest.parts[-1].error = "failed", manifest.error
        _write_manifest(run_dir, manifest, scrub)
        raise
    _release_space(run_dir)
    with contextlib.suppress(DiskFullError):  # the index is a convenience; the run is recorded
        runindex.refresh_index(run_dir.parent.parent)  # outputs/index.html lists this run too


def _finish(manifest: Manifest, run_dir: Path, t0: float, scrub: secrets.Scrubber) -> None:
    manifest.ended_at = iso_utc(utc_now())
    settled = RunContext(run_dir).settle_pending_servers(
        "interrupted" if manifest.status == "interrupted" else "failed",
        "its unit never ended: the kernel died or was stopped before it recorded this server"
        + (f" ({manifest.error})" if manifest.error else ""))
    if settled:
        manifest.warnings.append(f"servers recorded by the runner, their kernel gone: {', '.join(settled)}")
    _collect_servers(manifest, run_dir)
    _scrub_manifest(manifest, scrub)
    if manifest.parts:  # this part ends as the run does; the run's duration is its parts' together
        part = manifest.parts[-1]
        part.ended_at, part.duration_s = manifest.ended_at, round(time.monotonic() - t0, 3)
        part.status, part.error = manifest.status, manifest.error
        manifest.duration_s = round(sum(p.duration_s or 0.0 for p in manifest.parts), 3)
    else:
        manifest.duration_s = round(time.monotonic() - t0, 3)
    _scrub_run_files(run_dir, scrub)
    _write_manifest(run_dir, manifest, scrub)


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


RENDERS_DIR = "renders"


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


_HTML_FAILED = "html render failed:"


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
    with _sigterm_as_interrupt():
        failed_cell, error = _execute(nb_path, run_dir, kernel, reuse_data=True, progress=progress)
    _scrub_report(run_dir, secrets.Scrubber(secrets.env_secret_values(os.environ)))
    html, render_error = _try_render(run_dir, f"{manifest.experiment} {manifest.run_id}")
    status = "failed" if error or render_error else "ok"
    manifest.renders.append(
        RenderRecord(
            at=iso_utc(utc_now()),
            host=_render_host(),
            notebook=str(nb_path),
            notebook_sha256=sha256_file_or_none(nb_path),
            status=status,
            failed_cell=failed_cell,
            error=_join_errors(error, render_error),
            previous_report=previous,
        )
    )
    # the report now: made whole (ok), or failed (a cell on the saved data, or the html step)
    manifest.report_status = "ok" if html is not None and not error else "failed"
    manifest.render_error = _join_errors(error, render_error)
    if html is not None and not error and _failed_only_in_html(manifest):
        _mark_ok(manifest)
    write_manifest(run_dir, manifest)
    runindex.refresh_index_of(run_dir)  # the index the run is listed in shows the new headline
    # the returned manifest carries the render's outcome; the file keeps the collection's status
    view = manifest.model_copy(
        update={"status": status, "failed_cell": failed_cell, "error": _join_errors(error, render_error)}
    )
    result = RunResult(run_dir, status, failed_cell, run_dir / REPORT_IPYNB, html, view)
    return _raise_if_failed(result, f"render of {run_dir.name}")


RUN_COLUMNS = [
    "experiment",
    "run_id",
    "status",
    "started_at",
    "duration_s",
    "params_name",
    "params_hash",
    "git_sha",
    "git_dirty",
    "renders",
    "last_render",
    "run_dir",
]


def list_runs(outputs_root: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """One row per run folder under outputs_root/EXPERIMENT/, oldest first; unreadable manifests show as such."""
    import pandas as pd

    root = Path(outputs_root) if outputs_root else outputs_dir()
    rows = []
    for path in sorted(root.glob(f"*/*/{MANIFEST_NAME}")):
        run_dir = path.parent
        try:
            m = read_manifest(run_dir)
        except RunError:
            rows.append(
                {
                    "experiment": run_dir.parent.name,
                    "run_id": run_dir.name,
                    "status": "unreadable",
                    "run_dir": str(run_dir),
                }
            )
            continue
        rows.append(
            {
                "experiment": m.experiment,
                "run_id": m.run_id,
                "status": run_status(m),
                "started_at": m.started_at,
                "duration_s": m.duration_s,
                "params_name": m.params_name,
                "params_hash": m.params_hash[:12],
                "git_sha": m.git.short_sha,
                "git_dirty": m.git.dirty,
                "renders": len(m.renders),
                "last_render": m.renders[-1].status if m.renders else None,
                "run_dir": str(run_dir),
            }
        )
    frame = pd.DataFrame(rows, columns=RUN_COLUMNS)
    return frame.sort_values(["started_at", "run_id"], na_position="first", kind="stable").reset_index(
        drop=True
    )
