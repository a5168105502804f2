"""Resuming a run in its own folder (`specbook run --resume`): whether a run may be resumed, the part the
manifest gains, and the line a report shows about it.

Which units of work a run folder holds as done, and setting aside what unfinished ones left, is the run
folder's bookkeeping (specbook.store.units): the experiments' collects use it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specbook.core.errors import ParamsError, RunError
from specbook.core.secrets import REDACTED
from specbook.store.fingerprint import machine_kind
from specbook.store.manifest import Manifest, RunPart, read_manifest

__all__ = [
    "RESUMABLE",
    "add_part",
    "check_redacted",
    "check_resumable",
    "first_machine",
    "redacted_fields",
    "resumed_note",
    "resumed_note_of",
]

# Statuses a resume continues; "ok" is finished and "running" may still be running.
RESUMABLE = ("abandoned", "failed", "interrupted")


# --------------------------------------------------------------------------------------------------
# May this run be resumed?


def _walk(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}.{i}" if path else str(i))
    else:
        yield path, obj


def redacted_fields(params: dict[str, Any]) -> list[str]:
    """Dotted paths (list indices as numbers, the `-p` syntax) of params whose stored value is the redaction
    marker, or a URL whose password it replaced: values a resume must be given again."""
    return [path for path, value in _walk(params)
            if isinstance(value, str) and (value == REDACTED or f":{REDACTED}@" in value)]


def check_redacted(params: dict[str, Any], run_dir: Path) -> None:
    """ParamsError naming every field still holding the redaction marker: a server must never get it."""
    fields = redacted_fields(params)
    if fields:
        hint = " ".join(f"-p {f}=VALUE" for f in fields)
        raise ParamsError(
            f"{run_dir / 'params.yaml'}: {', '.join(fields)} {'was' if len(fields) == 1 else 'were'} redacted when "
            f"the run was saved; give {'it' if len(fields) == 1 else 'them'} again: specbook run --resume "
            f"{run_dir} {hint}")


def first_machine(manifest: Manifest) -> str | None:
    """The machine kind the run's first part ran on: as its part recorded it, else from the manifest's hardware
    (the first part's fingerprint); None where neither tells."""
    if manifest.parts and manifest.parts[0].machine:
        return manifest.parts[0].machine
    return machine_kind(manifest.hardware)


def check_resumable(manifest: Manifest, status: str, *, experiment: str | None, params_hash: str, git_sha: str,
                    allow_params_change: bool = False, allow_git_change: bool = False, machine: str | None = None,
                    allow_hardware_change: bool = False) -> list[str]:
    """Refuse what must not be resumed (RunError/ParamsError naming why); returns the checks the caller
    overrode on purpose (recorded in the manifest's part). `machine`: the kind of machine the resume would run on
    (store.fingerprint.machine_kind): units timed on another GPU model, GPU count or CPU do not compare with the
    kept ones (a lent GPU host may be an H100 one time and an H200 the next, under one hostname)."""
    where = manifest.run_id
    if status == "ok":
        raise RunError(f"{where}: finished ok; nothing to resume (render it again with `specbook render`)")
    if status == "running":
        runner = manifest.runner
        raise RunError(f"{where}: still marked running by pid {runner.get('pid')} on {runner.get('hostname')}; "
                       "stop that runner first (a run whose runner died reads `abandoned`)")
    if status not in RESUMABLE:
        raise RunError(f"{where}: status {status!r} cannot be resumed (only {', '.join(RESUMABLE)})")
    if experiment is not None and experiment != manifest.experiment:
        raise RunError(f"{where}: is a run of {manifest.experiment!r}, not {experiment!r}")
    forced = []
    if params_hash != manifest.params_hash:
        if not allow_params_change:
            raise ParamsError(
                f"{where}: the params differ from the run's (hash {params_hash[:12]} vs {manifest.params_hash[:12]}): "
                "the resumed units would not measure the same thing; pass --allow-params-change to resume anyway "
                "(recorded in the manifest)")
        forced.append(f"params changed: hash {manifest.params_hash[:12]} -> {params_hash[:12]}")
    if git_sha != manifest.git.sha:
        if not allow_git_change:
            raise RunError(
                f"{where}: the run was started at git {manifest.git.sha[:12]}, this checkout is {git_sha[:12]}; "
                "pass --allow-git-change to resume with this code anyway (recorded in the manifest)")
        forced.append(f"git changed: {manifest.git.sha[:12]} -> {git_sha[:12]}")
    before = first_machine(manifest)
    if before and machine and machine != before:
        if not allow_hardware_change:
            raise RunError(
                f"{where}: its kept units ran on {before}, this machine is {machine}: their timings would not "
                "compare; resume it on the same kind of machine, or pass --allow-hardware-change to resume here "
                "anyway (recorded in the manifest, and the report says so)")
        forced.append(f"machine changed: {before} -> {machine}")
    return forced


# --------------------------------------------------------------------------------------------------
# The manifest's record of it


def add_part(manifest: Manifest, status: str, part: RunPart) -> None:
    """Append the resumed part; the part before it ends as `status` (the run's status, derived: "abandoned"
    where the watchdog could not write it). A run recorded before parts existed gets its first start as part 1."""
    if not manifest.parts:
        first = manifest.model_dump()
        manifest.parts.append(RunPart(started_at=first["started_at"], ended_at=first["ended_at"],
                                      duration_s=first["duration_s"], host=manifest.runner.get("hostname"),
                                      machine=machine_kind(manifest.hardware), pid=manifest.runner.get("pid"),
                                      git_sha=manifest.git.sha, status=status, error=manifest.error))
    else:
        manifest.parts[-1].status = status
    manifest.parts.append(part)


# --------------------------------------------------------------------------------------------------
# What the report says


def resumed_note(manifest: Manifest) -> str | None:
    """One paragraph for the report when the run was collected in more than one part; None otherwise."""
    parts = manifest.parts
    if len(parts) < 2:
        return None
    lines = [f"This run was resumed {len(parts) - 1} time{'s' if len(parts) > 2 else ''}: its units were "
             f"collected in {len(parts)} parts."]
    for i, part in enumerate(parts, 1):
        kept = (f"; kept {part.kept_units} finished unit{'s' if part.kept_units != 1 else ''}"
                if i > 1 and part.kept_units is not None else "")
        aside = f"; what unfinished units left was set aside in {part.set_aside}" if part.set_aside else ""
        forced = f"; resumed although {', '.join(part.forced)}" if part.forced else ""
        machine = f", {part.machine}" if part.machine else ""
        lines.append(f"- part {i}: started {part.started_at} on {part.host} (pid {part.pid}{machine}, git "
                     f"{(part.git_sha or '?')[:12]}), {part.status}{kept}{aside}{forced}")
    return "\n".join(lines)


def resumed_note_of(run_dir: str | os.PathLike[str]) -> str | None:
    """resumed_note of a run folder's manifest (None when it has none or it cannot be read)."""
    try:
        return resumed_note(read_manifest(run_dir))
    except RunError:
        return None
