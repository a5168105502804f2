"""Time-to-ready of vLLM serving the embedded target, and where it went (figures only; no pass/fail).

Each start goes through the harness as a run's servers do (measure.harness.serve), so it is recorded in
<log-dir>/servers.jsonl with its `startup` facts; its ready_s is split as the servers table splits it
(specbook.report.tables.start_breakdown over the parts its log tells: imports, spawn, setup, weights, compile,
graphs, KV cache, ready); the last line gives the median of each part over the starts. Run under the shared
engine lock:
  flock /tmp/specbook-engine.lock .venv/bin/python benchmarks/server_start.py --repeats 2
On a GPU, `--no-enforce-eager --max-num-seqs 2` starts with compilation and CUDA graphs (the compile cache is
specbook's, shared by the starts: the first may compile, the others load).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from specbook.engines import EngineConfig, get_engine
from specbook.engines.base import START_PARTS
from specbook.measure.harness import serve
from specbook.models import TARGET
from specbook.report.tables import describe_start, start_breakdown
from specbook.store.runstore import RunContext

SPECS = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
}


def _parts_line(label: str, parts: dict[str, float]) -> str:
    return f"{label}: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in parts.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=TARGET, help="embedded name, path or hub id (default: %(default)s)")
    ap.add_argument("--spec", choices=sorted(SPECS), default="none", help="speculation to configure")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-num-seqs", type=int, default=None, help="sequences at once (sets the graph sizes)")
    ap.add_argument("--no-enforce-eager", action="store_true", help="let vLLM compile (much slower start)")
    ap.add_argument("--log-dir", type=Path, default=None,
                    help="keep the servers' logs and records here (default: a temp folder)")
    args = ap.parse_args()

    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="specbook-server-start-"))
    cfg = EngineConfig(model=args.model, speculative_config=SPECS[args.spec], enforce_eager=not args.no_enforce_eager,
                       max_num_seqs=args.max_num_seqs)
    versions = get_engine(cfg.engine).probe_versions()
    print(f"engine {versions.get('vllm_dist')} {versions.get('vllm')}, torch {versions.get('torch')}, "
          f"model {args.model}, spec {args.spec}, enforce_eager {cfg.enforce_eager}")
    run = RunContext(log_dir)
    ready, teardown, breakdowns = [], [], []
    for i in range(args.repeats):
        with serve(cfg, run, f"start-{i}") as server:
            if i == 0:
                print("argv: " + " ".join(server.managed.argv[1:]))
                print("env: " + " ".join(f"{k}={v}" for k, v in sorted(server.managed.spec.env.items())))
            t0 = time.monotonic()
        teardown.append(time.monotonic() - t0)
        record = run.servers()[-1]  # as the harness recorded it: ready_s and the log's startup facts
        ready.append(record.ready_s)
        breakdowns.append(start_breakdown(record.startup, record.ready_s))
        print(f"run {i}: ready {record.ready_s:.1f} s = {describe_start(breakdowns[-1], record.startup)}; "
              f"teardown {teardown[-1]:.1f} s, log {run.run_dir / (record.log_path or '')}")
    print(f"recorded in {run.run_dir / 'servers.jsonl'}")
    print(f"time-to-ready over {len(ready)} run(s): median {statistics.median(ready):.1f} s, "
          f"min {min(ready):.1f} s, max {max(ready):.1f} s; teardown median {statistics.median(teardown):.1f} s")
    medians = {name: statistics.median(b.get(name, 0.0) for b in breakdowns)
               for name in START_PARTS if any(name in b for b in breakdowns)}
    print(_parts_line(f"median of each part over {len(breakdowns)} start(s)", medians))


if __name__ == "__main__":
    main()
