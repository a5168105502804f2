"""specbook.core.stats on small hand-computed inputs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from specbook.core.errors import ExperimentError
from specbook.core.stats import (
    WELCH_METHOD,
    accuracy_by_arm,
    arm_table,
    delta_vs_baseline,
    interaction_2x2,
    summarize,
    welch_contrast,
    welch_delta,
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
    rows = delta_vs_baseline(frame(baseline=[1.9, 2.0, 2.1], v=[2.1, 2.2, 2.3]), "arm", "al", "baseline")
    r = rows.iloc[0]
    assert r["delta_abs"] == pytest.approx(0.2)
    assert r["delta_pct"] == pytest.approx(10.0)
    assert r["delta_over_baseline_sd"] == pytest.approx(2.0)
    # equal sds, n = 3 each: Welch df = 4, t = 0.2 / sqrt(2 * 0.01 / 3)
    t = 0.2 / math.sqrt(2 * 0.01 / 3)
    assert r["welch_p"] == pytest.approx(2 * sps.t.sf(t, 4), rel=1e-6)
    # Welch t interval: delta +/- t(0.975, df 4) x se
    half = sps.t.ppf(0.975, 4) * math.sqrt(2 * 0.01 / 3)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((0.2 - half, 0.2 + half))
    assert r["ci_df"] == pytest.approx(4.0) and r["delta_se"] == pytest.approx(math.sqrt(2 * 0.01 / 3))
    assert r["ci_method"] == WELCH_METHOD
    assert r["ci_low_pct"] == pytest.approx(100 * r["ci_low"] / 2.0)


def test_welch_df_with_unequal_spread_and_sizes_by_hand():
    b, v = np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.5, 3.0, 3.5, 4.0])
    vb, vv = np.var(b, ddof=1) / 3, np.var(v, ddof=1) / 5
    df = (vb + vv) ** 2 / (vb**2 / 2 + vv**2 / 4)
    w = welch_delta(b, v, ci=0.9)
    assert w.estimate == pytest.approx(1.0) and w.df == pytest.approx(df)
    assert (w.low, w.high) == pytest.approx((1 - sps.t.ppf(0.95, df) * math.sqrt(vb + vv),
                                             1 + sps.t.ppf(0.95, df) * math.sqrt(vb + vv)))
    # the same test scipy runs
    assert w.p == pytest.approx(sps.ttest_ind(v, b, equal_var=False).pvalue, rel=1e-9)


def test_welch_with_one_deterministic_arm_takes_the_other_arms_df():
    w = welch_delta(np.array([2.0, 2.0, 2.0]), np.array([2.1, 2.2, 2.3]))
    assert w.df == pytest.approx(2.0) and w.method == WELCH_METHOD


def test_welch_interval_is_wider_than_a_two_value_bootstrap_can_be():
    # two values per arm: a percentile bootstrap can only return deltas of resampled means, here
    # within [1.9 - 2.0, 2.0 - 1.9] = [-0.1, 0.1]; the t interval (df 2) is three times as wide
    w = welch_delta(np.array([1.9, 2.0]), np.array([1.9, 2.0]))
    assert w.df == pytest.approx(2.0) and w.high == pytest.approx(sps.t.ppf(0.975, 2) * math.sqrt(2 * 0.005 / 2))
    assert w.low == pytest.approx(-w.high) and w.high > 0.3


def test_welch_one_sweep_arm_has_no_interval_and_says_why():
    w = welch_contrast([np.array([2.0]), np.array([2.1, 2.2])], [-1, 1])
    assert math.isnan(w.low) and math.isnan(w.p) and "1 sweep" in w.method


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
    r = interaction_2x2(df, "arm", "al", "A", "B", "AB", "baseline")
    assert r.effect_a == pytest.approx(0.1)
    assert r.effect_b == pytest.approx(-0.1)
    assert r.effect_ab == pytest.approx(0.3)
    assert r.interaction == pytest.approx((2.3 - 1.9) - (2.1 - 2.0))
    assert r.additive_prediction == pytest.approx(2.0)
    assert (r.ci_low, r.ci_high) == pytest.approx((0.3, 0.3))
    assert r.ci_excludes_zero
    assert r.interaction_pct == pytest.approx(15.0)
    assert len(r.to_frame()) == 7
    assert "sd = 0" in r.method and r.to_frame()["method"].iloc[-1].startswith(r.method)


def test_interaction_ci_is_the_welch_contrast_of_four_arms_by_hand():
    df = frame(baseline=[2.0, 2.1], A=[2.2, 2.3, 2.25], B=[1.9, 1.8], AB=[2.0, 2.2, 2.1])
    r = interaction_2x2(df, "arm", "al", "A", "B", "AB", "baseline")
    var = {a: np.var(v, ddof=1) / len(v) for a, v in
           {"b": [2.0, 2.1], "A": [2.2, 2.3, 2.25], "B": [1.9, 1.8], "AB": [2.0, 2.2, 2.1]}.items()}
    n = {"b": 2, "A": 3, "B": 2, "AB": 3}
    se = math.sqrt(sum(var.values()))
    dof = sum(var.values()) ** 2 / sum(var[a] ** 2 / (n[a] - 1) for a in var)
    half = sps.t.ppf(0.975, dof) * se
    assert r.df == pytest.approx(dof)
    assert (r.ci_low, r.ci_high) == pytest.approx((r.interaction - half, r.interaction + half))


def test_interaction_additive_knobs_ci_covers_zero():
    df = frame(baseline=[2.0, 2.02], A=[2.1, 2.12], B=[1.9, 1.92], AB=[2.0, 2.02])
    r = interaction_2x2(df, "arm", "al", "A", "B", "AB", "baseline")
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


# --------------------------------------------------------------------------------------------------
# paired by sweep (the knob A/B's block design)


def swept(**arms: list[float]) -> pd.DataFrame:
    """One row per run: arm, its sweep (the list index), value."""
    return pd.DataFrame([{"arm": a, "sweep": s, "al": v} for a, vals in arms.items() for s, v in enumerate(vals)])


def test_paired_delta_by_hand():
    # a sweep effect (+0.5 in sweep 1) shared by both arms: Welch sees it as noise, the pairing removes it
    df = swept(baseline=[4.0, 4.5, 4.1], v=[3.0, 3.6, 3.05])
    r = delta_vs_baseline(df, "arm", "al", "baseline", sweep_col="sweep").iloc[0]
    d = np.array([-1.0, -0.9, -1.05])
    se = d.std(ddof=1) / math.sqrt(3)
    half = sps.t.ppf(0.975, 2) * se
    assert r["paired"] and r["ci_method"] == "paired t over 3 sweeps (df 2)" and r["ci_df"] == 2
    assert r["delta_abs"] == pytest.approx(d.mean()) and r["delta_se"] == pytest.approx(se)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert r["p_difference"] == pytest.approx(2 * sps.t.sf(abs(d.mean()) / se, 2))
    # TOST on the relative margin: per-sweep v - 0.99 b > 0 and 1.01 b - v > 0, each a paired t (df 2)
    b, v = np.array([4.0, 4.5, 4.1]), np.array([3.0, 3.6, 3.05])
    lower, upper = v - 0.99 * b, 1.01 * b - v
    t_lower = lower.mean() / (lower.std(ddof=1) / math.sqrt(3))
    t_upper = upper.mean() / (upper.std(ddof=1) / math.sqrt(3))
    assert r["tost_p"] == pytest.approx(max(sps.t.sf(t_lower, 2), sps.t.sf(t_upper, 2)))
    # the Welch p on the same runs, kept beside it, is far weaker: the sweep effect inflates both arms' sd
    assert r["welch_p"] == pytest.approx(welch_delta(np.array([4.0, 4.5, 4.1]), np.array([3.0, 3.6, 3.05])).p)
    assert r["p_difference"] < r["welch_p"] / 5
    # the '|delta| <= 1 baseline sd' yardstick stays the baseline's run-to-run sd
    assert r["delta_over_baseline_sd"] == pytest.approx(d.mean() / np.std([4.0, 4.5, 4.1], ddof=1))


def test_paired_pairs_by_sweep_not_by_row_order():
    df = swept(baseline=[4.0, 4.5, 4.1], v=[3.0, 3.6, 3.05]).sample(frac=1.0, random_state=3)
    r = delta_vs_baseline(df, "arm", "al", "baseline", sweep_col="sweep").iloc[0]
    assert r["delta_se"] == pytest.approx(np.std([-1.0, -0.9, -1.05], ddof=1) / math.sqrt(3))


def test_unbalanced_sweeps_fall_back_to_welch_and_say_why():
    df = swept(baseline=[4.0, 4.5, 4.1], v=[3.0, 3.6, 3.05], w=[4.0, 4.4, 4.2])
    df = df[~((df["arm"] == "v") & (df["sweep"] == 1))]  # v's run in sweep 1 failed
    rows = delta_vs_baseline(df, "arm", "al", "baseline", sweep_col="sweep").set_index("arm")
    v, w = rows.loc["v"], rows.loc["w"]
    assert not v["paired"] and v["ci_method"] == f"{WELCH_METHOD}; not paired: sweeps unbalanced: sweep 1 lacks 'v'"
    assert v["ci_low"] == pytest.approx(welch_delta(np.array([4.0, 4.5, 4.1]), np.array([3.0, 3.05])).low)
    assert w["paired"]  # the other comparison still has both its arms in every sweep
    twice = pd.concat([swept(baseline=[4.0, 4.5], v=[3.0, 3.6]), swept(v=[3.1])])
    r = delta_vs_baseline(twice, "arm", "al", "baseline", sweep_col="sweep").iloc[0]
    assert not r["paired"] and "sweep 0 has 2 runs of 'v'" in r["ci_method"]


def test_paired_with_equal_differences_but_noisy_arms_uses_welch():
    df = swept(baseline=[4.0, 4.5], v=[3.0, 3.5])
    r = delta_vs_baseline(df, "arm", "al", "baseline", sweep_col="sweep").iloc[0]
    assert not r["paired"] and "per-sweep contrasts are all equal" in r["ci_method"] and r["ci_low"] < r["ci_high"]
    same = delta_vs_baseline(swept(baseline=[2.0, 2.0], v=[2.01, 2.01]), "arm", "al", "baseline",
                             sweep_col="sweep").iloc[0]
    assert same["deterministic"] and same["ci_low"] == pytest.approx(0.01) == same["ci_high"]


def test_paired_interaction_by_hand():
    df = swept(baseline=[2.0, 2.4, 2.1], A=[2.2, 2.5, 2.35], B=[1.9, 2.2, 1.95], AB=[2.3, 2.75, 2.4])
    r = interaction_2x2(df, "arm", "al", "A", "B", "AB", "baseline", sweep_col="sweep")
    c = (np.array([2.3, 2.75, 2.4]) - [1.9, 2.2, 1.95] - [2.2, 2.5, 2.35] + [2.0, 2.4, 2.1])
    half = sps.t.ppf(0.975, 2) * c.std(ddof=1) / math.sqrt(3)
    assert r.method == "paired t over 3 sweeps (df 2)" and r.df == 2
    assert r.interaction == pytest.approx(c.mean())
    assert (r.ci_low, r.ci_high) == pytest.approx((c.mean() - half, c.mean() + half))
    assert r.to_frame()["method"].iloc[-1] == "paired t over 3 sweeps (df 2)"
    unbalanced = df[~((df["arm"] == "A") & (df["sweep"] == 2))]
    u = interaction_2x2(unbalanced, "arm", "al", "A", "B", "AB", "baseline", sweep_col="sweep")
    assert "not paired: sweeps unbalanced: sweep 2 lacks 'A'" in u.method


def test_every_public_name_is_reexported_from_the_package():
    """`from specbook.core.stats import X` keeps working for every public name; functions and classes are the
    submodules' own (defined once, re-exported), and the submodules' shared helpers stay out of the package."""
    import importlib

    import specbook.core.stats as package

    assert len(package.__all__) == len(set(package.__all__))
    for name in package.__all__:
        obj = getattr(package, name)
        home = getattr(obj, "__module__", None)
        if callable(obj):
            assert home.startswith("specbook.core.stats."), (name, home)
            assert getattr(importlib.import_module(home), name) is obj
    for helper in ("as_array", "check_columns", "arm_values", "pct"):
        assert helper not in package.__all__


def test_paired_tost_p_is_the_larger_one_sided_p_of_the_paired_t_statistics():
    from specbook.core.stats import paired_tost_p, paired_tost_t

    blocks = np.array([[2.00, 2.01], [2.10, 2.10], [1.95, 1.97], [2.05, 2.04]])
    t_lower, t_upper, df = paired_tost_t(blocks[:, 0], blocks[:, 1], 0.02)
    p = paired_tost_p(blocks, 0.02)
    assert df == 3.0
    assert p == pytest.approx(max(sps.t.sf(t_lower, df), sps.t.sf(t_upper, df)))
    assert 0 < p < 0.5  # inside a 2% margin of a mean near 2, and the sweeps agree closely
