"""Clone -> first report: what a new user waits for on this host (issue #13's target: under 10 minutes on 2 cores).

usage: python benchmarks/clone_to_report.py [--pip-reference] [--keep]
       python benchmarks/clone_to_report.py --run-dir outputs/knob_ab/<run>   (the demo run's split only)

Clones this checkout's HEAD into a temporary folder, with caches of its own (pip's, uv's and SPECBOOK_CACHE: nothing
installed, downloaded or prepared earlier on this host is reused, as on a fresh machine; the host's package sources
and its page cache are what they are), then runs `make install`, `make models` and `make demo` there, and prints
where the time went beside the reference: issue #13's measurement on a fresh 2-core machine before this work
(REFERENCE below). --pip-reference also installs the same pins with pip
(INSTALLER=pip) into a second venv, cold, so uv and pip are timed in the same run. Figures only; no pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 600.0
REFERENCE = {"set-up": 202.0, "demo run": 541.0, "clone -> report": 743.0}  # issue #13, before this work


def mmss(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def timed(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, str]:
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        fh.write(proc.stdout)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed (exit {proc.returncode}); its output: {log}")
    return time.monotonic() - t0, proc.stdout


def union_s(spans: list[tuple[float, float]]) -> float:
    """Wall seconds covered by the spans (servers started side by side count once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def run_split(run_dir: Path) -> dict[str, float]:
    """Where a knob A/B run's wall time went, from its manifest and server records."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    records = [json.loads(line) for line in (run_dir / "servers.jsonl").read_text().splitlines() if line.strip()]
    import pandas as pd

    runs = pd.read_parquet(run_dir / "data" / "runs.parquet")
    starts = []
    for r in records:
        t0 = datetime.fromisoformat(r["started_at"]).timestamp()
        starts.append((t0, t0 + (r["ready_s"] or 0.0)))
    split = {
        "servers": float(len(records)),
        "server starts, summed": float(sum(r["ready_s"] or 0.0 for r in records)),
        "server starts, wall (side by side once)": union_s(starts),
        "measured windows": float(runs["wall_s"].sum()),
        "run (manifest)": float(manifest["duration_s"]),
    }
    split["rest (kernel, flush waits, teardowns, analysis, render)"] = (
        split["run (manifest)"] - split["server starts, wall (side by side once)"] - split["measured windows"])
    return split


def print_split(split: dict[str, float]) -> None:
    print(f"  servers: {int(split.pop('servers'))}")
    for name, s in split.items():
        print(f"  {name:<58} {mmss(s):>8}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, help="only print the split of this knob A/B run folder")
    ap.add_argument("--pip-reference", action="store_true", help="also time pip installing the same pins, cold")
    ap.add_argument("--keep", action="store_true", help="keep the clone and its caches (printed)")
    args = ap.parse_args()
    if args.run_dir:
        print_split(run_split(args.run_dir))
        return

    work = Path(tempfile.mkdtemp(prefix="specbook-clone-to-report-"))  # caches and logs
    # beside this checkout, as a user's clone is beside ../shared (the demo's data paths are relative to it)
    clone = Path(tempfile.mkdtemp(prefix="specbook-clone-", dir=ROOT.parent))
    clone.rmdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "SPECBOOK_"))}
    env.update(PIP_CACHE_DIR=str(work / "pip-cache"), UV_CACHE_DIR=str(work / "uv-cache"),
               SPECBOOK_CACHE=str(work / "specbook-cache"), SPECBOOK_OUTPUTS=str(work / "outputs"))
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "/.venv/" not in p)
    times: dict[str, float] = {}
    t_all = time.monotonic()
    times["git clone"], _ = timed(["git", "clone", "-q", str(ROOT), str(clone)], work, env, work / "clone.log")
    times["venv + packages (make install)"], _ = timed(["make", "install"], clone, env, work / "install.log")
    times["models (make models)"], _ = timed(["make", "models"], clone, env, work / "models.log")
    times["demo (make demo)"], out = timed(["make", "demo"], clone, env, work / "demo.log")
    total = time.monotonic() - t_all
    setup = times["git clone"] + times["venv + packages (make install)"] + times["models (make models)"]
    m = re.search(r"^run folder: (.+)$", out, re.M)
    run_dir = Path(m.group(1).strip()) if m else None

    pip_s = None
    if args.pip_reference:  # the same pins into a second venv of the clone, by pip, from a cold cache of its own
        pip_env = {**env, "INSTALLER": "pip", "PIP_CACHE_DIR": str(work / "pip-cache-reference")}
        pip_s, _ = timed(["make", "install", "VENV=.venv-pip-reference"], clone, pip_env, work / "pip.log")

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"clone -> first report on {os.cpu_count()} cores, HEAD {head.strip()}")
    print(f"{'phase':<44} {'this run':>9} {'reference':>10}")
    for name, s in times.items():
        ref = REFERENCE["demo run"] if name.startswith("demo") else None
        print(f"{name:<44} {mmss(s):>9} {mmss(ref):>10}")
    print(f"{'set-up (clone, packages, models)':<44} {mmss(setup):>9} {mmss(REFERENCE['set-up']):>10}")
    print(f"{'clone -> report':<44} {mmss(total):>9} {mmss(REFERENCE['clone -> report']):>10}"
          f"   target under {mmss(TARGET_S)}")
    if pip_s is not None:
        print(f"{'packages with pip instead (INSTALLER=pip)':<44} {mmss(pip_s):>9}")
    if run_dir is not None and (run_dir / "manifest.json").exists():
        print(f"the demo run, {run_dir.name}:")
        print_split(run_split(run_dir))
    if args.keep:
        print(f"kept: {clone} and {work}")
    else:
        shutil.rmtree(clone, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
