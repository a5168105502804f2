"""Engine server lifecycle: launch from a typed spec, `Env:` line first in the log, readiness, teardown.

`ManagedServer` ties the parts together: launch (specbook.serve.launch: the spec, environment, log, process),
readiness (specbook.serve.readiness), the child watcher that names the process that ended first
(specbook.serve.childwatch), and teardown of the whole process tree (specbook.serve.teardown). The names other
modules import from here are re-exported.
"""

from __future__ import annotations

import atexit
import subprocess
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING

from specbook.core.errors import ServerStartError, ServerTeardownError
from specbook.core.secrets import REDACTED, Scrubber, env_secret_values
from specbook.core.secrets import redact_argv as _redact_argv
from specbook.serve.childwatch import ChildWatch, status_text
from specbook.serve.launch import (
    MARKER_ENV,
    PUMP_DRAIN_S,
    STARTS_LOG_ENV,
    ServerSpec,
    child_environment,
    env_diff,
    free_port,
    open_log,
    record_start,
    redact_env,
    spawn,
    start_pump,
)
from specbook.serve.logs import LOG_TAIL_LINES, tail_lines
from specbook.serve.readiness import poll_until_ready
from specbook.serve.teardown import KILL_GRACE_S, TERM_GRACE_S, ProcessTree, describe

if TYPE_CHECKING:
    import psutil

__all__ = [
    "KILL_GRACE_S",
    "LOG_TAIL_LINES",
    "MARKER_ENV",
    "PUMP_DRAIN_S",
    "REDACTED",
    "STARTS_LOG_ENV",
    "TERM_GRACE_S",
    "ManagedServer",
    "ServerSpec",
    "env_diff",
    "free_port",
    "redact_env",
    "tail_lines",
]

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
        self._tree: ProcessTree | None = None
        self._watch: ChildWatch | None = None

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

    def poll(self) -> int | None:
        """The server process's exit status once it has ended (as Popen gives it); None while it runs or
        before it was started."""
        return self._proc.poll() if self._proc else None

    def processes(self) -> list[psutil.Process]:
        """Every live process of this server (its tree, its session, marker holders); empty before start."""
        return self._tree.descendants() if self._tree is not None else []

    def stopped_processes(self) -> list[str]:
        """This server's processes the OS has stopped (state T: SIGSTOP, a debugger), described."""
        return self._tree.stopped() if self._tree is not None else []

    def exit_description(self) -> str | None:
        """How the server process ended ("exit code 1", "killed by SIGKILL"), and, when one of its processes
        ended before it (vLLM's API server exits 0 by itself once its engine core is killed), which one and how
        ("after its process pid N (VLLM::EngineCore) was killed by SIGKILL"); None while it runs."""
        code = self._proc.poll() if self._proc is not None else None
        if code is None:
            return None
        own = status_text(code)
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
        child, self.launched_env = child_environment(self.spec, self._marker)
        hidden = env_secret_values(child)
        _redact_argv(self.argv, hidden)
        scrub = Scrubber(hidden) if hidden else None
        self._log_fh = open_log(self.log_path, self.launched_env)
        self.started_at = datetime.now(timezone.utc)
        self._t0 = time.monotonic()
        try:
            self._proc = spawn(self.argv, child, self.spec.cwd, self._log_fh if scrub is None else subprocess.PIPE)
        except OSError as exc:
            self._log_fh.close()
            self._log_fh = None
            raise ServerStartError(
                f"server {self.name!r} could not be launched ({exc}): argv[0]={self.argv[0]!r}",
                log_path=str(self.log_path),
            ) from exc
        self._tree = ProcessTree(self._proc, self._marker)
        if scrub is not None:
            self._pump = start_pump(self._proc.stdout, self._log_fh.buffer, scrub, self.name)
        self._watch = ChildWatch(self._proc.pid)
        _LIVE_SERVERS.add(self)
        record_start(self, "start")
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
        try:
            poll_until_ready(self, self._t0 + timeout, timeout)
        except BaseException as exc:  # also KeyboardInterrupt: never leave the engine behind
            try:
                self.stop()
            except ServerTeardownError as td:
                raise td from exc
            raise
        self.ready_s = time.monotonic() - self._t0
        record_start(self, "ready", ready_s=round(self.ready_s, 2))
        return self.ready_s

    def stop(self, term_grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM the group and all descendants, SIGKILL stragglers, verify none survive (idempotent)."""
        if self._proc is None:
            return
        try:
            if self._watch is not None:
                self._watch.close()  # teardown's own deaths are no cause
            procs = self._tree.stop(term_grace_s) if self._tree is not None else []
            try:
                self.returncode = self._proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            if procs:
                raise ServerTeardownError(
                    f"server {self.name!r}: processes survived SIGKILL: {describe(procs)}",
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
        return self._tree.cpu_seconds() if self._tree is not None else 0.0

    def process_count(self) -> int:
        """How many processes this server runs now (its tree, its session, marker holders)."""
        return len(self._tree.descendants()) if self._tree is not None else 0

    def surviving_pids(self) -> list[int]:
        """Pids of this server's processes still alive (empty after a clean teardown)."""
        return self._tree.survivors() if self._tree is not None else []

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
