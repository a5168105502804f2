"""Interval arithmetic on arrays and values: Welch and paired t, the t interval of a mean, Fieller's ratio of
means, Wilson's interval of a proportion.

The array functions work along the last axis, so the coverage simulation passes thousands of replications at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from specbook.core.stats.summaries import DEFAULT_CI, summarize


def welch_df(variances_of_means: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """Welch-Satterthwaite df of a sum of independent variances of means v_i = c_i^2 s_i^2 / n_i.

    Works along the last axis (arrays of replications in the coverage simulation); terms with v_i = 0
    carry no uncertainty and drop out; NaN where every term is 0.
    """
    v = np.asarray(variances_of_means, float)
    n = np.asarray(ns, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        den = np.sum(np.where(v > 0, v**2 / (n - 1), 0.0), axis=-1)
        return np.where(den > 0, np.sum(v, axis=-1) ** 2 / den, np.nan)


def welch_t_interval(
    means: np.ndarray, variances: np.ndarray, ns: np.ndarray, coefs: Sequence[float], ci: float = DEFAULT_CI
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """sum(c_i mean_i) with its Welch t interval: (estimate, se, df, low, high), along the last axis.

    means, variances (sample, ddof=1), ns: one entry per arm on the last axis; any leading axes are
    replications (the coverage simulation passes thousands at once).
    """
    from scipy import stats as sps

    c = np.asarray(coefs, float)
    est = np.sum(c * np.asarray(means, float), axis=-1)
    vm = c**2 * np.asarray(variances, float) / np.asarray(ns, float)
    se = np.sqrt(np.sum(vm, axis=-1))
    df = welch_df(vm, ns)
    half = sps.t.ppf(0.5 + ci / 2, df) * se
    return est, se, df, est - half, est + half


def paired_t_interval(contrasts: np.ndarray, ci: float = DEFAULT_CI
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean of per-sweep contrasts with its Student t interval (df n - 1): (estimate, se, df, low, high).

    contrasts: sweeps on the last axis; leading axes are replications (the simulations pass thousands).
    """
    from scipy import stats as sps

    d = np.asarray(contrasts, float)
    n = d.shape[-1]
    est = d.mean(-1)
    se = d.std(-1, ddof=1) / math.sqrt(n)
    df = np.full_like(est, n - 1.0)
    half = sps.t.ppf(0.5 + ci / 2, df) * se
    return est, se, df, est - half, est + half


def mean_t_interval(values: Iterable[float], ci: float = DEFAULT_CI) -> tuple[float, float, float]:
    """mean with its Student t interval (df n - 1); NaN bounds with one value, the point with no spread."""
    from scipy import stats as sps

    s = summarize(values)
    if s.single_sweep:
        return s.mean, math.nan, math.nan
    half = float(sps.t.ppf(0.5 + ci / 2, s.n - 1)) * s.sem
    return s.mean, s.mean - half, s.mean + half


def ratio_of_means_interval(numerator: Iterable[float], denominator: Iterable[float],
                            ci: float = DEFAULT_CI, *, nonnegative: bool = False) -> tuple[float, float, float]:
    """mean(numerator) / mean(denominator) with Fieller's interval, Welch-Satterthwaite df.

    The set of ratios r with |mean_n - r mean_d| <= t * se(mean_n - r mean_d): exact for normal data
    when the df are; no finite interval (NaN bounds) when the denominator's mean is not clearly away
    from 0. nonnegative: both means are of quantities >= 0 (tok/s), so the ratio is too and the
    interval is cut at 0 (the true ratio is never below it, so the coverage is the same).
    """
    from scipy import stats as sps

    a, b = summarize(numerator, what="numerator"), summarize(denominator, what="denominator")
    if b.mean == 0:
        return math.nan, math.nan, math.nan
    point = a.mean / b.mean
    if a.single_sweep or b.single_sweep:
        return point, math.nan, math.nan
    va, vb = a.sem**2, b.sem**2
    if va == 0 and vb == 0:
        return point, point, point
    df = float(welch_df(np.array([va, point**2 * vb]), np.array([a.n, b.n])))
    t2 = float(sps.t.ppf(0.5 + ci / 2, df)) ** 2
    qa = b.mean**2 - t2 * vb  # r^2 qa - 2 r qb + qc <= 0
    qb = a.mean * b.mean
    qc = a.mean**2 - t2 * va
    disc = qb**2 - qa * qc
    if qa <= 0 or disc < 0:
        return point, math.nan, math.nan
    root = math.sqrt(disc)
    lo, hi = (qb - root) / qa, (qb + root) / qa
    return point, (max(lo, 0.0) if nonnegative else lo), hi


def wilson_ci(correct: int, total: int, ci: float = DEFAULT_CI) -> tuple[float, float]:
    """Wilson score interval of a proportion (statsmodels proportion_confint)."""
    from statsmodels.stats.proportion import proportion_confint

    if total <= 0:
        return math.nan, math.nan
    lo, hi = proportion_confint(correct, total, alpha=1 - ci, method="wilson")
    return float(lo), float(hi)
