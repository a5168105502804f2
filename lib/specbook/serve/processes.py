"""A run's processes, found by the run token in their environment, and stopping them.

The runner puts a token in the kernel's environment (specbook.core.secrets.RUN_TOKEN_ENV); every server the
kernel launches, and their workers, inherit it, so a run's processes are found whatever their parent or session
(servers run in their own sessions; a dead kernel's children are re-parented), on the runner's host or on a Ray
node. Servers are told from the kernel by the marker every launched server carries (specbook.serve.server).
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from specbook.core.secrets import RUN_TOKEN_ENV
from specbook.serve.server import MARKER_ENV

__all__ = ["KILL_GRACE_S", "TERM_GRACE_S", "alive", "run_processes", "send_signal", "stop"]

TERM_GRACE_S = 10.0
KILL_GRACE_S = 5.0
_POLL_S = 0.2


def run_processes(token: str) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(servers, others: the kernel and its helpers) of the run with this token, alive now."""
    servers, others = [], []
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            env = p.environ()
            if env.get(RUN_TOKEN_ENV) != token or p.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, OSError):
            continue
        (servers if MARKER_ENV in env else others).append(p)
    return servers, others


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie is not)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def send_signal(procs: list[psutil.Process], sig: int) -> None:
    """`sig` to each; one already gone is skipped."""
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def _wait(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    end = time.monotonic() + timeout_s
    while (left := alive(procs)) and time.monotonic() < end:
        time.sleep(_POLL_S)
    return left


def stop(procs: list[psutil.Process], term_grace_s: float = TERM_GRACE_S) -> list[psutil.Process]:
    """SIGTERM (and SIGCONT, for a stopped one), then SIGKILL what is left; returns the survivors."""
    send_signal(procs, signal.SIGTERM)
    send_signal(procs, signal.SIGCONT)
    left = _wait(procs, term_grace_s)
    if left:
        send_signal(left, signal.SIGKILL)
        left = _wait(left, KILL_GRACE_S)
    return left
