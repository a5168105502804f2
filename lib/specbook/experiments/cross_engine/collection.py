"""Cross-engine collection: check pins, derive weights, then serve each side x lane's phases (timed, equal work,
trace, profile: units of work), saving their frames as each ends.

Per lane x side: one server for its phases where its engine switches its instruments at run time, else a
server per instrumented phase besides (specbook.experiments.cross_engine.phases); the side served second starts
its server during the first side's draft replay. Per prompt in the timed phase: one cold request (not timed; its
raw response, with llama.cpp's `timings`, is kept), a /metrics snapshot, N warm repeats streamed one at a time,
a second snapshot; where their decode wall is shorter than `timing.min_timed_wall_s`, one more window of as many
repeats as it still needs, unless these requests cannot time the cell (too short, a loop, or unequal to the other
side's output where that side already ran: timing.worth_topping_up). A side whose drafter also learns from earlier
requests (engines.base.ForgetsDrafts: SGLang's NGRAM trie) has it emptied before each timed request, which then
gets a window of its own (params.draft_memory `forget`, the default). Warm tok/s = completion_tokens /
whole-request wall time; the headline is the decode rate on equal decode work (cross_engine_timing). AL per cell
comes from the counter delta under specbook.core.acceptance's one definition; raw figures are kept beside it.

Token ids for the guards come from tokenizing each output text with the target's own tokenizer
(both engines use the same vocabulary): one token space for every engine, and nothing added to the
timed requests (logprobs / token-id options change what the server does per token).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from specbook.core import request_failures
from specbook.core.acceptance import Acceptance
from specbook.engines import EngineConfig
from specbook.experiments.cross_engine import draft_memory, phases, timing
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

    # no "clean-up" of decoded text: it would strip spaces a BPE tokenizer's output holds, and newer transformers
    # skip it for BPE with a warning that lands in a report cell
    return AutoTokenizer.from_pretrained(resolve_model(params.oracle.engine.model), clean_up_tokenization_spaces=False)


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
    """Check pins (abort before measuring), derive weights, then serve each lane's sides in turn, each side x lane's
    phases on as few servers as its engine allows (specbook.experiments.cross_engine.phases).

    A resumed run (specbook.store.units) skips the side x lane x kind phases the folder holds as done."""
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
    run = _Collection(params, ctx, prompts, tokenizer, cold, done,
                      progress.Units("cross-engine phase", _planned_phases(params)))  # console only
    order = phases.side_order({which: params.side(which).engine.engine for which in SIDES})
    try:
        for lane in params.lanes:
            for i, which in enumerate(order):
                last = i == len(order) - 1
                # a side served first may start the next side's server during its replay (start_next_ahead)
                run.next_side = None if last else (order[i + 1], lane, i + 1 == len(order) - 1)
                run.side_lane(which, lane, equal_now=last)
            run.next_side = None
            if params.equal_work.enabled:  # the sides served before the last: their re-runs on servers of their own
                for which in order[:-1]:
                    run.side_lane(which, lane, equal_now=False, only=("equal_work",))
    finally:  # a server started ahead that no phase took (a failure, Ctrl-C) does not outlive the collection
        from specbook.measure import harness

        harness.discard_ahead()
    return load(ctx)


def _wanted(params: CrossEngineParams, lane: LaneSpec) -> list[str]:
    """The lane's phases, per side: timed always; equal_work, trace and profile where the params ask for them."""
    return ["timed", *(["equal_work"] if params.equal_work.enabled else []),
            *(["trace"] if params.traces.enabled and _traced(lane) else []),
            *(["profile"] if _profiled(params, lane) else [])]


def _planned_phases(params: CrossEngineParams) -> int:
    per_side = sum(len([p for p in _wanted(params, lane) if p != "equal_work"]) for lane in params.lanes)
    return 2 * per_side  # equal-work phases are counted once known


@dataclass
class _Collection:
    """One collect call's state: what is done, the cold responses so far, the console's phase count."""

    params: CrossEngineParams
    ctx: Any
    prompts: list[ChatRequest]
    tokenizer: Any
    cold: list[dict[str, Any]]
    done: set
    units: Any
    # the side served next in this lane, whose first server may start during this side's replay (start_next_ahead)
    next_side: tuple[str, LaneSpec, bool] | None = None
    prepared: dict[str, tuple[EngineConfig, Path, Path | None]] = field(default_factory=dict)

    def side_lane(self, which: str, lane: LaneSpec, *, equal_now: bool, only: tuple[str, ...] | None = None) -> None:
        """The side x lane's phases not done (`only`: these of them), server by server (phases.plan_servers)."""
        side = self.params.side(which)
        for plan in self._plans(which, lane, equal_now=equal_now, only=only, tell=True):
            self._serve(which, side, lane, plan)

    def _plans(self, which: str, lane: LaneSpec, *, equal_now: bool, only: tuple[str, ...] | None = None,
               tell: bool = False) -> list[phases.ServerPlan]:
        """The side x lane's servers for its phases not done (`tell`: the console counts the done ones)."""
        side = self.params.side(which)
        label = f"{side.label}-{lane.name}"
        wanted = [p for p in _wanted(self.params, lane) if (only is None or p in only)
                  and (equal_now or only is not None or p != "equal_work")]
        done = {kind for (s, ln, kind) in self.done if s == which and ln == lane.name}
        for p in wanted:
            if p in done and tell:
                self.units.skip(f"{label} {p}")
        if "equal_work" in wanted and "equal_work" not in done and ("timed" in done or only is not None):
            if not self._equal_cells(lane):  # known before any server: nothing to re-run, no server for it
                wanted.remove("equal_work")
        used = set(self.ctx.load_frame(SERVERS_FRAME)["server"]) if self.ctx.has_frame(SERVERS_FRAME) else set()
        return phases.plan_servers(label, wanted, done, side.engine.engine, equal_now=equal_now,
                                   used_names={str(u) for u in used})

    def start_next_ahead(self) -> None:
        """Start the next side's first server now, once, where one is planned: called before an untimed replay,
        so that the server's start overlaps it. No window overlaps that start: the next server this
        process serves waits until every server started ahead is ready (harness.serve)."""
        from specbook.measure import harness

        if self.next_side is None:
            return
        which, lane, equal_now = self.next_side
        self.next_side = None
        plans = self._plans(which, lane, equal_now=equal_now)
        if plans:
            plan = plans[0]
            setup = self.prepared[plan.name] = self._server_cfg(which, lane, plan)
            harness.start_ahead(setup[0], self.ctx, plan.name, during="during the draft's replay")

    def _server_cfg(self, which: str, lane: LaneSpec, plan: phases.ServerPlan
                    ) -> tuple[EngineConfig, Path, Path | None]:
        """The server's config with its phases' instruments installed, its trace folder and profiler folder (an
        unfinished earlier attempt's set aside)."""
        from specbook.measure import costsplit
        from specbook.measure.instruments import with_instruments

        side = self.params.side(which)
        base = f"{side.label}-{lane.name}"
        trace_folder = Path(self.ctx.run_dir) / "traces" / f"{base}-trace"
        prof_dir = costsplit.profile_dir(self.ctx, f"{base}-prof") if "profile" in plan.phases else None
        if "trace" in plan.phases:
            set_aside_folder(trace_folder)  # an unfinished earlier attempt's records: kept beside, never read
        cfg = with_instruments(lane_config(side, lane), trace_dir=trace_folder if "trace" in plan.phases else None,
                               profile_dir=prof_dir)
        return cfg, trace_folder, prof_dir

    def _equal_cells(self, lane: LaneSpec) -> list[EqualWorkCell]:
        return equal_work_plan(load(self.ctx), self.params).get(lane.name, [])

    def _serve(self, which: str, side: SideSpec, lane: LaneSpec, plan: phases.ServerPlan) -> None:
        """One server for `plan.phases`, launched with the instruments of those phases installed (off until
        theirs); each phase's rows saved, then its servers row (the unit is done)."""
        import time

        from specbook.measure import harness

        # started ahead (start_next_ahead): its folders are the ones that server writes into
        cfg, trace_folder, prof_dir = self.prepared.pop(plan.name, None) or self._server_cfg(which, lane, plan)
        extra: dict[str, Any] = {"experiment": "cross_engine", "side": which, "lane": lane.name, "phases": [],
                                 "phase_s": {}}
        if len(plan.phases) == 1 and plan.phases[0] != "timed":
            extra["pass"] = plan.phases[0]
        if plan.phases == ("profile",):
            extra["profiled_pass"] = True
        with harness.serve(cfg, self.ctx, plan.name, extra=extra) as server:
            for phase in plan.phases:
                t0 = time.monotonic()
                ran = self._phase(phase, server, which, side, lane, trace_folder, prof_dir)
                if ran:
                    extra["phases"].append(phase)
                    extra["phase_s"][phase] = round(time.monotonic() - t0, 3)
                    _server_done(self.ctx, server, plan.name, which, side, lane, phase)

    def _phase(self, phase: str, server: Any, which: str, side: SideSpec, lane: LaneSpec, trace_folder: Path,
               prof_dir: Path | None) -> bool:
        """Run one phase on `server`, saving its frames; False where it had nothing to do (no equal-work cell)."""
        params, ctx = self.params, self.ctx
        if phase == "timed":
            self.units.start(f"{server.name}: timed ({which}, {len(self.prompts)} prompts)")
            _timed_phase(params, ctx, server, which, lane, self.prompts, self.tokenizer, self.cold)
        elif phase == "equal_work":
            cells = self._equal_cells(lane)
            if not cells:
                return False
            self.units.total += 1  # known only now
            self.units.start(f"{server.name}: equal work ({which}, {len(cells)} cells re-run on their common prefix)")
            _equal_work_phase(params, ctx, server, which, lane, self.prompts, self.tokenizer, cells)
        elif phase == "trace":
            self.units.start(f"{server.name}: trace ({which}, untimed trace pass, {len(self.prompts)} prompts)")
            _trace_phase(params, ctx, server, which, lane, self.prompts, trace_folder,
                         before_replay=self.start_next_ahead)
        else:
            from specbook.measure import costsplit

            self.units.start(f"{server.name}: profile ({which}, profiled pass)")
            requests = [build_request(params, p) for p in self.prompts[: params.cost_split.num_prompts]]
            assert prof_dir is not None
            split = costsplit.profile_phase(server, requests, prof_dir, lane=lane.name, engine_label=side.label,
                                            forget=drafts_forgetter(params, server))
            frame = costsplit.splits_frame([split])
            frame.insert(0, "side", which)
            frame.insert(2, "kind", "profile")
            ctx.append_frame(COST_SPLIT_FRAME, frame)
        return True


def _timed_phase(params: CrossEngineParams, ctx: Any, server: Any, which: str, lane: LaneSpec,
                 prompts: list[ChatRequest], tokenizer: Any, cold: list[dict[str, Any]]) -> None:
    """A side x lane's timed pass: per prompt a cold request, then the warm repeats (measure_cell)."""
    cfg = server.cfg
    request_frames, cell_rows = [], []
    other = _other_side_outputs(ctx, which, lane.name)
    forget = drafts_forgetter(params, server)
    for prompt in prompts:
        cold_resp = server.post_raw(build_request(params, prompt))
        cold.append({"side": which, "lane": lane.name, "prompt_id": prompt.prompt_id, "response": cold_resp})

        def can_time(records: list[Any], prompt_id: str = prompt.prompt_id) -> bool:
            ok = [r for r in records if r.error is None]
            return bool(ok) and timing.worth_topping_up(
                token_ids(tokenizer, ok[0].output_text), other.get(prompt_id),
                min_common_tokens=params.timing.min_common_tokens, guards=params.guards,
                length=ok[0].completion_tokens)

        windows = measure_cell(server, lambda i, p=prompt: build_request(params, p, repeat=i), params.warm_repeats,
                               params.timing, can_time=can_time, forget=forget)
        request_frames.append(_windows_frame(windows, which, cfg.engine, lane.name, prompt.prompt_id, tokenizer)
                              .assign(drafts_emptied=forget.emptied if forget else ""))
        cell_rows.append(_cell_row(which, cfg.engine, lane.name, prompt.prompt_id, windows, cold_resp))
    # Saved after every phase: a later failure keeps what the earlier ones measured.
    ctx.append_frame(REQUESTS_FRAME, pd.concat(request_frames, ignore_index=True).assign(kind="timed"))
    ctx.append_frame(CELLS_FRAME, pd.DataFrame(cell_rows).assign(kind="timed"))
    ctx.save_json(COLD_JSON, cold)


def measure_cell(server: Any, build: Any, repeats: int, spec: TimingSpec, *,
                 can_time: Callable[[list[Any]], bool] | None = None,
                 forget: Callable[[], Any] | None = None) -> list[Any]:
    """One cell side's timed repeats (`build(i)` is repeat i's request): `repeats` in one window, then, where
    their decode wall is short of `spec.min_timed_wall_s`, one more window with as many as it still needs
    (within `spec.max_warm_repeats`): the windows, in order. `can_time(records)`: whether these requests can
    still time the cell (timing.worth_topping_up); no more window where it says no. `forget`: called before
    each request, which then gets a window of its own (drafts_forgetter)."""
    def window(first: int, n: int) -> list[Any]:
        if forget is None:
            return [server.measure([build(first + i) for i in range(n)], concurrency=1)]
        out = []
        for i in range(n):
            forget()
            out.append(server.measure([build(first + i)], concurrency=1))
        return out

    windows = window(0, repeats)
    first_records = [r for w in windows for r in w.records]
    walls = [r.wall_s - r.ttft_s if r.error is None and r.ttft_s is not None else math.nan for r in first_records]
    more = timing.repeats_to_add(walls, min_wall_s=spec.min_timed_wall_s, max_repeats=spec.max_warm_repeats)
    if more and (can_time is None or can_time(first_records)):
        windows += window(repeats, more)
    return windows


@dataclass
class DraftsForgetter:
    """Empties a server's drafter memory of earlier requests when called; `emptied`: what the engine said it
    emptied (the requests frame's `drafts_emptied`)."""

    engine: Any
    base_url: str
    emptied: str = ""

    def __call__(self) -> None:
        self.emptied = self.engine.forget(self.base_url)


def drafts_forgetter(params: CrossEngineParams, server: Any) -> DraftsForgetter | None:
    """What empties `server`'s drafter memory of earlier requests before each timed request (params.draft_memory
    `forget`, an engine that offers ForgetsDrafts and whose config remembers); None where nothing is to empty."""
    engine = draft_memory.remembering_engine(server.cfg) if params.draft_memory == "forget" else None
    return DraftsForgetter(engine, server.base_url) if engine is not None else None


def _other_side_outputs(ctx: Any, which: str, lane: str) -> dict[str, list[int]]:
    """The other side's first timed output per prompt in this lane, where it already ran (else empty)."""
    if not ctx.has_frame(REQUESTS_FRAME):
        return {}
    req = ctx.load_frame(REQUESTS_FRAME)
    rows = req[(req["lane"] == lane) & (req["side"] != which) & (req.get("kind", "timed") == "timed")]
    if "error" in rows:
        rows = rows[rows["error"].isna()]
    return {str(p): _tokens(g)[0] for p, g in rows.groupby("prompt", sort=False)}


def _server_done(ctx: Any, server: Any, label: str, which: str, side: SideSpec, lane: LaneSpec, kind: str) -> None:
    """The phase's servers row, appended last: the unit is done."""
    ctx.append_frame(SERVERS_FRAME, pd.DataFrame([{
        "server": label, "side": which, "label": side.label, "engine": side.engine.engine, "lane": lane.name,
        "ready_s": server.ready_s if server is not None else math.nan,
        "versions": str(server.versions) if server is not None else "", "kind": kind}]))


def _traced(lane: LaneSpec) -> bool:
    return bool(lane.speculative_config)


def _profiled(params: CrossEngineParams, lane: LaneSpec) -> bool:
    return params.cost_split.enabled and (params.cost_split.lanes is None or lane.name in params.cost_split.lanes)


def _trace_phase(params: CrossEngineParams, ctx: Any, server: Any, which: str, lane: LaneSpec,
                 prompts: list[ChatRequest], folder: Path, before_replay: Callable[[], None] | None = None) -> None:
    """The side x lane's untimed trace pass (tracing on only for it where the engine switches it at run time).
    `before_replay`: called once the traced requests are done, before the draft's replay (which needs no server)."""
    from specbook.measure.tracepass import trace_pass

    requests = [build_request(params, p) for p in prompts]
    ts = trace_pass(server, requests, folder)
    frames = cet.trace_frames(ts, which, lane.name)
    spec = lane.speculative_config or {}
    if params.traces.replay and ts.method == "draft_model" and ts.untraceable is None:
        if before_replay is not None:
            before_replay()
        ref = cet.replay_for(ts, str(spec["model"]), int(spec.get("num_speculative_tokens") or 1))
        frames[cet.TRACE_REFERENCE] = cet.reference_frame(ref, which, lane.name)
    for name, frame in frames.items():
        ctx.append_frame(name, frame)


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


def _equal_work_phase(params: CrossEngineParams, ctx: Any, server: Any, which: str, lane: LaneSpec,
                      sent: list[ChatRequest], tokenizer: Any, cells: list[EqualWorkCell]) -> None:
    """Re-run each planned cell with max_tokens = its common prefix (ignore_eos): equal work."""
    from specbook.traces.equalwork import equal_work_request

    prompts = {p.prompt_id: p for p in sent}
    repeats = params.equal_work.warm_repeats or params.warm_repeats
    frames = []
    forget = drafts_forgetter(params, server)
    for cell in cells:
        prompt = prompts[cell.prompt]
        def equal(repeat: int | None, cell: EqualWorkCell = cell, prompt: ChatRequest = prompt) -> Any:
            return equal_work_request(build_request(params, prompt, repeat=repeat), cell.ours, cell.oracle)
        server.post_raw(equal(None))  # cold, not timed
        windows = measure_cell(server, equal, repeats, params.timing, forget=forget)
        frame = _windows_frame(windows, which, server.cfg.engine, lane.name, cell.prompt, tokenizer)
        frame["max_tokens"] = cell.tokens
        frame["drafts_emptied"] = forget.emptied if forget else ""
        frames.append(frame)
    ctx.append_frame(EQUAL_WORK_FRAME, pd.concat(frames, ignore_index=True).assign(kind="equal_work"))


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
