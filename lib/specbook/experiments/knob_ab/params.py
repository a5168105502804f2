"""Knob A/B params: the engine, the knobs and how they cross, the workload, the steady-state cut, the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specbook.core.params import ExperimentParams
from specbook.core.paths import project_root
from specbook.core.request_failures import max_failed_requests_field
from specbook.engines.base import EngineConfig
from specbook.executors import ExecutorParams
from specbook.experiments.arms import Arm, KnobSpec, build_arms
from specbook.experiments.knob_ab.decision import DecisionRule
from specbook.workloads.params import Gsm8kWorkloadParams
from specbook.workloads.params import WorkloadParams as AnyWorkloadParams

# The workload schemas live with the workloads (one registry for every experiment). `WorkloadParams` here
# stays the GSM8K schema for modules that read GSM8K's fields directly.
WorkloadParams = Gsm8kWorkloadParams


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

    log_stats_interval_s: float = Field(1.0, gt=0, description="the engine's log-statistics interval for launched "
                                        "servers (where its log reports at intervals: vLLM)")
    flush_wait_s: float | None = Field(
        None, ge=0, description="wait after the last request so the last log interval is written; "
        "null: 2.5 x log_stats_interval_s"
    )
    primary: Literal["steady_log_al", "counter_al"] = Field(
        "steady_log_al", description="per-run AL the statistics use: steady-state log intervals, or whole-run counters"
    )
    max_failed_requests: int = max_failed_requests_field()  # per run (specbook.core.request_failures)
    # No knob A/B interval resamples any more (they are Welch t, specbook.core.stats); kept so that params files
    # and run folders written before still load.
    n_boot: int = Field(5000, ge=100, description="unused (was the bootstrap's resample count)")
    bootstrap_seed: int = Field(0, description="unused (was the bootstrap's seed)")


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
    sweeps_min: int | None = Field(
        None, ge=1, description="adaptive sweeps: first look after this many sweeps; null: `sweeps`"
    )
    sweeps_max: int | None = Field(
        None, ge=1, description="adaptive sweeps: stop here at the latest (specbook.experiments.knob_ab.sequential decides in between); "
        "null: `sweeps`. sweeps_min = sweeps_max is a fixed protocol; otherwise the collection loop looks "
        "(sequential.should_continue) after each complete sweep from sweeps_min on and stops once it decides"
    )
    workload: AnyWorkloadParams = Field(default_factory=Gsm8kWorkloadParams)
    steady_state: SteadyParams = Field(default_factory=SteadyParams)
    measurement: MeasurementParams = Field(default_factory=MeasurementParams)
    decision: DecisionRule = Field(default_factory=DecisionRule)
    ingest: IngestParams | None = None
    executor: ExecutorParams = Field(default_factory=ExecutorParams, description="where the runs execute: local "
                                     "(one after another) or ray (as Ray tasks over the cluster's GPUs)")

    @model_validator(mode="after")
    def _ingest_needs_logs(self) -> KnobABParams:
        if self.mode == "ingest" and self.ingest is None:
            raise ValueError("mode 'ingest' needs an `ingest:` block with `logs:` globs")
        return self

    @model_validator(mode="after")
    def _sweep_bounds(self) -> KnobABParams:
        lo, hi = self.sweep_bounds()
        if lo > hi:
            raise ValueError(f"sweeps_min ({lo}) must be <= sweeps_max ({hi})")
        if hi > lo and lo < 2:
            raise ValueError(f"adaptive sweeps need sweeps_min >= 2 (a first look needs a run-to-run sd); got {lo}")
        return self

    def check_inputs(self) -> None:
        """Launch: the workload's files; ingest: every `ingest.logs` glob matches a file."""
        if self.mode != "ingest" or self.ingest is None:
            super().check_inputs()
            return
        import glob

        from specbook.core.errors import ParamsError

        for pattern in self.ingest.logs:
            p = resolve_path(pattern)
            if not glob.glob(str(p), recursive=True):
                raise ParamsError(f"ingest.logs: {pattern!r} matches no file (looked at {p})")

    def sweep_bounds(self) -> tuple[int, int]:
        """(sweeps_min, sweeps_max), each defaulting to `sweeps`: equal bounds are today's fixed protocol."""
        lo = self.sweeps if self.sweeps_min is None else self.sweeps_min
        hi = self.sweeps if self.sweeps_max is None else self.sweeps_max
        return lo, hi

    @property
    def adaptive(self) -> bool:
        lo, hi = self.sweep_bounds()
        return hi > lo and self.mode == "launch"  # ingest adds no sweep: it analyses the logs it is given

    def arms(self) -> list[Arm]:
        return build_arms(self.engine.model_dump(), self.knobs, crossed=self.crossed)

    def knob(self, name: str) -> KnobSpec:
        return next(k for k in self.knobs if k.name == name)


def load_params_file(path: str) -> KnobABParams:
    from specbook.core.params import load_params

    return load_params(KnobABParams, path)


def resolve_path(p: str | None) -> Path | None:
    """Params paths are relative to the project root, wherever the notebook runs."""
    if p is None:
        return None
    path = Path(p).expanduser()
    return path if path.is_absolute() else (project_root() / path).resolve()
