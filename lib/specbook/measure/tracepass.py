"""The trace pass: a separate, untimed pass on a server launched with tracing on, giving a TraceSet.

    cfg = traced_config(cfg, trace_dir)                  # the engine's tracer switches tracing on
    with harness.serve(cfg, run, name) as server:
        traces = trace_pass(server, requests, trace_dir)

An engine whose tracer switches at run time (`traces_whole_server` False: vLLM's plugin) records only during
`trace_pass`, so the same server can serve timed windows before it with tracing installed and off.
How tracing is switched on and how a pass is read back is the engine's proposal tracer (an optional
capability, specbook.engines.base.ProposalTracer); an engine without one is refused naming it. Requests go
one at a time, non-streamed, with what the tracer adds to them (e.g. asking for the token ids). The pass is
a measurement window of its own (harness.Server.window): /metrics before and after, so the accepted counts
derived from the traces can be checked against the engine's counters for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specbook.engines import require
from specbook.engines.base import ProposalTracer, TracedPass, TracesProposals
from specbook.traces.records import RequestTrace, TraceError, records_frame
from specbook.traces.traceset import TraceSet

if TYPE_CHECKING:
    from specbook.engines.base import Engine, EngineConfig
    from specbook.measure.harness import Server
    from specbook.serve.client import ChatRequest

__all__ = ["TRACE_NOTE", "RequestTrace", "TraceSet", "trace_pass", "traced_config", "tracer_of"]

TRACE_NOTE = "proposal traces come from a separate, untimed trace pass (debug logging / trace plugin on)"


def tracer_of(engine: str | Engine) -> ProposalTracer:
    """The engine's proposal tracer; TraceError naming the engine (and those that have one) where it has none."""
    return require(engine, TracesProposals, "proposal tracer", TraceError).proposal_tracer


def traced_config(cfg: EngineConfig, trace_dir: str | Path) -> EngineConfig:
    """`cfg` with tracing on (the same server otherwise)."""
    folder = Path(trace_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return tracer_of(cfg.engine).traced_config(cfg, folder)


def trace_pass(server: Server, requests: Sequence[ChatRequest], trace_dir: str | Path, *,
               flush_wait_s: float = 1.0) -> TraceSet:
    """Send `requests` one at a time to a server started with `traced_config`; its TraceSet. A lane whose
    proposals cannot be traced on this build gives a TraceSet with `untraceable` saying why."""
    tracer = tracer_of(server.engine)
    spec = server.cfg.speculative_config or {}
    method = spec.get("method") or ("draft_model" if spec.get("model") else None)
    sent = [req.model_copy(update={"extra_body": {**req.extra_body, **tracer.extra_body}}) for req in requests]
    with tracer.recording(Path(trace_dir)):  # on for this pass only where the engine switches it at run time
        window = server.window(lambda: [server.post_raw(req) for req in sent], flush_wait_s=flush_wait_s,
                               answered=len)
    counters = window.acceptance
    engine = server.cfg.engine
    try:
        reading = tracer.read(TracedPass(server.name, server.base_url, Path(trace_dir), window.log.text(),
                                         window.result, requests))
    except TraceError as exc:
        return TraceSet(engine, server.name, method, records_frame([]), [], counters, untraceable=str(exc),
                        notes=[TRACE_NOTE], wall_s=window.wall_s)
    frame = records_frame(reading.records)
    untraceable = None
    if method and not len(frame):
        untraceable = f"{server.name}: speculation {method} is on but the pass recorded no proposal"
    elif len(frame) and not frame["proposed"].map(len).any() and counters.draft_tokens:
        untraceable = f"{server.name}: the engine drafted tokens but the trace holds no proposed ids"
    return TraceSet(engine, server.name, method, frame, reading.requests, counters, untraceable,
                    [TRACE_NOTE, *reading.notes], window.wall_s)
