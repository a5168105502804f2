"""vLLM's own profiler: enable it at launch, drive it over HTTP, reduce its trace to a per-step cost split.

Launch: `--profiler-config {"profiler": "torch", "torch_profiler_dir": DIR, ...}` (vLLM's ProfilerConfig;
the older `VLLM_TORCH_PROFILER_DIR` variable is gone from the 0.32 source) plus
`VLLM_CUSTOM_SCOPES_FOR_PROFILING=1`, which turns on the model runner's named scopes
(`gpu_model_runner: forward`, `... sample`, `... draft`, ...) that the split is read from. The server
then answers POST /start_profile and /stop_profile; each worker writes `rank<N>.<id>.pt.trace.json`
into DIR on stop (gzip off, stacks off: faster to write). Once reduced, the traces are gzipped in place
(`compress_traces`): a CUDA trace of two prompts was 0.3-1 GB of JSON on the H200.

The trace: every engine step of a worker is one user annotation named
`execute_context_<n>(<tokens>)_generation_<n>(<tokens>)` (vLLM's annotate_profile), followed by the
runner's scopes for that step. A decode step is one with no context (prefill) request. Its period runs
from its annotation's start to the next step's: what the scopes named below do not cover in that
period is "rest" (input preparation, bookkeeping, the scheduler and the hop between engine core and
worker). A step counts only when the next one is a decode step too: the last step has no next one, and
before a new request's prefill the engine may have been idle waiting for that request.

CUDA (vLLM 0.26 on the H200): the CPU-side scopes only time kernel launches there; where the trace
holds `gpu_user_annotation` events (the same scopes as seen on the GPU stream) the parts are read from
those (reduced on the H200 with vLLM 0.26: the split reads the gpu timeline).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbook.engines.base import EngineConfig
from specbook.errors import EngineError

PROFILE_SCOPES_ENV = "VLLM_CUSTOM_SCOPES_FOR_PROFILING"

# Part of a decode step -> the model runner scope that times it (vllm/v1/worker/gpu_model_runner.py).
PART_SCOPES = {
    "target_forward": "gpu_model_runner: forward",
    "draft": "gpu_model_runner: draft",  # draft-model forwards, or the n-gram lookup
    "sampling": "gpu_model_runner: sample",  # sampling with rejection of the drafts
}
STEP_RE = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
TRACE_GLOB = "*.pt.trace.json*"  # plain, or gzipped once reduced (compress_traces)
PROFILES_WHOLE_SERVER = False  # the profiler records only between /start_profile and /stop_profile


def profiled_config(cfg: EngineConfig, trace_dir: Path) -> EngineConfig:
    """`cfg` with vLLM's torch profiler enabled, writing plain-JSON traces into `trace_dir`."""
    if any(a == "--profiler-config" or a.startswith("--profiler-config") for a in cfg.extra_args):
        raise EngineError("profiled pass: the engine config already sets --profiler-config in extra_args")
    profiler = {
        "profiler": "torch",
        "torch_profiler_dir": str(Path(trace_dir).resolve()),
        "torch_profiler_with_stack": False,
        "torch_profiler_use_gzip": False,
    }
    return cfg.model_copy(update={
        "extra_args": [*cfg.extra_args, "--profiler-config", json.dumps(profiler, sort_keys=True)],
        "env": {**cfg.env, PROFILE_SCOPES_ENV: "1"},
    })


def start_profile(base_url: str) -> None:
    _post(base_url, "/start_profile")


def stop_profile(base_url: str) -> None:
    """Stop and wait for the traces to be written (the answer comes once the workers have dumped them)."""
    _post(base_url, "/stop_profile")


def _post(base_url: str, path: str) -> None:
    import httpx

    resp = httpx.post(base_url.rstrip("/") + path, timeout=600, trust_env=False)
    if resp.status_code != 200:
        raise EngineError(f"vLLM {path} at {base_url}: HTTP {resp.status_code}: {resp.text[:300]} "
                          "(was the server launched with --profiler-config?)")


def worker_traces(trace_dir: Path) -> list[Path]:
    """The workers' traces in `trace_dir` (rank<N>.*), not the API server's front-end trace."""
    return sorted(p for p in Path(trace_dir).glob(TRACE_GLOB)
                  if p.name.startswith("rank") and p.name.endswith((".json", ".json.gz")))  # not a cut .gz.tmp


@dataclass(frozen=True)
class StepSplit:
    """Mean ms per decode step and its parts over `steps` decode steps of one trace."""

    steps: int
    step_ms: float
    parts_ms: dict[str, float]  # target_forward, draft, sampling, rest
    timeline: str  # "cpu" (host scopes) or "gpu" (gpu_user_annotation scopes)
    tokens_per_step: float  # tokens scheduled per decode step: the target's forward width (1 + drafts)
    source: str = "profiler"

    @property
    def note(self) -> str:
        return (f"vLLM torch profiler, {self.timeline} timeline; {self.tokens_per_step:.2f} tokens scheduled "
                "per step (1 + drafts proposed)")


def load_events(path: Path) -> list[dict[str, Any]]:
    try:
        if str(path).endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                doc = json.load(fh)
        else:
            doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"vLLM profiler trace {path}: cannot be read as JSON ({exc})") from exc
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise EngineError(f"vLLM profiler trace {path}: no traceEvents list")
    return events


def _complete(events: Iterable[dict[str, Any]], cat: str) -> list[dict[str, Any]]:
    return sorted((e for e in events if e.get("cat") == cat and e.get("ph") == "X" and "dur" in e),
                  key=lambda e: float(e["ts"]))


def reduce_events(events: list[dict[str, Any]], source: str = "trace") -> StepSplit:
    """The mean decode step of one worker's trace, split into target forward, draft, sampling and rest."""
    host = _complete(events, "user_annotation")
    steps = [e for e in host if STEP_RE.match(str(e.get("name", "")))]
    if len(steps) < 2:
        raise EngineError(f"vLLM profiler trace {source}: {len(steps)} annotated engine steps; need at least 2 "
                          f"(was {PROFILE_SCOPES_ENV}=1 set and a request running between start and stop?)")
    device = _complete(events, "gpu_user_annotation")
    scopes, timeline = (device, "gpu") if any(e.get("name") in PART_SCOPES.values() for e in device) else (host, "cpu")
    periods: list[float] = []
    sums = {part: 0.0 for part in PART_SCOPES}
    tokens = 0
    for step, nxt in zip(steps, steps[1:], strict=False):
        m, m_next = STEP_RE.match(step["name"]), STEP_RE.match(nxt["name"])
        assert m is not None and m_next is not None
        if int(m.group(1)) != 0 or int(m.group(3)) == 0:  # prefill in it, or nothing to decode
            continue
        if int(m_next.group(1)) != 0:  # a new request's prefill next: the gap may be idle time waiting for it
            continue
        t0, t1 = float(step["ts"]), float(nxt["ts"])
        periods.append(t1 - t0)
        tokens += int(m.group(4))
        for part, scope in PART_SCOPES.items():
            sums[part] += sum(min(float(e["ts"]) + float(e["dur"]), t1) - float(e["ts"])
                              for e in scopes if e.get("name") == scope and t0 <= float(e["ts"]) < t1)
    if not periods:
        raise EngineError(f"vLLM profiler trace {source}: no pure decode step followed by another step")
    n = len(periods)
    step_ms = sum(periods) / n / 1000.0
    parts = {part: total / n / 1000.0 for part, total in sums.items()}
    parts["rest"] = step_ms - sum(parts.values())
    return StepSplit(steps=n, step_ms=step_ms, parts_ms=parts, timeline=timeline, tokens_per_step=tokens / n)


def reduce_trace(path: Path) -> StepSplit:
    return reduce_events(load_events(path), source=str(path))


def compress_traces(trace_dir: Path) -> list[Path]:
    """Gzip every plain trace in `trace_dir` in place (fast level: JSON shrinks ~10x at it); the gzipped
    ones, which load_events and worker_traces read as they read the plain ones."""
    done = []
    for path in sorted(Path(trace_dir).glob("*.pt.trace.json")):
        target = path.with_name(path.name + ".gz")
        tmp = target.with_name(target.name + ".tmp")
        with open(path, "rb") as src, gzip.open(tmp, "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp.replace(target)
        path.unlink()
        done.append(target)
    return done


def measure(server: Any, requests: Any, trace_dir: Path) -> tuple[StepSplit, float]:
    """Send `requests` between /start_profile and /stop_profile; the rank-0 worker's trace reduced, and
    the requests' wall time under the profiler."""
    import time

    start_profile(server.base_url)
    t0 = time.monotonic()
    server.send(requests)
    wall = time.monotonic() - t0
    stop_profile(server.base_url)
    traces = worker_traces(trace_dir)
    if not traces:
        raise EngineError(f"vLLM profiled pass on {server.name}: no worker trace in {trace_dir} after /stop_profile")
    split = reduce_trace(traces[0])
    compress_traces(trace_dir)
    return split, wall
