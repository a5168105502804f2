"""The AL-vs-concurrency curve: params checks, the level order, and every figure its report shows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from specbook.core import stats, verdicts
from specbook.core.errors import ParamsError
from specbook.core.params import load_params, validate_params
from specbook.experiments import concurrency_curve as cc

DEMO = "params/concurrency_curve/cpu-demo.yaml"


def demo_params(**overrides):
    return load_params(cc.ConcurrencyCurveParams, DEMO, [f"{k}={v}" for k, v in overrides.items()])


def test_demo_params_arms_and_requests_per_level():
    p = demo_params()
    assert [a.name for a in p.arms()] == ["baseline", "int4draft"]
    assert p.levels == [1, 2, 4, 8]
    assert [p.requests_at(level) for level in p.levels] == [4, 4, 8, 16]


def test_level_order_is_a_seeded_permutation_per_sweep():
    p = demo_params()
    orders = [p.level_order(s) for s in range(4)]
    assert all(sorted(o) == [1, 2, 4, 8] for o in orders)
    assert orders == [p.level_order(s) for s in range(4)]  # the same for every arm of a sweep
    assert len({tuple(o) for o in orders}) > 1  # not one fixed order


def test_a_level_above_max_num_seqs_is_refused_naming_both():
    with pytest.raises(ParamsError, match=r"levels.*16.*max_num_seqs=8"):
        demo_params(levels="[1,16]")


@pytest.mark.parametrize("levels", ["[]", "[0,2]", "[2,2]"])
def test_bad_levels_are_refused(levels):
    with pytest.raises(ParamsError, match="levels"):
        demo_params(levels=levels)


def test_one_sweep_is_refused():
    with pytest.raises(ParamsError, match="sweeps"):
        demo_params(sweeps=1)


def _windows(al: dict[tuple[str, int, int], float], tok: float = 10.0) -> pd.DataFrame:
    rows = []
    for (arm, sweep, level), v in al.items():
        rows.append({"window_id": f"{sweep}-{arm}@c{level}", "run_id": f"{sweep}-{arm}", "arm": arm, "sweep": sweep,
                     "level": level, "level_order": 0, "al": v, "tok_s": tok * level ** 0.5, "ttft_ms": 10.0,
                     "itl_ms": 5.0, "n_errors": 0, "steady_intervals": 1})
    return pd.DataFrame(rows)


def test_t_interval_matches_the_t_distribution():
    mean, sd, lo, hi = cc._t_interval(np.array([1.0, 2.0, 3.0]), 0.95)
    assert mean == 2.0 and sd == 1.0
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, df=2)
    assert lo == pytest.approx(2 - half) and hi == pytest.approx(2 + half)
    assert all(math.isnan(x) for x in cc._t_interval(np.array([1.0]), 0.95)[1:])


def test_delta_table_pairs_sweeps_per_level_as_estimates():
    al = {}
    for sweep, (b, v) in enumerate([(3.0, 2.0), (3.2, 2.1), (3.1, 2.05)]):
        for level in (1, 4):
            al[("baseline", sweep, level)] = b
            al[("int4draft", sweep, level)] = v
    d = cc.delta_table(_windows(al), 0.95)
    row = d[(d["metric"] == "AL") & (d["level"] == 4)].iloc[0]
    assert row["n_pairs"] == 3
    assert row["delta"] == pytest.approx(np.mean([-1.0, -1.1, -1.05]))
    assert row["ci_high"] < 0
    assert row["delta_pct"] == pytest.approx(100 * row["delta"] / 3.1)
    assert "excludes_zero" not in d  # a level is an estimate, never a verdict


def _curve_windows(effects: dict[int, list[float]], base: float = 4.5, sweep_shift=(0.0, 0.1)) -> pd.DataFrame:
    """Windows of two arms: the baseline at `base` (+ a sweep's shift shared by both arms), the knob arm at
    base + effects[level][sweep]."""
    al = {}
    for level, per_sweep in effects.items():
        for sweep, e in enumerate(per_sweep):
            al[("baseline", sweep, level)] = base + sweep_shift[sweep]
            al[("int4draft", sweep, level)] = base + sweep_shift[sweep] + e
    return _windows(al).assign(n_requests=4)


def test_one_model_over_levels_gives_the_overall_effect_and_the_level_dependence():
    # the H200 curve's per-sweep differences (int4 draft minus fp8 draft, counter AL) at 1, 4, 16, 64, 128, 256
    d = np.array([[-1.221070, -0.988624, -0.939048, -1.084863, -1.152396, -1.131989],
                  [-1.308927, -1.239842, -1.216624, -1.168417, -1.135228, -1.154671]])
    e = stats.effect_by_level(d, [1, 4, 16, 64, 128, 256], 0.95)
    blocks = d.mean(1)
    half = sps.t.ppf(0.975, 1) * blocks.std(ddof=1) / math.sqrt(2)
    assert e.overall == pytest.approx(d.mean()) and (e.overall_low, e.overall_high) == pytest.approx(
        (d.mean() - half, d.mean() + half))
    # randomized-block ANOVA: F = MS_level / MS_residual on (5, 5) df
    resid = d - d.mean(1, keepdims=True) - d.mean(0, keepdims=True) + d.mean()
    ms_res = (resid**2).sum() / 5
    ms_level = 2 * ((d.mean(0) - d.mean()) ** 2).sum() / 5
    assert e.f == pytest.approx(ms_level / ms_res) and e.p_level == pytest.approx(sps.f.sf(ms_level / ms_res, 5, 5))
    assert e.f_df == (5.0, 5.0) and e.span == 8.0
    x = np.log2([1, 4, 16, 64, 128, 256])
    slope = np.polyfit(x, d.mean(0), 1)[0]
    assert e.trend == pytest.approx(slope)
    assert e.trend_low < e.trend < e.trend_high


def test_a_level_independent_effect_is_one_labelled_answer_not_a_label_per_level():
    p = demo_params()
    # the same -1.1 AL at every level, +/-0.02 between sweeps and levels: shown different overall, and its change
    # across the levels lies inside the 1% margin
    effects = {1: [-1.10, -1.12], 2: [-1.11, -1.10], 4: [-1.12, -1.11], 8: [-1.10, -1.11]}
    windows = _curve_windows(effects)
    curve = cc.curve_table(windows, 0.95)
    result = cc.CurveResult(windows, curve, cc.delta_table(windows, 0.95), {"baseline": 4, "int4draft": None},
                            pd.DataFrame(), 0, [], effects=cc.effects_table(windows, 0.95))
    s = result.answer(p)
    heads = {h.comparison: h for h in s.headlines}
    overall = heads["int4draft vs baseline, all levels"]
    assert overall.verdict.startswith("SHOWN DIFFERENT: -24.") and overall.good is True
    assert overall.expected == "expected different: yes"
    assert "t over 2 sweep blocks (df 1), levels as a factor" in overall.interval
    change = heads["int4draft: change of its AL effect, c=1 to c=8"]
    assert change.verdict == "SHOWN EQUIVALENT" and "level x arm F(3, 3)" in change.figure
    assert not any("at concurrency" in h.comparison for h in s.headlines)
    assert heads["baseline: throughput"].verdict == "SATURATES AT 4 in this run"
    assert heads["int4draft: throughput"].verdict == "STILL GROWING in this run"
    assert "16 level windows" in " ".join(s.evidence)
    assert verdicts.check_summary(s) == []


def test_an_effect_that_grows_with_concurrency_is_shown_to_depend_on_it():
    p = demo_params()
    effects = {1: [-0.50, -0.52], 2: [-0.70, -0.71], 4: [-0.90, -0.92], 8: [-1.10, -1.12]}
    windows = _curve_windows(effects)
    e = cc.effects_table(windows, 0.95).iloc[0]
    assert e["p_level"] < 0.001 and e["change"] == pytest.approx(-0.6, abs=0.02)
    result = cc.CurveResult(windows, cc.curve_table(windows, 0.95), cc.delta_table(windows, 0.95), {},
                            pd.DataFrame(), 0, [], effects=cc.effects_table(windows, 0.95))
    overall, change = result.labels(p)["int4draft"]
    assert change.word == "shown different" and change.estimate < -10
    assert overall.word == "shown different"


def test_saturation_is_where_doubling_stops_paying():
    curve = pd.DataFrame({"arm": "a", "metric": "tok/s", "level": [1, 2, 4, 8], "mean": [10.0, 19.0, 30.0, 30.5]})
    assert cc.saturation_level(curve, "a") == 4
    growing = curve.assign(mean=[10.0, 20.0, 40.0, 80.0])
    assert cc.saturation_level(growing, "a") is None


def test_window_al_uses_the_primary_and_cuts_steady_intervals_by_level():
    p = demo_params(**{"measurement.primary": "steady_log_al"})
    levels = pd.DataFrame([{"window_id": "w@c4", "run_id": "w", "arm": "baseline", "sweep": 0, "level": 4,
                            "level_order": 0, "counter_drafts": 10, "counter_draft_tokens": 40,
                            "counter_accepted_tokens": 20, "n_errors": 0, "tok_s": 1.0, "ttft_ms": 1.0,
                            "itl_ms": 1.0}])
    intervals = pd.DataFrame({"window_id": ["w@c4"] * 3, "running": [4, 3, 1], "drafts": [5, 5, 100],
                              "accepted_tokens": [10, 5, 0], "draft_tokens": [20, 20, 400]})
    w = cc.window_al(cc.CurveData(levels, pd.DataFrame(), intervals), p)
    assert w.loc[0, "counter_al"] == pytest.approx(3.0)
    assert w.loc[0, "steady_intervals"] == 2  # running >= 0.75 x 4
    assert w.loc[0, "steady_log_al"] == pytest.approx(1 + 15 / 10)
    assert w.loc[0, "al"] == w.loc[0, "steady_log_al"]


def test_validate_params_names_the_field_for_an_unknown_key():
    with pytest.raises(ParamsError, match="measurement.bogus"):
        validate_params(cc.ConcurrencyCurveParams, {**demo_params().model_dump(), "measurement": {"bogus": 1}})


def test_the_margin_is_a_params_field():
    assert demo_params().measurement.margin_pct == 1.0
    assert demo_params(**{"measurement.margin_pct": 2.5}).measurement.margin_pct == 2.5
    with pytest.raises(ParamsError, match="margin_pct"):
        demo_params(**{"measurement.margin_pct": 0})


def test_client_processes_is_one_a_number_or_auto():
    assert demo_params().measurement.client_processes == 1
    assert demo_params(**{"measurement.client_processes": 2}).measurement.client_processes == 2
    assert demo_params(**{"measurement.client_processes": "auto"}).measurement.client_processes == "auto"
    with pytest.raises(ParamsError, match="measurement.client_processes"):
        demo_params(**{"measurement.client_processes": 0})
