"""Resume (specbook.run.resume, runner.resume_experiment) and the run guard (specbook.run.runguard); the units of
work a resume keeps or sets aside are tested on their own in test_units.py.

The runner tests execute a real fixture notebook (tests/fixtures/notebooks/units.ipynb) on the real kernel: it
does units of work the way a collect does (skip the done ones, append the done row last) and fails at the unit
FIXTURE_FAIL_AT names. No engine is involved; the guard tests use plain child processes standing for servers.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from specbook.core.errors import NotebookExecutionError, ParamsError, RunError
from specbook.experiments.registry import ExperimentSpec, register_experiment
from specbook.report.view import ran_on_line
from specbook.run import resume, runner
from specbook.run.runner import resume_experiment, run_experiment
from specbook.store.fingerprint import GitInfo, machine_kind
from specbook.store.manifest import Manifest, RunPart, read_manifest, run_status, write_manifest
from specbook.store.runstore import RunContext
from specbook.store.units import Units, register_units

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTEBOOKS = FIXTURES / "notebooks"
SMALL = FIXTURES / "params" / "fixture_good" / "small.yaml"
sys.path.insert(0, str(NOTEBOOKS))
fixture_experiments = importlib.import_module("fixture_experiments")

UNITS = Units(done_frame="units", key=("unit",), frames=("units", "items"), server="unit")
register_experiment(ExperimentSpec("fixture_units", fixture_experiments.FixtureParams, str(NOTEBOOKS / "units.ipynb")))
register_units("fixture_units", UNITS)


# --------------------------------------------------------------------------------------------------
# resume.py alone


def test_redacted_fields_are_named_in_the_override_syntax():
    params = {"engine": {"extra_args": ["--api-key", "***"], "env": {"HF_TOKEN": "***", "X": "1"}},
              "url": "http://u:***@host/x", "note": "a *** b"}
    assert resume.redacted_fields(params) == ["engine.extra_args.1", "engine.env.HF_TOKEN", "url"]
    with pytest.raises(ParamsError) as exc:
        resume.check_redacted(params, Path("/r"))
    assert "-p engine.env.HF_TOKEN=VALUE" in str(exc.value) and "/r/params.yaml" in str(exc.value)
    resume.check_redacted({"a": "1"}, Path("/r"))


def _manifest(**update) -> Manifest:
    m = Manifest(run_id="r1", experiment="knob_ab", started_at="2026-01-01T00:00:00+00:00", params_file="p.yaml",
                 params_name="p", params={}, params_hash="a" * 64, notebook="n.ipynb", kernel="specbook",
                 git=GitInfo(sha="b" * 40), specbook_version="0", python={}, libraries={})
    return m.model_copy(update=update)


def test_check_resumable_refuses_and_records_what_was_overridden():
    m = _manifest()
    ok = dict(experiment=None, params_hash="a" * 64, git_sha="b" * 40)
    with pytest.raises(RunError, match="nothing to resume"):
        resume.check_resumable(m, "ok", **ok)
    with pytest.raises(RunError, match="still marked running"):
        resume.check_resumable(m, "running", **ok)
    with pytest.raises(RunError, match="is a run of 'knob_ab', not 'config_flip'"):
        resume.check_resumable(m, "failed", **{**ok, "experiment": "config_flip"})
    with pytest.raises(ParamsError, match="--allow-params-change"):
        resume.check_resumable(m, "abandoned", **{**ok, "params_hash": "c" * 64})
    with pytest.raises(RunError, match="--allow-git-change"):
        resume.check_resumable(m, "interrupted", **{**ok, "git_sha": "d" * 40})
    assert resume.check_resumable(m, "abandoned", **ok) == []
    forced = resume.check_resumable(m, "failed", experiment="knob_ab", params_hash="c" * 64, git_sha="d" * 40,
                                    allow_params_change=True, allow_git_change=True)
    assert forced == ["params changed: hash aaaaaaaaaaaa -> cccccccccccc", "git changed: bbbbbbbbbbbb -> dddddddddddd"]


H100 = {"gpu": {"nvidia": [{"name": "NVIDIA H100 80GB HBM3", "driver_version": "580.159.04"}]}}
H200 = {"gpu": {"nvidia": [{"name": "NVIDIA H200", "driver_version": "580.159.04"}]}}


def test_machine_kind_is_the_gpus_or_the_cpu_and_ignores_drivers():
    assert machine_kind(H100) == "1 x NVIDIA H100 80GB HBM3"
    newer_driver = {"gpu": {"nvidia": [{"name": "NVIDIA H100 80GB HBM3", "driver_version": "590.1"}]}}
    assert machine_kind(newer_driver) == machine_kind(H100)
    two = {"gpu": {"nvidia": H200["gpu"]["nvidia"] * 2}}
    assert machine_kind(two) == "2 x NVIDIA H200"
    mixed = {"gpu": {"nvidia": H100["gpu"]["nvidia"] + H200["gpu"]["nvidia"]}}
    assert machine_kind(mixed) == "2 GPUs: NVIDIA H100 80GB HBM3, NVIDIA H200"
    cpu = {"cpu": {"model_name": "AMD EPYC 7B13", "threads": 16, "affinity": 2}, "gpu": {}}
    assert machine_kind(cpu) == "CPU AMD EPYC 7B13, 2 threads usable"  # what the process may use, not the host's
    assert machine_kind({}) is None and machine_kind({"cpu": {}, "gpu": {}}) is None


def test_check_resumable_refuses_another_kind_of_machine_unless_allowed():
    m = _manifest(hardware=H100)
    ok = dict(experiment=None, params_hash="a" * 64, git_sha="b" * 40)
    assert resume.check_resumable(m, "interrupted", **ok, machine="1 x NVIDIA H100 80GB HBM3") == []
    with pytest.raises(RunError) as exc:
        resume.check_resumable(m, "interrupted", **ok, machine="1 x NVIDIA H200")
    assert "ran on 1 x NVIDIA H100 80GB HBM3, this machine is 1 x NVIDIA H200" in str(exc.value)
    assert "--allow-hardware-change" in str(exc.value)
    forced = resume.check_resumable(m, "interrupted", **ok, machine="1 x NVIDIA H200", allow_hardware_change=True)
    assert forced == ["machine changed: 1 x NVIDIA H100 80GB HBM3 -> 1 x NVIDIA H200"]
    # the first part's record wins over the top-level fingerprint; where neither tells, nothing is compared
    first = RunPart(started_at="t0", machine="1 x NVIDIA H200")
    with pytest.raises(RunError, match="ran on 1 x NVIDIA H200, this machine is 1 x NVIDIA H100"):
        resume.check_resumable(_manifest(hardware=H100, parts=[first]), "failed", **ok,
                               machine="1 x NVIDIA H100 80GB HBM3")
    assert resume.check_resumable(_manifest(), "failed", **ok, machine="1 x NVIDIA H200") == []


def test_resumed_note_only_for_a_run_in_parts():
    part = RunPart(started_at="t0", host="h", pid=1, git_sha="b" * 40, status="abandoned")
    assert resume.resumed_note(_manifest(parts=[part])) is None
    second = RunPart(started_at="t1", host="h", pid=2, git_sha="b" * 40, status="ok", kept_units=2,
                     set_aside="unfinished/1")
    note = resume.resumed_note(_manifest(parts=[part, second]))
    assert note.startswith("This run was resumed 1 time: its units were collected in 2 parts.")
    assert "part 1: started t0 on h (pid 1, git bbbbbbbbbbbb), abandoned" in note
    assert "part 2: started t1 on h (pid 2, git bbbbbbbbbbbb), ok; kept 2 finished units; what unfinished units " \
           "left was set aside in unfinished/1" in note
    moved = RunPart(started_at="t2", host="vm", pid=3, machine="1 x NVIDIA H200", git_sha="b" * 40, status="ok",
                    forced=["machine changed: 1 x NVIDIA H100 80GB HBM3 -> 1 x NVIDIA H200"])
    note = resume.resumed_note(_manifest(parts=[part, moved]))
    assert "part 2: started t2 on vm (pid 3, 1 x NVIDIA H200, git bbbbbbbbbbbb), ok; resumed although machine " \
           "changed: 1 x NVIDIA H100 80GB HBM3 -> 1 x NVIDIA H200" in note


def test_a_resumed_part_ends_the_one_before_as_the_run_stood():
    first = RunPart(started_at="t0", pid=1, status="running")
    m = _manifest(parts=[first])
    resume.add_part(m, "abandoned", RunPart(started_at="t1", pid=2, resumed_from="abandoned"))
    assert [(p.started_at, p.status) for p in m.parts] == [("t0", "abandoned"), ("t1", "running")]
    # a run recorded before parts existed: its first start becomes part 1, from the top-level fields
    old = _manifest(status="failed", error="cell 3 raised", ended_at="t0b", duration_s=4.0,
                    runner={"hostname": "h", "pid": 7}, hardware=H100)
    resume.add_part(old, "failed", RunPart(started_at="t1", pid=2, resumed_from="failed"))
    part1 = old.parts[0]
    assert (part1.started_at, part1.ended_at, part1.duration_s, part1.host, part1.pid) == (old.started_at, "t0b",
                                                                                          4.0, "h", 7)
    assert part1.status == "failed" and part1.error == "cell 3 raised" and part1.git_sha == "b" * 40
    assert part1.machine == "1 x NVIDIA H100 80GB HBM3"
    assert old.parts[1].started_at == "t1" and len(old.parts) == 2


def test_run_status_reads_abandoned_for_a_dead_runner_on_this_host():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = socket.gethostname()
    assert run_status(_manifest(status="running", runner={"hostname": here, "pid": dead.pid})) == "abandoned"
    assert run_status(_manifest(status="running", runner={"hostname": here, "pid": os.getpid()})) == "running"
    assert run_status(_manifest(status="running", runner={"hostname": "elsewhere", "pid": dead.pid})) == "running"
    assert run_status(_manifest(status="abandoned")) == "abandoned"


# --------------------------------------------------------------------------------------------------
# The runner: run, fail, resume (a real kernel, no engine)


@pytest.fixture
def failed_run(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FIXTURE_FAIL_AT", "u2")
    with pytest.raises(NotebookExecutionError) as exc:
        run_experiment("fixture_units", SMALL, overrides=["env.API_TOKEN=s3cret-resume-value"],
                       outputs_root=tmp_path, progress=False)
    monkeypatch.delenv("FIXTURE_FAIL_AT")
    return exc.value.result.run_dir


def test_resume_keeps_done_units_runs_the_rest_and_says_so(failed_run):
    first = read_manifest(failed_run)
    assert first.status == "failed" and len(first.parts) == 1 and first.parts[0].status == "failed"
    kernel_1 = set(RunContext(failed_run).load_frame("units")["kernel_pid"])
    u0_log = (failed_run / "logs" / "u0.log").read_text()

    # the params.yaml has the token redacted: a resume must be given it again, and says how
    with pytest.raises(ParamsError, match=r"env\.API_TOKEN was redacted .* -p env\.API_TOKEN=VALUE"):
        resume_experiment(failed_run, progress=False)
    with pytest.raises(ParamsError, match="--allow-params-change"):
        resume_experiment(failed_run, ["env.API_TOKEN=s3cret-resume-value", "rows=9"], progress=False)
    assert read_manifest(failed_run).parts == first.parts  # a refusal changes nothing

    with open(failed_run / "servers.jsonl", "a") as fh:
        fh.write('{"name": "u2", "ar')  # a runner killed mid-append
    result = resume_experiment(failed_run, ["env.API_TOKEN=s3cret-resume-value"], progress=False)
    assert result.status == "ok"
    # the torn line moved to unfinished/1/ with its unit's leftovers; the manifest still says so
    assert [w for w in result.manifest.warnings if w.startswith("unfinished/1/servers.jsonl: torn or damaged line "
                                                                "set aside: (unreadable line")], result.manifest.warnings
    ctx = RunContext(failed_run)
    units = ctx.load_frame("units")
    assert list(units["unit"]) == ["u0", "u1", "u2", "u3"]  # the same order; u0, u1 not re-run
    assert set(units["kernel_pid"][:2]) == kernel_1 and not set(units["kernel_pid"][2:]) & kernel_1
    assert (failed_run / "logs" / "u0.log").read_text() == u0_log
    assert list(ctx.load_frame("items")["unit"]) == ["u0", "u0", "u1", "u1", "u2", "u2", "u3", "u3"]
    aside = failed_run / "unfinished" / "1"
    assert list(pd.read_parquet(aside / "data" / "items.parquet")["unit"]) == ["u2", "u2"]
    assert (aside / "logs" / "u2.log").is_file()

    m = read_manifest(failed_run)
    assert m.status == "ok" and [p.status for p in m.parts] == ["failed", "ok"]
    part = m.parts[1]
    assert part.resumed_from == "failed" and part.kept_units == 2 and part.set_aside == "unfinished/1"
    assert part.pid == os.getpid() and part.git_sha == first.git.sha and part.ended_at and part.forced == []
    assert part.overrides == ["env.API_TOKEN=***"]
    assert m.duration_s == pytest.approx(sum(p.duration_s for p in m.parts), abs=0.01)
    html = (failed_run / "report.html").read_text()
    assert "This run was resumed 1 time" in html and "UNITS-MARKER" in html
    for path in failed_run.rglob("*"):
        if path.is_file():
            assert b"s3cret-resume-value" not in path.read_bytes(), path

    with pytest.raises(RunError, match="finished ok; nothing to resume"):
        resume_experiment(failed_run, ["env.API_TOKEN=s3cret-resume-value"], progress=False)


def test_resume_of_an_abandoned_run_with_other_code_needs_the_flag_and_records_it(failed_run, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    m = read_manifest(failed_run)  # as a SIGKILLed runner whose watchdog died too leaves it
    m.status, m.runner = "running", {"hostname": socket.gethostname(), "pid": dead.pid}
    m.parts[0].status = "running"
    write_manifest(failed_run, m)
    other = GitInfo(sha="f" * 40, short_sha="fffffff", dirty=False)
    monkeypatch.setattr(runner, "git_info", lambda root: other)
    token = ["env.API_TOKEN=s3cret-resume-value"]
    with pytest.raises(RunError, match="--allow-git-change"):
        resume_experiment(failed_run, token, progress=False)
    with pytest.raises(RunError, match="is a run of 'fixture_units', not 'fixture_good'"):
        resume_experiment(failed_run, token, experiment="fixture_good", progress=False)
    result = resume_experiment(failed_run, token, allow_git_change=True, progress=False)
    parts = result.manifest.parts
    assert [p.status for p in parts] == ["abandoned", "ok"] and parts[1].resumed_from == "abandoned"
    assert parts[1].forced == [f"git changed: {m.git.sha[:12]} -> ffffffffffff"] and parts[1].git_sha == "f" * 40


def test_resume_on_another_kind_of_machine_needs_the_flag_and_the_report_says_so(failed_run, monkeypatch):
    first = read_manifest(failed_run)
    assert first.parts[0].machine == machine_kind(first.hardware) and first.parts[0].machine
    elsewhere = {**first.hardware, "gpu": H200["gpu"]}  # the same hostname, another card: as a lent GPU host is
    monkeypatch.setattr(runner, "hardware_fingerprint", lambda: elsewhere)
    token = ["env.API_TOKEN=s3cret-resume-value"]
    with pytest.raises(RunError, match="--allow-hardware-change"):
        resume_experiment(failed_run, token, progress=False)
    assert read_manifest(failed_run).parts == first.parts  # a refused resume leaves the run as it was
    result = resume_experiment(failed_run, token, allow_hardware_change=True, progress=False)
    parts = result.manifest.parts
    assert [p.status for p in parts] == ["failed", "ok"] and parts[1].machine == "1 x NVIDIA H200"
    assert parts[1].forced == [f"machine changed: {parts[0].machine} -> 1 x NVIDIA H200"]
    assert result.manifest.hardware == first.hardware  # the top-level fingerprint stays the first part's
    assert "resumed although machine changed" in (failed_run / "report.html").read_text()
    assert "its parts ran on 2 kinds of machine" in ran_on_line(failed_run)


def test_an_experiment_without_units_cannot_be_resumed(tmp_path):
    with pytest.raises(NotebookExecutionError) as exc:
        run_experiment("fixture_broken", SMALL, outputs_root=tmp_path, progress=False)
    with pytest.raises(RunError, match="does not declare its units"):
        resume_experiment(exc.value.result.run_dir, progress=False)


# --------------------------------------------------------------------------------------------------
# The run guard: SIGKILL (watchdog) and SIGTERM (servers before the kernel)

FAKE_RUNNER = """
import os, subprocess, sys, time
from pathlib import Path
from specbook.run import runguard
run_dir = Path(sys.argv[1])
with runguard.guarded(run_dir):
    # a child standing for a kernel's server: the run's token (inherited) and the server marker
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                              env={**os.environ, "SPECBOOK_SERVER_ID": "fake"})
    (run_dir / "server.pid").write_text(str(server.pid))
    time.sleep(600)
"""


def test_a_sigkilled_runner_leaves_no_server_and_its_run_reads_abandoned(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", FAKE_RUNNER, str(run_dir)])
    write_manifest(run_dir, _manifest(status="running", runner={"hostname": socket.gethostname(), "pid": proc.pid},
                                      parts=[RunPart(started_at="t0", pid=proc.pid)]))
    deadline = time.monotonic() + 60
    while not (run_dir / "server.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    server = psutil.Process(int((run_dir / "server.pid").read_text()))
    proc.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    proc.wait()
    gone = psutil.wait_procs([server], timeout=30)[0]
    took = time.monotonic() - t0
    assert gone, f"the server outlived its runner by {took:.1f} s"
    deadline = time.monotonic() + 10
    while read_manifest(run_dir).status == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    m = read_manifest(run_dir)
    assert m.status == "abandoned" and m.parts[0].status == "abandoned" and m.parts[0].ended_at
    assert f"the runner (pid {proc.pid}) died" in m.error and "stopped 1 server process(es)" in m.error
    journal = (run_dir / "logs" / "watchdog.log").read_text().splitlines()  # what it did, a whole line each
    assert f"the runner (pid {proc.pid}) died without finishing the run" in journal[0]
    assert any("stopped 1 server process(es)" in line for line in journal[1:]), journal


def test_a_runner_that_ends_normally_leaves_its_manifest_to_itself(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_manifest(run_dir, _manifest(status="running", runner={"hostname": socket.gethostname(), "pid": os.getpid()}))
    from specbook.run import runguard

    with runguard.guarded(run_dir) as guard:
        assert os.environ[runguard.RUN_TOKEN_ENV] == guard.token
    assert runguard.RUN_TOKEN_ENV not in os.environ
    time.sleep(0.5)
    assert read_manifest(run_dir).status == "running"  # the watchdog was told "done"


def test_sigterm_waits_for_the_servers_and_the_cell_before_the_kernel_is_shut_down(tmp_path):
    wrapper = (f"import sys; sys.path.insert(0, {str(NOTEBOOKS)!r}); import fixture_experiments; "
               "from specbook.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen(
        [sys.executable, "-c", wrapper, "run", "fixture_good", "-f", str(SMALL), "--notebook",
         str(NOTEBOOKS / "slow_server.ipynb"), "--outputs", str(tmp_path), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (pid_files := list(tmp_path.glob("*/*/server.pid"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_files, "the notebook never started its server"
    run_dir = pid_files[0].parent
    server = int(pid_files[0].read_text())
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE
    # the server's 8 s teardown ran to its end inside the kernel: the kernel was not shut down under it,
    # nor under the 6 s of work the cell does after it (what a cell records once its server is gone)
    assert (run_dir / "teardown.done").exists()
    assert (run_dir / "records.done").exists()
    assert "Exception in message handler" not in stderr, stderr[-3000:]  # the kernel's reply was not cut
    assert "Task exception was never retrieved" not in stderr, stderr[-3000:]  # nor printed at exit
    m = read_manifest(run_dir)
    assert m.status == "interrupted" and "servers gone" in m.error and "after SIGTERM" in m.error, m.error


def test_wait_quiet_returns_once_a_busy_process_goes_idle_and_gives_up_at_its_bound():
    from specbook.run import runguard

    # Busy for 1.5 s of CPU, then it says so and goes idle: wait_quiet must return after that moment, and before
    # its own bound. Quiet means little CPU over a window, so a process starved by a loaded host looks quiet too:
    # the window here (2 s, at most 0.01 s of CPU) is one no runnable process is starved into on a 2-core host
    # even at the load of 30-48 seen here; the bound (60 s) leaves room for 1.5 s of CPU stretched by that load.
    busy_then_idle = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 1.5\n"
                                       "while time.process_time() < end: pass\nprint('idle', flush=True)\n"
                                       "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle_at: list[float] = []
    reader = threading.Thread(target=lambda: (busy_then_idle.stdout.readline(), idle_at.append(time.monotonic())),
                              daemon=True)
    reader.start()
    try:
        took = runguard.wait_quiet([psutil.Process(busy_then_idle.pid)], timeout_s=60, quiet_s=2.0, cpu_s=0.01)
        returned_at = time.monotonic()
        reader.join(5)
        assert took is not None, "still busy after 60 s"
        assert idle_at and returned_at >= idle_at[0], (took, idle_at)  # not before it went idle
        assert runguard.wait_quiet([psutil.Process(busy.pid)], timeout_s=3, quiet_s=2.0, cpu_s=0.01) is None
        ending = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        watched = psutil.Process(ending.pid)
        ending.kill()
        ending.wait()
        assert runguard.wait_quiet([watched], timeout_s=1) is not None  # a process that is gone is quiet
    finally:
        for p in (busy_then_idle, busy):
            p.kill()
            p.wait()
