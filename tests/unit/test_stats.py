"""specbook.stats on small hand-computed inputs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from specbook.errors import ExperimentError
from specbook.stats import (
    accuracy_by_arm,
    arm_table,
    delta_vs_baseline,
    interaction_2x2,
    summarize,
    wilson_ci,
)


def frame(**arms: list[float]) -> pd.DataFrame:
    return pd.DataFrame([{"arm": a, "al": v} for a, vals in arms.items() for v in vals])


def test_summarize_hand_computed():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    # sum of squared deviations = 2.25 + 0.25 + 0.25 + 2.25 = 5; sd = sqrt(5/3)
    assert (s.n, s.mean, s.min, s.max) == (4, 2.5, 1.0, 4.0)
    assert s.sd == pytest.approx(math.sqrt(5 / 3))
    assert s.sem == pytest.approx(math.sqrt(5 / 3) / 2)
    assert not s.single_sweep and not s.deterministic


def test_summarize_single_value_is_flagged():
    s = summarize([2.5])
    assert (s.n, s.mean, s.sd, s.sem) == (1, 2.5, 0.0, 0.0)
    assert s.single_sweep
    assert not s.deterministic  # one sweep says nothing about noise


def test_summarize_identical_values_are_deterministic():
    s = summarize([2.25, 2.25, 2.25])
    assert s.sd == 0.0 and s.deterministic


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_summarize_rejects_empty_and_non_finite(bad):
    with pytest.raises(ExperimentError):
        summarize(bad, what="al of arm 'x'")


def test_arm_table_keeps_order_and_numbers():
    t = arm_table(frame(baseline=[1.9, 2.0, 2.1], fp32=[2.0, 2.0]), "arm", "al")
    assert list(t["arm"]) == ["baseline", "fp32"]
    assert t.loc[0, "mean"] == pytest.approx(2.0)
    assert t.loc[0, "sd"] == pytest.approx(0.1)
    assert bool(t.loc[1, "deterministic"])


def test_delta_numbers_and_welch_p_by_hand():
    rows = delta_vs_baseline(frame(baseline=[1.9, 2.0, 2.1], v=[2.1, 2.2, 2.3]), "arm", "al", "baseline", n_boot=2000)
    r = rows.iloc[0]
    assert r["delta_abs"] == pytest.approx(0.2)
    assert r["delta_pct"] == pytest.approx(10.0)
    assert r["delta_over_baseline_sd"] == pytest.approx(2.0)
    # equal sds, n = 3 each: Welch df = 4, t = 0.2 / sqrt(2 * 0.01 / 3)
    t = 0.2 / math.sqrt(2 * 0.01 / 3)
    assert r["welch_p"] == pytest.approx(2 * sps.t.sf(t, 4), rel=1e-6)
    # every resampled delta lies between the smallest and largest possible delta of means
    assert 0.0 <= r["ci_low"] < 0.2 < r["ci_high"] <= 0.4
    assert r["ci_low_pct"] == pytest.approx(100 * r["ci_low"] / 2.0)


def test_bootstrap_is_seeded():
    df = frame(baseline=[1.9, 2.0, 2.1, 2.05], v=[2.1, 2.2, 2.3, 2.0])
    a = delta_vs_baseline(df, "arm", "al", "baseline", n_boot=500, seed=7)
    b = delta_vs_baseline(df, "arm", "al", "baseline", n_boot=500, seed=7)
    c = delta_vs_baseline(df, "arm", "al", "baseline", n_boot=500, seed=8)
    assert (a.loc[0, "ci_low"], a.loc[0, "ci_high"]) == (b.loc[0, "ci_low"], b.loc[0, "ci_high"])
    assert (a.loc[0, "ci_low"], a.loc[0, "ci_high"]) != (c.loc[0, "ci_low"], c.loc[0, "ci_high"])


def test_tost_passes_for_tight_equal_arms():
    rows = delta_vs_baseline(
        frame(baseline=[2.000, 2.002, 1.998], v=[2.001, 2.003, 1.999]), "arm", "al", "baseline", margin_pct=1.0
    )
    r = rows.iloc[0]
    assert r["margin_abs"] == pytest.approx(0.02)
    se = math.sqrt(2 * 0.002**2 / 3)  # Welch, equal sds, df = 4
    p_hand = max(sps.t.sf((0.001 + 0.02) / se, 4), sps.t.cdf((0.001 - 0.02) / se, 4))
    assert r["tost_status"] == "ok"
    assert r["tost_p"] == pytest.approx(p_hand, rel=1e-4)
    assert r["tost_p"] < 0.05


def test_tost_fails_when_noise_is_large_even_with_equal_means():
    # same means, sd 0.1 = 5% of the mean: a +/-1% margin cannot be shown with 3 sweeps
    rows = delta_vs_baseline(frame(baseline=[1.9, 2.0, 2.1], v=[1.9, 2.0, 2.1]), "arm", "al", "baseline")
    r = rows.iloc[0]
    se = math.sqrt(2 * 0.01 / 3)
    assert r["delta_abs"] == pytest.approx(0.0, abs=1e-12)
    assert r["tost_p"] == pytest.approx(sps.t.sf(0.02 / se, 4), rel=1e-4)
    assert r["tost_p"] > 0.3


def test_zero_variance_both_arms_is_deterministic():
    rows = delta_vs_baseline(frame(baseline=[2.0, 2.0], v=[2.01, 2.01], same=[2.0, 2.0]), "arm", "al", "baseline")
    v, same = rows.iloc[0], rows.iloc[1]
    assert v["deterministic"] and v["tost_status"] == "deterministic" and math.isnan(v["tost_p"])
    assert math.isnan(v["welch_p"])
    assert v["delta_over_baseline_sd"] == math.inf
    assert "sd = 0" in v["sd_ratio_note"]
    assert (v["ci_low"], v["ci_high"]) == pytest.approx((0.01, 0.01))
    assert math.isnan(same["delta_over_baseline_sd"]) and "delta = 0" in same["sd_ratio_note"]


def test_one_sweep_baseline_has_unknown_sd():
    rows = delta_vs_baseline(frame(baseline=[2.0], v=[2.1, 2.2]), "arm", "al", "baseline")
    r = rows.iloc[0]
    assert math.isnan(r["delta_over_baseline_sd"]) and "1 sweep" in r["sd_ratio_note"]
    assert r["tost_status"] == "too few sweeps" and not r["deterministic"]


def test_missing_baseline_names_arms():
    with pytest.raises(ExperimentError, match="'base'.*arms: \\['a', 'b'\\]"):
        delta_vs_baseline(frame(a=[1.0, 2.0], b=[1.0, 2.0]), "arm", "al", "base")


def test_missing_column_is_named():
    with pytest.raises(ExperimentError, match="acceptance_length"):
        arm_table(frame(a=[1.0]), "arm", "acceptance_length")


def test_interaction_deterministic_hand_computed():
    df = frame(baseline=[2.0, 2.0], A=[2.1, 2.1], B=[1.9, 1.9], AB=[2.3, 2.3])
    r = interaction_2x2(df, "arm", "al", "A", "B", "AB", "baseline", n_boot=200)
    assert r.effect_a == pytest.approx(0.1)
    assert r.effect_b == pytest.approx(-0.1)
    assert r.effect_ab == pytest.approx(0.3)
    assert r.interaction == pytest.approx((2.3 - 1.9) - (2.1 - 2.0))
    assert r.additive_prediction == pytest.approx(2.0)
    assert (r.ci_low, r.ci_high) == pytest.approx((0.3, 0.3))
    assert r.ci_excludes_zero
    assert r.interaction_pct == pytest.approx(15.0)
    assert len(r.to_frame()) == 7


def test_interaction_additive_knobs_ci_covers_zero():
    df = frame(baseline=[2.0, 2.02], A=[2.1, 2.12], B=[1.9, 1.92], AB=[2.0, 2.02])
    r = interaction_2x2(df, "arm", "al", "A", "B", "AB", "baseline", n_boot=2000)
    assert r.interaction == pytest.approx(0.0, abs=1e-12)
    assert r.ci_low <= 0 <= r.ci_high and not r.ci_excludes_zero


def test_interaction_needs_all_four_arms():
    with pytest.raises(ExperimentError, match="'A\\+B': 'AB'"):
        interaction_2x2(frame(baseline=[1.0], A=[1.0], B=[1.0]), "arm", "al", "A", "B", "AB", "baseline")


def test_wilson_by_formula():
    z = sps.norm.ppf(0.975)
    n, p = 100, 0.85
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson_ci(85, 100) == pytest.approx((centre - half, centre + half), rel=1e-9)


def test_accuracy_by_arm_counts_and_spread():
    df = pd.DataFrame(
        {"arm": ["base", "base", "fp32", "fp32"], "correct": [40, 45, 44, 44], "total": [50, 50, 50, 50]}
    )
    t = accuracy_by_arm(df, "arm").set_index("arm")
    assert t.loc["base", "correct"] == 85 and t.loc["base", "total"] == 100
    assert t.loc["base", "accuracy_mean"] == pytest.approx(0.85)
    assert t.loc["base", "accuracy_sd"] == pytest.approx(np.std([0.8, 0.9], ddof=1))
    assert t.loc["base", "pooled_accuracy"] == pytest.approx(0.85)
    assert (t.loc["base", "wilson_low"], t.loc["base", "wilson_high"]) == pytest.approx(wilson_ci(85, 100))
    assert t.loc["fp32", "accuracy_sd"] == 0.0


def test_accuracy_rejects_impossible_counts():
    with pytest.raises(ExperimentError, match="correct"):
        accuracy_by_arm(pd.DataFrame({"arm": ["a"], "correct": [51], "total": [50]}), "arm")
