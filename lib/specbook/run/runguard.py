"""No process of a run outlives its runner: Ctrl-C / SIGTERM stop the servers before the kernel, and a watchdog
stops them (and marks the run abandoned) when the runner is killed outright.

The runner puts a token in the kernel's environment; every server the kernel launches, and their workers,
inherit it, so the run's processes are found by it (specbook.serve.processes, which also stops them: the Ray
executor does so on its nodes).

- Ctrl-C / SIGTERM (`guarded`): the kernel is interrupted, so the running cell's `with` blocks tear their
  servers down and record them; the runner waits until no server of the run is left (stopping any that
  outlive SERVER_STOP_BOUND_S itself), then until the kernel has finished the interrupted cell (its CPU goes
  quiet), and only then lets papermill shut the kernel down: the kernel's own short shutdown can no longer
  cut a server's longer teardown or the records written after it. A second signal stops the servers at once.
- SIGKILL, OOM kill: the runner can do nothing. A watchdog process started with it reads a pipe from it; at
  EOF without the runner's "done", it stops every process of the run and marks the manifest abandoned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil

from specbook.core.diskwrite import append_line
from specbook.core.errors import RunError
from specbook.core.secrets import RUN_TOKEN_ENV
from specbook.serve.processes import alive, run_processes, send_signal, stop
from specbook.serve.server import MARKER_ENV
from specbook.store.manifest import iso_utc, read_manifest, utc_now, write_manifest

# Longer than a server's own teardown (specbook.serve.teardown's TERM_GRACE_S + KILL_GRACE_S): the kernel gets
# the first chance.
SERVER_STOP_BOUND_S = 45.0
UNIT_RECORD_BOUND_S = 15.0  # a Ray unit's server record after its server is gone (a log parse and one write)
# After the servers are gone the interrupted cell still records them, writes its frames and formats its
# traceback; papermill's shutdown of a kernel still busy with that closes its sockets under it ("Exception in
# message handler ... ZMQError" on the console, and writes cut short). The runner waits, up to this bound, for
# the kernel to go quiet: no more than KERNEL_QUIET_CPU_S of CPU over KERNEL_QUIET_S.
KERNEL_QUIET_BOUND_S = 15.0
KERNEL_QUIET_S = 0.6
KERNEL_QUIET_CPU_S = 0.03
_POLL_S = 0.2
DONE = b"done\n"
WATCHDOG_LOG = "watchdog.log"  # in logs/: what the watchdog did after the runner died


def servers_gone_within(token: str, timeout_s: float) -> list[psutil.Process]:
    """Wait until no server of the run is alive (new ones found on the way count too); the survivors."""
    end = time.monotonic() + timeout_s
    while True:
        servers, _ = run_processes(token)
        if not servers or time.monotonic() >= end:
            return servers
        time.sleep(_POLL_S)


def _cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # gone: uses no more CPU
            continue
    return total


def wait_quiet(procs: list[psutil.Process], timeout_s: float, quiet_s: float = KERNEL_QUIET_S,
               cpu_s: float = KERNEL_QUIET_CPU_S) -> float | None:
    """Wait until these processes together use at most cpu_s of CPU over quiet_s (or are gone); the seconds
    that took, None when they were still busy after timeout_s."""
    t0 = time.monotonic()
    end = t0 + timeout_s
    before = _cpu_s(procs)
    while True:
        time.sleep(quiet_s)
        now = _cpu_s(procs)
        if now - before <= cpu_s or not alive(procs):
            return round(time.monotonic() - t0, 2)
        if time.monotonic() >= end:
            return None
        before = now


def _describe(procs: list[psutil.Process]) -> str:
    return ", ".join(str(p.pid) for p in procs)


# --------------------------------------------------------------------------------------------------
# The runner's side


@dataclass
class Guard:
    token: str
    signal_name: str | None = None
    servers_stopped_s: float | None = None  # signal -> no server left
    forced: str | None = None  # what the runner had to stop itself
    kernel_busy: bool = False  # the kernel was still busy KERNEL_QUIET_BOUND_S after its servers were gone

    def describe(self) -> str:
        """What the signal path did ('' when no signal came)."""
        parts = [f"servers gone {self.servers_stopped_s:.1f} s after {self.signal_name}"
                 if self.servers_stopped_s is not None else "", self.forced or "",
                 f"the kernel was still busy {KERNEL_QUIET_BOUND_S:.0f} s later and was shut down anyway"
                 if self.kernel_busy else ""]
        return "; ".join(p for p in parts if p)


def _kernels(token: str) -> list[psutil.Process]:
    """The kernel(s) this runner launched: its children carrying the token that are not servers."""
    out = []
    for child in psutil.Process().children():
        try:
            env = child.environ()
        except (psutil.Error, OSError):
            continue
        if env.get(RUN_TOKEN_ENV) == token and MARKER_ENV not in env:
            out.append(child)
    return out


def _start_watchdog(run_dir: Path, token: str) -> subprocess.Popen[bytes] | None:
    env = {k: v for k, v in os.environ.items() if k != RUN_TOKEN_ENV}
    try:
        # its own session: the terminal's Ctrl-C reaches the runner, never the watchdog
        return subprocess.Popen([sys.executable, "-m", "specbook.run.runguard", str(os.getpid()), str(run_dir), token],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    except OSError:  # no watchdog: Ctrl-C still works, a SIGKILL leaves list's "abandoned" and PDEATHSIG
        return None


def _end_watchdog(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.stdin is None:
        return
    try:
        proc.stdin.write(DONE)
        proc.stdin.close()
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()


@contextmanager
def guarded(run_dir: Path) -> Iterator[Guard]:
    """Run the notebook inside: the kernel (started inside) carries the run's token, a watchdog covers a
    SIGKILL, and SIGINT/SIGTERM stop the servers before KeyboardInterrupt reaches papermill."""
    guard = Guard(token=uuid.uuid4().hex)
    watchdog = _start_watchdog(run_dir, guard.token)
    previous_token = os.environ.get(RUN_TOKEN_ENV)
    os.environ[RUN_TOKEN_ENV] = guard.token
    handlers: dict[int, object] = {}

    def on_signal(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if guard.signal_name is not None:  # a second signal: stop now
            stop(run_processes(guard.token)[0], term_grace_s=2.0)
            raise KeyboardInterrupt(f"signal {name} (second)")
        guard.signal_name = name
        t0 = time.monotonic()
        send_signal(_kernels(guard.token), signal.SIGINT)  # the running cell raises KeyboardInterrupt
        left = servers_gone_within(guard.token, SERVER_STOP_BOUND_S)
        if left:
            survivors = stop(left)
            guard.forced = (f"the runner stopped server process(es) {_describe(left)} itself after "
                            f"{SERVER_STOP_BOUND_S:.0f} s" + (f"; {_describe(survivors)} survived SIGKILL"
                                                               if survivors else ""))
        else:  # a Ray task records its server after the server is gone: let it, before its worker is ended
            from specbook.executors.staging import wait_units_ended

            wait_units_ended(guard.token, UNIT_RECORD_BOUND_S)
        guard.servers_stopped_s = round(time.monotonic() - t0, 2)
        guard.kernel_busy = wait_quiet(_kernels(guard.token), KERNEL_QUIET_BOUND_S) is None
        raise KeyboardInterrupt(f"signal {name}")

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, on_signal)
    try:
        yield guard
    finally:
        for sig, old in handlers.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        if previous_token is None:
            os.environ.pop(RUN_TOKEN_ENV, None)
        else:
            os.environ[RUN_TOKEN_ENV] = previous_token
        # papermill shuts its kernel down; anything of the run still alive now is stopped, servers first
        servers, others = run_processes(guard.token)
        if servers:
            stop(servers)
        if others:
            stop(others, term_grace_s=5.0)
        _end_watchdog(watchdog)


# --------------------------------------------------------------------------------------------------
# The watchdog's side (python -m specbook.run.runguard RUNNER_PID RUN_DIR TOKEN)


def _mark_abandoned(run_dir: Path, runner_pid: int, note: str, again: bool = False) -> None:
    m = read_manifest(run_dir)
    if m.status != ("abandoned" if again else "running") or m.runner.get("pid") != runner_pid:
        return  # the runner finished it after all, or a later resume owns the folder
    m.status = "abandoned"
    m.error = f"the runner (pid {runner_pid}) died without finishing the run; {note}"
    if again:  # the times stay those of the first mark: when the runner was found dead
        if m.parts:
            m.parts[-1].error = m.error
        write_manifest(run_dir, m)
        return
    now = utc_now()
    m.ended_at = iso_utc(now)
    if m.parts:
        part = m.parts[-1]
        part.status, part.ended_at, part.error = "abandoned", m.ended_at, m.error
        try:
            part.duration_s = round((now - datetime.fromisoformat(part.started_at)).total_seconds(), 3)
        except (TypeError, ValueError):  # a start time not in ISO form: leave the duration unknown
            pass
        m.duration_s = round(sum(p.duration_s or 0.0 for p in m.parts), 3)
    write_manifest(run_dir, m)


def watch(runner_pid: int, run_dir: Path, token: str) -> int:
    """Block until the runner's pipe closes; unless it said "done", stop the run's processes and mark it."""
    data = sys.stdin.buffer.read()
    if data.endswith(DONE):
        return 0
    t0 = time.monotonic()
    journal = run_dir / "logs" / WATCHDOG_LOG

    def say(text: str) -> None:
        try:
            append_line(journal, f"{iso_utc(utc_now())} {text}")
        except (OSError, RunError):  # a full disk (DiskFullError): the manifest's mark still says it
            pass

    def mark(note: str, again: bool = False) -> None:
        try:
            _mark_abandoned(run_dir, runner_pid, note, again)
        except Exception as exc:  # an unreadable manifest must not keep the servers alive
            say(f"could not mark the manifest abandoned: {type(exc).__name__}: {exc}")

    say(f"the runner (pid {runner_pid}) died without finishing the run")
    mark("the watchdog is stopping its processes")  # said at once, then how it went
    servers, others = run_processes(token)
    survivors = stop(servers)
    others_left = stop(alive(others) + run_processes(token)[1], term_grace_s=5.0)
    gone_s = time.monotonic() - t0
    try:  # the kernel died with its units: their servers still get a record
        from specbook.store.runstore import RunContext

        settled = RunContext(run_dir).settle_pending_servers(
            "failed", f"the runner (pid {runner_pid}) died; the watchdog stopped this server")
    except Exception as exc:  # noqa: BLE001 - the mark below matters more
        say(f"could not record the pending servers: {type(exc).__name__}: {exc}")
        settled = []
    if settled:
        say(f"recorded the servers whose unit never ended: {', '.join(settled)}")
    note = (f"the watchdog stopped {len(servers)} server process(es) and {len(others)} other(s) in {gone_s:.1f} s"
            + (f"; still alive: {_describe(survivors + others_left)}" if survivors or others_left else ""))
    say(note)
    mark(note, again=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(watch(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))
