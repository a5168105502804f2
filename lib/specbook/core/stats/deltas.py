"""Each variant arm's delta vs the baseline: the difference of means, its interval, equivalence and difference
tests, as one table row per variant."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbook.core.errors import ExperimentError
from specbook.core.stats.contrasts import ContrastInterval, contrast_of, sweep_blocks, welch_delta
from specbook.core.stats.equivalence import paired_tost_p, tost_of
from specbook.core.stats.labels import pct
from specbook.core.stats.summaries import DEFAULT_CI, ArmSummary, arm_values, summarize


@dataclass(frozen=True)
class _Baseline:
    """The baseline arm's runs and the equivalence margin they set."""

    arm: str
    values: np.ndarray
    summary: ArmSummary
    margin_pct: float
    margin_abs: float  # margin_pct of |baseline mean|


@dataclass(frozen=True)
class _Variant:
    """One variant arm's runs and its contrast with the baseline (`blocks`: its sweep pairing, if any)."""

    arm: str
    values: np.ndarray
    summary: ArmSummary
    contrast: ContrastInterval
    blocks: np.ndarray | None


def delta_vs_baseline(
    df: pd.DataFrame,
    arm_col: str,
    value_col: str,
    baseline: str,
    *,
    margin_pct: float = 1.0,
    ci: float = DEFAULT_CI,
    sweep_col: str | None = None,
) -> pd.DataFrame:
    """One row per variant arm: its delta vs the baseline, in absolute, %, and baseline-sd units,
    the t interval of the delta (`ci_method` names it, `ci_df` its df), the TOST p for equivalence
    within +/-margin_pct % of the baseline mean and the p for a difference (`p_difference`), all by
    that method; `welch_p` is the Welch p whatever the method.

    sweep_col: pair the runs by sweep (the knob A/B). Where every sweep has one run of both arms the
    method is the paired t over the per-sweep differences (`paired` True); else Welch on run means and
    `ci_method` says why not paired. The baseline sd of `delta_over_baseline_sd` is its run-to-run sd
    either way.
    """
    if margin_pct <= 0:
        raise ExperimentError(f"margin_pct must be > 0, got {margin_pct}")
    if not 0 < ci < 1:
        raise ExperimentError(f"ci must be in (0, 1), got {ci}")
    per_arm = arm_values(df, arm_col, value_col)
    base = _baseline_of(per_arm, baseline, arm_col, margin_pct)
    rows = []
    for arm, vals in ((a, v) for a, v in per_arm.items() if a != baseline):
        var = _variant_of(df, arm_col, value_col, sweep_col, per_arm, base, arm, vals, ci)
        rows.append(_means_fields(base, var) | _interval_fields(base, var, ci) | _test_fields(base, var, ci))
    return pd.DataFrame(rows)


def _baseline_of(per_arm: dict[str, np.ndarray], baseline: str, arm_col: str, margin_pct: float) -> _Baseline:
    if baseline not in per_arm:
        raise ExperimentError(f"baseline arm {baseline!r} not in column {arm_col!r}; arms: {list(per_arm)}")
    values = per_arm[baseline]
    summary = summarize(values)
    return _Baseline(baseline, values, summary, margin_pct, abs(summary.mean) * margin_pct / 100.0)


def _variant_of(df: pd.DataFrame, arm_col: str, value_col: str, sweep_col: str | None,
                per_arm: dict[str, np.ndarray], base: _Baseline, arm: str, values: np.ndarray,
                ci: float) -> _Variant:
    """The variant's summary and its contrast with the baseline, paired by sweep where `sweep_col` allows."""
    summary = summarize(values)
    blocks, why = (sweep_blocks(df, arm_col, value_col, sweep_col, [base.arm, arm]) if sweep_col
                   else (None, ""))
    contrast = contrast_of(per_arm, blocks, why, [base.arm, arm], [-1.0, 1.0], ci)
    return _Variant(arm, values, summary, contrast, blocks)


def _sd_ratio(delta: float, base: ArmSummary) -> tuple[float, str]:
    """delta / baseline sd, with the cases where that ratio does not exist spelled out."""
    if base.single_sweep:
        return math.nan, "baseline has 1 sweep: its sd is unknown"
    if base.deterministic:
        if delta == 0:
            return math.nan, "baseline sd = 0 and delta = 0: no noise and no change"
        return math.copysign(math.inf, delta), "baseline sd = 0: any change is outside its (zero) noise"
    return delta / base.sd, ""


def _means_fields(base: _Baseline, var: _Variant) -> dict[str, object]:
    """The arms' means and sds and the delta in absolute, % and baseline-sd units."""
    b, v = base.summary, var.summary
    delta = v.mean - b.mean
    ratio, ratio_note = _sd_ratio(delta, b)
    return {
        "arm": var.arm,
        "baseline": base.arm,
        "n_baseline": b.n,
        "n_variant": v.n,
        "baseline_mean": b.mean,
        "baseline_sd": b.sd,
        "variant_mean": v.mean,
        "variant_sd": v.sd,
        "delta_abs": delta,
        "delta_pct": pct(delta, b.mean),
        "delta_over_baseline_sd": ratio,
        "sd_ratio_note": ratio_note,
    }


def _interval_fields(base: _Baseline, var: _Variant, ci: float) -> dict[str, object]:
    """The delta's t interval, absolute and as % of the baseline mean, with its method."""
    w, mean = var.contrast, base.summary.mean
    return {
        "ci": ci,
        "ci_low": w.low,
        "ci_high": w.high,
        "ci_low_pct": pct(w.low, mean),
        "ci_high_pct": pct(w.high, mean),
        "ci_method": w.method,
        "paired": w.paired,
        "ci_df": w.df,
        "delta_se": w.se,
    }


def _test_fields(base: _Baseline, var: _Variant, ci: float) -> dict[str, object]:
    """The TOST for equivalence within the margin (paired on the relative margin when the contrast is paired:
    paired_tost_t) and the p for a difference, by the contrast's method and by Welch."""
    w = var.contrast
    tost_p, tost_status = tost_of(w, base.margin_abs)
    if w.paired and var.blocks is not None:
        tost_p = paired_tost_p(var.blocks, base.margin_pct / 100.0)
    return {
        "margin_pct": base.margin_pct,
        "margin_abs": base.margin_abs,
        "tost_p": tost_p,
        "tost_status": tost_status,
        "deterministic": base.summary.deterministic and var.summary.deterministic,
        "p_difference": w.p,
        "welch_p": w.p if not w.paired else welch_delta(base.values, var.values, ci).p,
    }
