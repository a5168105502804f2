"""manifest.json: what a run was (params, git, versions, hardware, servers, renders, status), and its schema.

The manifest is written twice: a preliminary one before the notebook starts (status "running"), and the
final one after it ends, so even a killed run leaves a record of what it was about to do. A runner killed
outright (SIGKILL, OOM) cannot write the final one: its watchdog (specbook.run.runguard) marks the run "abandoned",
and `run_status` says so too for a run still marked running whose runner is gone. Each start of the collection
(the first and every `specbook run --resume`) is one of `parts`.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from specbook.core.diskwrite import write_text_atomic
from specbook.core.errors import RunError

MANIFEST_NAME = "manifest.json"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso_utc(when: datetime | float | int | str | None) -> str | None:
    """UTC ISO-8601 for a datetime, an epoch in seconds, or a string kept as given."""
    if when is None or isinstance(when, str):
        return when
    if isinstance(when, (int, float)):
        return datetime.fromtimestamp(when, timezone.utc).isoformat()
    if when.tzinfo is None:  # naive datetimes from the lib are local wall time
        when = when.astimezone()
    return when.astimezone(timezone.utc).isoformat()


class ServerRecord(BaseModel):
    """One engine server a run launched (a line of servers.jsonl)."""

    name: str
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict, description="redacted env diff vs the parent")
    versions: dict[str, Any] = Field(default_factory=dict)
    started_at: str | None = None
    stopped_at: str | None = None
    ready_s: float | None = None
    log_path: str | None = None
    startup: dict[str, Any] = Field(
        default_factory=dict, description="what the server's log says of its start (specbook.engines.vllm.startup)"
    )
    extra: dict[str, Any] = Field(default_factory=dict)
    status: Literal["ok", "failed", "interrupted"] | None = Field(
        None, description="how the server's unit of work ended (None in runs recorded before this field)"
    )
    error: str | None = None


class GitInfo(BaseModel):
    sha: str = "unknown"
    short_sha: str = "nogit"
    dirty: bool | Literal["unknown"] = "unknown"
    root: str | None = None


class FailedCell(BaseModel):
    """The cell that failed: its index in the executed report and in the source notebook."""

    report_index: int | None = None
    notebook_index: int | None = None
    exec_count: int | None = None
    first_line: str = ""
    failing_line: str | None = Field(None, description="the line of the cell that raised (the call that failed)")
    ename: str = ""
    evalue: str = ""

    def describe(self) -> str:
        where = f"cell {self.notebook_index}" if self.notebook_index is not None else "a cell"
        count = f" (In [{self.exec_count}])" if self.exec_count is not None else ""
        at = f"at `{self.failing_line}`" if self.failing_line else f"`{self.first_line}`"
        return f"{where}{count} {at} raised {self.ename}: {self.evalue}"


class RenderRecord(BaseModel):
    at: str
    host: str | None = Field(default=None, description="where the render ran (the run's data may come from elsewhere)")
    notebook: str
    notebook_sha256: str | None = None
    status: Literal["ok", "failed"]
    failed_cell: FailedCell | None = None
    error: str | None = Field(None, description="why this render failed (a cell, or the html step)")
    previous_report: str | None = Field(None, description="the folder the report it replaced was moved to "
                                        "(renders/<n>/: every earlier report is kept)")


RunStatus = Literal["running", "ok", "failed", "interrupted", "abandoned"]


class RunPart(BaseModel):
    """One start of a run's collection: the first, and each `specbook run --resume`."""

    started_at: str
    ended_at: str | None = None
    duration_s: float | None = None
    host: str | None = None
    machine: str | None = Field(None, description="the machine kind it ran on (store.fingerprint.machine_kind)")
    pid: int | None = None
    git_sha: str | None = None
    status: RunStatus = "running"
    error: str | None = None
    resumed_from: str | None = Field(None, description="the status the run had when this part resumed it")
    kept_units: int | None = Field(None, description="finished units kept from earlier parts (not re-run)")
    set_aside: str | None = Field(None, description="folder holding what unfinished units had left")
    overrides: list[str] = Field(default_factory=list, description="-p given to the resume (secrets hidden)")
    forced: list[str] = Field(default_factory=list, description="checks overridden on purpose (--allow-...)")


class Manifest(BaseModel):
    schema_version: int = 1
    run_id: str
    experiment: str
    status: RunStatus = "running"
    failed_cell: FailedCell | None = None
    error: str | None = None
    started_at: str
    ended_at: str | None = None
    duration_s: float | None = None
    command: list[str] = Field(default_factory=list, description="the command line that started the run")
    runner: dict[str, Any] = Field(default_factory=dict, description="hostname and pid of the runner process")
    params_file: str
    params_resolved: str = "params.yaml"
    overrides: list[str] = Field(default_factory=list)
    params_name: str
    params: dict[str, Any]
    params_hash: str
    notebook: str
    notebook_sha256: str | None = None
    kernel: str
    git: GitInfo
    specbook_version: str
    python: dict[str, str]
    libraries: dict[str, str | None]
    engine_versions: dict[str, dict[str, Any]] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    servers: list[ServerRecord] = Field(default_factory=list)
    executor: dict[str, Any] = Field(default_factory=dict, description="where the units ran when not in the kernel: "
                                     "the Ray cluster (nodes with GPUs/CPUs, Ray version, slots; data/executor.json)")
    renders: list[RenderRecord] = Field(default_factory=list)
    report_status: Literal["ok", "failed"] | None = Field(
        None, description="report.html rendered (ok) or not (failed: render_error says why; `specbook render` "
        "retries). A failed html step never fails the run. None in runs recorded before this field")
    render_error: str | None = None
    host_lock: dict[str, Any] = Field(default_factory=dict, description="the host lock of the run's servers: mode "
                                      "held or off (--no-lock), its path, how long the run waited and for whom")
    warnings: list[str] = Field(default_factory=list, description="damage the run's files showed and the runner "
                                "skipped (a servers.jsonl line torn by a killed runner)")
    parts: list[RunPart] = Field(default_factory=list, description="each start of the collection (empty in runs "
                                 "recorded before resume existed: one part, the top-level fields)")


def write_manifest(run_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write atomically so a crash mid-write never leaves a half manifest."""
    return write_text_atomic(Path(run_dir) / MANIFEST_NAME, manifest.model_dump_json(indent=2) + "\n")


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    path = Path(run_dir) / MANIFEST_NAME
    try:
        return Manifest.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"{path}: no manifest; is this a specbook run folder?") from None
    except ValueError as exc:
        raise RunError(f"{path}: unreadable manifest: {exc}") from None


def run_status(m: Manifest) -> str:
    """The status to show and act on: "abandoned" also for a run still marked running whose runner died on this
    host (a watchdog that died with it could not say so)."""
    if m.status != "running" or m.runner.get("hostname") != socket.gethostname():
        return m.status
    pid = m.runner.get("pid")
    if not isinstance(pid, int):
        return m.status
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "abandoned"
    except PermissionError:  # alive, another user's
        pass
    return m.status
