"""Statistics of an A/B experiment: per-arm summaries, deltas vs the baseline, equivalence, interaction.

The unit of replication is the sweep (one fresh server, one pass over the workload): every function
here takes one value per sweep, never per request or per log interval, because requests on one server
share that server's state and are not independent replicates.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from specbook.errors import ExperimentError

DEFAULT_N_BOOT = 10_000
DEFAULT_CI = 0.95
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
    n_boot: int
    n_per_arm: dict[str, int]

    @property
    def interaction_pct(self) -> float:
        return _pct(self.interaction, self.baseline_mean)

    @property
    def ci_excludes_zero(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0

    def to_frame(self) -> pd.DataFrame:
        """One row per quantity, absolute and as % of the baseline mean."""
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
                "value": [r[1] for r in rows],
                "pct_of_baseline": [
                    math.nan if r[0].startswith("A+B predicted") else _pct(r[1], self.baseline_mean)
                    for r in rows
                ],
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


def bootstrap_means(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """n_boot means of resamples (with replacement, same size) of one arm's values."""
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    return values[idx].mean(axis=1)


def _percentile_ci(samples: np.ndarray, ci: float) -> tuple[float, float]:
    lo, hi = np.percentile(samples, [100 * (1 - ci) / 2, 100 * (1 + ci) / 2])
    return float(lo), float(hi)


def bootstrap_delta_ci(
    baseline: np.ndarray,
    variant: np.ndarray,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    ci: float = DEFAULT_CI,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(variant) - mean(baseline), resampling within each arm."""
    rng = np.random.default_rng(seed)
    diff = bootstrap_means(variant, n_boot, rng) - bootstrap_means(baseline, n_boot, rng)
    return _percentile_ci(diff, ci)


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
    """TOST p-value (statsmodels ttost_ind, Welch variances) that |mean(variant)-mean(baseline)| < margin_abs.

    Returns (p, status): status "ok", "deterministic" (both arms have zero spread: t is undefined, so
    p is NaN and the margin alone decides) or "too few sweeps" (an arm has n < 2).
    """
    from statsmodels.stats.weightstats import ttost_ind

    if baseline.size < 2 or variant.size < 2:
        return math.nan, "too few sweeps"
    b, v = summarize(baseline), summarize(variant)
    if b.deterministic and v.deterministic:
        return math.nan, "deterministic"
    # One arm with zero spread is fine for Welch; numpy still warns on the 0/0 in its df formula.
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p, _, _ = ttost_ind(variant, baseline, -margin_abs, margin_abs, usevar="unequal")
    return float(p), "ok"


def welch_p(baseline: np.ndarray, variant: np.ndarray) -> float:
    """Two-sided Welch t-test p for a difference of means (NaN when undefined: n < 2 or zero spread)."""
    from scipy import stats as sps

    if baseline.size < 2 or variant.size < 2:
        return math.nan
    if summarize(baseline).deterministic and summarize(variant).deterministic:
        return math.nan
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(sps.ttest_ind(variant, baseline, equal_var=False).pvalue)


def delta_vs_baseline(
    df: pd.DataFrame,
    arm_col: str,
    value_col: str,
    baseline: str,
    *,
    margin_pct: float = 1.0,
    n_boot: int = DEFAULT_N_BOOT,
    ci: float = DEFAULT_CI,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per variant arm: its delta vs the baseline, in absolute, %, and baseline-sd units,
    the bootstrap CI of the delta, the TOST p for equivalence within +/-margin_pct % of the baseline
    mean, and the Welch p for a difference.
    """
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
    for i, (arm, vals) in enumerate((a, v) for a, v in per_arm.items() if a != baseline):
        var = summarize(vals)
        delta = var.mean - base.mean
        ratio, ratio_note = _sd_ratio(delta, base)
        lo, hi = bootstrap_delta_ci(base_vals, vals, n_boot=n_boot, ci=ci, seed=seed + i)
        tost_p, tost_status = tost_equivalence(base_vals, vals, margin_abs)
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
                "n_boot": n_boot,
                "margin_pct": margin_pct,
                "margin_abs": margin_abs,
                "tost_p": tost_p,
                "tost_status": tost_status,
                "deterministic": base.deterministic and var.deterministic,
                "welch_p": welch_p(base_vals, vals),
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
    n_boot: int = DEFAULT_N_BOOT,
    ci: float = DEFAULT_CI,
    seed: int = 0,
) -> InteractionResult:
    """Effects of A, B and A+B vs baseline, the interaction (AB - B) - (A - base), and its bootstrap CI."""
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
    rng = np.random.default_rng(seed)
    boot = (
        bootstrap_means(ab, n_boot, rng)
        - bootstrap_means(b, n_boot, rng)
        - bootstrap_means(a, n_boot, rng)
        + bootstrap_means(base, n_boot, rng)
    )
    lo, hi = _percentile_ci(boot, ci)
    return InteractionResult(
        baseline_mean=float(m0),
        effect_a=float(ma - m0),
        effect_b=float(mb - m0),
        effect_ab=float(mab - m0),
        interaction=float((mab - mb) - (ma - m0)),
        additive_prediction=float(m0 + (ma - m0) + (mb - m0)),
        ci_low=lo,
        ci_high=hi,
        ci=ci,
        n_boot=n_boot,
        n_per_arm={needed[r]: int(per_arm[needed[r]].size) for r in needed},
    )


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
