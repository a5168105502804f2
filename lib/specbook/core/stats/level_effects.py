"""The paired effects' model over levels (e.g. the concurrency curve's level x arm design): the overall effect, the
level F test and the log2 trend, one sweep a block."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specbook.core.errors import ExperimentError
from specbook.core.stats.summaries import DEFAULT_CI


@dataclass(frozen=True)
class LevelEffects:
    """One model of paired effects over levels: rows are sweep blocks, columns levels (e.g. concurrency).

    d[s, l] = variant - baseline in sweep s at level l, modelled as mu_l + b_s + e_sl: the levels a fixed factor,
    the sweep a block (one server per arm and sweep serves every level, so its server-to-server difference b_s
    is shared by that sweep's levels), e_sl the within-server noise. Balanced, so the mixed model with b_s
    random and the randomized-block ANOVA agree:
    - the overall effect (mean of mu_l) has the block means' t interval, df n_blocks - 1 (a sweep is the
      unit of replication);
    - whether the effect depends on the level: F = MS_level / MS_residual on (L - 1, (n - 1)(L - 1)) df;
    - its log-linear trend, the change of the effect per doubling of the level (a contrast of the level
      means, free of b_s), with the t interval on the residual's df; `span` doublings from the lowest level
      to the highest.
    """

    levels: tuple[float, ...]
    n_blocks: int
    level_means: tuple[float, ...]
    overall: float
    overall_se: float
    overall_df: float
    overall_low: float
    overall_high: float
    f: float
    f_df: tuple[float, float]
    p_level: float
    trend: float  # change of the effect per doubling of the level
    trend_se: float
    trend_df: float
    trend_low: float
    trend_high: float
    span: float  # doublings from the lowest level to the highest
    ci: float
    dropped_blocks: int = 0  # sweeps left out for a missing level


def effect_by_level(differences: np.ndarray, levels: Sequence[float], ci: float = DEFAULT_CI) -> LevelEffects:
    """The paired effects' model over levels (LevelEffects); blocks (rows) with a missing level are left out."""
    from scipy import stats as sps

    if not 0 < ci < 1:
        raise ExperimentError(f"ci must be in (0, 1), got {ci}")
    d = np.asarray(differences, float)
    lv = np.asarray(levels, float)
    if d.ndim != 2 or d.shape[1] != lv.size or lv.size == 0:
        raise ExperimentError(f"need a (sweeps, levels) matrix with {lv.size} level columns, got shape {d.shape}")
    whole = np.all(np.isfinite(d), axis=1)
    dropped = int((~whole).sum())
    d = d[whole]
    n, k = d.shape
    nan = math.nan
    grand = float(d.mean()) if n else nan
    level_means = tuple(float(x) for x in d.mean(0)) if n else tuple(nan for _ in lv)
    q = 0.5 + ci / 2
    overall_se = overall_df = overall_low = overall_high = nan
    if n >= 2:
        blocks = d.mean(1)
        overall_se = float(blocks.std(ddof=1) / math.sqrt(n))
        overall_df = float(n - 1)
        half = float(sps.t.ppf(q, overall_df)) * overall_se
        overall_low, overall_high = grand - half, grand + half
    f = p_level = trend_se = trend_low = trend_high = nan
    f_df = (float(k - 1), float((n - 1) * (k - 1)))
    x = np.log2(lv)
    c = x - x.mean()
    trend = float(np.dot(c, level_means) / np.dot(c, c)) if n and k >= 2 and np.dot(c, c) > 0 else nan
    if n >= 2 and k >= 2:
        resid = d - d.mean(1, keepdims=True) - d.mean(0, keepdims=True) + grand
        ms_res = float((resid**2).sum() / f_df[1])
        ms_level = float(n * ((np.asarray(level_means) - grand) ** 2).sum() / f_df[0])
        if ms_res > 0:
            f = ms_level / ms_res
            p_level = float(sps.f.sf(f, *f_df))
        if np.dot(c, c) > 0:
            trend_se = math.sqrt(ms_res / n / float(np.dot(c, c)))
            half = float(sps.t.ppf(q, f_df[1])) * trend_se
            trend_low, trend_high = trend - half, trend + half
    return LevelEffects(tuple(float(v) for v in lv), n, level_means, grand, overall_se, overall_df, overall_low,
                        overall_high, f, f_df, p_level, trend, trend_se, f_df[1], trend_low, trend_high,
                        float(x.max() - x.min()) if k else nan, ci, dropped)
