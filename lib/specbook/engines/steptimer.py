"""specbook's step timer, shared by the engines that run it inside their own processes (vLLM's general plugin,
SGLang's launcher), and the reading of what it wrote.

In the engine's process (standard library only: SGLang's launcher loads this file by path, so that its
processes import nothing of specbook's packages): a `StepTimer` takes one engine step at a time (`begin` with
the step's scheduled work, `enter`/`leave` around its parts, `end_step`); each part and the step are bracketed
by CUDA events on the current stream where the engine runs on a GPU (CUDA-graph replays are timed where they
run) and by wall-clock timers otherwise. A writer thread waits for the events and appends one JSON line per
step to DIR/<prefix>-steps-<pid>.jsonl, so the engine never waits for the GPU. It measures only while the
file DIR/on exists, so one server can be timed with and without it.

On the host: `recording` makes that switch around a window, `load_steps` reads the lines once the writer has
written them, and `decode_means` averages the decode steps (the engine's reduction names the parts).

A step line: {"schema", "pid", "timer", "t0_ns", "host_ms", "device_ms", "parts_ms", "parts_host_ms",
"runner", "spec_k", "num_reqs", "tokens", "new_reqs", "max_tokens_per_req"}: parts_ms sums each part's device
time (CUDA events; wall clock without CUDA); only the outermost open part is timed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP_TIMING_DIR_ENV = "SPECBOOK_STEP_TIMING_DIR"
STEP_TIMING_SWITCH = "on"  # the step timer measures while DIR/on exists
STEP_SCHEMA = 1
FLUSH_TIMEOUT_S = 10.0  # the engine's writer thread follows the last step by milliseconds


def steps_glob(prefix: str) -> str:
    return f"{prefix}-steps-*.jsonl"


# --------------------------------------------------------------------------------------------------
# in the engine's process


class Bracket:
    """One timed part: host times always, CUDA events where the step timer runs on a GPU."""

    __slots__ = ("part", "t0", "t1", "e0", "e1")

    def __init__(self, part: str, events: Any | None):
        self.part = part
        self.t0 = time.perf_counter_ns()
        self.t1 = self.t0
        self.e0 = self.e1 = None
        if events is not None:
            self.e0, self.e1 = events(enable_timing=True), events(enable_timing=True)
            self.e0.record()

    def close(self) -> None:
        if self.e1 is not None:
            self.e1.record()
        self.t1 = time.perf_counter_ns()

    def host_ms(self) -> float:
        return (self.t1 - self.t0) / 1e6

    def device_ms(self) -> float | None:
        return None if self.e0 is None else float(self.e0.elapsed_time(self.e1))


class StepTimer:
    """This process's step timer: the step in progress, the outermost part open in it, and a writer thread
    that turns finished steps into lines (waiting for their CUDA events off the engine's thread)."""

    def __init__(self, folder: Path, *, cuda: bool, prefix: str):
        import queue

        self.folder = folder
        self.switch = folder / STEP_TIMING_SWITCH
        self.pid = os.getpid()
        self.path = folder / f"{prefix}-steps-{self.pid}.jsonl"
        self.timer = "cuda_events" if cuda else "wall_clock"
        self._events = None
        if cuda:
            import torch

            self._events = torch.cuda.Event
        self.step: dict[str, Any] | None = None
        self.open_part: Bracket | None = None
        self.in_execute = False
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="specbook-step-timer", daemon=True)
        self._writer.start()

    def on(self) -> bool:
        return os.path.exists(self.switch)

    def begin(self, fields: Any) -> bool:
        """A step starts, unless the switch is off; whether it is timed. `fields()` gives its scheduled work
        (runner, spec_k, num_reqs, tokens, new_reqs, max_tokens_per_req), read only for a timed step."""
        self.open_part = None
        if not self.on():
            self.step = None
            return False
        self.step = {**fields(), "whole": Bracket("step", self._events), "parts": []}
        self.in_execute = True
        return True

    def executed(self) -> None:
        self.in_execute = False

    def enter(self, part: str, *, in_execute_only: bool = False) -> Bracket | None:
        """A part starts, unless no step is timed or another part is open (the outermost one counts);
        `in_execute_only`: only while the step's execution is open (`executed` not yet called)."""
        if self.step is None or self.open_part is not None or (in_execute_only and not self.in_execute):
            return None
        self.open_part = Bracket(part, self._events)
        return self.open_part

    def leave(self, bracket: Bracket | None) -> None:
        if bracket is None or self.step is None:
            return
        bracket.close()
        self.step["parts"].append(bracket)
        self.open_part = None

    def end_step(self) -> None:
        step, self.step, self.open_part = self.step, None, None
        if step is None:
            return
        step["whole"].close()
        self._queue.put(step)

    def _write_loop(self) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            while True:
                step = self._queue.get()
                fh.write(json.dumps(step_line(step, pid=self.pid, timer=self.timer)) + "\n")
                fh.flush()


def step_line(step: dict[str, Any], *, pid: int, timer: str) -> dict[str, Any]:
    """The JSON line of a finished step (its CUDA events waited for)."""
    step = dict(step)
    whole = step.pop("whole")
    parts = step.pop("parts")
    if whole.e1 is not None:
        whole.e1.synchronize()
    parts_ms: dict[str, float] = {}
    host_ms: dict[str, float] = {}
    for b in parts:
        device = b.device_ms()
        parts_ms[b.part] = parts_ms.get(b.part, 0.0) + (device if device is not None else b.host_ms())
        host_ms[b.part] = host_ms.get(b.part, 0.0) + b.host_ms()
    return {"schema": STEP_SCHEMA, "pid": pid, "timer": timer, "t0_ns": whole.t0, "host_ms": whole.host_ms(),
            "device_ms": whole.device_ms(), "parts_ms": parts_ms, "parts_host_ms": host_ms, **step}


def timed(timer: StepTimer | Callable[[], StepTimer | None], part: str, fn: Any, *,
          in_execute_only: bool = False) -> Any:
    """`fn` (a method) with its calls timed as `part` of the step in progress. `timer` may be a callable giving
    the process's timer at each call, or None before it has one (SGLang's is made at the scheduler's first step)."""
    timer_now = timer if callable(timer) else (lambda: timer)

    def wrapper(self, *args, **kwargs):
        current = timer_now()
        bracket = current.enter(part, in_execute_only=in_execute_only) if current is not None else None
        try:
            return fn(self, *args, **kwargs)
        finally:
            if bracket is not None:
                current.leave(bracket)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


# --------------------------------------------------------------------------------------------------
# on the host: the switch, the lines, the decode steps


def step_files(trace_dir: Path, prefix: str) -> list[Path]:
    return sorted(Path(trace_dir).glob(steps_glob(prefix)))


def load_steps(trace_dir: Path, prefix: str) -> list[dict[str, Any]]:
    """The timed steps of the process that ran the model (the file with the most lines: the engine core, the
    scheduler, or the first tensor-parallel worker), in order; a torn last line (a process killed mid-write)
    left out."""
    best: list[dict[str, Any]] = []
    for path in step_files(trace_dir, prefix):
        lines = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        if len(lines) > len(best):
            best = lines
    return best


def switch(trace_dir: Path, on: bool) -> None:
    path = Path(trace_dir) / STEP_TIMING_SWITCH
    if on:
        path.write_text("specbook step timer: measuring while this file exists\n")
    else:
        path.unlink(missing_ok=True)


@contextmanager
def recording(trace_dir: Path) -> Iterator[None]:
    """The step timer on for the block (its switch file made, then removed whatever happens)."""
    switch(trace_dir, True)
    try:
        yield
    finally:
        switch(trace_dir, False)


def settled_lines(trace_dir: Path, prefix: str, timeout_s: float = FLUSH_TIMEOUT_S) -> int:
    """Wait until the engine's writer has written every timed step (the line count stops growing)."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while True:
        now = sum(p.read_bytes().count(b"\n") for p in step_files(trace_dir, prefix))
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.2)


def is_decode(step: dict[str, Any]) -> bool:
    """No new request, something scheduled, and at most 1 + k tokens per request."""
    k = int(step.get("spec_k") or 0)
    return (int(step.get("new_reqs") or 0) == 0 and int(step.get("tokens") or 0) > 0
            and int(step.get("max_tokens_per_req") or 0) <= 1 + k)


@dataclass(frozen=True)
class DecodeMeans:
    """Over the counted decode steps: how many, the mean period, each part's summed ms, the parts seen."""

    steps: int
    step_ms: float
    sums: dict[str, float]
    seen: frozenset[str]
    tokens_per_step: float


def decode_means(steps: Iterable[dict[str, Any]], parts: Iterable[str]) -> DecodeMeans:
    """A decode step's period runs from its start to the next step's start, counted only when the next one is a
    decode step too (before a new request's prefill the engine may have waited for that request)."""
    steps = sorted(steps, key=lambda s: int(s["t0_ns"]))
    periods: list[float] = []
    sums = {part: 0.0 for part in parts}
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
    n = len(periods)
    return DecodeMeans(steps=n, step_ms=sum(periods) / n if n else float("nan"), sums=sums,
                       seen=frozenset(seen), tokens_per_step=tokens / n if n else float("nan"))
