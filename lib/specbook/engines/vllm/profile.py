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

import json
import math
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.errors import EngineError
from specbook.engines.base import EngineConfig
from specbook.engines.vllm.trace_plugin import STEP_TIMING_DIR_ENV, STEP_TIMING_SWITCH

if TYPE_CHECKING:
    from specbook.serve.logs import LogRange

PARTS = ("target_forward", "draft", "sampling")
STEPS_GLOB = "vllm-steps-*.jsonl"
PROFILES_WHOLE_SERVER = False  # the step timer measures only while its switch file exists
FLUSH_TIMEOUT_S = 10.0  # the engine's writer thread follows the last step by milliseconds


def profiled_config(cfg: EngineConfig, trace_dir: Path) -> EngineConfig:
    """`cfg` with specbook's step timer installed in every vLLM process (off until its switch is made)."""
    if STEP_TIMING_DIR_ENV in cfg.env:
        raise EngineError(f"profiled pass: the engine config already sets {STEP_TIMING_DIR_ENV} in env")
    return cfg.model_copy(update={"env": {**cfg.env, STEP_TIMING_DIR_ENV: str(Path(trace_dir).resolve())}})


def step_files(trace_dir: Path) -> list[Path]:
    return sorted(Path(trace_dir).glob(STEPS_GLOB))


def load_steps(trace_dir: Path) -> list[dict[str, Any]]:
    """The timed steps of the process that ran the model (the file with the most lines: the engine core, or
    the first tensor-parallel worker), in order; a torn last line (a process killed mid-write) left out."""
    best: list[dict[str, Any]] = []
    for path in step_files(trace_dir):
        lines = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        if len(lines) > len(best):
            best = lines
    return best


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


def is_decode(step: dict[str, Any]) -> bool:
    """No new request, something scheduled, and at most 1 + k tokens per request."""
    k = int(step.get("spec_k") or 0)
    return (int(step.get("new_reqs") or 0) == 0 and int(step.get("tokens") or 0) > 0
            and int(step.get("max_tokens_per_req") or 0) <= 1 + k)


def reduce_steps(steps: Iterable[dict[str, Any]], source: str = "steps") -> StepSplit:
    """The mean decode step of one process's timed steps, split into target forward, draft, sampling and rest."""
    steps = sorted(steps, key=lambda s: int(s["t0_ns"]))
    periods: list[float] = []
    sums = {part: 0.0 for part in PARTS}
    seen: set[str] = set()
    tokens = 0.0
    for step, nxt in zip(steps, steps[1:], strict=False):
        if not (is_decode(step) and is_decode(nxt)):
            continue
        periods.append((int(nxt["t0_ns"]) - int(step["t0_ns"])) / 1e6)
        tokens += int(step["tokens"]) / max(int(step["num_reqs"]), 1)
        for part, ms in (step.get("parts_ms") or {}).items():
            if part in sums:
                sums[part] += float(ms)
                seen.add(part)
    if not periods:
        raise EngineError(f"vLLM step timer {source}: {len(steps)} timed steps, no decode step followed by "
                          f"another (was {STEP_TIMING_DIR_ENV} set at launch and the switch on while requests ran?)")
    n = len(periods)
    runner = str(steps[0].get("runner") or "?")
    drafting = any(int(s.get("spec_k") or 0) for s in steps)
    # A part this runner does not time is unknown (NaN), not zero: V2 has no draft bracket, and times its target
    # only through CUDA-graph replays (none on CPU or with enforce_eager). No draft in a lane without one: 0.
    timed_by = {"v2": {"sampling", "target_forward"} & ({"sampling"} | seen)}.get(runner, set(PARTS))
    untimed = tuple(p for p in PARTS if p not in timed_by and (p != "draft" or drafting))
    parts = {p: (math.nan if p in untimed else sums[p] / n) for p in PARTS}
    step_ms = sum(periods) / n
    parts["rest"] = step_ms - sum(v for v in parts.values() if v == v)
    return StepSplit(steps=n, step_ms=step_ms, parts_ms=parts, timer=str(steps[0].get("timer") or "?"),
                     runner=runner, tokens_per_step=tokens / n, untimed=untimed)


def _switch(trace_dir: Path, on: bool) -> None:
    path = Path(trace_dir) / STEP_TIMING_SWITCH
    if on:
        path.write_text("specbook step timer: measuring while this file exists\n")
    else:
        path.unlink(missing_ok=True)


def _settled_lines(trace_dir: Path, timeout_s: float = FLUSH_TIMEOUT_S) -> int:
    """Wait until the engine's writer has written every timed step (the line count stops growing)."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while True:
        now = sum(p.read_bytes().count(b"\n") for p in step_files(trace_dir))
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.2)


@contextmanager
def recording(trace_dir: Path) -> Iterator[None]:
    """The step timer on for the block (its switch file made, then removed whatever happens)."""
    _switch(trace_dir, True)
    try:
        yield
    finally:
        _switch(trace_dir, False)


def split(trace_dir: Path) -> StepSplit:
    """The decode steps timed while the switch was on, reduced, once the engine's writer has written them all."""
    _settled_lines(trace_dir)
    steps = load_steps(trace_dir)
    if not steps:
        status = sorted(Path(trace_dir).glob("vllm-steps-*.status.json"))
        raise EngineError(f"vLLM profiled pass: no timed step in {trace_dir} "
                          + (f"(status: {status[0].read_text()[:400]})" if status
                             else "(no status file either: was the specbook plugin loaded by vLLM?)"))
    return reduce_steps(steps, source=str(trace_dir))


class StepTimerProfiler:
    """The cost-split capability of the vLLM adapter (specbook.engines.base.StepProfiler)."""

    profiles_whole_server = PROFILES_WHOLE_SERVER
    flush_wait_s = 0.0  # `split` waits for the writer itself

    def profiled_config(self, cfg: EngineConfig, trace_dir: Path) -> EngineConfig:
        return profiled_config(cfg, trace_dir)

    def recording(self, trace_dir: Path) -> AbstractContextManager[None]:
        return recording(trace_dir)

    def split(self, cfg: EngineConfig, log: LogRange, trace_dir: Path) -> StepSplit:
        del cfg, log  # the step timer writes its own files
        return split(trace_dir)
