"""Fault injection on a real llama-server through the harness: the engine is killed with SIGKILL mid-window.

What the user must see: an error saying the server died and how (killed by SIGKILL), with its log tail;
the unit recorded as failed in servers.jsonl; no process of it left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import psutil
import pytest

from specbook.core.errors import ServerDiedError, ServerHungError
from specbook.engines import EngineConfig
from specbook.measure import harness
from specbook.models import TARGET
from specbook.serve.client import ChatRequest
from specbook.store.runstore import RunContext

pytestmark = pytest.mark.integration

PROMPT = "Write a long story about a bicycle that travels across the world, chapter by chapter."


def test_a_server_killed_mid_window_is_named_recorded_and_gone(tmp_path, monkeypatch):
    from specbook.core.secrets import RUN_TOKEN_ENV

    # as inside a run: the runner's token is in the environment, and is no secret (its output goes straight to
    # the log, no scrubbing pipe that waits for a dead server's children)
    monkeypatch.setenv(RUN_TOKEN_ENV, "f26-token-0123456789")
    run = RunContext(tmp_path / "run")
    cfg = EngineConfig(engine="llamacpp", model=TARGET, served_model_name="smollm2", max_num_seqs=1,
                       extra_args=["-t", "2"])
    requests = [ChatRequest(prompt_id=f"p{i}", messages=[{"role": "user", "content": PROMPT}], max_tokens=400)
                for i in range(4)]
    pids: list[int] = []
    killed_at: list[float] = []

    def kill(pid: int) -> None:
        killed_at.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)

    with pytest.raises(ServerDiedError) as err:
        with harness.serve(cfg, run, "victim") as server:
            pids = [p.pid for p in psutil.Process(server.managed.pid).children(recursive=True)] + [server.managed.pid]
            assert server.managed._pump is None
            killer = threading.Timer(1.5, kill, (server.managed.pid,))
            killer.start()
            try:
                server.measure(requests, concurrency=1)
            finally:
                killer.cancel()
    detected_s = time.monotonic() - killed_at[0]  # kill -> error raised, teardown and record included
    message = str(err.value)
    assert "died during the measured window" in message and "killed by SIGKILL" in message, message
    assert "--- log tail ---" in message
    (record,) = run.servers()
    assert record.status == "failed" and "ServerDiedError" in (record.error or "")
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    print(f"\n[fault] SIGKILL mid-window: error raised {detected_s:.2f} s after the kill (teardown and record included)")


def _serve_and_measure(run: RunContext, name: str, during, **measure_kwargs):
    """Serve llama-server through the harness, call during(server) 1.5 s into a measured window."""
    cfg = EngineConfig(engine="llamacpp", model=TARGET, served_model_name="smollm2", max_num_seqs=1,
                       extra_args=["-t", "2"])
    requests = [ChatRequest(prompt_id=f"p{i}", messages=[{"role": "user", "content": PROMPT}], max_tokens=400)
                for i in range(4)]
    seen: dict[str, object] = {}
    with harness.serve(cfg, run, name) as server:
        seen["pids"] = [p.pid for p in psutil.Process(server.managed.pid).children(recursive=True)] + [
            server.managed.pid]

        def act() -> None:
            seen["acted_at"] = time.monotonic()
            during(server)

        timer = threading.Timer(1.5, act)
        timer.start()
        try:
            server.measure(requests, concurrency=1, **measure_kwargs)
        finally:
            timer.cancel()
    return seen


def _none_left(pids) -> bool:
    return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_server_stopped_mid_window_fails_the_unit_within_the_stall_bound(tmp_path):
    run = RunContext(tmp_path / "run")
    seen: dict[str, object] = {}

    def stop(server) -> None:
        seen["pids"] = [p.pid for p in psutil.Process(server.managed.pid).children(recursive=True)] + [
            server.managed.pid]
        seen["stopped_at"] = time.monotonic()
        os.kill(server.managed.pid, signal.SIGSTOP)

    with pytest.raises(ServerHungError) as err:
        _serve_and_measure(run, "hung", stop, stall_timeout_s=5)
    took = time.monotonic() - seen["stopped_at"]
    message = str(err.value)
    assert "stopped making progress" in message and "no token for 5 s" in message, message
    assert "stopped by the OS" in message, message
    (record,) = run.servers()
    assert record.status == "failed" and "ServerHungError" in (record.error or "")
    # the bound runs from the last token received, which a loaded host may have sent a while before the stop
    assert _none_left(seen["pids"]) and took < 45, took
    print(f"\n[fault] SIGSTOP mid-window, stall bound 5 s: failed and torn down {took:.1f} s after the stop")


def test_ctrl_c_while_the_server_hangs_stops_it_and_records_the_interrupt(tmp_path):
    run = RunContext(tmp_path / "run")
    main = threading.main_thread().ident
    times: dict[str, float] = {}

    def stop_then_interrupt(server) -> None:
        os.kill(server.managed.pid, signal.SIGSTOP)
        time.sleep(1.0)
        times["interrupt"] = time.monotonic()
        signal.pthread_kill(main, signal.SIGINT)  # what Ctrl-C delivers to the runner

    # the stall bound only has to outlast the bound asserted below (a Ctrl-C lost would fail there, not wait 600 s)
    with pytest.raises(KeyboardInterrupt):
        _serve_and_measure(run, "hung-interrupted", stop_then_interrupt, stall_timeout_s=90)
    took = time.monotonic() - times["interrupt"]
    (record,) = run.servers()
    assert record.status == "interrupted"
    assert took < 45, f"Ctrl-C took {took:.1f} s to stop a hung server"
    print(f"\n[fault] Ctrl-C with the server stopped: out and torn down in {took:.1f} s")


BUSY = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def _busy_elsewhere() -> int:
    """A CPU-bound process that is not the run's own (re-parented away from this process): another user's work."""
    import subprocess
    import sys

    outer = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, "
                              "'-c', sys.argv[1]], start_new_session=True, stdout=subprocess.DEVNULL); print(p.pid, flush=True)", BUSY],
                             stdout=subprocess.PIPE, text=True)
    pid = int(outer.stdout.readline())
    outer.wait()
    return pid


def test_contention_is_flagged_and_a_hang_outside_the_window_fails_within_the_stall_bound(tmp_path):
    """One llama-server: a window measured beside a busy process carries its host load, flagged; then, the server
    stopped (SIGSTOP), a warm-up send and a raw (non-streamed, cold / trace / equal-work) request each fail within
    the stall bound instead of the client's 600 s, and the stopped server is killed on the way out."""
    from specbook.serve import hostload

    run = RunContext(tmp_path / "run")
    # one compute thread: beside the busy process, two would wait on each other at every step (the window then
    # takes from 20 s to a minute on a 2-core host instead of seconds)
    cfg = EngineConfig(engine="llamacpp", model=TARGET, served_model_name="smollm2", max_num_seqs=1,
                       extra_args=["-t", "1"])
    short = [ChatRequest(prompt_id=f"s{i}", messages=[{"role": "user", "content": PROMPT}], max_tokens=24)
             for i in range(2)]
    times: dict[str, float] = {}
    with pytest.raises(ServerHungError) as err:
        with harness.serve(cfg, run, "hang-outside") as server:
            busy = _busy_elsewhere()
            try:
                window = server.measure(short, concurrency=1)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(busy, signal.SIGKILL)
            assert window.host_load is not None and window.host_load.contended, window.host_load
            (record,) = hostload.read_records(run.run_dir)
            assert record["server"] == "hang-outside" and record["contended"] and record["other_cpu_s"] > 0
            assert record["top"], record  # the busiest others (on a loaded host not always our busy process)

            pids = [p.pid for p in psutil.Process(server.managed.pid).children(recursive=True)] + [server.managed.pid]
            os.kill(server.managed.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            with pytest.raises(ServerHungError) as warm:
                server.send(short[:1], stall_timeout_s=5)
            times["warm-up"] = time.monotonic() - t0
            assert "while answering unmeasured requests" in str(warm.value) and "5 s" in str(warm.value)
            assert "stopped by the OS" in str(warm.value), str(warm.value)
            t0 = time.monotonic()
            try:
                server.post_raw(short[0], stall_timeout_s=5)
            finally:
                times["raw"] = time.monotonic() - t0
                times["teardown_from"] = time.monotonic()
    times["teardown"] = time.monotonic() - times.pop("teardown_from")
    assert "stopped making progress on request s0" in str(err.value) and "no CPU" in str(err.value), str(err.value)
    (rec,) = run.servers()
    assert rec.status == "failed" and "ServerHungError" in (rec.error or "")
    assert _none_left(pids)
    assert times["warm-up"] < 45 and times["raw"] < 45, times
    print(f"\n[fault] SIGSTOP outside the window, stall bound 5 s: warm-up send failed after {times['warm-up']:.1f} s, "
          f"raw request after {times['raw']:.1f} s; the stopped server torn down in {times['teardown']:.1f} s; "
          f"contended window: other processes {window.host_load.other_cores:.2f} cores")


def test_readiness_answered_by_another_process_on_the_port_is_refused(tmp_path):
    """Another process (here the healthy stub: /health and /v1/models answer 200) holds the port a vLLM server
    was given: while vLLM loads (it binds last), the stub's answers must not count as our server being ready."""
    import subprocess
    import sys
    from pathlib import Path

    from specbook.core.errors import ServerStartError
    from specbook.engines import get_engine
    from specbook.serve.server import ManagedServer, free_port

    stub_py = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"
    port = free_port()
    squatter = subprocess.Popen([sys.executable, str(stub_py), "--mode", "healthy", "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                      for c in psutil.net_connections(kind="tcp")):
            assert time.monotonic() < deadline and squatter.poll() is None, "the stub never listened"
            time.sleep(0.1)
        cfg = EngineConfig(engine="vllm", model=TARGET, served_model_name="smollm2")
        spec = get_engine("vllm").build_spec(cfg, name="late", log_path=tmp_path / "late.log", port=port)
        server = ManagedServer(spec)
        with pytest.raises(ServerStartError) as err:
            with server:
                pass
        message = str(err.value)
        assert f"port {port} is served by another process, pid {squatter.pid}" in message, message
        assert server.surviving_pids() == [] and squatter.poll() is None  # ours torn down, theirs untouched
    finally:
        squatter.kill()
        squatter.wait(10)
