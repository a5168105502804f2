"""The curve past its params' top (issue 30): what the server held back (capacity) and how the first server
finds the levels past the top (extension), on the real GPU curves' data where the engine's figures matter: the
H200 curve to 256 (every request ran) and the H100 curve past it (docs/reports/concurrency_curve-h100-beyond-256,
commit ec833a5: its first server doubled 256 to 4096, and past 2048 the engine ran about 550 of the requests in
flight at once) with its probe of four API server processes (docs/reports/concurrency_curve-h100-api-servers-4: no
knob arm, no engine log intervals)."""

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
BEYOND = Path("docs/reports/concurrency_curve-h100-beyond-256")
PROBE = Path("docs/reports/concurrency_curve-h100-api-servers-4")
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
    held = capacity.capacity(w, "baseline", None)
    assert held.kv_full_level is None and held.word is None and held.levels == [256] and not held.unfed
    throughput = [h for h in result.answer(params).headlines if h.comparison == "baseline: throughput"][0]
    assert throughput.verdict == "STILL GROWING in this run"
    assert ("at 256 the engine ran at most 253 at once (fed: 75% of the level or more); KV cache at most 3.4% in use"
            in throughput.figure) and "steps bound" not in throughput.figure  # it had not stopped growing


def test_past_2048_the_engine_was_not_fed_and_the_reading_says_where_requests_waited_not_what_bounds_tok_s():
    params = cc.load_params_file(str(BEYOND / "params.yaml"))
    data = cc.load(RunContext.from_run_dir(BEYOND))
    result = cc.analyze(data, params)
    assert result.saturation == {"baseline": 2048, "int4draft": 2048}
    w = result.windows
    past = w[w["level"] >= 2048]
    # the figures the reading rests on, from the engine's log intervals directly
    iv = data.intervals
    for _, r in past.iterrows():
        mine = iv[iv["window_id"] == r["window_id"]]
        assert r["peak_running"] == mine["running"].max() < 0.75 * r["level"]
        assert mine["waiting"].max() == 0 and mine["kv_cache_usage"].max() < 0.95
    for arm in ("baseline", "int4draft"):
        held = capacity.capacity(w, arm, 2048, params.measurement.kv_full_fraction)
        assert held.unfed and held.word is None and held.levels == [2048, 4096]
        assert held.running == [float(past[(past["arm"] == arm) & (past["level"] == lv)]["peak_running"].max())
                                for lv in (2048, 4096)]
    heads = {h.comparison: h for h in result.answer(params).headlines}
    base = heads["baseline: throughput"]
    assert base.verdict == "SATURATES AT 2048, ENGINE-BOUND in this run"
    assert ("at 2048, 4096 the engine ran at most 537, 560 at once, none waiting in its queue; KV cache at most "
            "16.7%, 15.3% in use (full from 95%): the other requests in flight waited before its scheduler, in the "
            "server's front end (median TTFT 3976, 5401 ms); whether a server that fed them sooner would turn them "
            "into more tok/s, this reading cannot tell" in base.figure)
    assert "ENGINE-BOUND: the client's event loop stayed below saturation at level 2048, 4096" in base.figure
    # below the knee the engine was fed: 16, 64 and 256 ran at (nearly) their level
    low = w[w["level"] <= 256]
    assert (low["peak_running"] >= 0.75 * low["level"]).all() and (low["peak_running"] <= low["level"]).all()


def test_the_first_servers_decisions_are_replayed_from_its_windows():
    params = cc.load_params_file(str(BEYOND / "params.yaml"))
    result = cc.analyze(cc.load(RunContext.from_run_dir(BEYOND)), params)
    steps = result.extension_steps
    assert [(s.after, s.level) for s in steps] == [(256, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, None)]
    assert steps[-1].why == "tok/s grew -2.4% per doubling from 2048 to 4096 (< 5%): stopped growing"
    first = result.windows[result.windows["run_id"] == cc.explorer_run_id(params)].sort_values("level_order")
    assert first["level"].tolist()[3:] == [512, 1024, 2048, 4096]  # added in order, after its three planned levels
    others = result.windows[result.windows["run_id"] != cc.explorer_run_id(params)]
    assert (others.groupby("run_id")["level"].apply(sorted).apply(list) == [[16, 64, 256, 512, 1024, 2048, 4096]]
            * 3).all()


def test_the_probe_with_four_api_servers_fed_the_engine_sooner_for_no_more_tok_s():
    """The sceptic's question to the reading above: would a server that feeds the engine sooner turn the waiting
    requests into tok/s? With --api-server-count 4 (the same params, no knob arm, levels 256 and 2048) vLLM turns its
    stats logging off, so there is no capacity reading; the client's figures answer: the first token came sooner
    and the steps got longer, for the same tok/s."""
    params = cc.load_params_file(str(PROBE / "params.yaml"))
    assert params.knobs == [] and "--api-server-count" in params.engine.extra_args
    probe = cc.analyze(cc.load(RunContext.from_run_dir(PROBE)), params)
    beyond = cc.analyze(cc.load(RunContext.from_run_dir(BEYOND)), cc.load_params_file(str(BEYOND / "params.yaml")))
    assert probe.effects.empty and probe.capacity["peak running"].isna().all()
    assert capacity.capacity(probe.windows, "baseline", None) is None
    at = {name: r.windows[(r.windows["arm"] == "baseline") & (r.windows["level"] == 2048)]
          for name, r in (("probe", probe), ("one", beyond))}
    assert at["probe"]["ttft_ms"].max() < at["one"]["ttft_ms"].min() / 2  # fed sooner
    assert at["probe"]["itl_ms"].min() > 3 * at["one"]["itl_ms"].max()  # longer steps
    ratio = at["probe"]["tok_s"].mean() / at["one"]["tok_s"].mean()
    assert 0.95 < ratio < 1.05, ratio  # the same tok/s
    heads = {h.comparison: h for h in probe.answer(params).headlines}
    assert list(heads) == ["baseline: throughput"]


def test_a_gzipped_server_log_is_read_as_the_log():
    from specbook.engines.common import stored_log
    from specbook.engines.vllm.startup import log_startup_facts

    log = BEYOND / "logs" / "00-sweep0-baseline.log"
    assert not log.exists() and stored_log(log) == BEYOND / "logs" / "00-sweep0-baseline.log.gz"
    facts = log_startup_facts(log)
    assert facts and "FLASH_ATTN" in str(facts)
    assert stored_log(BEYOND / "logs" / "nothing.log") is None and log_startup_facts(BEYOND / "nothing.log") == {}


def test_a_window_at_the_full_fraction_names_the_lowest_level_that_filled_the_kv_cache():
    w = pd.DataFrame({"arm": "a", "level": [256, 512, 1024, 1024], "peak_running": [256, 512, 700, 690],
                      "peak_waiting": [0, 3, 324, 334], "peak_kv_usage": [0.3, 0.6, 0.97, 0.999],
                      "ttft_ms": [1.0, 2.0, 3.0, 4.0]})
    held = capacity.capacity(w, "a", 512)
    assert held.kv_full_level == 1024 and held.word == "KV CACHE FULL AT 1024" and not held.unfed
    assert held.text().endswith("the KV cache filled at 1024") and "at 512, 1024 the engine ran at most 512, 700" in \
        held.text()
    assert capacity.capacity(w, "a", 512, kv_full_fraction=0.5).kv_full_level == 512
    # not full, every request ran: no word (the client's side names the bound)
    ran = w.assign(peak_kv_usage=0.2, peak_running=w["level"], peak_waiting=0)
    assert capacity.capacity(ran, "a", 512).word is None
    assert capacity.capacity(ran, "a", 512).text().endswith("every request ran, and the steps bound the throughput")
    # not fed, but requests waited in the engine's own queue: not the front end's doing
    assert capacity.capacity(w.assign(peak_kv_usage=0.2), "a", 512).word is None
    assert capacity.capacity(w.assign(peak_kv_usage=np.nan, peak_running=np.nan, peak_waiting=np.nan), "a",
                             512) is None


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
