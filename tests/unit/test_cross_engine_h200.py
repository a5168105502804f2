"""The committed GPU cross-engine reports: the H200 second edition (docs/reports/cross_engine-h200, commit a0121e8,
22 servers) and the fourth edition on an H100 (docs/reports/cross_engine-h100, commit ec833a5, one vLLM server per
lane, the llama.cpp build carried from an earlier lease; it replaced the third edition of commit 83325b0, which is in
the repository's history): their headlines rest on equal decode work, the cells they leave out say why, and their
figures are those their raw frames give.

Each folder holds what its report re-renders from (data/, the timed servers' logs, params, manifest); here the
analysis runs again and is checked against the frames directly, so a change to the code that moves a figure of a
committed report fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specbook.core.params import load_params
from specbook.experiments import cross_engine as ce
from specbook.store.runstore import RunContext

REPORTS = Path(__file__).resolve().parents[2] / "docs" / "reports"
FOLDER = REPORTS / "cross_engine-h200"
THIRD = REPORTS / "cross_engine-h100"


def _analyzed(folder: Path):
    if not (folder / "data" / "requests.parquet").is_file():
        pytest.fail(f"{folder} holds no data/requests.parquet: docs/reports/README.md says what the folder keeps")
    params = load_params(ce.CrossEngineParams, folder / "params.yaml")
    data = ce.load(RunContext.from_run_dir(folder))
    return params, data, ce.analyze(data, params), folder


@pytest.fixture(scope="module", params=[FOLDER, THIRD], ids=["h200-a0121e8", "h100-ec833a5"])
def h200(request):
    return _analyzed(request.param)


@pytest.fixture(scope="module")
def second():
    return _analyzed(FOLDER)


@pytest.fixture(scope="module")
def third():
    return _analyzed(THIRD)


def _pooled_rate(rows: pd.DataFrame) -> float:
    return float((rows["completion_tokens"] - 1).sum() / (rows["wall_s"] - rows["ttft_s"]).sum())


def test_each_lane_is_timed_on_equal_decode_work_only(h200):
    params, data, r, _ = h200
    head = r.decode_headline.set_index("lane")
    assert list(head.index) == ["off", "ngram", "draft-int4"] and (head["cells"] == 24).all()
    timed = r.decode_cells[r.decode_cells["timed"]]
    assert (timed["common_tokens"] >= params.timing.min_common_tokens).all()
    assert (timed[["ours_decode_wall_s", "oracle_decode_wall_s"]] >= params.timing.min_timed_wall_s).all().all()
    assert list(head["timed"]) == [int((timed["lane"] == lane).sum()) for lane in head.index]
    assert not timed["prompt"].isin(["yes-loop", "hello-loop", "letter-loop", "capital"]).any()
    # a timed cell on its own requests: the decode rate from the raw frame, pooled over the repeats
    req = data.requests
    cell = timed[(timed["lane"] == "off") & (timed["prompt"] == "count-up")].iloc[0]
    for side in ("ours", "oracle"):
        rows = req[(req["lane"] == "off") & (req["prompt"] == "count-up") & (req["side"] == side)]
        assert cell[f"{side}_decode_tok_s"] == pytest.approx(_pooled_rate(rows))
    # the lane headline: the geometric mean of its cells' ratios
    off = timed[timed["lane"] == "off"]["decode_ratio"]
    assert head.loc["off", "decode_ratio"] == pytest.approx(float(np.exp(np.log(off).mean())))
    assert (head["decode_ratio_lo"] < head["decode_ratio"]).all() and (head["decode_ratio"] < head["decode_ratio_hi"]).all()


def test_the_letter_loop_that_became_a_count_and_the_loops_say_why_they_are_left_out(h200):
    _, _, r, _ = h200
    cells = r.decode_cells.set_index(["lane", "prompt"])
    for lane in ("off", "ngram", "draft-int4"):
        assert cells.loc[(lane, "letter-loop"), "why_not_timed"].startswith("left its prompt's task")
        assert cells.loc[(lane, "yes-loop"), "why_not_timed"] == "a loop (degenerate output)"
        assert cells.loc[(lane, "capital"), "why_not_timed"] == "8 common tokens < 64"
    flags = r.cells.set_index(["lane", "prompt"]).loc[("off", "letter-loop"), "flags"]
    assert flags == "left_task_llamacpp-cuda, left_task_vllm-cuda"
    assert (r.decode_cells.loc[~r.decode_cells["timed"], "why_not_timed"] != "").all()


def test_the_summary_leads_with_decode_rate_and_ttft_per_lane_texts_and_a_why(h200):
    params, _, r, folder = h200
    summary = r.answer(params)
    names = [h.comparison for h in summary.headlines]
    assert names[:6] == [f"lane {lane}: {what}" for what in ("decode rate", "TTFT")
                         for lane in ("off", "ngram", "draft-int4")]
    assert all(h.why for h in summary.headlines)
    spec = summary.headlines[-1]
    assert spec.verdict == "SLOWER THAN OFF ON BOTH ENGINES" and (r.speculation_effect["vs_off_hi"] < 1).all()
    assert spec.why.endswith("drafting does not pay for a 135M target, so the speculative lanes' ratios compare "
                             "whose speculation hurts less")
    assert set(r.headline_texts["prompt"]) == set(r.decode_cells.loc[r.decode_cells["timed"], "prompt"])
    assert (r.headline_texts["ours, first words"] != "").all()
    html = (folder / "report.html").read_text()
    first = html.split('<h2 id="Decode-rate-on-equal-work"')[0]
    assert "lane off: decode rate" in first and "lane draft-int4: TTFT" in first and "Why: " in first
    assert "The timed cells: the first words of both outputs" in first
    assert all(path not in html for path in ("/root/", "/tmp/", "/opt/", "/work/"))


def test_the_recorded_cost_split_says_what_it_could_not_see(second):
    _, _, r, _ = second
    notes = r.cost_split_notes
    assert notes[0].startswith("This run's vLLM split comes from the torch profiler")
    assert "vllm-cuda off reads target forward 0" in notes[0]
    assert [n.split(":")[0] for n in notes[1:]] == ["vllm-cuda draft-int4", "llamacpp-cuda draft-int4"]
    scaled = r.cost_split_scaled
    step = scaled[scaled["part"] == "step (all parts)"]
    assert step["scaled_ms"].notna().all() and (step["scaled_ms"] > 0).all()


def test_the_h100_edition_served_every_phase_of_a_lane_from_one_vllm_server(third):
    _, _, r, folder = third
    servers = [json.loads(line) for line in (folder / "servers.jsonl").read_text().splitlines() if line.strip()]
    vllm = [s for s in servers if s["name"].startswith("vllm-cuda")]
    assert sorted(s["name"] for s in vllm) == ["vllm-cuda-draft-int4", "vllm-cuda-ngram", "vllm-cuda-off"]
    for s in vllm:
        assert s["extra"]["phases"][0] == "timed" and "profile" in s["extra"]["phases"]
    # the step timer's split (graphs on): the parts add up to the step, per vLLM lane
    split = r.cost_split[r.cost_split["engine"] == "vllm-cuda"].set_index("lane")
    assert (split["source"] == "step_timer").all()
    parts = split[["target_forward_ms", "draft_ms", "sampling_ms", "rest_ms"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(split["step_ms"].to_numpy(), rel=1e-6)
    assert split.loc["off", "draft_ms"] == 0 and split.loc["draft-int4", "draft_ms"] > split.loc["draft-int4",
                                                                                              "target_forward_ms"]
    # the draft lane's vLLM server started during llama.cpp's untimed trace pass (its replay needs no server), and
    # its timed phase began after llama.cpp's last phase of the lane
    by_name = {s["name"]: s for s in servers}
    started = by_name["vllm-cuda-draft-int4"]["started_at"]
    trace = by_name["llamacpp-cuda-draft-int4-trace"]
    assert trace["started_at"] < started < trace["stopped_at"] < by_name["llamacpp-cuda-draft-int4-prof"]["stopped_at"]
    html = (folder / "report.html").read_text()
    assert "clean_up_tokenization" not in html  # no library warning in a report cell
