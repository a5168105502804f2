"""How fast the faults of issue 26 end, on real servers: figures printed beside the issue's, never asserted.

usage: python benchmarks/fault_times.py [--engine llamacpp|vllm] [--ctrl-c-engine vllm] [--stall 10]
                                        [--cases ctrl-c warmup dead runs] [--out DIR]

What is measured (each on a fresh server through specbook's harness, in a child process that stands for the
kernel: the harness is called from inside a running event loop, as a notebook cell is, and SIGINT raises there):
  ctrl-c while hung   the server is SIGSTOPped 2 s into a measured window of streamed requests, SIGINT reaches the
                      child 1 s later: seconds until every server process is gone, and until the child has exited.
                      The issue's figure, printed beside it, is vLLM-CPU's (uvicorn waited for the client's open
                      streams).
  hang in warm-up     the server is SIGSTOPped, then a warm-up `Server.send` with a stall bound of --stall s:
                      seconds to ServerHungError (the issue: no error while it waited).
  dead to failed      SIGKILL of the server 1.5 s into a window, with the runner's SPECBOOK_RUN_TOKEN in the
                      environment as in a run: seconds until servers.jsonl records it `failed` (the issue's
                      figure printed beside it).
  two runs together   two `specbook run knob_ab -f params/knob_ab/cpu-llamacpp.yaml` (1 sweep, 2 questions)
                      started in the same second with the host lock (a private lock file): what each did
                      (waited how long, for whom), their tok/s, then a third with --no-wait while one holds it.
                      The issue: both `ok`, each far slower than alone, no warning anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
from pathlib import Path
from specbook.measure import harness
from specbook.serve.client import ChatRequest
from specbook.engines import EngineConfig
from specbook.models import TARGET
from specbook.store.runstore import RunContext

engine, what, run_dir, stall = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
extra = ["-t", "2"] if engine == "llamacpp" else []
env = {"VLLM_CPU_KVCACHE_SPACE": "1"} if engine == "vllm" else {}
cfg = EngineConfig(engine=engine, model=TARGET, served_model_name="smollm2", max_num_seqs=4, max_model_len=1024,
                   extra_args=extra, env=env)
prompt = "Write a long story about a bicycle that travels across the world, chapter by chapter."
reqs = [ChatRequest(prompt_id=f"p{i}", messages=[{"role": "user", "content": prompt}], max_tokens=400)
        for i in range(4)]
run = RunContext(run_dir)


def book():
    with harness.serve(cfg, run, what) as server:
        pids = [server.managed.pid] + [p.pid for p in __import__("psutil").Process(server.managed.pid).children(True)]
        print("READY " + json.dumps(pids), flush=True)
        if what == "warmup":
            sys.stdin.readline()  # the parent has stopped the server
            t0 = time.monotonic()
            try:
                server.send(reqs[:1], stall_timeout_s=stall)
            finally:
                print(f"RAISED {time.monotonic() - t0:.2f}", flush=True)
        else:
            print("MEASURING", flush=True)
            server.measure(reqs, concurrency=4, stall_timeout_s=600)


async def cell():  # as a notebook cell runs: in a running event loop (the client then runs in a worker thread)
    book()


try:
    import asyncio

    asyncio.new_event_loop().run_until_complete(cell())  # no asyncio.run: Ctrl-C raises, as in a kernel
except BaseException as exc:
    print(f"ENDED {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}", flush=True)
    raise SystemExit(1)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "lib") + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "SPECBOOK_ROOT": str(ROOT)}


def _child(engine: str, what: str, run_dir: Path, stall: float, env: dict[str, str] | None = None):
    return subprocess.Popen([sys.executable, "-c", CHILD, engine, what, str(run_dir), str(stall)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env or _env())


def _line(proc: subprocess.Popen[str], prefix: str) -> str:
    for line in proc.stdout:
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    raise RuntimeError(f"the child ended before saying {prefix!r} (exit {proc.wait()})")


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


def ctrl_c_hung(engine: str, out: Path) -> dict[str, float]:
    proc = _child(engine, "ctrlc", out / f"ctrlc-{engine}", 600)
    pids = json.loads(_line(proc, "READY "))
    _line(proc, "MEASURING")
    time.sleep(2.0)
    os.kill(pids[0], signal.SIGSTOP)
    time.sleep(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    gone = None
    while proc.poll() is None or gone is None:
        if gone is None and not _alive(pids):
            gone = time.monotonic() - t0
        if time.monotonic() - t0 > 120:
            break
        time.sleep(0.02)
    exited = time.monotonic() - t0
    proc.wait()
    return {"servers_gone_s": round(gone if gone is not None else float("nan"), 2), "exit_s": round(exited, 2)}


def warmup_hang(engine: str, out: Path, stall: float) -> dict[str, float]:
    proc = _child(engine, "warmup", out / f"warmup-{engine}", stall)
    pids = json.loads(_line(proc, "READY "))
    os.kill(pids[0], signal.SIGSTOP)
    t0 = time.monotonic()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    raised = float(_line(proc, "RAISED "))
    ended = _line(proc, "ENDED ")
    proc.wait()
    return {"stall_bound_s": stall, "error_after_s": raised, "child_exit_s": round(time.monotonic() - t0, 2),
            "error": ended[:120]}


def dead_to_failed(engine: str, out: Path) -> dict[str, float]:
    run_dir = out / f"dead-{engine}"
    env = {**_env(), "SPECBOOK_RUN_TOKEN": "fault-times-0123456789"}
    proc = _child(engine, "dead", run_dir, 600, env)
    pids = json.loads(_line(proc, "READY "))
    _line(proc, "MEASURING")
    time.sleep(1.5)
    t0 = time.monotonic()
    os.kill(pids[0], signal.SIGKILL)
    servers = run_dir / "servers.jsonl"
    recorded = None
    while time.monotonic() - t0 < 120:
        if servers.exists() and '"failed"' in servers.read_text():
            recorded = time.monotonic() - t0
            break
        time.sleep(0.02)
    ended = _line(proc, "ENDED ")
    proc.wait()
    return {"recorded_failed_s": round(recorded if recorded is not None else float("nan"), 2), "error": ended[:160]}


def _run_cmd(out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "specbook", "run", "knob_ab", "-f", str(ROOT / "params/knob_ab/cpu-llamacpp.yaml"),
            "-p", "sweeps=1", "-p", "workload.subset=2", "--outputs", str(out), "--no-progress", *flags]


def _manifest(stdout: str) -> dict:
    folder = next((ln.split(":", 1)[1].strip() for ln in stdout.splitlines() if ln.startswith("run folder:")), None)
    if folder is None:
        return {}
    return {**json.loads((Path(folder) / "manifest.json").read_text()), "_folder": folder}


def two_runs(out: Path) -> dict[str, object]:
    env = {**_env(), "SPECBOOK_HOST_LOCK": str(out / "host.lock")}
    runs = out / "runs"
    t0 = time.monotonic()
    a = subprocess.Popen(_run_cmd(runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    b = subprocess.Popen(_run_cmd(runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    results = {}
    for name, proc in (("first", a), ("second", b)):
        stdout, stderr = proc.communicate(timeout=900)
        m = _manifest(stdout)
        waits = [ln for ln in stderr.splitlines() if "waiting for the host lock" in ln]
        results[name] = {"exit": proc.returncode, "status": m.get("status"), "wall_s": round(time.monotonic() - t0, 1),
                         "host_lock": m.get("host_lock"), "said": waits[:1],
                         "tok_s": _window_tok_s(m), "contended_windows": _contended(m)}
    # a third with --no-wait while one holds the lock
    holder = subprocess.Popen(_run_cmd(runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lock_file = out / "host.lock"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (lock_file.exists() and lock_file.read_text().strip()):
        time.sleep(0.1)
    t1 = time.monotonic()
    refused = subprocess.run(_run_cmd(runs, "--no-wait"), capture_output=True, text=True, env=env, timeout=300)
    results["no_wait"] = {"exit": refused.returncode, "after_s": round(time.monotonic() - t1, 1),
                          "error": next((ln for ln in refused.stderr.splitlines() if ln.startswith("error:")), "")}
    holder.communicate(timeout=900)
    return results


def _window_tok_s(manifest: dict) -> float | None:
    """Output tok/s over the run's measured windows (the knob A/B's runs frame)."""
    if not manifest:
        return None
    import pandas as pd

    path = Path(manifest["_folder"]) / "data" / "runs.parquet"
    if not path.exists():
        return None
    frame = pd.read_parquet(path)
    col = next((c for c in ("tok_s", "output_tok_s") if c in frame.columns), None)
    return round(float(frame[col].mean()), 1) if col else None


def _contended(manifest: dict) -> str | None:
    from specbook.serve import hostload

    folder = Path(manifest.get("_folder", ""))
    records = hostload.read_records(folder)
    return f"{sum(1 for r in records if r.get('contended'))} of {len(records)}" if records else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="llamacpp", choices=["llamacpp", "vllm"])
    ap.add_argument("--ctrl-c-engine", default="vllm", choices=["llamacpp", "vllm"],
                    help="the engine of the Ctrl-C case (vllm: the issue's uvicorn wait)")
    ap.add_argument("--stall", type=float, default=10.0)
    ap.add_argument("--cases", nargs="+", default=["ctrl-c", "warmup", "dead", "runs"],
                    choices=["ctrl-c", "warmup", "dead", "runs"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="fault-times-"))
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    print(f"host: {os.cpu_count()} cores, load average {load:.1f} at start; folder {out}")
    figures = {}
    for engine in dict.fromkeys([args.ctrl_c_engine, args.engine]) if "ctrl-c" in args.cases else []:
        figures[f"ctrl_c_hung[{engine}]"] = ctrl_c_hung(engine, out)
        print(f"Ctrl-C while hung ({engine}): servers gone {figures[f'ctrl_c_hung[{engine}]']['servers_gone_s']} s, "
              f"exit {figures[f'ctrl_c_hung[{engine}]']['exit_s']} s after SIGINT   "
              "(issue, vLLM: 20.3 s / 24.7-25.4 s; documented ~0.5 s)")
    if "warmup" in args.cases:
        figures["warmup_hang"] = w = warmup_hang(args.engine, out, args.stall)
        print(f"hang in warm-up ({args.engine}, stall bound {w['stall_bound_s']:g} s): ServerHungError after "
              f"{w['error_after_s']} s, child out {w['child_exit_s']} s after the stop   (issue: no error in 120 s)")
    if "dead" in args.cases:
        figures["dead_to_failed"] = d = dead_to_failed(args.engine, out)
        print(f"dead server to `failed` ({args.engine}, run token set): recorded {d['recorded_failed_s']} s after the "
              f"SIGKILL   (issue: 8.4 s)\n  error: {d['error']}")
    if "runs" in args.cases:
        figures["two_runs"] = r = two_runs(out)
        for name in ("first", "second"):
            x = r[name]
            print(f"two runs together, {name}: exit {x['exit']}, {x['status']}, done {x['wall_s']} s after both "
                  f"started; lock {x['host_lock']}; tok/s {x['tok_s']}; contended windows {x['contended_windows']}"
                  + (f"; said: {x['said'][0]}" if x["said"] else ""))
        print(f"--no-wait while another run holds the lock: exit {r['no_wait']['exit']} after "
              f"{r['no_wait']['after_s']} s: {r['no_wait']['error'][:200]}   (issue: both ran, 9x slower, silently)")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    (out / "fault_times.json").write_text(json.dumps(figures, indent=1))
    print(f"figures: {out / 'fault_times.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
