"""Each experiment's summary block (`result.answer(params)`) on the golden run folders: what the report leads with."""

from __future__ import annotations

from pathlib import Path

import pytest

import specbook.experiments  # noqa: F401  (experiments register at import)
from specbook.core.params import load_params
from specbook.experiments.registry import get_experiment
from specbook.report import view as rv
from specbook.store.runstore import RunContext

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def answer_of(folder: str, experiment: str):
    spec = get_experiment(experiment)
    params = load_params(spec.params_model, GOLDEN / folder / "params.yaml")
    result = spec.analyze(spec.load(RunContext.from_run_dir(GOLDEN / folder)), params)
    return result, params, result.answer(params)


def test_knob_ab_leads_with_each_comparison_its_delta_and_interval():
    result, params, summary = answer_of("knob_ab", "knob_ab")
    d = result.decision
    assert summary.question.startswith("Does each knob (fp32, int4draft) move draft acceptance (steady_log_al)")
    assert params.description in summary.question
    assert [h.comparison for h in summary.headlines] == [f"{v.arm} vs {v.baseline}" for v in d.verdicts]
    assert [h.verdict for h in summary.headlines] == [v.label.verdict() for v in d.verdicts]
    assert [h.verdict.split(":")[0] for h in summary.headlines] == [
        "UNDECIDED", "UNDECIDED", "SHOWN DIFFERENT", "UNDECIDED", "UNDECIDED"]
    row = d.comparisons.set_index(["arm", "baseline"]).loc[("int4draft", "baseline")]
    h = next(h for h in summary.headlines if h.comparison == "int4draft vs baseline")
    assert h.figure == (f"steady_log_al {rv.fmt(row['variant_mean'])} vs {rv.fmt(row['baseline_mean'])} "
                        f"({row['delta_pct']:+.2f}%)")
    # every sweep has every arm: the paired t over the per-sweep differences, named with its df, and the margin
    assert h.interval == (f"95% CI [{row['ci_low_pct']:+.2f}%, {row['ci_high_pct']:+.2f}%] vs margin \u00b11%; "
                          "paired t over 2 sweeps (df 1)")
    # the colour belongs to the expectation line: whether the label is the one the params expected
    expected = dict(zip(d.knob_verdicts["comparison"], d.knob_verdicts["as expected"], strict=True))
    assert [h.good for h in summary.headlines] == [expected[h.comparison] for h in summary.headlines]
    assert h.expected == "expected different: no" and h.rule == "meets the stated rule: no"
    assert "includes 0" in h.why and "sweeps" in h.why
    assert summary.evidence[:3] == ["2 sweeps per arm", "8 of 8 runs usable", "0 run(s) flagged by attribution"]
    assert summary.short == f"fp32 vs baseline: {summary.headlines[0].verdict} (+4 more)"


def test_knob_ab_ingest_counts_its_runs():
    _, _, summary = answer_of("knob_ab_ingest", "knob_ab")
    assert [h.comparison for h in summary.headlines] == ["int4draft vs baseline"]
    assert summary.evidence[:2] == ["2 sweeps per arm", "4 of 4 runs usable"]


def test_config_flip_leads_with_the_collapse_and_output_equality():
    _, _, summary = answer_of("config_flip", "config_flip")
    assert summary.question == ("Does flipping config.json:rope_parameters.rope_theta of smollm2-135m-instruct-fp8 "
                                "(100000.0 vs 100.0) change draft acceptance?")
    collapse, outputs = summary.headlines
    # one server per arm, no run-to-run interval: the labels say what this run measured
    assert (collapse.comparison, collapse.verdict) == ("arm1-100.0 vs arm0-100000.0 (best)", "COLLAPSED in this run")
    assert collapse.interval.startswith("one server per arm: no run-to-run interval")
    # AL from the counters: 1 + 146/46 and 1 + 64/119; accepted per step = AL - 1
    assert collapse.figure == ("AL 1.538 vs 4.174; accepted per step 0.538 vs 3.17 (17% of best; "
                               "collapse at <= 25%)")
    assert (outputs.verdict, outputs.good, outputs.figure) == ("EQUAL in this run", True,
                                                               "3 of 3 prompts equal under greedy decoding")
    assert summary.evidence[:3] == ["2 arms, one server each", "6 requests (0 failed)", "165 drafts counted"]
    assert summary.short == "rope_theta 100.0 vs 100000.0: COLLAPSED in this run (AL 1.538 vs 4.174)"


def test_cross_engine_leads_with_decode_rate_and_ttft_per_lane_each_with_its_why():
    result, params, summary = answer_of("cross_engine", "cross_engine")
    assert summary.question.startswith("How fast does llamacpp (ours) decode against the pinned vllm oracle")
    assert summary.question.endswith("Ratios are llamacpp / vllm.")
    lanes = ["off", "ngram", "draft-int4"]
    assert [h.comparison for h in summary.headlines] == [
        *(f"lane {lane}: decode rate" for lane in lanes), *(f"lane {lane}: TTFT" for lane in lanes),
        "speculation against off, each engine"]
    # the golden run's 64-token outputs: nothing to time at the 64-common-token minimum, and the report says why
    off = summary.headlines[0]
    assert (off.verdict, off.good) == ("NO CELL TIMED", False)
    assert off.figure == ("none of 3 cells timed on equal decode work: 1 loop or off-task output, "
                          "2 under the common-token minimum")
    assert off.why == "a cell is timed only with >= 64 common tokens and a decode wall of >= 0.25 s a side"
    ttft = summary.headlines[3]
    head = result.decode_headline.set_index("lane").loc["off"]
    assert ttft.verdict == f"{rv.fmt(head['ttft_ratio'], 3)}x shorter" and head["ttft_ratio_hi"] < 1
    assert ttft.interval == rv.interval(head["ttft_ratio_lo"], head["ttft_ratio_hi"], 0.95, 3) + ", t over 3 cells"
    assert ttft.why == "the prompt's prefill of ~42 tokens and the request path; not decode work"
    spec = summary.headlines[-1]
    assert spec.verdict == "MIXED OR UNDECIDED" and spec.why.startswith("whether speculation pays here is not decided")
    assert all(h.why for h in summary.headlines)
    assert summary.evidence[0] == ("9 cells (3 lanes x 3 prompts); timed: off 0, ngram 0, draft-int4 0 "
                                   "(>= 64 common tokens, decode wall >= 0.25 s a side)")


@pytest.mark.parametrize("folder,experiment", [("knob_ab", "knob_ab"), ("config_flip", "config_flip"),
                                               ("cross_engine", "cross_engine")])
def test_the_summary_block_renders_every_headline(folder, experiment):
    _, _, summary = answer_of(folder, experiment)
    out = rv.summary_html(summary, GOLDEN / folder)
    assert all(h.verdict in out and h.comparison in out for h in summary.headlines)
    assert "collected in one go (not resumed)" in out
