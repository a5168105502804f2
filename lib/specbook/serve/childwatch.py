"""Which of a server's processes ended first, and how: seen while they run, because a parent that reaps its child
and exits by itself hides the real cause."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import psutil


def status_text(code: int) -> str:
    """A wait status as Popen gives it (negative: the signal) in words."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def zombie_status(pid: int) -> int | None:
    """The wait status of a zombie not ours to reap (/proc/PID/stat field 52, Linux >= 3.5), as Popen gives it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 50 or fields[0] != b"Z":
        return None
    status = int(fields[49])
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


class ChildWatch:
    """Which of a server's processes ended first, and how, seen while they run: a parent that reaps its child
    and exits by itself (vLLM's API server after its engine core was killed) hides the real cause. A zombie's
    status is read before its parent reaps it; a process reaped between two looks is named without it."""

    POLL_S = 0.1

    def __init__(self, root_pid: int):
        self._root_pid = root_pid
        self._seen: dict[int, psutil.Process] = {}
        self._names: dict[int, str] = {}
        self._deaths: list[tuple[float, int, str, int | None]] = []
        self._root_ended: float | None = None
        self._done = threading.Event()  # the root's end was seen (or the watch ended)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"childwatch-{root_pid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._watch()
        finally:
            self._done.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.POLL_S):
            self._look_for_children()
            self._look_for_deaths()
            if self._root_ended is None and (zombie_status(self._root_pid) is not None
                                             or not psutil.pid_exists(self._root_pid)):
                self._root_ended = time.monotonic()
                self._done.set()  # what died before the root is known now
            if self._root_ended is not None and time.monotonic() - self._root_ended > 1.0:
                return

    def _look_for_children(self) -> None:
        """Remember every process under the root seen so far, with its name (gone once it is reaped)."""
        try:
            root = psutil.Process(self._root_pid)
            for ch in root.children(recursive=True):
                if ch.pid not in self._seen:
                    self._seen[ch.pid] = ch
                    with contextlib.suppress(psutil.Error):
                        self._names[ch.pid] = ch.name()
        except psutil.Error:
            pass

    def _look_for_deaths(self) -> None:
        """Note when each process seen ended, with its status where it is still a zombie."""
        dead = {pid for _, pid, _, _ in self._deaths}
        for pid, proc in list(self._seen.items()):
            if pid in dead:
                continue
            status = zombie_status(pid)
            if status is not None or not proc.is_running():
                self._deaths.append((time.monotonic(), pid, self._names.get(pid, "?"), status))

    def first_death(self) -> str | None:
        self._done.wait(1.0)  # the root just ended: let the watch take its last look
        before = [d for d in self._deaths if self._root_ended is None or d[0] <= self._root_ended]
        if not before:
            return None
        _, pid, name, status = min(before)
        how = status_text(status) if status is not None else "ended (its parent took its exit status)"
        how = how if how.startswith(("killed", "ended")) else f"ended with {how}"
        return f"pid {pid} ({name}) {how}"

    def close(self) -> None:
        self._stop.set()
