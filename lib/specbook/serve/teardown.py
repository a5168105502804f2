"""A server's process tree, found however its processes left it, and stopping all of it.

A server runs in its own session (so one signal reaches its whole process group) and is torn down by group
*and* by every descendant found with psutil, because engines such as vLLM spawn engine-core workers that may
leave the group; the marker in their environment finds those that left the session too. Teardown verifies
that nothing survived.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil

from specbook.serve.launch import MARKER_ENV

TERM_GRACE_S = 20.0
KILL_GRACE_S = 10.0


def alive(proc: psutil.Process) -> bool:
    # PID 1 of a container may never reap orphans: a zombie is dead for our purpose.
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"pid {p.pid} ({' '.join(p.cmdline())[:120]})")
        except psutil.Error:
            out.append(f"pid {p.pid}")
    return ", ".join(out)


class ProcessTree:
    """Every process of one launched server: the tree under its root, its session, and marker holders, with
    those seen earlier kept (once the root dies its orphans lose the tree link)."""

    def __init__(self, root: subprocess.Popen[bytes], marker: str):
        self.root = root
        self.marker = marker
        self.known: dict[int, psutil.Process] = {}

    def descendants(self) -> list[psutil.Process]:
        """Every live process of this server: the tree under the root, its session, and marker holders."""
        found: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.root.pid)
            found[root.pid] = root
            for ch in root.children(recursive=True):
                found[ch.pid] = ch
        except psutil.NoSuchProcess:
            pass
        sid = self.root.pid
        for p in psutil.process_iter():
            if p.pid in found or p.pid == os.getpid():
                continue
            try:
                if os.getsid(p.pid) == sid:
                    found[p.pid] = p
                elif p.environ().get(MARKER_ENV) == self.marker:
                    found[p.pid] = p
            except (psutil.Error, OSError):
                continue
        # Keep processes seen earlier: once the root dies its orphans lose the tree link.
        for pid, p in found.items():
            self.known.setdefault(pid, p)
        return [p for p in self.known.values() if alive(p)]

    def stopped(self) -> list[str]:
        """Its processes the OS has stopped (state T: SIGSTOP, a debugger), described."""
        out = []
        for p in self.descendants():
            try:
                if p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                    out.append(f"pid {p.pid} ({p.name()})")
            except psutil.Error:
                continue
        return out

    def survivors(self) -> list[int]:
        """Pids of the processes seen so far that are still alive."""
        return [p.pid for p in self.known.values() if alive(p)]

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by its processes alive now (those seen before and the root's tree)."""
        if not self.known:
            self.descendants()
        with contextlib.suppress(psutil.Error):
            for ch in psutil.Process(self.root.pid).children(recursive=True):
                self.known.setdefault(ch.pid, ch)
        total = 0.0
        for p in list(self.known.values()):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def signal_all(self, sig: int, procs: list[psutil.Process]) -> None:
        try:
            os.killpg(self.root.pid, sig)  # the session leader's pid is the group id
        except (ProcessLookupError, PermissionError):
            pass
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass

    def wait_gone(self, grace_s: float) -> list[psutil.Process]:
        end = time.monotonic() + grace_s
        while True:
            self.root.poll()  # reap our own child so it does not linger as a zombie
            left = self.descendants()
            if not left or time.monotonic() >= end:
                return left
            time.sleep(0.2)

    def stop(self, term_grace_s: float = TERM_GRACE_S) -> list[psutil.Process]:
        """SIGTERM the group and all descendants, SIGKILL stragglers; returns the processes that survived."""
        procs = self.descendants()
        if procs and self.stopped():
            # a stopped server cannot shut down in order (continued, it would wait for its connections):
            # it is killed, and continued so that the kill is not held
            self.signal_all(signal.SIGKILL, procs)
            self.signal_all(signal.SIGCONT, procs)
            procs = self.wait_gone(KILL_GRACE_S)
        if procs:
            self.signal_all(signal.SIGTERM, procs)
            # a stopped (SIGSTOP, a hung debugger) process holds SIGTERM until it runs again
            self.signal_all(signal.SIGCONT, procs)
            procs = self.wait_gone(term_grace_s)
        if procs:
            self.signal_all(signal.SIGKILL, procs)
            procs = self.wait_gone(KILL_GRACE_S)
        return procs
