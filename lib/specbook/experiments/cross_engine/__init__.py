"""Cross-engine comparison: our engine against a pinned oracle engine, with guards before any ratio.

The same target weights, lanes, prompts and decoding on both sides (the params enforce it); one server per
side x lane serving its phases (timed, equal work, trace, profile) where its engine allows it; a cell
(lane x prompt) is compared only where its guards pass, and timed on equal decode work.

  params.py      the params schema (sides, lanes, prompts, optional passes) and its matched-work rules
  data.py        the run folder's frames and units of work; CrossData and load
  cells.py       per-cell guards, ratios and acceptance; the per-lane headlines
  collection.py  collect: pins, weights, then each side x lane's timed / equal-work / trace / profile phases
  phases.py      which servers a side x lane starts and which phases each serves, in order
  tables.py      the report's descriptive tables: pins, weights, set-ups, per-position acceptance, cost split
  analysis.py    analyze -> CrossResult; cross_answer, the report's summary block
  guards.py, pins.py, setups.py, timing.py, traces.py   output guards, version pins, set-up facts, timing on
                 equal decode work, the trace pass's tables
"""

from specbook.experiments.cross_engine.analysis import (
    PROPOSALS_NOTE,
    CrossResult,
    analyze,
    category_of,
    cross_answer,
    repeats_line,
)
from specbook.experiments.cross_engine.cells import (
    FAILED_FLAG,
    GUARD_COLUMNS,
    REPORT_COLUMNS,
    acceptance_table,
    cell_guards,
    cell_table,
    equal_work_cells,
    equal_work_headline,
    failures_line,
    flagged_count,
    flagged_reasons,
    headline,
    prompt_texts,
    ratio_of_means_ci,
    request_failure_table,
    usable_cells,
    user_text,
    with_rates,
)
from specbook.experiments.cross_engine.collection import (
    EqualWorkCell,
    build_request,
    check_all_pins,
    collect,
    equal_work_plan,
    lane_config,
    load_tokenizer,
    measure_cell,
    token_ids,
)

# private, but the unit tests call them here (the redundant alias marks the re-export)
from specbook.experiments.cross_engine.collection import _cell_row as _cell_row
from specbook.experiments.cross_engine.collection import _windows_frame as _windows_frame
from specbook.experiments.cross_engine.data import (
    CELLS_FRAME,
    COLD_JSON,
    COST_SPLIT_FRAME,
    EQUAL_WORK_FRAME,
    PINS_JSON,
    REQUESTS_FRAME,
    SERVERS_FRAME,
    UNIT_KINDS,
    UNITS,
    WEIGHTS_JSON,
    WORKLOAD_JSON,
    CrossData,
    load,
)
from specbook.experiments.cross_engine.params import (
    OFF_LANE,
    SIDES,
    SPEC_BENCH_DEPRECATED,
    CostSplitSpec,
    CrossEngineParams,
    EqualWorkSpec,
    LaneSpec,
    PromptSpec,
    SideSpec,
    TracesSpec,
)
from specbook.experiments.cross_engine.tables import (
    SHORT_DIGEST,
    cost_split_table,
    definition_note,
    per_position,
    per_position_table,
    pins_table,
    prompts_note,
    setup_table,
    shown_source,
    timed_step_ms,
    weights_table,
    weights_view,
)
from specbook.experiments.registry import ExperimentSpec, register_experiment

register_experiment(ExperimentSpec("cross_engine", CrossEngineParams, "cross_engine.ipynb",
                                   collect=collect, load=load, analyze=analyze))

__all__ = [
    "CELLS_FRAME",
    "COLD_JSON",
    "COST_SPLIT_FRAME",
    "CostSplitSpec",
    "CrossData",
    "CrossEngineParams",
    "CrossResult",
    "EQUAL_WORK_FRAME",
    "EqualWorkCell",
    "EqualWorkSpec",
    "FAILED_FLAG",
    "GUARD_COLUMNS",
    "LaneSpec",
    "OFF_LANE",
    "PINS_JSON",
    "PROPOSALS_NOTE",
    "PromptSpec",
    "REPORT_COLUMNS",
    "REQUESTS_FRAME",
    "SERVERS_FRAME",
    "SHORT_DIGEST",
    "SIDES",
    "SPEC_BENCH_DEPRECATED",
    "SideSpec",
    "TracesSpec",
    "UNITS",
    "UNIT_KINDS",
    "WEIGHTS_JSON",
    "WORKLOAD_JSON",
    "acceptance_table",
    "analyze",
    "build_request",
    "category_of",
    "cell_guards",
    "cell_table",
    "check_all_pins",
    "collect",
    "cost_split_table",
    "cross_answer",
    "definition_note",
    "equal_work_cells",
    "equal_work_headline",
    "equal_work_plan",
    "failures_line",
    "flagged_count",
    "flagged_reasons",
    "headline",
    "lane_config",
    "load",
    "load_tokenizer",
    "measure_cell",
    "per_position",
    "per_position_table",
    "pins_table",
    "prompt_texts",
    "prompts_note",
    "ratio_of_means_ci",
    "repeats_line",
    "request_failure_table",
    "setup_table",
    "shown_source",
    "timed_step_ms",
    "token_ids",
    "usable_cells",
    "user_text",
    "weights_table",
    "weights_view",
    "with_rates",
]
