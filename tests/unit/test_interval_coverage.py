"""Coverage of every interval the book reports, simulated at the sweep counts people run (n = 2, 3, 5).

Normal run-to-run noise, seeded; no true effect and a true effect; equal and unequal spread. Tolerance:
coverage must not fall below nominal - 1.5 points (at 20,000 replications the Monte-Carlo standard
error is 0.15 points, so that is 10 of them) and must not exceed nominal + 3.5 points. The upper side
is wider on purpose: with equal spreads at n = 2 Welch's df estimate lies between 1 and 2 while the
exact pooled t has 2, so Welch is conservative there (about 97.7%); a percentile bootstrap of the same
runs covers about 70%.

The knob A/B's primary intervals are paired by sweep (every arm of a sweep serves that sweep's question
draw): runs are simulated as arm mean + sweep effect (shared by the arms of a sweep) + run noise, with
the sweep effect's sd far above the run noise's and far below it; the paired t must hold its coverage in
both, and the controls show what the check catches: Welch on the same runs is several times wider when
sweeps dominate, and the paired standard error with the unpaired df undercovers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from specbook.core import stats
from specbook.experiments import cross_engine as ce

REPS = 20_000
NOMINAL = 0.95
BELOW, ABOVE = 0.015, 0.035


def within_tolerance(coverage: float) -> bool:
    return NOMINAL - BELOW <= coverage <= NOMINAL + ABOVE


def welch_coverage(rng, n: int, effect: float, sd_b: float, sd_v: float, n_v: int | None = None) -> float:
    n_v = n_v or n
    b = rng.normal(10.0, sd_b, (REPS, n))
    v = rng.normal(10.0 + effect, sd_v, (REPS, n_v))
    means = np.stack([b.mean(1), v.mean(1)], -1)
    var = np.stack([b.var(1, ddof=1), v.var(1, ddof=1)], -1)
    _, _, _, lo, hi = stats.welch_t_interval(means, var, np.array([n, n_v]), [-1.0, 1.0], NOMINAL)
    return float(np.mean((lo <= effect) & (effect <= hi)))


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize(("effect", "sd_b", "sd_v"), [(0.0, 0.1, 0.1), (0.5, 0.1, 0.1), (0.0, 0.05, 0.2),
                                                      (-0.3, 0.2, 0.05)])
def test_delta_interval_covers_at_small_n(n, effect, sd_b, sd_v):
    """The knob A/B delta interval (and so the 'CI excludes 0' criterion: at effect 0, 1 - coverage
    is how often noise is called a difference)."""
    cov = welch_coverage(np.random.default_rng(1000 * n + int(100 * sd_v) + int(10 * abs(effect))), n, effect,
                         sd_b, sd_v)
    assert within_tolerance(cov), f"n={n} effect={effect} sds=({sd_b}, {sd_v}): coverage {cov:.4f}"


def test_delta_interval_with_unequal_sweeps_per_arm():
    cov = welch_coverage(np.random.default_rng(7), 2, 0.2, 0.1, 0.1, n_v=5)
    assert within_tolerance(cov), f"coverage {cov:.4f}"


def test_the_scalar_interval_is_the_simulated_one():
    rng = np.random.default_rng(5)
    b, v = rng.normal(4.3, 0.05, 3), rng.normal(4.2, 0.1, 2)
    w = stats.welch_delta(b, v)
    means, var = np.array([b.mean(), v.mean()]), np.array([b.var(ddof=1), v.var(ddof=1)])
    _, _, _, lo, hi = stats.welch_t_interval(means, var, np.array([3, 2]), [-1.0, 1.0], NOMINAL)
    assert (w.low, w.high) == pytest.approx((float(lo), float(hi)), rel=1e-12)


def test_the_old_bootstrap_would_fail_this_tolerance():
    """The check can fail: a percentile bootstrap of 2 runs per arm, as the book reported before."""
    rng = np.random.default_rng(11)
    reps, n_boot = 2000, 400
    b, v = rng.normal(0, 1, (reps, 2)), rng.normal(0, 1, (reps, 2))
    idx_b = rng.integers(0, 2, (reps, n_boot, 2))
    idx_v = rng.integers(0, 2, (reps, n_boot, 2))
    boot = (np.take_along_axis(v[:, None, :], idx_v, 2).mean(-1)
            - np.take_along_axis(b[:, None, :], idx_b, 2).mean(-1))
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=1)
    cov = float(np.mean((lo <= 0) & (0 <= hi)))
    assert cov < 0.8 and not within_tolerance(cov)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("interaction", [0.0, 0.4])
def test_interaction_interval_covers_at_small_n(n, interaction):
    rng = np.random.default_rng(50 + n)
    sds = np.array([0.1, 0.2, 0.1, 0.15])  # AB, B, A, base
    true = np.array([2.0 + interaction, 1.5, 2.2, 2.1])
    runs = rng.normal(true[None, :, None], sds[None, :, None], (REPS, 4, n))
    coefs = [1.0, -1.0, -1.0, 1.0]
    _, _, _, lo, hi = stats.welch_t_interval(runs.mean(-1), runs.var(-1, ddof=1), np.full(4, n), coefs, NOMINAL)
    target = float(np.dot(coefs, true))
    cov = float(np.mean((lo <= target) & (target <= hi)))
    assert within_tolerance(cov), f"n={n}: coverage {cov:.4f}"


@pytest.mark.parametrize("n", [2, 3, 5])
def test_tost_type_one_error_at_the_margin(n):
    """TOST (equivalence within +/-1%): a true delta on the margin is called equivalent at most alpha of the time."""
    rng = np.random.default_rng(300 + n)
    reps, sd, margin = 4000, 0.03, 0.05  # base mean 5.0: margin 1%
    passed = 0
    for _ in range(reps):
        b = rng.normal(5.0, sd, n)
        v = rng.normal(5.0 + margin * rng.choice([-1, 1]), sd, n)
        p, _ = stats.tost_equivalence(b, v, margin)
        passed += p < 0.05
    rate = passed / reps
    assert rate <= 0.05 + 0.01, f"n={n}: TOST called a margin-sized change equivalent {rate:.3f} of the time"


def test_wilson_interval_exact_coverage():
    """The pooled accuracy's Wilson interval, coverage computed exactly over the binomial outcomes."""
    for total, p in ((60, 0.3), (120, 0.1), (600, 0.03)):
        ks = np.arange(total + 1)
        bounds = np.array([stats.wilson_ci(int(k), total) for k in ks])
        cov = float(np.sum(sps.binom.pmf(ks, total, p) * ((bounds[:, 0] <= p) & (p <= bounds[:, 1]))))
        assert NOMINAL - 0.025 <= cov <= NOMINAL + 0.035, f"n={total} p={p}: coverage {cov:.4f}"


@pytest.mark.parametrize("n", [2, 3, 5])
def test_cross_engine_ratio_interval_covers(n):
    """ours / oracle tok/s over a cell's repeats (Fieller, Welch df). Where it has no finite bounds (the
    oracle's repeats too spread to tell its mean from 0: about 1 in 7 at n = 2 here) the Fieller set is
    unbounded; whether it holds the true ratio is checked on its defining inequality."""
    rng = np.random.default_rng(400 + n)
    reps, ratio = 3000, 3.5
    hits = 0
    for _ in range(reps):
        oracle = rng.normal(15.0, 1.5, n)
        ours = rng.normal(15.0 * ratio, 3.0, n)
        point, lo, hi = ce.ratio_of_means_ci(ours, oracle)
        if np.isnan(lo):
            va, vb = ours.var(ddof=1) / n, oracle.var(ddof=1) / n
            df = (va + point**2 * vb) ** 2 / ((va**2 + point**4 * vb**2) / (n - 1))
            t = sps.t.ppf(0.975, df)
            hits += bool((ours.mean() - ratio * oracle.mean()) ** 2 <= t**2 * (va + ratio**2 * vb))
        else:
            hits += bool(lo <= ratio <= hi)
    cov = hits / reps
    assert NOMINAL - 0.025 <= cov <= NOMINAL + ABOVE, f"n={n}: coverage {cov:.4f}"


@pytest.mark.parametrize("cells", [2, 3, 5])
def test_cross_engine_headline_interval_covers(cells):
    """The headline: t interval of the mean log ratio over comparable cells (geometric mean ratio)."""
    rng = np.random.default_rng(500 + cells)
    reps, true = 4000, np.log(3.0)
    hits = 0
    for _ in range(reps):
        _, lo, hi = stats.mean_t_interval(rng.normal(true, 0.2, cells))
        hits += lo <= true <= hi
    cov = hits / reps
    assert NOMINAL - 0.02 <= cov <= NOMINAL + 0.02, f"{cells} cells: coverage {cov:.4f}"


# --------------------------------------------------------------------------------------------------
# paired by sweep: arm mean + sweep effect (shared within a sweep) + run noise

SWEEP_CASES = [(1.0, 0.05), (0.05, 0.2)]  # (sweep effect sd, run noise sd): sweeps dominate / runs dominate


def swept_runs(rng, n: int, means: list[float], sweep_sd: float, run_sd: float) -> np.ndarray:
    """(REPS, arms, n sweeps) per-run values with a sweep effect shared by every arm of the sweep."""
    sweep = rng.normal(0.0, sweep_sd, (REPS, 1, n))
    return np.asarray(means, float)[None, :, None] + sweep + rng.normal(0.0, run_sd, (REPS, len(means), n))


def covered(lo: np.ndarray, hi: np.ndarray, target: float) -> float:
    return float(np.mean((lo <= target) & (target <= hi)))


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize(("sweep_sd", "run_sd"), SWEEP_CASES)
@pytest.mark.parametrize("effect", [0.0, -1.2])
def test_paired_delta_interval_covers_at_small_n(n, sweep_sd, run_sd, effect):
    rng = np.random.default_rng(600 + 10 * n + int(sweep_sd > run_sd) + int(2 * abs(effect)))
    runs = swept_runs(rng, n, [4.6, 4.6 + effect], sweep_sd, run_sd)
    _, _, df, lo, hi = stats.paired_t_interval(runs[:, 1] - runs[:, 0], NOMINAL)
    cov = covered(lo, hi, effect)
    assert np.all(df == n - 1)
    assert within_tolerance(cov), f"n={n} sds=({sweep_sd}, {run_sd}) effect={effect}: coverage {cov:.4f}"


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize(("sweep_sd", "run_sd"), SWEEP_CASES)
def test_paired_interaction_interval_covers_at_small_n(n, sweep_sd, run_sd):
    rng = np.random.default_rng(700 + n + int(sweep_sd > run_sd))
    true = [2.4, 1.5, 2.2, 2.1]  # AB, B, A, base: interaction 0.8
    runs = swept_runs(rng, n, true, sweep_sd, run_sd)
    _, _, _, lo, hi = stats.paired_t_interval(np.einsum("a,ras->rs", [1.0, -1.0, -1.0, 1.0], runs), NOMINAL)
    cov = covered(lo, hi, 0.8)
    assert within_tolerance(cov), f"n={n} sds=({sweep_sd}, {run_sd}): coverage {cov:.4f}"


def test_the_scalar_paired_interval_is_the_simulated_one():
    rng = np.random.default_rng(8)
    frame = pd.DataFrame([{"arm": a, "sweep": s, "al": float(v)} for a, row in
                          (("baseline", rng.normal(4.6, 0.3, 3)), ("v", rng.normal(3.4, 0.3, 3)))
                          for s, v in enumerate(row)])
    row = stats.delta_vs_baseline(frame, "arm", "al", "baseline", sweep_col="sweep").iloc[0]
    wide = frame.pivot(index="sweep", columns="arm", values="al")
    _, _, _, lo, hi = stats.paired_t_interval((wide["v"] - wide["baseline"]).to_numpy(), NOMINAL)
    assert row["paired"] and (row["ci_low"], row["ci_high"]) == pytest.approx((float(lo), float(hi)), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_control_welch_is_much_wider_when_sweeps_dominate(n):
    """Welch on the same runs covers (over-covers) too, but its interval carries the between-sweep spread:
    several times wider than the paired one, so a real knob effect hides in it."""
    rng = np.random.default_rng(800 + n)
    runs = swept_runs(rng, n, [4.6, 3.4], 1.0, 0.05)
    _, _, _, plo, phi = stats.paired_t_interval(runs[:, 1] - runs[:, 0], NOMINAL)
    means, var = runs.mean(-1), runs.var(-1, ddof=1)
    _, _, _, wlo, whi = stats.welch_t_interval(means, var, np.array([n, n]), [-1.0, 1.0], NOMINAL)
    ratio = float(np.median((whi - wlo) / (phi - plo)))
    assert ratio > 5, f"n={n}: Welch / paired median width {ratio:.2f}"
    assert covered(wlo, whi, -1.2) > NOMINAL + ABOVE  # far above nominal: it is not the right interval


@pytest.mark.parametrize("n", [2, 3])
def test_control_paired_se_with_the_unpaired_df_undercovers(n):
    """The check can fail: the paired standard error with Welch's df (about 2(n - 1) instead of n - 1)."""
    rng = np.random.default_rng(900 + n)
    runs = swept_runs(rng, n, [4.6, 3.4], 1.0, 0.05)
    d = runs[:, 1] - runs[:, 0]
    est, se = d.mean(-1), d.std(-1, ddof=1) / np.sqrt(n)
    half = sps.t.ppf(0.5 + NOMINAL / 2, 2 * (n - 1)) * se
    cov = covered(est - half, est + half, -1.2)
    assert cov < NOMINAL - 0.03 and not within_tolerance(cov), f"n={n}: coverage {cov:.4f}"


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize(("sweep_sd", "run_sd"), SWEEP_CASES)
def test_paired_tost_type_one_error_at_the_margin(n, sweep_sd, run_sd):
    """Paired TOST: a true delta on the +/-1% margin (of the true baseline mean) is called equivalent at
    most alpha of the time, each side."""
    rng = np.random.default_rng(1000 + n + int(sweep_sd > run_sd))
    for side in (1.0, -1.0):
        runs = swept_runs(rng, n, [4.6, 4.6 * (1 + side * 0.01)], sweep_sd, run_sd)
        t_lower, t_upper, df = stats.paired_tost_t(runs[:, 0], runs[:, 1], 0.01)
        p = np.maximum(sps.t.sf(t_lower, df), sps.t.sf(t_upper, df))
        rate = float(np.mean(p < 0.05))
        assert rate <= 0.05 + 0.01, f"n={n} side {side}: paired TOST called a margin-sized change equivalent {rate:.3f}"
    # the scalar path (the knob A/B's tost_p) gives the same p as this vectorised one
    frame = pd.DataFrame([{"arm": a, "sweep": s, "al": float(runs[0, i, s])}
                          for i, a in enumerate(["baseline", "v"]) for s in range(n)])
    row = stats.delta_vs_baseline(frame, "arm", "al", "baseline", sweep_col="sweep").iloc[0]
    assert row["paired"] and row["tost_p"] == pytest.approx(float(p[0]), rel=1e-9)


def test_control_a_margin_from_the_estimated_mean_is_not_exact_when_sweeps_dominate():
    """The check can fail: TOST on the paired difference with the margin taken as 1% of the *estimated*
    baseline mean, a fixed number. The sweep effect moves that estimate by about the paired se, and at
    n = 5 it calls a margin-sized change equivalent well above alpha; the relative form above does not."""
    rng = np.random.default_rng(1100)
    n, margin = 5, 0.046  # 1% of 4.6
    runs = swept_runs(rng, n, [4.6, 4.6 + margin], 1.0, 0.003)
    est, se, df, _, _ = stats.paired_t_interval(runs[:, 1] - runs[:, 0], NOMINAL)
    m_hat = 0.01 * np.abs(runs[:, 0].mean(-1))
    p = np.maximum(sps.t.sf((est + m_hat) / se, df), sps.t.cdf((est - m_hat) / se, df))
    naive = float(np.mean(p < 0.05))
    t_lower, t_upper, tdf = stats.paired_tost_t(runs[:, 0], runs[:, 1], 0.01)
    relative = float(np.mean(np.maximum(sps.t.sf(t_lower, tdf), sps.t.sf(t_upper, tdf)) < 0.05))
    assert naive > 0.15 and relative <= 0.05 + 0.01, f"fixed margin {naive:.3f}, relative {relative:.3f}"
