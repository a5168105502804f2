"""`specbook diff RUN_A RUN_B`: two runs of one experiment side by side.

What differs in their params, in their environment (git, specbook, Python, libraries, host, engine
versions), and their headline verdicts and figures (each report's summary.json). Manifests are read as
plain JSON, so runs of other specbook versions compare too.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbook.core.errors import RunError
from specbook.report.view import table_html

MISSING = "(absent)"


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists as dotted keys (`engine.env.X`, `knobs.0.name`); leaves (and empty ones) as they are."""
    out: dict[str, Any] = {}
    if not prefix and isinstance(obj, (dict, list)) and not obj:  # nothing at all: no leaf
        return out
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1] if prefix else ""] = obj
    return out


def changed(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, value in a, value in b) for every dotted key whose values differ, sorted by key."""
    fa, fb = flatten(a), flatten(b)
    keys = sorted(set(fa) | set(fb))
    return [(k, fa.get(k, MISSING), fb.get(k, MISSING)) for k in keys if fa.get(k, MISSING) != fb.get(k, MISSING)]


def environment(doc: dict[str, Any]) -> dict[str, Any]:
    """What a run ran on and with: git, specbook, Python, libraries, host facts, each server's versions."""
    hw = doc.get("hardware") or {}
    cpu = hw.get("cpu") or {}
    gpus = (hw.get("gpu") or {}).get("nvidia") or []
    return {
        "git": {k: (doc.get("git") or {}).get(k) for k in ("sha", "dirty")},
        "specbook": doc.get("specbook_version"),
        "python": (doc.get("python") or {}).get("version") if isinstance(doc.get("python"), dict) else doc.get("python"),
        "libraries": doc.get("libraries") or {},
        "host": {"hostname": (doc.get("runner") or {}).get("hostname") or hw.get("hostname"),
                 "cpu": cpu.get("model_name"), "cpu_threads": cpu.get("threads"),
                 "gpus": sorted({g.get("name", "?") for g in gpus})},
        "engine_versions": doc.get("engine_versions") or {},
        "notebook_sha256": doc.get("notebook_sha256"),
    }


def _read(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "manifest.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunError(f"{path}: cannot read the run's manifest: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise RunError(f"{path}: not valid JSON: {exc}") from None


def _summary(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


@dataclass
class RunDiff:
    a: Path
    b: Path
    experiment: str
    header: list[tuple[str, Any, Any]]  # run id, start, status, params name, git, host
    params: list[tuple[str, Any, Any]]
    environment: list[tuple[str, Any, Any]]
    headlines: list[tuple[str, str, str]]  # comparison, A's verdict, figure, interval (and expectation, rule), B's
    notes: list[str]


def _headline_cell(h: dict[str, Any] | None) -> str:
    if not h:
        return MISSING
    parts = [h.get("verdict"), h.get("figure"), h.get("interval"), h.get("expected"), h.get("rule")]
    return " | ".join(str(p) for p in parts if p)


def diff_runs(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str]) -> RunDiff:
    """The diff of two run folders of the same experiment; RunError names a folder that is not a run."""
    a, b = Path(run_a).resolve(), Path(run_b).resolve()
    da, db = _read(a), _read(b)
    if da.get("experiment") != db.get("experiment"):
        raise RunError(f"{a.name} is a {da.get('experiment')!r} run and {b.name} a {db.get('experiment')!r} run: "
                       "diff compares two runs of one experiment")
    notes = []
    sa, sb = _summary(a), _summary(b)
    for run, s in ((a, sa), (b, sb)):
        if not s:
            notes.append(f"{run.name} has no summary.json (its report predates the summary block): "
                         f"`specbook render {run}` writes one")
    ha = {h["comparison"]: h for h in sa.get("headlines", [])}
    hb = {h["comparison"]: h for h in sb.get("headlines", [])}
    headlines = [(c, _headline_cell(ha.get(c)), _headline_cell(hb.get(c))) for c in dict.fromkeys([*ha, *hb])]

    def header(doc: dict[str, Any], run: Path) -> dict[str, Any]:
        git = doc.get("git") or {}
        return {"run": doc.get("run_id") or run.name, "started": doc.get("started_at"), "status": doc.get("status"),
                "params name": doc.get("params_name"), "params hash": str(doc.get("params_hash", ""))[:12],
                "git": f"{git.get('short_sha')}{' (dirty)' if git.get('dirty') is True else ''}",
                "duration_s": doc.get("duration_s")}

    hdr_a, hdr_b = header(da, a), header(db, b)
    return RunDiff(a, b, str(da.get("experiment")), [(k, hdr_a[k], hdr_b[k]) for k in hdr_a],
                   changed(da.get("params") or {}, db.get("params") or {}),
                   changed(environment(da), environment(db)), headlines, notes)


def diff_text(d: RunDiff) -> str:
    """The diff for a terminal."""
    def block(title: str, rows: list[tuple[Any, ...]], empty: str) -> list[str]:
        lines = [f"\n{title}"]
        if not rows:
            return lines + [f"  {empty}"]
        for key, va, vb in rows:
            lines += [f"  {key}", f"    A: {va}", f"    B: {vb}"]
        return lines

    out = [f"{d.experiment}: A = {d.a}", f"{' ' * len(d.experiment)}  B = {d.b}"]
    out += ["\nRuns"] + [f"  {key:<12} A: {va}   B: {vb}" for key, va, vb in d.header]
    out += block("Headline verdicts and figures", d.headlines, "neither run has a summary")
    out += block("Params that differ", d.params, "the params are the same")
    out += block("Environment that differs", d.environment, "the environment is the same")
    out += [f"\nnote: {n}" for n in d.notes]
    return "\n".join(out) + "\n"


def diff_html(d: RunDiff) -> str:
    """The diff as a self-contained page."""
    import pandas as pd

    def table(rows: list[tuple[Any, ...]], key: str, empty: str) -> str:
        if not rows:
            return f"<p><i>{html.escape(empty)}</i></p>"
        frame = pd.DataFrame([(k, str(va), str(vb)) for k, va, vb in rows], columns=[key, "A", "B"])
        return table_html(frame, max_columns=10**6)

    title = f"specbook diff: {d.experiment}"
    notes = "".join(f"<p><i>note: {html.escape(n)}</i></p>" for n in d.notes)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body style='font-family:sans-serif;margin:16px'><h1>{html.escape(title)}</h1>"
            f"<p>A = {html.escape(str(d.a))}<br>B = {html.escape(str(d.b))}</p>"
            f"<h2>Runs</h2>{table(d.header, 'run', '')}"
            f"<h2>Headline verdicts and figures</h2>{table(d.headlines, 'comparison', 'neither run has a summary')}"
            f"<h2>Params that differ</h2>{table(d.params, 'param', 'the params are the same')}"
            f"<h2>Environment that differs</h2>{table(d.environment, 'what', 'the environment is the same')}"
            f"{notes}</body></html>")
