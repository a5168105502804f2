"""The AL-vs-concurrency curve: params checks, the level order, and every figure its report shows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from specbook.errors import ParamsError
from specbook.experiments import concurrency_curve as cc
from specbook.params import load_params, validate_params

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


def test_delta_table_pairs_sweeps_and_flags_an_interval_excluding_zero():
    al = {}
    for sweep, (b, v) in enumerate([(3.0, 2.0), (3.2, 2.1), (3.1, 2.05)]):
        for level in (1, 4):
            al[("baseline", sweep, level)] = b
            al[("int4draft", sweep, level)] = v
    d = cc.delta_table(_windows(al), 0.95)
    row = d[(d["metric"] == "AL") & (d["level"] == 4)].iloc[0]
    assert row["n_pairs"] == 3
    assert row["delta"] == pytest.approx(np.mean([-1.0, -1.1, -1.05]))
    assert row["excludes_zero"]
    assert row["delta_pct"] == pytest.approx(100 * row["delta"] / 3.1)


def test_delta_with_noise_only_includes_zero():
    al = {("baseline", 0, 1): 3.0, ("int4draft", 0, 1): 3.1, ("baseline", 1, 1): 3.1, ("int4draft", 1, 1): 3.0}
    row = cc.delta_table(_windows(al), 0.95).query("metric == 'AL'").iloc[0]
    assert not row["excludes_zero"]


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


def test_answer_leads_with_each_knob_level_verdict_and_saturation():
    p = demo_params()
    al = {}
    for sweep, (b, v) in enumerate([(3.0, 2.0), (3.2, 2.1), (3.1, 2.05)]):
        for level in (1, 2, 4, 8):
            al[("baseline", sweep, level)] = b
            al[("int4draft", sweep, level)] = v
    windows = _windows(al).assign(n_requests=4)
    curve = cc.curve_table(windows, 0.95)
    result = cc.CurveResult(windows, curve, cc.delta_table(windows, 0.95), {"baseline": 4, "int4draft": None},
                            pd.DataFrame(), 0, [])
    s = result.answer(p)
    heads = {h.comparison: h for h in s.headlines}
    h = heads["int4draft vs baseline at concurrency 8"]
    assert h.verdict == "AL MOVED" and h.good is True  # the knob was expected to be different
    assert "-1.050" in h.figure and "3 paired sweeps" in h.interval
    assert heads["baseline: throughput"].verdict == "SATURATES AT 4"
    assert heads["int4draft: throughput"].verdict == "STILL GROWING"
    assert "24 level windows" in " ".join(s.evidence)
