"""A contrast of arm means (e.g. variant - baseline) with its t interval: paired by sweep where every sweep has
one run of each arm, else Welch on run means, saying why not paired."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbook.core.errors import ExperimentError
from specbook.core.stats.intervals import paired_t_interval, welch_t_interval
from specbook.core.stats.labels import WELCH_METHOD, paired_method
from specbook.core.stats.summaries import DEFAULT_CI, check_columns, summarize


@dataclass(frozen=True)
class ContrastInterval:
    """A contrast of arm means (e.g. variant - baseline) with its t interval and two-sided p for 0.

    `method` says how the interval was made (paired t over N sweeps, or Welch t on run means and why not
    paired), or why there is none (an arm with one sweep) or why it is the point itself (no spread in
    any arm: t is undefined and the runs are deterministic). `paired` is True for the paired t.
    """

    estimate: float
    se: float
    df: float
    ci: float
    low: float
    high: float
    p: float
    method: str
    paired: bool = False


def welch_contrast(groups: Sequence[np.ndarray], coefs: Sequence[float], ci: float = DEFAULT_CI) -> ContrastInterval:
    """Welch t interval of sum(c_i mean(group_i)) and its two-sided p against 0."""
    from scipy import stats as sps

    if not 0 < ci < 1:
        raise ExperimentError(f"ci must be in (0, 1), got {ci}")
    summaries = [summarize(g) for g in groups]
    est = float(sum(c * s.mean for c, s in zip(coefs, summaries, strict=True)))
    if any(s.n < 2 for s in summaries):
        return ContrastInterval(est, math.nan, math.nan, ci, math.nan, math.nan, math.nan,
                                "no interval: an arm has 1 sweep, so its run-to-run sd is unknown")
    if all(s.deterministic for s in summaries):
        return ContrastInterval(est, 0.0, math.nan, ci, est, est, math.nan,
                                "no interval needed: every arm repeats exactly (sd = 0), the point is exact")
    means = np.array([s.mean for s in summaries])
    variances = np.array([s.sd**2 for s in summaries])
    ns = np.array([s.n for s in summaries])
    e, se, df, lo, hi = (float(x) for x in welch_t_interval(means, variances, ns, coefs, ci))
    p = float(2 * sps.t.sf(abs(e) / se, df))
    return ContrastInterval(e, se, df, ci, lo, hi, p, WELCH_METHOD)


def welch_delta(baseline: np.ndarray, variant: np.ndarray, ci: float = DEFAULT_CI) -> ContrastInterval:
    """mean(variant) - mean(baseline) with its Welch t interval."""
    return welch_contrast([baseline, variant], [-1.0, 1.0], ci)


def welch_p(baseline: np.ndarray, variant: np.ndarray) -> float:
    """Two-sided Welch t-test p for a difference of means (NaN when undefined: n < 2 or zero spread)."""
    return welch_delta(baseline, variant).p


def sweep_blocks(df: pd.DataFrame, arm_col: str, value_col: str, sweep_col: str,
                 arms: Sequence[str]) -> tuple[np.ndarray | None, str]:
    """The runs of `arms` as a (sweeps, arms) matrix in sweep order, when every sweep that ran any of them
    has exactly one valued run of each; else (None, why not) - a failed or excluded run unbalances its sweep.
    """
    check_columns(df, [arm_col, value_col, sweep_col])
    part = df[df[arm_col].isin(list(arms))]
    counts = part.groupby([sweep_col, arm_col]).size().unstack(fill_value=0).reindex(columns=list(arms),
                                                                                     fill_value=0)
    missing = [f"sweep {s} lacks {', '.join(repr(a) for a in arms if counts.loc[s, a] == 0)}"
               for s in counts.index if (counts.loc[s] == 0).any()]
    repeated = [f"sweep {s} has {int(counts.loc[s, a])} runs of {a!r}"
                for s in counts.index for a in arms if counts.loc[s, a] > 1]
    if missing or repeated:
        return None, "sweeps unbalanced: " + "; ".join(missing + repeated)
    wide = part.pivot(index=sweep_col, columns=arm_col, values=value_col).sort_index()
    return wide[list(arms)].to_numpy(float), ""


def paired_contrast(blocks: np.ndarray, coefs: Sequence[float], ci: float = DEFAULT_CI) -> ContrastInterval:
    """sum(c_i arm_i) per sweep (rows of `blocks`, one column per arm), its mean and paired t interval.

    Falls back to Welch on the columns (saying so) when the paired interval does not exist: one sweep, or
    per-sweep contrasts that are all equal while the arms themselves vary (paired sd 0, t undefined).
    """
    from scipy import stats as sps

    if not 0 < ci < 1:
        raise ExperimentError(f"ci must be in (0, 1), got {ci}")
    b = np.asarray(blocks, float)
    cols = [b[:, j] for j in range(b.shape[1])]
    n = b.shape[0]
    if n < 2:
        return welch_contrast(cols, coefs, ci)
    d = b @ np.asarray(coefs, float)
    s = summarize(d, what="per-sweep contrast")
    if s.deterministic:
        w = welch_contrast(cols, coefs, ci)
        if w.se == 0 or math.isnan(w.se):
            return w
        return ContrastInterval(w.estimate, w.se, w.df, ci, w.low, w.high, w.p,
                                f"{WELCH_METHOD}; not paired: the {n} per-sweep contrasts are all equal (paired sd 0)")
    e, se, df, lo, hi = (float(x) for x in paired_t_interval(d, ci))
    p = float(2 * sps.t.sf(abs(e) / se, df))
    return ContrastInterval(e, se, df, ci, lo, hi, p, paired_method(n), paired=True)


def contrast_of(per_arm: dict[str, np.ndarray], blocks: np.ndarray | None, why_not_paired: str,
                arms: Sequence[str], coefs: Sequence[float], ci: float) -> ContrastInterval:
    """The paired interval when `blocks` pair the arms by sweep, else Welch on the arms' runs, saying why."""
    if blocks is not None:
        return paired_contrast(blocks, coefs, ci)
    w = welch_contrast([per_arm[a] for a in arms], coefs, ci)
    if why_not_paired and w.method == WELCH_METHOD:
        return ContrastInterval(w.estimate, w.se, w.df, w.ci, w.low, w.high, w.p,
                                f"{WELCH_METHOD}; not paired: {why_not_paired}")
    return w
