"""Capture verbatim SGLang output on the GPU host for specbook's parser and adapter tests (tests/fixtures/sglang/).

One SGLang server (the embedded SmolLM2-135M-Instruct with its int4 draft model, STANDALONE k=4, eager, 4
running requests), started the way specbook's adapter starts it, then: /health, /v1/models, /server_info,
/metrics before and after 8 chat requests (non-streamed, with `return_meta_info` for SGLang's per-request
spec_verify_ct), and the server's log. Everything is written verbatim into OUTDIR; what it says is read by the
tests, not here (only a summary line is printed).

    python3 scripts/sglang/capture.py OUTDIR        (env: SPECBOOK_SGLANG_SITE, PYTHONPATH with specbook's lib)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PORT = 31871
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


def get(path: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return 0, repr(exc)


def post(path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def main(out: Path) -> int:
    from specbook.engines.base import EngineConfig
    from specbook.engines.registry import get_engine

    out.mkdir(parents=True, exist_ok=True)
    engine = get_engine("sglang")
    cfg = EngineConfig(engine="sglang", model="smollm2-135m-instruct", served_model_name="smollm2", max_num_seqs=4,
                       dtype="bfloat16", enforce_eager=True, extra_args=["--mem-fraction-static", "0.2"],
                       speculative_config={"method": "draft_model", "model": "smollm2-135m-instruct-int4g32",
                                           "num_speculative_tokens": 4})
    argv = engine.build_argv(cfg, host="127.0.0.1", port=PORT)
    env = {**os.environ, **engine.build_env(cfg)}
    (out / "argv.json").write_text(json.dumps(argv, indent=1))
    (out / "versions.json").write_text(json.dumps(engine.probe_versions(), indent=1))
    log = (out / "server.log").open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while time.monotonic() - t0 < 400:
            if proc.poll() is not None:
                print(f"capture: SGLang exited with {proc.returncode} before it was ready (see server.log)")
                return 1
            if get("/health", timeout=5)[0] == 200:
                break
            time.sleep(1)
        else:
            print("capture: SGLang not ready in 400 s")
            return 1
        ready_s = time.monotonic() - t0
        for path, name in (("/v1/models", "models.json"), ("/server_info", "server_info.json"),
                           ("/metrics", "metrics-before.txt")):
            status, text = get(path)
            (out / name).write_text(text)
        responses = []
        for prompt in PROMPTS:
            responses.append(post("/v1/chat/completions", {
                "model": "smollm2", "messages": [{"role": "user", "content": prompt}], "max_tokens": 128,
                "temperature": 0, "return_meta_info": True}))
        (out / "responses.json").write_text(json.dumps(responses, indent=1))
        time.sleep(1)  # the tokenizer's counters are added as requests finish: all have
        (out / "metrics-after.txt").write_text(get("/metrics")[1])
        verify = sum(r["choices"][0].get("meta_info", {}).get("spec_verify_ct", 0) for r in responses)
        tokens = sum(r["usage"]["completion_tokens"] for r in responses)
        print(f"capture: ready in {ready_s:.0f} s; 8 requests, {tokens} completion tokens, {verify} verify steps")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
