"""Per-step cost split: mean ms per decode step split into target forward, draft, sampling and rest.

One split per engine x lane, from a separate profiled pass (never from a timed window: profiling slows
a server down, and `overhead` says by how much):

    split = costsplit.profiled_pass(server_cfg, requests, run, name="prof-vllm-draft", lane="draft-int4")
    frame = costsplit.splits_frame([split, ...])   # plots.cost_split_bars(frame)

Where each figure comes from (`source`):
- "profiler": vLLM's own torch profiler (engines/vllm/profile.py): every part measured.
- "engine_log": llama-server's timings and speculative statistics at debug verbosity
  (engines/llamacpp/perf.py): the draft's calls are measured, the target's forward is not told apart
  from the host work around it (`target_and_rest`).
- "derived": no split from the engine; the target forward is taken as the spec-off lane's cost per
  token and the rest of the spec-on step is `spec_overhead` (`derived_split`).
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook import resume
from specbook.errors import EngineError

if TYPE_CHECKING:
    import pandas as pd

    from specbook.client import ChatRequest
    from specbook.engines.base import EngineConfig
    from specbook.runstore import RunContext

# Parts in stacking order. Engines fill the ones they can tell apart; the others stay NaN.
PARTS = ("target_forward", "draft", "sampling", "rest", "target_and_rest", "spec_overhead")
PART_LABELS = {
    "target_forward": "target forward",
    "draft": "draft (forwards / lookup)",
    "sampling": "sampling + rejection",
    "rest": "rest (host, scheduling)",
    "target_and_rest": "target forward + host (not told apart)",
    "spec_overhead": "speculation overhead (derived)",
}
SOURCES = ("profiler", "engine_log", "derived")
PROFILES_DIR = "profiles"  # run_dir/profiles/NAME: a profiled pass's traces


@dataclass(frozen=True)
class CostSplit:
    """Mean ms per decode step of one engine x lane and its parts (NaN: not told apart by this source)."""

    engine: str
    lane: str
    source: str
    steps: int
    step_ms: float
    parts_ms: dict[str, float]
    tokens_per_step: float = math.nan  # tokens the target's forward takes per decode step (1 + drafts)
    overhead: float = math.nan  # profiled pass wall / the same requests' unprofiled wall
    note: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise EngineError(f"cost split {self.engine}/{self.lane}: source {self.source!r} not one of {SOURCES}")
        unknown = set(self.parts_ms) - set(PARTS)
        if unknown:
            raise EngineError(f"cost split {self.engine}/{self.lane}: unknown parts {sorted(unknown)}")

    def row(self) -> dict[str, Any]:
        row = {k: v for k, v in asdict(self).items() if k != "parts_ms"}
        for part in PARTS:
            row[f"{part}_ms"] = float(self.parts_ms.get(part, math.nan))
        return row


def splits_frame(splits: Sequence[CostSplit]) -> pd.DataFrame:
    """One row per engine x lane: step_ms, one `<part>_ms` column per part, source, steps, overhead, note."""
    import pandas as pd

    cols = ["engine", "lane", "source", "steps", "step_ms", *(f"{p}_ms" for p in PARTS),
            "tokens_per_step", "overhead", "note"]
    return pd.DataFrame([s.row() for s in splits], columns=cols)


def derived_split(engine: str, lane: str, *, off_ms_per_token: float, on_ms_per_step: float, steps: int,
                  tokens_per_step: float = math.nan, note: str = "") -> CostSplit:
    """A split from matched lanes where the engine gives none: target forward = the spec-off lane's cost
    per token, speculation overhead = the spec-on step's cost beyond it (draft, verification's extra
    tokens, sampling, host)."""
    if not (off_ms_per_token > 0 and on_ms_per_step > 0):
        raise EngineError(f"derived cost split {engine}/{lane}: off ms/token ({off_ms_per_token}) and "
                          f"on ms/step ({on_ms_per_step}) must be > 0")
    parts = {"target_forward": off_ms_per_token, "spec_overhead": on_ms_per_step - off_ms_per_token}
    why = "derived: target forward = spec-off ms/token; overhead = spec-on ms/step - that"
    return CostSplit(engine, lane, "derived", steps, on_ms_per_step, parts, tokens_per_step,
                     note=f"{why}; {note}" if note else why)


# engine name -> its module with profiled_config(cfg, trace_dir) -> EngineConfig and
# measure(server, requests, trace_dir) -> (split with source/steps/step_ms/parts_ms/tokens_per_step/note, wall_s)
_PROFILERS = {
    "vllm": "specbook.engines.vllm.profile",
    "llamacpp": "specbook.engines.llamacpp.perf",
}


def profiled_pass(server_cfg: EngineConfig, requests: Sequence[ChatRequest], run: RunContext, *, name: str,
                  lane: str, engine_label: str | None = None) -> CostSplit:
    """Serve `server_cfg` with the engine's profiler enabled, send `requests` three times: warm-up,
    unprofiled (timed), profiled (timed); reduce what the engine reported to a CostSplit. `overhead` is
    the profiled wall over the unprofiled one (NaN where the engine profiles its whole life: llama.cpp's
    debug verbosity).

    The server is recorded in the run's servers.jsonl like every other (`extra`: profiled_pass); its
    traces or log stay in the run folder (profiles/NAME/, logs/NAME.log).
    """
    from specbook.harness import serve

    module_name = _PROFILERS.get(server_cfg.engine)
    if module_name is None:
        raise EngineError(f"profiled pass: no profiler for engine {server_cfg.engine!r} (known: {sorted(_PROFILERS)})")
    profiler = importlib.import_module(module_name)
    trace_dir = Path(run.run_dir) / PROFILES_DIR / name
    resume.set_aside_folder(trace_dir)  # a resumed run: a cut attempt's profiler traces are never read as these
    trace_dir.mkdir(parents=True, exist_ok=True)
    cfg = profiler.profiled_config(server_cfg, trace_dir)
    with serve(cfg, run, name, extra={"profiled_pass": True, "lane": lane}) as server:
        server.send(requests)  # warm-up
        t0 = time.monotonic()
        server.send(requests)
        unprofiled = time.monotonic() - t0
        split, profiled = profiler.measure(server, requests, trace_dir)
    overhead = math.nan if profiler.PROFILES_WHOLE_SERVER or unprofiled <= 0 else profiled / unprofiled
    return CostSplit(engine_label or server_cfg.engine, lane, split.source, split.steps, split.step_ms,
                     split.parts_ms, split.tokens_per_step, overhead=overhead, note=split.note)
