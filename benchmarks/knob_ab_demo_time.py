"""Where the knob A/B demo's wall time goes (target: about 10 minutes on 2 cores). Prints figures only.

usage: python benchmarks/knob_ab_demo_time.py [RUN_DIR]
       with no RUN_DIR it runs `specbook run knob_ab -f params/knob_ab/cpu-demo.yaml` first.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from specbook.manifest import read_manifest


def main() -> None:
    if len(sys.argv) > 1:
        run_dir = Path(sys.argv[1])
    else:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "specbook", "run", "knob_ab", "-f", "params/knob_ab/cpu-demo.yaml"],
                              capture_output=True, text=True, check=True)
        print(f"specbook run wall: {time.monotonic() - t0:.0f} s")
        run_dir = Path(re.search(r"^run folder: (.+)$", proc.stdout, re.M).group(1).strip())
    manifest = read_manifest(run_dir)
    runs = pd.read_parquet(run_dir / "data" / "runs.parquet")
    print(f"run folder: {run_dir}")
    print(f"notebook run (manifest): {manifest.duration_s:.0f} s, status {manifest.status}")
    print(f"server runs: {len(runs)}; server start (ready_s) total {runs['ready_s'].sum():.0f} s, "
          f"median {runs['ready_s'].median():.1f} s")
    print(f"workload (requests) total {runs['wall_s'].sum():.0f} s; completion tokens {int(runs['completion_tokens'].sum())}; "
          f"tok/s per run median {runs['tok_s'].median():.1f} (min {runs['tok_s'].min():.1f}, max {runs['tok_s'].max():.1f})")
    other = manifest.duration_s - runs["ready_s"].sum() - runs["wall_s"].sum()
    print(f"everything else (flush waits, teardown, analysis, render): {other:.0f} s")
    print(runs[["run_id", "ready_s", "wall_s", "completion_tokens", "tok_s", "counter_al"]].to_string(index=False))


if __name__ == "__main__":
    main()
