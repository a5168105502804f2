"""The analysis findings on real run folders, without a server: golden folders, second set.

tests/golden holds, besides the pre-refactor folders (test_golden.py), real runs that carry what the demos'
e2e runs used to be the only proof of (tests/golden/README.md says how each was made):
- config_flip_traced: the config-flip CPU demo as config_flip.ipynb runs it when opened (two vLLM-CPU arms, then
  each arm's untimed trace pass and profiled pass);
- cross_engine_traced: the cross-engine CPU demo reduced to 2 prompts and lanes off / draft-int4, with its trace
  pass, equal-work re-runs and profiled pass (llama.cpp vs vLLM-CPU);
- concurrency_curve: the curve's CPU demo reduced to levels 1 and 4, 2 sweeps, fp8 vs int4 draft;
- cross_engine_h200: the H200 cross-engine run (24 prompts, vLLM 0.26 with CUDA graphs vs llama.cpp CUDA), data
  and the timed servers' logs only;
- cross_engine_h100_sglang_off: the first SGLang cross-engine run (SGLang 0.5.15.post1 vs vLLM 0.26, both with CUDA
  graphs, on an H100), which failed at its ngram server: its off lane, whole on both sides, data and logs;
- cross_engine_h100_sglang_ngram_forget: SGLang's ngram lane alone against vLLM with draft_memory forget (SGLang's
  /flush_cache before each timed request), on an H100: data and the three servers' logs (gzipped).
Each folder goes through today's load() and analyze(); the findings the demos exist to show must hold in it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specbook.core.params import load_params
from specbook.experiments import concurrency_curve as cc
from specbook.experiments import config_flip as cf
from specbook.experiments import cross_engine as ce
from specbook.store.runstore import RunContext

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _copy(name: str, tmp_path: Path) -> Path:
    """A copy elsewhere: the analysis must not depend on where the run was made, nor write into the golden."""
    src = GOLDEN / name
    if not (src / "params.yaml").is_file():
        pytest.fail(f"golden folder {src} is missing (tests/golden/README.md says how it was made)")
    return Path(shutil.copytree(src, tmp_path / name))


def _flip(tmp_path):
    run = _copy("config_flip_traced", tmp_path)
    params = load_params(cf.ConfigFlipParams, run / "params.yaml")
    return cf.analyze(cf.load(RunContext.from_run_dir(run)), params), params


def _cross(name: str, tmp_path):
    run = _copy(name, tmp_path)
    params = load_params(ce.CrossEngineParams, run / "params.yaml")
    return ce.analyze(ce.load(RunContext.from_run_dir(run)), params), params


# ------------------------------------------------------------------------------------------------
# config flip


def test_the_flipped_rope_theta_collapses_acceptance_and_keeps_the_outputs(tmp_path):
    _, params = _flip(tmp_path)
    data = cf.load(RunContext.from_run_dir(tmp_path / "config_flip_traced"))
    summary = cf.arm_summary(data).set_index("arm")
    original, flipped = summary.loc["arm0-100000.0"], summary.loc["arm1-100.0"]
    assert original["failed"] == 0 and flipped["failed"] == 0
    assert original["al"] > 2.5  # the fp8 draft of the same weights accepts most of its 4 tokens
    assert flipped["al"] - 1 < params.collapse_fraction * (original["al"] - 1)
    equality = cf.output_equality(data)
    assert len(equality) == len(params.selected_prompts()) and equality["all_equal"].all(), equality


def test_each_arms_trace_pass_agrees_with_its_counters_and_the_replay(tmp_path):
    result, _ = _flip(tmp_path)
    agreement = result.trace_agreement.set_index("arm")
    assert list(agreement.index) == ["arm0-100000.0", "arm1-100.0"]
    for arm, row in agreement.iterrows():
        assert row["agree"], (arm, row["disagreements"])
        assert row["derived_drafts"] == row["counter_drafts"] > 0
        assert row["derived_draft_tokens"] == row["counter_draft_tokens"]
        # vLLM counts what its sampler kept in a step the request's end cut: between derived and full proposals
        assert row["derived_accepted"] <= row["counter_accepted"] <= row["derived_accepted_max"]
    rate = agreement["derived_accepted"] / agreement["derived_draft_tokens"]
    assert rate["arm1-100.0"] < 0.25 * rate["arm0-100000.0"]  # the collapse shows in the trace pass too
    replay = result.replay.set_index("arm")
    assert (replay["anchors"] > 0).all() and replay.loc["arm0-100000.0", "identical_share"] > 0.5
    splits = result.cost_split.set_index("lane")
    assert list(splits.index) == ["arm0-100000.0", "arm1-100.0"] and (splits["source"] == "profiler").all()
    assert (splits["step_ms"] > 0).all() and (splits["target_forward_ms"] > 0).all() and (splits["draft_ms"] > 0).all()


# ------------------------------------------------------------------------------------------------
# cross engine


@pytest.mark.parametrize("name, loops", [("cross_engine_traced", {"yes-loop"}),
                                         ("cross_engine_h200", {"yes-loop", "hello-loop"}),
                                         ("cross_engine_h100_sglang_off", {"yes-loop", "hello-loop"})])
def test_loop_cells_are_flagged_and_left_out_of_every_headline(name, loops, tmp_path):
    result, params = _cross(name, tmp_path)
    cells = result.cells
    looped = cells[cells["prompt"].isin(loops)]
    assert len(looped) == len(loops) * cells["lane"].nunique()
    assert not looped["comparable"].any() and looped["flags"].str.contains("degenerate").all(), looped["flags"]
    for headline in (result.headline, result.equal_work_headline):
        for loop in loops:
            assert headline["left_out"].str.contains(loop).all(), headline[["lane", "left_out"]]


@pytest.mark.parametrize("name", ["cross_engine_traced", "cross_engine_h200"])
def test_trace_passes_derive_the_counters_on_both_engines(name, tmp_path):
    result, _ = _cross(name, tmp_path)
    agree = result.trace_agreement
    assert set(agree["side"]) == {"oracle", "ours"}
    for _, row in agree.iterrows():
        assert row["agree"], (row["side"], row["lane"], row["disagreements"])
        assert row["derived_drafts"] == row["counter_drafts"] > 0
        assert row["derived_accepted"] <= row["counter_accepted"] <= row["derived_accepted_max"]
        if row["side"] == "ours":  # llama.cpp reports every step's count: exact
            assert row["derived_accepted"] == row["counter_accepted"]
    replay = result.replay
    assert (replay["systematic_mismatches"] == "none").all() and (replay["identical_share"] > 0.9).all(), replay


@pytest.mark.parametrize("name", ["cross_engine_traced", "cross_engine_h200"])
def test_equal_work_headline_adds_only_re_run_cells_and_every_lane_has_a_cost_split(name, tmp_path):
    result, params = _cross(name, tmp_path)
    strict, equal = (h.set_index("lane") for h in (result.headline, result.equal_work_headline))
    assert list(equal.index) == list(strict.index) == [lane.name for lane in params.lanes]
    assert (equal["comparable"] >= strict["comparable"]).all()
    assert (equal["comparable"] - strict["comparable"] <= equal["re_run"]).all()
    assert (equal["ratio"] > 0).all() and (strict["ratio"] > 0).all()
    split = result.cost_split
    assert (split["step_ms"] > 0).all()
    assert {(row.lane, row.source) for row in split.itertuples()} >= {
        (lane, source) for lane in set(split["lane"]) for source in ("profiler", "engine_log")}


def test_the_h200_run_rests_on_real_cells_in_every_lane(tmp_path):
    """24 prompts x 3 lanes; each lane's headline has comparable cells and equal-work re-runs added some."""
    result, params = _cross("cross_engine_h200", tmp_path)
    assert len(result.cells) == 24 * 3
    head = result.equal_work_headline.set_index("lane")
    assert (head["re_run"] > 0).all() and (head["comparable"] > result.headline.set_index("lane")["comparable"]).all()


# ------------------------------------------------------------------------------------------------
# concurrency curve


def test_the_positive_control_lowers_al_at_every_level_of_every_sweep(tmp_path):
    run = _copy("concurrency_curve", tmp_path)
    params = cc.load_params_file(str(run / "params.yaml"))
    data = cc.load(RunContext.from_run_dir(run))
    assert len(data.levels) == 8 and (data.levels["n_errors"] == 0).all()
    result = cc.analyze(data, params)
    al = result.windows.pivot_table(index=["sweep", "level"], columns="arm", values="al")
    assert len(al) == 4 and (al["int4draft"] < al["baseline"]).all(), al
    assert (al["baseline"] > 2.0).all(), al
    deltas = result.deltas[result.deltas["metric"] == "AL"]
    assert set(deltas["level"]) == {1, 4} and (deltas["delta"] < 0).all() and (deltas["n_pairs"] == 2).all()


def test_the_sglang_run_compares_on_real_cells_with_sglang_set_up_as_it_ran(tmp_path):
    """SGLang's side through the same analysis: its pins, its start-up read from its log (CUDA graphs it captured),
    its ngram set-up told apart from vLLM's, and an off lane timed on real cells only (the other lanes never ran)."""
    result, _ = _cross("cross_engine_h100_sglang_off", tmp_path)
    pins = result.pins
    assert pins["ok"].all() and set(pins.loc[pins["side"] == "ours", "key"]) >= {"sglang", "sglang-kernel", "torch"}
    setup = result.setup.set_index(["lane", "aspect"])
    graphs = setup.loc[("off", "graphs / compilation")]
    assert graphs["ours"] == "CUDA graphs" and "captured: target decode, target prefill" in graphs["ours_detail"]
    ngram = setup.loc[("ngram", "speculation")]
    assert ngram["differs"] and "not mapped" in ngram["ours"] and ngram["oracle"] == "ngram match length 2..4"
    head = result.decode_headline.set_index("lane")
    assert list(head.index) == ["off"] and head.loc["off", "timed"] >= 5
    assert head.loc["off", "decode_ratio_lo"] <= head.loc["off", "decode_ratio"] <= head.loc["off", "decode_ratio_hi"]


def test_an_emptied_sglang_trie_drafts_as_on_a_first_serve_and_the_headline_is_not_scoped(tmp_path):
    """draft_memory forget on a real SGLang server: every timed SGLang request records what /flush_cache emptied,
    none streams its output in fewer chunks on a later serve (the full edition's re-served prompts did, 5 of 24),
    so the ngram headline carries no "prompts served before" scope, and its TTFT line names what was emptied."""
    result, params = _cross("cross_engine_h100_sglang_ngram_forget", tmp_path)
    assert params.draft_memory == "forget"
    chunks = result.repeat_chunks.set_index("engine")
    assert chunks.loc["sglang", "prompts"] >= 20 and chunks.loc["sglang", "fewer_chunks_later"] == 0
    assert chunks.loc["vllm", "fewer_chunks_later"] == 0
    assert result.caveats == {}
    answer = {h.comparison: h for h in result.answer(params).headlines}
    assert "prompts served before" not in answer["lane ngram: decode rate"].verdict
    assert "emptied its NGRAM trie" in answer["lane ngram: TTFT"].why
    assert "speculation against off, each engine" not in answer  # no off lane in this run
    head = result.decode_headline.set_index("lane").loc["ngram"]
    assert head["timed"] >= 5 and head["decode_ratio_lo"] <= head["decode_ratio"] <= head["decode_ratio_hi"]
