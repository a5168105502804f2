"""What a trace pass costs: tok/s of the same requests on the same server config, tracing off vs on
(vLLM: specbook's trace plugin; llama.cpp: `-v` debug logging). Prints figures only; the trace pass is
untimed in every report, so this says how much longer a pass takes, not a correction to any figure.

usage: python benchmarks/trace_overhead.py [ENGINE:LANE ...] [--model PATH] [--draft PATH] [--extra ARGS]
       (default vllm:draft llamacpp:draft; the embedded target and its int4 draft)
       LANE: draft (draft model, k=4) or ngram (k=4); requests one at a time, greedy, 64 tokens.
       On a GPU host: --model /tmp/hf --draft /tmp/hf --extra "--gpu-memory-utilization 0.3".

       python benchmarks/trace_overhead.py --off-cost [--pairs N] [vllm:LANE]
       What the vLLM plugin costs when installed but off (the timed phase of a server that traces and profiles
       later, cross_engine since issue 27): decode tok/s of a server launched with $SPECBOOK_TRACE_DIR and
       $SPECBOOK_STEP_TIMING_DIR (plugin and step timer installed, their switch files absent) against one
       launched without, in N pairs, the pair's first server alternating (start order moves a pair's figures);
       prints each pair and the ratio installed-off / without as a geometric mean with its 95% t interval, and
       the load average at each server.
"""

from __future__ import annotations

import argparse
import shlex
import tempfile
import time
from pathlib import Path

from specbook.engines import EngineConfig, get_engine, launch
from specbook.measure.harness import Server
from specbook.measure.tracepass import trace_pass, traced_config
from specbook.models import DRAFT_INT4, TARGET
from specbook.serve.client import ChatRequest

SPECS = {
    "draft": {"method": "draft_model", "num_speculative_tokens": 4},
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 3},
}
ENGINE_ARGS = {"vllm": {"dtype": "bfloat16"}, "llamacpp": {"extra_args": ["-t", "2"]}}
PROMPTS = ["Write a short paragraph explaining how a bicycle works.",
           "What is the capital of France? Answer and then describe the city briefly.",
           "Repeat this list 3 times, one copy per line: apple, banana, cherry, date, fig"]
REQUESTS = [ChatRequest(prompt_id=f"p{i}", messages=[{"role": "user", "content": p}], max_tokens=64)
            for i, p in enumerate(PROMPTS)]


def _serve_and_time(cfg: EngineConfig, folder: Path, traced: bool) -> tuple[float, int]:
    name = f"{cfg.engine}-{'traced' if traced else 'plain'}"
    if traced:
        cfg = traced_config(cfg, folder / "trace")
    with launch(cfg, name=name, log_path=folder / f"{name}.log") as managed:
        server = Server(managed, get_engine(cfg.engine), cfg, {})
        server.send(REQUESTS[:1])  # warm-up
        if traced:
            ts = trace_pass(server, REQUESTS, folder / "trace", flush_wait_s=0)
            return ts.wall_s, ts.output_tokens
        t0 = time.monotonic()
        tokens = sum(int(server.post_raw(r)["usage"]["completion_tokens"]) for r in REQUESTS)
        return time.monotonic() - t0, tokens


def decode_tok_s(records: list) -> float:
    """Decode tokens per second over streamed records: tokens after the first over the time after the first."""
    tokens = sum(r.completion_tokens - 1 for r in records if r.error is None and (r.completion_tokens or 0) > 1)
    wall = sum(r.wall_s - r.ttft_s for r in records if r.error is None and (r.completion_tokens or 0) > 1)
    return tokens / wall if wall > 0 else float("nan")


def ratio_interval(pairs: list[tuple[float, float]], level: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of a / b over the pairs and its `level` t interval (on the log ratios): (ratio, lo, hi)."""
    import math
    import statistics

    from scipy import stats

    logs = [math.log(a / b) for a, b in pairs]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), float("nan"), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _off_server_tok_s(cfg: EngineConfig, folder: Path, installed: bool) -> tuple[float, str]:
    import os

    from specbook.engines.vllm.trace_plugin import STEP_TIMING_DIR_ENV, TRACE_DIR_ENV

    name = f"vllm-{'installed-off' if installed else 'without'}"
    if installed:
        cfg = cfg.model_copy(update={"env": {**cfg.env, TRACE_DIR_ENV: str(folder / "trace"),
                                             STEP_TIMING_DIR_ENV: str(folder / "steps")}})
    with launch(cfg, name=name, log_path=folder / f"{name}.log") as managed:
        server = Server(managed, get_engine(cfg.engine), cfg, {})
        server.send(REQUESTS[:1])  # warm-up
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        rate = decode_tok_s(server.send(REQUESTS * 2))
    if installed:  # the plugin was there and recorded nothing: what this measures is its cost when off
        status = list((folder / "trace").glob("*.status.json"))
        records = [p for p in (folder / "trace").glob("*.jsonl") if p.stat().st_size]
        steps = [p for p in (folder / "steps").glob("*.jsonl") if p.stat().st_size]
        if not status or records or steps:
            raise SystemExit(f"{name}: plugin not installed or not off (status {status}, records {records + steps})")
    return rate, load


def off_cost(cfg: EngineConfig, pairs: int) -> None:
    measured = []
    print(f"{'pair':>4} {'first':>14} {'installed-off tok/s':>20} {'without tok/s':>14} {'ratio':>7}  load (1/5/15 min)")
    for i in range(pairs):
        order = [True, False] if i % 2 == 0 else [False, True]
        got = {}
        for installed in order:
            with tempfile.TemporaryDirectory() as tmp:
                got[installed] = _off_server_tok_s(cfg, Path(tmp), installed)
        measured.append((got[True][0], got[False][0]))
        print(f"{i:4d} {'installed-off' if order[0] else 'without':>14} {got[True][0]:20.2f} {got[False][0]:14.2f} "
              f"{got[True][0] / got[False][0]:7.3f}  {got[True][1]} / {got[False][1]}", flush=True)
    ratio, lo, hi = ratio_interval(measured)
    print(f"installed-off / without: {ratio:.3f} (95% CI {lo:.3f}-{hi:.3f}, {pairs} pairs, first server alternating)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lanes", nargs="*", default=None)
    ap.add_argument("--off-cost", action="store_true", help="vLLM plugin installed and off vs without, in pairs")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--model", default=TARGET)
    ap.add_argument("--draft", default=DRAFT_INT4)
    ap.add_argument("--extra", default="", help="extra server arguments (vLLM), one string")
    args = ap.parse_args()
    if args.off_cost:
        item = (args.lanes or ["vllm:draft"])[0]
        engine, lane = item.split(":")
        if engine != "vllm":
            raise SystemExit("--off-cost measures vLLM's plugin: give vllm:LANE")
        spec = {**SPECS[lane], **({"model": args.draft} if lane == "draft" else {})}
        extra = {"extra_args": shlex.split(args.extra)} if args.extra else {}
        off_cost(EngineConfig(engine="vllm", model=args.model, served_model_name="smollm2", max_num_seqs=1,
                              speculative_config=spec, **{**ENGINE_ARGS["vllm"], **extra}), args.pairs)
        return
    args.lanes = args.lanes or ["vllm:draft", "llamacpp:draft"]
    print(f"{'engine:lane':18} {'plain tok/s':>12} {'traced tok/s':>13} {'traced/plain':>13}")
    for item in args.lanes:
        engine, lane = item.split(":")
        spec = {**SPECS[lane], **({"model": args.draft} if lane == "draft" else {})}
        engine_args = dict(ENGINE_ARGS[engine])
        if engine == "vllm" and args.extra:
            engine_args["extra_args"] = shlex.split(args.extra)
        cfg = EngineConfig(engine=engine, model=args.model, served_model_name="smollm2", max_num_seqs=1,
                           speculative_config=spec, **engine_args)
        with tempfile.TemporaryDirectory() as tmp:
            plain_s, plain_n = _serve_and_time(cfg, Path(tmp), traced=False)
            traced_s, traced_n = _serve_and_time(cfg, Path(tmp), traced=True)
        plain, traced = plain_n / plain_s, traced_n / traced_s
        print(f"{item:18} {plain:12.2f} {traced:13.2f} {traced / plain:13.2f}   ({plain_n} / {traced_n} tokens)",
              flush=True)


if __name__ == "__main__":
    main()
