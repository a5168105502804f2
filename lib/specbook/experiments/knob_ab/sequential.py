"""The knob A/B's sequential design: after each complete sweep, stop or add one (`should_continue`).

The design itself (boundaries, looks, projections, operating characteristics) is `specbook.core.sequential`,
which other experiments and the verdict vocabulary read too; its names are re-exported here for older imports.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from specbook.core.errors import ExperimentError
from specbook.core.sequential import *  # noqa: F401,F403  (older imports read the design from here)
from specbook.core.sequential import SequentialState, decide_frame

if TYPE_CHECKING:
    from specbook.experiments.knob_ab.params import KnobABParams


def _run_values(runs: pd.DataFrame, params: KnobABParams, intervals: pd.DataFrame | None) -> tuple[pd.Series, str]:
    """Each run's AL by measurement.primary: steady-state log AL from `intervals`, else whole-run counters."""
    from specbook.core.acceptance import Acceptance
    from specbook.experiments.knob_ab import steady

    primary = params.measurement.primary
    if primary in runs:
        return runs[primary], primary
    if primary == "steady_log_al" and intervals is not None and len(intervals):
        st = steady.steady_state_filter(intervals, params.workload.concurrency,
                                        params.steady_state.min_running_fraction)
        return runs["run_id"].map(st.counts.set_index("run_id")["al_kept"]), primary
    if "counter_drafts" in runs:
        al = [Acceptance.from_row(r, "counter_").al if r.get("counter_drafts") else math.nan
              for _, r in runs.iterrows()]
        return pd.Series(al, index=runs.index), "counter_al"
    raise ExperimentError(f"runs frame has neither {primary!r}, log intervals, nor counter columns to take an AL from")


def should_continue(runs_frame: pd.DataFrame, params: KnobABParams, *,
                    intervals: pd.DataFrame | None = None) -> SequentialState:
    """After a complete sweep of a launched knob A/B: stop (a verdict, or sweeps_max) or add a sweep?

    runs_frame: the collection's runs frame (run_id, sweep, declared_arm or arm, status and the counter
    columns); intervals: its log intervals, for measurement.primary = steady_log_al (without them the
    whole-run counter AL stands in, and the state's value_col says so). Only runs with status ok count.
    """
    lo, hi = params.sweep_bounds()
    runs = runs_frame[runs_frame["status"] == "ok"] if "status" in runs_frame else runs_frame
    arm_col = "arm" if "arm" in runs else "declared_arm"
    values, value_col = _run_values(runs, params, intervals)
    per_run = pd.DataFrame({"arm": runs[arm_col].to_numpy(), "sweep": runs["sweep"].to_numpy(),
                            "al": values.to_numpy(dtype=float)})
    # every planned arm must appear, even before its first run, or a sweep would look complete too early
    planned = [a.name for a in params.arms()]
    missing = [a for a in planned if a not in set(per_run["arm"])]
    if missing:
        per_run = pd.concat([per_run, pd.DataFrame({"arm": missing, "sweep": -1, "al": math.nan})],
                            ignore_index=True)
    state = decide_frame(per_run, params.decision, lo, hi, value_col="al")
    return SequentialState(state.decision, state.sweeps, lo, hi, state.alpha, state.spending, state.margin_pct,
                           value_col, state.looks, state.notes, state.method)
