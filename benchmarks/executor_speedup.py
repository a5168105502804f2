"""Wall time of the same experiment with the local executor and with Ray, side by side, and the speed-up.

    .venv/bin/python benchmarks/executor_speedup.py                                   # llama.cpp knob A/B, this host
    .venv/bin/python benchmarks/executor_speedup.py -f params/knob_ab/h200-attention-backend-both.yaml  # GPU host
    .venv/bin/python benchmarks/executor_speedup.py --ray-address auto                # an existing cluster

Each run is a whole `specbook run` (servers, notebook, report) in a subprocess; the figures are its wall time,
the sum of its units' server lifetimes (from servers.jsonl), the slots Ray used and whether both runs reached
the same verdicts. The reference is the local executor on the same host and params.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(experiment: str, params: str, overrides: list[str], outputs: Path, executor: list[str]) -> dict:
    cmd = [sys.executable, "-m", "specbook", "run", experiment, "-f", params, "--outputs", str(outputs), *executor]
    for o in overrides:
        cmd += ["-p", o]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(executor) or 'local'} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    (run_dir,) = outputs.glob(f"{experiment}/*")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    server_s = 0.0
    for s in manifest.get("servers", []):
        if s.get("started_at") and s.get("stopped_at"):
            server_s += (datetime.fromisoformat(s["stopped_at"]) - datetime.fromisoformat(s["started_at"])).total_seconds()
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    return {"wall_s": wall, "servers": len(manifest.get("servers", [])), "server_s": server_s,
            "slots": manifest.get("executor", {}).get("slots", 1),
            "gpus": manifest.get("executor", {}).get("gpus", "-"),
            "verdicts": {h["comparison"]: h["verdict"] for h in summary.get("headlines", [])}, "run_dir": run_dir}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", nargs="?", default="knob_ab")
    ap.add_argument("-f", "--params", default="params/knob_ab/cpu-llamacpp.yaml")
    ap.add_argument("-p", "--param", dest="overrides", action="append", default=[])
    ap.add_argument("--ray-address", default=None, help="join this cluster instead of a local Ray instance")
    args = ap.parse_args()
    ray_args = ["--executor", "ray"] + (["--ray-address", args.ray_address] if args.ray_address else [])
    with tempfile.TemporaryDirectory(prefix="specbook-speedup-") as tmp:
        local = run(args.experiment, args.params, args.overrides, Path(tmp) / "local", ["--executor", "local"])
        ray = run(args.experiment, args.params, args.overrides, Path(tmp) / "ray", ray_args)
    print(f"{args.experiment} {args.params} {' '.join('-p ' + o for o in args.overrides)}")
    print(f"{'executor':<10}{'wall s':>9}{'servers':>9}{'server-s':>10}{'slots':>7}")
    for name, r in (("local", local), ("ray", ray)):
        print(f"{name:<10}{r['wall_s']:>9.1f}{r['servers']:>9}{r['server_s']:>10.1f}{r['slots']:>7}")
    print(f"speed-up (local wall / ray wall): {local['wall_s'] / ray['wall_s']:.2f}x on {ray['slots']} slot(s)")
    print(f"same verdicts: {local['verdicts'] == ray['verdicts']}  {ray['verdicts']}")


if __name__ == "__main__":
    main()
