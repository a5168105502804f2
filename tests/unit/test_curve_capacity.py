"""The curve past its params' top (issue 30): what the server held back (capacity) and how the first server
finds the levels past the top (extension), on the real H200 curve's intervals where the engine's figures matter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specbook.core.errors import ParamsError
from specbook.core.params import load_params
from specbook.experiments import concurrency_curve as cc
from specbook.experiments.concurrency_curve import capacity, extension
from specbook.store.runstore import RunContext

H200 = Path("docs/reports/concurrency_curve-h200")
DEMO = "params/concurrency_curve/cpu-demo.yaml"
EXT = extension.LevelExtension(factor=2, max_level=4096)


def _rows(levels_tok: list[tuple[int, float]], kv: float = 0.1) -> pd.DataFrame:
    return pd.DataFrame([{"level": lv, "tok_s": t, "peak_running": lv, "peak_waiting": 0.0, "peak_kv_usage": kv,
                          "level_order": i} for i, (lv, t) in enumerate(levels_tok)])


# ---------------------------------------------------------------- capacity, on the H200 curve's engine log


def test_window_peaks_are_the_maxima_of_the_windows_log_intervals():
    iv = pd.read_parquet(H200 / "data" / "intervals.parquet")
    wid = sorted(set(iv["window_id"]))[0]
    mine = iv[iv["window_id"] == wid]
    peaks = capacity.window_peaks(mine)
    assert peaks == {"peak_running": float(mine["running"].max()), "peak_waiting": float(mine["waiting"].max()),
                     "peak_kv_usage": float(mine["kv_cache_usage"].max())}
    assert all(np.isnan(v) for v in capacity.window_peaks(mine.drop(columns=["running", "waiting",
                                                                             "kv_cache_usage"])).values())


def test_a_run_from_before_the_peak_columns_gets_them_from_its_intervals():
    params = cc.load_params_file(str(H200 / "params.yaml"))
    result = cc.analyze(cc.load(RunContext.from_run_dir(H200)), params)
    w = result.windows
    assert w[list(capacity.PEAKS)].notna().all().all()
    top = w[(w["arm"] == "baseline") & (w["level"] == 256)]
    assert 0 < top["peak_kv_usage"].max() < 0.1 and top["peak_running"].max() <= 256
    table = result.capacity
    assert set(table["level"]) == {1, 4, 16, 64, 128, 256} and (table["windows"] == 2).all()
    row = table[(table["arm"] == "baseline") & (table["level"] == 256)].iloc[0]
    assert row["peak KV usage %"] == pytest.approx(100 * top["peak_kv_usage"].max())
    held = capacity.capacity(w, "baseline")
    assert held.kv_full_level is None and held.word is None and held.top_level == 256
    throughput = [h for h in result.answer(params).headlines if h.comparison == "baseline: throughput"][0]
    assert throughput.verdict.startswith("STILL GROWING") and "KV cache at most 3.4% in use at 256" in throughput.figure


def test_a_window_at_the_full_fraction_names_the_lowest_level_that_filled_the_kv_cache():
    w = pd.DataFrame({"arm": "a", "level": [256, 512, 1024, 1024], "peak_running": [256, 512, 700, 690],
                      "peak_waiting": [0, 3, 324, 334], "peak_kv_usage": [0.3, 0.6, 0.97, 0.999]})
    held = capacity.capacity(w, "a")
    assert held.kv_full_level == 1024 and held.word == "KV CACHE FULL AT 1024"
    assert "reached at 1024" in held.text() and "up to 700 of 1024 running at once" in held.text()
    assert capacity.capacity(w, "a", kv_full_fraction=0.5).kv_full_level == 512
    assert capacity.capacity(w.assign(peak_kv_usage=np.nan, peak_running=np.nan, peak_waiting=np.nan), "a") is None


# ---------------------------------------------------------------- extension


def test_per_doubling_growth():
    assert extension.per_doubling(256, 1000, 512, 1100) == pytest.approx(0.10)
    assert extension.per_doubling(256, 1000, 1024, 1210) == pytest.approx(0.10)  # two doublings
    assert np.isnan(extension.per_doubling(256, 0, 512, 10)) and np.isnan(extension.per_doubling(512, 1, 256, 2))


def test_the_next_level_doubles_while_tok_s_grows_and_stops_where_it_does_not():
    step = extension.next_level(_rows([(64, 1500), (256, 5200)]), EXT)
    assert step.level == 512 and step.after == 256 and "grew" in step.why
    stop = extension.next_level(_rows([(64, 1500), (256, 5200), (512, 5300)]), EXT)
    assert stop.level is None and "stopped growing" in stop.why and "+1.9%" in stop.why
    assert extension.next_level(_rows([(256, 5200)]), EXT).level == 512  # one level: nothing to compare yet


def test_a_full_kv_cache_or_max_level_ends_the_extension():
    full = extension.next_level(_rows([(256, 5200), (512, 9000)], kv=0.96), EXT)
    assert full.level is None and "KV cache filled at 512 (96.0% in use)" in full.why
    top = extension.next_level(_rows([(2048, 9000), (4096, 15000)]), EXT)
    assert top.level is None and "above max_level 4096" in top.why


def test_replay_gives_the_first_servers_decisions_after_its_levels_and_each_added_one():
    # planned 256 and 64 in a random order, then 512 and 1024 added; 1024 stops growing
    rows = _rows([(256, 5200), (64, 1500), (512, 8000), (1024, 8100)])
    steps = extension.replay(rows, [64, 256], EXT)
    assert [(s.after, s.level) for s in steps] == [(256, 512), (512, 1024), (1024, None)]


def test_extend_is_checked_against_the_top_level_and_max_num_seqs():
    with pytest.raises(ParamsError, match=r"extend.max_level.*8.*above the top level 8"):
        load_params(cc.ConcurrencyCurveParams, DEMO, ["extend={max_level: 8}"])
    with pytest.raises(ParamsError, match=r"extend.max_level.*16.*max_num_seqs=8"):
        load_params(cc.ConcurrencyCurveParams, DEMO, ["levels=[1,2]", "extend={max_level: 16}"])
    with pytest.raises(ParamsError, match="factor"):
        load_params(cc.ConcurrencyCurveParams, DEMO, ["levels=[1,2]", "extend={factor: 1, max_level: 8}"])
    p = load_params(cc.ConcurrencyCurveParams, DEMO, ["levels=[1,2]", "extend={max_level: 8}"])
    assert p.extend.factor == 2 and p.level_order(0, [1, 2, 4, 8]) == p.level_order(0, [8, 4, 2, 1])
    assert sorted(p.level_order(1, [1, 2, 4, 8])) == [1, 2, 4, 8]


def test_the_summary_says_how_the_levels_past_the_top_were_found():
    p = load_params(cc.ConcurrencyCurveParams, DEMO, ["levels=[1,2]", "extend={max_level: 8}"])
    first = cc.explorer_run_id(p)
    assert first == "00-sweep0-baseline"
    rows = []
    for order, run in enumerate([first, "01-sweep0-int4draft", "02-sweep1-int4draft", "03-sweep1-baseline"]):
        arm, sweep = run.split("-")[2], int(run.split("-")[1][-1])
        for i, (lv, tok) in enumerate([(2, 20.0), (1, 11.0), (4, 30.0), (8, 30.5)]):
            rows.append({"window_id": f"{run}@c{lv}", "run_id": run, "order": order, "sweep": sweep, "arm": arm,
                         "level": lv, "level_order": i, "tok_s": tok * (1 + 0.01 * sweep), "ttft_ms": 1.0,
                         "itl_ms": 1.0, "tpot_ms": 1.0, "n_requests": 4, "n_errors": 0, "counter_drafts": 10,
                         "counter_draft_tokens": 40, "counter_accepted_tokens": 30 if arm == "baseline" else 10,
                         **{f"counter_accepted_pos_{k}": 1 for k in range(1, 5)},
                         "peak_running": lv, "peak_waiting": 0, "peak_kv_usage": 0.01 * lv})
    data = cc.CurveData(pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame())
    result = cc.analyze(data, p)
    assert [(s.after, s.level) for s in result.extension_steps] == [(2, 4), (4, 8), (8, None)]
    summary = result.answer(p)
    line = [e for e in summary.evidence if e.startswith("levels past 2")][0]
    assert "found by the first server (00-sweep0-baseline), x2 up to 8: 4, 8;" in line
    assert "stopped after 8: tok/s grew +1.7% per doubling from 4 to 8 (< 5%): stopped growing" in line
    assert "(1, 2, 4, 8)" in summary.question
    assert result.saturation == {"baseline": 4, "int4draft": 4}
