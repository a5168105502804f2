"""What an SGLang server's log says of its start (sglang 0.5.15.post1; lines stamped `[YYYY-MM-DD HH:MM:SS]`):

    server_args=ServerArgs(model_path='...', ..., attention_backend='fa3', ..., speculative_algorithm='STANDALONE',
        ..., speculative_draft_attention_backend=None, ...)       the arguments after SGLang's own defaults
    Attention backend not specified. Use fa3 backend by default.   only when --attention-backend was not given
    Load weight end. elapsed=0.31 s, type=LlamaForCausalLM, avail mem=70.12 GB, mem usage=0.27 GB.
    KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1234567, K size: 3.21 GB, V size: 3.21 GB
    max_total_num_tokens=1234567, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=16,
        context_len=2048, available_gpu_mem=60.00 GB
    Capture target verify CUDA graph end. elapsed=2.10 s, mem usage=0.05 GB, avail mem=60.0 GB.
    The server is fired up and ready to roll!

The target's backend is `attention_backend`; the draft's is `speculative_draft_attention_backend`, or the
target's where that is unset (SGLang's rule). The first line of a speculative server's "Load weight" and "KV
Cache" pairs is the target's, the second the draft's. `start_parts` (engines.base.START_PARTS) from the lines'
whole-second stamps, from the log's first line: setup (to the first "Load weight begin"), weights (to the last
"Load weight end"), kv_cache (to the last "KV Cache is allocated"), graphs (to the last CUDA graph capture's
end), ready (to "fired up", which SGLang logs after its own warm-up request). What came before its first line
(the interpreter, SGLang's imports) is in the harness's ready_s only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from specbook.engines.common import start_parts

_STAMP = re.compile(r"^\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_ARG = r"\b{name}=(?:'(?P<value>[^']*)'|(?P<bare>None|True|False|-?\d+(?:\.\d+)?))"
_SERVER_ARGS = "server_args=ServerArgs("
_KV = re.compile(r"KV Cache is allocated\. .*#tokens: (?P<tokens>\d+)")
_LIMITS = re.compile(r"max_total_num_tokens=(?P<total>\d+).*max_running_requests=(?P<running>\d+).*"
                     r"context_len=(?P<ctx>\d+)")
_WEIGHTS = re.compile(r"Load weight end\. elapsed=(?P<s>[\d.]+) s")
_CAPTURE = re.compile(r"Capture (?P<role>target|draft) (?P<what>\w+) CUDA graph end\. elapsed=(?P<s>[\d.]+) s")
_DEFAULT_BACKEND = re.compile(r"Attention backend not specified\. Use (?P<backend>\w+) backend by default")
_PART_ENDS = (("setup", "Load weight begin"), ("weights", "Load weight end"), ("kv_cache", "KV Cache is allocated"),
              ("graphs", "CUDA graph end"), ("ready", "The server is fired up"))
_LAST_OF = {"weights", "kv_cache", "graphs"}  # a speculative server logs these for the draft too: the last one ends


def server_arg(line: str, name: str) -> str | None:
    """One argument of the `server_args=ServerArgs(...)` line, as logged (None: absent or None)."""
    m = re.search(_ARG.format(name=re.escape(name)), line)
    if m is None:
        return None
    value = m["value"] if m["value"] is not None else m["bare"]
    return None if value == "None" else value


def _when(line: str) -> datetime | None:
    m = _STAMP.match(line)
    return datetime.strptime(m["stamp"], "%Y-%m-%d %H:%M:%S") if m else None


def startup_facts(lines: Iterable[str]) -> dict[str, Any]:
    """Attention backends of target and draft, the KV cache's tokens, the limits the scheduler took, load and
    capture seconds, and `start_parts` (see the module docstring)."""
    facts: dict[str, Any] = {}
    first: datetime | None = None
    ends: dict[str, datetime] = {}
    weights: list[float] = []
    kv: list[int] = []
    graphs: dict[str, float] = {}
    for line in lines:
        when = _when(line)
        if when is not None and first is None:
            first = when
        if _SERVER_ARGS in line and "attention_backend_target" not in facts:
            target = server_arg(line, "attention_backend")
            draft = server_arg(line, "speculative_draft_attention_backend")
            algorithm = server_arg(line, "speculative_algorithm")
            facts["speculative_algorithm"] = algorithm
            if target:
                facts["attention_backend_target"] = target
            if algorithm and algorithm.upper() != "NGRAM" and (draft or target):
                facts["attention_backend_draft"] = draft or target
                facts["attention_backend_draft_selected_by"] = (
                    "--speculative-draft-attention-backend" if draft else "the target's (no draft backend given)")
            for key in ("cuda_graph_max_bs", "mem_fraction_static", "disable_cuda_graph", "speculative_num_steps",
                        "speculative_num_draft_tokens", "speculative_eagle_topk"):
                value = server_arg(line, key)
                if value is not None:
                    facts[key] = value
        elif (m := _DEFAULT_BACKEND.search(line)) is not None:
            facts["attention_backend_target_selected_by"] = f"SGLang's default for this GPU ({m['backend']})"
        elif (m := _KV.search(line)) is not None:
            kv.append(int(m["tokens"]))
        elif (m := _LIMITS.search(line)) is not None and "max_running_requests" not in facts:
            facts["max_total_num_tokens"] = int(m["total"])
            facts["max_running_requests"] = int(m["running"])
            facts["context_len"] = int(m["ctx"])
        elif (m := _WEIGHTS.search(line)) is not None:
            weights.append(float(m["s"]))
        elif (m := _CAPTURE.search(line)) is not None:
            key = f"{m['role']} {m['what']}"
            graphs[key] = round(graphs.get(key, 0.0) + float(m["s"]), 3)
        if when is not None:
            for name, words in _PART_ENDS:
                if words in line and (name in _LAST_OF or name not in ends):
                    ends[name] = when
    if kv:
        facts["kv_cache_tokens"] = kv[0]
        if len(kv) > 1:
            facts["kv_cache_tokens_draft"] = kv[1]
    if weights:
        facts["load_weights_s"] = weights
    if graphs:
        facts["graph_capture_s"] = graphs
    if first is not None and ends:
        facts["start_parts"] = start_parts([name for name, _ in _PART_ENDS],
                                           {name: (at - first).total_seconds() for name, at in ends.items()})
    return facts


def log_startup_facts(path: str | Path) -> dict[str, Any]:
    """startup_facts of a log file (or its .gz copy); {} when it does not exist (a server that never started)."""
    from specbook.engines.common import facts_of_log

    return facts_of_log(path, startup_facts)
