"""Cross-engine collection: check pins, derive weights, then serve each side x lane's units of work (timed, trace,
profile, equal work), saving their frames as each ends.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from specbook.core import request_failures
from specbook.core.acceptance import Acceptance
from specbook.engines import EngineConfig
from specbook.experiments.cross_engine import timing
from specbook.experiments.cross_engine import traces as cet
from specbook.experiments.cross_engine.cells import _tokens, cell_guards, prompt_texts, request_failure_table
from specbook.experiments.cross_engine.data import (
    CELLS_FRAME,
    COLD_JSON,
    COST_SPLIT_FRAME,
    EQUAL_WORK_FRAME,
    PINS_JSON,
    REQUESTS_FRAME,
    SERVERS_FRAME,
    UNITS,
    WEIGHTS_JSON,
    WORKLOAD_JSON,
    CrossData,
    load,
)
from specbook.experiments.cross_engine.params import SIDES, CrossEngineParams, LaneSpec, SideSpec
from specbook.experiments.cross_engine.timing import TimingSpec
from specbook.store.units import done_units, set_aside_folder

if TYPE_CHECKING:
    from specbook.serve.client import ChatRequest

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
