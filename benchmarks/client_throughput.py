"""How many requests and tokens per second one client process consumes, and its CPU per request: specbook's
client beside `vllm bench serve`'s, against the same server, printed side by side (issue 29).

usage: python benchmarks/client_throughput.py [--concurrency 16 64 256] [--requests 512] [--max-tokens 64]
                                              [--tokens-per-chunk 1] [--repeats 1] [--transport httpstream]
                                              [--target standin|vllm] [--params params/knob_ab/cpu-demo.yaml]

--target standin (default): benchmarks/standin_server.py in its own process, streaming as fast as it can (no
model; `--tokens-per-chunk` tokens per SSE chunk, as a speculative engine sends several accepted tokens in one).
There the client is the only limit besides the stand-in itself, so req/s shows what a client can consume.
--target vllm: the params file's vLLM-CPU server (launched by specbook's engine adapter); there the engine is the
limit. The two clients' prompts differ there (vLLM's random dataset draws random token ids, specbook sends a
repeated text), so speculation accepts differently and req/s is not equal work, and the process CPU (the server
watch thread included) grows with each run's length: for equal work on a real engine, benchmarks/client_fidelity.py.

Both clients run in this process, alternating per level (ABBA over repeats), on /v1/completions with streamed
usage: vLLM's by its own argument parser and `main` (benchmarks/client_fidelity.py's VllmBench; its CPU timed
around its `benchmark()` coroutine, `--dataset-name random`), specbook's by `specbook.serve.client.run_requests`
(CPU timed around it, the event loop's start included). CPU is the process's CPU time from the OS
(time.process_time), not wall. "per core" = req/s or tok/s divided by the CPU the client used (cores busy):
what one fully busy core of this client would consume. Prints figures only, never asserts timing; on a host
loaded by other processes the figures are loaded figures (the load average is printed beside them).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from specbook.core.paths import project_root  # noqa: E402
from specbook.serve.client import ChatRequest, run_requests_sync  # noqa: E402
from specbook.serve.clientcpu import ClientCpu  # noqa: E402

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_standin(tokens_per_chunk: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "standin_server.py"), "--port", str(port),
                             "--tokens-per-chunk", str(tokens_per_chunk)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "standin serving on ..." once it listens
    if "serving" not in line:
        proc.kill()
        sys.exit(f"the stand-in server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{port}"


def measure_specbook(base_url: str, model: str, n: int, max_tokens: int, conc: int, transport: str) -> dict[str, Any]:
    reqs = [ChatRequest(prompt_id=str(i), prompt=f"prompt {i} " * 8, max_tokens=max_tokens, ignore_eos=True)
            for i in range(n)]
    cpu: list[ClientCpu] = []
    c0, t0 = time.process_time(), time.perf_counter()
    records = run_requests_sync(base_url, model, reqs, concurrency=conc, progress=False, transport=transport,
                                cpu=cpu)
    wall, used = time.perf_counter() - t0, time.process_time() - c0
    ok = [r for r in records if r.error is None]
    return {"requests": len(ok), "tokens": sum(r.completion_tokens or 0 for r in ok), "wall_s": wall, "cpu_s": used,
            "loop_share": cpu[0].loop_share if cpu else float("nan"), "failed": len(records) - len(ok)}


def measure_vllm(bench: Any, base_url: str, model: str, tokenizer: str, n: int, max_tokens: int, conc: int,
                 out: Path, tag: str, log: Any) -> dict[str, Any]:
    host, port = base_url.rsplit("//", 1)[1].rsplit(":", 1)
    argv = ["--backend", "openai", "--endpoint", "/v1/completions", "--host", host, "--port", port,
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", "16",
            "--random-output-len", str(max_tokens), "--ignore-eos", "--num-prompts", str(n),
            "--max-concurrency", str(conc), "--disable-tqdm", "--ready-check-timeout-sec", "0",
            "--save-result", "--result-dir", str(out), "--result-filename", f"{tag}.json"]
    t0 = time.perf_counter()
    cpu = bench.run(argv, log)
    wall = time.perf_counter() - t0
    result = json.loads((out / f"{tag}.json").read_text())
    return {"requests": result["completed"], "tokens": result["total_output_tokens"],
            "wall_s": result.get("duration", wall), "cpu_s": cpu, "loop_share": float("nan"),
            "failed": result.get("failed", n - result["completed"])}


def figures(row: dict[str, Any]) -> dict[str, float]:
    wall, cpu = row["wall_s"], row["cpu_s"]
    cores = cpu / wall if wall > 0 else float("nan")
    return {"req_s": row["requests"] / wall, "tok_s": row["tokens"] / wall,
            "cpu_ms_req": 1000 * cpu / max(row["requests"], 1), "cores": cores,
            "req_s_core": row["requests"] / cpu if cpu > 0 else float("nan"),
            "tok_s_core": row["tokens"] / cpu if cpu > 0 else float("nan")}


def report(rows: list[dict[str, Any]], levels: list[int]) -> None:
    print("\nper run:")
    print(f"{'rep':>3} {'conc':>4} {'client':<9} {'req/s':>8} {'tok/s':>9} {'CPU ms/req':>10} {'cores':>6} "
          f"{'loop':>5} {'failed':>6}")
    for r in rows:
        f = figures(r)
        print(f"{r['repeat']:>3} {r['conc']:>4} {r['client']:<9} {f['req_s']:8.1f} {f['tok_s']:9.0f} "
              f"{f['cpu_ms_req']:10.3f} {f['cores']:6.2f} {r['loop_share']:5.2f} {r['failed']:>6}")
    print("\nside by side (mean over repeats; per core = per CPU-second the client used):")
    print(f"{'conc':>4} {'figure':<16} {'specbook':>10} {'vllm bench':>10}  specbook / vllm")
    for conc in levels:
        for key, label, digits in (("cpu_ms_req", "CPU ms/request", 3), ("req_s", "req/s", 1), ("tok_s", "tok/s", 0),
                                   ("req_s_core", "req/s per core", 1), ("tok_s_core", "tok/s per core", 0)):
            vals = {c: [figures(r)[key] for r in rows if r["conc"] == conc and r["client"] == c]
                    for c in ("specbook", "vllm")}
            a = statistics.fmean(vals["specbook"]) if vals["specbook"] else float("nan")
            b = statistics.fmean(vals["vllm"]) if vals["vllm"] else float("nan")
            print(f"{conc:>4} {label:<16} {a:10.{digits}f} {b:10.{digits}f}  {a / b if b else float('nan'):.3f}")


def main() -> None:
    root = project_root()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--requests", type=int, default=512, help="requests per level and client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--tokens-per-chunk", type=int, default=1, help="the stand-in's tokens per SSE chunk")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--transport", default="httpstream", help="specbook's streamed transport: httpstream or httpx")
    ap.add_argument("--target", choices=("standin", "vllm"), default="standin")
    ap.add_argument("--params", type=Path, default=root / "params/knob_ab/cpu-demo.yaml",
                    help="--target vllm: a params file whose `engine` section is the server to serve")
    ap.add_argument("--tokenizer-model", default="smollm2-135m-instruct",
                    help="the tokenizer vllm bench's random dataset needs (a specbook model name or path)")
    args = ap.parse_args()

    import yaml
    from client_fidelity import VllmBench

    from specbook.engines import launch
    from specbook.engines.base import EngineConfig, resolve_model

    out = Path(tempfile.mkdtemp(prefix="client-throughput-"))
    log = (out / "vllm-bench.log").open("w")
    bench = VllmBench()
    load0 = os.getloadavg()
    managed = None
    if args.target == "standin":
        proc, base_url = start_standin(args.tokens_per_chunk)
        model, tokenizer = "standin", resolve_model(args.tokenizer_model)
    else:
        cfg = EngineConfig(**yaml.safe_load(args.params.read_text())["engine"])
        managed = launch(cfg, name="throughput", log_path=out / "server.log")
        managed.__enter__()
        base_url, model, tokenizer = managed.base_url, managed.model_name or cfg.client_model_name(), resolve_model(cfg.model)
    print(f"target {args.target} at {base_url}; {args.requests} requests of {args.max_tokens} tokens per level, "
          f"{args.tokens_per_chunk if args.target == 'standin' else 'engine'} tokens/chunk; out {out}", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        httpx.get(base_url + "/v1/models", timeout=30, trust_env=False)
        measure_specbook(base_url, model, 32, args.max_tokens, 8, args.transport)  # warm-up, both clients
        measure_vllm(bench, base_url, model, tokenizer, 32, args.max_tokens, 8, out, "warm", log)
        for rep in range(args.repeats):
            for i, conc in enumerate(args.concurrency):
                order = ["specbook", "vllm"] if (rep + i) % 2 == 0 else ["vllm", "specbook"]
                for client in order:
                    if client == "specbook":
                        row = measure_specbook(base_url, model, args.requests, args.max_tokens, conc, args.transport)
                    else:
                        row = measure_vllm(bench, base_url, model, tokenizer, args.requests, args.max_tokens, conc,
                                           out, f"rep{rep}-c{conc}", log)
                    row.update(repeat=rep, conc=conc, client=client)
                    rows.append(row)
                    f = figures(row)
                    print(f"  rep {rep} conc {conc:>3} {client:<8}: {f['req_s']:.1f} req/s, "
                          f"{f['cpu_ms_req']:.3f} CPU ms/req, load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        if managed is not None:
            managed.__exit__(None, None, None)
        else:
            proc.terminate()
            proc.wait(10)
        log.close()
    report(rows, args.concurrency)
    load1 = os.getloadavg()
    print(f"\nload average (1, 5, 15 min): before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} on {os.cpu_count()} cores")
    (out / "rows.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
