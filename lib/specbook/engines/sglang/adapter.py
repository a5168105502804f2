"""SGLang adapter (sglang 0.5.15.post1, the release pinned to torch 2.11.0; CUDA only: SGLang has no CPU wheel).

EngineConfig maps onto `python -m sglang.launch_server` as follows:
  model               --model-path (resolved as for vLLM: the same bf16 safetensors folder)
  served_model_name   --served-model-name
  max_num_seqs        --max-running-requests (and --cuda-graph-max-bs: no decode graph above what can run)
  max_model_len       --context-length
  dtype               --dtype
  seed                --random-seed
  attention_backend   --attention-backend (fa3, flashinfer, triton, ...; None: SGLang's default, fa3 on Hopper)
  enforce_eager       true: --disable-cuda-graph; false: SGLang's CUDA graphs (decode, and prefill "breakable"
                      graphs; SGLang compiles nothing with torch.compile unless asked in extra_args)
  speculative_config  {"method": "draft_model", "model", "num_speculative_tokens": k}
                        -> --speculative-algorithm STANDALONE --speculative-draft-model-path DRAFT
                           --speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1
                           (a chain of k greedy draft tokens, verified by one target pass; SGLang needs all three)
                        `attention_backend` in it -> --speculative-draft-attention-backend (unset: the target's)
                      {"method": "ngram", "num_speculative_tokens": k}
                        -> --speculative-algorithm NGRAM --speculative-num-draft-tokens k+1
                           --speculative-ngram-min-bfs-breadth 1 --speculative-ngram-max-bfs-breadth 1
                           (k proposals per step; SGLang counts the verified root token in num-draft-tokens and
                           pads missing proposals, so every step verifies k). Its n-grams come from one trie that
                           every request's tokens feed (earlier requests' too): it has no lookup size, so
                           prompt_lookup_max / _min are taken and not mapped, and the set-up table says both.
Always: --enable-metrics (the counters specbook reads), --log-level info (the decode-batch lines).
A profiled config ($SPECBOOK_STEP_TIMING_DIR in env, specbook.engines.sglang.profile) starts
`python .../sglang/launch.py` instead of `-m sglang.launch_server`: the same server with specbook's step timer.
Refused at params time, naming the field: a speculative method or key it has no mapping for.

Where SGLang is installed apart from specbook's own packages (carried to a GPU host beside vLLM's), the folder
$SPECBOOK_SGLANG_SITE names is put first on the server's PYTHONPATH, with the folders its .pth files name (a
`pip --target` folder is no site directory, so Python would not read them: CUTLASS's DSL, which SGLang imports to
capture a draft model's CUDA graphs, lives in one), and versions are read there first.
SGLANG_FORCE_SHUTDOWN=1 (unless set): on SIGTERM SGLang would otherwise drain its requests with no time limit.
SGLANG_GRPC_PORT (unless set) where --port + 10000, the gRPC port SGLang derives and refuses to start with, is
past 65535: a port below --port instead (gRPC stays off; SGLang only checks the number).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.errors import EngineError
from specbook.core.versions import dist_version, torch_cuda_version
from specbook.engines.base import EARLIER_REQUESTS, EngineConfig, SetupFact
from specbook.engines.common import LOOPBACK, loopback_spec, server_json_field, speculation_facts
from specbook.engines.registry import register_engine
from specbook.engines.sglang import profile
from specbook.models.resolve import resolve_model
from specbook.serve.server import ServerSpec

if TYPE_CHECKING:
    import pandas as pd

    from specbook.serve.metrics import CounterDelta, MetricsSnapshot

SITE_ENV = "SPECBOOK_SGLANG_SITE"
LAUNCH_MODULE = "sglang.launch_server"
# distributions a report names, by the key it shows them under
DISTS = {"sglang": ("sglang",), "sglang-kernel": ("sglang-kernel", "sgl-kernel"),
         "flashinfer": ("flashinfer-python", "flashinfer_python"), "torch": ("torch",)}
SPEC_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
             "attention_backend")
NGRAM_LOOKUP = ("from a server-wide suffix trie, BFS breadth 1 (no match length: prompt_lookup_max/min not "
                "mapped)")
# SGLang's NGRAM worker feeds one trie (--speculative-ngram-capacity tokens) with every request's tokens and
# matches every request against it: what one request generated is drafted for the next.
NGRAM_SOURCE = f"a trie of every request's tokens since the server started, {EARLIER_REQUESTS}"


# /flush_cache empties the NGRAM trie (the scheduler's flush calls the draft worker's clear_cache_pool) and the
# radix prefix cache with it, only while the scheduler is idle: `timeout` lets it wait for that.
FLUSH_PATH, FLUSH_WAIT_S = "/flush_cache", 30.0
FLUSHED = "its NGRAM trie and its prefix cache (/flush_cache)"

SHUTDOWN_ENV = "SGLANG_FORCE_SHUTDOWN"
GRPC_PORT_ENV, GRPC_PORT_OFFSET = "SGLANG_GRPC_PORT", 10000


def site_paths(where: str) -> list[str]:
    """`where` and the folders its .pth files name (relative to it; import lines and absent folders skipped)."""
    paths = [where]
    for pth in sorted(Path(where).glob("*.pth")):
        for line in pth.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "import ")) and (Path(where) / line).is_dir():
                paths.append(str(Path(where) / line))
    return paths


def site() -> str | None:
    """The folder $SPECBOOK_SGLANG_SITE names; EngineError when it names no folder."""
    value = os.environ.get(SITE_ENV)
    if not value:
        return None
    if not Path(value).is_dir():
        raise EngineError(f"{SITE_ENV}={value}: no such folder (where SGLang's packages were installed)")
    return value


def _method(spec: Mapping[str, Any]) -> str | None:
    return spec.get("method") or ("draft_model" if spec.get("model") else None)


def speculation_refusals(spec: Mapping[str, Any] | None) -> list[str]:
    """What of a speculative_config SGLang cannot honour, each naming its key; [] for None."""
    if not spec:
        return []
    refused = [f"speculative_config.{key} has no SGLang mapping (it maps {', '.join(SPEC_KEYS)})"
               for key in spec if key not in SPEC_KEYS]
    method, k = _method(spec), spec.get("num_speculative_tokens")
    if method not in SPEC_METHODS:
        refused.append(f"speculative_config.method {method!r} has no SGLang mapping; known: {sorted(SPEC_METHODS)}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        refused.append(f"speculative_config.num_speculative_tokens must be a positive int, got {k!r}")
    if method == "draft_model" and not isinstance(spec.get("model"), str):
        refused.append("speculative_config.model (the draft) is required for method draft_model")
    if method == "ngram" and spec.get("attention_backend") is not None:
        refused.append("speculative_config.attention_backend is the draft model's: method ngram has none")
    return refused


def _draft_model_args(spec: Mapping[str, Any], k: int) -> list[str]:
    args = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", resolve_model(spec["model"]),
            "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(k + 1)]
    if spec.get("attention_backend"):
        args += ["--speculative-draft-attention-backend", str(spec["attention_backend"])]
    return args


def _ngram_args(spec: Mapping[str, Any], k: int) -> list[str]:
    return ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k + 1),
            "--speculative-ngram-min-bfs-breadth", "1", "--speculative-ngram-max-bfs-breadth", "1"]


# Registry: speculative method -> launch_server flags (see the module docstring)
SPEC_METHODS = {"draft_model": _draft_model_args, "ngram": _ngram_args}


def speculative_args(spec: Mapping[str, Any] | None) -> list[str]:
    if not spec:
        return []
    refused = speculation_refusals(spec)
    if refused:
        raise EngineError("; ".join(refused))
    return SPEC_METHODS[str(_method(spec))](spec, spec["num_speculative_tokens"])


def _graphs_fact(cfg: EngineConfig, startup: Mapping[str, Any]) -> SetupFact:
    if cfg.enforce_eager:
        return SetupFact("eager", "--disable-cuda-graph: no CUDA graphs (SGLang compiles nothing by default)")
    captured = startup.get("graph_capture_s") or {}
    return SetupFact("CUDA graphs", "SGLang's decode and breakable prefill graphs, no torch.compile"
                     + (f"; captured: {', '.join(sorted(captured))}" if captured else ""))


@register_engine("sglang")
class SglangEngine:
    name = "sglang"
    # what specbook sets itself: extra_args that set one are refused at params time
    reserved_options = ("--host", "--port", "--served-model-name", "--enable-metrics", "--log-level")
    metrics_prefix = "sglang:"
    health_path = "/health"
    models_path = "/v1/models"
    version_keys = ("sglang", "sglang-kernel", "torch", "cuda")
    profiler = profile.SglangStepProfiler()  # the cost split: specbook's step timer in SGLang's scheduler

    def refusals(self, cfg: EngineConfig) -> list[str]:
        return speculation_refusals(cfg.speculative_config)

    def build_argv(self, cfg: EngineConfig, *, host: str, port: int) -> list[str]:
        launch = [str(profile.LAUNCHER)] if profile.profiled(cfg) else ["-m", LAUNCH_MODULE]
        argv = [sys.executable, *launch, "--model-path", resolve_model(cfg.model)]
        argv += ["--served-model-name", cfg.client_model_name(), "--host", host, "--port", str(port)]
        argv += ["--enable-metrics", "--log-level", "info"]
        if cfg.max_num_seqs is not None:
            argv += ["--max-running-requests", str(cfg.max_num_seqs)]
            if not cfg.enforce_eager:
                argv += ["--cuda-graph-max-bs", str(cfg.max_num_seqs)]
        if cfg.max_model_len is not None:
            argv += ["--context-length", str(cfg.max_model_len)]
        if cfg.dtype is not None:
            argv += ["--dtype", cfg.dtype]
        if cfg.seed is not None:
            argv += ["--random-seed", str(cfg.seed)]
        if cfg.attention_backend is not None:
            argv += ["--attention-backend", cfg.attention_backend]
        if cfg.enforce_eager:
            argv.append("--disable-cuda-graph")
        return argv + speculative_args(cfg.speculative_config) + list(cfg.extra_args)

    def build_env(self, cfg: EngineConfig, parent: Mapping[str, str] | None = None) -> dict[str, str]:
        """Overrides on top of the parent env: SGLang's site first on PYTHONPATH, no endless drain on SIGTERM,
        then the config's own env."""
        parent = dict(os.environ) if parent is None else dict(parent)
        env: dict[str, str] = {}
        where = site()
        if where:
            env["PYTHONPATH"] = os.pathsep.join([*site_paths(where), *filter(None, [parent.get("PYTHONPATH")])])
        if SHUTDOWN_ENV not in parent and "SGL_FORCE_SHUTDOWN" not in parent:  # the old name, still read
            env[SHUTDOWN_ENV] = "1"
        env.update(cfg.env)
        return env

    def build_spec(self, cfg: EngineConfig, *, name: str, log_path: Path, port: int) -> ServerSpec:
        argv = self.build_argv(cfg, host=LOOPBACK, port=port)
        env = self.build_env(cfg)
        if port + GRPC_PORT_OFFSET > 65535 and GRPC_PORT_ENV not in env and GRPC_PORT_ENV not in os.environ:
            env[GRPC_PORT_ENV] = str(port - GRPC_PORT_OFFSET)
        return loopback_spec(self, cfg, name=name, log_path=log_path, port=port, argv=argv, env=env)

    def probe_versions(self, base_url: str | None = None) -> dict[str, str]:
        """Versions where the server imports them ($SPECBOOK_SGLANG_SITE first) and, with a URL, /server_info's."""
        versions: dict[str, str] = {"engine": self.name}
        where = site()
        for key, dists in DISTS.items():
            found = dist_version(*dists, first_in=where)
            if found:
                versions[key] = found[1]
        if "torch" in versions:
            versions["cuda"] = torch_cuda_version() or "none"
        if where:
            versions["sglang_site"] = where
        if base_url:
            versions["server_sglang"] = server_json_field(base_url, "/server_info", "version")
        return versions

    def spec_decode_delta(
        self, before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None,
        cfg: EngineConfig | None = None,
    ) -> CounterDelta:
        """Its counters over finished requests (specbook.engines.sglang.metrics): scrape after they returned.
        Draft tokens a step are the config's k (SGLang sets its gauge of them only at decode-log intervals)."""
        from specbook.engines.sglang.metrics import counter_delta

        spec = cfg.speculative_config if cfg is not None else None
        k = spec.get("num_speculative_tokens") if spec else None
        return counter_delta(before, after, model_name=model_name, k=k)

    def startup_facts(self, log_path: str | Path) -> dict[str, Any]:
        from specbook.engines.sglang.startup import log_startup_facts

        return log_startup_facts(log_path)

    def remembers(self, cfg: EngineConfig) -> bool:
        """NGRAM drafts from one server-wide trie (NGRAM_SOURCE); STANDALONE's draft model reads the request only."""
        return (cfg.speculative_config or {}).get("method") == "ngram"

    def forget(self, base_url: str) -> str:
        """POST /flush_cache?timeout=FLUSH_WAIT_S: SGLang answers 200 once it flushed, 400 when it could not (a
        request still running); the latter raises, naming the server's answer."""
        import httpx

        url = f"{base_url.rstrip('/')}{FLUSH_PATH}"
        try:
            resp = httpx.post(url, params={"timeout": FLUSH_WAIT_S}, timeout=FLUSH_WAIT_S + 10, trust_env=False)
        except httpx.HTTPError as exc:
            raise EngineError(f"sglang: {url} failed ({type(exc).__name__}: {exc}): its NGRAM trie may still hold "
                              "earlier requests") from exc
        if resp.status_code != 200:
            raise EngineError(f"sglang: {url} answered {resp.status_code} {resp.text.strip()[:200]!r}: its NGRAM trie "
                              "still holds earlier requests")
        return FLUSHED

    def setup_facts(self, cfg: EngineConfig, startup: Mapping[str, Any]) -> dict[str, SetupFact]:
        facts: dict[str, SetupFact] = {}
        if startup.get("processes"):
            facts["server processes"] = SetupFact(str(startup["processes"]), "HTTP server and tokenizer, scheduler, "
                                                  "detokenizer")
        running = startup.get("max_running_requests") or cfg.max_num_seqs
        facts["concurrent sequences"] = SetupFact(str(running or "SGLang's default"), "--max-running-requests")
        ctx = startup.get("context_len") or cfg.max_model_len
        if ctx:
            facts["context per sequence"] = SetupFact(str(ctx), "--context-length")
        dtype = cfg.dtype or "the checkpoint's"
        facts["weights"] = SetupFact({"bf16": "bfloat16"}.get(dtype, dtype), "--dtype" if cfg.dtype else "")
        facts["graphs / compilation"] = _graphs_fact(cfg, startup)
        facts.update(speculation_facts(
            cfg.speculative_config, ngram_lookup=NGRAM_LOOKUP, ngram_source=NGRAM_SOURCE,
            draft_detail="STANDALONE, top-1 chain, greedy verification",
            k_detail="--speculative-num-steps (draft) / --speculative-num-draft-tokens - 1"))
        return facts

    def log_intervals(self, lines: Iterable[str]) -> pd.DataFrame:
        """One row per decode-batch line: load and the printed AL (no counts: see engines.sglang.logparse)."""
        from specbook.engines.sglang.logparse import decode_lines_frame

        return decode_lines_frame(lines)

    def detect_log(self, head_lines: Sequence[str]) -> int:
        from specbook.engines.sglang.logparse import detect_log

        return detect_log(head_lines)

    def summarise_log(self, path: str | Path) -> dict[str, Any]:
        """The log's decode lines for `specbook ingest` (no counts; the note says where they come from)."""
        from specbook.engines.sglang.logparse import ingest_summary

        return ingest_summary(path)
