"""specbook's step timer in SGLang's scheduler process: which SGLang methods make a step and its parts.

Installed by the launcher (specbook.engines.sglang.launch) as SGLang imports each module below, only where
$SPECBOOK_STEP_TIMING_DIR is set; standard library only at import (the launcher loads this file by path, and
is handed the shared timer module, specbook.engines.steptimer).

A step is one call of the worker the scheduler drives: the speculative worker's `forward_batch_generation`
(EAGLEWorkerV2, which STANDALONE's draft-model worker is; NGRAMWorker), or, with speculation off,
TpModelWorker's. Its parts, each the outermost open one:
    target_forward  ModelRunner.forward (the target's layers, graphed or eager; a draft forward runs inside
                    `draft`, so it is never counted here)
    draft           EagleDraftWorker.draft and ._draft_extend_for_decode (the draft model's k forwards and its
                    pass over the accepted tokens); NGRAMWorker._prepare_for_speculative_decoding (the trie
                    lookup on the host)
    sampling        eagle_sample (verification of the drafts), ModelRunner.sample (speculation off)
The step's scheduled work: requests in the batch; a prefill (an extend that is not a target verify) counts its
requests as new, so it is never a decode step; a decode step schedules 1 + k tokens per request (k = speculative_num_draft_tokens - 1).

Known API: SGLang 0.5.15.post1 (spec v2 workers). `api_problems` names what a module's source lacks; `install`
writes it to the status file (DIR/sglang-steps-<pid>.status.json) and leaves that module unpatched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

STEP_PREFIX = "sglang"  # DIR/sglang-steps-<pid>.jsonl
RUNNER = "sglang-spec-v2"

TP_WORKER = "sglang.srt.managers.tp_worker"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
EAGLE_V2 = "sglang.srt.speculative.eagle_worker_v2"
NGRAM = "sglang.srt.speculative.ngram_worker"

# What the wrappers rely on, as text in each module's source (checked on the installed module at start, and in
# tests on the source lines of the version named above).
REQUIRED_SOURCE = {
    TP_WORKER: {"class TpModelWorker(": "TpModelWorker", "    def forward_batch_generation(":
                "TpModelWorker.forward_batch_generation (a step with speculation off)"},
    MODEL_RUNNER: {"class ModelRunner(": "ModelRunner", "    def forward(": "ModelRunner.forward (target forward)",
                   "    def sample(": "ModelRunner.sample (sampling, speculation off)"},
    EAGLE_V2: {"class EAGLEWorkerV2(": "EAGLEWorkerV2", "class EagleDraftWorker(": "EagleDraftWorker",
               "    def forward_batch_generation(self, batch: ScheduleBatch": "EAGLEWorkerV2.forward_batch_generation",
               "    def draft(self, batch: ScheduleBatch)": "EagleDraftWorker.draft",
               "    def _draft_extend_for_decode(": "EagleDraftWorker._draft_extend_for_decode",
               "eagle_sample(": "eagle_sample called by name in the module (verification)"},
    NGRAM: {"class NGRAMWorker(": "NGRAMWorker", "    def forward_batch_generation(": "NGRAMWorker.forward_batch_generation",
            "    def _prepare_for_speculative_decoding(": "NGRAMWorker._prepare_for_speculative_decoding",
            "eagle_sample(": "eagle_sample called by name in the module (verification)"},
}


def api_problems(module: str, source: str) -> list[str]:
    """What of the API the wrappers need is missing from `module`'s source."""
    return [what for needle, what in REQUIRED_SOURCE.get(module, {}).items() if needle not in source]


def batch_fields(batch: Any, draft_tokens: int) -> dict[str, Any]:
    """The scheduled work of a step on `batch` (a ScheduleBatch): requests, tokens, new requests; a verify step
    schedules `draft_tokens` tokens per request (1 + k), a decode step without speculation 1."""
    reqs = getattr(batch, "reqs", None)
    if reqs is not None:
        n = len(reqs)
    else:
        seq_lens = getattr(batch, "seq_lens", None)
        n = int(len(seq_lens)) if seq_lens is not None else 0
    mode = getattr(batch, "forward_mode", None)
    # SGLang's ForwardMode.is_extend() is true for TARGET_VERIFY too (a verify pass extends the KV cache): a
    # prefill is an extend that is not a verify
    prefill = mode is not None and mode.is_extend() and not (hasattr(mode, "is_target_verify")
                                                             and mode.is_target_verify())
    extend = bool(getattr(batch, "is_extend_in_batch", False)) or bool(prefill)
    per_req = max(int(draft_tokens), 1)
    return {"runner": RUNNER, "spec_k": per_req - 1, "num_reqs": n, "new_reqs": n if extend else 0,
            "tokens": n * per_req, "max_tokens_per_req": per_req}


class Steps:
    """The process's timer, made at the first step (only the scheduler steps), and the wrappers' shared state:
    how deep the step wrappers are nested (a speculative step calls TpModelWorker's as its verify)."""

    def __init__(self, folder: Path, timer_module: ModuleType, cuda: bool | None = None):
        self.folder = folder
        self.st = timer_module
        self.cuda = cuda
        self.timer: Any = None
        self.depth = 0

    def get(self) -> Any:
        if self.timer is None:
            cuda = self.cuda
            if cuda is None:
                try:
                    import torch

                    cuda = bool(torch.cuda.is_available())
                except ImportError:
                    cuda = False
            self.timer = self.st.StepTimer(self.folder, cuda=cuda, prefix=STEP_PREFIX)
        return self.timer

    def step(self, fn: Any, draft_tokens_of: Any) -> Any:
        """`fn` (a worker's forward_batch_generation) as a step, unless it runs inside one."""
        steps = self

        def forward_batch_generation(self, batch=None, *args, **kwargs):
            if steps.depth:
                return fn(self, batch, *args, **kwargs)
            timer = steps.get()
            timer.begin(lambda: batch_fields(batch, draft_tokens_of(self)))  # read only while timing
            steps.depth += 1
            try:
                return fn(self, batch, *args, **kwargs)
            finally:
                steps.depth -= 1
                timer.executed()
                timer.end_step()

        forward_batch_generation.__wrapped__ = fn  # type: ignore[attr-defined]
        return forward_batch_generation

    def part(self, part: str, fn: Any) -> Any:
        """`fn` (a method) timed as `part` of the step in progress (none before the first step)."""
        return self.st.timed(lambda: self.timer, part, fn)

    def function_part(self, part: str, fn: Any) -> Any:
        """`fn` (a module-level function) timed as `part`."""
        method = self.part(part, lambda _none, *a, **k: fn(*a, **k))

        def wrapper(*args, **kwargs):
            return method(None, *args, **kwargs)

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper


def _spec_draft_tokens(worker: Any) -> int:
    return int(getattr(worker, "speculative_num_draft_tokens", None) or 1)


def _no_draft(worker: Any) -> int:
    del worker
    return 1


def _wrap(cls: Any, name: str, wrapped: Any) -> str:
    setattr(cls, name, wrapped)
    return f"{cls.__module__}.{cls.__qualname__}.{name}"


def patch(module: ModuleType, steps: Steps) -> list[str]:
    """Wrap what `module` holds of the step (one of REQUIRED_SOURCE's modules); the names wrapped."""
    name = module.__name__
    if getattr(module, "_specbook_step_timed", False):
        return []
    done: list[str] = []
    if name == TP_WORKER:
        cls = module.TpModelWorker
        done.append(_wrap(cls, "forward_batch_generation", steps.step(cls.forward_batch_generation, _no_draft)))
    elif name == MODEL_RUNNER:
        cls = module.ModelRunner
        done.append(_wrap(cls, "forward", steps.part("target_forward", cls.forward)))
        done.append(_wrap(cls, "sample", steps.part("sampling", cls.sample)))
    elif name == EAGLE_V2:
        worker, draft = module.EAGLEWorkerV2, module.EagleDraftWorker
        done.append(_wrap(worker, "forward_batch_generation",
                          steps.step(worker.forward_batch_generation, _spec_draft_tokens)))
        done.append(_wrap(draft, "draft", steps.part("draft", draft.draft)))
        done.append(_wrap(draft, "_draft_extend_for_decode", steps.part("draft", draft._draft_extend_for_decode)))
        module.eagle_sample = steps.function_part("sampling", module.eagle_sample)
        done.append(f"{name}.eagle_sample")
    elif name == NGRAM:
        worker = module.NGRAMWorker
        done.append(_wrap(worker, "forward_batch_generation",
                          steps.step(worker.forward_batch_generation, _spec_draft_tokens)))
        done.append(_wrap(worker, "_prepare_for_speculative_decoding",
                          steps.part("draft", worker._prepare_for_speculative_decoding)))
        module.eagle_sample = steps.function_part("sampling", module.eagle_sample)
        done.append(f"{name}.eagle_sample")
    module._specbook_step_timed = True
    return done


class Installer:
    """What the launcher's import hook calls as each module of REQUIRED_SOURCE is imported: check its source,
    wrap it, and write the process's status (what was wrapped, what was refused and why)."""

    def __init__(self, folder: Path, timer_module: ModuleType):
        self.folder = Path(folder)
        self.steps = Steps(self.folder, timer_module)
        self.status: dict[str, Any] = {"pid": os.getpid(), "patched": [], "refused": {}}

    def __call__(self, module: ModuleType) -> None:
        import inspect

        try:
            problems = api_problems(module.__name__, inspect.getsource(module))
        except (OSError, TypeError) as exc:
            problems = [f"its source cannot be read ({exc})"]
        if problems:
            self.status["refused"][module.__name__] = "missing: " + "; ".join(problems)
        else:
            self.status["patched"] += patch(module, self.steps)
        self.write_status()

    def write_status(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{STEP_PREFIX}-steps-{os.getpid()}.status.json"
        path.write_text(json.dumps(self.status, indent=1, sort_keys=True))
