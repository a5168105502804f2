"""SGLang's per-step cost split, from specbook's step timer in its scheduler process (step_hooks.py, installed by
the launcher launch.py): the target's forward, the draft and the verification of every step, timed with CUDA
events on the current stream (graphs on).

Launch: `$SPECBOOK_STEP_TIMING_DIR=DIR` makes the adapter start SGLang through specbook's launcher, which
wraps SGLang's workers in each process it spawns (the server keeps its own config: graphs, overlap
scheduling). The timer measures only while DIR/on exists, so the same server serves its timed pass untimed
and its profiled window timed (`overhead` compares the two).

Reduction (specbook.engines.steptimer.decode_means): a decode step is one with no new request and 1 + k
tokens scheduled per request; its period runs to the next step's start when that one is a decode step too.
Parts are summed per step and averaged over the counted steps; what they leave of the period is "rest" (input
preparation, the verify plan, KV bookkeeping, the scheduler's own work between steps). Where the parts' device
times add up to more than the period (SGLang's overlap scheduler starts a step on the host before the device has
ended the last one), rest reads negative, and the split's note says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.errors import EngineError
from specbook.engines import steptimer
from specbook.engines.base import EngineConfig
from specbook.engines.common import SwitchedStepTimer
from specbook.engines.sglang.step_hooks import STEP_PREFIX
from specbook.engines.steptimer import STEP_TIMING_DIR_ENV

if TYPE_CHECKING:
    from collections.abc import Iterable

    from specbook.serve.logs import LogRange

PARTS = ("target_forward", "draft", "sampling")
LAUNCHER = Path(__file__).resolve().parent / "launch.py"


def profiled(cfg: EngineConfig) -> bool:
    """Whether `cfg` starts SGLang with specbook's step timer (through the launcher)."""
    return bool(cfg.env.get(STEP_TIMING_DIR_ENV))


@dataclass(frozen=True)
class SglangStepSplit:
    """Mean ms per decode step and its parts over `steps` decode steps."""

    steps: int
    step_ms: float
    parts_ms: dict[str, float]  # target_forward, draft, sampling, rest
    timer: str  # "cuda_events" or "wall_clock"
    tokens_per_step: float  # tokens scheduled per decode step per request (1 + k)
    source: str = "step_timer"

    @property
    def note(self) -> str:
        where = "CUDA events around each part (graphs on)" if self.timer == "cuda_events" else "wall-clock timers"
        text = (f"specbook step timer in SGLang's scheduler, {where}; {self.tokens_per_step:.2f} tokens scheduled "
                "per request per step (1 + k)")
        if self.parts_ms.get("rest", 0.0) < 0:
            text += ("; rest is negative: the parts' device times add up to more than the period between step "
                     "starts (SGLang's overlap scheduler starts a step on the host before the device ends the last)")
        return text


def reduce_steps(steps: Iterable[dict[str, Any]], source: str = "steps") -> SglangStepSplit:
    """The mean decode step of the scheduler's timed steps, split into target forward, draft, sampling, rest."""
    steps = list(steps)
    means = steptimer.decode_means(steps, PARTS)
    if not means.steps:
        raise EngineError(f"SGLang step timer {source}: {len(steps)} timed steps, no decode step followed by another "
                          f"(was {STEP_TIMING_DIR_ENV} set at launch and the switch on while requests ran?)")
    drafting = any(int(s.get("spec_k") or 0) for s in steps)
    parts = {p: means.sums[p] / means.steps for p in PARTS}
    if not drafting:
        parts["draft"] = 0.0
    parts["rest"] = means.step_ms - sum(v for v in parts.values() if not math.isnan(v))
    timer = str(min(steps, key=lambda s: int(s["t0_ns"])).get("timer") or "?")
    return SglangStepSplit(steps=means.steps, step_ms=means.step_ms, parts_ms=parts, timer=timer,
                           tokens_per_step=means.tokens_per_step)


def split(trace_dir: Path) -> SglangStepSplit:
    """The decode steps timed while the switch was on, reduced, once the scheduler's writer has written them."""
    steptimer.settled_lines(trace_dir, STEP_PREFIX)
    steps = steptimer.load_steps(trace_dir, STEP_PREFIX)
    if not steps:
        statuses = sorted(Path(trace_dir).glob(f"{STEP_PREFIX}-steps-*.status.json"))
        refused = {}
        for path in statuses:
            refused.update(json.loads(path.read_text()).get("refused") or {})
        raise EngineError(f"SGLang profiled pass: no timed step in {trace_dir} "
                          + (f"(refused: {refused})" if refused else
                             f"({len(statuses)} status files, none refusing)" if statuses else
                             "(no status file: was SGLang started through specbook's launcher?)"))
    return reduce_steps(steps, source=str(trace_dir))


class SglangStepProfiler(SwitchedStepTimer):
    """The cost-split capability of the SGLang adapter (specbook.engines.base.StepProfiler)."""

    def split(self, cfg: EngineConfig, log: LogRange, trace_dir: Path) -> SglangStepSplit:
        del cfg, log  # the step timer writes its own files
        return split(trace_dir)
