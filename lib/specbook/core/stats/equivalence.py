"""Equivalence tests (TOST): is the variant within a margin of the baseline? Welch on run means, or paired by
sweep on a margin relative to the baseline's mean."""

from __future__ import annotations

import math

import numpy as np

from specbook.core.stats.contrasts import ContrastInterval, welch_delta


def paired_tost_t(baseline: np.ndarray, variant: np.ndarray, margin_frac: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The TOST's two t statistics, paired by sweep, for the margin +/- margin_frac x |baseline mean|:
    (t_lower, t_upper, df), each large when the variant is inside its side of the margin.

    The margin is relative to the baseline's mean, so the hypotheses are mu_v - mu_b > -m |mu_b| and
    < +m |mu_b|: each is a mean of per-sweep contrasts v_s - (1 -/+ m) b_s (sign of b's mean folded in),
    tested by the paired t, exact under normal noise whatever the sweep effect. Using the estimated
    baseline mean times m as a fixed margin instead would not be: when sweeps move the arms together,
    that estimate moves with them by about as much as the paired difference's standard error.
    Sweeps on the last axis; leading axes are replications.
    """
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    n = b.shape[-1]
    m = margin_frac * np.sign(b.mean(-1, keepdims=True))
    lower = v - (1 - m) * b  # > 0 on average iff mu_v > mu_b - m |mu_b|
    upper = (1 + m) * b - v  # > 0 on average iff mu_v < mu_b + m |mu_b|
    with np.errstate(divide="ignore", invalid="ignore"):
        t_lower = lower.mean(-1) / (lower.std(-1, ddof=1) / math.sqrt(n))
        t_upper = upper.mean(-1) / (upper.std(-1, ddof=1) / math.sqrt(n))
    return t_lower, t_upper, np.full_like(t_lower, n - 1.0)


def paired_tost_p(blocks: np.ndarray, margin_frac: float) -> float:
    """The paired TOST p (the larger one-sided p of paired_tost_t) for (sweeps, [baseline, variant]) blocks."""
    from scipy import stats as sps

    t_lower, t_upper, tdf = paired_tost_t(blocks[:, 0], blocks[:, 1], margin_frac)
    return float(max(sps.t.sf(t_lower, tdf), sps.t.sf(t_upper, tdf)))


def tost_of(w: ContrastInterval, margin_abs: float) -> tuple[float, str]:
    """TOST p that |true contrast| < margin_abs from a contrast's estimate, se and df (its own method).

    Returns (p, status): "ok", "deterministic" (no spread: t undefined, the margin alone decides) or
    "too few sweeps" (an arm has n < 2).
    """
    from scipy import stats as sps

    if math.isnan(w.se):
        return math.nan, "too few sweeps"
    if w.se == 0:
        return math.nan, "deterministic"
    p_low = sps.t.sf((w.estimate + margin_abs) / w.se, w.df)
    p_high = sps.t.cdf((w.estimate - margin_abs) / w.se, w.df)
    return float(max(p_low, p_high)), "ok"


def tost_equivalence(baseline: np.ndarray, variant: np.ndarray, margin_abs: float) -> tuple[float, str]:
    """Welch TOST p that |mean(variant) - mean(baseline)| < margin_abs: the larger of the two one-sided p.

    Returns (p, status): status "ok", "deterministic" (both arms have zero spread: t is undefined, so
    p is NaN and the margin alone decides) or "too few sweeps" (an arm has n < 2).
    """
    return tost_of(welch_delta(baseline, variant), margin_abs)
