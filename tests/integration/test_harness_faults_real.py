"""Fault injection on a real llama-server through the harness: the engine is killed with SIGKILL mid-window.

What the user must see: an error saying the server died and how (killed by SIGKILL), with its log tail;
the unit recorded as failed in servers.jsonl; no process of it left behind.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from specbook import harness
from specbook.client import ChatRequest
from specbook.engines import EngineConfig
from specbook.errors import ServerDiedError, ServerHungError
from specbook.models import TARGET
from specbook.runstore import RunContext

pytestmark = pytest.mark.integration

PROMPT = "Write a long story about a bicycle that travels across the world, chapter by chapter."


def test_a_server_killed_mid_window_is_named_recorded_and_gone(tmp_path):
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
    assert _none_left(seen["pids"]) and 5 <= took < 45, took
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

    with pytest.raises(KeyboardInterrupt):
        _serve_and_measure(run, "hung-interrupted", stop_then_interrupt, stall_timeout_s=600)
    took = time.monotonic() - times["interrupt"]
    (record,) = run.servers()
    assert record.status == "interrupted"
    assert took < 45, f"Ctrl-C took {took:.1f} s to stop a hung server"
    print(f"\n[fault] Ctrl-C with the server stopped: out and torn down in {took:.1f} s")


def test_readiness_answered_by_another_process_on_the_port_is_refused(tmp_path):
    """Another process (here the healthy stub: /health and /v1/models answer 200) holds the port a vLLM server
    was given: while vLLM loads (it binds last), the stub's answers must not count as our server being ready."""
    import subprocess
    import sys
    from pathlib import Path

    from specbook.engines import get_engine
    from specbook.errors import ServerStartError
    from specbook.server import ManagedServer, free_port

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
