"""Config-flip A/B: serve the same weights under configs that differ in exactly one field.

Each arm is a copy of one model folder (the target, or the draft of a draft-model speculative
config) whose weight files are links to the originals and whose config has the flipped field set
to that arm's value (specbook.experiments.config_flip.flip). Everything else is one shared EngineConfig in params, with
the placeholder ``@flip`` where the arm's folder goes (``engine.model`` or
``engine.speculative_config.model``). Before any server starts, the arms are proven to differ in
that field only: the folders file by file, and the launch specs (argv and env) built from them.

Per arm: a fresh server, a warm-up request, /metrics snapshot, the same prompts (greedy), a second
snapshot. AL and per-position acceptance come from the counter deltas; per-step time is decode
time divided by decode steps, with decode steps = (completion tokens - 1) / AL per request
(each engine step of one sequence emits AL tokens on average; the first token is the prefill's).

After every measured arm, optional passes per arm, each on its own server (never the timed one):
an untimed trace pass (params `traces`: proposals per step, derived accepted counts against the
counters, the replay reference, the arms side by side at matched anchors) and a profiled pass
(params `cost_split`: ms per decode step split into target / draft / sampling / rest).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specbook.core import request_failures, secrets
from specbook.core.acceptance import (
    ACCEPTED,
    Acceptance,
    accepted_per_draft_from_al,
    per_position_frame,
    upgrade_position_columns,
)
from specbook.core.errors import ExperimentError, ModelNotPreparedError
from specbook.core.params import ExperimentParams
from specbook.core.request_failures import RequestMeasurement
from specbook.engines import EngineConfig
from specbook.experiments.config_flip import flip
from specbook.experiments.registry import ExperimentSpec, register_experiment
from specbook.measure import costsplit
from specbook.report import view as report_view
from specbook.store.units import Units, done_units, register_units, set_aside_folder
from specbook.traces import tables as trace_tables

FLIP_PLACEHOLDER = "@flip"
FLIP_DIRNAME = "flip"
# Frames and JSON documents written into run_dir/data (the notebook's reuse_data path reads these).
ARMS_FRAME = "arms"
REQUESTS_FRAME = "requests"
INTERVALS_FRAME = "intervals"
FLIP_JSON = "flip"
COST_SPLIT_FRAME = "cost_split"
# A unit of work is one arm x kind server: kind "measured" (the arm's timed window), "trace" (its untimed trace
# pass), "profile" (its profiled pass). Its arms row (appended last, `server` naming it) says it finished. Runs
# saved before kinds existed hold measured arms only, each server named as its arm (the callable default).
UNIT_KINDS = ("measured", "trace", "profile")
UNITS = register_units("config_flip", Units(
    done_frame=ARMS_FRAME, key=("arm", "kind"),
    frames=(ARMS_FRAME, REQUESTS_FRAME, INTERVALS_FRAME, *trace_tables.FRAMES, COST_SPLIT_FRAME),
    server="server", key_defaults={"kind": "measured", "server": lambda frame: frame["arm"]}))
TRACE_NOTE = ("Proposal traces come from a separate, untimed trace pass per arm (its own server, run after the "
              "measured arms: vLLM with specbook's trace plugin, llama.cpp at debug verbosity -v), on the measured "
              "prompts (the first `trace_num_prompts`); no timed figure comes from it.")


class FlipSpec(BaseModel):
    """Which folder, which JSON file in it, which dotted field, and the values to compare."""

    model_config = ConfigDict(extra="forbid")

    folder: str = Field(description="model folder to flip: a path or an embedded model name")
    file: str = Field("config.json", description="JSON file of the folder holding the field, relative to it")
    field: str = Field(description="dotted path into the file, e.g. rope_theta or rope_scaling.factor")
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




# ---------------------------------------------------------------------------------------------
# arms: placeholder substitution and the "differ only in the folder" proof
# ---------------------------------------------------------------------------------------------


def flip_role(engine: EngineConfig) -> Literal["target", "draft"]:
    """Where the placeholder sits; exactly one place, and nowhere else in the config."""
    spec_model = (engine.speculative_config or {}).get("model")
    places = [role for role, value in (("target", engine.model), ("draft", spec_model)) if value == FLIP_PLACEHOLDER]
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


def arm_engine_config(engine: EngineConfig, folder: Path, *, served_model_name: str) -> EngineConfig:
    """The shared config with the placeholder replaced by this arm's folder.

    A flipped target gets a fixed served model name, else vLLM would name it by its (per-arm) path.
    """
    data = engine.model_dump()
    if flip_role(engine) == "target":
        data["model"] = str(folder)
        data["served_model_name"] = data.get("served_model_name") or served_model_name
    else:
        data["speculative_config"] = {**data["speculative_config"], "model": str(folder)}
    return EngineConfig.model_validate(data)


def _launch_view(spec: Any, folder: Path) -> dict[str, Any]:
    """The parts of a launch spec that must be equal across arms, with the arm folder masked."""
    mask = lambda s: s.replace(str(folder), FLIP_PLACEHOLDER)  # noqa: E731
    return {
        "argv": [mask(a) for a in spec.argv],
        "env": {k: mask(v) for k, v in sorted(spec.env.items())},
        "unset_env": sorted(spec.unset_env),
        "cwd": str(spec.cwd) if spec.cwd else None,
    }


def _redacted_view(view: dict[str, Any]) -> dict[str, Any]:
    """A launch view as flip.json records it: argv and env with their secrets hidden (specbook.core.secrets)."""
    return {**view, "argv": secrets.redact_argv(view["argv"]), "env": secrets.redact_env(view["env"])}


def assert_launches_differ_only_in_folder(views: list[dict[str, Any]], labels: list[str]) -> None:
    """Refuse arms whose launch argv/env differ once the arm's folder is masked out."""
    base = views[0]
    for label, view in zip(labels[1:], views[1:], strict=True):
        for key in base:
            if view[key] != base[key]:
                raise ExperimentError(
                    f"arm {label} would launch differently from arm {labels[0]} in {key} besides the "
                    f"flipped folder:\n  {base[key]}\n  {view[key]}"
                )


# ---------------------------------------------------------------------------------------------
# collect / load
# ---------------------------------------------------------------------------------------------


@dataclass
class FlipData:
    """What one config-flip run measured (all raw; the analysis functions derive the rest)."""

    flip: dict[str, Any]  # folders, values, the proven diffs, original value
    arms: pd.DataFrame  # one row per measured arm: counter deltas, elapsed, server facts
    requests: pd.DataFrame  # one row per (arm, prompt)
    intervals: pd.DataFrame  # SpecDecoding log intervals per arm (may be empty)
    # optional passes (params traces / cost_split), keyed by arm; empty in runs without them
    trace_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_requests: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_passes: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_reference: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost_split: pd.DataFrame = field(default_factory=pd.DataFrame)


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


def arm_label(index: int, value: Any) -> str:
    return f"arm{index}-{flip.safe_label(value)}"


def build_arms(params: ConfigFlipParams, root: Path) -> tuple[list[flip.FlippedFolder], dict[str, Any]]:
    """Build every arm's folder under `root` and prove they differ in the declared field only."""
    spec = params.flip
    source = resolve_folder(spec.folder)
    folders = [
        flip.build_flipped_folder(
            source, root / arm_label(i, value), file=spec.file, field=spec.field, value=value,
            add_missing=spec.add_missing, link_mode=spec.link,
        )
        for i, value in enumerate(spec.values)
    ]
    diffs = {
        folders[i].path.name: [d.describe() for d in flip.assert_only_field_differs(
            folders[0].path, folders[i].path, file=spec.file, field=spec.field)]
        for i in range(1, len(folders))
    }
    summary = {
        "source": str(source),
        "file": spec.file,
        "field": spec.field,
        "role": flip_role(params.engine),
        "original_value": folders[0].original_value,
        "field_was_added": folders[0].field_was_added,
        "link": spec.link,
        "arms": [
            {"label": f.path.name, "value": f.value, "folder": str(f.path),
             "linked_weights": list(f.linked_weights), "copied_files": list(f.copied_files)}
            for f in folders
        ],
        "diffs_vs_first_arm": diffs,
    }
    return folders, summary


def _chat_requests(params: ConfigFlipParams, prefix: str = "p") -> list[Any]:
    from specbook.serve.client import ChatRequest

    out = []
    for i, text in enumerate(params.selected_prompts()):
        messages = [{"role": "system", "content": params.system_prompt}] if params.system_prompt else []
        messages.append({"role": "user", "content": text})
        out.append(ChatRequest(prompt_id=f"{prefix}{i:03d}", messages=messages, max_tokens=params.max_tokens))
    return out


def collect(params: ConfigFlipParams, ctx: Any) -> FlipData:
    """Build the arms, prove them one-field apart, serve each in turn and save frames as each ends.

    A resumed run (specbook.store.units) skips the arms the folder holds as done; the arm folders (links and one
    edited file, made from the params) are built again."""
    import shutil

    from specbook.core import progress
    from specbook.engines import get_engine
    from specbook.measure import harness
    from specbook.measure.tracepass import traced_config

    done = done_units(ctx, UNITS)
    arms_root = Path(ctx.run_dir) / FLIP_DIRNAME
    if arms_root.exists():  # a resumed run: derived from the params, never measured data
        shutil.rmtree(arms_root)
    folders, summary = build_arms(params, arms_root)
    engine = get_engine(params.engine.engine)
    labels = [f.path.name for f in folders]
    configs = [arm_engine_config(params.engine, f.path, served_model_name="flip-target") for f in folders]
    # Same name/log/port for the comparison so only what the arm changes can differ.
    views = [
        _launch_view(engine.build_spec(cfg, name="arm", log_path=Path("arm.log"), port=1), f.path)
        for cfg, f in zip(configs, folders, strict=True)
    ]
    assert_launches_differ_only_in_folder(views, labels)
    summary["launch"] = _redacted_view(views[0])
    ctx.save_json(FLIP_JSON, summary)

    requests = _chat_requests(params)
    warmup = _chat_requests(params.model_copy(update={"num_prompts": 1, "max_tokens": 8}), prefix="warmup")
    units = progress.Units("config-flip server", _planned_units(params))  # console only (specbook.core.progress)
    to_measure = [i for i, label in enumerate(labels) if (label, "measured") not in done]
    ahead = _pairs_ahead(params, [(labels[i], configs[i]) for i in to_measure])
    try:
        for index, (label, folder, cfg) in enumerate(zip(labels, folders, configs, strict=True)):
            if (label, "measured") in done:
                units.skip(label)
                continue
            _measure_arm(params, ctx, index, label, folder, cfg, requests, warmup, units, ahead)
        traced = []
        for label, cfg in zip(labels, configs, strict=True):
            if params.traces and (label, "trace") not in done:
                folder = Path(ctx.run_dir) / "traces" / f"{label}-trace"
                set_aside_folder(folder)  # a resumed run: the cut attempt's records are never read as these
                traced.append((folder.name, traced_config(cfg, folder)))
        ahead = _pairs_ahead(params, traced)
        # every arm's trace pass, then every arm's profiled pass: a trace server started ahead never sits beside
        # a profiled one
        for kind in ("trace", "profile"):
            for index, (label, folder, cfg) in enumerate(zip(labels, folders, configs, strict=True)):
                _extra_pass(kind, params, ctx, index, label, json.dumps(folder.value), cfg, done, units, ahead)
    finally:
        harness.discard_ahead()  # a failed arm or Ctrl-C: the next one's server is not needed
    return load(ctx)


def _pairs_ahead(params: ConfigFlipParams, servers: list[tuple[str, EngineConfig]]) -> dict[str, tuple[str, EngineConfig]]:
    """With starts_together 2: for the first server of each pair, the (name, config) to launch beside it."""
    if params.starts_together < 2:
        return {}
    return {servers[i][0]: servers[i + 1] for i in range(0, len(servers) - 1, 2)}


def _start_partner(ctx: Any, name: str, ahead: dict[str, tuple[str, EngineConfig]]) -> None:
    from specbook.measure import harness

    if name in ahead:
        partner, cfg = ahead[name]
        harness.start_ahead(cfg, ctx, partner)


def _measure_arm(params: ConfigFlipParams, ctx: Any, index: int, label: str, folder: Any, cfg: EngineConfig,
                 requests: list[Any], warmup: list[Any], units: Any, ahead: dict[str, tuple[str, EngineConfig]]) -> None:
    """One measured arm on its own server (its pair's partner launched beside it): warm-up, the window, then
    its frames; the arms row last (it marks the arm done for a resume)."""
    from specbook.measure import harness

    units.start(f"{label} ({params.flip.field} = {json.dumps(folder.value)})")
    extra = {"experiment": "config_flip", "field": params.flip.field, "value": json.dumps(folder.value),
             "folder": str(folder.path)}
    _start_partner(ctx, label, ahead)
    with harness.serve(cfg, ctx, label, extra=extra) as server:
        for _ in range(params.warmup_requests):
            server.send(warmup)
        window = server.measure(requests, concurrency=params.concurrency)
    row = {
        "arm": label, "kind": "measured", "server": label, "index": index, "value": json.dumps(folder.value),
        "is_original": (not folder.field_was_added) and flip.same_json(folder.value, folder.original_value),
        "folder": str(folder.path), "requests": len(window.records), "elapsed_s": window.wall_s,
        "ready_s": server.ready_s, **window.acceptance.counts(),
    }
    frame = window.requests_frame()
    frame.insert(0, "arm", label)
    frame.insert(1, "value", json.dumps(folder.value))
    frame["kind"] = "measured"
    # Saved after every arm: a later arm's failure keeps what the earlier ones measured. The arms row
    # goes last: it marks the arm done for a resume.
    ctx.append_frame(REQUESTS_FRAME, frame)
    intervals = window.log_intervals()
    if len(intervals):
        intervals.insert(0, "arm", label)
        intervals["kind"] = "measured"
        ctx.append_frame(INTERVALS_FRAME, intervals)
    ctx.append_frame(ARMS_FRAME, pd.DataFrame([row]))


def _planned_units(params: ConfigFlipParams) -> int:
    return len(params.flip.values) * (1 + params.traces + params.cost_split)


def _keyed(frame: pd.DataFrame, arm: str, kind: str) -> pd.DataFrame:
    out = frame.copy()
    out.insert(0, "arm", arm)
    out.insert(1, "kind", kind)
    return out


def _extra_pass(kind: str, params: ConfigFlipParams, ctx: Any, index: int, label: str, value: str,
                cfg: EngineConfig, done: set, units: Any, ahead: dict[str, tuple[str, EngineConfig]]) -> None:
    """The arm's untimed trace pass or its profiled pass (`kind`), each its own server and unit, after every
    measured arm (tracing and profiling slow a server down: never in the timed one)."""
    from specbook.measure import harness
    from specbook.measure.tracepass import trace_pass, traced_config

    def done_row(kind: str, server_name: str, ready_s: float | None) -> pd.DataFrame:
        return pd.DataFrame([{"arm": label, "kind": kind, "server": server_name, "index": index, "value": value,
                              "ready_s": ready_s}])

    requests = _chat_requests(params)
    if kind == "trace" and params.traces:
        name = f"{label}-trace"
        if (label, "trace") in done:
            units.skip(name)
        else:
            traced = requests[: params.trace_num_prompts]
            units.start(f"{name} (untimed trace pass, first {len(traced)} prompt(s))")
            folder = Path(ctx.run_dir) / "traces" / name  # set aside in collect, before any trace server starts
            extra = {"experiment": "config_flip", "field": params.flip.field, "value": value, "pass": "trace"}
            _start_partner(ctx, name, ahead)
            with harness.serve(traced_config(cfg, folder), ctx, name, extra=extra) as server:
                ts = trace_pass(server, traced, folder)
            frames = trace_tables.trace_set_frames(ts)
            spec = cfg.speculative_config or {}
            if ts.method == "draft_model" and ts.untraceable is None:
                frames[trace_tables.TRACE_REFERENCE] = trace_tables.replay_for(
                    ts, str(spec["model"]), int(spec.get("num_speculative_tokens") or 1))
            for frame_name, frame in frames.items():
                ctx.append_frame(frame_name, _keyed(frame, label, "trace"))
            ctx.append_frame(ARMS_FRAME, done_row("trace", name, server.ready_s))
    if kind == "profile" and params.cost_split:
        name = f"{label}-prof"
        if (label, "profile") in done:
            units.skip(name)
        else:
            units.start(f"{name} (profiled pass, first {min(params.cost_split_num_prompts, len(requests))} prompt(s))")
            split = costsplit.profiled_pass(cfg, requests[: params.cost_split_num_prompts], ctx, name=name, lane=label)
            ctx.append_frame(COST_SPLIT_FRAME, _keyed(costsplit.splits_frame([split]), label, "profile"))
            ctx.append_frame(ARMS_FRAME, done_row("profile", name, None))


def load(ctx: Any) -> FlipData:
    """Read back what collect saved (reuse_data / `specbook render`); frames of older runs are upgraded."""
    from specbook.engines import upgrade_log_frame

    def maybe_frame(name: str) -> pd.DataFrame:
        return ctx.load_frame(name) if ctx.has_frame(name) else pd.DataFrame()

    intervals = maybe_frame(INTERVALS_FRAME)
    units = UNITS.upgraded(ctx.load_frame(ARMS_FRAME))  # the measured arms' rows and the extra passes' done rows
    arms = units[units["kind"] == "measured"].reset_index(drop=True)
    arms = upgrade_position_columns(arms).rename(columns={"accepted": ACCEPTED})
    return FlipData(
        flip=ctx.load_json(FLIP_JSON),
        arms=arms,
        requests=ctx.load_frame(REQUESTS_FRAME),
        intervals=upgrade_log_frame(intervals) if len(intervals) else intervals,
        trace_steps=maybe_frame(trace_tables.TRACE_STEPS),
        trace_requests=maybe_frame(trace_tables.TRACE_REQUESTS),
        trace_passes=maybe_frame(trace_tables.TRACE_PASSES),
        trace_reference=maybe_frame(trace_tables.TRACE_REFERENCE),
        cost_split=maybe_frame(COST_SPLIT_FRAME),
    )


# ---------------------------------------------------------------------------------------------
# analysis (pure functions of the saved frames)
# ---------------------------------------------------------------------------------------------


def arm_acceptance(arm: Any) -> Acceptance:
    return Acceptance.from_row(arm, source="counter delta")


def arm_summary(data: FlipData) -> pd.DataFrame:
    """One row per arm: AL, acceptance rate, tok/s, per-step time, failed requests.

    - al, acceptance_rate: the acceptance model on the counter deltas of the measured window
    - output_tok_s = completion tokens / elapsed wall time of the arm's measured window
    - decode_steps = sum over requests of (completion_tokens - 1) / AL
    - per_step_ms = sum(wall - ttft) / decode_steps
    """
    rows = []
    for _, arm in data.arms.sort_values("index").iterrows():
        req = data.requests[data.requests["arm"] == arm["arm"]]
        ok = req[req["error"].isna()] if "error" in req else req
        acc = arm_acceptance(arm)
        al = acc.al
        completion = float(ok["completion_tokens"].sum())
        decode_s = float((ok["wall_s"] - ok["ttft_s"]).sum())
        steps = float(((ok["completion_tokens"] - 1).clip(lower=0) / al).sum()) if al == al else math.nan
        rows.append({
            "arm": arm["arm"],
            "value": arm["value"],
            "is_original": bool(arm["is_original"]),
            "requests": int(len(req)),
            "failed": int(len(req) - len(ok)),
            "completion_tokens": int(completion),
            "drafts": int(acc.drafts or 0),
            "draft_tokens": int(acc.draft_tokens),
            "accepted_tokens": int(acc.accepted_tokens),
            "al": al,
            "acceptance_rate": acc.acceptance_rate,
            "output_tok_s": completion / float(arm["elapsed_s"]) if arm["elapsed_s"] else math.nan,
            "decode_tok_s": (completion - len(ok)) / decode_s if decode_s > 0 else math.nan,
            "decode_steps": steps,
            "per_step_ms": 1000.0 * decode_s / steps if steps and steps > 0 else math.nan,
            "ttft_ms_mean": 1000.0 * float(ok["ttft_s"].mean()) if len(ok) else math.nan,
        })
    return pd.DataFrame(rows)


def per_position_acceptance(data: FlipData) -> pd.DataFrame:
    """Arm x draft position (1-based): the share of drafts whose token at that position was accepted."""
    arms = data.arms.sort_values("index")
    return per_position_frame(({"arm": a["arm"], "value": a["value"]}, arm_acceptance(a)) for _, a in arms.iterrows())


def per_position_table(positions: pd.DataFrame) -> pd.DataFrame:
    """position x arm: the rate (the report's table and bar plot)."""
    return positions.pivot(index="position", columns="arm", values="rate")


def intervals_by_arm(data: FlipData) -> pd.DataFrame:
    """interval number x arm: each log interval's printed AL (a flat line = AL is the config's, not a prompt's)."""
    if data.intervals.empty:
        return pd.DataFrame()
    iv = data.intervals.copy()
    iv["interval"] = iv.groupby("arm").cumcount()
    return iv.pivot(index="interval", columns="arm", values="al")


def output_equality(data: FlipData, arms: list[str] | None = None) -> pd.DataFrame:
    """Per prompt: is every arm's output equal to the first arm's, and where they first part.

    Under greedy decoding the target alone decides the text, so equal outputs across arms are what
    lossless speculation promises whatever the draft proposes. A failed request has no output: a prompt
    that failed in an arm is not compared (`comparable` false, `all_equal` empty, `no_output` names the arms).
    `arms`: the arms to compare (default every arm, in order).
    """
    req = request_failures.answered(data.requests)
    arms = arms if arms is not None else list(data.arms.sort_values("index")["arm"])
    texts = req.pivot_table(index="prompt_id", columns="arm", values="output_text", aggfunc="first")
    prompts = list(dict.fromkeys(data.requests["prompt_id"])) if "prompt_id" in data.requests else []
    texts = texts.reindex(index=prompts, columns=arms)
    rows = []
    for prompt_id, row in texts.iterrows():
        missing = [a for a in arms if not isinstance(row.get(a), str)]
        first = row.get(arms[0]) if arms else None
        entry: dict[str, Any] = {"prompt_id": prompt_id}
        equal = True
        for arm in arms[1:]:
            other = row.get(arm)
            same = isinstance(first, str) and isinstance(other, str) and first == other
            equal &= same
            entry[f"first_difference_{arm}"] = None if same else _first_difference(first, other)
        entry["comparable"] = not missing
        entry["all_equal"] = equal if not missing else None
        entry["no_output"] = ", ".join(missing)
        rows.append(entry)
    return pd.DataFrame(rows)


def _first_difference(a: Any, b: Any) -> int | None:
    if not isinstance(a, str) or not isinstance(b, str):
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


@dataclass(frozen=True)
class FlipVerdict:
    collapsed: list[str]
    kept: list[str]
    best_arm: str
    accepted_per_step: dict[str, float]
    collapse_fraction: float
    outputs_equal: bool
    left_out: dict[str, str] = field(default_factory=dict)  # arm -> why (over measurement.max_failed_requests)

    def sentence(self) -> str:
        rates = ", ".join(f"{a}: {v:.2f}" for a, v in self.accepted_per_step.items())
        outputs = "equal" if self.outputs_equal else "NOT equal"
        if not self.collapsed:
            head = "No arm collapsed"
        else:
            head = f"Acceptance collapsed in {', '.join(self.collapsed)}"
        out = "; ".join(f"{a}: {why}" for a, why in self.left_out.items())
        return (
            f"{head} (accepted draft tokens per step {rates}; collapse = at most "
            f"{self.collapse_fraction:g} x the best arm {self.best_arm}). Outputs across arms are {outputs}."
            + (f" Left out for failed requests: {out}." if out else "")
        )


def flip_verdict(summary: pd.DataFrame, equality: pd.DataFrame, collapse_fraction: float,
                 left_out: dict[str, str] | None = None) -> FlipVerdict:
    """Which arms' acceptance collapsed relative to the best arm (AL-1 at most collapse_fraction x best); the arms
    in `left_out` (too many failed requests) are not judged. Outputs are equal when every prompt compared in
    every arm is (prompts with a failed request are not compared) and at least one was compared."""
    left_out = dict(left_out or {})
    if left_out and set(summary["arm"]) <= set(left_out):
        raise ExperimentError("every arm has more failed requests than measurement.max_failed_requests allows: "
                              + "; ".join(f"{a}: {why}" for a, why in left_out.items()))
    per_step = {r["arm"]: accepted_per_draft_from_al(float(r["al"])) for _, r in summary.iterrows()
                if r["arm"] not in left_out}
    finite = {a: v for a, v in per_step.items() if v == v}
    if not finite:
        raise ExperimentError("no arm has drafts in its counters; was speculative decoding on?")
    best = max(finite, key=finite.get)
    collapsed = [a for a, v in finite.items() if a != best and v <= collapse_fraction * finite[best]]
    return FlipVerdict(
        collapsed=collapsed,
        kept=[a for a in per_step if a not in collapsed],
        best_arm=best,
        accepted_per_step=per_step,
        collapse_fraction=collapse_fraction,
        outputs_equal=_outputs_equal(equality),
        left_out=left_out,
    )


def _outputs_equal(equality: pd.DataFrame) -> bool:
    compared = equality[equality["comparable"].astype(bool)] if "comparable" in equality else equality
    return bool(len(compared)) and bool(compared["all_equal"].astype(bool).all())


def describe_flip(data: FlipData) -> str:
    """What was flipped, in plain lines: source, field, arms with their values and shared weights."""
    f = data.flip
    where = "the target (engine.model)" if f["role"] == "target" else "the draft (speculative_config.model)"
    original = "absent (added)" if f["field_was_added"] else json.dumps(f["original_value"])
    lines = [
        f"source folder: {f['source']}  ->  serves as {where}",
        f"flipped field: {f['file']}:{f['field']}  (original value {original})",
    ]
    for arm in f["arms"]:
        lines.append(
            f"  {arm['label']}: {f['field']} = {json.dumps(arm['value'])}; "
            f"{len(arm['linked_weights'])} weight file(s) {f['link']}ed to the originals, "
            f"{len(arm['copied_files'])} other file(s) copied"
        )
    n = len(f["arms"]) - 1
    lines.append(
        f"checked: each of the {n} other arm(s) differs from {f['arms'][0]['label']} only in "
        f"{f['file']}:{f['field']} (all files diffed), and launches with the same argv and env but for the folder"
    )
    return "\n".join(lines)


def diff_table(data: FlipData) -> pd.DataFrame:
    """The proven differences between each arm and the first arm (file:field: left != right)."""
    rows = [
        {"arm": arm, "difference": d}
        for arm, diffs in data.flip.get("diffs_vs_first_arm", {}).items()
        for d in diffs
    ]
    return pd.DataFrame(rows)


@dataclass
class FlipResult:
    """Everything the config-flip report shows."""

    description: str
    differences: pd.DataFrame
    summary: pd.DataFrame
    per_position: pd.DataFrame
    per_position_table: pd.DataFrame
    intervals_by_arm: pd.DataFrame
    output_equality: pd.DataFrame
    verdict: FlipVerdict
    # per arm: requests, failed, the bound (measurement.max_failed_requests), valid, why an arm is left out
    request_failures: pd.DataFrame = field(default_factory=pd.DataFrame)
    # proposal traces (params traces; a separate untimed pass per arm): "" / empty in runs without them
    trace_note: str = ""
    trace_agreement: pd.DataFrame = field(default_factory=pd.DataFrame)
    replay: pd.DataFrame = field(default_factory=pd.DataFrame)
    proposals: pd.DataFrame = field(default_factory=pd.DataFrame)
    matched_anchors: pd.DataFrame = field(default_factory=pd.DataFrame)
    matched_summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    prefix_acceptance: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per-step cost split per arm (params cost_split; a separate profiled pass per arm)
    cost_split: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost_split_notes: list[str] = field(default_factory=list)  # parts out of proportion; what a split cannot see
    cost_split_scaled: pd.DataFrame = field(default_factory=pd.DataFrame)  # measured and scaled to the timed step

    def answer(self, params: ConfigFlipParams) -> report_view.Summary:
        """The report's summary block: each arm against the best arm (collapsed or kept), and output equality."""
        return flip_answer(self, params)


def flip_answer(result: FlipResult, params: ConfigFlipParams) -> report_view.Summary:
    """Question, one headline per arm (AL and accepted tokens per step against the best arm), outputs equal or not.

    One server per arm: there is no run-to-run interval, so each label says what this run measured and nothing
    more ("COLLAPSED in this run"; specbook.core.verdicts' rule for labels without an interval)."""
    from specbook.core.verdicts import RUN_SCOPE

    v, fmt = result.verdict, report_view.fmt
    al = dict(zip(result.summary["arm"], result.summary["al"], strict=True))
    best = v.accepted_per_step[v.best_arm]
    heads = []
    for arm, per_step in v.accepted_per_step.items():
        if arm == v.best_arm:
            continue
        share = per_step / best if best else float("nan")
        heads.append(report_view.Headline(
            f"{arm} vs {v.best_arm} (best)", f"{'COLLAPSED' if arm in v.collapsed else 'KEPT'} {RUN_SCOPE}",
            None, f"AL {fmt(al[arm])} vs {fmt(al[v.best_arm])}; accepted per step {fmt(per_step, 3)} vs "
            f"{fmt(best, 3)} ({share:.0%} of best; collapse at <= {v.collapse_fraction:.0%})",
            "one server per arm: no run-to-run interval (the counters cover every token of the window)",
            why=f"One server per arm: the counters are exact for this run's {int(result.summary['drafts'].sum())} "
                "drafts, but another run (another server start) could differ; the label says what this run "
                "measured."))
    eq = result.output_equality
    compared = eq[eq["comparable"].astype(bool)] if "comparable" in eq else eq
    n_eq = int(compared["all_equal"].astype(bool).sum()) if len(compared) else 0
    not_compared = f"; {len(eq) - len(compared)} not compared (a failed request)" if len(compared) < len(eq) else ""
    heads.append(report_view.Headline("outputs across arms",
                                      f"{'EQUAL' if v.outputs_equal else 'NOT EQUAL'} {RUN_SCOPE}", v.outputs_equal,
                                      f"{n_eq} of {len(compared)} prompts equal under greedy decoding{not_compared}",
                                      "no interval: the prompts sent, compared token for token"))
    for arm, why in v.left_out.items():
        heads.append(report_view.Headline(arm, "LEFT OUT", False, why))
    s = result.summary
    failed = int(s["failed"].sum()) if "failed" in s else 0
    # the index's one clause: the flipped field's values in words, not the arms' folder names
    others = [a for a in v.accepted_per_step if a != v.best_arm]
    value = dict(zip(s["arm"], s["value"], strict=True)) if "value" in s else {}
    short = (f"{params.flip.field.rsplit('.', 1)[-1]} {value.get(others[0], others[0])} vs "
             f"{value.get(v.best_arm, v.best_arm)}: {heads[0].verdict} (AL {fmt(al[others[0]])} vs "
             f"{fmt(al[v.best_arm])})" if others else report_view.short_clause(heads))
    return report_view.Summary(
        question=f"Does flipping {params.flip.file}:{params.flip.field} of {params.flip.folder} "
                 f"({' vs '.join(json.dumps(x) for x in params.flip.values)}) change draft acceptance?",
        headlines=heads,
        evidence=[f"{len(s)} arms, one server each", f"{int(s['requests'].sum())} requests ({failed} failed)",
                  f"{int(s['drafts'].sum())} drafts counted", "arms proven to differ only in the flipped field",
                  *([line] if (line := identical_share_line(result.matched_summary)) else [])],
        short=short,
    )


def request_failure_table(data: FlipData, max_failed: int) -> pd.DataFrame:
    """Per arm: its requests, how many failed, and whether it stays in the analysis."""
    return request_failures.failure_table(data.requests, ["arm"], max_failed)


# -- the optional passes (params traces / cost_split): pure functions of their frames, keyed by arm ------------


def _arm_part(frame: pd.DataFrame, arm: str) -> pd.DataFrame:
    return frame[frame["arm"] == arm] if len(frame) else frame


def _traced_arms(data: FlipData) -> list[str]:
    """The arms with a trace pass, in arm order."""
    if data.trace_passes.empty:
        return []
    traced = set(data.trace_passes["arm"])
    return [a for a in data.arms.sort_values("index")["arm"] if a in traced]


def trace_agreement_by_arm(data: FlipData) -> pd.DataFrame:
    """Per arm: the accepted counts derived from its traced proposals against the output, beside the engine's
    counters for the same (untimed) window; `agree` says whether the counters lie within the derived counts."""
    rows = [{"arm": p["arm"], **trace_tables.pass_agreement(p, _arm_part(data.trace_steps, p["arm"]))}
            for _, p in data.trace_passes.iterrows()]
    return pd.DataFrame(rows, columns=["arm", *trace_tables.AGREEMENT_COLUMNS])


def replay_by_arm(data: FlipData) -> pd.DataFrame:
    """Per draft_model arm: its traced proposals against the replay reference (its own draft folder, flipped
    config included, run greedily in transformers): anchors, share identical, systematic mismatches named."""
    cols = ["arm", "anchors", "identical_share", "systematic_mismatches"]
    if data.trace_reference.empty:
        return pd.DataFrame(columns=cols)
    rows = [{"arm": arm, **trace_tables.replay_comparison(_arm_part(data.trace_steps, arm), ref,
                                                          _arm_part(data.trace_requests, arm))}
            for arm, ref in data.trace_reference.groupby("arm", sort=False)]
    return pd.DataFrame(rows, columns=cols)


def proposals_table(data: FlipData, steps_per_arm: int = 12) -> pd.DataFrame:
    """Per arm, the first `steps_per_arm` verified steps of its first traced prompt: proposed ids beside the ids
    the target emitted there and the accepted count derived from them (the whole of it: data/trace_steps)."""
    parts = []
    for arm in _traced_arms(data):
        steps = _arm_part(data.trace_steps, arm)
        table = trace_tables.proposals_vs_output(steps, _arm_part(data.trace_requests, arm))
        if len(table):
            table = table[table["prompt_id"] == table["prompt_id"].iloc[0]].head(steps_per_arm)
            parts.append(_keyed(table, arm, "trace").drop(columns=["kind"]))
    cols = ["arm", "prompt_id", "anchor_pos", "proposed", "emitted", "accepted", "cut"]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def _pairs(data: FlipData) -> list[tuple[str, str]]:
    """Each traced arm against the first traced arm (as the outputs table compares them)."""
    arms = _traced_arms(data)
    return [(arms[0], b) for b in arms[1:]]


def pair_label(a: str, b: str) -> str:
    return f"{a} vs {b}"


def matched_anchors_between_arms(data: FlipData) -> pd.DataFrame:
    """Per pair of arms (each against the first): every anchor both reached with the same prefix (same prompt
    and emitted ids), their proposals side by side (`proposed_a` = the first arm), identical or where they first
    differ (1-based)."""
    parts = []
    for a, b in _pairs(data):
        m = trace_tables.matched_pair(_arm_part(data.trace_steps, a), _arm_part(data.trace_requests, a),
                                      _arm_part(data.trace_steps, b), _arm_part(data.trace_requests, b))
        m.insert(0, "pair", pair_label(a, b))
        parts.append(m)
    cols = ["pair", *trace_tables.MATCHED_COLUMNS]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def matched_anchor_summary(matched: pd.DataFrame) -> pd.DataFrame:
    """Per pair of arms: matched anchors, the share with identical proposals, where the others first differ."""
    return trace_tables.matched_summary(matched, "pair")


def prefix_acceptance_between_arms(data: FlipData) -> pd.DataFrame:
    """Per pair of arms x prompt traced in both: the common prefix of their emitted ids and each arm's
    speculative steps and accepted draft tokens on it ("96 tokens in 25 steps (arm0) vs 80 (arm1)")."""
    cols = ["pair", "prompt_id", "common_prefix", "tokens_a", "tokens_b", "steps_a", "steps_b", "accepted_a",
            "accepted_b", "summary"]
    rows = []
    for a, b in _pairs(data):
        ra, rb = _arm_part(data.trace_requests, a), _arm_part(data.trace_requests, b)
        sa, sb = _arm_part(data.trace_steps, a), _arm_part(data.trace_steps, b)
        for pa in ra.itertuples(index=False):
            match = rb[rb["prompt_id"] == pa.prompt_id]
            if match.empty or sa.empty or sb.empty:
                continue
            pb = next(match.itertuples(index=False))
            out_a, out_b = trace_tables.as_ids(pa.output_ids), trace_tables.as_ids(pb.output_ids)
            n, acc_a, acc_b = trace_tables.prefix_pair(sa[sa["request_id"] == str(pa.request_id)], out_a,
                                                       sb[sb["request_id"] == str(pb.request_id)], out_b)
            rows.append({"pair": pair_label(a, b), "prompt_id": pa.prompt_id, "common_prefix": n,
                         "tokens_a": len(out_a), "tokens_b": len(out_b), "steps_a": acc_a.steps,
                         "steps_b": acc_b.steps, "accepted_a": acc_a.accepted_tokens, "accepted_b": acc_b.accepted_tokens,
                         "summary": f"{n} tokens in {acc_a.steps} steps ({a}) vs {acc_b.steps} ({b})"})
    return pd.DataFrame(rows, columns=cols)


def identical_share_line(summary: pd.DataFrame) -> str:
    """The summary block's evidence line (traces.tables.identical_share_line), per pair."""
    return trace_tables.identical_share_line(summary, by="pair")


def cost_split_table(data: FlipData) -> pd.DataFrame:
    """The profiled passes' splits per arm (costsplit.splits_frame rows; `lane` is the arm, `source` says where
    each figure comes from, `overhead` the profiled wall over the unprofiled one)."""
    frame = data.cost_split
    return frame.drop(columns=["arm", "kind"]) if len(frame) else frame


def timed_step_ms(splits: pd.DataFrame, summary: pd.DataFrame) -> dict[tuple[str, str], float]:
    """(engine, arm) -> ms per decode step of the arm's measured, uninstrumented window (arm_summary's
    per_step_ms: all its prompts, the profiled pass sends the first cost_split_num_prompts of them)."""
    per_arm = dict(zip(summary["arm"], summary["per_step_ms"], strict=True)) if len(summary) else {}
    return {(r.engine, r.lane): float(per_arm.get(r.lane, math.nan)) for r in splits.itertuples(index=False)}


def analyze(data: FlipData, params: ConfigFlipParams) -> FlipResult:
    summary = arm_summary(data)
    positions = per_position_acceptance(data)
    failures = request_failure_table(data, params.measurement.max_failed_requests)
    left_out = request_failures.left_out(failures, ["arm"])
    kept = [a for a in data.arms.sort_values("index")["arm"] if a not in left_out]
    equality = output_equality(data, kept)
    traced = not data.trace_passes.empty
    matched = matched_anchors_between_arms(data) if traced else pd.DataFrame()
    splits = cost_split_table(data)
    return FlipResult(
        description=describe_flip(data), differences=diff_table(data), summary=summary, per_position=positions,
        per_position_table=per_position_table(positions), intervals_by_arm=intervals_by_arm(data),
        output_equality=equality, verdict=flip_verdict(summary, equality, params.collapse_fraction, left_out),
        request_failures=failures,
        trace_note=TRACE_NOTE if traced else "",
        trace_agreement=trace_agreement_by_arm(data) if traced else pd.DataFrame(),
        replay=replay_by_arm(data) if traced else pd.DataFrame(),
        proposals=proposals_table(data) if traced else pd.DataFrame(),
        matched_anchors=matched, matched_summary=matched_anchor_summary(matched) if traced else pd.DataFrame(),
        prefix_acceptance=prefix_acceptance_between_arms(data) if traced else pd.DataFrame(),
        cost_split=splits, cost_split_notes=costsplit.split_notes(splits) if len(splits) else [],
        cost_split_scaled=costsplit.scaled_splits(splits, timed_step_ms(splits, summary)) if len(splits) else pd.DataFrame(),
    )


register_experiment(ExperimentSpec("config_flip", ConfigFlipParams, "config_flip.ipynb",
                                   collect=collect, load=load, analyze=analyze))
