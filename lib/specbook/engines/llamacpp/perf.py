"""What llama-server reports of its own step costs: per-request timings and the speculative statistics.

At debug verbosity (`-lv 4`) llama-server prints, after each request's `print_timing` lines, its
speculative implementation's running totals:

    spec common_specu: statistics     draft-simple: #calls(b,g,a) =    2     28     28, ..., dur(b,g,a) = 0.089, 12410.409, 0.026 ms

`b`, `g` and `a` are the draft's begin, generate and accept calls; `dur` their summed wall time in ms
since the server started. The difference between a request's line and the previous one is that
request's share. With its `eval time = X ms / N tokens` and `draft acceptance = r (A accepted / D
generated)` this gives the mean decode step (the eval period emits N - 1 tokens, each step A_step + 1
of them, so it holds N - 1 - A steps) and, of that step, the draft's generation and the acceptance
calls. llama.cpp does not time the target's verification forward apart from its host work: that
remainder is one figure here (`target_and_rest`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from specbook.core.errors import EngineError
from specbook.engines.base import EngineConfig
from specbook.serve.logs import LogRange

VERBOSITY_ARGS = ["-lv", "4"]  # the statistics line is printed at debug verbosity only
# The debug verbosity is on for the server's whole life: no unprofiled pass on the same server to
# compare with, so the profiled pass reports no overhead for llama.cpp.
PROFILES_WHOLE_SERVER = True

_TASK = r"slot print_timing: id\s+\d+ \| task (\d+) \|"
EVAL_RE = re.compile(_TASK + r"\s+eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
ACCEPT_RE = re.compile(_TASK + r" draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")
STATS_RE = re.compile(
    r"statistics\s+(\S+): #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+),.*dur\(b,g,a\) =\s*([\d.]+),\s*([\d.]+),\s*([\d.]+) ms"
)


@dataclass(frozen=True)
class RequestSteps:
    """One request's decode period as llama-server reported it."""

    task: int
    implementation: str  # draft-simple, ngram-simple, ...
    eval_ms: float
    tokens: int
    accepted: int
    drafted: int
    draft_calls: int
    draft_ms: float  # generate calls
    accept_ms: float  # accept calls
    begin_ms: float  # begin calls

    @property
    def steps(self) -> int:
        return max(self.tokens - 1 - self.accepted, 0)


def parse_requests(lines: Iterable[str]) -> list[RequestSteps]:
    """Each request with an `eval time` line and a statistics line after it (running totals differenced)."""
    out: list[RequestSteps] = []
    pending: dict[str, tuple[int, float, int, int, int]] = {}
    prev_impl: dict[str, dict[str, float]] = {}
    for line in lines:
        if (m := EVAL_RE.search(line)) is not None:
            pending = {"eval": (int(m.group(1)), float(m.group(2)), int(m.group(3)), 0, 0)}
        elif (m := ACCEPT_RE.search(line)) is not None and "eval" in pending:
            task, ms, n, _, _ = pending["eval"]
            if int(m.group(1)) == task:
                pending["eval"] = (task, ms, n, int(m.group(2)), int(m.group(3)))
        elif (m := STATS_RE.search(line)) is not None:
            impl = m.group(1)
            prev = prev_impl.get(impl, {"g": 0, "dur_b": 0.0, "dur_g": 0.0, "dur_a": 0.0})
            now = {"g": int(m.group(3)), "dur_b": float(m.group(5)), "dur_g": float(m.group(6)),
                   "dur_a": float(m.group(7))}
            prev_impl[impl] = now
            if "eval" not in pending:
                continue
            task, ms, n, acc, drafted = pending.pop("eval")
            out.append(RequestSteps(
                task=task, implementation=impl, eval_ms=ms, tokens=n, accepted=acc, drafted=drafted,
                draft_calls=int(now["g"] - prev["g"]), draft_ms=now["dur_g"] - prev["dur_g"],
                accept_ms=now["dur_a"] - prev["dur_a"], begin_ms=now["dur_b"] - prev["dur_b"],
            ))
    return out


@dataclass(frozen=True)
class LlamaStepSplit:
    """Mean ms per decode step over `steps` steps of the given requests."""

    steps: int
    step_ms: float
    parts_ms: dict[str, float]  # draft, sampling (accept calls), target_and_rest
    tokens_per_step: float
    note: str
    source: str = "engine_log"


def step_split(requests: list[RequestSteps], source: str = "log") -> LlamaStepSplit:
    """Spec-on requests: their decode steps split into the draft's calls, acceptance and the remainder."""
    steps = sum(r.steps for r in requests)
    if steps == 0:
        raise EngineError(f"llama-server {source}: no decode steps with speculative statistics "
                          f"(launched with {' '.join(VERBOSITY_ARGS)} and a speculative lane?)")
    step_ms = sum(r.eval_ms for r in requests) / steps
    draft = sum(r.draft_ms + r.begin_ms for r in requests) / steps
    accept = sum(r.accept_ms for r in requests) / steps
    drafted = sum(r.drafted for r in requests)
    impl = ",".join(sorted({r.implementation for r in requests}))
    return LlamaStepSplit(steps=steps, step_ms=step_ms,
                          parts_ms={"draft": draft, "sampling": accept, "target_and_rest": step_ms - draft - accept},
                          tokens_per_step=(steps + drafted) / steps,  # the target's forward width
                          note=f"llama-server -lv 4 statistics ({impl}): draft begin+generate, accept calls timed; "
                               "the target's forward is not told apart from host work")


def eval_periods(lines: Iterable[str]) -> list[tuple[float, int]]:
    """(eval ms, tokens) of every request's `eval time` line."""
    return [(float(m.group(2)), int(m.group(3))) for line in lines if (m := EVAL_RE.search(line)) is not None]


def off_split(periods: list[tuple[float, int]], source: str = "log") -> LlamaStepSplit:
    """Spec-off requests: one token per step, nothing to split (target forward and host together)."""
    steps = sum(max(n - 1, 0) for _, n in periods)
    if steps == 0:
        raise EngineError(f"llama-server {source}: no `eval time` line with more than one token")
    step_ms = sum(ms for ms, _ in periods) / steps
    return LlamaStepSplit(steps=steps, step_ms=step_ms, parts_ms={"target_and_rest": step_ms}, tokens_per_step=1.0,
                          note="llama-server eval time, speculation off: one token per step")


def profiled_config(cfg: EngineConfig, trace_dir: Path) -> EngineConfig:
    """`cfg` at debug verbosity, so llama-server prints its speculative statistics (its log is the trace)."""
    del trace_dir  # llama-server writes what it reports into its log
    if cfg.speculative_config is None:  # spec off: the eval time line is printed at any verbosity
        return cfg
    return cfg.model_copy(update={"extra_args": [*cfg.extra_args, *VERBOSITY_ARGS]})


def split(cfg: EngineConfig, log: LogRange) -> LlamaStepSplit:
    """The requests of a measurement window, from the log lines it wrote (`log`)."""
    lines = log.text().splitlines()
    where = f"log {log.path}"
    if cfg.speculative_config is None:
        return off_split(eval_periods(lines), where)
    # The statistics are running totals since the server started: difference them over the whole log,
    # then keep the requests of the window.
    before = log.text_before().splitlines()
    earlier = len(parse_requests(before))
    return step_split(parse_requests([*before, *lines])[earlier:], where)


class LogStatisticsProfiler:
    """The cost-split capability of the llama.cpp adapter (specbook.engines.base.StepProfiler)."""

    profiles_whole_server = PROFILES_WHOLE_SERVER
    flush_wait_s = 0.0  # the window waits for each request's release line, written after its statistics

    def profiled_config(self, cfg: EngineConfig, trace_dir: Path) -> EngineConfig:
        return profiled_config(cfg, trace_dir)

    def recording(self, trace_dir: Path) -> AbstractContextManager[None]:
        del trace_dir  # on for the server's whole life
        return nullcontext()

    def split(self, cfg: EngineConfig, log: LogRange, trace_dir: Path) -> LlamaStepSplit:
        del trace_dir
        return split(cfg, log)


def eval_ms_per_token(timings: Iterable[dict]) -> float:
    """Mean eval ms per generated token from responses' `timings` (the spec-off lane's per-token cost)."""
    ms = n = 0.0
    for t in timings:
        ms += float(t["predicted_ms"])
        n += max(int(t["predicted_n"]) - 1, 0)  # the eval period emits all but the first token
    if n == 0:
        raise EngineError("llama-server timings: no generated tokens after the first")
    return ms / n
