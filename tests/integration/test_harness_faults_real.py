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
from specbook.errors import ServerDiedError
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
