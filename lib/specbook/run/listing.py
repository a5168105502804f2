"""`specbook list`: one row per run folder, read from its manifest (its status derived: a run still marked
running whose runner is gone reads `abandoned`, specbook.store.manifest.run_status)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.errors import RunError
from specbook.core.paths import outputs_dir
from specbook.store.manifest import MANIFEST_NAME, read_manifest, run_status

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RUN_COLUMNS", "list_runs"]

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


def _row(run_dir: Path) -> dict[str, Any]:
    try:
        m = read_manifest(run_dir)
    except RunError:
        return {"experiment": run_dir.parent.name, "run_id": run_dir.name, "status": "unreadable",
                "run_dir": str(run_dir)}
    return {
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


def list_runs(outputs_root: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """One row per run folder under outputs_root/EXPERIMENT/, oldest first; unreadable manifests show as such."""
    import pandas as pd

    root = Path(outputs_root) if outputs_root else outputs_dir()
    rows = [_row(path.parent) for path in sorted(root.glob(f"*/*/{MANIFEST_NAME}"))]
    frame = pd.DataFrame(rows, columns=RUN_COLUMNS)
    return frame.sort_values(["started_at", "run_id"], na_position="first", kind="stable").reset_index(
        drop=True
    )
