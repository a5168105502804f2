"""The knob A/B on Ray: a local Ray instance on this CPU host, two llama.cpp units at once (`-t 1` each).

- (full tier) The same params with `--executor local` and `--executor ray` give the same data (the same frames,
  columns and run ids; the same counter counts per run, greedy llama.cpp being deterministic) and the same
  verdicts; the Ray run records its cluster in the manifest and where each unit ran (two slots) in its rows and
  report.
- A llama-server SIGKILLed mid-run fails only its unit: the other units finish and are saved, the run ends
  failed naming the unit, and `specbook run --resume` re-runs that unit only.
- (full tier) Ctrl-C (SIGINT to the runner) cancels the tasks: the run reads interrupted and no server of it is
  left. The fast tier has Ctrl-C on the local executor (tests/integration/test_harness_faults_real.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pandas as pd
import psutil
import pytest

from specbook.core.paths import project_root
from specbook.run.runguard import RUN_TOKEN_ENV
from specbook.store.manifest import read_manifest
from specbook.store.runstore import RunContext

pytestmark = pytest.mark.e2e

PARAMS = "params/knob_ab/cpu-llamacpp.yaml"
SMALL = ["workload.subset=2", "workload.max_tokens=32"]  # 3 arms x 2 sweeps = 6 llama-servers, ~10 s each
COUNTS = ["counter_drafts", "counter_draft_tokens", "counter_accepted_tokens", "completion_tokens"]


@pytest.fixture(scope="module", autouse=True)
def _llama_server_and_ray():
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.fail("ray is not installed: `make test` installs specbook[ray] (pip install -e '.[ray]'); the Ray "
                    "executor tests need it for a local Ray instance")
    from specbook.engines.llamacpp.adapter import binary_path

    try:
        binary_path()
    except Exception as exc:  # noqa: BLE001 - say why, loudly
        pytest.fail(f"llama-server is needed for the Ray executor tests and is missing: {exc}")


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "specbook", "run", *args]


def _run(args: list[str], timeout: int = 900) -> tuple[subprocess.CompletedProcess, Path | None]:
    proc = subprocess.run(_cmd(*args), cwd=project_root(), capture_output=True, text=True, timeout=timeout)
    folder = next((line.split(": ", 1)[1].strip() for line in proc.stdout.splitlines()
                   if line.startswith("run folder: ")), None)
    return proc, Path(folder) if folder else None


def _book(outputs: Path, *extra: str) -> list[str]:
    args = ["knob_ab", "-f", PARAMS, "--outputs", str(outputs)]
    for o in SMALL:
        args += ["-p", o]
    return [*args, *extra]  # an override in extra comes later and wins


def _llama_servers(runner: psutil.Process) -> list[psutil.Process]:
    found = []
    for p in runner.children(recursive=True):
        try:
            if p.name() == "llama-server":
                found.append(p)
        except psutil.Error:  # a helper process that ended meanwhile
            continue
    return found


def _verdicts(run_dir: Path) -> dict[str, str]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {h["comparison"]: h["verdict"] for h in summary["headlines"]}


@pytest.fixture(scope="module")
def local_and_ray(tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("ray")
    local, local_dir = _run(_book(out / "local", "--executor", "local"))
    assert local.returncode == 0, local.stdout[-2000:] + local.stderr[-4000:]
    ray, ray_dir = _run(_book(out / "ray", "--executor", "ray"))
    assert ray.returncode == 0, ray.stdout[-2000:] + ray.stderr[-4000:]
    assert "Ray: 2 slot(s)" in ray.stderr  # the console says where the units go
    return local_dir, ray_dir


@pytest.mark.slow
def test_ray_and_local_give_the_same_data_and_verdicts(local_and_ray):
    local_dir, ray_dir = local_and_ray
    a, b = RunContext.from_run_dir(local_dir), RunContext.from_run_dir(ray_dir)
    for name in ("runs", "requests", "intervals", "categories"):
        fa, fb = a.load_frame(name), b.load_frame(name)
        assert list(fa.columns) == list(fb.columns), name
        assert len(fa) == len(fb), name
    ra, rb = (c.load_frame("runs").set_index("run_id").sort_index() for c in (a, b))
    assert list(ra.index) == list(rb.index)
    pd.testing.assert_frame_equal(ra[COUNTS], rb[COUNTS])
    assert _verdicts(local_dir) == _verdicts(ray_dir)
    assert sorted(p.name for p in a.logs_dir.glob("*.log") if p.name != "progress.log") == \
        sorted(p.name for p in b.logs_dir.glob("*.log") if p.name != "progress.log")
    assert len(b.servers()) == 6 and all(s.status == "ok" for s in b.servers())


@pytest.mark.slow
def test_the_ray_run_records_its_cluster_and_where_each_unit_ran(local_and_ray):
    local_dir, ray_dir = local_and_ray
    m = read_manifest(ray_dir)
    assert m.status == "ok"
    assert m.executor["executor"] == "ray" and m.executor["slots"] == 2 and m.executor["ray_version"]
    assert len(m.executor["nodes"]) == 1 and m.executor["nodes"][0]["cpus"] >= 2
    runs = RunContext.from_run_dir(ray_dir).load_frame("runs")
    assert set(runs["executor"]) == {"ray"} and set(runs["slot"]) == {0, 1}
    assert all(runs.groupby("declared_arm")["slot"].nunique() == 2)  # spread: every arm on both slots
    assert read_manifest(local_dir).executor == {}
    assert "where each run ran" in (ray_dir / "report.html").read_text()


def _processing(p: psutil.Process) -> bool:
    """The llama-server is answering a request (its /metrics gauge `llamacpp:requests_processing`): a measured
    request, not a readiness probe (knob A/B units send no warm-up)."""
    try:
        argv = p.cmdline()
        port = int(argv[argv.index("--port") + 1])
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2, trust_env=False).text
    except (psutil.Error, ValueError, IndexError, httpx.HTTPError):
        return False
    return any(line.startswith("llamacpp:requests_processing ") and float(line.split()[-1]) > 0
               for line in text.splitlines())


def _kill_a_server_mid_run(stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the third llama-server of the run once it is answering a measured request."""
    seen: list[int] = []
    while not stop.is_set() and not killed:
        for p in psutil.process_iter(["name", "pid"]):
            if p.info["name"] != "llama-server" or p.pid in seen:
                continue
            try:
                if p.environ().get(RUN_TOKEN_ENV) is None:
                    continue
            except psutil.Error:
                continue
            seen.append(p.pid)
            if len(seen) < 3:
                continue
            while not stop.is_set() and p.is_running():
                if _processing(p):
                    p.kill()
                    killed.append(p.pid)
                    return
                time.sleep(0.05)
        time.sleep(0.1)


def test_a_server_killed_mid_run_fails_only_its_unit_and_resume_reruns_only_it(tmp_path):
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_a_server_mid_run, args=(stop, killed), daemon=True)
    killer.start()
    try:
        proc, run_dir = _run(_book(tmp_path, "--executor", "ray"))
    finally:
        stop.set()
        killer.join(5)
    assert killed, "no third llama-server appeared to kill"
    assert proc.returncode != 0 and run_dir is not None
    assert "1 of 6 knob A/B run(s) failed on Ray, the others finished" in proc.stderr, proc.stderr[-3000:]
    runs = RunContext.from_run_dir(run_dir).load_frame("runs")
    failed = runs[runs["status"] == "failed"]
    assert len(failed) == 1 and "ServerDiedError" in failed["error"].iloc[0]
    assert (runs["status"] == "ok").sum() == 5
    assert read_manifest(run_dir).status == "failed"

    resumed = subprocess.run(_cmd("--resume", str(run_dir), "--executor", "ray"), cwd=project_root(),
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
    m = read_manifest(run_dir)
    assert m.status == "ok" and len(m.parts) == 2
    assert m.executor["executor"] == "ray" and m.executor["slots"] == 2 and m.executor["ray_version"]
    runs = RunContext.from_run_dir(run_dir).load_frame("runs")
    assert set(runs["executor"]) == {"ray"} and set(runs["slot"]) <= {0, 1}
    assert sorted(runs.loc[runs["status"] == "ok", "run_id"]) == sorted(set(runs["run_id"]))
    assert (runs["status"] == "ok").sum() == 6  # the failed unit ran again, alone; the 5 were kept
    assert resumed.stderr.count("started on slot") == 1


@pytest.mark.slow
def test_ctrl_c_cancels_the_ray_tasks_and_leaves_no_server(tmp_path):
    # longer units (8 requests of 128 tokens) than the others: both slots' servers surely overlap, even when a
    # loaded host starts one Ray worker late; the run is cut anyway
    longer = ["-p", "workload.subset=8", "-p", "workload.max_tokens=128"]
    proc = subprocess.Popen(_cmd(*_book(tmp_path, "--executor", "ray", *longer)), cwd=project_root(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runner = psutil.Process(proc.pid)
    token = None
    end = time.monotonic() + 240
    while time.monotonic() < end and token is None:  # wait for two servers answering requests at once
        servers = [p for p in _llama_servers(runner) if _processing(p)]
        if len(servers) >= 2:
            try:
                token = servers[0].environ().get(RUN_TOKEN_ENV)
            except psutil.Error:
                continue
        time.sleep(0.1)
    assert token, "the Ray run never had two llama-servers answering requests at once"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    gone_s = time.monotonic() - t0
    print(f"Ctrl-C on a Ray run with two units measuring: runner out after {gone_s:.1f} s")
    assert proc.returncode == 130, err[-3000:]
    left = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.environ().get(RUN_TOKEN_ENV) == token and p.info["name"] == "llama-server":
                left.append(p.pid)
        except psutil.Error:
            continue
    assert left == [], f"llama-server(s) {left} of the run survived Ctrl-C"
    (run_dir,) = tmp_path.glob("knob_ab/*")
    m = read_manifest(run_dir)
    assert m.status == "interrupted"
    assert any(s.status == "interrupted" for s in m.servers), ([s.status for s in m.servers], err[-3000:])
