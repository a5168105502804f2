"""Cross-engine analysis: `analyze` gathers every table into CrossResult, and `cross_answer` turns it into the
report's summary block."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from specbook.core import request_failures
from specbook.experiments.cross_engine import draft_memory, timing
from specbook.experiments.cross_engine import traces as cet
from specbook.experiments.cross_engine.cells import (
    GUARD_COLUMNS,
    REPORT_COLUMNS,
    _labels,
    acceptance_table,
    cell_table,
    equal_work_cells,
    equal_work_headline,
    failures_line,
    flagged_count,
    flagged_reasons,
    headline,
    prompt_texts,
    request_failure_table,
    usable_cells,
)
from specbook.experiments.cross_engine.collection import load_tokenizer
from specbook.experiments.cross_engine.data import CrossData
from specbook.experiments.cross_engine.params import CrossEngineParams
from specbook.experiments.cross_engine.setups import asymmetries
from specbook.experiments.cross_engine.tables import (
    cost_split_table,
    definition_note,
    per_position,
    per_position_table,
    pins_table,
    prompts_note,
    setup_table,
    timed_step_ms,
    weights_table,
    weights_view,
)
from specbook.measure import categories, costsplit
from specbook.report import view as report_view

PROPOSALS_NOTE = (
    "Draft proposals side by side: not shown. Neither engine exposes the drafted token ids of each step "
    "through its API or metrics (vLLM 0.32 not at all; llama.cpp 11434 only prints draft candidates "
    "at debug log verbosity, which would change the timed run), so no matched-position comparison of "
    "proposals is possible; per-position acceptance above is the closest comparable figure."
)


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
    # per side x lane: chunks for the same output across a prompt's repeats (draft_memory: a drafter that learns
    # from earlier requests streams it in fewer), and per lane the caveat its headline carries where one does
    repeat_chunks: pd.DataFrame = field(default_factory=pd.DataFrame)
    caveats: dict[str, str] = field(default_factory=dict)
    emptied_notes: dict[str, str] = field(default_factory=dict)  # per lane: what collection emptied before each request
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
    def no_speculation_effect(self) -> str:
        """What the speculation-against-off table says where it has no rows."""
        return timing.NO_SPECULATION_EFFECT

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
            caveat = result.caveats.get(h.lane, "")
            why = timing.lane_why(h, result.tokens_per_step.get(h.lane, {}), labels, h.lane)
            heads.append(report_view.Headline(
                f"lane {h.lane}: decode rate", f"{fmt(h.decode_ratio, 3)}x {word}{draft_memory.scope_word(caveat)}",
                None,
                f"{fmt(h.ours_decode_tok_s, 3)} vs {fmt(h.oracle_decode_tok_s, 3)} tok/s after the first token "
                f"(end-to-end {fmt(h.e2e_ratio, 3)}x); {n} of {total} cells timed"
                + (f" ({h.not_timed} left out)" if h.not_timed else ""),
                _interval_text(h.decode_ratio_lo, h.decode_ratio_hi, level, n),
                why="; ".join(t for t in (caveat, why) if t)))
        if int(h.ttft_cells):
            word = timing.verdict_word(h.ttft_ratio_lo, h.ttft_ratio_hi, "longer", "shorter", "undecided")
            ttfts.append(report_view.Headline(
                f"lane {h.lane}: TTFT", f"{fmt(h.ttft_ratio, 3)}x {word}", None,
                f"{fmt(h.ours_ttft_ms, 3)} vs {fmt(h.oracle_ttft_ms, 3)} ms to the first token, {int(h.ttft_cells)} cells",
                _interval_text(h.ttft_ratio_lo, h.ttft_ratio_hi, level, int(h.ttft_cells)),
                why="; ".join(t for t in (timing.ttft_why(h, labels, diffs, result.prompt_tokens),
                                          result.emptied_notes.get(h.lane, "")) if t)))
    eff = result.speculation_effect
    spec = []
    if len(eff):
        scoped = [f"lane {lane}: prompts served before (its headline says why)" for lane in result.caveats]
        spec.append(report_view.Headline(
            "speculation against off, each engine", timing.speculation_verdict(eff), None,
            timing.speculation_figure(eff, labels), f"{level:.0%} CI per engine x lane below",
            why="; ".join([timing.speculation_why(eff, labels, result.model), *scoped])))
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
    answered = request_failures.answered(data.requests)
    decode = timing.decode_cells(cells, answered, data.equal_work, equal,
                                 params.timing, ci=params.ci_level)
    setup = setup_table(data, params)
    diffs = asymmetries(setup) if len(setup) else []
    timed = {(r.lane, r.prompt) for r in decode.itertuples(index=False) if r.timed}
    summary = cet.matched_anchor_summary(matched) if traced else pd.DataFrame()
    by_prompt = cet.anchors_by_prompt(matched, timed) if traced else pd.DataFrame()
    listing, anchor_note = cet.anchor_listing(matched, labels, _decoder(params) if len(matched) else None)
    splits = cost_split_table(data)
    chunks = draft_memory.repeat_chunks(answered)
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
        speculation_effect=timing.speculation_effect(answered, cells,
                                                     ci=params.ci_level),
        tokens_per_step=timing.tokens_per_step(answered, data.cells, decode), timing_note=timing.timing_note(decode, params.timing),
        repeats_note=repeats_line(data.requests),
        repeat_chunks=chunks, emptied_notes=draft_memory.emptied_notes(answered, labels),
        caveats=draft_memory.caveats(draft_memory.remembering_sides(params), chunks, labels, answered),
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
