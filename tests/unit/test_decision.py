"""specbook.decision: verdicts with every criterion's numbers, including the deterministic case."""

from __future__ import annotations

import pandas as pd
import pytest
from pydantic import ValidationError

from specbook.decision import (
    DecisionRule,
    compare_and_decide,
    evaluate,
    evaluate_difference,
    verdict_table,
)
from specbook.errors import ExperimentError
from specbook.stats import delta_vs_baseline, summarize


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
    rows, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(), n_boot=1000)
    assert rows.loc[0, "delta_pct"] == pytest.approx(-0.5)
    assert rows.loc[0, "delta_over_baseline_sd"] == pytest.approx(-0.4)
    assert [status(v, n) for n in ("sweeps", "delta_pct", "delta_over_sd", "tost")] == ["PASS", "PASS", "PASS", "FAIL"]
    assert not v.equivalent and not v.deterministic
    assert "NOT SHOWN EQUIVALENT" in v.text and "|delta| = 0.500% of baseline mean <= 1%" in v.text
    assert "|delta| = 0.40 x baseline sd" in v.text

    _, (v2,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(require_tost=False), n_boot=1000)
    assert v2.equivalent and "(reported only)" in v2.text


def test_tight_arms_are_equivalent():
    df = frame(baseline=[2.000, 2.002, 1.998], v=[2.001, 2.003, 1.999])
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(), n_boot=1000)
    assert v.equivalent and all(c.status == "PASS" for c in v.criteria)


def test_large_shift_fails_delta_criteria():
    df = frame(baseline=[1.9, 2.0, 2.1], v=[2.1, 2.2, 2.3])
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(), n_boot=1000)
    assert [status(v, n) for n in ("delta_pct", "delta_over_sd", "tost")] == ["FAIL", "FAIL", "FAIL"]
    assert "|delta| = 10.000% of baseline mean > 1%" in v.text


def test_too_few_sweeps_fails():
    df = frame(baseline=[2.0, 2.001], v=[2.0])
    rule = DecisionRule(min_sweeps=2)
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", rule, n_boot=200)
    assert status(v, "sweeps") == "FAIL" and not v.equivalent
    assert "TOST not computable: too few sweeps" in v.text


@pytest.mark.parametrize(("variant", "equivalent"), [(2.01, True), (2.03, False)])
def test_deterministic_runs_are_judged_by_margin_alone(variant, equivalent):
    df = frame(baseline=[2.0, 2.0], v=[variant, variant])
    _, (v,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(), n_boot=200)
    assert v.deterministic
    assert status(v, "delta_over_sd") == "n/a" and status(v, "tost") == "n/a"
    assert "n/a: deterministic" in v.text and "judged by the margin alone" in v.text
    assert status(v, "deterministic_margin") == ("PASS" if equivalent else "FAIL")
    assert v.equivalent is equivalent


def test_margin_mismatch_is_refused():
    df = frame(baseline=[1.9, 2.0, 2.1], v=[2.0, 2.0, 2.1])
    row = delta_vs_baseline(df, "arm", "al", "baseline", margin_pct=2.0, n_boot=100).iloc[0]
    with pytest.raises(ExperimentError, match="tost_margin_pct"):
        evaluate(DecisionRule(tost_margin_pct=1.0), row, summarize([1.9, 2.0, 2.1]), summarize([2.0, 2.0, 2.1]))


def test_positive_control_is_different():
    df = frame(baseline=[2.00, 2.01, 1.99], slow=[2.30, 2.31, 2.29], tiny=[2.004, 2.014, 1.994])
    rows = delta_vs_baseline(df, "arm", "al", "baseline", n_boot=2000)
    slow = evaluate_difference(DecisionRule(), rows.iloc[0])
    assert slow.different and slow.conclusion == "different"
    # a 0.2% shift is inside the 1% margin: not a "different" verdict even if its CI excluded 0
    tiny = evaluate_difference(DecisionRule(), rows.iloc[1])
    assert not tiny.different
    assert next(c for c in tiny.criteria if c.name == "delta_beyond_margin").status == "FAIL"


def test_verdict_table_rows_per_criterion():
    df = frame(baseline=[2.0, 2.0], a=[2.01, 2.01], b=[2.5, 2.5])
    rows, verdicts = compare_and_decide(df, "arm", "al", "baseline", DecisionRule(), n_boot=200)
    diff = evaluate_difference(DecisionRule(), rows.iloc[1])
    t = verdict_table([*verdicts, diff])
    assert set(t["arm"]) == {"a", "b"}
    assert len(t) == sum(len(v.criteria) for v in verdicts) + len(diff.criteria)
    a_rows = t[(t["arm"] == "a") & (t["kind"] == "equivalence")]
    assert set(a_rows["conclusion"]) == {"equivalent"}
    assert set(a_rows["result"]) == {"PASS", "n/a"}
    assert set(t[t["kind"] == "difference"]["conclusion"]) == {"different"}


def test_rule_describe_states_the_numbers():
    text = DecisionRule(max_abs_delta_pct=0.5, tost_margin_pct=2.0, min_sweeps=3).describe()
    assert "0.5%" in text and "+/-2%" in text and ">= 3 sweeps" in text
