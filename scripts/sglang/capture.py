"""Capture verbatim SGLang output on the GPU host for specbook's parser and adapter tests (tests/fixtures/sglang/).

Servers start through specbook's own launcher (specbook.engines.launch: the adapter's argv and env, readiness,
teardown), on the embedded SmolLM2-135M-Instruct:

    python3 scripts/sglang/capture.py OUTDIR           one eager server with the int4 draft (STANDALONE k=4, 4
                                                       running requests): /v1/models, /server_info, /metrics before
                                                       and after 8 non-streamed chat requests (`return_meta_info`:
                                                       SGLang's own per-request counts), its log
    python3 scripts/sglang/capture.py OUTDIR --graphs  the kit check: a STANDALONE (fp8 draft, k=4) and an NGRAM
                                                       (k=4) server with CUDA graphs, 16 running requests, each
                                                       asked one chat request; their logs
    python3 scripts/sglang/capture.py OUTDIR --step-timer  the step timer's check on the real engine: the same two
                                                       servers (1 running request), each started through
                                                       specbook's launcher and profiled
                                                       (specbook.measure.costsplit.profiled_pass, 2 prompts): the
                                                       split (split-NAME.json), its step lines, status files and
                                                       log (NAME/)

(env: SPECBOOK_SGLANG_SITE, PYTHONPATH with specbook's lib). Everything is written verbatim into OUTDIR; what it
says is read by the tests, not here (only a summary line per server is printed).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

from specbook.engines import EngineConfig, get_engine, launch
from specbook.models import DRAFT_FP8, DRAFT_INT4, TARGET

PROMPTS = [
    "Count from 1 to 30, one number per line.",
    "What is the capital of France? Answer and then describe the city briefly.",
    "Write a short paragraph explaining how a bicycle works.",
    "List the first ten prime numbers and say why each is prime.",
    "Translate into German: The weather is nice today and we will go for a walk.",
    "Summarize in two sentences: the Eiffel Tower was built for the 1889 World's Fair in Paris.",
    "Write the word 'yes' 20 times.",
    "Explain what a hash table is to a new programmer.",
]
GRAPH_SERVERS = {"standalone": {"method": "draft_model", "model": DRAFT_FP8, "num_speculative_tokens": 4},
                 "ngram": {"method": "ngram", "num_speculative_tokens": 4}}


def get(base_url: str, path: str) -> str:
    with urllib.request.urlopen(base_url + path, timeout=10) as resp:
        return resp.read().decode("utf-8", errors="replace")


def chat(base_url: str, prompt: str, **extra: object) -> dict:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": prompt}], "max_tokens": 128,
            "temperature": 0, **extra}
    req = urllib.request.Request(base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def config(spec: dict, *, eager: bool, running: int) -> EngineConfig:
    return EngineConfig(engine="sglang", model=TARGET, served_model_name="smollm2", max_num_seqs=running,
                        dtype="bfloat16", enforce_eager=eager, extra_args=["--mem-fraction-static", "0.2"],
                        speculative_config=spec)


def capture(out: Path) -> None:
    cfg = config({"method": "draft_model", "model": DRAFT_INT4, "num_speculative_tokens": 4}, eager=True, running=4)
    t0 = time.monotonic()
    with launch(cfg, name="capture", log_path=out / "server.log") as srv:
        ready_s = time.monotonic() - t0
        (out / "argv.json").write_text(json.dumps(srv.spec.argv, indent=1))
        (out / "versions.json").write_text(json.dumps(get_engine("sglang").probe_versions(), indent=1))
        for path, name in (("/v1/models", "models.json"), ("/server_info", "server_info.json"),
                           ("/metrics", "metrics-before.txt")):
            (out / name).write_text(get(srv.base_url, path))
        responses = [chat(srv.base_url, prompt, return_meta_info=True) for prompt in PROMPTS]
        (out / "responses.json").write_text(json.dumps(responses, indent=1))
        # the tokenizer adds a request's counters as it finishes, before the next request's response: all are in
        (out / "metrics-after.txt").write_text(get(srv.base_url, "/metrics"))
    verify = sum(r["choices"][0].get("meta_info", {}).get("spec_verify_ct", 0) for r in responses)
    tokens = sum(r["usage"]["completion_tokens"] for r in responses)
    print(f"capture: ready in {ready_s:.0f} s; {len(PROMPTS)} requests, {tokens} completion tokens, "
          f"{verify} verify steps")


def graphs(out: Path) -> None:
    for name, spec in GRAPH_SERVERS.items():
        t0 = time.monotonic()
        with launch(config(spec, eager=False, running=16), name=name, log_path=out / f"server-{name}-graphs.log") as srv:
            ready_s = time.monotonic() - t0
            tokens = chat(srv.base_url, PROMPTS[0])["usage"]["completion_tokens"]
        print(f"capture --graphs: {name} ready in {ready_s:.0f} s; one request, {tokens} completion tokens")


def step_timer(out: Path) -> None:
    from dataclasses import asdict

    from specbook.measure import costsplit
    from specbook.serve.client import ChatRequest
    from specbook.store.runstore import RunContext

    requests = [ChatRequest(prompt_id=f"p{i}", messages=[{"role": "user", "content": text}], max_tokens=128)
                for i, text in enumerate(PROMPTS[:2])]
    for name, spec in GRAPH_SERVERS.items():
        t0 = time.monotonic()
        split = costsplit.profiled_pass(config(spec, eager=False, running=1), requests, RunContext(out / name),
                                        name=f"prof-{name}", lane=name)
        (out / f"split-{name}.json").write_text(json.dumps(asdict(split), indent=1))
        parts = ", ".join(f"{part} {ms:.3f}" for part, ms in split.parts_ms.items())
        print(f"capture --step-timer: {name} in {time.monotonic() - t0:.0f} s; {split.steps} decode steps of "
              f"{split.step_ms:.3f} ms: {parts}; overhead {split.overhead:.3f}")


MODES = {"--graphs": graphs, "--step-timer": step_timer}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    MODES.get(argv[1] if len(argv) > 1 else "", capture)(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
