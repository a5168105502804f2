"""Knob A/B params: the engine, the knobs and how they cross, the workload, the steady-state cut, the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specbook.arms import Arm, KnobSpec, build_arms
from specbook.decision import DecisionRule
from specbook.engines.base import EngineConfig
from specbook.params import ExperimentParams
from specbook.paths import project_root


class WorkloadParams(BaseModel):
    """GSM8K k-shot chat: local JSONL paths (tests, CI) or the hub (`openai/gsm8k`) when left null."""

    model_config = ConfigDict(extra="forbid")

    dataset: Literal["gsm8k"] = "gsm8k"
    test_path: str | None = Field(None, description="test.jsonl; null loads openai/gsm8k from the hub")
    train_path: str | None = Field(None, description="train.jsonl (few-shot source); null: the hub")
    subset: int | None = Field(32, ge=1, description="questions drawn from the test split; null: all")
    seed: int = Field(1234, description="seed of the subset draw (recorded with the indices)")
    shots: int = Field(5, ge=0)
    max_tokens: int = Field(256, ge=1)
    concurrency: int = Field(4, ge=1, description="requests in flight; the steady-state target")
    request_seed: int | None = Field(0, description="per-request sampling seed (greedy anyway)")
    resample_per_sweep: bool = Field(
        False, description="draw a fresh subset for each sweep (seed + sweep), the same for every arm of that "
        "sweep: run-to-run sd then includes which questions were served, the noise of a real workload; "
        "false: every sweep serves the same questions and sd is the engine's own run-to-run noise",
    )

    def subset_seed(self, sweep: int) -> int:
        return self.seed + sweep if self.resample_per_sweep else self.seed


class SteadyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_running_fraction: float = Field(
        0.75, ge=0, le=1, description="keep intervals with running >= this x concurrency (the load cut)"
    )
    sensitivity: list[float] = Field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    crude_al_threshold: float | None = Field(
        None, description="the crude cut to contrast with: drop intervals with AL above this; null: the "
        "baseline's pooled AL over all its intervals"
    )


class MeasurementParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    log_stats_interval_s: float = Field(1.0, gt=0, description="VLLM_LOG_STATS_INTERVAL for launched servers")
    flush_wait_s: float | None = Field(
        None, ge=0, description="wait after the last request so the last log interval is written; "
        "null: 2.5 x log_stats_interval_s"
    )
    primary: Literal["steady_log_al", "counter_al"] = Field(
        "steady_log_al", description="per-run AL the statistics use: steady-state log intervals, or whole-run counters"
    )
    n_boot: int = Field(5000, ge=100)
    bootstrap_seed: int = 0


class IngestParams(BaseModel):
    """Analyse existing server logs instead of launching servers (one file = one run)."""

    model_config = ConfigDict(extra="forbid")

    logs: list[str] = Field(min_length=1, description="globs, relative to the project root or absolute")
    arm_from: Literal["env", "mapping"] = Field(
        "env", description="env: match each file's `Env:` line against the arms' knob env; mapping: by the mapping"
    )
    mapping: dict[str, str] = Field(
        default_factory=dict,
        description="arm_from=mapping: {'KEY=VALUE [KEY2=VALUE2]' or 'glob:PATTERN': arm name}",
    )
    sweep_from_order: bool = Field(True, description="number sweeps per arm by file order")


class KnobABParams(ExperimentParams):
    mode: Literal["launch", "ingest"] = "launch"
    engine: EngineConfig
    knobs: list[KnobSpec] = Field(min_length=1)
    crossed: bool = Field(True, description="all knob combinations (2^n arms); false: baseline + each knob alone")
    sweeps: int = Field(2, ge=1, description="independent sweeps per arm, each on a fresh server")
    workload: WorkloadParams = Field(default_factory=WorkloadParams)
    steady_state: SteadyParams = Field(default_factory=SteadyParams)
    measurement: MeasurementParams = Field(default_factory=MeasurementParams)
    decision: DecisionRule = Field(default_factory=DecisionRule)
    ingest: IngestParams | None = None

    @model_validator(mode="after")
    def _ingest_needs_logs(self) -> KnobABParams:
        if self.mode == "ingest" and self.ingest is None:
            raise ValueError("mode 'ingest' needs an `ingest:` block with `logs:` globs")
        return self

    def arms(self) -> list[Arm]:
        return build_arms(self.engine.model_dump(), self.knobs, crossed=self.crossed)

    def knob(self, name: str) -> KnobSpec:
        return next(k for k in self.knobs if k.name == name)


def load_params_file(path: str) -> KnobABParams:
    from specbook.params import load_params

    return load_params(KnobABParams, path)


def resolve_path(p: str | None) -> Path | None:
    """Params paths are relative to the project root, wherever the notebook runs."""
    if p is None:
        return None
    path = Path(p).expanduser()
    return path if path.is_absolute() else (project_root() / path).resolve()
