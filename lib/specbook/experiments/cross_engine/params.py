"""The cross-engine params schema: the two sides, the lanes, the prompts and the optional passes, with the
matched-work rules every run must meet checked when the params are read.

Matched work, enforced by the params schema: the same target (an embedded name or the same path:
llama.cpp gets a GGUF bit-identical to the safetensors vLLM loads, see specbook.models.weights), the same
lane (speculation off / a speculative_config with the same draft and k) on both sides, the same
max concurrent sequences, greedy decoding, the same prompts and max_tokens; chat prompts are
templated by each server from the same template (the prompt-length guard checks they agree).

Prompts: the fixed `prompts` list, then the requests a `workload` (the registry: spec_bench, jsonl, gsm8k)
draws, each with its category. Every prompt is sent as one turn: a conversation's second turn would carry
each engine's own first answer, so the two sides would no longer get the same prompt (a drawn request with
a follow-up turn is refused; Spec-Bench's MT-Bench questions go as their first turn, `turns: 1`).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specbook.core.params import ExperimentParams
from specbook.core.request_failures import RequestMeasurement
from specbook.engines import EngineConfig
from specbook.experiments.cross_engine.guards import GuardThresholds
from specbook.experiments.cross_engine.timing import TimingSpec
from specbook.workloads.params import WorkloadParams

if TYPE_CHECKING:
    from specbook.serve.client import ChatRequest
    from specbook.workloads import WorkloadDraw

SIDES = ("ours", "oracle")
OFF_LANE = "off"


class SideSpec(BaseModel):
    """One side of the comparison: its engine config (without speculation: lanes add it) and its pins."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, description="shown in tables, e.g. llamacpp")
    engine: EngineConfig
    pins: dict[str, str | None] = Field(
        default_factory=dict,
        description="expected probe_versions() values; null = must be absent; glob patterns allowed",
    )


class LaneSpec(BaseModel):
    """One speculation setting applied to both sides."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    speculative_config: dict[str, Any] | None = None


class PromptSpec(BaseModel):
    """One prompt: a chat user message (templated by each server) or a plain completion prompt."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    text: str = Field(min_length=1)
    chat: bool = True
    system: str | None = None
    category: str | None = Field(None, description="task category (e.g. a Spec-Bench group): ratio and AL per category")

    def request(self) -> ChatRequest:
        """This prompt as a request template (build_request sets the experiment's decoding on it)."""
        from specbook.serve.client import ChatRequest

        if not self.chat:
            return ChatRequest(prompt_id=self.id, prompt=self.text, category=self.category)
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": self.text})
        return ChatRequest(prompt_id=self.id, messages=messages, category=self.category)


# Workload fields cross_engine sets itself for every prompt (fixed or drawn): left at their defaults.
_WORKLOAD_FIELDS_SET_HERE = {
    "max_tokens": "the top-level max_tokens", "concurrency": "one request at a time",
    "request_seed": "greedy, no seed (as the fixed prompts)", "resample_per_sweep": "one draw per run",
}
SPEC_BENCH_DEPRECATED = (
    "params `spec_bench:` is deprecated (read as `workload:`): write `workload: {dataset: spec_bench, path: ..., "
    "per_category: N, seed: S, max_chars: M, turns: 1}` instead"
)


def _spec_bench_as_workload(block: Any) -> dict[str, Any]:
    """The deprecated `spec_bench:` block (path, per_category, seed, max_chars: first turns) as a `workload:`."""
    if not isinstance(block, dict):
        raise ValueError(f"spec_bench: expected a mapping, got {block!r}; {SPEC_BENCH_DEPRECATED}")
    unknown = sorted(set(block) - {"path", "per_category", "seed", "max_chars"})
    if unknown:
        raise ValueError(f"spec_bench: unknown field(s) {unknown}; {SPEC_BENCH_DEPRECATED}")
    # the old block's defaults (per_category 3, seed 0, max_chars 4000): the same draw as before
    return {"dataset": "spec_bench", "path": block.get("path"), "per_category": block.get("per_category", 3),
            "seed": block.get("seed", 0), "max_chars": block.get("max_chars", 4000), "turns": 1}


class TracesSpec(BaseModel):
    """A separate, untimed trace pass per side x speculative lane (its own server, tracing on)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="trace each speculative lane on both sides (an extra server each)")
    replay: bool = Field(True, description="draft_model lanes: compute the draft's own greedy proposals "
                                           "(transformers, same weights) as the reference")


class EqualWorkSpec(BaseModel):
    """Diverged or length-mismatched cells (not loops) re-run on both sides with max_tokens = their common prefix."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="re-run such cells (an extra server per side x lane that has one)")
    warm_repeats: int | None = Field(None, ge=1, description="timed repeats per re-run cell (default: warm_repeats)")


class CostSplitSpec(BaseModel):
    """A profiled pass per side x lane (specbook.measure.costsplit): mean ms per decode step split into parts."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="profile each side x lane (an extra server each)")
    lanes: list[str] | None = Field(None, description="lane names to profile (default: every lane)")
    num_prompts: int = Field(2, ge=1, description="the first N prompts are sent (three times: warm-up, "
                                                   "unprofiled, profiled)")


class CrossEngineParams(ExperimentParams):
    ours: SideSpec
    oracle: SideSpec
    lanes: list[LaneSpec] = Field(min_length=1)
    prompts: list[PromptSpec] = Field(min_length=1)
    num_prompts: int | None = Field(None, ge=1, description="use only the first N prompts")
    max_tokens: int = Field(128, ge=2)
    warm_repeats: int = Field(3, ge=1, description="timed repeats per prompt after one discarded cold run (more "
                                                   "where timing.min_timed_wall_s needs them)")
    matched_work: bool = Field(
        False, description="force equal lengths: ignore_eos with max_tokens on both sides (equal work)"
    )
    guards: GuardThresholds = Field(default_factory=GuardThresholds)
    ci_level: float = Field(0.95, gt=0, lt=1)
    n_boot: int = Field(2000, ge=100)
    measurement: RequestMeasurement = Field(default_factory=RequestMeasurement,
                                            description="max_failed_requests: per lane x prompt cell, both sides")
    workload: WorkloadParams | None = Field(
        None, description="requests drawn from the workload registry (spec_bench, jsonl, gsm8k; with their "
        "categories), appended to `prompts`; one turn each (spec_bench: turns: 1)")
    traces: TracesSpec = Field(default_factory=TracesSpec)
    equal_work: EqualWorkSpec = Field(default_factory=EqualWorkSpec)
    cost_split: CostSplitSpec = Field(default_factory=CostSplitSpec)
    timing: TimingSpec = Field(default_factory=TimingSpec, description="when a cell is timed on equal decode work "
                               "(common tokens, decode wall) and how many repeats collection may add")
    draft_memory: Literal["forget", "keep"] = Field(
        "forget", description="a side whose drafter also learns from earlier requests (SGLang's NGRAM trie): "
        "`forget` empties it before each timed request (one request per window), so every timed request drafts "
        "as on a first serve; `keep` times prompts served before, and the lane's headline says so")

    @model_validator(mode="before")
    @classmethod
    def _deprecated_spec_bench(cls, data: Any) -> Any:
        """Params files written before the workload registry: `spec_bench:` is read as `workload:`."""
        if not isinstance(data, dict) or "spec_bench" not in data:
            return data
        if data["spec_bench"] is None:  # run folders' params.yaml of that time hold `spec_bench: null`
            return {k: v for k, v in data.items() if k != "spec_bench"}
        if data.get("workload") is not None:
            raise ValueError("spec_bench and workload are both given: keep `workload:` only "
                             "(`spec_bench:` is its deprecated spelling)")
        workload = _spec_bench_as_workload(data["spec_bench"])
        warnings.warn(SPEC_BENCH_DEPRECATED, FutureWarning, stacklevel=2)
        return {**{k: v for k, v in data.items() if k != "spec_bench"}, "workload": workload}

    @model_validator(mode="after")
    def _workload_sends_single_turns(self) -> CrossEngineParams:
        w = self.workload
        if w is None:
            return self
        if getattr(w, "turns", 1) != 1:
            raise ValueError(
                f"workload.turns is {w.turns}: cross_engine sends every prompt as one turn (a second turn would "
                "carry each engine's own first answer, so the sides would not get the same prompt); write turns: 1")
        defaults = type(w).model_fields
        changed = [f"workload.{k} ({getattr(w, k)!r}; here: {how})" for k, how in _WORKLOAD_FIELDS_SET_HERE.items()
                   if getattr(w, k) != defaults[k].default]
        if changed:
            raise ValueError(f"{', '.join(changed)}: cross_engine sets these itself for every prompt; leave them out")
        return self

    @model_validator(mode="after")
    def _matched_work(self) -> CrossEngineParams:
        o, r = self.ours.engine, self.oracle.engine
        if o.model != r.model:
            raise ValueError(
                f"ours.engine.model {o.model!r} and oracle.engine.model {r.model!r} differ: both sides must "
                "serve the same target weights (an embedded name, or the same path)"
            )
        if (o.max_num_seqs or 1) != (r.max_num_seqs or 1):
            raise ValueError(
                f"ours.engine.max_num_seqs ({o.max_num_seqs}) and oracle.engine.max_num_seqs ({r.max_num_seqs}) "
                "differ: matched work needs the same max concurrent sequences"
            )
        for side in (self.ours, self.oracle):
            if side.engine.speculative_config is not None:
                raise ValueError(
                    f"{side.label}: engine.speculative_config must be empty; speculation is set per lane (lanes)"
                )
        names = [lane.name for lane in self.lanes]
        if len(set(names)) != len(names):
            raise ValueError(f"lanes: names must be distinct, got {names}")
        ids = [p.id for p in self.prompts]
        if len(set(ids)) != len(ids):
            raise ValueError(f"prompts: ids must be distinct, got {ids}")
        if self.ours.label == self.oracle.label:
            raise ValueError("ours.label and oracle.label must differ")
        unknown = sorted(set(self.cost_split.lanes or []) - set(names))
        if unknown:
            raise ValueError(f"cost_split.lanes: {unknown} are not lanes of this run ({names})")
        self._instruments_on_both_sides()
        fewest = max(self.warm_repeats, self.equal_work.warm_repeats or 0)
        if self.timing.max_warm_repeats < fewest:
            raise ValueError(f"timing.max_warm_repeats ({self.timing.max_warm_repeats}) is below the repeats every "
                             f"cell gets (warm_repeats / equal_work.warm_repeats: {fewest}): raise it or lower those")
        return self

    def _instruments_on_both_sides(self) -> None:
        """Traces and the cost split compare the two sides: refused, naming the field and the engine, where a
        side's engine has no proposal tracer or no step profiler (it would fail at its phase, after the timed
        windows)."""
        from specbook.engines import capability
        from specbook.engines.base import ProfilesSteps, TracesProposals

        wanted = [("traces.enabled", self.traces.enabled, TracesProposals, "proposal tracer"),
                  ("cost_split.enabled", self.cost_split.enabled, ProfilesSteps, "step profiler")]
        for field_name, enabled, kind, what in wanted:
            lacking = [f"{side.label} ({side.engine.engine})" for side in (self.ours, self.oracle)
                       if enabled and capability(side.engine.engine, kind) is None]
            if lacking:
                raise ValueError(f"{field_name}: {', '.join(lacking)} has no {what}, and a one-sided {what} "
                                 f"compares nothing: set {field_name} false")

    def draws_workload(self) -> bool:
        """Whether the run sends drawn prompts: a workload, and num_prompts unset or beyond the fixed list."""
        return self.workload is not None and not (self.num_prompts and self.num_prompts <= len(self.prompts))

    def draw(self) -> WorkloadDraw | None:
        """The workload's draw (its file read now; None without a workload); a follow-up turn is refused."""
        from specbook.core.errors import WorkloadError
        from specbook.workloads import draw_workload

        if self.workload is None:
            return None
        drawn = draw_workload(self.workload, self.workload.seed)
        multi = [r.prompt_id for r in drawn.requests if r.follow_up]
        if multi:
            raise WorkloadError(
                f"workload ({drawn.name}): {len(multi)} drawn prompt(s) have follow-up turns ({', '.join(multi[:3])}"
                f"{', ...' if len(multi) > 3 else ''}); cross_engine sends every prompt as one turn: give single-turn "
                "prompts (jsonl: a string in workload.prompt_field)")
        return drawn

    def all_prompts(self, drawn: WorkloadDraw | None = None) -> list[ChatRequest]:
        """Request templates: `prompts`, then the workload's draw (`drawn`, or drawn now); ids must be distinct."""
        from specbook.core.errors import WorkloadError

        drawn = drawn if drawn is not None else self.draw()
        out = [p.request() for p in self.prompts] + (list(drawn.requests) if drawn else [])
        ids = [r.prompt_id for r in out]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise WorkloadError(f"workload: drawn prompt ids {dup[:5]} repeat ids of `prompts`; rename those prompts")
        return out

    def selected_prompts(self, drawn: WorkloadDraw | None = None) -> list[ChatRequest]:
        """The request templates this run sends: every prompt, or the first `num_prompts` (the workload is
        drawn only when `prompts` alone has fewer)."""
        if not self.draws_workload():
            return [p.request() for p in self.prompts[: self.num_prompts]]
        prompts = self.all_prompts(drawn)
        return prompts[: self.num_prompts] if self.num_prompts else prompts

    def side(self, which: str) -> SideSpec:
        return self.ours if which == "ours" else self.oracle
