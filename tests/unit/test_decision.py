"""specbook.experiments.knob_ab.decision: each comparison's label (from its interval) beside the stated rule's outcome with every
criterion's numbers, including the deterministic case."""

from __future__ import annotations

import pandas as pd
import pytest
from pydantic import ValidationError

from specbook.core.errors import ExperimentError
from specbook.core.stats import delta_vs_baseline, summarize
from specbook.experiments.knob_ab.decision import (
    Criterion,
    DecisionRule,
    compare_and_decide,
    delta_over_sd_criterion,
    delta_pct_criterion,
    deterministic_margin_criterion,
    evaluate,
    evaluate_difference,
    sweeps_criterion,
    tost_criterion,
    verdict_table,
)


def frame(**arms: list[float]) -> pd.DataFrame:
    return pd.DataFrame([{"arm": a, "al": v} for a, vals in arms.items() for v in vals])


def status(verdict, name: str) -> str:
    return next(c.status for c in verdict.criteria if c.name == name)


def test_rule_is_strict_about_fields():
    with pytest.raises(ValidationError):
        DecisionRule(max_abs_delta_pct=1.0, margin=2)
    with pytest.raises(ValidationError):
        DecisionRule(alpha=1.5)


def test_submitters_case_passes_delta_criteria_but_not_tost():
    # AL -0.5% and 0.4 x baseline sd, 3 sweeps per arm: |delta| and delta/sd pass, TOST with a
    # +/-1% margin cannot pass with this much noise (p ~ 0.32).
    df = frame(baseline=[1.975, 2.000, 2.025], fp32=[1.965, 1.990, 2.015])
    rows, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule())
    assert rows.loc[0, "delta_pct"] == pytest.approx(-0.5)
    assert rows.loc[0, "delta_over_baseline_sd"] == pytest.approx(-0.4)
    assert [status(v, n) for n in ("sweeps", "delta_pct", "delta_over_sd", "tost")] == ["PASS", "PASS", "PASS", "FAIL"]
    assert not v.equivalent and not v.deterministic and not v.meets_rule
    # the label reads the interval: [-3.33%, +2.33%] includes 0 and reaches past +/-1%
    assert v.conclusion == "undecided" and v.text.startswith("fp32 vs baseline: UNDECIDED: ~")
    assert "meets the stated rule: no" in v.text and "|delta| = 0.500% of baseline mean <= 1%" in v.text
    assert "|delta| = 0.40 x baseline sd" in v.text

    _, (v2,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(require_tost=False))
    # the stated rule is met on the point alone; the label stays what the interval shows
    assert v2.equivalent and v2.meets_rule and "(reported only)" in v2.text
    assert v2.conclusion == "undecided" and "meets the stated rule: yes" in v2.text


def test_tight_arms_are_equivalent():
    df = frame(baseline=[2.000, 2.002, 1.998], v=[2.001, 2.003, 1.999])
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule())
    assert v.equivalent and all(c.status == "PASS" for c in v.criteria)
    assert v.conclusion == "shown equivalent" and v.label.inside and not v.label.excludes_zero


def test_large_shift_fails_delta_criteria():
    df = frame(baseline=[1.9, 2.0, 2.1], v=[2.1, 2.2, 2.3])
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule())
    assert [status(v, n) for n in ("delta_pct", "delta_over_sd", "tost")] == ["FAIL", "FAIL", "FAIL"]
    assert "|delta| = 10.000% of baseline mean > 1%" in v.text


def test_too_few_sweeps_fails():
    df = frame(baseline=[2.0, 2.001], v=[2.0])
    rule = DecisionRule(min_sweeps=2)
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", rule)
    assert status(v, "sweeps") == "FAIL" and not v.equivalent
    assert "TOST not computable: too few sweeps" in v.text


@pytest.mark.parametrize(("variant", "equivalent"), [(2.01, True), (2.03, False)])
def test_deterministic_runs_are_judged_by_margin_alone(variant, equivalent):
    df = frame(baseline=[2.0, 2.0], v=[variant, variant])
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule())
    assert v.deterministic
    assert status(v, "delta_over_sd") == "n/a" and status(v, "tost") == "n/a"
    assert "n/a: deterministic" in v.text and "judged by the margin alone" in v.text
    assert status(v, "deterministic_margin") == ("PASS" if equivalent else "FAIL")
    assert v.equivalent is equivalent


def test_margin_mismatch_is_refused():
    df = frame(baseline=[1.9, 2.0, 2.1], v=[2.0, 2.0, 2.1])
    row = delta_vs_baseline(df, "arm", "al", "baseline", margin_pct=2.0).iloc[0]
    with pytest.raises(ExperimentError, match="tost_margin_pct"):
        evaluate(DecisionRule(tost_margin_pct=1.0), row, summarize([1.9, 2.0, 2.1]), summarize([2.0, 2.0, 2.1]))


def test_positive_control_is_different():
    df = frame(baseline=[2.00, 2.01, 1.99], slow=[2.30, 2.31, 2.29], tiny=[2.004, 2.014, 1.994])
    rows = delta_vs_baseline(df, "arm", "al", "baseline")
    slow = evaluate_difference(DecisionRule(), rows.iloc[0])
    assert slow.different and slow.conclusion == "shown different"
    # a 0.2% shift is inside the 1% margin: the stated rule says not different; the interval, [-0.63%, +1.03%]
    # (Welch), includes 0 and reaches past the margin: undecided
    tiny = evaluate_difference(DecisionRule(), rows.iloc[1])
    assert not tiny.different and tiny.conclusion == "undecided"
    assert next(c for c in tiny.criteria if c.name == "delta_beyond_margin").status == "FAIL"


def test_verdict_table_rows_per_criterion():
    df = frame(baseline=[2.0, 2.0], a=[2.01, 2.01], b=[2.5, 2.5])
    rows, verdicts = compare_and_decide(df, "arm", "al", "baseline", DecisionRule())
    diff = evaluate_difference(DecisionRule(), rows.iloc[1])
    t = verdict_table([*verdicts, diff])
    assert set(t["arm"]) == {"a", "b"}
    assert len(t) == sum(len(v.criteria) for v in verdicts) + len(diff.criteria)
    a_rows = t[(t["arm"] == "a") & (t["kind"] == "equivalence")]
    # deterministic +0.5%: the interval is the point, inside +/-1% and excluding 0; the rule is met
    assert set(a_rows["conclusion"]) == {"small real change, inside the margin"} and a_rows["meets_rule"].all()
    assert set(a_rows["result"]) == {"PASS", "n/a"}
    assert set(t[t["kind"] == "difference"]["conclusion"]) == {"shown different"}


def test_rule_describe_states_the_numbers():
    text = DecisionRule(max_abs_delta_pct=0.5, tost_margin_pct=2.0, min_sweeps=3).describe()
    assert "0.5%" in text and "+/-2%" in text and ">= 3 sweeps" in text


# --------------------------------------------------------------------------------------------------
# evaluate, criterion by criterion (the split must not change a character of the verdict)

RULE_TEXT = (
    "  rule: equivalent iff >= 2 sweeps per arm, |delta| <= 1% of the baseline mean, |delta| <= 1 x baseline sd, "
    "and TOST p < 0.05 for a +/-1% margin (required); when both arms are deterministic (sd = 0) the sd and TOST "
    "criteria are n/a and |delta| <= 1% decides. 'different' iff the delta's 95% t CI excludes 0 and "
    "|delta| > 1%. Intervals and tests: paired t on per-sweep differences (df n_sweeps - 1) when the comparison "
    "is paired by sweep and every sweep has both arms, else Welch t on run means (Welch-Satterthwaite df); each "
    "comparison names its method."
)


def test_verdict_text_reads_the_label_then_the_stated_rule_noisy_runs():
    df = frame(baseline=[1.975, 2.000, 2.025], fp32=[1.965, 1.990, 2.015])
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule())
    assert v.text == "\n".join([
        "fp32 vs baseline: UNDECIDED: ~47 more sweeps (95% CI [-3.33%, +2.33%] vs margin \u00b11%)",
        "  meets the stated rule: no (the rule for 'equivalent')",
        "  PASS sweeps: min sweeps per arm = 3 (baseline 3, variant 3) >= 2 required",
        "  PASS delta_pct: |delta| = 0.500% of baseline mean <= 1% (delta -0.500%)",
        "  PASS delta_over_sd: |delta| = 0.40 x baseline sd (0.025) <= 1",
        "  FAIL tost: TOST p = 0.3249 >= alpha 0.05 for +/-1% margin",
        RULE_TEXT,
    ])
    assert [(c.name, c.threshold, c.required) for c in v.criteria] == [
        ("sweeps", 2, True), ("delta_pct", 1.0, True), ("delta_over_sd", 1.0, True), ("tost", 0.05, True)]
    assert v.criteria[0].value == 3 and v.criteria[1].value == pytest.approx(-0.5)
    assert v.criteria[2].value == pytest.approx(-0.4) and v.criteria[3].value == pytest.approx(0.3249, abs=1e-4)


def test_verdict_text_reads_the_label_then_the_stated_rule_deterministic_runs():
    df = frame(baseline=[2.0, 2.0], v=[2.03, 2.03])
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule())
    assert v.text == "\n".join([
        "v vs baseline: SHOWN DIFFERENT: +1.50% (95% CI [+1.50%, +1.50%] vs margin \u00b11%)",
        "  meets the stated rule: no (the rule for 'equivalent') (deterministic runs: the rule is judged by the "
        "margin alone)",
        "  PASS sweeps: min sweeps per arm = 2 (baseline 2, variant 2) >= 2 required",
        "  FAIL delta_pct: |delta| = 1.500% of baseline mean > 1% (delta +1.500%)",
        "  n/a delta_over_sd: n/a: deterministic (sd = 0 in both arms)",
        "  n/a tost: n/a: deterministic (t undefined with zero variance)",
        "  FAIL deterministic_margin: runs are deterministic, so the margin alone decides: |delta| = 1.500% > 1%",
        RULE_TEXT,
    ])


def test_zero_baseline_sd_with_a_noisy_variant_fails_the_sd_criterion():
    df = frame(baseline=[2.0, 2.0, 2.0], v=[2.0, 2.1, 2.2])
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(require_tost=False))
    assert not v.deterministic and [c.name for c in v.criteria] == ["sweeps", "delta_pct", "delta_over_sd", "tost"]
    assert "FAIL delta_over_sd: |delta| = inf x baseline sd (0) > 1" in v.text
    assert not next(c for c in v.criteria if c.name == "tost").required


def test_each_criterion_function_returns_its_criterion():
    rule = DecisionRule()
    df = frame(baseline=[1.975, 2.000, 2.025], fp32=[1.965, 1.990, 2.015])
    row = delta_vs_baseline(df, "arm", "al", "baseline").iloc[0]
    base, var = summarize([1.975, 2.000, 2.025]), summarize([1.965, 1.990, 2.015])
    made = [
        sweeps_criterion(rule, base, summarize([2.0])),
        delta_pct_criterion(rule, 1.5),
        delta_over_sd_criterion(rule, row, base, deterministic=True),
        tost_criterion(DecisionRule(require_tost=False), row, deterministic=False),
        deterministic_margin_criterion(rule, -0.9),
    ]
    assert all(isinstance(c, Criterion) for c in made)
    assert [(c.name, c.status) for c in made] == [
        ("sweeps", "FAIL"), ("delta_pct", "FAIL"), ("delta_over_sd", "n/a"), ("tost", "FAIL"),
        ("deterministic_margin", "PASS")]
    assert made[0].text == "FAIL sweeps: min sweeps per arm = 1 (baseline 3, variant 1) >= 2 required"
    assert made[3].text.endswith("(reported only)") and not made[3].required
    # evaluate is these functions in this order
    v = evaluate(rule, row, base, var)
    assert v.criteria == [
        sweeps_criterion(rule, base, var),
        delta_pct_criterion(rule, float(row["delta_pct"])),
        delta_over_sd_criterion(rule, row, base, deterministic=False),
        tost_criterion(rule, row, deterministic=False),
    ]


# --------------------------------------------------------------------------------------------------
# compare_and_decide with expectations: the verdicts knob_ab._judge gave


KNOB_EXPECT = {"fp32": "equivalent", "slow": "different"}


def expectation_of(arm_name: str) -> str:
    """knob_ab._expectation_of: an arm with a knob expected to move AL is judged for a difference."""
    expects = {KNOB_EXPECT[k] for k in arm_name.split("+") if k != "baseline"}
    return "different" if "different" in expects else "equivalent"


def judge_reference(df, value_col, baseline, rule, arms=None, label=None):
    """knob_ab._judge as it was before compare_and_decide took it over (the reference numbers)."""
    part = df if arms is None else df[df["arm"].isin([baseline, *arms])]
    rows = delta_vs_baseline(part, "arm", value_col, baseline, margin_pct=rule.tost_margin_pct, ci=1 - rule.alpha)
    base = summarize(part.loc[part["arm"] == baseline, value_col])
    verdicts = []
    for _, row in rows.iterrows():
        arm = row["arm"]
        if expectation_of(label or arm) == "different":
            verdicts.append(evaluate_difference(rule, row))
        else:
            verdicts.append(evaluate(rule, row, base, summarize(part.loc[part["arm"] == arm, value_col])))
    return rows, verdicts


def crossed_runs() -> pd.DataFrame:
    """A crossed 2x2 knob A/B in interleaved sweep order: fp32 changes nothing, slow moves AL by ~15%."""
    values = {
        "baseline": [2.000, 2.010, 1.990, 2.004],
        "fp32": [2.001, 2.008, 1.992, 2.003],
        "slow": [2.300, 2.310, 2.290, 2.296],
        "fp32+slow": [2.302, 2.305, 2.291, 2.299],
    }
    order = [["slow", "baseline", "fp32+slow", "fp32"], ["fp32", "slow", "baseline", "fp32+slow"],
             ["baseline", "fp32+slow", "fp32", "slow"], ["fp32+slow", "fp32", "slow", "baseline"]]
    return pd.DataFrame([{"arm": a, "sweep": s, "al": values[a][s]} for s, arms in enumerate(order) for a in arms])


def same(verdicts, reference) -> bool:
    return [repr(v) for v in verdicts] == [repr(v) for v in reference]  # repr: NaN values compare equal


@pytest.mark.parametrize("rule", [DecisionRule(), DecisionRule(tost_margin_pct=2.0, require_tost=False)])
def test_compare_and_decide_gives_the_verdicts_judge_gave(rule):
    df = crossed_runs()
    rows, verdicts = compare_and_decide(df, "arm", "al", "baseline", rule,
                                        expectation=expectation_of)
    ref_rows, ref = judge_reference(df, "al", "baseline", rule)
    pd.testing.assert_frame_equal(rows, ref_rows)
    assert same(verdicts, ref)
    kinds = {v.arm: v.kind for v in verdicts}
    assert kinds == {"slow": "difference", "fp32+slow": "difference", "fp32": "equivalence"}
    assert {v.arm: v.conclusion for v in verdicts}["slow"] == "shown different"


def test_compare_and_decide_restricted_to_arms_gives_the_knob_effects_judge_gave():
    """knob_ab._knob_effects: A+B vs B for each knob, judged by the knob's own expectation (its label)."""
    df, rule = crossed_runs(), DecisionRule()
    for knob, other in (("fp32", "slow"), ("slow", "fp32")):
        rows, verdicts = compare_and_decide(df, "arm", "al", other, rule, arms=["fp32+slow"],
                                            expectation=lambda _arm, k=knob: expectation_of(k))
        ref_rows, ref = judge_reference(df, "al", other, rule, arms=["fp32+slow"], label=knob)
        pd.testing.assert_frame_equal(rows, ref_rows)
        assert same(verdicts, ref)
        (v,) = verdicts
        assert (v.arm, v.baseline, v.kind) == ("fp32+slow", other, "equivalence" if knob == "fp32" else "difference")


def test_compare_and_decide_without_expectation_judges_equivalence_everywhere():
    df = crossed_runs()
    rows, verdicts = compare_and_decide(df, "arm", "al", "baseline", DecisionRule())
    _, with_equiv = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(),
                                       expectation=lambda _arm: "equivalent")
    assert {v.kind for v in verdicts} == {"equivalence"} and same(verdicts, with_equiv)
    assert list(rows["arm"]) == ["slow", "fp32+slow", "fp32"]  # order of first appearance, as before


def test_compare_and_decide_refuses_a_bad_expectation_or_unknown_arm():
    df = crossed_runs()
    with pytest.raises(ExperimentError, match=r"expectation for arm 'slow' is 'faster'"):
        compare_and_decide(df, "arm", "al", "baseline", DecisionRule(), expectation=lambda _a: "faster")
    with pytest.raises(ExperimentError, match=r"arms \['nope'\] are not in column 'arm'"):
        compare_and_decide(df, "arm", "al", "baseline", DecisionRule(), arms=["nope"])


# --------------------------------------------------------------------------------------------------
# paired by sweep


def swept(**arms: list[float]) -> pd.DataFrame:
    return pd.DataFrame([{"arm": a, "sweep": s, "al": v} for a, vals in arms.items() for s, v in enumerate(vals)])


def test_a_shared_sweep_effect_hides_a_difference_from_welch_but_not_from_the_pairing():
    # each sweep serves its own question draw: all arms move together by sweep; the knob costs ~0.25 AL
    df = swept(baseline=[4.0, 4.6, 4.2], slow=[3.74, 4.37, 3.94])
    rule = DecisionRule()
    rows, (paired,) = compare_and_decide(df, "arm", "al", "baseline", rule, expectation=lambda _a: "different",
                                         sweep_col="sweep")
    _, (welch,) = compare_and_decide(df, "arm", "al", "baseline", rule, expectation=lambda _a: "different")
    assert paired.different and not welch.different
    lo, hi = rows.loc[0, "ci_low"], rows.loc[0, "ci_high"]
    assert paired.criteria[0].text == (f"PASS ci_excludes_zero: 95% CI of delta [{lo:.4g}, {hi:.4g}], "
                                       "paired t over 3 sweeps (df 2), excludes 0")
    assert welch.criteria[0].text.startswith("FAIL ci_excludes_zero: 95% Welch t CI of delta [")


def test_a_welch_fallback_says_why_it_is_not_paired():
    df = swept(baseline=[4.0, 4.6, 4.2], slow=[3.74, 4.37, 3.94])
    df = df[~((df["arm"] == "slow") & (df["sweep"] == 2))]
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(), expectation=lambda _a: "different",
                                 sweep_col="sweep")
    assert v.criteria[0].text.startswith("FAIL ci_excludes_zero: 95% Welch t CI of delta [")
    assert v.criteria[0].text.endswith("includes 0; not paired: sweeps unbalanced: sweep 2 lacks 'slow'")
