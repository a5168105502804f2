"""What a trace pass costs: tok/s of the same requests on the same server config, tracing off vs on
(vLLM: specbook's trace plugin; llama.cpp: `-v` debug logging). Prints figures only; the trace pass is
untimed in every report, so this says how much longer a pass takes, not a correction to any figure.

usage: python benchmarks/trace_overhead.py [ENGINE:LANE ...] [--model PATH] [--draft PATH] [--extra ARGS]
       (default vllm:draft llamacpp:draft; the embedded target and its int4 draft)
       LANE: draft (draft model, k=4) or ngram (k=4); requests one at a time, greedy, 64 tokens.
       On a GPU host: --model /tmp/hf --draft /tmp/hf --extra "--gpu-memory-utilization 0.3".
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lanes", nargs="*", default=["vllm:draft", "llamacpp:draft"])
    ap.add_argument("--model", default=TARGET)
    ap.add_argument("--draft", default=DRAFT_INT4)
    ap.add_argument("--extra", default="", help="extra server arguments (vLLM), one string")
    args = ap.parse_args()
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
