"""What a config-flip run folder holds: its frames and flip.json, its units of work, and `load` reading them back.

Frames (data/*.parquet; every row carries `arm` and `kind`, the resume unit's key):
    arms             one row per finished unit: a measured arm's counter deltas, elapsed, server facts; a trace or
                     profiled pass's done row (appended last, `server` naming the unit's server)
    requests         one row per (arm, prompt) of the measured windows
    intervals        SpecDecoding log intervals of the measured windows (may be empty)
    trace_*          the trace passes (specbook.traces.tables.FRAMES)
    cost_split       the profiled passes' splits (specbook.measure.costsplit.splits_frame rows)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from specbook.core.acceptance import ACCEPTED, upgrade_position_columns
from specbook.engines import upgrade_log_frame
from specbook.store.runstore import RunContext
from specbook.store.units import Units, register_units
from specbook.traces import tables as trace_tables

FLIP_DIRNAME = "flip"  # the arms' folders, under the run folder
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


@dataclass
class FlipData:
    """What one config-flip run measured (all raw; the analysis functions derive the rest)."""

    flip: dict[str, Any]  # flip.json: folders, values, the proven diffs, original value (any JSON value)
    arms: pd.DataFrame  # one row per measured arm: counter deltas, elapsed, server facts
    requests: pd.DataFrame  # one row per (arm, prompt)
    intervals: pd.DataFrame  # SpecDecoding log intervals per arm (may be empty)
    # optional passes (params traces / cost_split), keyed by arm; empty in runs without them
    trace_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_requests: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_passes: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_reference: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost_split: pd.DataFrame = field(default_factory=pd.DataFrame)


def keyed(frame: pd.DataFrame, arm: str, kind: str) -> pd.DataFrame:
    """`frame` with the unit's key (arm, kind) as its first columns."""
    out = frame.copy()
    out.insert(0, "arm", arm)
    out.insert(1, "kind", kind)
    return out


def load(ctx: RunContext) -> FlipData:
    """Read back what collect saved (reuse_data / `specbook render`); frames of older runs are upgraded."""

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
