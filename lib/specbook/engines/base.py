"""What every engine adapter takes (EngineConfig) and offers (Engine protocol)."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

if TYPE_CHECKING:
    import pandas as pd

    from specbook.serve.metrics import CounterDelta, MetricsSnapshot
    from specbook.serve.server import ServerSpec

class EngineConfig(BaseModel):
    """One engine server's configuration as an experiment declares it (params YAML)."""

    model_config = ConfigDict(extra="forbid")

    engine: str = "vllm"
    model: str = Field(min_length=1, description="path, hub id, or embedded model name")
    served_model_name: str | None = None
    speculative_config: dict[str, Any] | None = None
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_model_len: int | None = Field(default=2048, gt=0)
    dtype: str | None = None
    # vLLM: --attention-backend NAME (FLASH_ATTN, TRITON_ATTN, FLASHINFER, ...); None lets vLLM choose. It
    # reaches the target only: vLLM 0.26 picks the draft's backend itself unless speculative_config names
    # one (attention_backend there). specbook.engines.vllm.startup reads from the log what each of them used.
    attention_backend: str | None = None
    enforce_eager: bool = True
    seed: int | None = 0
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    ready_timeout_s: float = Field(default=600, gt=0)

    @field_validator("extra_args")
    @classmethod
    def _not_specbooks_own(cls, args: list[str], info: ValidationInfo) -> list[str]:
        """Refuse extra arguments that set what specbook sets (the engine's `reserved_options`): the server
        would listen or answer where specbook does not look, and fail as "not ready" minutes later."""
        engine = info.data.get("engine")
        if not isinstance(engine, str):
            return args
        try:
            from specbook.engines import get_engine

            reserved = tuple(getattr(get_engine(engine), "reserved_options", ()))
        except Exception:  # an unknown engine is refused where it is launched, naming it
            return args
        for i, arg in enumerate(args):
            option = str(arg).split("=", 1)[0]
            if option in reserved:
                raise ValueError(
                    f"item {i} ({arg!r}) sets {option}, which specbook sets itself for {engine} (its own "
                    f"{', '.join(reserved)}); set served_model_name in the params for the model's name, and "
                    "leave host, port and metrics to specbook")
        return args

    def client_model_name(self) -> str:
        """The name clients send as "model": served_model_name, else the name as declared."""
        return self.served_model_name or self.model


@runtime_checkable
class Engine(Protocol):
    """An engine adapter: everything engine-specific (argv, readiness paths, counters, versions)."""

    name: str

    def build_spec(self, cfg: EngineConfig, *, name: str, log_path: Path, port: int) -> ServerSpec: ...

    def probe_versions(self, base_url: str | None = None) -> dict[str, str]: ...

    def spec_decode_delta(
        self, before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None
    ) -> CounterDelta:
        """What the server's counters accrued between two scrapes, through the acceptance model."""
        ...

    def startup_facts(self, log_path: str | Path) -> dict[str, Any]:
        """What the server's log says of its start (attention backends, KV cache, load times); {} if nothing."""
        ...

    def log_intervals(self, lines: Iterable[str]) -> pd.DataFrame:
        """The acceptance records the server's log holds (vLLM: per stats interval; llama.cpp: per request)."""
        ...

    def detect_log(self, head_lines: Sequence[str]) -> int:
        """How many of a log file's first lines carry this engine's signatures (`specbook ingest` gives the
        file to the engine with most hits)."""
        ...

    def summarise_log(self, path: str | Path) -> dict[str, Any]:
        """A whole log file summed through the acceptance model, by the engine's own log parser:
        specbook.ingest.IngestResult's fields, with the counts as `acceptance` (an Acceptance)."""
        ...

    def setup_facts(self, cfg: EngineConfig, startup: Mapping[str, Any]) -> dict[str, SetupFact]:
        """How a server was set up, on SETUP_ASPECTS (the aspects every engine can be lined up on): from the
        declared config and what its log said at start (`startup`: startup_facts plus the harness's
        `processes`). An aspect the engine cannot tell is absent."""
        ...


def facts_of_log(path: str | Path, parse: Callable[[Iterable[str]], dict[str, Any]]) -> dict[str, Any]:
    """What a start-up facts parser reads from a log file; {} when it does not exist (a server that never
    started)."""
    path = Path(path)
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        return parse(fh)


class SetupFact(NamedTuple):
    """One aspect of a server's set-up: `value` is what two engines are compared on, `detail` how this engine
    got there (its flags, what its log said)."""

    value: str
    detail: str = ""


# What a cross-engine report lines up side by side; a differing value is an asymmetry of the comparison.
SETUP_ASPECTS = ("compute threads", "server processes", "concurrent sequences", "context per sequence", "weights",
                 "graphs / compilation", "speculation", "draft tokens per step")


def speculation_facts(spec: Mapping[str, Any] | None, *, ngram_lookup: str, draft_detail: str,
                      k_detail: str) -> dict[str, SetupFact]:
    """The speculation aspects of a vLLM-style speculative_config, with the engine's own wording."""
    if not spec:
        return {"speculation": SetupFact("off")}
    method = spec.get("method") or ("draft_model" if spec.get("model") else "?")
    k = str(spec.get("num_speculative_tokens", "?"))
    if method == "ngram":
        what = SetupFact(f"ngram match length {ngram_lookup}", "draft from the request's own tokens")
    elif method == "draft_model":
        what = SetupFact(f"draft model {Path(str(spec.get('model'))).name}", draft_detail)
    else:
        what = SetupFact(str(method))
    return {"speculation": what, "draft tokens per step": SetupFact(k, k_detail)}


LOOPBACK = "127.0.0.1"  # every server specbook launches listens on this machine only


def loopback_spec(engine: Engine, cfg: EngineConfig, *, name: str, log_path: Path, port: int, argv: list[str],
                  env: dict[str, str], unset_env: list[str] | None = None) -> ServerSpec:
    """The ServerSpec every adapter builds: its argv and env, served on loopback, ready by its paths
    (the adapter's `health_path` / `models_path`, the OpenAI-compatible ones where it names none)."""
    from specbook.serve.server import ServerSpec

    return ServerSpec(
        name=name, argv=argv, env=env, unset_env=unset_env or [], host=LOOPBACK, port=port,
        health_path=getattr(engine, "health_path", "/health"), models_path=getattr(engine, "models_path", "/v1/models"),
        ready_timeout_s=cfg.ready_timeout_s,
        log_path=log_path, model_name=cfg.client_model_name(),
    )


def server_json_field(base_url: str, path: str, field: str) -> str:
    """A field of a JSON document the server serves (GET base_url/path), or why it could not be read."""
    import httpx

    try:
        resp = httpx.get(f"{base_url.rstrip('/')}{path}", timeout=5.0, trust_env=False)
        resp.raise_for_status()
        return str(resp.json().get(field))
    except (httpx.HTTPError, ValueError) as exc:
        return f"unavailable ({type(exc).__name__})"


def is_embedded_name(model: str) -> bool:
    """True for a name `specbook models prepare` makes (specbook.models.EMBEDDED_MODELS)."""
    from specbook.models import EMBEDDED_MODELS

    return model in EMBEDDED_MODELS


def resolve_model(model: str) -> str:
    """An existing path as is; an embedded name -> its prepared folder (ModelNotPreparedError if not); else a hub id."""
    if Path(model).expanduser().exists():
        return str(Path(model).expanduser())
    if is_embedded_name(model):
        from specbook.models import model_path

        return str(model_path(model))
    return model


def dist_version(*dists: str) -> tuple[str, str] | None:
    """(distribution name, version) of the first installed of `dists`, without importing it."""
    for dist in dists:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def torch_cuda_version() -> str | None:
    """torch.version.cuda read from torch/version.py, so probing does not import torch (seconds)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(version_py.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        )
        if isinstance(target, ast.Name) and target.id == "cuda" and node.value is not None:
            value = ast.literal_eval(node.value)
            return str(value) if value is not None else None
    return None
