"""Config-flip collection: build the arms, then serve each arm's units of work and save their frames as each ends.

Per arm, up to three units (phases), in this order:
    measured   warm-up, the timed window (`measure_arm`, on the running server)
    trace      an untimed trace pass (params `traces`), tracing switched on around it
    profile    a profiled pass (params `cost_split`), the profiler switched on around it
`arm_unit` serves them on one server, launched with the instruments installed and off
(specbook.measure.instruments), where the engine switches them at run time: every window of the measured phase
comes before any instrument is on. An instrument the engine cannot switch (on from its server's start) keeps a
server of its own (`trace_unit`, `profile_unit`), after every arm's server, as before. A resumed run serves an arm's
unfinished phases on a fresh server (ARM-2, ...). A unit's row in the arms frame goes last: it marks the unit
done for a resume (specbook.store.units); each server's record lists the phases it served (`extra.phases`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from specbook.core import progress
from specbook.engines import EngineConfig
from specbook.experiments.config_flip import flip
from specbook.experiments.config_flip.arms import FlipArm, flip_arms
from specbook.experiments.config_flip.data import (
    ARMS_FRAME,
    COST_SPLIT_FRAME,
    FLIP_DIRNAME,
    FLIP_JSON,
    INTERVALS_FRAME,
    REQUESTS_FRAME,
    UNITS,
    FlipData,
    keyed,
    load,
)
from specbook.experiments.config_flip.params import ConfigFlipParams
from specbook.measure import costsplit, harness
from specbook.measure.harness import Server, Window
from specbook.measure.instruments import PROFILE, TRACE, switchable, with_instruments
from specbook.measure.tracepass import TraceSet, trace_pass, traced_config
from specbook.serve.client import ChatRequest
from specbook.store.runstore import RunContext
from specbook.store.units import done_units, set_aside_folder
from specbook.traces import tables as trace_tables

EXPERIMENT = "config_flip"  # the servers' records name it (servers.jsonl `extra`)
# With starts_together 2: for the first server of each pair, the (name, config) launched beside it.
Ahead = dict[str, tuple[str, EngineConfig]]
Done = set[tuple[str, str]]  # the (arm, kind) units a resumed run holds as done
KINDS = ("measured", "trace", "profile")  # an arm's phases, in the order its server serves them


def collect(params: ConfigFlipParams, ctx: RunContext) -> FlipData:
    """Build the arms, prove them one-field apart, serve each in turn and save frames as each ends.

    A resumed run (specbook.store.units) skips the units the folder holds as done; the arm folders (links and one
    edited file, made from the params) are built again."""
    done: Done = done_units(ctx, UNITS)
    arms_root = Path(ctx.run_dir) / FLIP_DIRNAME
    if arms_root.exists():  # a resumed run: derived from the params, never measured data
        shutil.rmtree(arms_root)
    arms, record = flip_arms(params, arms_root)
    ctx.save_json(FLIP_JSON, record)
    requests = chat_requests(params)
    units = progress.Units("config-flip server", planned_units(params))  # console only (specbook.core.progress)
    try:
        measured_units(params, ctx, arms, requests, done, units)
        if params.traces:
            trace_units(params, ctx, arms, requests, done, units)
        if params.cost_split:
            profile_units(params, ctx, arms, requests, done, units)
    finally:
        harness.discard_ahead()  # a failed arm or Ctrl-C: the next one's server is not needed
    return load(ctx)


def chat_requests(params: ConfigFlipParams, prefix: str = "p") -> list[ChatRequest]:
    """The selected prompts as single-turn chats (the system prompt first where there is one)."""
    out = []
    for i, text in enumerate(params.selected_prompts()):
        messages = [{"role": "system", "content": params.system_prompt}] if params.system_prompt else []
        messages.append({"role": "user", "content": text})
        out.append(ChatRequest(prompt_id=f"{prefix}{i:03d}", messages=messages, max_tokens=params.max_tokens))
    return out


def warmup_requests(params: ConfigFlipParams) -> list[ChatRequest]:
    """The warm-up sent before a measured window: the first prompt, a few tokens."""
    return chat_requests(params.model_copy(update={"num_prompts": 1, "max_tokens": 8}), prefix="warmup")


def planned_units(params: ConfigFlipParams) -> int:
    return len(params.flip.values) * (1 + params.traces + params.cost_split)


def wanted_kinds(params: ConfigFlipParams) -> list[str]:
    return ["measured", *([TRACE] if params.traces else []), *([PROFILE] if params.cost_split else [])]


def shared_kinds(params: ConfigFlipParams, arm: FlipArm, done: Done) -> tuple[str, ...]:
    """The arm's phases not done that its one server serves: measured, and each instrumented pass the engine
    switches at run time."""
    shareable = {"measured"} | switchable(arm.cfg.engine)
    return tuple(k for k in wanted_kinds(params) if k in shareable and (arm.label, k) not in done)


def arm_server_name(arm: FlipArm, used: set[str]) -> str:
    """The arm's label; ARM-2, ARM-3, ... in a resumed run where a done phase's server had that name (`used`)."""
    name, n = arm.label, 1
    while name in used:
        n += 1
        name = f"{arm.label}-{n}"
    return name


def pairs_ahead(params: ConfigFlipParams, servers: list[tuple[str, EngineConfig]]) -> Ahead:
    """With starts_together 2: for the first server of each pair, the (name, config) to launch beside it."""
    if params.starts_together < 2:
        return {}
    return {servers[i][0]: servers[i + 1] for i in range(0, len(servers) - 1, 2)}


def start_partner(ctx: RunContext, name: str, ahead: Ahead) -> None:
    """Launch the server paired with `name` (if any) now, so that its start overlaps this one's."""
    if name in ahead:
        partner, cfg = ahead[name]
        harness.start_ahead(cfg, ctx, partner)


def done_row(arm: FlipArm, kind: str, server_name: str, ready_s: float | None) -> pd.DataFrame:
    """The arms row that marks a trace or profiled pass done."""
    return pd.DataFrame([{"arm": arm.label, "kind": kind, "server": server_name, "index": arm.index,
                          "value": arm.value, "ready_s": ready_s}])


# -- measured: the arm's timed window ------------------------------------------------------------------------


def measured_units(params: ConfigFlipParams, ctx: RunContext, arms: list[FlipArm], requests: list[ChatRequest],
                   done: Done, units: progress.Units) -> None:
    """Every arm's server in order (an arm with nothing left to serve on it skipped), serving its measured phase
    and the instrumented passes its engine switches at run time; servers started in pairs with starts_together 2.
    The folders of the passes to run are set aside first (a resumed run: a cut attempt's records are never read
    as these), before any server starts."""
    warmup = warmup_requests(params)
    used = {str(x) for x in ctx.load_frame(ARMS_FRAME)["server"]} if done and ctx.has_frame(ARMS_FRAME) else set()
    plans = []
    for arm in arms:
        kinds = shared_kinds(params, arm, done)
        if not kinds:
            units.skip(arm.label)
            continue
        if TRACE in kinds:
            set_aside_folder(trace_folder(ctx, arm))
        prof_dir = costsplit.profile_dir(ctx, profile_server_name(arm)) if PROFILE in kinds else None
        cfg = with_instruments(arm.cfg, trace_dir=trace_folder(ctx, arm) if TRACE in kinds else None,
                               profile_dir=prof_dir)
        plans.append((arm, arm_server_name(arm, used), cfg, kinds))
    ahead = pairs_ahead(params, [(name, cfg) for _, name, cfg, _ in plans])
    for arm, name, cfg, kinds in plans:
        arm_unit(params, ctx, arm, name, cfg, kinds, requests, warmup, units, ahead)


def arm_unit(params: ConfigFlipParams, ctx: RunContext, arm: FlipArm, name: str, cfg: EngineConfig,
             kinds: tuple[str, ...], requests: list[ChatRequest], warmup: list[ChatRequest], units: progress.Units,
             ahead: Ahead) -> None:
    """One arm's server (its pair's partner launched beside it) serving `kinds` in order: the measured window
    (warm-up, the window, its frames), then the trace pass, then the profiled pass, each with its arms row last."""
    import time

    extra = {"experiment": EXPERIMENT, "field": params.flip.field, "value": arm.value,
             "folder": str(arm.folder.path), "phases": [], "phase_s": {}}
    start_partner(ctx, name, ahead)
    with harness.serve(cfg, ctx, name, extra=extra) as server:
        for kind in kinds:
            t0 = time.monotonic()
            if kind == "measured":
                units.start(f"{name} ({params.flip.field} = {arm.value})")
                save_measured(ctx, arm, measure_arm(server, params, requests, warmup), server.ready_s, name)
            elif kind == TRACE:
                traced = requests[: params.trace_num_prompts]
                units.start(f"{name}: untimed trace pass, first {len(traced)} prompt(s)")
                save_trace(ctx, arm, trace_pass(server, traced, trace_folder(ctx, arm)), name, server.ready_s)
            else:
                profiled = requests[: params.cost_split_num_prompts]
                units.start(f"{name}: profiled pass, first {len(profiled)} prompt(s)")
                split = costsplit.profile_phase(server, profiled, Path(ctx.run_dir) / costsplit.PROFILES_DIR
                                                / profile_server_name(arm), lane=arm.label)
                save_profile(ctx, arm, split, name, server.ready_s)
            extra["phases"].append(kind)
            extra["phase_s"][kind] = round(time.monotonic() - t0, 3)


def measure_arm(server: Server, params: ConfigFlipParams, requests: list[ChatRequest],
                warmup: list[ChatRequest]) -> Window:
    """The arm's timed window on its running server: the warm-up requests (not measured), then the prompts."""
    for _ in range(params.warmup_requests):
        server.send(warmup)
    return server.measure(requests, concurrency=params.concurrency)


def save_measured(ctx: RunContext, arm: FlipArm, window: Window, ready_s: float | None,
                  server_name: str | None = None) -> None:
    """The measured arm's requests and log intervals, then its arms row: saved after every arm, so a later arm's
    failure keeps what the earlier ones measured; the arms row goes last, it marks the arm done for a resume."""
    folder = arm.folder
    row = {
        "arm": arm.label, "kind": "measured", "server": server_name or arm.label, "index": arm.index,
        "value": arm.value,
        "is_original": (not folder.field_was_added) and flip.same_json(folder.value, folder.original_value),
        "folder": str(folder.path), "requests": len(window.records), "elapsed_s": window.wall_s,
        "ready_s": ready_s, **window.acceptance.counts(),
    }
    frame = window.requests_frame()
    frame.insert(0, "arm", arm.label)
    frame.insert(1, "value", arm.value)
    frame["kind"] = "measured"
    ctx.append_frame(REQUESTS_FRAME, frame)
    intervals = window.log_intervals()
    if len(intervals):
        intervals.insert(0, "arm", arm.label)
        intervals["kind"] = "measured"
        ctx.append_frame(INTERVALS_FRAME, intervals)
    ctx.append_frame(ARMS_FRAME, pd.DataFrame([row]))


# -- trace: the arm's untimed trace pass -----------------------------------------------------------------------


def trace_server_name(arm: FlipArm) -> str:
    return f"{arm.label}-trace"


def trace_folder(ctx: RunContext, arm: FlipArm) -> Path:
    """Where the arm's trace pass leaves its records (the trace plugin's files)."""
    return Path(ctx.run_dir) / "traces" / trace_server_name(arm)


def trace_units(params: ConfigFlipParams, ctx: RunContext, arms: list[FlipArm], requests: list[ChatRequest],
                done: Done, units: progress.Units) -> None:
    """Every arm's trace pass in order (a done one skipped). The passes to run have their folders set aside first
    (a resumed run: the cut attempt's records are never read as these), before any trace server starts."""
    todo = [arm for arm in arms if (arm.label, "trace") not in done and TRACE not in switchable(arm.cfg.engine)]
    for arm in todo:
        set_aside_folder(trace_folder(ctx, arm))
    ahead = pairs_ahead(params, [(trace_server_name(arm), traced_config(arm.cfg, trace_folder(ctx, arm)))
                                 for arm in todo])
    for arm in arms:
        if (arm.label, "trace") in done:
            units.skip(trace_server_name(arm))
        elif arm in todo:
            trace_unit(params, ctx, arm, requests, units, ahead)


def trace_unit(params: ConfigFlipParams, ctx: RunContext, arm: FlipArm, requests: list[ChatRequest],
               units: progress.Units, ahead: Ahead) -> None:
    """The arm's untimed trace pass on its own server (tracing on), then its frames and done row."""
    name, folder = trace_server_name(arm), trace_folder(ctx, arm)
    traced = requests[: params.trace_num_prompts]
    units.start(f"{name} (untimed trace pass, first {len(traced)} prompt(s))")
    extra = {"experiment": EXPERIMENT, "field": params.flip.field, "value": arm.value, "pass": "trace"}
    start_partner(ctx, name, ahead)
    with harness.serve(traced_config(arm.cfg, folder), ctx, name, extra=extra) as server:
        trace_set = trace_pass(server, traced, folder)
    save_trace(ctx, arm, trace_set, name, server.ready_s)


def save_trace(ctx: RunContext, arm: FlipArm, trace_set: TraceSet, name: str, ready_s: float | None) -> None:
    """The arm's trace frames, then its done row."""
    for frame_name, frame in trace_frames(trace_set, arm.cfg).items():
        ctx.append_frame(frame_name, keyed(frame, arm.label, "trace"))
    ctx.append_frame(ARMS_FRAME, done_row(arm, "trace", name, ready_s))


def trace_frames(trace_set: TraceSet, cfg: EngineConfig) -> dict[str, pd.DataFrame]:
    """A trace pass's frames; a traced draft_model arm adds the replay reference (its own draft folder, flipped
    config included, run greedily in transformers: after its server is gone, never beside it)."""
    frames = trace_tables.trace_set_frames(trace_set)
    spec = cfg.speculative_config or {}
    if trace_set.method == "draft_model" and trace_set.untraceable is None:
        frames[trace_tables.TRACE_REFERENCE] = trace_tables.replay_for(
            trace_set, str(spec["model"]), int(spec.get("num_speculative_tokens") or 1))
    return frames


# -- profile: the arm's profiled pass ---------------------------------------------------------------------------


def profile_server_name(arm: FlipArm) -> str:
    return f"{arm.label}-prof"


def profile_units(params: ConfigFlipParams, ctx: RunContext, arms: list[FlipArm], requests: list[ChatRequest],
                  done: Done, units: progress.Units) -> None:
    """Every arm's profiled pass on a server of its own (a done one skipped), where the engine cannot switch its
    profiler at run time (else the arm's server served it)."""
    for arm in arms:
        if (arm.label, "profile") in done:
            units.skip(profile_server_name(arm))
        elif PROFILE not in switchable(arm.cfg.engine):
            profile_unit(params, ctx, arm, requests, units)


def profile_unit(params: ConfigFlipParams, ctx: RunContext, arm: FlipArm, requests: list[ChatRequest],
                 units: progress.Units) -> None:
    """The arm's profiled pass on a server of its own, started from the arm's config: its split, then its done row."""
    name = profile_server_name(arm)
    profiled = requests[: params.cost_split_num_prompts]
    units.start(f"{name} (profiled pass, first {len(profiled)} prompt(s))")
    split = costsplit.profiled_pass(arm.cfg, profiled, ctx, name=name, lane=arm.label)
    save_profile(ctx, arm, split, name, None)


def save_profile(ctx: RunContext, arm: FlipArm, split: costsplit.CostSplit, name: str, ready_s: float | None) -> None:
    """The arm's cost split, then its done row."""
    ctx.append_frame(COST_SPLIT_FRAME, keyed(costsplit.splits_frame([split]), arm.label, "profile"))
    ctx.append_frame(ARMS_FRAME, done_row(arm, "profile", name, ready_s))
