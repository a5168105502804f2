"""specbook.experiments.knob_ab.sequential: alpha spending, boundaries against published values, verdicts, and error rates
measured by simulation (seeded): P(0 excluded | no effect) <= alpha, P(inside the margin | |delta| = margin) <=
alpha / 2 (each TOST test at alpha / 2: the (1 - alpha) interval the labels read); sweep projections.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from specbook.core.errors import ExperimentError, ParamsError
from specbook.core.params import validate_params
from specbook.experiments import knob_ab
from specbook.experiments.knob_ab import sequential as sq
from specbook.experiments.knob_ab.decision import DecisionRule

PARAMS = {
    "engine": {"engine": "vllm", "model": "org/target", "dtype": "bfloat16",
               "speculative_config": {"method": "draft_model", "model": "org/draft-fp8", "num_speculative_tokens": 4}},
    "knobs": [
        {"name": "fp32", "set": {"dtype": "float32"}, "expect": "equivalent"},
        {"name": "int4", "set": {"speculative_config.model": "org/draft-int4"}, "expect": "different"},
    ],
    "crossed": False,
    "sweeps": 2,
    "sweeps_min": 2,
    "sweeps_max": 8,
    "measurement": {"primary": "counter_al"},
}


def params(**overrides):
    return validate_params(knob_ab.KnobABParams, {**PARAMS, **overrides}, "test-params.yaml")


# ------------------------------------------------------------------------------------------------
# spending and boundaries


@pytest.mark.parametrize("spending", sq.SPENDING_FUNCTIONS)
def test_spending_is_increasing_and_reaches_alpha(spending):
    spent = [sq.spent_alpha(t, 0.05, spending) for t in (0.1, 0.3, 0.6, 1.0)]
    assert spent == sorted(spent) and spent[0] > 0
    assert spent[-1] == pytest.approx(0.05)


def test_obrien_fleming_boundaries_match_published_values():
    # Lan-DeMets O'Brien-Fleming, 5 equally spaced looks, one-sided 0.025 (gsDesign sfLDOF; Jennison &
    # Turnbull, Group Sequential Methods, ch. 7): 4.877, 3.357, 2.680, 2.290, 2.031
    z = sq.z_boundaries((0.2, 0.4, 0.6, 0.8, 1.0), 0.025, "obrien_fleming", False)
    assert z == pytest.approx((4.877, 3.357, 2.680, 2.290, 2.031), abs=2e-3)
    # two-sided 0.05 spends 0.025 in each tail: the same boundaries
    assert sq.z_boundaries((0.2, 0.4, 0.6, 0.8, 1.0), 0.05, "obrien_fleming", True) == pytest.approx(z, abs=1e-6)


def test_pocock_boundaries_are_nearly_flat_and_one_look_is_the_fixed_test():
    z = sq.z_boundaries((0.2, 0.4, 0.6, 0.8, 1.0), 0.025, "pocock", False)
    assert z == pytest.approx((2.438, 2.427, 2.410, 2.397, 2.386), abs=3e-3)
    assert sq.z_boundaries((1.0,), 0.05, "pocock", False)[0] == pytest.approx(sps.norm.isf(0.05))
    assert sq.z_boundaries((1.0,), 0.05, "obrien_fleming", True)[0] == pytest.approx(sps.norm.isf(0.025))


def _nested_paired_t(draws: int, sweeps: int, seed: int) -> np.ndarray:
    """(draws, sweeps) paired t of the first n standard-normal differences (column n-1; NaN for n = 1)."""
    x = np.random.default_rng(seed).standard_normal((draws, sweeps))
    n = np.arange(1, sweeps + 1)
    mean = x.cumsum(1) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        var = (np.cumsum(x * x, 1) - n * mean * mean) / (n - 1)
        return mean / np.sqrt(var / n)


@pytest.mark.parametrize(("spending", "lo", "hi"), [("obrien_fleming", 2, 4), ("obrien_fleming", 2, 10),
                                                    ("pocock", 3, 8)])
@pytest.mark.parametrize("two_sided", [True, False])
def test_paired_t_boundaries_spend_the_planned_alpha_look_by_look(spending, lo, hi, two_sided):
    """On draws independent of the calibration's: the share of null sequences that first cross at each look is
    that look's spent alpha, within 4 Monte-Carlo standard errors (of these draws and the calibration's)."""
    draws = 100_000
    t = _nested_paired_t(draws, hi, seed=99)
    stat = np.abs(t) if two_sided else t
    bounds = sq.paired_t_boundaries(lo, hi, 0.05, spending, two_sided)
    tails, tail_alpha = (2, 0.025) if two_sided else (1, 0.05)
    running, prev = np.ones(draws, bool), 0.0
    for k, n in enumerate(range(lo, hi + 1)):
        spent = tails * sq.spent_alpha(n / hi, tail_alpha, spending)
        cross = running & (stat[:, n - 1] >= bounds[k])
        # Monte-Carlo error of this check's draws and of the calibration's own
        se = math.sqrt(max(spent - prev, 1e-4) * (1 / draws + 1 / sq.CALIBRATION_DRAWS))
        assert cross.mean() == pytest.approx(spent - prev, abs=4 * se), (n, cross.mean(), spent - prev)
        running &= ~cross
        prev = spent
    assert 1 - running.mean() == pytest.approx(0.05, abs=4 * math.sqrt(0.05 * 0.95 / draws))
    # the first look has heavier tails than the normal: its t boundary is above the normal one at the same level
    z = sq.z_boundaries(sq.look_fractions(lo, hi), 0.05, spending, two_sided)
    assert bounds[0] > z[0]


def test_one_look_is_the_fixed_t_test():
    for n in (2, 3, 6):
        assert sq.paired_t_boundaries(n, n, 0.05, "obrien_fleming", True)[0] == pytest.approx(
            sps.t.isf(0.025, n - 1), rel=0.02)
        assert sq.paired_t_boundaries(n, n, 0.05, "pocock", False)[0] == pytest.approx(sps.t.isf(0.05, n - 1),
                                                                                        rel=0.02)


@pytest.mark.parametrize(("spending", "lo", "hi"), [("obrien_fleming", 2, 4), ("obrien_fleming", 2, 10),
                                                    ("pocock", 3, 8)])
def test_the_paired_difference_test_rejects_a_true_null_at_alpha(spending, lo, hi):
    """The difference test alone (margin 0, so no equivalence and no margin condition) on null paired runs:
    its rejection rate is alpha within 4 Monte-Carlo standard errors. The normal boundaries converted at the
    same tail area (the book's method before) gave 5.6-5.8% here."""
    reps = 40_000
    rng = np.random.default_rng(20261202)
    sweep = rng.normal(0, 3, (reps, hi))
    oc = sq.operating_characteristics(rng.normal(100, 1, (reps, hi)) + sweep, rng.normal(100, 1, (reps, hi)) + sweep,
                                      margin_pct=0.0, alpha=0.05, sweeps_min=lo, sweeps_max=hi, spending=spending,
                                      paired=True)
    assert oc.p_different == pytest.approx(0.05, abs=4 * math.sqrt(0.05 * 0.95 / reps))


def test_decide_says_how_its_t_boundaries_were_set():
    base, var = [4.30, 4.31, 4.29], [4.20, 4.22, 4.19]
    paired = sq.decide(base, var, margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=4, paired=True)
    welch = sq.decide(base, var, margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=4)
    assert paired.boundaries.t_from == sq.PAIRED_CALIBRATION
    assert paired.boundaries.t_difference == sq.paired_t_boundaries(2, 4, 0.05, "obrien_fleming", True)[1]
    assert welch.boundaries.t_from == sq.WELCH_CONVERSION
    assert welch.boundaries.t_difference == pytest.approx(sq.t_bound(welch.boundaries.z_difference,
                                                                     welch.boundaries.df))


def test_bad_looks_are_refused():
    with pytest.raises(ExperimentError, match="increase"):
        sq.z_boundaries((0.5, 0.4), 0.05, "pocock", False)
    with pytest.raises(ExperimentError, match="sweeps_min"):
        sq.look_fractions(5, 3)
    with pytest.raises(ExperimentError, match="spending"):
        sq.spent_alpha(0.5, 0.05, "linear")


# ------------------------------------------------------------------------------------------------
# verdicts of one comparison


def test_tight_equal_arms_are_equivalent_at_the_first_look_that_allows_it():
    base = [4.300, 4.302, 4.298, 4.301]
    var = [4.301, 4.299, 4.300, 4.302]
    look = sq.decide(base[:2], var[:2], margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=4)
    assert look.boundaries is not None and look.boundaries.look == 1
    later = sq.decide(base, var, margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=4)
    assert later.decision == sq.EQUIVALENT and "TOST" in later.reason
    # each one-sided TOST test spends alpha / 2: the pair is a 95% interval inside the margin
    assert later.boundaries.alpha_spent_equivalence == pytest.approx(0.025)


def test_a_large_shift_is_different_and_a_small_real_one_inside_the_margin_is_labelled_so():
    base = [4.30, 4.31, 4.32]
    far = sq.decide(base, [3.10, 3.12, 3.11], margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=6)
    assert far.decision == sq.DIFFERENT and far.delta == pytest.approx(-1.2)
    # +0.3%: very significant with this noise, and inside the 1% margin: both tests cross
    near = sq.decide([4.3000, 4.3001, 4.2999], [4.3130, 4.3131, 4.3129], margin_pct=1.0, alpha=0.05,
                     sweeps_min=2, sweeps_max=6)
    assert near.decision == sq.SMALL_CHANGE and "TOST" in near.reason and "|t|" in near.reason
    # excluding 0 with a point inside the margin but an interval reaching beyond it: shown different (the
    # vocabulary reads the interval, not the point)
    loose = sq.decide([4.30, 4.32, 4.28], [4.262, 4.29, 4.258], margin_pct=1.0, alpha=0.05, sweeps_min=3,
                      sweeps_max=3, paired=True)
    assert abs(loose.delta) < loose.margin_abs and loose.decision == sq.DIFFERENT


def test_continue_before_the_first_look_and_undecided_at_the_last():
    first = sq.decide([4.3], [4.2], margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=4)
    assert first.decision == sq.CONTINUE and first.boundaries is None
    noisy_b, noisy_v = [4.0, 4.6, 4.2, 4.5], [4.3, 3.9, 4.6, 4.1]
    mid = sq.decide(noisy_b[:3], noisy_v[:3], margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=4)
    assert mid.decision == sq.CONTINUE
    last = sq.decide(noisy_b, noisy_v, margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=4)
    assert last.decision == sq.UNDECIDED
    with pytest.raises(ExperimentError, match="sweeps_max"):
        sq.decide(noisy_b, noisy_v, margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=3)


def test_deterministic_arms_are_judged_by_the_margin_alone():
    same = sq.decide([2.0, 2.0], [2.0, 2.0], margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=5)
    near = sq.decide([2.0, 2.0], [2.01, 2.01], margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=5)
    moved = sq.decide([2.0, 2.0], [2.03, 2.03], margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=5)
    assert (same.decision, near.decision, moved.decision) == (sq.EQUIVALENT, sq.SMALL_CHANGE, sq.DIFFERENT)
    assert "the margin decides" in same.reason


@pytest.mark.parametrize("paired", [False, True])
def test_decide_and_the_vectorised_simulation_agree_on_the_same_runs(paired):
    rng = np.random.default_rng(3)
    sweep = rng.normal(0, 0.05, (40, 6))  # shared by both arms of a sweep
    b = rng.normal(4.3, 0.03, (40, 6)) + sweep
    v = rng.normal(4.3 + rng.choice([0.0, 0.04, 0.3], (40, 1)), 0.03, (40, 6)) + sweep
    stops = []
    for r in range(40):
        for n in range(2, 7):
            look = sq.decide(b[r, :n], v[r, :n], margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=6,
                             paired=paired)
            if look.decision != sq.CONTINUE:
                stops.append((look.decision, n))
                break
    oc = sq.operating_characteristics(b, v, margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=6, paired=paired)
    assert oc.p_equivalent == pytest.approx(np.mean([d == sq.EQUIVALENT for d, _ in stops]))
    assert oc.p_small_change == pytest.approx(np.mean([d == sq.SMALL_CHANGE for d, _ in stops]))
    assert oc.p_different == pytest.approx(np.mean([d == sq.DIFFERENT for d, _ in stops]))
    assert oc.p_equivalent + oc.p_small_change + oc.p_different + oc.p_undecided == pytest.approx(1.0)
    assert oc.expected_sweeps == pytest.approx(np.mean([n for _, n in stops]))


# ------------------------------------------------------------------------------------------------
# error rates, simulated (normal run-to-run noise, sd 1 on a mean of 100; margin 1% = 1 sd)

REPS = 6000
TOL = 0.012  # 5 Monte-Carlo standard errors at alpha = 0.05 and 6000 replications


@pytest.mark.parametrize(("spending", "lo", "hi"), [("obrien_fleming", 2, 10), ("pocock", 3, 8)])
def test_error_rates_are_controlled(spending, lo, hi):
    rng = np.random.default_rng(20261130)

    def runs(delta):
        return rng.normal(100, 1, (REPS, hi)), rng.normal(100 + delta, 1, (REPS, hi))

    null = sq.operating_characteristics(*runs(0.0), margin_pct=1.0, alpha=0.05, sweeps_min=lo, sweeps_max=hi,
                                        spending=spending)
    at_margin = [sq.operating_characteristics(*runs(d), margin_pct=1.0, alpha=0.05, sweeps_min=lo, sweeps_max=hi,
                                              spending=spending) for d in (1.0, -1.0)]
    control = sq.operating_characteristics(*runs(3.0), margin_pct=1.0, alpha=0.05, sweeps_min=lo, sweeps_max=hi,
                                           spending=spending)
    assert null.p_excludes_zero <= 0.05 + TOL  # calling noise a difference
    assert all(oc.p_inside <= 0.025 + TOL for oc in at_margin)  # calling a margin-sized change equivalent
    assert control.p_different > 0.99 and control.expected_sweeps < hi  # a 3-sd change stops early
    # and the design does find equivalence when there is no change and the margin is 2 sd
    wide = sq.operating_characteristics(*runs(0.0), margin_pct=2.0, alpha=0.05, sweeps_min=lo, sweeps_max=hi,
                                        spending=spending)
    assert wide.p_inside > 0.5


@pytest.mark.parametrize(("spending", "lo", "hi"), [("obrien_fleming", 2, 10), ("pocock", 3, 8)])
@pytest.mark.parametrize("sweep_sd", [3.0, 0.0])
def test_paired_error_rates_are_controlled(spending, lo, hi, sweep_sd):
    """The paired design (per-sweep differences, df n - 1), with a sweep effect shared by both arms of a sweep
    (sd 3, three times the run noise: which questions a sweep drew) and without one."""
    rng = np.random.default_rng(20261201 + int(sweep_sd))

    def runs(delta):
        sweep = rng.normal(0, sweep_sd, (REPS, hi))
        return rng.normal(100, 1, (REPS, hi)) + sweep, rng.normal(100 + delta, 1, (REPS, hi)) + sweep

    def oc(delta, paired=True, margin_pct=1.0):
        return sq.operating_characteristics(*runs(delta), margin_pct=margin_pct, alpha=0.05, sweeps_min=lo,
                                            sweeps_max=hi, spending=spending, paired=paired)

    null = oc(0.0)
    assert null.p_excludes_zero <= 0.05 + TOL
    assert all(oc(d).p_inside <= 0.025 + TOL for d in (1.0, -1.0))
    control = oc(3.0)  # 3 run sds = 2.1 sds of a per-sweep difference, tested on n - 1 df
    assert control.p_different > 0.97 and control.expected_sweeps < hi
    assert oc(0.0, margin_pct=2.0).p_inside > 0.5
    if sweep_sd:  # Welch on the same runs carries the sweep spread: it rarely decides at all
        welch = oc(3.0, paired=False)
        assert welch.p_different < 0.5 and welch.expected_sweeps > control.expected_sweeps + 2


# ------------------------------------------------------------------------------------------------
# params and the collection loop's call


def test_sweep_bounds_default_to_sweeps_and_are_validated():
    p = params(sweeps=3, sweeps_min=None, sweeps_max=None)
    assert p.sweep_bounds() == (3, 3) and not p.adaptive
    assert params().sweep_bounds() == (2, 8) and params().adaptive
    with pytest.raises(ParamsError, match="sweeps_min"):
        params(sweeps_min=5, sweeps_max=4)
    with pytest.raises(ParamsError, match="sweeps_min >= 2"):
        params(sweeps_min=1, sweeps_max=4)


def runs_frame(al: dict[str, list[float]]) -> pd.DataFrame:
    """The collection's runs frame: declared arm, sweep, status and counter deltas whose AL is `al`."""
    rows = []
    for arm, values in al.items():
        for sweep, a in enumerate(values):
            drafts = 100_000
            rows.append({"run_id": f"{sweep:02d}-{arm}", "sweep": sweep, "declared_arm": arm, "status": "ok",
                         "counter_drafts": drafts, "counter_draft_tokens": 4 * drafts,
                         "counter_accepted_tokens": round((a - 1) * drafts)})
    return pd.DataFrame(rows)


def test_should_continue_until_every_comparison_is_decided():
    p = params()
    # fp32 within 0.0002 AL of the baseline in every sweep: the 95% interval fits the margin at the second look
    al = {"baseline": [4.300, 4.302, 4.298], "fp32": [4.3002, 4.3019, 4.2979], "int4": [3.10, 3.12, 3.11]}
    state = sq.should_continue(runs_frame({a: v[:1] for a, v in al.items()}), p)
    assert state.decision == sq.CONTINUE and not state.stop and state.sweeps == 1
    state = sq.should_continue(runs_frame(al), p)
    assert state.value_col == "counter_al" and state.sweeps == 3
    got = {lk.arm: lk.decision for lk in state.looks}
    assert got == {"fp32": sq.EQUIVALENT, "int4": sq.DIFFERENT}
    assert state.stop and state.decision == "decided"
    assert "obrien-fleming" in state.describe() and len(state.table()) == 2
    # complete sweeps pair every arm: the looks are paired t on the per-sweep differences
    assert state.method == sq.PAIRED_METHOD and sq.PAIRED_METHOD in state.describe()
    d = np.array(al["int4"]) - np.array(al["baseline"])
    int4 = next(lk for lk in state.looks if lk.arm == "int4")
    assert int4.se == pytest.approx(d.std(ddof=1) / math.sqrt(3), rel=1e-3)  # counts round the ALs
    assert int4.boundaries.df == 2


def test_should_continue_counts_complete_sweeps_only_and_ignores_failed_runs():
    p = params()
    frame = runs_frame({"baseline": [4.30, 4.31], "fp32": [4.30, 4.31], "int4": [3.1]})
    state = sq.should_continue(frame, p)
    assert state.sweeps == 1 and state.decision == sq.CONTINUE
    failed = frame.assign(status=["ok", "ok", "ok", "ok", "failed"])
    assert sq.should_continue(failed, p).sweeps == 0
    # an arm not launched yet makes no sweep complete
    assert sq.should_continue(runs_frame({"baseline": [4.3, 4.31]}), p).sweeps == 0


def test_should_continue_stops_undecided_at_the_maximum():
    p = params(sweeps_max=3)
    noisy = {"baseline": [4.0, 4.6, 4.2], "fp32": [4.3, 3.9, 4.6], "int4": [3.1, 3.12, 3.11]}
    state = sq.should_continue(runs_frame(noisy), p)
    assert state.decision == sq.UNDECIDED and state.stop
    assert {lk.arm: lk.decision for lk in state.looks}["fp32"] == sq.UNDECIDED


def test_rule_names_its_spending_function():
    assert DecisionRule().spending == "obrien_fleming"
    with pytest.raises(ValueError):
        DecisionRule(spending="linear")
    assert math.isclose(sq.spent_alpha(1.0, 0.1, DecisionRule(spending="pocock").spending), 0.1)


# ------------------------------------------------------------------------------------------------
# repeated intervals: a run whose sweeps the design chose is labelled from the design's interval

SEQ_RUN = Path(__file__).resolve().parents[2] / "docs" / "reports" / "knob_ab-h200-attention-backend-both-seq"


def test_a_sequential_run_that_did_not_decide_is_not_labelled_from_the_fixed_sample_interval(tmp_path):
    """The H200 attention-backend run stopped at 5 sweeps of its 2..6 design with the look saying continue; the
    fixed-sample paired t interval at 5 sweeps lies inside +/-1%, the design's repeated interval does not."""
    import shutil

    from specbook.core import stats, verdicts
    from specbook.store.runstore import RunContext

    if not (SEQ_RUN / "params.yaml").is_file():
        pytest.fail(f"{SEQ_RUN} is missing: the committed H200 run this test reads")
    run = Path(shutil.copytree(SEQ_RUN, tmp_path / "run"))
    params = knob_ab.load_params_file(str(run / "params.yaml"))
    data = knob_ab.load(RunContext.from_run_dir(run))
    assert [lk["decision"] for lk in data.looks] == ["continue"] * 4 and data.looks[-1]["sweeps"] == 5

    r = knob_ab.analyze(data, params)
    (v,) = r.decision.verdicts
    valued = r.decision.run_al[r.decision.run_al[r.decision.value_col].notna()]
    fixed = stats.delta_vs_baseline(valued, "arm", r.decision.value_col, "baseline", margin_pct=1.0, ci=0.95,
                                    sweep_col="sweep").iloc[0]
    assert verdicts.is_inside(fixed["ci_low_pct"], fixed["ci_high_pct"], 1.0)  # what the label used to read
    assert v.label.word == verdicts.UNDECIDED, v.label
    assert v.label.low < -1.0 and v.label.low < fixed["ci_low_pct"] and v.label.high > fixed["ci_high_pct"]
    # the interval is the delta +/- the look's recorded boundary x se
    look = data.looks[-1]["comparisons"][0]
    half = look["bound_difference"] * fixed["delta_se"] * 100 / fixed["baseline_mean"]
    assert v.label.low == pytest.approx(fixed["delta_pct"] - half) and v.label.high == pytest.approx(
        fixed["delta_pct"] + half)
    (head,) = r.answer(params).headlines
    assert head.verdict.startswith("UNDECIDED") and "repeated interval (look 4 of 5" in head.interval
    assert not verdicts.check_headline(head), verdicts.check_headline(head)
    evidence = r.answer(params).evidence
    assert "5 sweeps per arm (adaptive sweeps 2..6)" in evidence, evidence  # the run's bounds, not the description's


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_the_repeated_interval_excludes_zero_exactly_when_the_look_shows_a_difference(spending):
    from specbook.core import stats

    rng = np.random.default_rng(7)
    design = sq.Design(2, 6, 0.05, spending)
    agreed = 0
    for _ in range(60):
        n = int(rng.integers(2, 7))
        base = rng.normal(4.0, 0.05, n)
        var = base + rng.normal(rng.choice([0.0, 0.04, 0.1]), 0.03, n)
        frame = pd.DataFrame({"arm": ["baseline"] * n + ["v"] * n, "sweep": [*range(n), *range(n)],
                              "al": [*base, *var]})
        rows = sq.repeated_intervals(stats.delta_vs_baseline(frame, "arm", "al", "baseline", margin_pct=1.0,
                                                             ci=0.95, sweep_col="sweep"), design)
        row = rows.iloc[0]
        look = sq.decide(base, var, margin_pct=1.0, alpha=0.05, sweeps_min=2, sweeps_max=6, spending=spending,
                         paired=True)
        excludes = row["ci_low"] > 0 or row["ci_high"] < 0
        assert excludes == (abs(look.t_difference) >= look.boundaries.t_difference), (n, row, look)
        assert f"look {n - 1} of 5" in row["ci_design"]
        agreed += excludes
    assert 0 < agreed < 60  # both outcomes were exercised


def test_an_analysis_past_the_design_takes_its_nearest_look_and_says_so():
    design = sq.Design(3, 5, 0.05, "obrien_fleming")
    assert [design.look_at(n) for n in (1, 2, 3, 4, 5, 6, 9)] == [3, 3, 3, 4, 5, 5, 5]
    frame = pd.DataFrame({"arm": ["baseline", "v"] * 2, "sweep": [0, 0, 1, 1], "al": [4.0, 4.1, 4.05, 4.12]})
    from specbook.core import stats

    rows = sq.repeated_intervals(stats.delta_vs_baseline(frame, "arm", "al", "baseline", margin_pct=1.0, ci=0.95,
                                                         sweep_col="sweep"), design)
    assert "look 1 of 3, the nearest to 2 sweeps" in rows.iloc[0]["ci_design"]
