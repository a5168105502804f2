"""`specbook index`: one HTML page listing every run under a folder (outputs/, docs/reports/).

Each row: experiment, start time, params name, git sha and dirty flag, host, its GPUs (or CPU), status, the
report's answer in one short clause (its summary.json) and a link to the report. The runner rewrites
outputs/index.html after every run. Manifests are read as plain JSON, so runs recorded by older or newer
versions still list; an unreadable one lists as such.
"""

from __future__ import annotations

import html
import json
import logging
import os
from pathlib import Path
from typing import Any

from specbook.core.diskwrite import write_text_atomic
from specbook.report.view import machine_text, short_clause, table_html

INDEX_HTML = "index.html"
SUMMARY_JSON = "summary.json"
# outputs/<experiment>/<run>/ and docs/reports/<name>/
MANIFEST_GLOBS = ("*/manifest.json", "*/*/manifest.json")

log = logging.getLogger(__name__)


def run_folders(root: str | os.PathLike[str]) -> list[Path]:
    """Every folder under root (one or two levels down) holding a manifest.json."""
    root = Path(root)
    found = {p.parent for pattern in MANIFEST_GLOBS for p in root.glob(pattern)}
    return sorted(found)


def _status(doc: dict[str, Any], run_dir: Path) -> str:
    """The manifest's status, with a run still marked running whose runner is gone named as manifest.run_status does."""
    try:
        from specbook.store.manifest import Manifest, run_status

        return run_status(Manifest.model_validate(doc))
    except Exception:  # a manifest of another version: its own word
        return str(doc.get("status") or "?")


def headline_text(run_dir: str | os.PathLike[str]) -> str:
    """The report's answer in one short clause, from the folder's summary.json: its `short` line, or (a summary
    written before it had one) the first headline's comparison and verdict and how many more; '' without one."""
    try:
        doc = json.loads((Path(run_dir) / SUMMARY_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    if doc.get("short"):
        return str(doc["short"])
    return short_clause([h for h in doc.get("headlines", []) if isinstance(h, dict)])


def index_row(run_dir: Path, root: Path) -> dict[str, Any]:
    """One run's row of the index."""
    report = run_dir / "report.html"
    link = os.path.relpath(report, root) if report.is_file() else ""
    try:
        doc = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {"experiment": run_dir.parent.name, "run": run_dir.name, "status": f"unreadable manifest ({exc})",
                "report": link}
    git = doc.get("git") or {}
    dirty = git.get("dirty")
    runner = doc.get("runner") or {}
    hardware = doc.get("hardware") or {}
    return {
        "experiment": doc.get("experiment") or run_dir.parent.name,
        "started (UTC)": str(doc.get("started_at") or "")[:19].replace("T", " "),
        "run": doc.get("run_id") or run_dir.name,
        "params": doc.get("params_name") or "",
        "git": f"{git.get('short_sha', '?')}{' (dirty)' if dirty is True else ''}",
        "host": runner.get("hostname") or hardware.get("hostname") or "",
        "ran on": machine_text(hardware, details=False) if hardware else "",
        "status": _status(doc, run_dir),
        "headline": headline_text(run_dir),
        "report": link,
    }


def index_rows(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows for every run under root, newest first."""
    root = Path(root)
    rows = [index_row(d, root) for d in run_folders(root)]
    return sorted(rows, key=lambda r: (r.get("started (UTC)") or "", r["run"]), reverse=True)


def index_html(rows: list[dict[str, Any]], title: str) -> str:
    """The page: a table of runs, each linking its report (a relative link: the folder can move)."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=["experiment", "started (UTC)", "run", "params", "git", "host", "ran on",
                                        "status", "headline", "report"])
    frame["report"] = [f"<a href=\"{html.escape(link, quote=True)}\">report</a>" if link else ""
                       for link in frame["report"].fillna("")]
    table = table_html(frame.fillna(""), max_columns=10**6, raw_html=("report",))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body style='font-family:sans-serif;margin:16px'><h1>{html.escape(title)}</h1>"
            f"<p>{len(rows)} run(s), newest first. Headline: the report's answer in one short clause, from its "
            "summary block (blank for runs rendered before reports wrote one).</p>"
            f"{table}</body></html>")


def write_index(root: str | os.PathLike[str], title: str | None = None) -> Path:
    """Write root/index.html listing every run under root."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out = root / INDEX_HTML
    return write_text_atomic(out, index_html(index_rows(root), title or f"specbook runs in {root}"))


def refresh_index(root: str | os.PathLike[str]) -> Path | None:
    """write_index for the runner: an index that cannot be written is logged, never a run's failure."""
    try:
        return write_index(root)
    except Exception as exc:  # the run and its report matter; the index is a convenience
        log.warning("could not write %s: %s", Path(root) / INDEX_HTML, exc)
        return None


def refresh_index_of(run_dir: str | os.PathLike[str]) -> Path | None:
    """After a render: refresh the index that lists this run (outputs/ or a folder that already has one)."""
    from specbook.core.paths import outputs_dir

    root = Path(run_dir).resolve().parent.parent
    if root == outputs_dir().resolve() or (root / INDEX_HTML).is_file():
        return refresh_index(root)
    return None
