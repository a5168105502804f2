"""The cross-engine demo end to end, reduced: `specbook run cross_engine` with llama.cpp vs vLLM-CPU.

Reduced via -p: the loop prompt and two ordinary prompts, the int4-draft lane alone, one warm repeat, 64 tokens;
a cell is timed from 8 common tokens (on vLLM-CPU and llama.cpp's CPU build the bicycle answers part within their
first tokens, so the 8-token capital answer is what both engines emit alike); the lane's untimed trace pass,
equal-work re-runs (cells that need one) and profiled pass as the demo params switch them on: one vLLM server
serving the timed, equal-work, trace and profiled phases in that order (its plugin and step timer switched at run
time), and llama-servers for timed, trace (-v), profiled (-lv 4) and equal-work passes. The analysis findings on a whole lane set (off, ngram, draft; 24 prompts on the H200) are checked
without a server on saved runs (tests/unit/test_golden_real_runs.py). Run under the shared engine lock:
`flock /tmp/specbook-engine.lock .venv/bin/pytest -m e2e`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from specbook.core.params import load_params
from specbook.experiments import cross_engine as ce
from specbook.store.runstore import RunContext

pytestmark = pytest.mark.e2e

DEMO = "params/cross_engine/cpu-demo.yaml"
LANES = '[{name: draft-int4, speculative_config: {method: draft_model, model: smollm2-135m-instruct-int4g32, num_speculative_tokens: 4}}]'


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, run_book) -> Path:
    outputs = tmp_path_factory.mktemp("outputs")
    return run_book("cross_engine", DEMO, ["num_prompts=3", "warm_repeats=1", "max_tokens=64", f"lanes={LANES}",
                                           "cost_split.lanes=[draft-int4]", "timing.min_common_tokens=8"],
                    outputs, timeout=1500)


def test_run_folder_holds_every_server_its_log_and_the_timed_requests(demo_run):
    import json

    m = json.loads((demo_run / "manifest.json").read_text())
    assert m["status"] == "ok"
    servers = {s["name"]: s for s in m["servers"]}
    timed = [f"{engine}-draft-int4" for engine in ("vllm", "llamacpp")]
    passes = [f"llamacpp-draft-int4-{kind}" for kind in ("trace", "prof")]
    assert set(timed + passes) <= set(servers), sorted(servers)
    assert {s["status"] for s in servers.values()} == {"ok"}
    # one vLLM server for the side x lane, its phases in the order that keeps the timed windows clean
    vllm = [s for s in servers.values() if (s.get("versions") or {}).get("engine") == "vllm"]
    assert [s["name"] for s in vllm] == ["vllm-draft-int4"], sorted(servers)
    phases = vllm[0]["extra"]["phases"]
    assert phases[0] == "timed" and phases[-2:] == ["trace", "profile"] and set(phases) <= {
        "timed", "equal_work", "trace", "profile"}, phases
    # the cost split of the shared server: the step timer switched on only for its phase
    assert {"timed", "trace", "profile"} <= set(pd.read_parquet(demo_run / "data" / "servers.parquet").query(
        "server == 'vllm-draft-int4'")["kind"])
    # the vLLM server started during the llama.cpp trace pass's replay (which needs no server): after that side's
    # timed server was gone, while its trace server was up (a later server's windows wait until it is ready:
    # tests/unit/test_harness.py)
    oracle, trace_server = servers["vllm-draft-int4"], servers["llamacpp-draft-int4-trace"]
    assert servers["llamacpp-draft-int4"]["stopped_at"] <= oracle["started_at"] < trace_server["stopped_at"], (
        oracle["started_at"], trace_server["stopped_at"])
    assert "(ahead" in (demo_run / "logs" / "progress.log").read_text()
    signature = {"vllm": "APIServer", "llamacpp": "llama_server"}  # each engine's own start-up lines
    for name in timed + passes:
        log = (demo_run / servers[name]["log_path"]).read_text()
        assert log.startswith("Env:") and signature[name.split("-")[0]] in log, name
    requests = pd.read_parquet(demo_run / "data" / "requests.parquet")
    timed_requests = requests[requests["kind"] == "timed"]
    # every prompt timed on both sides (at least the one warm repeat; more where a cell's decode wall was short)
    per_side = timed_requests.groupby("side")["prompt"].agg(lambda p: sorted(set(p)))
    assert per_side.to_dict() == {side: sorted(set(requests["prompt"])) for side in ("oracle", "ours")}
    assert len(set(requests["prompt"])) == 3
    assert timed_requests["error"].isna().all() and (timed_requests["completion_tokens"] > 0).all()
    pins = json.loads((demo_run / "data" / "pins.json").read_text())
    assert set(pins) == {"ours", "oracle"} and all(c["ok"] for side in pins.values() for c in side["checks"])
    assert (demo_run / "report.html").is_file() and (demo_run / "summary.json").is_file()


def test_loop_cell_is_flagged_and_left_out(demo_run):
    params = load_params(ce.CrossEngineParams, demo_run / "params.yaml")
    data = ce.load(RunContext.from_run_dir(demo_run))
    cells = ce.cell_table(data, params.guards, n_boot=200)
    loop = cells[cells["prompt"] == "yes-loop"]
    assert len(loop) == 1 and not loop["comparable"].any()
    assert loop["flags"].str.contains("degenerate").all()
    head = ce.headline(cells, n_boot=200)
    assert head["left_out"].str.contains("yes-loop").all()
    assert (data.requests["completion_tokens"] > 0).all()
    html = (demo_run / "report.html").read_text()
    assert "NOT COMPARABLE" in html and "yes-loop" in html


def test_both_engines_report_acceptance_under_one_definition(demo_run):
    data = ce.load(RunContext.from_run_dir(demo_run))
    acc = ce.acceptance_table(data)
    assert set(acc["engine"]) == {"vllm", "llamacpp"}
    assert ((acc["al"] > 1.0) & (acc["al"] <= 5.0)).all()
    pp = ce.per_position(data)
    assert set(pp["side"]) == {"ours", "oracle"} and (pp["rate"].between(0, 1)).all()
    assert all(p["identical"] for p in data.weights.values())


def _result(demo_run):
    params = load_params(ce.CrossEngineParams, demo_run / "params.yaml")
    return params, ce.analyze(ce.load(RunContext.from_run_dir(demo_run)), params)


# "ours" (llama.cpp) was a strict xfail until its derivation followed the engine: its verifier ends a step at
# an EOS it samples short of the draft's end (the `capital` request's last step: 0 accepted, not 1).
@pytest.mark.parametrize("side", ["oracle", "ours"])
def test_trace_pass_derived_counts_equal_the_counters(demo_run, side):
    params, result = _result(demo_run)
    agree = result.trace_agreement.set_index("side")
    assert sorted(agree.index) == ["oracle", "ours"] and set(agree["lane"]) == {"draft-int4"}
    row = agree.loc[side]
    assert row["untraceable"] is None or pd.isna(row["untraceable"]), row["untraceable"]
    assert row["derived_drafts"] > 0 and row["derived_drafts"] == row["counter_drafts"]
    assert row["agree"], row["disagreements"]
    # exactly equal where nothing was cut: llama.cpp reports every step's count, and a stop there is never a cut
    if side == "ours":
        assert row["derived_accepted"] == row["derived_accepted_max"] == row["counter_accepted"], row


def test_trace_pass_feeds_the_replay_matched_content_and_report(demo_run):
    params, result = _result(demo_run)
    assert len(result.replay) == 2 and (result.replay["anchors"] > 0).all()
    assert (result.replay["systematic_mismatches"] == "none").all(), result.replay
    assert len(result.prefix_acceptance) == 3 and (result.prefix_acceptance["common_prefix"] > 0).all()  # 3 prompts
    for rel in ("logs/vllm-draft-int4.log", "logs/llamacpp-draft-int4-trace.log", "traces/vllm-draft-int4-trace"):
        assert (demo_run / rel).exists(), rel
    html = (demo_run / "report.html").read_text()
    assert "untimed trace pass" in html and "Matched anchors between the engines" in html


def test_equal_work_headline_stands_beside_the_strict_one_and_the_cost_split_is_shown(demo_run):
    params, result = _result(demo_run)
    strict, equal = (h.set_index("lane") for h in (result.headline, result.equal_work_headline))
    assert list(equal.index) == list(strict.index) == ["draft-int4"]
    assert (equal["comparable"] >= strict["comparable"]).all()
    assert (equal["comparable"] - strict["comparable"] <= equal["re_run"]).all()
    assert equal["left_out"].str.contains("yes-loop").all()  # loops stay out of both
    split = result.cost_split
    assert sorted(split["engine"]) == ["llamacpp", "vllm"] and set(split["lane"]) == {"draft-int4"}
    assert set(split["source"]) == {"step_timer", "engine_log"} and (split["step_ms"] > 0).all()
    vllm = split.set_index("engine").loc["vllm"]
    # the step timer on vLLM-CPU: wall-clock timers around each part, its own overhead against the same server
    assert vllm["target_forward_ms"] > 0 and vllm["draft_ms"] > 0 and vllm["overhead"] > 0
    assert "wall-clock timers" in vllm["note"]
    scaled = result.cost_split_scaled
    assert set(scaled["engine"]) == {"llamacpp", "vllm"} and scaled["scaled_ms"].notna().all()
    html = (demo_run / "report.html").read_text()
    assert "Equal-work re-runs" in html and "Per-step cost split" in html


def test_the_report_opens_with_decode_rate_and_ttft_per_lane_on_equal_work(demo_run):
    params, result = _result(demo_run)
    summary = result.answer(params)
    assert [h.comparison for h in summary.headlines][:2] == ["lane draft-int4: decode rate", "lane draft-int4: TTFT"]
    assert all(h.why for h in summary.headlines)
    cells = result.decode_cells
    timed = cells[cells["timed"]]
    assert len(timed), cells[["lane", "prompt", "why_not_timed"]]
    assert (timed["common_tokens"] >= 8).all() and (timed["prompt"] != "yes-loop").all()
    assert (timed[["ours_decode_wall_s", "oracle_decode_wall_s"]] >= params.timing.min_timed_wall_s).all().all()
    assert (cells.loc[~cells["timed"], "why_not_timed"] != "").all()
    assert (timed["ours_words"] != "").all() and (timed["oracle_words"] != "").all()
    html = (demo_run / "report.html").read_text()
    first = html.split('<h2 id="Decode-rate-on-equal-work"')[0]  # what the reader sees before the first section
    assert "lane draft-int4: decode rate" in first and "The timed cells: the first words of both outputs" in first
    assert "Why: " in first and "Contents: " in first
