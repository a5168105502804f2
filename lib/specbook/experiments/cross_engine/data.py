"""What a cross-engine run folder holds: the names of its frames and JSON documents, its units of work (registered
for resume), CrossData, and `load` reading them back (older runs' frames upgraded)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbook.core.acceptance import ACCEPTED, upgrade_position_columns
from specbook.experiments.cross_engine import traces as cet
from specbook.store.runstore import RunContext
from specbook.store.units import Units, register_units

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
# A unit of work is one side x lane x kind phase: kind "timed" (all its prompt cells), "trace" (the untimed
# trace pass), "profile" (the cost split's profiled pass), "equal_work" (diverged cells re-run on their common
# prefix). Its servers row (appended last, naming the server that served it: one server may serve several
# phases, specbook.experiments.cross_engine.phases) says it finished; runs saved before kinds existed are all
# "timed".
UNIT_KINDS = ("timed", "trace", "profile", "equal_work")
UNITS = register_units("cross_engine", Units(
    done_frame=SERVERS_FRAME, key=("side", "lane", "kind"),
    frames=(REQUESTS_FRAME, CELLS_FRAME, SERVERS_FRAME, *cet.FRAMES, COST_SPLIT_FRAME, EQUAL_WORK_FRAME),
    server="server", key_defaults={"kind": "timed"}))


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


# Cell columns as commit 5ece790 and earlier saved them.
_OLD_CELL_COLUMNS = {"accepted": ACCEPTED, "log_accepted": "log_accepted_tokens", "log_generated": "log_draft_tokens"}


def load(ctx: RunContext) -> CrossData:
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
