"""A run's processes found by its token and stopped (specbook.serve.processes): plain child processes stand for
a kernel and its servers."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psutil
import pytest

from specbook.core.secrets import RUN_TOKEN_ENV
from specbook.serve.processes import alive, run_processes, stop
from specbook.serve.server import MARKER_ENV

# says "ready" once its SIGTERM handling is set, then waits to be stopped
CHILD = """
import signal, sys, time
if sys.argv[1] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def spawn():
    children: list[subprocess.Popen[str]] = []

    def start(env: dict[str, str], term: str = "default") -> psutil.Process:
        child = subprocess.Popen([sys.executable, "-c", CHILD, term], env={**os.environ, **env},
                                 stdout=subprocess.PIPE, text=True)
        children.append(child)
        assert child.stdout.readline().strip() == "ready"
        return psutil.Process(child.pid)

    yield start
    for child in children:
        child.kill()
        child.wait()


def test_a_runs_processes_are_found_by_its_token_servers_apart(spawn):
    token = uuid.uuid4().hex
    server = spawn({RUN_TOKEN_ENV: token, MARKER_ENV: "arm-0"})
    kernel = spawn({RUN_TOKEN_ENV: token})
    spawn({RUN_TOKEN_ENV: "another-run", MARKER_ENV: "arm-0"})  # another run's server
    servers, others = run_processes(token)
    assert [p.pid for p in servers] == [server.pid] and [p.pid for p in others] == [kernel.pid]


def test_stop_terms_then_kills_what_ignores_it(spawn):
    token = uuid.uuid4().hex
    polite = spawn({RUN_TOKEN_ENV: token, MARKER_ENV: "a"})
    stubborn = spawn({RUN_TOKEN_ENV: token, MARKER_ENV: "b"}, term="ignore-term")
    servers, _ = run_processes(token)
    assert stop(servers, term_grace_s=1.0) == []
    assert alive([polite, stubborn]) == [] and run_processes(token) == ([], [])
