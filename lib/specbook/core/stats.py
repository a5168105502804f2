"""Statistics of an A/B experiment: per-arm summaries, deltas vs the baseline, equivalence, interaction.

The unit of replication is the sweep (one fresh server, one pass over the workload): every function
here takes one value per sweep, never per request or per log interval, because requests on one server
share that server's state and are not independent replicates.

Intervals are t intervals: people run 2-5 sweeps per arm, and a percentile bootstrap of 2-3 values per
arm covers far less than it claims (about 70% at 2 runs per arm for a nominal 95%); t intervals hold their
coverage there (tests/unit/test_interval_coverage.py). Two kinds:

- paired by sweep (the knob A/B's block design: within a sweep every arm serves the same question draw,
  interleaved in time, so most run-to-run variance is between sweeps, not between arms): the per-sweep
  contrasts d_s (variant_s - baseline_s, or the interaction's AB_s - B_s - A_s + base_s) and their
  Student t interval with n_sweeps - 1 df. Used when every sweep has exactly one run of every arm the
  contrast involves (`sweep_blocks`);
- Welch t on run means (Welch-Satterthwaite df): when no sweep pairing is given, or the sweeps are
  unbalanced (a failed or excluded run); the result's method then says why it is not paired.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from specbook.core.errors import ExperimentError

DEFAULT_CI = 0.95
# What every interval and test on run means here is; the reports print it beside the interval.
WELCH_METHOD = "Welch t on run means (Welch-Satterthwaite df)"
# The paired method in general; each result names its own sweeps (paired_method).
PAIRED_METHOD = "paired t on per-sweep differences (df n_sweeps - 1)"
# Sweeps whose sd is below this fraction of |mean| are treated as identical (float noise, not run noise).
DETERMINISTIC_REL_TOL = 1e-12


@dataclass(frozen=True)
class ArmSummary:
    """One arm's per-sweep values: n, mean, sample sd (ddof=1), standard error, range."""

    n: int
    mean: float
    sd: float
    sem: float
    min: float
    max: float
    # True when n == 1: sd and sem are reported as 0.0 but are really unknown.
    single_sweep: bool

    @property
    def deterministic(self) -> bool:
        """At least two sweeps and all equal: the arm shows no run-to-run noise at all."""
        return self.n >= 2 and self.sd <= DETERMINISTIC_REL_TOL * max(abs(self.mean), 1.0)

    def as_dict(self) -> dict[str, float | int | bool]:
        return {**asdict(self), "deterministic": self.deterministic}


@dataclass(frozen=True)
class InteractionResult:
    """2x2 factorial on arm means: does knob B stack on knob A as the sum of their effects predicts?"""

    baseline_mean: float
    effect_a: float
    effect_b: float
    effect_ab: float
    # (AB - B) - (A - base) = effect_ab - effect_a - effect_b: 0 when the effects add up.
    interaction: float
    # The AB mean that additivity predicts: base + effect_a + effect_b.
    additive_prediction: float
    ci_low: float
    ci_high: float
    ci: float
    df: float  # paired: n_sweeps - 1; else Welch-Satterthwaite df of the interaction contrast
    method: str
    n_per_arm: dict[str, int]
    arms: tuple[str, str, str, str] = ("A", "B", "A+B", "baseline")  # the arms of A, B, A+B and the baseline

    @property
    def interaction_pct(self) -> float:
        return _pct(self.interaction, self.baseline_mean)

    @property
    def ci_excludes_zero(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0

    def to_frame(self) -> pd.DataFrame:
        """One row per quantity, absolute and as % of the baseline mean, with the arms it is made of (A and B
        named); the CI rows name their method."""
        a, b, ab, base = self.arms
        interaction = f"({ab} - {b}) - ({a} - {base})"
        made_of = [f"{a} - {base}", f"{b} - {base}", f"{ab} - {base}", f"{base} + ({a} - {base}) + ({b} - {base})",
                   interaction, interaction, interaction]
        rows = [
            ("effect of A", self.effect_a),
            ("effect of B", self.effect_b),
            ("effect of A+B", self.effect_ab),
            ("A+B predicted if additive (mean)", self.additive_prediction),
            ("interaction (A+B - B) - (A - base)", self.interaction),
            (f"interaction {self.ci:.0%} CI low", self.ci_low),
            (f"interaction {self.ci:.0%} CI high", self.ci_high),
        ]
        return pd.DataFrame(
            {
                "quantity": [r[0] for r in rows],
                "arms": made_of,
                "value": [r[1] for r in rows],
                "pct_of_baseline": [
                    math.nan if r[0].startswith("A+B predicted") else _pct(r[1], self.baseline_mean)
                    for r in rows
                ],
                "method": [method_label(self.method, self.df) if " CI " in r[0] else "" for r in rows],
            }
        )


def _pct(delta: float, base: float) -> float:
    return 100.0 * delta / base if base != 0 else math.nan


def _as_array(values: Iterable[float], what: str) -> np.ndarray:
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        raise ExperimentError(f"{what}: no values to summarize")
    if not np.all(np.isfinite(arr)):
        bad = [i for i, v in enumerate(arr) if not np.isfinite(v)]
        raise ExperimentError(f"{what}: non-finite values at positions {bad}; drop or fix those sweeps first")
    return arr


def summarize(values: Iterable[float], *, what: str = "values") -> ArmSummary:
    """n, mean, sd (ddof=1; 0.0 and flagged single_sweep when n == 1), sem, min, max."""
    arr = _as_array(values, what)
    n = int(arr.size)
    sd = float(arr.std(ddof=1)) if n >= 2 else 0.0
    return ArmSummary(
        n=n,
        mean=float(arr.mean()),
        sd=sd,
        sem=sd / math.sqrt(n) if n >= 2 else 0.0,
        min=float(arr.min()),
        max=float(arr.max()),
        single_sweep=n == 1,
    )


def _check_columns(df: pd.DataFrame, cols: Sequence[str]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ExperimentError(f"frame lacks column(s) {missing}; it has {list(df.columns)}")


def _arm_values(df: pd.DataFrame, arm_col: str, value_col: str) -> dict[str, np.ndarray]:
    """Values per arm in order of first appearance; every arm must have finite values."""
    _check_columns(df, [arm_col, value_col])
    out: dict[str, np.ndarray] = {}
    for arm in pd.unique(df[arm_col]):
        out[str(arm)] = _as_array(df.loc[df[arm_col] == arm, value_col], f"{value_col} of arm {arm!r}")
    if not out:
        raise ExperimentError(f"frame has no rows (column {arm_col!r})")
    return out


def arm_table(df: pd.DataFrame, arm_col: str, value_col: str) -> pd.DataFrame:
    """One row per arm (order of first appearance): n, mean, sd, sem, min, max, single_sweep, deterministic."""
    rows = []
    for arm, values in _arm_values(df, arm_col, value_col).items():
        rows.append({arm_col: arm, **summarize(values, what=f"{value_col} of arm {arm!r}").as_dict()})
    return pd.DataFrame(rows)


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


def paired_method(n_sweeps: int) -> str:
    """The method of a paired interval as the report prints it: 'paired t over N sweeps (df N-1)'."""
    return f"paired t over {n_sweeps} sweeps (df {n_sweeps - 1})"


def method_label(method: str, df: float) -> str:
    """The method with its df where the method does not already name it (Welch's df is data-dependent)."""
    if method.startswith("paired t over") or not math.isfinite(df):
        return method
    return f"{method}, df {df:.3g}"


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


def sweep_blocks(df: pd.DataFrame, arm_col: str, value_col: str, sweep_col: str,
                 arms: Sequence[str]) -> tuple[np.ndarray | None, str]:
    """The runs of `arms` as a (sweeps, arms) matrix in sweep order, when every sweep that ran any of them
    has exactly one valued run of each; else (None, why not) - a failed or excluded run unbalances its sweep.
    """
    _check_columns(df, [arm_col, value_col, sweep_col])
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


def _sd_ratio(delta: float, base: ArmSummary) -> tuple[float, str]:
    """delta / baseline sd, with the cases where that ratio does not exist spelled out."""
    if base.single_sweep:
        return math.nan, "baseline has 1 sweep: its sd is unknown"
    if base.deterministic:
        if delta == 0:
            return math.nan, "baseline sd = 0 and delta = 0: no noise and no change"
        return math.copysign(math.inf, delta), "baseline sd = 0: any change is outside its (zero) noise"
    return delta / base.sd, ""


def tost_equivalence(baseline: np.ndarray, variant: np.ndarray, margin_abs: float) -> tuple[float, str]:
    """Welch TOST p that |mean(variant) - mean(baseline)| < margin_abs: the larger of the two one-sided p.

    Returns (p, status): status "ok", "deterministic" (both arms have zero spread: t is undefined, so
    p is NaN and the margin alone decides) or "too few sweeps" (an arm has n < 2).
    """
    return tost_of(welch_delta(baseline, variant), margin_abs)


def welch_p(baseline: np.ndarray, variant: np.ndarray) -> float:
    """Two-sided Welch t-test p for a difference of means (NaN when undefined: n < 2 or zero spread)."""
    return welch_delta(baseline, variant).p


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
    from scipy import stats as sps

    if margin_pct <= 0:
        raise ExperimentError(f"margin_pct must be > 0, got {margin_pct}")
    if not 0 < ci < 1:
        raise ExperimentError(f"ci must be in (0, 1), got {ci}")
    per_arm = _arm_values(df, arm_col, value_col)
    if baseline not in per_arm:
        raise ExperimentError(f"baseline arm {baseline!r} not in column {arm_col!r}; arms: {list(per_arm)}")
    base_vals = per_arm[baseline]
    base = summarize(base_vals)
    margin_abs = abs(base.mean) * margin_pct / 100.0
    rows = []
    for arm, vals in ((a, v) for a, v in per_arm.items() if a != baseline):
        var = summarize(vals)
        delta = var.mean - base.mean
        ratio, ratio_note = _sd_ratio(delta, base)
        blocks, why = (sweep_blocks(df, arm_col, value_col, sweep_col, [baseline, arm]) if sweep_col
                       else (None, ""))
        w = contrast_of(per_arm, blocks, why, [baseline, arm], [-1.0, 1.0], ci)
        lo, hi = w.low, w.high
        tost_p, tost_status = tost_of(w, margin_abs)
        if w.paired and blocks is not None:  # the paired TOST on the relative margin (paired_tost_t)
            t_lower, t_upper, tdf = paired_tost_t(blocks[:, 0], blocks[:, 1], margin_pct / 100.0)
            tost_p = float(max(sps.t.sf(t_lower, tdf), sps.t.sf(t_upper, tdf)))
        rows.append(
            {
                "arm": arm,
                "baseline": baseline,
                "n_baseline": base.n,
                "n_variant": var.n,
                "baseline_mean": base.mean,
                "baseline_sd": base.sd,
                "variant_mean": var.mean,
                "variant_sd": var.sd,
                "delta_abs": delta,
                "delta_pct": _pct(delta, base.mean),
                "delta_over_baseline_sd": ratio,
                "sd_ratio_note": ratio_note,
                "ci": ci,
                "ci_low": lo,
                "ci_high": hi,
                "ci_low_pct": _pct(lo, base.mean),
                "ci_high_pct": _pct(hi, base.mean),
                "ci_method": w.method,
                "paired": w.paired,
                "ci_df": w.df,
                "delta_se": w.se,
                "margin_pct": margin_pct,
                "margin_abs": margin_abs,
                "tost_p": tost_p,
                "tost_status": tost_status,
                "deterministic": base.deterministic and var.deterministic,
                "p_difference": w.p,
                "welch_p": w.p if not w.paired else welch_delta(base_vals, vals, ci).p,
            }
        )
    return pd.DataFrame(rows)


def interaction_2x2(
    df: pd.DataFrame,
    arm_col: str,
    value_col: str,
    knob_a_arm: str,
    knob_b_arm: str,
    both_arm: str,
    baseline: str,
    *,
    ci: float = DEFAULT_CI,
    sweep_col: str | None = None,
) -> InteractionResult:
    """Effects of A, B and A+B vs baseline, the interaction (AB - B) - (A - base), and its t interval:
    paired by sweep (AB_s - B_s - A_s + base_s, df n_sweeps - 1) when `sweep_col` is given and every sweep
    has one run of each of the four arms, else Welch on run means (the method says why)."""
    per_arm = _arm_values(df, arm_col, value_col)
    needed = {"baseline": baseline, "A": knob_a_arm, "B": knob_b_arm, "A+B": both_arm}
    missing = {role: arm for role, arm in needed.items() if arm not in per_arm}
    if missing:
        raise ExperimentError(
            f"interaction needs arms {missing} in column {arm_col!r}; arms present: {list(per_arm)}"
        )
    if len(set(needed.values())) != 4:
        raise ExperimentError(f"interaction needs four distinct arms, got {needed}")
    base, a, b, ab = (per_arm[needed[r]] for r in ("baseline", "A", "B", "A+B"))
    m0, ma, mb, mab = base.mean(), a.mean(), b.mean(), ab.mean()
    order = [both_arm, knob_b_arm, knob_a_arm, baseline]
    blocks, why = sweep_blocks(df, arm_col, value_col, sweep_col, order) if sweep_col else (None, "")
    w = contrast_of(per_arm, blocks, why, order, [1.0, -1.0, -1.0, 1.0], ci)
    return InteractionResult(
        baseline_mean=float(m0),
        effect_a=float(ma - m0),
        effect_b=float(mb - m0),
        effect_ab=float(mab - m0),
        interaction=float((mab - mb) - (ma - m0)),
        additive_prediction=float(m0 + (ma - m0) + (mb - m0)),
        ci_low=w.low,
        ci_high=w.high,
        ci=ci,
        df=w.df,
        method=w.method,
        n_per_arm={needed[r]: int(per_arm[needed[r]].size) for r in needed},
        arms=(knob_a_arm, knob_b_arm, both_arm, baseline),
    )


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


def wilson_ci(correct: int, total: int, ci: float = DEFAULT_CI) -> tuple[float, float]:
    """Wilson score interval of a proportion (statsmodels proportion_confint)."""
    from statsmodels.stats.proportion import proportion_confint

    if total <= 0:
        return math.nan, math.nan
    lo, hi = proportion_confint(correct, total, alpha=1 - ci, method="wilson")
    return float(lo), float(hi)


def accuracy_by_arm(
    df: pd.DataFrame,
    arm_col: str,
    *,
    correct_col: str = "correct",
    total_col: str = "total",
    ci: float = DEFAULT_CI,
) -> pd.DataFrame:
    """Accuracy spread per arm from one row per sweep with exact counts: mean and sd of the per-sweep
    accuracies, the pooled counts, and the Wilson CI of the pooled accuracy.
    """
    _check_columns(df, [arm_col, correct_col, total_col])
    rows = []
    for arm in pd.unique(df[arm_col]):
        part = df.loc[df[arm_col] == arm]
        correct = part[correct_col].to_numpy()
        total = part[total_col].to_numpy()
        if np.any(total <= 0) or np.any(correct < 0) or np.any(correct > total):
            raise ExperimentError(
                f"arm {arm!r}: counts must satisfy 0 <= {correct_col} <= {total_col} and {total_col} > 0"
            )
        acc = summarize(correct / total, what=f"accuracy of arm {arm!r}")
        c, t = int(correct.sum()), int(total.sum())
        lo, hi = wilson_ci(c, t, ci)
        rows.append(
            {
                arm_col: arm,
                "sweeps": acc.n,
                "accuracy_mean": acc.mean,
                "accuracy_sd": acc.sd,
                "accuracy_min": acc.min,
                "accuracy_max": acc.max,
                "correct": c,
                "total": t,
                "pooled_accuracy": c / t,
                "ci": ci,
                "wilson_low": lo,
                "wilson_high": hi,
            }
        )
    return pd.DataFrame(rows)


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
