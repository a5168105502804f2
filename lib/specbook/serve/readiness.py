"""Is the server ready, and is it ours? Health, then the model list, polled while the process lives; the answer
must come from one of its processes and name the model it serves."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import psutil

from specbook.core.errors import ServerStartError
from specbook.serve.teardown import describe

if TYPE_CHECKING:
    from specbook.serve.server import ManagedServer

POLL_S = 0.5


def poll_until_ready(server: ManagedServer, deadline: float, timeout: float) -> None:
    """Each readiness path in turn answers 200, from this server, by `deadline` (monotonic); else
    ServerStartError with the log tail (the server died, timed out, or another process answers)."""
    paths = [p for p in (server.spec.health_path, server.spec.models_path) if p]
    with httpx.Client(base_url=server.base_url, timeout=5.0, trust_env=False) as http:
        for path in paths:
            _poll_until_ok(server, http, path, deadline, timeout)


def _poll_until_ok(server: ManagedServer, http: httpx.Client, path: str, deadline: float, timeout: float) -> None:
    last = "no answer yet"
    while True:
        code = server.poll()
        if code is not None:
            server.returncode = code
            raise ServerStartError(
                f"server {server.name!r} (pid {server.pid}) exited with code {code} before it was ready",
                log_path=str(server.log_path),
                log_tail=server.log_tail(),
            )
        try:
            resp = http.get(path)
            if resp.status_code == 200:
                _check_it_is_ours(server, path, resp)
                return
            last = f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        if time.monotonic() >= deadline:
            raise ServerStartError(
                f"server {server.name!r} (pid {server.pid}) not ready after {timeout:.0f} s: "
                f"GET {server.base_url}{path} -> {last}",
                log_path=str(server.log_path),
                log_tail=server.log_tail(),
            )
        time.sleep(POLL_S)


def port_owner(port: int) -> psutil.Process | None:
    """The process listening on `port` (None when the OS does not say)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            try:
                return psutil.Process(c.pid)
            except psutil.Error:
                return None
    return None


def _check_it_is_ours(server: ManagedServer, path: str, resp: httpx.Response) -> None:
    """Readiness answered by this server, not by another process that holds (or took) the port: the
    listener must be one of our processes, and the model list must name the model we serve."""
    spec = server.spec
    owner = port_owner(spec.port)
    if owner is not None and owner.pid not in {p.pid for p in server.processes()}:
        raise ServerStartError(
            f"server {server.name!r}: port {spec.port} is served by another process, pid {owner.pid} "
            f"({describe([owner])}), not by this server (pid {server.pid}); it was taken between choosing and "
            "binding it, or another runner's server answers there",
            log_path=str(server.log_path), log_tail=server.log_tail(),
        )
    if path == spec.models_path and spec.model_name:
        try:
            served = {m.get("id") for m in resp.json().get("data", [])}
        except (ValueError, AttributeError):
            served = set()
        if spec.model_name not in served:
            raise ServerStartError(
                f"server {server.name!r}: {server.base_url}{path} serves {sorted(str(m) for m in served) or 'no model'}, "
                f"not {spec.model_name!r}: another server answers on port {spec.port}",
                log_path=str(server.log_path), log_tail=server.log_tail(),
            )
