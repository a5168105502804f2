"""Instruments one server can carry switched off: which of an engine's instruments switch at run time, and a
config with them installed.

A server launched `with_instruments` serves its timed windows first with every instrument installed and off,
then its untimed trace pass (tracepass.trace_pass switches tracing on around it) and its profiled pass
(costsplit.profile_phase switches the profiler on around it). Only an instrument the engine switches at run time
may ride on such a server (its tracer's `traces_whole_server`, its profiler's `profiles_whole_server` False);
the others keep a server of their own, since they slow every window from the start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specbook.engines import capability
from specbook.engines.base import ProfilesSteps, TracesProposals

if TYPE_CHECKING:
    from specbook.engines.base import EngineConfig

TRACE, PROFILE = "trace", "profile"


def switchable(engine: str) -> set[str]:
    """The instrumented passes ("trace", "profile") `engine` can serve on a server that served timed windows
    before: those whose instrument it installs off and switches on at run time."""
    out = set()
    traced = capability(engine, TracesProposals)
    if traced is not None and not getattr(traced.proposal_tracer, "traces_whole_server", True):
        out.add(TRACE)
    prof = capability(engine, ProfilesSteps)
    if prof is not None and not prof.profiler.profiles_whole_server:
        out.add(PROFILE)
    return out


def with_instruments(cfg: EngineConfig, *, trace_dir: Path | None = None,
                     profile_dir: Path | None = None) -> EngineConfig:
    """`cfg` with the proposal tracer (writing into `trace_dir`) and the step profiler (into `profile_dir`)
    installed, each only where its folder is given; the server is otherwise the same."""
    from specbook.measure.costsplit import profiler_of
    from specbook.measure.tracepass import traced_config

    if trace_dir is not None:
        cfg = traced_config(cfg, trace_dir)
    if profile_dir is not None:
        cfg = profiler_of(cfg.engine).profiled_config(cfg, profile_dir)
    return cfg
