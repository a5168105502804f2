"""Cross-engine comparison: our engine against a pinned oracle engine, with guards before any ratio.

Matched work, enforced by the params schema: the same target (an embedded name or the same path:
llama.cpp gets a GGUF bit-identical to the safetensors vLLM loads, see specbook.models.weights), the same
lane (speculation off / a speculative_config with the same draft and k) on both sides, the same
max concurrent sequences, greedy decoding, the same prompts and max_tokens; chat prompts are
templated by each server from the same template (the prompt-length guard checks they agree).

Prompts: the fixed `prompts` list, then the requests a `workload` (the registry: spec_bench, jsonl, gsm8k)
draws, each with its category. Every prompt is sent as one turn: a conversation's second turn would carry
each engine's own first answer, so the two sides would no longer get the same prompt (a drawn request with
a follow-up turn is refused; Spec-Bench's MT-Bench questions go as their first turn, `turns: 1`).

Per lane x side: one fresh server. Per prompt on it: one cold request (not timed; its raw response,
with llama.cpp's `timings`, is kept), a /metrics snapshot, N warm repeats streamed one at a time,
a second snapshot; where their decode wall is shorter than `timing.min_timed_wall_s`, one more window of
as many repeats as it still needs. Warm tok/s = completion_tokens / whole-request wall time; the headline is
the decode rate on equal decode work (cross_engine_timing). AL per cell comes from the counter delta under
specbook.core.acceptance's one definition; raw figures are kept beside it.

Token ids for the guards come from tokenizing each output text with the target's own tokenizer
(both engines use the same vocabulary): one token space for every engine, and nothing added to the
timed requests (logprobs / token-id options change what the server does per token).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specbook.core import request_failures, stats
from specbook.core.acceptance import (
    ACCEPTED,
    DEFINITION,
    Acceptance,
    frame_acceptance,
    per_position_frame,
    upgrade_position_columns,
)
from specbook.core.params import ExperimentParams
from specbook.core.request_failures import RequestMeasurement
from specbook.engines import EngineConfig
from specbook.experiments.cross_engine import timing as timing
from specbook.experiments.cross_engine import traces as cet
from specbook.experiments.cross_engine.guards import GuardThresholds, GuardVerdict, SideOutputs, guard_cell
from specbook.experiments.cross_engine.setups import asymmetries
from specbook.experiments.cross_engine.timing import TimingSpec
from specbook.experiments.registry import ExperimentSpec, register_experiment
from specbook.measure import categories, costsplit
from specbook.report import view as report_view
from specbook.store.units import Units, done_units, register_units, set_aside_folder
from specbook.workloads.params import WorkloadParams

if TYPE_CHECKING:
    from specbook.serve.client import ChatRequest
    from specbook.workloads import WorkloadDraw

SIDES = ("ours", "oracle")
OFF_LANE = "off"
# Frames / JSON documents in run_dir/data (the notebook's reuse_data path reads these back).
REQUESTS_FRAME = "requests"
CELLS_FRAME = "cell_counters"
SERVERS_FRAME = "servers"
PINS_JSON = "pins"
COLD_JSON = "cold_responses"
WEIGHTS_JSON = "weights"
WORKLOAD_JSON = "workload"  # the workload draw's selection record (source, sha256, seed, ids); absent without one
EQUAL_WORK_FRAME = "equal_work_requests"
COST_SPLIT_FRAME = "cost_split"
# A unit of work is one side x lane x kind server: kind "timed" (all its prompt cells), "trace" (the untimed
# trace pass), "profile" (the cost split's profiled pass), "equal_work" (diverged cells re-run on their common
# prefix). Its servers row (appended last) says it finished; runs saved before kinds existed are all "timed".
UNIT_KINDS = ("timed", "trace", "profile", "equal_work")
UNITS = register_units("cross_engine", Units(
    done_frame=SERVERS_FRAME, key=("side", "lane", "kind"),
    frames=(REQUESTS_FRAME, CELLS_FRAME, SERVERS_FRAME, *cet.FRAMES, COST_SPLIT_FRAME, EQUAL_WORK_FRAME),
    server="server", key_defaults={"kind": "timed"}))
PROPOSALS_NOTE = (
    "Draft proposals side by side: not shown. Neither engine exposes the drafted token ids of each step "
    "through its API or metrics (vLLM 0.32 not at all; llama.cpp 11434 only prints draft candidates "
    "at debug log verbosity, which would change the timed run), so no matched-position comparison of "
    "proposals is possible; per-position acceptance above is the closest comparable figure."
)


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
        fewest = max(self.warm_repeats, self.equal_work.warm_repeats or 0)
        if self.timing.max_warm_repeats < fewest:
            raise ValueError(f"timing.max_warm_repeats ({self.timing.max_warm_repeats}) is below the repeats every "
                             f"cell gets (warm_repeats / equal_work.warm_repeats: {fewest}): raise it or lower those")
        return self

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




# ---------------------------------------------------------------------------------------------
# building requests and configs
# ---------------------------------------------------------------------------------------------


def lane_config(side: SideSpec, lane: LaneSpec) -> EngineConfig:
    """The side's engine config with the lane's speculation."""
    return side.engine.model_copy(update={"speculative_config": lane.speculative_config})


def build_request(params: CrossEngineParams, prompt: ChatRequest, *, repeat: int | None = None) -> ChatRequest:
    """One request of a prompt (a template from selected_prompts): greedy, no seed, params' max_tokens and
    matched_work; the repeat number tags its id."""
    pid = prompt.prompt_id if repeat is None else f"{prompt.prompt_id}#{repeat}"
    return prompt.model_copy(update={"prompt_id": pid, "max_tokens": params.max_tokens, "temperature": 0.0,
                                     "seed": None, "ignore_eos": params.matched_work})


def check_all_pins(params: CrossEngineParams) -> dict[str, Any]:
    """Pins of both sides against the installed engines, before any server starts (PinMismatchError)."""
    from specbook.engines import get_engine
    from specbook.experiments.cross_engine.pins import check_pins

    out: dict[str, Any] = {}
    for which in SIDES:
        side = params.side(which)
        found = get_engine(side.engine.engine).probe_versions()
        checks = check_pins(side.pins, found, what=f"{which} {side.label} ({side.engine.engine}; params {which}.pins)")
        out[which] = {"declared": side.pins, "found": found, "checks": [c.model_dump() for c in checks]}
    return out


def load_tokenizer(params: CrossEngineParams) -> Any:
    """The target's own tokenizer (the model folder both engines' weights come from)."""
    from transformers import AutoTokenizer

    from specbook.engines import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(params.oracle.engine.model))


def token_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text or "", add_special_tokens=False))


# ---------------------------------------------------------------------------------------------
# collect / load
# ---------------------------------------------------------------------------------------------


@dataclass
class CrossData:
    """Everything a cross-engine run measured (raw); analysis functions derive the rest."""

    requests: pd.DataFrame  # one row per request: side, lane, prompt_id, phase, repeat, record fields, token_ids
    cells: pd.DataFrame  # one row per side x lane x prompt: counter deltas, raw engine figures
    servers: pd.DataFrame  # one row per server: side, lane, ready_s, versions
    pins: dict[str, Any] = field(default_factory=dict)
    cold: list[dict[str, Any]] = field(default_factory=list)
    weights: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)  # the workload draw's selection record; {} without one
    # optional passes (params traces / cost_split / equal_work); empty in runs without them
    trace_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_requests: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_passes: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_reference: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost_split: pd.DataFrame = field(default_factory=pd.DataFrame)
    equal_work: pd.DataFrame = field(default_factory=pd.DataFrame)
    # server name -> start-up facts (servers.jsonl, updated from its log: specbook.report.tables.server_startup)
    startup: dict[str, dict[str, Any]] = field(default_factory=dict)


def _weights_proof(params: CrossEngineParams) -> dict[str, Any]:
    """For every side whose engine serves the weights converted to its own format (DerivesWeights, llama.cpp's
    GGUF): the proof of identical weights (target and draft)."""
    from specbook.engines import capability
    from specbook.engines.base import DerivesWeights

    proofs: dict[str, Any] = {}
    models = {params.ours.engine.model, params.oracle.engine.model}
    for lane in params.lanes:
        draft = (lane.speculative_config or {}).get("model")
        if isinstance(draft, str):
            models.add(draft)
    deriving = [a for e in sorted({params.ours.engine.engine, params.oracle.engine.engine})
                if (a := capability(e, DerivesWeights)) is not None]
    for name in sorted(models):
        for adapter in deriving:
            proofs[name] = adapter.weights_proof(name)
    return proofs


def collect(params: CrossEngineParams, ctx: Any) -> CrossData:
    """Check pins (abort before measuring), derive weights, then serve each lane on each side in turn.

    A resumed run (specbook.store.units) skips the side x lane x kind servers the folder holds as done."""
    from specbook.core import progress

    pins = check_all_pins(params)
    ctx.save_json(PINS_JSON, pins)
    weights = _weights_proof(params)
    ctx.save_json(WEIGHTS_JSON, weights)
    tokenizer = load_tokenizer(params)
    drawn = params.draw() if params.draws_workload() else None
    if drawn is not None:
        ctx.save_json(WORKLOAD_JSON, drawn.selection)
    prompts = params.selected_prompts(drawn)

    done = done_units(ctx, UNITS)
    saved_cold = ctx.load_json(COLD_JSON) if done and (Path(ctx.data_dir) / f"{COLD_JSON}.json").exists() else []
    cold: list[dict[str, Any]] = [c for c in saved_cold if (c["side"], c["lane"], "timed") in done]
    units = progress.Units("cross-engine server", _planned_servers(params))  # console only (specbook.core.progress)
    for lane in params.lanes:
        for which in ("oracle", "ours"):
            if (which, lane.name, "timed") in done:
                units.skip(f"{which} / lane {lane.name}")
            else:
                _timed_unit(params, ctx, which, lane, prompts, tokenizer, cold, units)
            _extra_passes(params, ctx, which, lane, prompts, done, units)
    if params.equal_work.enabled:
        _equal_work(params, ctx, prompts, tokenizer, done, units)
    return load(ctx)


def _timed_unit(params: CrossEngineParams, ctx: Any, which: str, lane: LaneSpec, prompts: list[ChatRequest],
                tokenizer: Any, cold: list[dict[str, Any]], units: Any) -> None:
    """One side x lane's timed server: per prompt a cold request, then the warm repeats (measure_cell)."""
    from specbook.measure import harness

    side = params.side(which)
    cfg = lane_config(side, lane)
    label = f"{side.label}-{lane.name}"
    units.start(f"{label} ({which}, {len(prompts)} prompts)")
    request_frames, cell_rows = [], []
    extra = {"experiment": "cross_engine", "side": which, "lane": lane.name}
    with harness.serve(cfg, ctx, label, extra=extra) as server:
        for prompt in prompts:
            cold_resp = server.post_raw(build_request(params, prompt))
            cold.append({"side": which, "lane": lane.name, "prompt_id": prompt.prompt_id, "response": cold_resp})
            windows = measure_cell(server, lambda i, p=prompt: build_request(params, p, repeat=i), params.warm_repeats,
                                   params.timing)
            request_frames.append(_windows_frame(windows, which, cfg.engine, lane.name, prompt.prompt_id, tokenizer))
            cell_rows.append(_cell_row(which, cfg.engine, lane.name, prompt.prompt_id, windows, cold_resp))
    # Saved after every server: a later failure keeps what the earlier ones measured.
    ctx.append_frame(REQUESTS_FRAME, pd.concat(request_frames, ignore_index=True).assign(kind="timed"))
    ctx.append_frame(CELLS_FRAME, pd.DataFrame(cell_rows).assign(kind="timed"))
    ctx.save_json(COLD_JSON, cold)
    _server_done(ctx, server, label, which, side, lane, "timed")


def measure_cell(server: Any, build: Any, repeats: int, spec: TimingSpec) -> list[Any]:
    """One cell side's timed repeats (`build(i)` is repeat i's request): `repeats` in one window, then, where
    their decode wall is short of `spec.min_timed_wall_s`, one more window with as many as it still needs
    (within `spec.max_warm_repeats`): the windows, in order."""
    windows = [server.measure([build(i) for i in range(repeats)], concurrency=1)]
    walls = [r.wall_s - r.ttft_s if r.error is None and r.ttft_s is not None else math.nan for r in windows[0].records]
    more = timing.repeats_to_add(walls, min_wall_s=spec.min_timed_wall_s, max_repeats=spec.max_warm_repeats)
    if more:
        windows.append(server.measure([build(repeats + i) for i in range(more)], concurrency=1))
    return windows


def _server_done(ctx: Any, server: Any, label: str, which: str, side: SideSpec, lane: LaneSpec, kind: str) -> None:
    """The unit's servers row, appended last: the unit is done."""
    ctx.append_frame(SERVERS_FRAME, pd.DataFrame([{
        "server": label, "side": which, "label": side.label, "engine": side.engine.engine, "lane": lane.name,
        "ready_s": server.ready_s if server is not None else math.nan,
        "versions": str(server.versions) if server is not None else "", "kind": kind}]))


def _traced(lane: LaneSpec) -> bool:
    return bool(lane.speculative_config)


def _profiled(params: CrossEngineParams, lane: LaneSpec) -> bool:
    return params.cost_split.enabled and (params.cost_split.lanes is None or lane.name in params.cost_split.lanes)


def _planned_servers(params: CrossEngineParams) -> int:
    per_side = len(params.lanes) + sum(params.traces.enabled and _traced(lane) for lane in params.lanes) \
        + sum(_profiled(params, lane) for lane in params.lanes)
    return 2 * per_side  # equal-work servers are counted once known


def _extra_passes(params: CrossEngineParams, ctx: Any, which: str, lane: LaneSpec, prompts: list[ChatRequest],
                  done: set, units: Any) -> None:
    """The side x lane's untimed trace pass and its profiled pass, each its own server and unit, after its
    timed server (tracing and profiling slow a server down: never in a timed one)."""
    from specbook.measure import costsplit, harness
    from specbook.measure.tracepass import trace_pass, traced_config

    side = params.side(which)
    cfg = lane_config(side, lane)
    if params.traces.enabled and _traced(lane):
        label = f"{side.label}-{lane.name}-trace"
        if (which, lane.name, "trace") in done:
            units.skip(label)
        else:
            units.start(f"{label} ({which}, untimed trace pass, {len(prompts)} prompts)")
            folder = Path(ctx.run_dir) / "traces" / label
            set_aside_folder(folder)  # an unfinished earlier attempt's records: kept beside, never read
            requests = [build_request(params, p) for p in prompts]
            extra = {"experiment": "cross_engine", "side": which, "lane": lane.name, "pass": "trace"}
            with harness.serve(traced_config(cfg, folder), ctx, label, extra=extra) as server:
                ts = trace_pass(server, requests, folder)
            frames = cet.trace_frames(ts, which, lane.name)
            spec = lane.speculative_config or {}
            if params.traces.replay and ts.method == "draft_model" and ts.untraceable is None:
                ref = cet.replay_for(ts, str(spec["model"]), int(spec.get("num_speculative_tokens") or 1))
                frames[cet.TRACE_REFERENCE] = cet.reference_frame(ref, which, lane.name)
            for name, frame in frames.items():
                ctx.append_frame(name, frame)
            _server_done(ctx, server, label, which, side, lane, "trace")
    if _profiled(params, lane):
        label = f"{side.label}-{lane.name}-prof"
        if (which, lane.name, "profile") in done:
            units.skip(label)
        else:
            units.start(f"{label} ({which}, profiled pass)")
            requests = [build_request(params, p) for p in prompts[: params.cost_split.num_prompts]]
            split = costsplit.profiled_pass(cfg, requests, ctx, name=label, lane=lane.name, engine_label=side.label)
            frame = costsplit.splits_frame([split])
            frame.insert(0, "side", which)
            frame.insert(2, "kind", "profile")
            ctx.append_frame(COST_SPLIT_FRAME, frame)
            _server_done(ctx, None, label, which, side, lane, "profile")


@dataclass(frozen=True)
class EqualWorkCell:
    """A cell to re-run with equal work: its prompt and both sides' first-repeat outputs (target token ids)."""

    prompt: str
    ours: list[int]
    oracle: list[int]

    @property
    def tokens(self) -> int:
        from specbook.traces.equalwork import common_prefix_len

        return common_prefix_len(self.ours, self.oracle)


def equal_work_plan(data: CrossData, params: CrossEngineParams) -> dict[str, list[EqualWorkCell]]:
    """Per lane: every cell to re-run with equal work: diverged or length-mismatched, not degenerate (loops
    stay out) nor off its task, no failed request, a common prefix of at least timing.min_common_tokens (ours'
    and the oracle's first repeat, in the target tokenizer's ids): a shorter one could not be timed."""
    from specbook.experiments.cross_engine.guards import DEGENERATE, DIVERGED, LEFT_TASK, LENGTH_MISMATCH

    over = request_failures.left_out(request_failure_table(data, params.measurement.max_failed_requests),
                                     ["lane", "prompt"])
    req = data.requests
    plan: dict[str, list[EqualWorkCell]] = {}
    for (lane, prompt), verdict in cell_guards(data, params.guards, prompt_texts(params)).items():
        if any(f.startswith((DEGENERATE, LEFT_TASK)) for f in verdict.flags) or (lane, prompt) in over:
            continue
        if not {DIVERGED, LENGTH_MISMATCH} & set(verdict.flags):
            continue
        outs = []
        for which in SIDES:
            rows = req[(req["lane"] == lane) & (req["prompt"] == prompt) & (req["side"] == which)]
            rows = rows[rows["error"].isna()] if "error" in rows else rows
            outs.append(_tokens(rows)[0] if len(rows) else [])
        cell = EqualWorkCell(prompt, outs[0], outs[1])
        if cell.tokens >= max(2, params.timing.min_common_tokens):
            plan.setdefault(lane, []).append(cell)
    return plan


def _equal_work(params: CrossEngineParams, ctx: Any, sent: list[ChatRequest], tokenizer: Any, done: set,
                units: Any) -> None:
    """Re-run each planned cell on both sides with max_tokens = its common prefix (ignore_eos): equal work."""
    from specbook.measure import harness
    from specbook.traces.equalwork import equal_work_request

    plan = equal_work_plan(load(ctx), params)
    prompts = {p.prompt_id: p for p in sent}
    repeats = params.equal_work.warm_repeats or params.warm_repeats
    units.total += 2 * len(plan)  # known only now
    for lane in params.lanes:
        if lane.name not in plan:
            continue
        for which in ("oracle", "ours"):
            side = params.side(which)
            label = f"{side.label}-{lane.name}-equal"
            if (which, lane.name, "equal_work") in done:
                units.skip(label)
                continue
            units.start(f"{label} ({which}, {len(plan[lane.name])} cells re-run on their common prefix)")
            cfg = lane_config(side, lane)
            frames = []
            extra = {"experiment": "cross_engine", "side": which, "lane": lane.name, "pass": "equal_work"}
            with harness.serve(cfg, ctx, label, extra=extra) as server:
                for cell in plan[lane.name]:
                    prompt = prompts[cell.prompt]
                    def equal(repeat: int | None, cell: EqualWorkCell = cell, prompt: ChatRequest = prompt) -> Any:
                        return equal_work_request(build_request(params, prompt, repeat=repeat), cell.ours, cell.oracle)
                    server.post_raw(equal(None))  # cold, not timed
                    windows = measure_cell(server, equal, repeats, params.timing)
                    frame = _windows_frame(windows, which, cfg.engine, lane.name, cell.prompt, tokenizer)
                    frame["max_tokens"] = cell.tokens
                    frames.append(frame)
            ctx.append_frame(EQUAL_WORK_FRAME, pd.concat(frames, ignore_index=True).assign(kind="equal_work"))
            _server_done(ctx, server, label, which, side, lane, "equal_work")


def _windows_frame(windows: list[Any], side: str, engine: str, lane: str, prompt: str, tokenizer: Any) -> pd.DataFrame:
    """A cell side's measured windows' requests as cell rows: where they ran, the repeat (numbered on across
    the windows), and the output's token ids."""
    records = [r for w in windows for r in w.records]
    frame = pd.concat([w.requests_frame() for w in windows], ignore_index=True)
    frame.insert(0, "side", side)
    frame.insert(1, "engine", engine)
    frame.insert(2, "lane", lane)
    frame.insert(3, "prompt", prompt)
    frame.insert(4, "repeat", range(len(records)))
    frame["token_ids"] = [token_ids(tokenizer, r.output_text) for r in records]
    return frame


def _cell_row(side: str, engine: str, lane: str, prompt: str, windows: list[Any], cold_resp: dict) -> dict:
    """The cell's counter counts over its windows (acceptance model), the cold response's timings and the
    engine log's own figures."""
    row: dict[str, Any] = {"side": side, "engine": engine, "lane": lane, "prompt": prompt,
                           **Acceptance.total([w.acceptance for w in windows]).counts()}
    from specbook.engines import capability, response_draft_counts
    from specbook.engines.base import SummarisesRequestLogs

    row["cold_timings_draft_n"], row["cold_timings_draft_n_accepted"] = response_draft_counts(engine, cold_resp)
    per_request = capability(engine, SummarisesRequestLogs)
    if per_request is not None:  # its log prints per-request draft statistics, kept as raw figures
        row.update(per_request.request_log_figures(pd.concat([w.log_intervals() for w in windows], ignore_index=True)))
    return row


# Cell columns as commit 5ece790 and earlier saved them.
_OLD_CELL_COLUMNS = {"accepted": ACCEPTED, "log_accepted": "log_accepted_tokens", "log_generated": "log_draft_tokens"}


def load(ctx: Any) -> CrossData:
    """Read back what collect saved (reuse_data / `specbook render`); frames of older runs are upgraded."""
    def maybe_json(name: str, default: Any) -> Any:
        return ctx.load_json(name) if (Path(ctx.data_dir) / f"{name}.json").exists() else default

    def maybe_frame(name: str) -> pd.DataFrame:
        return ctx.load_frame(name) if ctx.has_frame(name) else pd.DataFrame()

    def timed(frame: pd.DataFrame) -> pd.DataFrame:  # runs saved before unit kinds: every row is timed
        return frame if "kind" in frame else frame.assign(kind="timed")

    from specbook.report.tables import server_startup

    cells = upgrade_position_columns(ctx.load_frame(CELLS_FRAME)).rename(columns=_OLD_CELL_COLUMNS)
    servers = timed(ctx.load_frame(SERVERS_FRAME))
    # only the timed servers' logs are read again (setup_table); trace and profiled passes' logs are large
    timed_names = set(servers.loc[servers["kind"] == "timed", "server"]) if "server" in servers else set()
    return CrossData(
        requests=timed(ctx.load_frame(REQUESTS_FRAME)),
        cells=timed(cells),
        servers=servers,
        pins=maybe_json(PINS_JSON, {}),
        cold=maybe_json(COLD_JSON, []),
        weights=maybe_json(WEIGHTS_JSON, {}),
        workload=maybe_json(WORKLOAD_JSON, {}),
        trace_steps=maybe_frame(cet.TRACE_STEPS),
        trace_requests=maybe_frame(cet.TRACE_REQUESTS),
        trace_passes=maybe_frame(cet.TRACE_PASSES),
        trace_reference=maybe_frame(cet.TRACE_REFERENCE),
        cost_split=maybe_frame(COST_SPLIT_FRAME),
        equal_work=maybe_frame(EQUAL_WORK_FRAME),
        startup={r.name: server_startup(r, ctx.run_dir) for r in ctx.servers() if r.name in timed_names},
    )


# ---------------------------------------------------------------------------------------------
# analysis (pure functions of the saved frames)
# ---------------------------------------------------------------------------------------------


def with_rates(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests plus warm tok/s = completion_tokens / whole-request wall time."""
    df = requests.copy()
    df["tok_s"] = df["completion_tokens"] / df["wall_s"]
    return df


def ratio_of_means_ci(
    ours: np.ndarray, oracle: np.ndarray, *, ci: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """mean(ours) / mean(oracle) with Fieller's interval (Welch df) over each side's repeats
    (stats.ratio_of_means_interval; n_boot and seed are no longer used: a bootstrap of 2-3 repeats
    covers far less than its level).

    Repeats on one server share its state: the CI covers request-to-request noise, not server-to-server.
    """
    ours, oracle = np.asarray(ours, float), np.asarray(oracle, float)
    if ours.size == 0 or oracle.size == 0:
        return math.nan, math.nan, math.nan
    return stats.ratio_of_means_interval(ours, oracle, ci, nonnegative=True)


def _tokens(df: pd.DataFrame) -> list[list[int]]:
    return [list(map(int, t)) for t in df.sort_values("repeat")["token_ids"]]


def user_text(request: ChatRequest) -> str:
    """What a request asks, in the user's words (a chat's last user message, or the plain prompt)."""
    if request.messages is None:
        return request.prompt or ""
    users = [m.get("content") for m in request.messages if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def prompt_texts(params: CrossEngineParams) -> dict[str, str]:
    """prompt id -> its user text, for the left-task guard: the fixed prompts, and the workload's draw where
    its file can be read here (a drawn prompt whose text is not known is not judged by that guard)."""
    from specbook.core.errors import SpecbookError

    try:
        templates = params.selected_prompts()
    except (SpecbookError, OSError):
        templates = [p.request() for p in params.prompts]
    return {r.prompt_id: user_text(r) for r in templates}


def cell_guards(data: CrossData, thresholds: GuardThresholds | None = None,
                texts: dict[str, str] | None = None) -> dict[tuple[str, str], GuardVerdict]:
    """Guards for every lane x prompt cell; `texts` (prompt id -> its user text) lets the left-task guard judge
    the outputs of those prompts."""
    req = data.requests
    labels = _labels(data)
    out: dict[tuple[str, str], GuardVerdict] = {}
    lanes = list(dict.fromkeys(req["lane"]))
    for lane in lanes:
        for prompt in dict.fromkeys(req.loc[req["lane"] == lane, "prompt"]):
            sides = {}
            prompt_tokens: list[int | None] = []
            for which in SIDES:
                rows = req[(req["lane"] == lane) & (req["prompt"] == prompt) & (req["side"] == which)]
                ok = rows[rows["error"].isna()] if "error" in rows else rows
                off_rows = req[(req["lane"] == OFF_LANE) & (req["prompt"] == prompt) & (req["side"] == which)]
                spec_off = _tokens(off_rows)[0] if lane != OFF_LANE and len(off_rows) else None
                counted = ok["completion_tokens"].dropna() if "completion_tokens" in ok else pd.Series(dtype=float)
                text = ok.sort_values("repeat")["output_text"].iloc[0] if len(ok) and "output_text" in ok else None
                sides[which] = SideOutputs(labels[which], _tokens(ok), spec_off=spec_off,
                                           completion_tokens=int(counted.iloc[0]) if len(counted) else None,
                                           text=text)
                pt = ok["prompt_tokens"].dropna()
                prompt_tokens.append(int(pt.iloc[0]) if len(pt) else None)
            out[(lane, prompt)] = guard_cell(
                sides["ours"], sides["oracle"], thresholds, prompt_tokens=(prompt_tokens[0], prompt_tokens[1]),
                prompt_text=(texts or {}).get(prompt),
            )
    return out


def _labels(data: CrossData) -> dict[str, str]:
    labels = {"ours": "ours", "oracle": "oracle"}
    if not data.servers.empty:
        for which in SIDES:
            found = data.servers.loc[data.servers["side"] == which, "label"]
            if len(found):
                labels[which] = str(found.iloc[0])
    return labels


def request_failure_table(data: CrossData, max_failed: int) -> pd.DataFrame:
    """Per lane x prompt cell (both sides' warm repeats): requests, failed, and whether it stays comparable."""
    return request_failures.failure_table(data.requests, ["lane", "prompt"], max_failed)


FAILED_FLAG = "failed requests"


def cell_table(
    data: CrossData, thresholds: GuardThresholds | None = None, *, ci: float = 0.95, n_boot: int = 2000,
    max_failed_requests: int = 0, texts: dict[str, str] | None = None,
) -> pd.DataFrame:
    """lane / prompt / ours / oracle / ratio [CI] / flags, plus lengths, divergence, TTFT, ITL (per streamed
    chunk and per token), AL.

    A cell with more failed requests than `max_failed_requests` is not comparable, whatever its guards say;
    `texts` (prompt id -> user text) lets the left-task guard judge those prompts' outputs."""
    req = request_failures.answered(with_rates(data.requests))
    guards = cell_guards(data, thresholds, texts)
    over = request_failures.left_out(request_failure_table(data, max_failed_requests), ["lane", "prompt"])
    acc = acceptance_table(data) if not data.cells.empty else pd.DataFrame()
    al = acc.set_index(["lane", "prompt", "side"])["al"] if not acc.empty else None
    rows = []
    for (lane, prompt), verdict in guards.items():
        cell = req[(req["lane"] == lane) & (req["prompt"] == prompt)]
        ours, oracle = (cell[cell["side"] == s] for s in SIDES)
        ratio, lo, hi = ratio_of_means_ci(ours["tok_s"].to_numpy(), oracle["tok_s"].to_numpy(), ci=ci, n_boot=n_boot)
        row = {
            "lane": lane, "prompt": prompt,
            "ours_tok_s": float(ours["tok_s"].mean()), "oracle_tok_s": float(oracle["tok_s"].mean()),
            "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
            "comparable": verdict.comparable and (lane, prompt) not in over,
            "flags": ", ".join([*verdict.flags, *([FAILED_FLAG] if (lane, prompt) in over else [])]),
            "ours_tokens": verdict.ours_tokens, "oracle_tokens": verdict.oracle_tokens,
            "first_divergence": verdict.first_divergence,
            "ours_distinct": verdict.ours_distinct_ratio, "oracle_distinct": verdict.oracle_distinct_ratio,
            "ours_ttft_ms": 1000 * float(ours["ttft_s"].mean()), "oracle_ttft_ms": 1000 * float(oracle["ttft_s"].mean()),
            "ours_itl_ms": 1000 * float(ours["itl_mean_s"].mean()),
            "oracle_itl_ms": 1000 * float(oracle["itl_mean_s"].mean()),
            "ours_itl_token_ms": timing.side_figures(ours)["itl_token_ms"],
            "oracle_itl_token_ms": timing.side_figures(oracle)["itl_token_ms"],
            "reasons": [*verdict.reasons, *([over[(lane, prompt)]] if (lane, prompt) in over else [])],
        }
        if al is not None:
            for which in SIDES:
                row[f"{which}_al"] = al.get((lane, prompt, which), math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def headline(cells: pd.DataFrame, *, ci: float = 0.95, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per lane: the geometric mean of the comparable cells' ratios (flagged cells left out), with a CI.

    The CI is the t interval of the mean log ratio over comparable cells (prompts; df = cells - 1) when
    there are at least two; with one it is that cell's own CI; with none the lane has no headline ratio.
    """
    rows = []
    for lane, group in cells.groupby("lane", sort=False):
        ok = group[group["comparable"]]
        logs = np.log(ok["ratio"].to_numpy(float))
        row = {"lane": lane, "cells": len(group), "comparable": len(ok),
               "left_out": ", ".join(group.loc[~group["comparable"], "prompt"])}
        if len(ok) == 0:
            row.update(ratio=math.nan, ratio_lo=math.nan, ratio_hi=math.nan)
        elif len(ok) == 1:
            row.update(ratio=float(ok["ratio"].iloc[0]), ratio_lo=float(ok["ratio_lo"].iloc[0]),
                       ratio_hi=float(ok["ratio_hi"].iloc[0]))
        else:
            mean, lo, hi = stats.mean_t_interval(logs, ci)
            row.update(ratio=float(np.exp(mean)), ratio_lo=float(np.exp(lo)), ratio_hi=float(np.exp(hi)))
        rows.append(row)
    return pd.DataFrame(rows)


def equal_work_cells(data: CrossData, thresholds: GuardThresholds | None = None, *, ci: float = 0.95,
                     max_failed_requests: int = 0) -> pd.DataFrame:
    """The equal-work re-runs (max_tokens = the common prefix, both sides) as cells, guarded like the strict
    ones (each lane on its own: a re-run has no spec-off output of the same length to compare with)."""
    ew = data.equal_work
    if ew.empty:
        return pd.DataFrame(columns=[*REPORT_COLUMNS, "max_tokens"])
    parts = []
    for lane in dict.fromkeys(ew["lane"]):
        rows = ew[ew["lane"] == lane]
        lane_data = CrossData(requests=rows, cells=pd.DataFrame(), servers=data.servers)
        cells = cell_table(lane_data, thresholds, ci=ci, max_failed_requests=max_failed_requests)
        cells["max_tokens"] = cells["prompt"].map(rows.groupby("prompt")["max_tokens"].first())
        parts.append(cells)
    return pd.concat(parts, ignore_index=True)


def equal_work_headline(strict: pd.DataFrame, equal: pd.DataFrame, *, ci: float = 0.95) -> pd.DataFrame:
    """Per lane, the second headline: the geometric-mean ratio over the strict comparable cells plus every
    diverged / length-mismatched cell whose equal-work re-run is comparable (its ratio replaces the strict
    one). Loops are never re-run, so they stay out of both."""
    eq = equal[equal["comparable"]].set_index(["lane", "prompt"]) if len(equal) else pd.DataFrame()
    rows = []
    for r in strict.itertuples(index=False):
        key = (r.lane, r.prompt)
        if not r.comparable and len(eq) and key in eq.index:
            e = eq.loc[key]
            rows.append({"lane": r.lane, "prompt": r.prompt, "ratio": float(e["ratio"]), "ratio_lo": float(e["ratio_lo"]),
                         "ratio_hi": float(e["ratio_hi"]), "comparable": True, "equal_work": True})
        else:
            rows.append({"lane": r.lane, "prompt": r.prompt, "ratio": r.ratio, "ratio_lo": r.ratio_lo,
                         "ratio_hi": r.ratio_hi, "comparable": bool(r.comparable), "equal_work": False})
    combined = pd.DataFrame(rows, columns=["lane", "prompt", "ratio", "ratio_lo", "ratio_hi", "comparable", "equal_work"])
    head = headline(combined, ci=ci)
    if len(head):
        head.insert(3, "re_run", head["lane"].map(combined.groupby("lane")["equal_work"].sum()).astype(int))
    return head


def usable_cells(strict: pd.DataFrame, equal: pd.DataFrame) -> pd.DataFrame:
    """Per lane: cells, usable under the strict guards, usable with equal work, and why the others are not."""
    ok_equal = set(map(tuple, equal.loc[equal["comparable"], ["lane", "prompt"]].to_numpy())) if len(equal) else set()
    rows = []
    for lane, g in strict.groupby("lane", sort=False):
        rescued = [p for p in g.loc[~g["comparable"], "prompt"] if (lane, p) in ok_equal]
        why = [f"{r.prompt}: {r.flags}" for r in g.itertuples(index=False)
               if not r.comparable and r.prompt not in rescued]
        rows.append({"lane": lane, "cells": len(g), "strict_usable": int(g["comparable"].sum()),
                     "equal_work_usable": int(g["comparable"].sum()) + len(rescued),
                     "re_run_usable": ", ".join(rescued), "not_usable": "; ".join(why)})
    return pd.DataFrame(rows, columns=["lane", "cells", "strict_usable", "equal_work_usable", "re_run_usable",
                                       "not_usable"])


def timed_step_ms(data: CrossData, params: CrossEngineParams, labels: dict[str, str]) -> dict[tuple[str, str], float]:
    """(side label, lane) -> ms per decode step of the timed requests of the prompts the profiled pass sent (the
    first cost_split.num_prompts): decode wall over decode tokens less accepted drafts (costsplit.step_ms_of)."""
    req = request_failures.answered(data.requests)
    if req.empty or data.cells.empty:
        return {}
    prompts = list(dict.fromkeys(req["prompt"]))[: params.cost_split.num_prompts]
    out = {}
    for (side, lane), g in req[req["prompt"].isin(prompts)].groupby(["side", "lane"], sort=False):
        counts = data.cells[(data.cells["side"] == side) & (data.cells["lane"] == lane) & data.cells["prompt"].isin(prompts)]
        accepted = float(counts[ACCEPTED].fillna(0).sum()) if ACCEPTED in counts else 0.0
        out[(labels.get(side, side), lane)] = costsplit.step_ms_of(
            float((g["wall_s"] - g["ttft_s"]).sum()), float((g["completion_tokens"] - 1).clip(lower=0).sum()), accepted)
    return out


def cost_split_table(data: CrossData) -> pd.DataFrame:
    """The profiled passes' splits (costsplit.splits_frame rows with their side), the `source` column saying
    where each figure comes from."""
    frame = data.cost_split
    return frame.drop(columns=["kind"]) if "kind" in frame else frame


def flagged_reasons(cells: pd.DataFrame) -> str:
    """One block per flagged cell: why it is not comparable (printed under the table)."""
    lines = []
    for _, row in cells[~cells["comparable"]].iterrows():
        lines.append(f"{row['lane']} / {row['prompt']}: NOT COMPARABLE")
        lines += [f"    - {r}" for r in row["reasons"]]
    return "\n".join(lines) if lines else "every cell passed every guard"


def acceptance_table(data: CrossData) -> pd.DataFrame:
    """Per side x lane x prompt: AL and acceptance rate from the acceptance model, the raw counts beside."""
    rows = []
    for _, c in data.cells.iterrows():
        acc = Acceptance.from_row(c, source="counter delta")
        if not acc.has_drafts:
            continue  # no speculation in this cell
        row = {"lane": c["lane"], "prompt": c["prompt"], "side": c["side"], "engine": c["engine"],
               **acc.figures()}
        row = {k: v for k, v in row.items() if not k.startswith("accepted_pos_")}
        if pd.notna(c.get("log_requests")):  # an engine whose log printed per-request draft statistics
            cold = Acceptance.from_llamacpp_timings([{"draft_n": c.get("cold_timings_draft_n"),
                                                      "draft_n_accepted": c.get("cold_timings_draft_n_accepted")}])
            row["cold_timings_acceptance_rate"] = cold.acceptance_rate
            row["log_mean_len"] = c.get("log_mean_len")
        rows.append(row)
    return pd.DataFrame(rows)


def per_position(data: CrossData) -> pd.DataFrame:
    """Side x lane x position (1-based): accepted at that position / drafts, summed over the prompts."""
    items = []
    for (side, lane), g in data.cells.groupby(["side", "lane"], sort=False):
        acc = frame_acceptance(g)
        if acc.drafts:
            items.append(({"side": side, "lane": lane}, acc))
    return per_position_frame(items)


def per_position_table(positions: pd.DataFrame) -> pd.DataFrame:
    """position x (lane, side): the rate (the report's table and bar plot)."""
    if positions.empty:
        return pd.DataFrame()
    return positions.pivot_table(index="position", columns=["lane", "side"], values="rate")


def prompts_note(data: CrossData, params: CrossEngineParams) -> str:
    """Which prompts the cells ran: how many fixed, how many the workload drew (from where, with which seed),
    and that every prompt went as one turn."""
    sent = list(dict.fromkeys(data.requests["prompt"])) if "prompt" in data.requests else []
    fixed = {p.id for p in params.prompts}
    n_fixed = sum(p in fixed for p in sent)
    text = f"{len(sent)} prompts: {n_fixed} from the params' `prompts` list"
    sel = data.workload
    if sel:
        how = [f"{k} {sel[k]}" for k in ("seed", "per_category", "subset", "n", "max_chars") if sel.get(k) is not None]
        source = sel.get("source") or sel.get("test_source")  # gsm8k names its test split's source
        text += (f", {len(sent) - n_fixed} drawn by the `{sel.get('workload')}` workload ({shown_source(source)}; "
                 f"{', '.join(how)})")
    mt_bench = " (MT-Bench questions: their first turn)" if sel.get("workload") == "spec_bench" else ""
    return text + (f". Every prompt is sent as one turn{mt_bench}, the same on both engines: a second turn would "
                   "carry each engine's own first answer.")


def shown_source(source: Any) -> str:
    """A workload's source as a report names it: a file by its name (no machine path), a hub id as it is."""
    text = str(source or "")
    if text.startswith(("/", "./", "../", "~")) or "\\" in text:
        return Path(text).name
    return text


def definition_note() -> str:
    return (
        f"Acceptance, one definition for every engine: {DEFINITION}. vLLM: from vllm:spec_decode_* counters; "
        "llama.cpp: from llamacpp:spec_decode_* counters (drafts = verification steps). Raw figures beside: "
        "the counts, llama.cpp's log 'mean len' (same definition) and the cold response's timings "
        "draft_n_accepted / draft_n (an acceptance rate, not AL)."
    )


REPORT_COLUMNS = ["lane", "prompt", "ours_tok_s", "oracle_tok_s", "ratio", "ratio_lo", "ratio_hi", "comparable", "flags"]
GUARD_COLUMNS = [
    "lane", "prompt", "flags", "ours_tokens", "oracle_tokens", "first_divergence", "ours_distinct", "oracle_distinct",
    "ours_al", "oracle_al", "ours_ttft_ms", "oracle_ttft_ms", "ours_itl_token_ms", "oracle_itl_token_ms",
]


def setup_table(data: CrossData, params: CrossEngineParams) -> pd.DataFrame:
    """Per lane, each set-up aspect of the two timed servers side by side (specbook.experiments.cross_engine.setups: the declared
    config and what each server's log said at start); `differs` marks an asymmetry of the comparison."""
    from specbook.engines import get_engine
    from specbook.experiments.cross_engine.setups import SETUP_COLUMNS, setup_rows

    rows: list[dict[str, Any]] = []
    timed = data.servers[data.servers["kind"] == "timed"] if "kind" in data.servers else data.servers
    named = {"side", "lane", "server"} <= set(timed.columns)
    for lane in params.lanes:
        facts = {}
        for which in ("ours", "oracle"):
            found = timed.loc[(timed["side"] == which) & (timed["lane"] == lane.name), "server"] if named else []
            startup = data.startup.get(str(found.iloc[0]), {}) if len(found) else {}
            cfg = lane_config(params.side(which), lane)
            facts[which] = get_engine(cfg.engine).setup_facts(cfg, startup)
        rows += setup_rows(lane.name, facts["ours"], facts["oracle"])
    return pd.DataFrame(rows, columns=SETUP_COLUMNS)


def pins_table(data: CrossData) -> pd.DataFrame:
    """side / key / expected / found / ok for every declared pin."""
    rows = []
    for which, doc in data.pins.items():
        for c in doc.get("checks", []):
            rows.append({"side": which, **c})
    return pd.DataFrame(rows, columns=["side", "key", "expected", "found", "ok"])


def weights_table(data: CrossData) -> pd.DataFrame:
    """model / identical / tensors / weights digest / GGUF sha256 (llama.cpp sides only)."""
    rows = [
        {"model": name, "identical": p.get("identical"), "tensors": p.get("tensors"),
         "weights_digest": p.get("weights_digest"), "gguf_sha256": p.get("gguf_sha256"), "method": p.get("method")}
        for name, p in data.weights.items()
    ]
    return pd.DataFrame(rows, columns=["model", "identical", "tensors", "weights_digest", "gguf_sha256", "method"])


SHORT_DIGEST = 12  # hex digits a report shows of a sha256 (the whole one is in data/weights.json)


def weights_view(weights: pd.DataFrame) -> pd.DataFrame:
    """The weights table as the report shows it: digests cut to their first hex digits, so it fits the page."""
    out = weights.copy()
    for col in ("weights_digest", "gguf_sha256"):
        out[col] = out[col].map(lambda v: f"{v[:SHORT_DIGEST]}..." if isinstance(v, str) and len(v) > SHORT_DIGEST else v)
    return out


def failures_line(failures: pd.DataFrame) -> str:
    """'none of 432 requests failed (72 cells)' / 'N of M requests failed in K cells, J left out'."""
    if failures.empty:
        return "no request was sent"
    sent, failed = int(failures["n_requests"].sum()), int(failures["n_failed"].sum())
    if not failed:
        return f"none of {sent} requests failed ({len(failures)} cells)"
    hit = failures[failures["n_failed"] > 0]
    out = int((~failures["valid"].astype(bool)).sum()) if "valid" in failures else 0
    return f"{failed} of {sent} requests failed, in {len(hit)} of {len(failures)} cells; {out} cells left out"


def flagged_count(cells: pd.DataFrame) -> int:
    return int((~cells["comparable"].astype(bool)).sum()) if len(cells) else 0


@dataclass
class CrossResult:
    """Everything the cross-engine report shows."""

    pins: pd.DataFrame
    weights: pd.DataFrame
    cells: pd.DataFrame
    flagged_reasons: str
    headline: pd.DataFrame
    acceptance: pd.DataFrame
    per_position: pd.DataFrame
    per_position_table: pd.DataFrame
    definition: str
    proposals_note: str
    # how many prompts were fixed and how many the workload drew (source, seed), sent as one turn each
    prompts_note: str = ""
    # per lane x prompt: requests, failed, the bound (measurement.max_failed_requests), valid, why a cell is left out
    request_failures: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per lane x task category (prompts with a `category`): tok/s ratio with its interval, each side's AL
    categories: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per lane: cells usable under the strict guards / with equal work, and why the others are not
    usable: pd.DataFrame = field(default_factory=pd.DataFrame)
    # equal work (params equal_work): the re-run cells and the second, labelled headline per lane
    equal_work_cells: pd.DataFrame = field(default_factory=pd.DataFrame)
    equal_work_headline: pd.DataFrame = field(default_factory=pd.DataFrame)
    # proposal traces (params traces; a separate untimed pass): derived counts against the counters,
    # the replay reference, matched anchors between the engines, acceptance on the common prefix
    trace_agreement: pd.DataFrame = field(default_factory=pd.DataFrame)
    replay: pd.DataFrame = field(default_factory=pd.DataFrame)
    matched_anchors: pd.DataFrame = field(default_factory=pd.DataFrame)
    matched_summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    prefix_acceptance: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per-step cost split per side x lane (params cost_split; a separate profiled pass)
    cost_split: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per lane x set-up aspect: the two timed servers side by side, asymmetries marked (specbook.experiments.cross_engine.setups)
    setup: pd.DataFrame = field(default_factory=pd.DataFrame)
    # timing on equal decode work (cross_engine_timing): per cell timed or why not, per lane the headline
    decode_cells: pd.DataFrame = field(default_factory=pd.DataFrame)
    decode_headline: pd.DataFrame = field(default_factory=pd.DataFrame)
    headline_texts: pd.DataFrame = field(default_factory=pd.DataFrame)  # timed prompts, first words of both outputs
    speculation_effect: pd.DataFrame = field(default_factory=pd.DataFrame)  # per side x lane: rate vs its off lane
    # per lane: each side's decode tokens per step over its timed prompts, for the why-sentences
    tokens_per_step: dict[str, dict[str, float]] = field(default_factory=dict)
    timing_note: str = ""  # repeats a side, walls, thresholds: what the timed figures rest on, from the data
    repeats_note: str = ""  # timed repeats a side over every cell, from the data
    # matched anchors for reading: the listing as text, where they come from, what explains a low share
    anchor_listing: pd.DataFrame = field(default_factory=pd.DataFrame)
    anchor_note: str = ""
    anchors_by_prompt: pd.DataFrame = field(default_factory=pd.DataFrame)
    identical_share_notes: list[str] = field(default_factory=list)
    cost_split_notes: list[str] = field(default_factory=list)  # parts out of proportion; what a split cannot see
    # per engine x lane x part: as measured in the profiled pass and scaled to the timed requests' step time
    cost_split_scaled: pd.DataFrame = field(default_factory=pd.DataFrame)
    labels: dict[str, str] = field(default_factory=dict)  # side -> its label (ours / oracle)
    model: str = ""  # the target both sides serve
    prompt_tokens: float = math.nan  # median prompt tokens of the timed requests

    @property
    def report_cells(self) -> pd.DataFrame:
        return self.cells[REPORT_COLUMNS]

    @property
    def decode_timed(self) -> pd.DataFrame:
        """The timed cells for reading: where their requests come from, common tokens, the decode-rate ratio with
        its interval, each side's decode rate, decode wall and repeats."""
        return timing.timed_view(self.decode_cells)

    @property
    def decode_not_timed(self) -> pd.DataFrame:
        """The other cells and why each is not timed."""
        cols = ["lane", "prompt", "why_not_timed", "common_tokens", "source"]
        d = self.decode_cells
        return d.loc[~d["timed"].astype(bool), cols].reset_index(drop=True) if len(d) else pd.DataFrame(columns=cols)

    @property
    def itl_table(self) -> pd.DataFrame:
        """Per cell, each side's inter-token latency per token and per streamed chunk, and tokens per chunk."""
        cols = ["lane", "prompt", "ours_itl_token_ms", "oracle_itl_token_ms", "ours_itl_chunk_ms",
                "oracle_itl_chunk_ms", "ours_tokens_per_chunk", "oracle_tokens_per_chunk"]
        return self.decode_cells[cols] if len(self.decode_cells) else pd.DataFrame(columns=cols)

    @property
    def weights_shown(self) -> pd.DataFrame:
        return weights_view(self.weights)

    @property
    def strict_headline(self) -> pd.DataFrame:
        """The whole-request tok/s headline for reading: how many cells each lane left out, not their names."""
        h = self.headline.copy()
        if "left_out" in h:
            h["left_out"] = h["cells"] - h["comparable"]
        return h

    @property
    def flagged_cells(self) -> int:
        return flagged_count(self.cells)

    @property
    def failures_line(self) -> str:
        return failures_line(self.request_failures)

    @property
    def guard_cells(self) -> pd.DataFrame:
        return self.cells[[c for c in GUARD_COLUMNS if c in self.cells]]

    def answer(self, params: CrossEngineParams) -> report_view.Summary:
        """The report's summary block: each lane's headline ratio with its interval, and how many cells stand behind it."""
        return cross_answer(self, params)


def _interval_text(lo: float, hi: float, level: float, cells: int) -> str:
    text = report_view.interval(lo, hi, level, 3)
    if not text:
        return "no interval: one cell with fewer than 2 repeats a side" if cells == 1 else ""
    return f"{text}, {'that cell (Fieller)' if cells == 1 else f't over {cells} cells'}"


def cross_answer(result: CrossResult, params: CrossEngineParams) -> report_view.Summary:
    """Question; per lane the decode-rate ratio on equal decode work (its interval, the end-to-end ratio beside,
    the cells it rests on) and the TTFT ratio as its own row; what speculation does on each engine; each with
    one sentence of why; the evidence."""
    ours, oracle, fmt = params.ours.label, params.oracle.label, report_view.fmt
    labels = {"ours": ours, "oracle": oracle}
    level = params.ci_level
    th = params.timing
    diffs = asymmetries(result.setup) if len(result.setup) else []
    heads, ttfts = [], []
    for h in result.decode_headline.itertuples(index=False):
        n, total = int(h.timed), int(h.cells)
        if n == 0:
            heads.append(report_view.Headline(
                f"lane {h.lane}: decode rate", "NO CELL TIMED", False,
                f"none of {total} cells timed on equal decode work: {h.not_timed}",
                why=f"a cell is timed only with >= {th.min_common_tokens} common tokens and a decode wall of "
                    f">= {th.min_timed_wall_s:g} s a side"))
        else:
            word = timing.verdict_word(h.decode_ratio_lo, h.decode_ratio_hi, "faster", "slower", "undecided")
            heads.append(report_view.Headline(
                f"lane {h.lane}: decode rate", f"{fmt(h.decode_ratio, 3)}x {word}", None,
                f"{fmt(h.ours_decode_tok_s, 3)} vs {fmt(h.oracle_decode_tok_s, 3)} tok/s after the first token "
                f"(end-to-end {fmt(h.e2e_ratio, 3)}x); {n} of {total} cells timed"
                + (f" ({h.not_timed} left out)" if h.not_timed else ""),
                _interval_text(h.decode_ratio_lo, h.decode_ratio_hi, level, n),
                why=timing.lane_why(h, result.tokens_per_step.get(h.lane, {}), labels, h.lane)))
        if int(h.ttft_cells):
            word = timing.verdict_word(h.ttft_ratio_lo, h.ttft_ratio_hi, "longer", "shorter", "undecided")
            ttfts.append(report_view.Headline(
                f"lane {h.lane}: TTFT", f"{fmt(h.ttft_ratio, 3)}x {word}", None,
                f"{fmt(h.ours_ttft_ms, 3)} vs {fmt(h.oracle_ttft_ms, 3)} ms to the first token, {int(h.ttft_cells)} cells",
                _interval_text(h.ttft_ratio_lo, h.ttft_ratio_hi, level, int(h.ttft_cells)),
                why=timing.ttft_why(h, labels, diffs, result.prompt_tokens)))
    eff = result.speculation_effect
    spec = []
    if len(eff):
        spec.append(report_view.Headline(
            "speculation against off, each engine", timing.speculation_verdict(eff), None,
            timing.speculation_figure(eff, labels), f"{level:.0%} CI per engine x lane below",
            why=timing.speculation_why(eff, labels, result.model)))
    cells = result.decode_cells
    pins_ok = bool(result.pins["ok"].all()) if len(result.pins) else True
    evidence = []
    if len(cells):
        per_lane = ", ".join(f"{h.lane} {int(h.timed)}" for h in result.decode_headline.itertuples(index=False))
        lanes, prompts = len(result.decode_headline), cells["prompt"].nunique()
        evidence.append(f"{len(cells)} cells ({lanes} lane{'s' * (lanes != 1)} x {prompts} prompt{'s' * (prompts != 1)}"
                        f"); timed: {per_lane} (>= {th.min_common_tokens} common tokens, decode wall >= "
                        f"{th.min_timed_wall_s:g} s a side)")
    if result.timing_note:
        evidence.append(result.timing_note)
    evidence.append("every pin matched" if pins_ok else "a pin did NOT match")
    share = cet.identical_share_line(result.matched_summary)
    if share:
        evidence.append(share)
    if len(result.setup):
        evidence.append(f"set-ups differ in {len(diffs)} aspect(s): " + " · ".join(diffs) if diffs
                        else "the two set-ups agree on every aspect compared")
    return report_view.Summary(
        question=f"How fast does {ours} (ours) decode against the pinned {oracle} oracle on the same weights, lanes "
                 f"and prompts, timed only where both emit the same tokens? Ratios are {ours} / {oracle}.",
        headlines=[*heads, *ttfts, *spec], evidence=evidence,
    )


def category_of(data: CrossData, params: CrossEngineParams) -> dict[str, str]:
    """prompt id -> task category: as recorded with each request, else (runs saved before requests carried
    it) from the params: `prompts`, and the workload's draw where its file can be read here."""
    from specbook.core.errors import SpecbookError

    req = data.requests
    if "category" in req and req["category"].notna().any():
        return {str(k): str(v) for k, v in req.dropna(subset=["category"]).groupby("prompt")["category"].first().items()}
    try:
        templates = params.all_prompts()
    except SpecbookError:
        templates = [p.request() for p in params.prompts]
    return {r.prompt_id: r.category for r in templates if r.category}


def analyze(data: CrossData, params: CrossEngineParams) -> CrossResult:
    bound = params.measurement.max_failed_requests
    texts = prompt_texts(params)
    cells = cell_table(data, params.guards, ci=params.ci_level, n_boot=params.n_boot, max_failed_requests=bound,
                       texts=texts)
    positions = per_position(data)
    equal = equal_work_cells(data, params.guards, ci=params.ci_level, max_failed_requests=bound)
    labels = _labels(data)
    traced = not data.trace_passes.empty
    matched = cet.matched_anchor_table(data.trace_steps, data.trace_requests) if traced else pd.DataFrame()
    decode = timing.decode_cells(cells, request_failures.answered(data.requests), data.equal_work, equal,
                                 params.timing, ci=params.ci_level)
    setup = setup_table(data, params)
    diffs = asymmetries(setup) if len(setup) else []
    timed = {(r.lane, r.prompt) for r in decode.itertuples(index=False) if r.timed}
    summary = cet.matched_anchor_summary(matched) if traced else pd.DataFrame()
    by_prompt = cet.anchors_by_prompt(matched, timed) if traced else pd.DataFrame()
    listing, anchor_note = cet.anchor_listing(matched, labels, _decoder(params) if len(matched) else None)
    splits = cost_split_table(data)
    return CrossResult(
        pins=pins_table(data), weights=weights_table(data), cells=cells, flagged_reasons=flagged_reasons(cells),
        headline=headline(cells, ci=params.ci_level, n_boot=params.n_boot),
        acceptance=acceptance_table(data) if not data.cells.empty else pd.DataFrame(),
        per_position=positions, per_position_table=per_position_table(positions), definition=definition_note(),
        proposals_note=cet.UNTIMED_NOTE if traced else PROPOSALS_NOTE, prompts_note=prompts_note(data, params),
        request_failures=request_failure_table(data, bound),
        usable=usable_cells(cells, equal), equal_work_cells=equal,
        equal_work_headline=equal_work_headline(cells, equal, ci=params.ci_level)
        if len(equal) or params.equal_work.enabled else pd.DataFrame(),
        trace_agreement=cet.trace_agreement(data.trace_passes, data.trace_steps) if traced else pd.DataFrame(),
        replay=cet.replay_table(data.trace_steps, data.trace_reference, data.trace_requests, labels)
        if traced else pd.DataFrame(),
        matched_anchors=matched, matched_summary=summary,
        prefix_acceptance=cet.prefix_acceptance_table(data.trace_steps, data.trace_requests, labels)
        if traced else pd.DataFrame(),
        cost_split=splits,
        setup=setup,
        categories=categories.cross_engine_by_category(
            cells, data.cells, category_of(data, params),
            lambda group: headline(group, ci=params.ci_level, n_boot=params.n_boot)),
        decode_cells=decode, decode_headline=timing.decode_headline(decode, ci=params.ci_level),
        headline_texts=timing.headline_texts(decode),
        speculation_effect=timing.speculation_effect(request_failures.answered(data.requests), cells,
                                                     ci=params.ci_level),
        tokens_per_step=timing.tokens_per_step(request_failures.answered(data.requests), data.cells, decode), timing_note=timing.timing_note(decode, params.timing),
        repeats_note=repeats_line(data.requests),
        anchor_listing=listing, anchor_note=anchor_note, anchors_by_prompt=by_prompt,
        identical_share_notes=cet.identical_share_notes(summary, by_prompt, diffs) if traced else [],
        cost_split_notes=costsplit.split_notes(splits) if len(splits) else [],
        cost_split_scaled=costsplit.scaled_splits(splits, timed_step_ms(data, params, labels))
        if len(splits) else pd.DataFrame(),
        labels=labels, model=str(params.oracle.engine.model),
        prompt_tokens=_median_prompt_tokens(data.requests),
    )


def _decoder(params: CrossEngineParams) -> Any | None:
    """token ids -> text with the target's tokenizer, or None where its model folder is not here."""
    from specbook.core.errors import SpecbookError

    try:
        tokenizer = load_tokenizer(params)
    except (SpecbookError, OSError, ValueError, ImportError):  # the listing then shows ids, and says so
        return None
    return lambda ids: tokenizer.decode(list(ids))


def repeats_line(requests: pd.DataFrame) -> str:
    """'3 timed repeats a side in every cell' / '3 to 9 timed repeats a side' from the timed requests."""
    if requests.empty:
        return ""
    n = requests.groupby(["lane", "prompt", "side"], sort=False).size()
    if n.min() == n.max():
        return f"{n.min()} timed repeat{'s' if n.min() != 1 else ''} a side in every cell"
    return f"{n.min()} to {n.max()} timed repeats a side (collection adds repeats where a cell's decode wall is short)"


def _median_prompt_tokens(requests: pd.DataFrame) -> float:
    pt = requests["prompt_tokens"].dropna() if "prompt_tokens" in requests else pd.Series(dtype=float)
    return float(pt.median()) if len(pt) else math.nan


register_experiment(ExperimentSpec("cross_engine", CrossEngineParams, "cross_engine.ipynb",
                                   collect=collect, load=load, analyze=analyze))
