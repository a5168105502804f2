"""Per-step cost split: mean ms per decode step split into target forward, draft, sampling and rest.

One split per engine x lane, from a separate profiled pass (never from a timed window: an instrument slows
a server down, and `overhead` says by how much; `scaled_splits` scales the measured parts to the step time
of the timed, uninstrumented requests):

    split = costsplit.profiled_pass(server_cfg, requests, run, name="prof-vllm-draft", lane="draft-int4")
    frame = costsplit.splits_frame([split, ...])   # plots.cost_split_bars(frame)

Where each figure comes from (`source`):
- "step_timer": specbook's step timer (engines/steptimer.py) in vLLM's processes (engines/vllm/profile.py,
  trace_plugin.py) or SGLang's scheduler (engines/sglang/profile.py, step_hooks.py): the target's forward, the
  draft and the sampling timed with CUDA events (wall clock on vLLM-CPU), graphs on.
- "profiler": vLLM's torch profiler, as runs made before the step timer recorded it (their host timeline
  holds no forward for a CUDA-graph replay: `split_notes` says so where a split shows it).
- "engine_log": llama-server's timings and speculative statistics at debug verbosity
  (engines/llamacpp/perf.py): the draft's calls are measured, the target's forward is not told apart
  from the host work around it (`target_and_rest`).
- "derived": no split from the engine; the target forward is taken as the spec-off lane's cost per
  token and the rest of the spec-on step is `spec_overhead` (`derived_split`).

The engine's profiler is an optional capability of its adapter (specbook.engines.base.StepProfiler: its
launch config, the instrument switched on around the window, the window's split); the profiled send is the
one measurement window (harness.Server.window).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.errors import EngineError
from specbook.engines import require
from specbook.engines.base import ProfilesSteps, StepProfiler
from specbook.store.units import set_aside_folder

if TYPE_CHECKING:
    import pandas as pd

    from specbook.engines.base import Engine, EngineConfig
    from specbook.serve.client import ChatRequest
    from specbook.store.runstore import RunContext

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
SOURCES = ("step_timer", "profiler", "engine_log", "derived")
OFF_LANE = "off"
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


def profiler_of(engine: str | Engine) -> StepProfiler:
    """The engine's step profiler; EngineError naming the engine (and those that have one) where it has none."""
    return require(engine, ProfilesSteps, "profiler", EngineError).profiler


def profile_dir(run: RunContext, name: str) -> Path:
    """run_dir/profiles/NAME, made empty: a cut attempt's traces set aside beside it (never read as these)."""
    trace_dir = Path(run.run_dir) / PROFILES_DIR / name
    set_aside_folder(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    return trace_dir


def profiled_pass(server_cfg: EngineConfig, requests: Sequence[ChatRequest], run: RunContext, *, name: str,
                  lane: str, engine_label: str | None = None) -> CostSplit:
    """Serve `server_cfg` with the engine's profiler enabled and run `profile_phase` on it: a server of its own.

    The server is recorded in the run's servers.jsonl like every other (`extra`: profiled_pass); its
    traces or log stay in the run folder (profiles/NAME/, logs/NAME.log).
    """
    from specbook.measure.harness import serve

    profiler = profiler_of(server_cfg.engine)
    trace_dir = profile_dir(run, name)
    cfg = profiler.profiled_config(server_cfg, trace_dir)
    with serve(cfg, run, name, extra={"profiled_pass": True, "lane": lane}) as server:
        return profile_phase(server, requests, trace_dir, lane=lane, engine_label=engine_label)


def profile_phase(server: Any, requests: Sequence[ChatRequest], trace_dir: Path, *, lane: str,
                  engine_label: str | None = None, forget: Callable[[], Any] | None = None) -> CostSplit:
    """The profiled phase on a server launched with `profiled_config(cfg, trace_dir)` (its own, or one that served
    timed windows before with the instrument off): send `requests` three times, warm-up, unprofiled (timed),
    profiled (timed, the instrument switched on around it); reduce what the engine reported to a CostSplit.
    `overhead` is the profiled wall over the unprofiled one (NaN where the engine profiles its whole life:
    llama.cpp's debug verbosity). `forget`: where the drafter remembers earlier requests (SGLang's NGRAM trie), what
    empties it; each request is then sent alone after it, in all three sends, so the split's drafts are a first
    serve's, as in the timed pass."""
    profiler = profiler_of(server.cfg.engine)

    def send() -> None:
        if forget is None:
            server.send(requests)
            return
        for request in requests:
            forget()
            server.send([request])

    send()  # warm-up
    t0 = time.monotonic()
    send()
    unprofiled = time.monotonic() - t0
    with profiler.recording(trace_dir):
        window = server.window(send, flush_wait_s=profiler.flush_wait_s)  # Server.send waits for the log
    split = profiler.split(server.cfg, window.log, trace_dir)
    profiled = window.wall_s
    overhead = math.nan if profiler.profiles_whole_server or unprofiled <= 0 else profiled / unprofiled
    return CostSplit(engine_label or server.cfg.engine, lane, split.source, split.steps, split.step_ms,
                     split.parts_ms, split.tokens_per_step, overhead=overhead, note=split.note)


# --------------------------------------------------------------------------------------------------
# reading a split: scaled to the timed step, parts out of proportion, what a source cannot see


def step_ms_of(decode_wall_s: float, decode_tokens: float, accepted_tokens: float) -> float:
    """ms per decode step of timed requests: each step emits its accepted drafts and one token of the target's,
    so decode tokens - accepted drafts = steps."""
    steps = decode_tokens - accepted_tokens
    return 1000.0 * decode_wall_s / steps if steps > 0 and decode_wall_s == decode_wall_s else math.nan


def scaled_splits(splits: pd.DataFrame, timed_step_ms: dict[tuple[str, str], float]) -> pd.DataFrame:
    """Per engine x lane x part: the part as measured in the profiled pass and scaled to the step time of the
    timed, uninstrumented requests (`timed_step_ms`, by (engine, lane)): measured x timed step / measured step.
    Columns: engine, lane, source, part, measured_ms, scaled_ms, share (of the measured step)."""
    import pandas as pd

    rows = []
    for r in splits.itertuples(index=False):
        timed = timed_step_ms.get((r.engine, r.lane), math.nan)
        scale = timed / r.step_ms if r.step_ms and timed == timed else math.nan
        for part in PARTS:
            ms = getattr(r, f"{part}_ms")
            if ms != ms:
                continue
            rows.append({"engine": r.engine, "lane": r.lane, "source": r.source, "part": PART_LABELS[part],
                         "measured_ms": ms, "scaled_ms": ms * scale, "share": ms / r.step_ms if r.step_ms else math.nan})
        rows.append({"engine": r.engine, "lane": r.lane, "source": r.source, "part": "step (all parts)",
                     "measured_ms": r.step_ms, "scaled_ms": timed, "share": 1.0})
    return pd.DataFrame(rows, columns=["engine", "lane", "source", "part", "measured_ms", "scaled_ms", "share"])


def out_of_proportion(splits: pd.DataFrame) -> list[str]:
    """Parts out of proportion: a draft dearer per drafted token than one forward of its target (the target's
    forward where the source times it, else the same engine's spec-off step: target and host, one token)."""
    notes = []
    for r in splits.itertuples(index=False):
        drafted = r.tokens_per_step - 1 if r.tokens_per_step == r.tokens_per_step else math.nan
        if not (r.draft_ms == r.draft_ms and drafted == drafted and drafted > 0 and r.draft_ms > 0):
            continue
        per_token = r.draft_ms / drafted
        if r.target_forward_ms == r.target_forward_ms and r.target_forward_ms > 0:
            target, what = r.target_forward_ms, "per target forward (all tokens of the step in one)"
        else:
            off = splits[(splits["engine"] == r.engine) & (splits["lane"] == OFF_LANE)]
            if off.empty:
                continue
            target, what = float(off["step_ms"].iloc[0]), "per spec-off step (target forward and host, one token)"
        if per_token > target:
            notes.append(f"{r.engine} {r.lane}: the draft is dearer per token than its target: {per_token:.3g} ms "
                         f"per drafted token ({r.draft_ms:.3g} ms for {drafted:.2g} tokens a step) vs {target:.3g} ms "
                         f"{what}")
    return notes


def split_notes(splits: pd.DataFrame) -> list[str]:
    """What a reader must know before reading the bars: a profiler split that could not see CUDA-graph replays
    (target forward 0 where the step ran a target), the profiler's own slowdown, and parts out of proportion."""
    notes = []
    prof = splits[splits["source"] == "profiler"]
    if len(prof):
        blind = prof[(prof["target_forward_ms"] == 0) & prof["note"].str.contains("cpu timeline", regex=False)]
        lo, hi = prof["overhead"].min(), prof["overhead"].max()
        slow = (f"{lo:.2f}-{hi:.2f}x" if lo != hi else f"{lo:.2f}x") if lo == lo else "an unmeasured"
        lanes = ", ".join(f"{r.engine} {r.lane}" for r in blind.itertuples(index=False))
        notes.append("This run's vLLM split comes from the torch profiler: "
                     + (f"its host timeline holds no forward for a CUDA-graph replay, so {lanes} reads target forward 0 "
                        "and the whole step as rest; " if len(blind) else "")
                     + f"its measured bars carry the profiler's own {slow} slowdown (the scaled column divides it "
                     "out); runs since time the forwards with CUDA events (specbook's step timer).")
    return notes + overhead_notes(splits) + out_of_proportion(splits)


def overhead_notes(splits: pd.DataFrame) -> list[str]:
    """A step-timer overhead below 1 (the instrumented send faster than the plain one) says that one pair of
    sends cannot resolve the timer's cost, not that timing made the engine faster: say so where it happens."""
    rows = splits[(splits["source"] == "step_timer") & (splits["overhead"] < 1.0)]
    if rows.empty:
        return []
    which = ", ".join(f"{r.engine} {r.lane} {r.overhead:.3g}x" for r in rows.itertuples(index=False))
    return [f"Step timer overhead below 1 ({which}): the timed send was faster than the plain one before it, so "
            "this pass's two sends do not resolve the timer's own cost (it is smaller than their run-to-run "
            "spread); read the parts' shares, not their sum against the plain send."]
