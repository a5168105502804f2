"""Steady-state windows on per-interval spec-decoding stats (one row per `SpecDecoding metrics` line).

Steady state is defined by LOAD (how many requests the server was running), never by the outcome
(acceptance length): a window chosen by looking at AL would bias the AL it is meant to measure.
AL over a window is always token-weighted, 1 + sum(accepted) / sum(drafts), never a mean of
per-interval ALs (an interval with 3 drafts would weigh as much as one with 3000).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbook.core.acceptance import frame_al
from specbook.core.errors import ExperimentError

REQUIRED_COLUMNS = (
    "timestamp",
    "al",
    "accepted_tokens",
    "draft_tokens",
    "drafts",
    "running",
)
DEFAULT_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class SteadyResult:
    """What a cut kept, what it dropped (with a `reason` per interval) and the counts per run."""

    kept: pd.DataFrame
    dropped: pd.DataFrame
    counts: pd.DataFrame
    rule: str


def has_interval_columns(frame: pd.DataFrame) -> bool:
    """Whether `frame` holds per-interval stats (vLLM's log) rather than per-request records (llama.cpp's)."""
    return all(c in frame.columns for c in REQUIRED_COLUMNS)


def empty_intervals() -> pd.DataFrame:
    """An interval frame with no rows: what a cut sees for an engine that prints no stats intervals."""
    return pd.DataFrame({"timestamp": pd.Series(dtype="datetime64[ns, UTC]"),
                         **{c: pd.Series(dtype=float) for c in REQUIRED_COLUMNS if c != "timestamp"}})


def _check(frame: pd.DataFrame, run_col: str, extra: Sequence[str] = ()) -> None:
    missing = [c for c in (run_col, *REQUIRED_COLUMNS, *extra) if c not in frame.columns]
    if missing:
        raise ExperimentError(
            f"interval frame lacks column(s) {missing} (expected engines.vllm.logparse.intervals_frame columns "
            f"plus {run_col!r}); it has {list(frame.columns)}"
        )


def _fmt(x: float) -> str:
    return f"{x:g}"


def weighted_al(frame: pd.DataFrame) -> float:
    """1 + sum(accepted_tokens) / sum(drafts) over the rows (the acceptance model); NaN without drafts."""
    try:
        return frame_al(frame)
    except KeyError as exc:
        raise ExperimentError(str(exc.args[0])) from None


def al_by(frame: pd.DataFrame, by: str | Sequence[str]) -> pd.DataFrame:
    """Token-weighted AL per group, with the intervals and token sums behind it."""
    keys = [by] if isinstance(by, str) else list(by)
    rows = []
    for key, part in frame.groupby(keys, sort=False, dropna=False):
        key_t = key if isinstance(key, tuple) else (key,)
        rows.append(
            {
                **dict(zip(keys, key_t, strict=True)),
                "al": weighted_al(part),
                "intervals": len(part),
                "accepted_tokens": int(part["accepted_tokens"].sum()),
                "draft_tokens": int(part["draft_tokens"].sum()),
                "drafts": int(part["drafts"].sum()),
            }
        )
    return pd.DataFrame(
        rows, columns=[*keys, "al", "intervals", "accepted_tokens", "draft_tokens", "drafts"]
    )


def steady_state_filter(
    frame: pd.DataFrame,
    target_concurrency: int,
    min_running_fraction: float = 0.75,
    *,
    run_col: str = "run_id",
) -> SteadyResult:
    """Keep the intervals where running >= min_running_fraction * target_concurrency.

    Dropped intervals get a reason: "warm-up" before a run's first steady interval, "drain" after its
    last, "dip" in between; a run with no steady interval at all is dropped as "never steady".
    An interval whose running count is unknown (no Engine stats line) is never steady.
    """
    _check(frame, run_col)
    if target_concurrency < 1:
        raise ExperimentError(f"target_concurrency must be >= 1, got {target_concurrency}")
    if not 0 <= min_running_fraction <= 1:
        raise ExperimentError(f"min_running_fraction must be in [0, 1], got {min_running_fraction}")
    threshold = min_running_fraction * target_concurrency
    rule = f"running >= {_fmt(min_running_fraction)}*{target_concurrency} = {_fmt(threshold)}"
    cmp = f"< {_fmt(min_running_fraction)}*{target_concurrency}"
    frame = frame.sort_values([run_col, "timestamp"], kind="stable")
    kept_parts, dropped_parts, counts = [], [], []
    for run_id, run in frame.groupby(run_col, sort=False):
        running = run["running"].to_numpy(
            dtype=float, na_value=np.nan
        )  # Int64 with <NA> from intervals_frame
        # A zero cut keeps everything, including intervals whose load is unknown.
        steady = np.ones(len(run), bool) if threshold <= 0 else (running >= threshold)
        reasons = np.array([""] * len(run), dtype=object)
        pos = np.flatnonzero(steady)
        first, last = (pos[0], pos[-1]) if pos.size else (len(run), -1)
        for i in np.flatnonzero(~steady):
            what = (
                "no running count (no Engine stats line)"
                if np.isnan(running[i])
                else f"running {running[i]:g} {cmp}"
            )
            if not pos.size:
                phase = "never steady"
            elif i < first:
                phase = "warm-up"
            elif i > last:
                phase = "drain"
            else:
                phase = "dip"
            reasons[i] = f"{phase}: {what}"
        kept_parts.append(run[steady])
        dropped_parts.append(run[~steady].assign(reason=reasons[~steady]))
        phases = pd.Series([r.split(":", 1)[0] for r in reasons[~steady]], dtype=object)
        counts.append(
            {
                run_col: run_id,
                "intervals": len(run),
                "kept": int(steady.sum()),
                "warm_up": int((phases == "warm-up").sum()),
                "dip": int((phases == "dip").sum()),
                "drain": int((phases == "drain").sum()),
                "never_steady": int((phases == "never steady").sum()),
                "threshold": threshold,
                "al_all": weighted_al(run),
                "al_kept": weighted_al(run[steady]),
            }
        )
    kept = pd.concat(kept_parts) if kept_parts else frame.iloc[0:0]
    dropped = (
        pd.concat(dropped_parts) if dropped_parts else frame.iloc[0:0].assign(reason=pd.Series(dtype=object))
    )
    columns = [run_col, "intervals", "kept", "warm_up", "dip", "drain", "never_steady", "threshold", "al_all",
               "al_kept"]
    return SteadyResult(kept=kept, dropped=dropped, counts=pd.DataFrame(counts, columns=columns), rule=rule)


def cut_sensitivity(
    frame: pd.DataFrame,
    target_concurrency: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    *,
    run_col: str = "run_id",
    arm_col: str | None = "arm",
) -> pd.DataFrame:
    """AL per run (and per arm, if arm_col is in the frame) as the load cut moves.

    Rows: fraction, scope ("run" or "arm"), the run or arm, al, intervals kept / total.
    Arm AL is the mean of its runs' ALs (sweeps are the replicates); al_pooled weighs all its tokens.
    """
    _check(frame, run_col)
    use_arm = arm_col is not None and arm_col in frame.columns
    rows = []
    for frac in fractions:
        res = steady_state_filter(frame, target_concurrency, frac, run_col=run_col)
        totals = res.counts.set_index(run_col)["intervals"]
        per_run = res.counts[[run_col, "al_kept", "kept", "intervals"]]
        for r in per_run.itertuples(index=False):
            run_id, al, kept, total = r
            arm = frame.loc[frame[run_col] == run_id, arm_col].iloc[0] if use_arm else None
            rows.append(
                {
                    "fraction": frac,
                    "threshold": frac * target_concurrency,
                    "scope": "run",
                    run_col: run_id,
                    "arm": arm,
                    "al": al,
                    "al_pooled": al,
                    "intervals_kept": kept,
                    "intervals_total": total,
                }
            )
        if use_arm and len(per_run):
            run_rows = pd.DataFrame([x for x in rows if x["fraction"] == frac and x["scope"] == "run"])
            for arm, part in run_rows.groupby("arm", sort=False):
                kept_arm = res.kept[res.kept[arm_col] == arm]
                rows.append(
                    {
                        "fraction": frac,
                        "threshold": frac * target_concurrency,
                        "scope": "arm",
                        run_col: None,
                        "arm": arm,
                        "al": float(part["al"].mean()),
                        "al_pooled": weighted_al(kept_arm),
                        "intervals_kept": int(part["intervals_kept"].sum()),
                        "intervals_total": int(totals[part[run_col]].sum()),
                    }
                )
    columns = ["fraction", "threshold", "scope", run_col, "arm", "al", "al_pooled", "intervals_kept",
               "intervals_total"]
    return pd.DataFrame(rows, columns=columns)


def crude_al_threshold_cut(
    frame: pd.DataFrame, al_threshold: float, *, run_col: str = "run_id"
) -> SteadyResult:
    """The cut NOT to use: drop intervals whose own AL is above a threshold. Kept here so the book can
    show what it does (see explain_crude_cut_bias); never use it to choose the data you report.
    """
    _check(frame, run_col)
    high = frame["al"].to_numpy(dtype=float, na_value=np.nan) > al_threshold
    kept = frame[~high]
    dropped = frame[high].assign(
        reason=[f"crude: AL {al:g} > {al_threshold:g}" for al in frame.loc[high, "al"]]
    )
    counts = []
    for run_id, run in frame.groupby(run_col, sort=False):
        run_high = run["al"].to_numpy(dtype=float, na_value=np.nan) > al_threshold
        counts.append(
            {
                run_col: run_id,
                "intervals": len(run),
                "kept": int((~run_high).sum()),
                "dropped_high_al": int(run_high.sum()),
                "al_all": weighted_al(run),
                "al_kept": weighted_al(run[~run_high]),
            }
        )
    columns = [run_col, "intervals", "kept", "dropped_high_al", "al_all", "al_kept"]
    return SteadyResult(
        kept=kept, dropped=dropped, counts=pd.DataFrame(counts, columns=columns), rule=f"AL <= {al_threshold:g}"
    )


def explain_crude_cut_bias() -> str:
    """Why "drop intervals with AL above a threshold" biases AL downward (plain text for the report)."""
    return (
        "Dropping intervals whose AL is above a threshold selects on the dependent variable. "
        "Each interval's AL is a noisy estimate of the server's true AL: some intervals land above it, "
        "some below, by chance. Removing only the high tail, conditionally on the outcome, leaves the "
        "low tail in place, so the AL of what remains is lower than the true AL, and by an amount that "
        "depends on the noise, not on the knob. High-AL intervals are not warm-up artefacts: warm-up "
        "and drain are defined by load (how many requests were running), which is known before looking "
        "at AL, so a load cut removes intervals for a reason independent of their AL and leaves the "
        "estimate unbiased. Two arms with different noise would also be biased by different amounts, "
        "turning the cut itself into an apparent effect."
    )
