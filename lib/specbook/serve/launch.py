"""What to launch and launching it: the spec, the child's environment (with the marker), the log opened with its
`Env:` line, the process in its own session, and the reader that hides secrets from the log."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from specbook.core.envline import format_env_line
from specbook.core.secrets import Scrubber
from specbook.core.secrets import redact_env as _redact_env

if TYPE_CHECKING:
    from specbook.serve.server import ManagedServer

# Marker put into every launched server's environment: descendants inherit it, so teardown finds
# even processes that left both the process group and the session. Not written to the Env line.
MARKER_ENV = "SPECBOOK_SERVER_ID"
PUMP_DRAIN_S = 5.0  # how long teardown waits for the last scrubbed log lines
# Where set, every server start is appended here as one JSON line (benchmarks/test_tiers.py counts the starts
# per engine and per test: the pytest node id comes from PYTEST_CURRENT_TEST, which subprocesses inherit).
STARTS_LOG_ENV = "SPECBOOK_SERVER_STARTS_LOG"


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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Copy of `env` with secrets hidden (secret-looking names' values, URL passwords): specbook.core.secrets' rules."""
    return _redact_env(env)


def env_diff(child: dict[str, str], parent: dict[str, str]) -> dict[str, str]:
    """Variables of `child` that are new or changed relative to `parent` (unredacted)."""
    return {k: v for k, v in child.items() if parent.get(k) != v}


def child_environment(spec: ServerSpec, marker: str) -> tuple[dict[str, str], dict[str, str]]:
    """(the server's environment, marker included; what the launcher set, redacted, for the `Env:` line)."""
    parent = dict(os.environ)
    child = {k: v for k, v in parent.items() if k not in set(spec.unset_env)}
    child.update(spec.env)
    # What the launcher set, even when equal to the parent's value, plus whatever differs.
    launched = env_diff(child, parent) | {k: child[k] for k in spec.env}
    launched_env = redact_env(dict(sorted(launched.items())))
    child[MARKER_ENV] = marker
    return child, launched_env


def keep_old_log(path: Path) -> None:
    """Move an existing log aside (name.1.log, name.2.log, ...) so a relaunch never erases it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    i = 1
    while (old := path.with_name(f"{path.stem}.{i}{path.suffix}")).exists():
        i += 1
    path.rename(old)


def open_log(path: Path, launched_env: dict[str, str]) -> IO[str]:
    """The server's log, opened with its `Env:` line written (an older log moved aside first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keep_old_log(path)
    fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - lives with the process
    try:
        fh.write(format_env_line(launched_env) + "\n")
        fh.flush()
    except OSError as exc:  # a full disk is named before any server starts, not found later as a lost log
        with contextlib.suppress(OSError):  # closing flushes the same unwritable buffer again
            fh.close()
        from specbook.core.diskwrite import disk_full_error, is_disk_full

        if is_disk_full(exc):
            raise disk_full_error(path, exc) from exc
        raise
    return fh


def die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the launching process dies (Linux), so a kernel killed by
    SIGTERM or a timeout, which never runs our teardown, does not leave an engine server behind."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux/glibc: teardown and atexit still cover normal exits
        pass


def spawn(argv: list[str], env: dict[str, str], cwd: Path | None, stdout: IO[str] | int) -> subprocess.Popen[bytes]:
    """The server process in its own session (one signal reaches its whole group), output and errors to
    `stdout`, told to die with its launcher."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


def pump_scrubbed(pipe: IO[bytes], sink: IO[bytes], scrub: Scrubber) -> None:
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


def start_pump(pipe: IO[bytes], sink: IO[bytes], scrub: Scrubber, name: str) -> threading.Thread:
    """The running reader thread of pump_scrubbed."""
    pump = threading.Thread(target=pump_scrubbed, args=(pipe, sink, scrub), name=f"log-{name}", daemon=True)
    pump.start()
    return pump


def record_start(server: ManagedServer, event: str, **extra: object) -> None:
    """Append the server's start or readiness to $SPECBOOK_SERVER_STARTS_LOG, where that is set."""
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
