"""The config-flip params: which folder and field to flip, to which values, and the engine config all arms share.

The shared EngineConfig holds the placeholder ``@flip`` where each arm's folder goes: ``engine.model`` (flip the
target) or ``engine.speculative_config.model`` (flip the draft), in exactly one place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specbook.core.errors import ExperimentError, ModelNotPreparedError
from specbook.core.params import ExperimentParams
from specbook.core.request_failures import RequestMeasurement
from specbook.engines import EngineConfig
from specbook.experiments.config_flip import flip

FLIP_PLACEHOLDER = "@flip"
FlipRole = Literal["target", "draft"]


class FlipSpec(BaseModel):
    """Which folder, which JSON file in it, which dotted field, and the values to compare."""

    model_config = ConfigDict(extra="forbid")

    folder: str = Field(description="model folder to flip: a path or an embedded model name")
    file: str = Field("config.json", description="JSON file of the folder holding the field, relative to it")
    field: str = Field(description="dotted path into the file, e.g. rope_theta or rope_scaling.factor")
    # any JSON value the field may hold: a number, a string, null, a list or an object
    values: list[Any] = Field(min_length=2, description="one arm per value, in this order")
    add_missing: bool = Field(False, description="add the field when the file lacks it (else refused)")
    link: Literal["symlink", "hardlink"] = Field(
        "symlink", description="how weight files are shared with the original; they are never copied"
    )

    @field_validator("file")
    @classmethod
    def _inside_the_folder(cls, v: str) -> str:
        try:  # checked again against the folder itself (symlinks) when the arms are built
            return flip.check_relative_file(v, "flip.file")
        except ExperimentError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("field")
    @classmethod
    def _dotted(cls, v: str) -> str:
        try:
            flip.check_dotted_path(v)
        except ExperimentError as exc:  # pydantic wraps ValueError with the field's location
            raise ValueError(str(exc)) from None
        return v

    @field_validator("values")
    @classmethod
    def _distinct(cls, v: list[Any]) -> list[Any]:
        seen = [json.dumps(x, sort_keys=True) for x in v]
        dupes = sorted({s for s in seen if seen.count(s) > 1})
        if dupes:
            raise ValueError(f"values must be distinct; repeated: {', '.join(dupes)}")
        return v


class ConfigFlipParams(ExperimentParams):
    flip: FlipSpec
    engine: EngineConfig = Field(description=f"shared by all arms; {FLIP_PLACEHOLDER!r} marks the flipped folder")
    prompts: list[str] = Field(min_length=1, description="user messages, sent as single-turn chats")
    system_prompt: str | None = None
    num_prompts: int | None = Field(None, ge=1, description="use only the first N prompts")
    max_tokens: int = Field(128, ge=2)
    concurrency: int = Field(1, ge=1, description="1 keeps per-step time a clean single-sequence figure")
    warmup_requests: int = Field(1, ge=0, description="sent before the first /metrics snapshot, not measured")
    collapse_fraction: float = Field(
        0.25, gt=0, lt=1,
        description="an arm collapsed if its accepted tokens per step (AL-1) <= this x the best arm's",
    )
    measurement: RequestMeasurement = Field(default_factory=RequestMeasurement,
                                            description="max_failed_requests: per arm")
    traces: bool = Field(False, description="after the measured arms: an untimed trace pass per arm (its own "
                                            "server, tracing on); draft_model arms also get the replay reference")
    trace_num_prompts: int | None = Field(None, ge=1, description="trace pass: the first N prompts (default all)")
    cost_split: bool = Field(False, description="after the measured arms: a profiled pass per arm (its own server): "
                                                "ms per decode step split into parts")
    cost_split_num_prompts: int = Field(2, ge=1, description="profiled pass: the first N prompts, sent three "
                                                             "times (warm-up, unprofiled, profiled)")
    starts_together: int = Field(1, ge=1, le=2, description="2: the arms' servers start in pairs (the next arm's "
                                 "launched beside this one's; each window starts once both are ready, so no window "
                                 "overlaps a start), the trace passes' likewise. For CPU hosts, where a start keeps "
                                 "one core busy; on a GPU two starts at once would each claim its memory")

    @model_validator(mode="after")
    def _one_placeholder(self) -> ConfigFlipParams:
        try:
            flip_role(self.engine)
        except ExperimentError as exc:
            raise ValueError(str(exc)) from None
        return self

    def selected_prompts(self) -> list[str]:
        return self.prompts[: self.num_prompts] if self.num_prompts else list(self.prompts)

    def check_inputs(self) -> None:
        """The flip folder exists and its flipped file is one of its own (a hub snapshot's link into its own
        cache's blobs counts), before any run folder is made."""
        super().check_inputs()
        folder = resolve_folder(self.flip.folder)
        target = flip.resolve_inside(folder, self.flip.file)
        if not target.is_file():
            raise ExperimentError(f"flip.file {self.flip.file!r}: no such file in the flip folder {folder}")


def flip_role(engine: EngineConfig) -> FlipRole:
    """Where the placeholder sits; exactly one place, and nowhere else in the config."""
    spec_model = (engine.speculative_config or {}).get("model")
    places: list[FlipRole] = [role for role, value in (("target", engine.model), ("draft", spec_model))
                              if value == FLIP_PLACEHOLDER]
    if len(places) != 1:
        raise ExperimentError(
            f"engine: put {FLIP_PLACEHOLDER!r} in exactly one of engine.model (flip the target) or "
            f"engine.speculative_config.model (flip the draft); found it in {len(places)}"
        )
    dumped = engine.model_dump(mode="json")
    dumped["model"] = None
    if dumped.get("speculative_config"):
        dumped["speculative_config"] = {k: v for k, v in dumped["speculative_config"].items() if k != "model"}
    if FLIP_PLACEHOLDER in json.dumps(dumped):
        raise ExperimentError(f"engine: {FLIP_PLACEHOLDER!r} may only stand for the model folder, found elsewhere")
    return places[0]


def resolve_folder(name_or_path: str) -> Path:
    """A folder path as given, else an embedded model name's prepared folder (the engines' rule)."""
    from specbook.engines import resolve_model

    try:
        resolved = Path(resolve_model(name_or_path))
    except ModelNotPreparedError as exc:
        raise ExperimentError(f"flip.folder {name_or_path!r}: {exc}") from exc
    if not resolved.is_dir():
        raise ExperimentError(
            f"flip.folder {name_or_path!r} is neither a model folder nor an embedded model name "
            "(a hub id cannot be flipped: download it to a folder first)"
        )
    return resolved.resolve()
