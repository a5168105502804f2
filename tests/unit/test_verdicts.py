"""specbook.core.verdicts: one label per interval against a margin, on constructed data; a property test that no label
contradicts its interval (and the checker catches every other label); the checker on the labels the book wrote
before this vocabulary; sweep projections (specbook.experiments.knob_ab.sequential.project_sweeps)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from specbook.core import verdicts as v
from specbook.experiments.knob_ab import sequential

# --------------------------------------------------------------------------------------------------
# one label per case, constructed


@pytest.mark.parametrize(("estimate", "low", "high", "word"), [
    (0.1, -0.4, 0.6, v.SHOWN_EQUIVALENT),  # inside +/-1, includes 0
    (-0.3, -0.5, -0.1, v.SMALL_CHANGE),  # inside and excludes 0
    (-1.4, -2.38, -0.43, v.SHOWN_DIFFERENT),  # excludes 0, reaches past -1 (the CPU demo's fp32, issue 24)
    (-10.0, -12.0, -8.0, v.SHOWN_DIFFERENT),  # wholly beyond the margin
    (-0.28, -12.65, 12.09, v.UNDECIDED),  # the H200 CUDA-graphs interval, once labelled EQUIVALENT
    (-0.33, -1.95, 1.29, v.UNDECIDED),  # the H200 attention-backend interval, once labelled EQUIVALENT
])
def test_each_label_follows_from_the_interval_and_the_margin(estimate, low, high, word):
    lab = v.label(estimate, low, high, 1.0)
    assert lab.word == word
    assert lab.inside == (low >= -1 and high <= 1) and lab.excludes_zero == (low > 0 or high < 0)
    assert v.check_headline({"verdict": lab.verdict(), "interval": lab.interval_text("paired t")}) == []


def test_the_edges_an_interval_on_the_margin_is_inside_one_touching_zero_does_not_exclude_it():
    assert v.label(0.5, -1.0, 1.0, 1.0).word == v.SHOWN_EQUIVALENT
    assert v.label(0.5, 0.0, 1.0, 1.0).word == v.SHOWN_EQUIVALENT  # 0 is in [0, 1]
    assert v.label(0.5, 1e-9, 1.0, 1.0).word == v.SMALL_CHANGE
    assert v.label(0.5, -0.2, 1.0 + 1e-9, 1.0).word == v.UNDECIDED
    # deterministic runs: the interval is the point
    assert [v.label(x, x, x, 1.0).word for x in (0.0, 0.5, 1.5)] == [v.SHOWN_EQUIVALENT, v.SMALL_CHANGE,
                                                                     v.SHOWN_DIFFERENT]


def test_no_interval_is_undecided_and_says_why():
    lab = v.label(-3.0, math.nan, math.nan, 1.0, no_interval="an arm has 1 sweep")
    assert lab.word == v.UNDECIDED and lab.verdict() == "UNDECIDED (no interval)"
    assert lab.interval_text() == "no interval: an arm has 1 sweep" and "nothing is shown" in lab.why()
    with pytest.raises(ValueError, match="margin"):
        v.label(0.0, -1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="out of order"):
        v.label(0.0, 1.0, -1.0, 1.0)


def test_the_verdict_carries_the_size_or_the_sweeps_and_the_interval_the_margin():
    diff = v.label(-1.4, -2.38, -0.43, 1.0)
    assert diff.verdict() == "SHOWN DIFFERENT: -1.40%"
    assert diff.interval_text("paired t over 3 sweeps (df 2)") == (
        "95% CI [-2.38%, -0.43%] vs margin \u00b11%; paired t over 3 sweeps (df 2)")
    assert diff.why() == ("The 95% interval excludes 0: the change is at least -0.43%, so the change may still be "
                          "inside \u00b11%.")
    assert "beyond the margin" in v.label(-10.0, -12.0, -8.0, 1.0).why()
    und = v.label(-0.33, -1.95, 1.29, 1.0, se=0.377, n=3, design=(2, "obrien_fleming"))
    assert und.projection is not None and und.verdict() == f"UNDECIDED: ~{und.projection.more} more sweeps"
    assert "sweeps_max" in und.why() and "t(df) x sd / sqrt(N)" in und.why()
    assert v.label(0.2, 0.1, 0.3, 1.0).verdict() == "SMALL REAL CHANGE, INSIDE THE MARGIN"
    # the quantity's own unit: 3 decimals, no % sign
    assert v.label(-1.1, -1.89, -0.40, 0.05, unit="").interval_text() == "95% CI [-1.890, -0.400] vs margin \u00b10.05"


def test_the_printed_interval_keeps_the_sides_of_zero_and_the_margin_the_label_read():
    tiny = v.label(-0.002, -0.0041, -0.0001, 1.0)
    assert tiny.word == v.SMALL_CHANGE and tiny.interval_text() == "95% CI [-0.0041%, -0.0001%] vs margin \u00b11%"
    past = v.label(0.3, -0.2, 1.0001, 1.0)
    assert past.interval_text().startswith("95% CI [-0.2000%, +1.0001%]")  # as many decimals as show it past 1%


def test_expectation_and_rule_are_their_own_lines():
    assert v.expectation_text("different", v.SHOWN_DIFFERENT) == "expected different: yes"
    assert v.expectation_text("equivalent", v.SMALL_CHANGE) == "expected equivalent: yes"
    assert v.expectation_text("equivalent", v.UNDECIDED) == "expected equivalent: no"
    assert v.expectation_met("different", v.SMALL_CHANGE) is False and v.expectation_met("unknown", v.UNDECIDED) is None
    assert v.rule_text(True) == "meets the stated rule: yes" and v.rule_text(None) == ""


# --------------------------------------------------------------------------------------------------
# the property: no label contradicts its interval, and the checker catches every other label

bounds = st.one_of(st.floats(-50, 50, allow_nan=False, allow_infinity=False),
                   st.sampled_from([0.0, 1.0, -1.0, 2.5, -2.5, 1e-7, -1e-7]))


@settings(max_examples=400, deadline=None)
@given(a=bounds, b=bounds, margin=st.sampled_from([0.5, 1.0, 2.5, 0.3]), where=st.floats(0, 1),
       unit=st.sampled_from(["%", ""]))
def test_no_label_contradicts_its_interval_and_every_other_label_does(a, b, margin, where, unit):
    low, high = min(a, b), max(a, b)
    estimate = min(max(low + where * (high - low), low), high)  # inside the interval, float rounding aside
    lab = v.label(estimate, low, high, margin, unit=unit)
    assert lab.inside == v.is_inside(low, high, margin) and lab.excludes_zero == v.excludes_zero(low, high)
    assert lab.word == {(True, False): v.SHOWN_EQUIVALENT, (True, True): v.SMALL_CHANGE,
                        (False, True): v.SHOWN_DIFFERENT, (False, False): v.UNDECIDED}[(lab.inside, lab.excludes_zero)]
    interval = lab.interval_text("paired t over 3 sweeps (df 2)")
    assert v.check_headline({"comparison": "x vs baseline", "verdict": lab.verdict(), "interval": interval}) == []
    for other in set(v.WORDS) - {lab.word}:
        wrong = v.Label(other, estimate, low, high, margin, unit=unit, digits=lab.digits).verdict()
        assert v.check_headline({"verdict": wrong, "interval": interval}), (other, interval)


# --------------------------------------------------------------------------------------------------
# the checker on what the book wrote before (issue 24's list: docs/reports summary.json as committed before)

BEFORE = [
    # knob_ab-h200-cuda-graphs: a green EQUIVALENT on [-12.65%, +12.09%], no margin stated
    ({"comparison": "cuda_graphs vs baseline", "verdict": "EQUIVALENT",
      "interval": "95% CI of delta [-12.65%, +12.09%], paired t over 2 sweeps (df 1)"}, "states no margin"),
    # the same with its margin: the interval does not lie inside it
    ({"comparison": "cuda_graphs vs baseline", "verdict": "EQUIVALENT",
      "interval": "95% CI of delta [-12.65%, +12.09%] (margin \u00b11%)"}, "does not lie inside the margin"),
    ({"comparison": "triton_attn vs baseline", "verdict": "EQUIVALENT",
      "interval": "95% CI of delta [-1.95%, +1.29%], margin +/-1%"}, "does not lie inside the margin"),
    # config_flip-h200: labels without an interval that do not say they hold for this run only
    ({"comparison": "arm1-100.0 vs arm0-100000.0 (best)", "verdict": "COLLAPSED",
      "interval": "one server per arm: no interval (the counters cover every token of the window)"}, "in this run"),
    ({"comparison": "outputs across arms", "verdict": "EQUAL", "interval": ""}, "in this run"),
    ({"comparison": "baseline: throughput", "verdict": "STILL GROWING", "interval": ""}, "in this run"),
    # a claim of a difference whose interval includes 0
    ({"comparison": "int4 at 4", "verdict": "AL MOVED", "interval": "95% t interval [-2.71, 0.482]"}, "includes 0"),
    ({"comparison": "x", "verdict": "NOT SHOWN TO MOVE AL", "interval": "95% t interval [-1.82, -0.707]"},
     "excludes 0"),
    ({"comparison": "x", "verdict": "SHOWN DIFFERENT: -5.00%", "interval": "95% CI [-2.38%, -0.43%] vs margin \u00b11%"},
     "stated size"),
    ({"comparison": "x", "verdict": "SHOWN EQUIVALENT", "interval": "95% CI [-0.5, 0.2] vs margin \u00b11%"},
     "margin in %"),
    ({"comparison": "x", "verdict": "SHOWN EQUIVALENT", "interval": "no interval: one sweep"}, "has no interval"),
    ({"comparison": "lane off", "verdict": "llamacpp/vllm tok/s 4.28x", "interval": "95% CI [0.553, 3.06]"},
     "outside its interval"),
]


@pytest.mark.parametrize(("headline", "why"), BEFORE)
def test_the_checker_names_each_label_that_says_more_than_its_interval(headline, why):
    problems = v.check_headline(headline)
    assert problems and why in problems[0], problems


@pytest.mark.parametrize("headline", [
    # what the committed reports' other headlines said: true to their intervals
    {"verdict": "AL MOVED", "interval": "95% t interval [-1.82, -0.707] over 2 paired sweeps"},
    {"verdict": "NOT SHOWN TO MOVE AL", "interval": "95% t interval [-2.71, 0.482] over 2 paired sweeps"},
    {"verdict": "llamacpp-cuda/vllm-cuda tok/s 1.62x", "interval": "95% CI [1.34, 1.94]"},
    {"verdict": "llamacpp/vllm tok/s 1.05x", "interval": "95% CI [0, 15.93] (one cell: that cell's own CI)"},
    {"verdict": "NO COMPARABLE CELL", "interval": ""},
    {"verdict": "LEFT OUT", "interval": ""},
    {"verdict": "COLLAPSED in this run", "interval": "one server per arm: no run-to-run interval"},
    {"verdict": "UNDECIDED (no interval)", "interval": "no interval: an arm has 1 sweep"},
])
def test_the_checker_passes_labels_true_to_their_intervals(headline):
    assert v.check_headline(headline) == []


def test_check_report_folders_reads_every_summary_and_skips_earlier_renders(tmp_path):
    import json

    good = {"headlines": [{"comparison": "a", "verdict": "SHOWN DIFFERENT: -2.00%",
                           "interval": "95% CI [-3.00%, -1.00%] vs margin \u00b11%"}]}
    bad = {"headlines": [{"comparison": "b", "verdict": "EQUIVALENT", "interval": "95% CI [-12%, +12%]"}]}
    for name, doc in (("one", good), ("two", bad), ("two/renders/1", bad)):
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
        (tmp_path / name / "summary.json").write_text(json.dumps(doc))
    (tmp_path / "three").mkdir()
    (tmp_path / "three" / "summary.json").write_text("{torn")
    found = v.check_report_folders(tmp_path)
    assert set(found) == {"one", "two", "three"} and found["one"] == []
    assert "states no margin" in found["two"][0] and "cannot be read" in found["three"][0]
    assert len(v.all_problems(found)) == 2


# --------------------------------------------------------------------------------------------------
# projections


def test_the_projection_is_the_t_half_width_at_n_sweeps_with_the_sd_as_observed():
    # paired sd 0.653% per sweep over 3 sweeps, estimate -0.33%, margin 1%
    se = 0.653 / math.sqrt(3)
    p = sequential.project_sweeps(-0.33, se, 3, 1.0)
    half = [sps.t.ppf(0.975, n - 1) * 0.653 / math.sqrt(n) for n in range(4, 100)]
    fits = next(n for n, h in zip(range(4, 100), half, strict=False) if 0.33 + h <= 1.0)
    zero = next(n for n, h in zip(range(4, 100), half, strict=False) if h < 0.33)
    assert (p.to_equivalence, p.to_difference) == (fits, zero) and p.sweeps_max is None
    assert p.sd == pytest.approx(0.653) and p.first == fits and p.more == fits - 3


def test_the_sequential_projection_needs_at_least_the_fixed_sweeps_and_reaches_its_boundary():
    se = 0.653 / math.sqrt(3)
    p = sequential.project_sweeps(-0.33, se, 3, 1.0, sequential=(2, "obrien_fleming"))
    assert p.sweeps_max is not None and p.sweeps_max >= p.first
    n = p.sweeps_max
    c_e = sequential.paired_t_boundaries(2, n, 0.025, "obrien_fleming", False)[-1]
    c_d = sequential.paired_t_boundaries(2, n, 0.05, "obrien_fleming", True)[-1]
    se_n = 0.653 / math.sqrt(n)
    assert 0.33 / se_n >= c_d or (1.0 - 0.33) / se_n >= c_e
    assert p.more == n - 3


def test_no_projection_without_noise_and_none_where_a_route_cannot_decide():
    assert sequential.project_sweeps(0.5, 0.0, 3, 1.0) is None
    assert sequential.project_sweeps(0.5, math.nan, 3, 1.0) is None
    beyond = sequential.project_sweeps(-10.0, 20.0, 2, 1.0)
    assert beyond.to_equivalence is None and beyond.to_difference is not None  # |estimate| >= margin
    zero = sequential.project_sweeps(0.0, 1.0, 2, 1.0)
    assert zero.to_difference is None and zero.to_equivalence is not None
    lab = v.label(-10.0, -60.0, 40.0, 1.0, se=20.0, n=2)
    assert "never fit inside \u00b11%" in lab.why() and "rough" in lab.why()


# --------------------------------------------------------------------------------------------------
# every committed report and every golden folder's analysis


def test_no_committed_report_or_golden_analysis_has_a_label_that_contradicts_its_interval(tmp_path):
    import json
    import shutil

    import specbook.experiments  # noqa: F401  (experiments register at import)
    from specbook.core.params import load_params
    from specbook.core.paths import project_root
    from specbook.experiments.registry import get_experiment
    from specbook.store.runstore import RunContext

    root = project_root()
    found = v.check_report_folders(root / "docs" / "reports")
    assert {"knob_ab-h200-attention-backend-both", "knob_ab-h200-cuda-graphs", "concurrency_curve-h200",
            "config_flip-h200"} <= set(found), sorted(found)
    problems = v.all_problems(found)
    golden = sorted(p.parent for p in (root / "tests" / "golden").glob("*/expected_figures.json"))
    assert len(golden) >= 4
    for src in golden:
        folder = tmp_path / src.name
        shutil.copytree(src, folder)
        spec = get_experiment(json.loads((folder / "manifest.json").read_text())["experiment"])
        params = load_params(spec.params_model, folder / "params.yaml")
        summary = spec.analyze(spec.load(RunContext.from_run_dir(folder)), params).answer(params)
        assert summary.headlines, src.name
        problems += [f"tests/golden/{src.name}: {p}" for p in v.check_summary(summary)]
    assert problems == []


def test_a_comparison_with_one_sweep_has_no_interval_and_says_so_once():
    import pandas as pd

    from specbook.experiments.knob_ab.decision import DecisionRule, compare_and_decide

    df = pd.DataFrame({"arm": ["baseline", "baseline", "v"], "al": [2.0, 2.01, 1.9]})
    _, (verdict,) = compare_and_decide(df, "arm", "al", "baseline", DecisionRule())
    lab = verdict.label
    assert lab.word == v.UNDECIDED and lab.verdict() == "UNDECIDED (no interval)"
    assert lab.interval_text() == "no interval: an arm has 1 sweep, so its run-to-run sd is unknown"
    assert v.check_headline({"verdict": lab.verdict(), "interval": lab.interval_text()}) == []


def test_a_ratio_label_reads_its_interval_against_1():
    # a cross-engine ratio: "no difference" is 1x, not 0
    ok = {"comparison": "lane draft-int4: TTFT", "verdict": "0.162x undecided", "interval": "95% CI [0.0018, 14.6]"}
    assert v.check_headline(ok) == []
    decided = {**ok, "verdict": "0.4x undecided", "interval": "95% CI [0.3, 0.5]"}
    (problem,) = v.check_headline(decided)
    assert "excludes 1" in problem
