"""A unit's staging folder (the run folder's layout, on the node that ran it) and its merge into the run folder.

A Ray task runs its unit against a fresh staging folder and hands back every file in it; the driver merges them
into the one run folder: frames appended (`RunContext.append_frame`, the done frame last, so a unit counts as
done only once all its rows are in), `servers.jsonl` records appended whole, every other file (server logs,
trace folders) written at the same relative path. So a Ray run and a local run leave the same layout.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from specbook.core import diskwrite
from specbook.store.runstore import SERVERS_NAME

if TYPE_CHECKING:
    from specbook.store.runstore import RunContext

STAGING_ROOT = "specbook-units"
# Written by the task once its unit has ended (server torn down and recorded): a runner stopping the run after
# Ctrl-C waits for it before it ends the Ray workers (wait_units_ended). Never merged.
ENDED_MARK = ".unit-ended"
# A unit's files travel through Ray's object store; server logs are the large ones, and this bound leaves them
# ample room while refusing a runaway file.
MAX_UNIT_BYTES = 512 * 1024 * 1024


def _run_root(token: str) -> Path:
    return Path(tempfile.gettempdir()) / STAGING_ROOT / token


def staging_dir(token: str, key: str) -> Path:
    """Where a unit stages its files on its node (the same path on every node)."""
    return _run_root(token) / key


def mark_ended(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ENDED_MARK).touch()


def wait_units_ended(token: str, timeout_s: float, poll_s: float = 0.2) -> list[str]:
    """Wait until every unit staged on this host for the run has ended; the keys still running at the timeout."""
    root = _run_root(token)
    end = time.monotonic() + timeout_s
    while True:
        running = [f.name for f in sorted(root.glob("*")) if f.is_dir() and not (f / ENDED_MARK).exists()] \
            if root.is_dir() else []
        if not running or time.monotonic() >= end:
            return running
        time.sleep(poll_s)


def collect_staged(token: str) -> dict[str, dict[str, bytes]]:
    """On this node: the files of every unit still staged for the run (cancelled ones), by unit key; removed."""
    root = _run_root(token)
    staged = {}
    for folder in sorted(root.glob("*")) if root.is_dir() else []:
        if folder.is_dir():
            try:
                staged[folder.name] = pack(folder)
            except (OSError, ValueError):
                continue
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return staged


def recover_interrupted(token: str, ctx: RunContext) -> list[str]:
    """After an interrupted run whose kernel ended before it merged its cancelled units (the runner stops the
    kernel once the servers are gone): their server records and logs into the run folder; the keys.

    Frames are left out, so such a unit is not done and `--resume` runs it again; a server record the kernel
    merged already is not appended twice."""
    staged = collect_staged(token)
    servers_path = ctx.run_dir / SERVERS_NAME
    seen = set(servers_path.read_text(encoding="utf-8", errors="replace").splitlines()) \
        if staged and servers_path.is_file() else set()
    for files in staged.values():
        _write_files({rel: d for rel, d in files.items() if not _is_frame(rel)}, ctx, seen)
    return sorted(staged)


def pack(folder: str | Path) -> dict[str, bytes]:
    """Every file under `folder` by its relative path (posix), bytes as written."""
    root = Path(folder)
    files: dict[str, bytes] = {}
    total = 0
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.endswith(".tmp") and path.name != ENDED_MARK:
            data = path.read_bytes()
            total += len(data)
            if total > MAX_UNIT_BYTES:
                raise ValueError(f"{root}: a unit's files exceed {MAX_UNIT_BYTES >> 20} MiB; give the run a "
                                 f"shared folder instead of shipping them")
            files[path.relative_to(root).as_posix()] = data
    return files


def merge(files: dict[str, bytes], ctx: RunContext, *, done_frame: str) -> list[str]:
    """Write a unit's files into the run folder; the relative paths written, the done frame last."""
    import pandas as pd

    frames = {rel: data for rel, data in files.items() if _is_frame(rel)}
    written = _write_files({rel: data for rel, data in files.items() if rel not in frames}, ctx)
    done_rel = f"data/{done_frame}.parquet"
    for rel in sorted(frames, key=lambda r: r == done_rel):  # the done frame last
        ctx.append_frame(Path(rel).stem, pd.read_parquet(io.BytesIO(frames[rel])))
        written.append(rel)
    return written


def _is_frame(rel: str) -> bool:
    return rel.startswith("data/") and rel.endswith(".parquet")


def _write_files(files: dict[str, bytes], ctx: RunContext, seen_servers: set[str] | None = None) -> list[str]:
    """A unit's files other than frames into the run folder: server records appended (one in `seen_servers`
    skipped, where given), every other file written at its relative path; the paths written."""
    for rel, data in files.items():
        if rel == SERVERS_NAME:
            for line in data.decode("utf-8", "replace").splitlines():
                if line.strip() and (seen_servers is None or line not in seen_servers):
                    diskwrite.append_line(ctx.run_dir / SERVERS_NAME, line)
                    if seen_servers is not None:
                        seen_servers.add(line)
        else:
            target = _inside(ctx.run_dir, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            diskwrite.write_atomic(target, lambda p, d=data: Path(p).write_bytes(d))
    return list(files)


def _inside(root: Path, rel: str) -> Path:
    target = (root / rel).resolve()
    if root.resolve() not in target.parents:
        raise ValueError(f"{rel!r}: a unit's file must lie inside the run folder {root}")
    return target
