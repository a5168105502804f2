"""Engine server lifecycle: launch from a typed spec, `Env:` line first in the log, readiness, teardown.

A server runs in its own session (so one signal reaches its whole process group) and is torn down
by group *and* by every descendant found with psutil, because engines such as vLLM spawn
engine-core workers that may leave the group. Teardown verifies that nothing survived.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import httpx
import psutil
from pydantic import BaseModel, ConfigDict, Field

from specbook.core.envline import format_env_line
from specbook.core.errors import ServerStartError, ServerTeardownError
from specbook.core.secrets import REDACTED, Scrubber, env_secret_values
from specbook.core.secrets import redact_argv as _redact_argv
from specbook.core.secrets import redact_env as _redact_env

__all__ = ["REDACTED", "ManagedServer", "ServerSpec", "env_diff", "free_port", "redact_env", "tail_lines"]
# Marker put into every launched server's environment: descendants inherit it, so teardown finds
# even processes that left both the process group and the session. Not written to the Env line.
MARKER_ENV = "SPECBOOK_SERVER_ID"
LOG_TAIL_LINES = 40
TERM_GRACE_S = 20.0
KILL_GRACE_S = 10.0
_POLL_S = 0.5
PUMP_DRAIN_S = 5.0  # how long teardown waits for the last scrubbed log lines
# Where set, every server start is appended here as one JSON line (benchmarks/test_tiers.py counts the starts
# per engine and per test: the pytest node id comes from PYTEST_CURRENT_TEST, which subprocesses inherit).
STARTS_LOG_ENV = "SPECBOOK_SERVER_STARTS_LOG"


def _record_start(server: ManagedServer, event: str, **extra: object) -> None:
    path = os.environ.get(STARTS_LOG_ENV)
    if not path:
        return
    import json

    line = json.dumps({"event": event, "name": server.name, "program": Path(server.argv[0]).name,
                       "argv": server.argv[:4], "pid": server.pid, "test": os.environ.get("PYTEST_CURRENT_TEST"),
                       "time": time.time(), **extra})
    with contextlib.suppress(OSError):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


class ServerSpec(BaseModel):
    """What to launch and how to tell it is ready. `env` overrides the parent environment."""

    model_config = ConfigDict(extra="forbid")

    name: str
    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    unset_env: list[str] = Field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = Field(gt=0, lt=65536)
    health_path: str | None = "/health"
    models_path: str | None = "/v1/models"
    ready_timeout_s: float = Field(default=600, gt=0)
    log_path: Path
    cwd: Path | None = None
    # The name clients must send as "model" (engine adapters fill it in); None when unknown.
    model_name: str | None = None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the launching process dies (Linux), so a kernel killed by
    SIGTERM or a timeout, which never runs our teardown, does not leave an engine server behind."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux/glibc: teardown and atexit still cover normal exits
        pass


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Copy of `env` with secrets hidden (secret-looking names' values, URL passwords): specbook.core.secrets' rules."""
    return _redact_env(env)


def _pump_scrubbed(pipe: IO[bytes], sink: IO[bytes], scrub: Scrubber) -> None:
    """Copy a server's output into its log line by line with every known secret hidden (a reader thread)."""
    try:
        for line in iter(pipe.readline, b""):
            text = scrub(line.decode("utf-8", "surrogateescape"))
            sink.write(text.encode("utf-8", "surrogateescape"))
            sink.flush()
    except (OSError, ValueError):  # the log was closed under us (teardown gave up waiting): stop copying
        pass
    finally:
        pipe.close()


def env_diff(child: dict[str, str], parent: dict[str, str]) -> dict[str, str]:
    """Variables of `child` that are new or changed relative to `parent` (unredacted)."""
    return {k: v for k, v in child.items() if parent.get(k) != v}


def tail_lines(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """The last `n` lines of a text file ('' if it does not exist)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=n)).rstrip("\n")
    except FileNotFoundError:
        return ""


def _keep_old_log(path: Path) -> None:
    """Move an existing log aside (name.1.log, name.2.log, ...) so a relaunch never erases it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    i = 1
    while (old := path.with_name(f"{path.stem}.{i}{path.suffix}")).exists():
        i += 1
    path.rename(old)


def _status_text(code: int) -> str:
    """A wait status as Popen gives it (negative: the signal) in words."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _zombie_status(pid: int) -> int | None:
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


class _ChildWatch:
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
            try:
                root = psutil.Process(self._root_pid)
                for ch in root.children(recursive=True):
                    if ch.pid not in self._seen:
                        self._seen[ch.pid] = ch
                        with contextlib.suppress(psutil.Error):
                            self._names[ch.pid] = ch.name()
            except psutil.Error:
                pass
            dead = {pid for _, pid, _, _ in self._deaths}
            for pid, proc in list(self._seen.items()):
                if pid in dead:
                    continue
                status = _zombie_status(pid)
                if status is not None or not proc.is_running():
                    self._deaths.append((time.monotonic(), pid, self._names.get(pid, "?"), status))
            if self._root_ended is None and (_zombie_status(self._root_pid) is not None
                                             or not psutil.pid_exists(self._root_pid)):
                self._root_ended = time.monotonic()
                self._done.set()  # what died before the root is known now
            if self._root_ended is not None and time.monotonic() - self._root_ended > 1.0:
                return

    def first_death(self) -> str | None:
        self._done.wait(1.0)  # the root just ended: let the watch take its last look
        before = [d for d in self._deaths if self._root_ended is None or d[0] <= self._root_ended]
        if not before:
            return None
        _, pid, name, status = min(before)
        how = _status_text(status) if status is not None else "ended (its parent took its exit status)"
        how = how if how.startswith(("killed", "ended")) else f"ended with {how}"
        return f"pid {pid} ({name}) {how}"

    def close(self) -> None:
        self._stop.set()


def _alive(proc: psutil.Process) -> bool:
    # PID 1 of a container may never reap orphans: a zombie is dead for our purpose.
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"pid {p.pid} ({' '.join(p.cmdline())[:120]})")
        except psutil.Error:
            out.append(f"pid {p.pid}")
    return ", ".join(out)


_LIVE_SERVERS: set[ManagedServer] = set()


@atexit.register
def _stop_leftovers() -> None:
    # A crashed notebook or test must not leave an engine eating the cores.
    for srv in list(_LIVE_SERVERS):
        try:
            srv.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class ManagedServer:
    """One engine server process tree. `with ManagedServer(spec) as srv:` starts, waits ready, tears down."""

    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self.argv: list[str] = list(spec.argv)
        self.log_path: Path = Path(spec.log_path)
        self.launched_env: dict[str, str] = {}
        self.started_at: datetime | None = None
        self.stopped_at: datetime | None = None
        self.ready_s: float | None = None
        self.returncode: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[str] | None = None
        # Set when the server's argv or env holds a secret: its output then reaches the log through a
        # thread that hides those values (an engine may print its arguments or env), not directly.
        self._pump: threading.Thread | None = None
        self._t0 = 0.0
        self._marker = uuid.uuid4().hex
        self._known: dict[int, psutil.Process] = {}
        self._watch: _ChildWatch | None = None

    # -- properties -------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def model_name(self) -> str | None:
        return self.spec.model_name

    @property
    def name(self) -> str:
        return self.spec.name

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stopped_processes(self) -> list[str]:
        """This server's processes the OS has stopped (state T: SIGSTOP, a debugger), described."""
        out = []
        for p in self._descendants() if self._proc is not None else []:
            try:
                if p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                    out.append(f"pid {p.pid} ({p.name()})")
            except psutil.Error:
                continue
        return out

    def exit_description(self) -> str | None:
        """How the server process ended ("exit code 1", "killed by SIGKILL"), and, when one of its processes
        ended before it (vLLM's API server exits 0 by itself once its engine core is killed), which one and how
        ("after its process pid N (VLLM::EngineCore) was killed by SIGKILL"); None while it runs."""
        code = self._proc.poll() if self._proc is not None else None
        if code is None:
            return None
        own = _status_text(code)
        first = self._watch.first_death() if self._watch is not None else None
        if first is None:
            return own
        return f"{own}, after its process {first}"

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        if self._proc is not None and self._proc.poll() is not None:
            self._drain_log(PUMP_DRAIN_S)  # a dead server's last words are its most useful
        if self._log_fh:
            self._log_fh.flush()
        return tail_lines(self.log_path, n)

    def _drain_log(self, timeout_s: float) -> None:
        """Wait until the scrubbing reader has copied all output (the pipe closes when every process holding
        it has exited), at most `timeout_s`."""
        if self._pump is not None:
            self._pump.join(timeout_s)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> ManagedServer:
        """Launch the process (new session), log to `log_path` after one `Env:` line. Does not wait."""
        if self._proc is not None:
            raise ServerStartError(f"server {self.name!r} was already started (pid {self.pid})")
        parent = dict(os.environ)
        child = {k: v for k, v in parent.items() if k not in set(self.spec.unset_env)}
        child.update(self.spec.env)
        # What the launcher set, even when equal to the parent's value, plus whatever differs.
        launched = env_diff(child, parent) | {k: child[k] for k in self.spec.env}
        self.launched_env = redact_env(dict(sorted(launched.items())))
        child[MARKER_ENV] = self._marker
        hidden = env_secret_values(child)
        _redact_argv(self.argv, hidden)
        scrub = Scrubber(hidden) if hidden else None

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        _keep_old_log(self.log_path)
        self._log_fh = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - lives with the process
        try:
            self._log_fh.write(format_env_line(self.launched_env) + "\n")
            self._log_fh.flush()
        except OSError as exc:  # a full disk is named before any server starts, not found later as a lost log
            with contextlib.suppress(OSError):  # closing flushes the same unwritable buffer again
                self._log_fh.close()
            self._log_fh = None
            from specbook.core.diskwrite import disk_full_error, is_disk_full

            if is_disk_full(exc):
                raise disk_full_error(self.log_path, exc) from exc
            raise
        self.started_at = datetime.now(timezone.utc)
        self._t0 = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log_fh if scrub is None else subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=child,
                cwd=self.spec.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            self._log_fh.close()
            self._log_fh = None
            raise ServerStartError(
                f"server {self.name!r} could not be launched ({exc}): argv[0]={self.argv[0]!r}",
                log_path=str(self.log_path),
            ) from exc
        if scrub is not None:
            self._pump = threading.Thread(target=_pump_scrubbed, args=(self._proc.stdout, self._log_fh.buffer, scrub),
                                          name=f"log-{self.name}", daemon=True)
            self._pump.start()
        self._watch = _ChildWatch(self._proc.pid)
        _LIVE_SERVERS.add(self)
        _record_start(self, "start")
        return self

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Poll health, then the model list, while the process lives; returns seconds since start.

        On death or timeout the server is torn down and ServerStartError carries the log tail.
        """
        if self._proc is None:
            raise ServerStartError(f"server {self.name!r} was never started")
        if self.ready_s is not None:  # seen ready before (a server started ahead): keep when that was
            return self.ready_s
        timeout = self.spec.ready_timeout_s if timeout_s is None else timeout_s
        deadline = self._t0 + timeout
        paths = [p for p in (self.spec.health_path, self.spec.models_path) if p]
        try:
            with httpx.Client(base_url=self.base_url, timeout=5.0, trust_env=False) as http:
                for path in paths:
                    self._poll_until_ok(http, path, deadline, timeout)
        except BaseException as exc:  # also KeyboardInterrupt: never leave the engine behind
            try:
                self.stop()
            except ServerTeardownError as td:
                raise td from exc
            raise
        self.ready_s = time.monotonic() - self._t0
        _record_start(self, "ready", ready_s=round(self.ready_s, 2))
        return self.ready_s

    def _poll_until_ok(self, http: httpx.Client, path: str, deadline: float, timeout: float) -> None:
        last = "no answer yet"
        while True:
            code = self._proc.poll() if self._proc else None
            if code is not None:
                self.returncode = code
                raise ServerStartError(
                    f"server {self.name!r} (pid {self.pid}) exited with code {code} before it was ready",
                    log_path=str(self.log_path),
                    log_tail=self.log_tail(),
                )
            try:
                resp = http.get(path)
                if resp.status_code == 200:
                    self._check_it_is_ours(path, resp)
                    return
                last = f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"server {self.name!r} (pid {self.pid}) not ready after {timeout:.0f} s: "
                    f"GET {self.base_url}{path} -> {last}",
                    log_path=str(self.log_path),
                    log_tail=self.log_tail(),
                )
            time.sleep(_POLL_S)

    def _port_owner(self) -> psutil.Process | None:
        """The process listening on this server's port (None when the OS does not say)."""
        try:
            conns = psutil.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return None
        for c in conns:
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.spec.port and c.pid:
                try:
                    return psutil.Process(c.pid)
                except psutil.Error:
                    return None
        return None

    def _check_it_is_ours(self, path: str, resp: httpx.Response) -> None:
        """Readiness answered by this server, not by another process that holds (or took) the port: the
        listener must be one of our processes, and the model list must name the model we serve."""
        owner = self._port_owner()
        if owner is not None and owner.pid not in {p.pid for p in self._descendants()}:
            raise ServerStartError(
                f"server {self.name!r}: port {self.spec.port} is served by another process, pid {owner.pid} "
                f"({_describe([owner])}), not by this server (pid {self.pid}); it was taken between choosing and "
                "binding it, or another runner's server answers there",
                log_path=str(self.log_path), log_tail=self.log_tail(),
            )
        if path == self.spec.models_path and self.spec.model_name:
            try:
                served = {m.get("id") for m in resp.json().get("data", [])}
            except (ValueError, AttributeError):
                served = set()
            if self.spec.model_name not in served:
                raise ServerStartError(
                    f"server {self.name!r}: {self.base_url}{path} serves {sorted(str(m) for m in served) or 'no model'}, "
                    f"not {self.spec.model_name!r}: another server answers on port {self.spec.port}",
                    log_path=str(self.log_path), log_tail=self.log_tail(),
                )

    def _descendants(self) -> list[psutil.Process]:
        """Every live process of this server: the tree under the root, its session, and marker holders."""
        found: dict[int, psutil.Process] = {}
        if self._proc is not None:
            try:
                root = psutil.Process(self._proc.pid)
                found[root.pid] = root
                for ch in root.children(recursive=True):
                    found[ch.pid] = ch
            except psutil.NoSuchProcess:
                pass
        sid = self._proc.pid if self._proc is not None else None
        for p in psutil.process_iter():
            if p.pid in found or p.pid == os.getpid():
                continue
            try:
                if sid is not None and os.getsid(p.pid) == sid:
                    found[p.pid] = p
                elif p.environ().get(MARKER_ENV) == self._marker:
                    found[p.pid] = p
            except (psutil.Error, OSError):
                continue
        # Keep processes seen earlier: once the root dies its orphans lose the tree link.
        for pid, p in found.items():
            self._known.setdefault(pid, p)
        return [p for p in self._known.values() if _alive(p)]

    def _signal_all(self, sig: int, procs: list[psutil.Process]) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, sig)  # the session leader's pid is the group id
            except (ProcessLookupError, PermissionError):
                pass
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass

    def _wait_gone(self, grace_s: float) -> list[psutil.Process]:
        end = time.monotonic() + grace_s
        while True:
            if self._proc is not None:
                self._proc.poll()  # reap our own child so it does not linger as a zombie
            alive = self._descendants()
            if not alive or time.monotonic() >= end:
                return alive
            time.sleep(0.2)

    def stop(self, term_grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM the group and all descendants, SIGKILL stragglers, verify none survive (idempotent)."""
        if self._proc is None:
            return
        try:
            if self._watch is not None:
                self._watch.close()  # teardown's own deaths are no cause
            procs = self._descendants()
            if procs and self.stopped_processes():
                # a stopped server cannot shut down in order (continued, it would wait for its connections):
                # it is killed, and continued so that the kill is not held
                self._signal_all(signal.SIGKILL, procs)
                self._signal_all(signal.SIGCONT, procs)
                procs = self._wait_gone(KILL_GRACE_S)
            if procs:
                self._signal_all(signal.SIGTERM, procs)
                # a stopped (SIGSTOP, a hung debugger) process holds SIGTERM until it runs again
                self._signal_all(signal.SIGCONT, procs)
                procs = self._wait_gone(term_grace_s)
            if procs:
                self._signal_all(signal.SIGKILL, procs)
                procs = self._wait_gone(KILL_GRACE_S)
            try:
                self.returncode = self._proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            if procs:
                raise ServerTeardownError(
                    f"server {self.name!r}: processes survived SIGKILL: {_describe(procs)}",
                    log_path=str(self.log_path),
                    log_tail=self.log_tail(),
                )
        finally:
            self._drain_log(PUMP_DRAIN_S)
            if self._log_fh is not None:
                self._log_fh.close()
                self._log_fh = None
            if self.stopped_at is None:
                self.stopped_at = datetime.now(timezone.utc)
            _LIVE_SERVERS.discard(self)

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by this server's processes alive now (those seen before and the root's tree)."""
        if self._proc is None:
            return 0.0
        if not self._known:
            self._descendants()
        with contextlib.suppress(psutil.Error):
            for ch in psutil.Process(self._proc.pid).children(recursive=True):
                self._known.setdefault(ch.pid, ch)
        total = 0.0
        for p in list(self._known.values()):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def process_count(self) -> int:
        """How many processes this server runs now (its tree, its session, marker holders)."""
        return len(self._descendants()) if self._proc else 0

    def surviving_pids(self) -> list[int]:
        """Pids of this server's processes still alive (empty after a clean teardown)."""
        return [p.pid for p in self._known.values() if _alive(p)] if self._proc else []

    # -- context manager --------------------------------------------------------------------------
    def __enter__(self) -> ManagedServer:
        if self._proc is None:  # a server started ahead is entered where its unit uses it
            self.start()
        self.wait_ready()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else "stopped" if self._proc else "new"
        return f"ManagedServer({self.name!r}, {self.base_url}, pid={self.pid}, {state})"
