"""The book runner: validate params, make the run folder, execute the notebook, render the report.

A run folder holds params.yaml (validated, resolved), manifest.json, report.ipynb, report.html,
data/*.parquet (raw frames the notebook saved), logs/*.log (server logs) and servers.jsonl.
A failed cell still leaves all of it: papermill saves the notebook with the error cell, the html
is rendered from it and the manifest names the cell.

Notebooks run with cwd = the run folder, so anything a cell writes by relative path stays in it.

This module owns a run's lifecycle, once for a first run and a resumed one: the checks before any folder
exists, the folder and its first manifest, the host lock, the notebook under the run guard, the report, and
the last manifest. Its steps live beside it: execute (papermill and the kernel), signals, render (the html),
scrub (secrets), rerender (`specbook render`), listing (`specbook list`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from specbook import __version__
from specbook.core import secrets
from specbook.core.digest import sha256_file_or_none
from specbook.core.diskwrite import write_atomic
from specbook.core.errors import DiskFullError, RunError
from specbook.core.params import load_params, params_display_name
from specbook.core.paths import outputs_dir, project_root
from specbook.report import runindex
from specbook.run import hostlock, resume, runguard
from specbook.run.execute import (
    NOTEBOOK_PARAMETERS,
    PARAMS_YAML,
    REPORT_IPYNB,
    check_kernel,
    check_notebook,
    execute,
    kernel_params_file,
    last_started_cell,
)
from specbook.run.listing import list_runs
from specbook.run.render import REPORT_HTML, record_report, render_html, try_render
from specbook.run.rerender import render_run
from specbook.run.result import RunResult, join_errors, raise_if_failed
from specbook.run.scrub import (
    Shown,
    dump_params_shown,
    scrub_manifest,
    scrub_report,
    scrub_run_files,
    shown_of,
    write_manifest_shown,
)
from specbook.run.signals import quiet_interrupted_cell_task
from specbook.store.fingerprint import (
    GitInfo,
    git_info,
    hardware_fingerprint,
    library_versions,
    machine_kind,
    python_info,
)
from specbook.store.manifest import Manifest, RunPart, iso_utc, read_manifest, run_status, utc_now
from specbook.store.runstore import SERVERS_NAME, RunContext
from specbook.store.units import done_units, set_aside_unfinished, units_of

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "NOTEBOOK_PARAMETERS",
    "PARAMS_YAML",
    "REPORT_HTML",
    "REPORT_IPYNB",
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

RUN_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
# Space kept in the run folder for its last manifest: freed when a full disk refused it, so the run still ends
# saying `failed` (and why) instead of staying `running` on disk
RESERVE_NAME = ".space-reserve"
RESERVE_BYTES = 256 * 1024

log = logging.getLogger(__name__)


@dataclass
class _Collection:
    """One collection of a run (its first part or a resumed one): what the lifecycle needs to carry it out."""

    manifest: Manifest
    run_dir: Path
    notebook: Path
    kernel: str
    params: BaseModel
    shown: Shown
    progress: bool
    host_lock: str  # "wait", "no-wait" or "off" (specbook.run.hostlock)
    t0: float  # time.monotonic() at the part's start: its duration

    @property
    def title(self) -> str:
        return f"{self.manifest.experiment} {self.run_dir.name}"


# --------------------------------------------------------------------------------------------------
# The two ways in: a new run, a resumed one


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
    shown = shown_of(params, list(overrides), list(sys.argv))
    dump_params_shown(params, run_dir / PARAMS_YAML, shown.scrub)
    RunContext(run_dir)  # data/ and logs/ exist before the first cell runs
    hardware = hardware_fingerprint()
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
        runner=_this_runner(),
        git=git,
        specbook_version=__version__,
        python=python_info(),
        libraries=library_versions(),
        hardware=hardware,
        parts=[_part(started, git, hardware)],
    )
    run = _Collection(manifest, run_dir, nb_path, kernel, params, shown, progress, host_lock, t0)
    _start(run)
    return _collect(run)


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
    allow_hardware_change: bool = False,
) -> RunResult:
    """Continue an abandoned, failed or interrupted run in its own folder (`specbook run --resume`).

    The units its collect finished are kept and skipped (specbook.store.units), what unfinished ones left is set
    aside in unfinished/<n>/, the same schedule runs on; the manifest gains a part (specbook.run.resume). Params
    come from the run's params.yaml: a value redacted there must be given again with `overrides` (`-p
    field=value`).
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
    shown = shown_of(params, list(overrides), list(sys.argv))
    git = git_info(project_root())
    hardware = hardware_fingerprint()
    forced = resume.check_resumable(manifest, status, experiment=experiment, params_hash=shown.params_hash,
                                    git_sha=git.sha, allow_params_change=allow_params_change,
                                    allow_git_change=allow_git_change, machine=machine_kind(hardware),
                                    allow_hardware_change=allow_hardware_change)
    if units is None:
        raise RunError(f"{run_dir}: experiment {manifest.experiment!r} does not declare its units of work "
                       "(specbook.store.units.register_units); it cannot be resumed")
    resume.check_redacted(params.model_dump(mode="json"), run_dir)
    nb_path = Path(notebook).resolve() if notebook else spec.notebook_path()
    check_notebook(nb_path)
    kernel = kernel or manifest.kernel
    check_kernel(kernel)

    if shown.params_hash != manifest.params_hash:  # allowed on purpose (forced): the folder shows what runs now
        dump_params_shown(params, params_path, shown.scrub)
        manifest.params, manifest.params_hash = shown.params, shown.params_hash
    ctx = RunContext(run_dir)
    set_aside = set_aside_unfinished(ctx, units)
    # a torn servers.jsonl line leaves the file with the unit it belonged to: the manifest still says so
    manifest.warnings += [f"{set_aside['folder']}/{SERVERS_NAME}: torn or damaged line set aside: {name}"
                          for name in set_aside.get("servers", []) if name.startswith("(unreadable line")]
    started = utc_now()
    t0 = time.monotonic()
    resume.add_part(manifest, status, _part(started, git, hardware, resumed_from=status,
                                            kept_units=len(done_units(ctx, units)), set_aside=set_aside.get("folder"),
                                            overrides=shown.overrides, forced=forced))
    manifest.status, manifest.error, manifest.failed_cell, manifest.ended_at = "running", None, None, None
    manifest.runner = _this_runner()
    run = _Collection(manifest, run_dir, nb_path, kernel, params, shown, progress, host_lock, t0)
    _start(run)
    log.info("resuming %s (%s; %d finished units kept%s)", run_dir.name, status, manifest.parts[-1].kept_units,
             f"; set aside: {set_aside['folder']}" if set_aside else "")
    return _collect(run)


# --------------------------------------------------------------------------------------------------
# The run folder and its first manifest


def _check_inputs(params: BaseModel) -> None:
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


def _this_runner() -> dict[str, str | int]:
    return {"hostname": socket.gethostname(), "pid": os.getpid()}


def _part(started: datetime, git: GitInfo, hardware: dict[str, object], **resumed: object) -> RunPart:
    """The part this runner collects on this machine (`hardware`: its fingerprint); `resumed`: what a resume records
    of how it started (RunPart's fields)."""
    return RunPart(started_at=iso_utc(started), host=socket.gethostname(), machine=machine_kind(hardware),
                   pid=os.getpid(), git_sha=git.sha, **resumed)


def _start(run: _Collection) -> None:
    """The manifest as the run starts (status running), and the space kept for its last one."""
    write_manifest_shown(run.run_dir, run.manifest, run.shown.scrub)
    _reserve_space(run.run_dir)


def _reserve_space(run_dir: Path) -> None:
    # a disk already too full for it: the run finds out on its first write
    with contextlib.suppress(OSError, DiskFullError):
        write_atomic(run_dir / RESERVE_NAME, lambda tmp: tmp.write_bytes(b"\0" * RESERVE_BYTES))


def _release_space(run_dir: Path) -> None:
    (run_dir / RESERVE_NAME).unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------
# The collection: host lock, run guard, the notebook, the report


def _collect(run: _Collection) -> RunResult:
    """Execute the notebook collecting (servers run) under the host lock and the run guard, render the report
    and finalize the manifest. Ctrl-C or SIGTERM keeps what was measured, records the run interrupted and goes
    on up."""
    log.info("run folder: %s", run.run_dir)
    manifest = run.manifest
    guard: runguard.Guard | None = None
    try:
        with hostlock.held(run.run_dir, wait=run.host_lock != "no-wait", enabled=run.host_lock != "off",
                           say=log.info) as lock:
            manifest.host_lock = lock.record()
            if lock.waited_for:
                log.info("host lock taken after %.1f s", lock.waited_s)
                write_manifest_shown(run.run_dir, manifest, run.shown.scrub)
            with runguard.guarded(run.run_dir) as guard, \
                    kernel_params_file(run.params, run.run_dir, run.shown.hidden_in_params) as kernel_params:
                failed_cell, error = execute(run.notebook, run.run_dir, run.kernel, reuse_data=False,
                                             progress=run.progress, params_file=kernel_params)
    except hostlock.HostBusyError as exc:  # nothing ran: the folder says why
        manifest.status, manifest.error = "failed", str(exc)
        _finalize(manifest, run.run_dir, run.t0, run.shown.scrub)
        raise
    except BaseException as exc:  # Ctrl-C or SIGTERM: keep what was measured, record it, let it through
        quiet_interrupted_cell_task()
        _recover_staged(guard, run.run_dir)
        manifest.status = "interrupted"
        manifest.failed_cell = last_started_cell(exc, run.run_dir / REPORT_IPYNB, run.notebook)
        _report(run)
        how = guard.describe() if guard is not None else ""
        manifest.error = (f"interrupted: {type(exc).__name__} {exc}".strip()
                          + (f" ({how})" if how and how not in str(exc) else ""))
        _finalize(manifest, run.run_dir, run.t0, run.shown.scrub)
        raise
    _recover_staged(guard, run.run_dir)
    manifest.failed_cell = failed_cell
    html = _report(run)
    # the html is the report's state, not the run's: every cell ran, so the run is ok (`specbook render` retries)
    manifest.status = "failed" if error else "ok"
    manifest.error = error
    _finalize(manifest, run.run_dir, run.t0, run.shown.scrub)
    result = RunResult(run.run_dir, manifest.status, failed_cell, run.run_dir / REPORT_IPYNB, html, manifest)
    return raise_if_failed(result, f"run of {manifest.experiment}")


def _report(run: _Collection) -> Path | None:
    """report.html from the executed notebook, its secrets hidden first; the manifest says whether it exists."""
    scrub_report(run.run_dir, run.shown.scrub)
    html, render_error = try_render(run.run_dir, run.title)
    record_report(run.manifest, html, render_error)
    return html


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


# --------------------------------------------------------------------------------------------------
# The last manifest


def _finalize(manifest: Manifest, run_dir: Path, t0: float, scrub: secrets.Scrubber | None = None) -> None:
    """The run's last manifest; on a full disk, written from the space reserve and saying `failed` and why."""
    scrub = scrub or secrets.Scrubber()
    try:
        _finish(manifest, run_dir, t0, scrub)
    except DiskFullError as exc:  # the files before it are whole; the manifest must still say how the run ended
        _release_space(run_dir)
        manifest.status = "failed"
        manifest.error = join_errors(manifest.error, str(exc))
        if manifest.parts:
            manifest.parts[-1].status, manifest.parts[-1].error = "failed", manifest.error
        write_manifest_shown(run_dir, manifest, scrub)
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
    scrub_manifest(manifest, scrub)
    if manifest.parts:  # this part ends as the run does; the run's duration is its parts' together
        part = manifest.parts[-1]
        part.ended_at, part.duration_s = manifest.ended_at, round(time.monotonic() - t0, 3)
        part.status, part.error = manifest.status, manifest.error
        manifest.duration_s = round(sum(p.duration_s or 0.0 for p in manifest.parts), 3)
    else:
        manifest.duration_s = round(time.monotonic() - t0, 3)
    scrub_run_files(run_dir, scrub)
    write_manifest_shown(run_dir, manifest, scrub)


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
