"""What every engine adapter takes (EngineConfig), must offer (Engine) and may offer (the capabilities).

An adapter is one package under specbook.engines that registers its class with `@register_engine(name)`
(specbook.engines.registry) when imported; specbook.engines imports every such package. Code outside
specbook.engines never compares an engine's name: it asks the adapter (the Engine methods below), or asks
whether the adapter offers an optional capability (`registry.capability(engine, Kind)`, a runtime-checkable
Protocol below) and does without it, or refuses naming the engine, where it does not.

Optional attributes, read with a default where absent:
    reserved_options  tuple[str, ...]  server options specbook sets itself: extra_args setting one are refused
    health_path       str | None       readiness path polled first ("/health"; None: none)
    models_path       str | None       model list polled next, which must name the served model ("/v1/models")
    version_keys      tuple[str, ...]  keys of probe_versions a report's servers table shows as columns
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from specbook.models.resolve import is_embedded_name, resolve_model

if TYPE_CHECKING:
    import pandas as pd

    from specbook.serve.client import ChatRequest
    from specbook.serve.logs import LogRange
    from specbook.serve.metrics import CounterDelta, MetricsSnapshot
    from specbook.serve.server import ServerSpec
    from specbook.traces.records import TraceReading

# Kept importable from here (they were defined here): model resolution lives with the models.
__all__ = [
    "CAPABILITIES",
    "SETUP_ASPECTS",
    "START_PARTS",
    "BenchReader",
    "DerivesWeights",
    "DescribesBuild",
    "DraftCounts",
    "Engine",
    "EngineConfig",
    "MeasuredSplit",
    "ProfilesSteps",
    "ProposalTracer",
    "ReadsBenchOutputs",
    "ReportsResponseDrafts",
    "SetsLogStatsInterval",
    "SetupFact",
    "StepProfiler",
    "SummarisesRequestLogs",
    "TracedPass",
    "TracesProposals",
    "UpgradesLogFrames",
    "is_embedded_name",
    "resolve_model",
]


class SetupFact(NamedTuple):
    """One aspect of a server's set-up: `value` is what two engines are compared on, `detail` how this engine
    got there (its flags, what its log said)."""

    value: str
    detail: str = ""


# What a cross-engine report lines up side by side; a differing value is an asymmetry of the comparison.
SETUP_ASPECTS = ("compute threads", "server processes", "concurrent sequences", "context per sequence", "weights",
                 "graphs / compilation", "speculation", "draft tokens per step")
# How a drafter's source ends where it also drafts from other requests served before (a server-wide n-gram trie):
# a repeated prompt then meets drafts learnt from its own earlier serves, which a cross-engine report must say.
EARLIER_REQUESTS = "earlier requests included"
# Where a server's start went, in order: Engine.startup_facts' `start_parts` gives seconds per part, each engine
# those its log tells (imports up to the first line, spawning the engine's processes, devices and workers,
# weights, compilation, graph capture, KV cache with memory profiling and warm-up, ready to serve); the servers
# table (specbook.report.tables.start_breakdown) adds what the harness's ready_s holds beyond them.
START_PARTS = ("imports", "spawn", "setup", "weights", "compile", "graphs", "kv_cache", "ready")


class EngineConfig(BaseModel):
    """One engine server's configuration as an experiment declares it (the params YAML's `engine:` keys).

    The fields are one vocabulary for every engine (vLLM's words, where it had them first); each adapter maps
    them onto its own server, and refuses at params time, naming the field, what it cannot honour
    (`Engine.refusals`) rather than launching something else than what was declared.
    """

    model_config = ConfigDict(extra="forbid")

    engine: str = Field("vllm", description="the registered adapter serving this config (params naming none: vllm)")
    model: str = Field(min_length=1, description="path, hub id, or embedded model name; each adapter loads it in "
                       "its own format (llama.cpp: a GGUF, derived from the same weights where not given as one)")
    served_model_name: str | None = Field(None, description="the name clients send as `model`; None: `model` as "
                                          "declared (vLLM --served-model-name, llama.cpp --alias)")
    speculative_config: dict[str, Any] | None = Field(
        None, description="speculation, in keys every adapter maps or refuses: method (ngram, draft_model, ...), "
        "model (the draft), num_speculative_tokens (k), prompt_lookup_max / prompt_lookup_min (ngram sizes); an "
        "engine may take more keys of its own (vLLM: any of its speculative config's); None: speculation off")
    max_num_seqs: int | None = Field(default=None, gt=0, description="sequences served at once (vLLM "
                                     "--max-num-seqs, llama.cpp slots -np); None: the engine's default")
    max_model_len: int | None = Field(default=2048, gt=0, description="context tokens per sequence (vLLM "
                                      "--max-model-len, llama.cpp -c of this times the slots)")
    dtype: str | None = Field(None, description="the dtype the weights compute in (vLLM --dtype); an engine "
                              "that computes in its weights' own types accepts only theirs; None: the checkpoint's")
    # vLLM: --attention-backend NAME (FLASH_ATTN, TRITON_ATTN, FLASHINFER, ...); None lets vLLM choose. It
    # reaches the target only: vLLM 0.26 picks the draft's backend itself unless speculative_config names
    # one (attention_backend there). specbook.engines.vllm.startup reads from the log what each of them used.
    attention_backend: str | None = Field(None, description="the attention kernels by the engine's name for them; "
                                          "None: the engine chooses")
    enforce_eager: bool = Field(True, description="run the target without ahead-of-time compilation or graph "
                                "capture (vLLM --enforce-eager); false: the engine's compiled / captured path")
    seed: int | None = Field(0, description="the server's sampling seed (vLLM --seed, llama.cpp -s)")
    extra_args: list[str] = Field(default_factory=list, description="the engine's own options, appended as given")
    env: dict[str, str] = Field(default_factory=dict, description="variables set for the server's processes")
    ready_timeout_s: float = Field(default=600, gt=0, description="how long the server may take to become ready")

    @field_validator("extra_args")
    @classmethod
    def _not_specbooks_own(cls, args: list[str], info: ValidationInfo) -> list[str]:
        """Refuse extra arguments that set what specbook sets (the engine's `reserved_options`): the server
        would listen or answer where specbook does not look, and fail as "not ready" minutes later."""
        engine = info.data.get("engine")
        adapter = _registered(engine) if isinstance(engine, str) else None
        if adapter is None:  # an unknown engine is refused where it is launched, naming it
            return args
        reserved = tuple(getattr(adapter, "reserved_options", ()))
        for i, arg in enumerate(args):
            option = str(arg).split("=", 1)[0]
            if option in reserved:
                raise ValueError(
                    f"item {i} ({arg!r}) sets {option}, which specbook sets itself for {engine} (its own "
                    f"{', '.join(reserved)}); set served_model_name in the params for the model's name, and "
                    "leave host, port and metrics to specbook")
        return args

    @model_validator(mode="after")
    def _honoured_by_its_engine(self) -> EngineConfig:
        """Refuse, naming the field, what the engine cannot honour (a field it would otherwise ignore)."""
        adapter = _registered(self.engine)
        refused = adapter.refusals(self) if adapter is not None else []
        if refused:
            raise ValueError(f"engine {self.engine}: " + "; ".join(refused))
        return self

    def client_model_name(self) -> str:
        """The name clients send as "model": served_model_name, else the name as declared."""
        return self.served_model_name or self.model


def _registered(name: str) -> Engine | None:
    from specbook.core.errors import UnknownEngineError
    from specbook.engines.registry import get_engine

    try:
        return get_engine(name)
    except UnknownEngineError:
        return None


@runtime_checkable
class Engine(Protocol):
    """An engine adapter: what every engine must offer (argv and env, readiness, versions, counters, logs)."""

    name: str

    def refusals(self, cfg: EngineConfig) -> list[str]:
        """What of `cfg` this engine cannot honour, one sentence per field naming it; [] when it honours all.
        EngineConfig's validation raises them at params time."""
        ...

    def build_spec(self, cfg: EngineConfig, *, name: str, log_path: Path, port: int) -> ServerSpec:
        """How to launch `cfg` and tell it is ready (argv, env, readiness paths): specbook.engines.common's
        loopback_spec serves every adapter so far."""
        ...

    def probe_versions(self, base_url: str | None = None) -> dict[str, str]:
        """Versions in the launching environment (`engine`: the adapter's name, always) and, given a running
        server's URL, what the server says of itself."""
        ...

    def spec_decode_delta(
        self, before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None,
        cfg: EngineConfig | None = None,
    ) -> CounterDelta:
        """What the server's counters accrued between two scrapes, through the acceptance model. `cfg` is the
        server's config, for an engine whose counters leave out what it was asked (SGLang: draft tokens a step)."""
        ...

    def startup_facts(self, log_path: str | Path) -> dict[str, Any]:
        """What the server's log says of its start (attention backends, KV cache, load times; `start_parts`:
        seconds per part of START_PARTS it tells); {} if nothing."""
        ...

    def setup_facts(self, cfg: EngineConfig, startup: Mapping[str, Any]) -> dict[str, SetupFact]:
        """How a server was set up, on SETUP_ASPECTS (the aspects every engine can be lined up on): from the
        declared config and what its log said at start (`startup`: startup_facts plus the harness's
        `processes`). An aspect the engine cannot tell is absent."""
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


# -- optional capabilities: each a Protocol the adapter satisfies, asked for with registry.capability ---------

@dataclass(frozen=True)
class TracedPass:
    """One trace pass as it was sent, for the engine's tracer to read: the requests, the server's whole
    answers (non-streamed), the log the pass wrote and the folder the server traced into."""

    server_name: str
    base_url: str
    trace_dir: Path
    log_text: str
    responses: list[dict[str, Any]]
    requests: Sequence[ChatRequest]


@runtime_checkable
class ProposalTracer(Protocol):
    """How an engine's server is launched with its draft proposals traced, and how a pass is read back."""

    extra_body: Mapping[str, Any]  # added to each request of the pass (e.g. asking for the token ids)
    traces_whole_server: bool  # traces for its whole life once launched traced: a traced server of its own

    def recording(self, folder: Path) -> AbstractContextManager[None]:
        """Tracing on for the pass inside the block (a no-op where it is on for the server's life)."""
        ...

    def traced_config(self, cfg: EngineConfig, folder: Path) -> EngineConfig:
        """`cfg` with tracing on into `folder` (the same server otherwise)."""
        ...

    def read(self, traced: TracedPass) -> TraceReading:
        """The pass's proposal records and requests; TraceError saying why where this build cannot be traced."""
        ...


@runtime_checkable
class TracesProposals(Protocol):
    proposal_tracer: ProposalTracer


@runtime_checkable
class MeasuredSplit(Protocol):
    """Mean ms per decode step of a profiled window and its parts (specbook.measure.costsplit.PARTS names)."""

    @property
    def source(self) -> str: ...
    @property
    def steps(self) -> int: ...
    @property
    def step_ms(self) -> float: ...
    @property
    def parts_ms(self) -> dict[str, float]: ...
    @property
    def tokens_per_step(self) -> float: ...
    @property
    def note(self) -> str: ...


@runtime_checkable
class StepProfiler(Protocol):
    """How an engine tells what its decode step costs, part by part, over one measurement window."""

    profiles_whole_server: bool  # instrumented for its whole life: no unprofiled send on it to compare with
    flush_wait_s: float  # how long after the window's last response the engine's report is complete

    def profiled_config(self, cfg: EngineConfig, trace_dir: Path) -> EngineConfig:
        """`cfg` with the instrument installed (writing into `trace_dir` where it writes files)."""
        ...

    def recording(self, trace_dir: Path) -> AbstractContextManager[None]:
        """The instrument on for the window inside the block (a no-op where it is on for the server's life)."""
        ...

    def split(self, cfg: EngineConfig, log: LogRange, trace_dir: Path) -> MeasuredSplit:
        """The window's decode steps, split, from what the instrument wrote (its log range, its trace_dir)."""
        ...


@runtime_checkable
class ProfilesSteps(Protocol):
    profiler: StepProfiler


@runtime_checkable
class SetsLogStatsInterval(Protocol):
    """An engine whose log reports at intervals (not per request), and whose interval can be set."""

    def with_log_stats_interval(self, cfg: EngineConfig, seconds: float) -> EngineConfig:
        """`cfg` logging its statistics every `seconds` (what cfg itself sets wins)."""
        ...


@runtime_checkable
class UpgradesLogFrames(Protocol):
    def upgrade_log_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """A frame of log_intervals records saved by an older specbook, in the columns log_intervals gives
        now; any other frame (one it did not write, or already current) returned as it is."""
        ...


@runtime_checkable
class SummarisesRequestLogs(Protocol):
    """An engine whose log prints draft statistics per request (its log_intervals rows are requests)."""

    def request_log_figures(self, records: pd.DataFrame) -> dict[str, float | int | None]:
        """The log's own figures over these log_intervals rows, kept raw beside the counters: log_requests,
        log_mean_len (the AL it prints), log_accepted_tokens, log_draft_tokens."""
        ...

    def requests_logged(self, text: str) -> int:
        """How many requests this stretch of its log shows ended (their statistics written in full): a window
        waits for the count to reach its requests, since the log may be written after the response."""
        ...


class DraftCounts(NamedTuple):
    """Draft tokens and accepted ones as an engine reports them for one request; None where it does not."""

    drafted: int | None = None
    accepted: int | None = None


@runtime_checkable
class ReportsResponseDrafts(Protocol):
    def response_draft_counts(self, body: Mapping[str, Any]) -> DraftCounts:
        """The draft counts a non-streamed response's body carries (llama.cpp: its `timings`)."""
        ...


@runtime_checkable
class ForgetsDrafts(Protocol):
    """An engine whose drafter can also learn from earlier requests (its set-up fact's source ends in
    EARLIER_REQUESTS), and how a harness empties what it learnt, so that a timed request drafts from its own tokens
    as on a first serve."""

    def remembers(self, cfg: EngineConfig) -> bool:
        """Whether a server of `cfg` drafts from earlier requests."""
        ...

    def forget(self, base_url: str) -> str:
        """Empty what the running server's drafter learnt from earlier requests (and whatever else the engine
        empties with it: the returned phrase says what); EngineError where the server did not."""
        ...


@runtime_checkable
class DerivesWeights(Protocol):
    """An engine that serves the declared weights converted to a format of its own."""

    def weights_proof(self, model: str) -> dict[str, Any]:
        """Whether the weights it serves for `model` (and how they were derived) are the declared ones."""
        ...


@runtime_checkable
class DescribesBuild(Protocol):
    def describe_build(self, versions: Mapping[str, str]) -> str | None:
        """The build a server ran, in words, from its recorded versions; None where they say nothing."""
        ...


@runtime_checkable
class BenchReader(Protocol):
    """Outputs of the engine's own benchmark client, read as `specbook ingest` records."""

    def reads_folder(self, path: Path) -> bool:
        """Whether `path` is an output folder of the benchmark client."""
        ...

    def detects(self, head: str) -> bool:
        """Whether a file whose first bytes are `head` is a result file of the benchmark client."""
        ...

    def read(self, path: Path) -> list[dict[str, Any]]:
        """One JSON-ready record per benchmark run the file or folder holds (IngestError naming the file)."""
        ...


@runtime_checkable
class ReadsBenchOutputs(Protocol):
    bench_reader: BenchReader


# Every optional capability, for the registry's listing and the adapters' tests.
CAPABILITIES: tuple[type, ...] = (
    TracesProposals, ProfilesSteps, SetsLogStatsInterval, UpgradesLogFrames, SummarisesRequestLogs,
    ReportsResponseDrafts, DerivesWeights, DescribesBuild, ReadsBenchOutputs,
)
