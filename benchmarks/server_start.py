"""Time-to-ready of vLLM serving the embedded target (figures only; no pass/fail).

Run under the shared engine lock:
  flock /tmp/specbook-engine.lock .venv/bin/python benchmarks/server_start.py --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from specbook.engines import EngineConfig, get_engine, launch
from specbook.models import TARGET

SPECS = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=TARGET, help="embedded name, path or hub id (default: %(default)s)")
    ap.add_argument("--spec", choices=sorted(SPECS), default="none", help="speculation to configure")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-enforce-eager", action="store_true", help="let vLLM compile (much slower start)")
    ap.add_argument("--log-dir", type=Path, default=None, help="keep server logs here (default: a temp folder)")
    args = ap.parse_args()

    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="specbook-server-start-"))
    cfg = EngineConfig(model=args.model, speculative_config=SPECS[args.spec], enforce_eager=not args.no_enforce_eager)
    versions = get_engine(cfg.engine).probe_versions()
    print(f"engine {versions.get('vllm_dist')} {versions.get('vllm')}, torch {versions.get('torch')}, "
          f"model {args.model}, spec {args.spec}, enforce_eager {cfg.enforce_eager}")
    ready, teardown = [], []
    for i in range(args.repeats):
        srv = launch(cfg, name=f"start-{i}", log_path=log_dir / f"start-{i}.log")
        with srv:
            ready.append(srv.ready_s)
            t0 = time.monotonic()
        teardown.append(time.monotonic() - t0)
        print(f"run {i}: ready {srv.ready_s:.1f} s, teardown {teardown[-1]:.1f} s, log {srv.log_path}")
    print(f"time-to-ready over {len(ready)} run(s): median {statistics.median(ready):.1f} s, "
          f"min {min(ready):.1f} s, max {max(ready):.1f} s; teardown median {statistics.median(teardown):.1f} s")


if __name__ == "__main__":
    main()
