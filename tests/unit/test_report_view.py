"""specbook.report.view: the summary block and the reading tables every report shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specbook.experiments.knob_ab.decision import DecisionRule, evaluate_difference
from specbook.report import view as rv


def test_fmt_gives_significant_digits_without_exponents_for_everyday_numbers():
    assert rv.fmt(4.62912) == "4.629"
    assert rv.fmt(12345.6) == "12346"
    assert rv.fmt(0.000012) == "1.20e-05"
    assert rv.fmt(np.int64(7)) == "7"
    assert rv.fmt(np.bool_(True)) == "yes" and rv.fmt(False) == "no"
    assert rv.fmt(float("nan")) == rv.fmt(None) == rv.fmt(pd.NA) == "-"
    assert rv.fmt(0.1234567, 2) == "0.12"
    assert rv.fmt(2.78e-17) == "0"
    assert rv.fmt("text") == "text"


def test_signed_pct_and_interval():
    assert rv.signed_pct(0.2561) == "+0.26%" and rv.signed_pct(-1.1) == "-1.10%"
    assert rv.signed_pct(float("nan")) == "-"
    assert rv.interval(-0.0112, 0.0193, 0.95, what="delta") == "95% CI of delta [-0.0112, 0.0193]"
    assert rv.interval(float("nan"), float("nan"), 0.95) == ""


def test_table_has_no_index_column_units_in_headers_and_every_row():
    df = pd.DataFrame({"arm": [f"a{i}" for i in range(70)], "tok_s": np.linspace(1, 2, 70)}, index=range(100, 170))
    out = rv.table_html(df, units={"tok_s": "tok/s"})
    assert "<th class='sb-text'>tok_s (tok/s)</th>" in out
    assert out.count("<tr>") == 71  # header + 70 rows: nothing cut, no "..."
    assert ">100<" not in out and "…" not in out and "..." not in out  # the index is not shown
    assert ">a69<" in out and ">2<" in out


def test_a_wide_table_with_few_rows_is_transposed():
    df = pd.DataFrame([{"arm": "base", **{f"c{i}": i + 0.5 for i in range(20)}},
                       {"arm": "knob", **{f"c{i}": i + 1.5 for i in range(20)}}])
    out = rv.table_html(df, units={"c3": "ms"})
    head = re.search(r"<thead>(.*?)</thead>", out).group(1)
    assert re.findall(r">([^<]*)</th>", head) == ["", "base", "knob"]
    assert ">c3 (ms)<" in out and out.count("<tr>") == 21


def test_a_transposed_table_keeps_rows_whose_first_column_is_alike():
    # the H200 config-flip cost split: two arms, both engine "vllm" -- one column was silently dropped
    df = pd.DataFrame([{"engine": "vllm", "lane": "arm0", **{f"c{i}": i for i in range(20)}},
                       {"engine": "vllm", "lane": "arm1", **{f"c{i}": i + 100 for i in range(20)}}])
    head = re.search(r"<thead>(.*?)</thead>", rv.table_html(df)).group(1)
    assert re.findall(r">([^<]*)</th>", head) == ["", "vllm / arm0", "vllm / arm1"]
    same = pd.DataFrame([{"engine": "vllm", **{f"c{i}": i for i in range(20)}}] * 2)
    out = rv.table_html(same)
    assert ">vllm (row 0)<" in out and ">vllm (row 1)<" in out


def test_a_wide_table_with_many_rows_is_split_repeating_its_first_column():
    df = pd.DataFrame({"arm": list("abcdef"), **{f"c{i}": range(6) for i in range(12)}})
    out = rv.table_html(df, max_columns=5)
    assert out.count("<table") == 3  # 12 value columns in groups of 4
    assert out.count(">arm<") == 3
    assert all(f">c{i}<" in out for i in range(12))
    # the first group is shown, the continuations fold beneath it, named by the columns they hold
    shown, folded = out.split("<details", 1)
    assert ">c3<" in shown and ">c4<" not in shown
    assert "8 more columns, by arm: c4, c5, c6, c7, c8, c9, c10, c11" in folded


def test_continuations_repeat_every_key_column_that_tells_the_rows_apart():
    """lane alone repeats (three prompts a lane): each continuation carries lane and prompt, so its rows read."""
    df = pd.DataFrame({"lane": ["off"] * 3 + ["ngram"] * 3, "prompt": list("abcabc"),
                       **{f"c{i}": range(6) for i in range(10)}})
    assert rv.key_columns(df) == ["lane", "prompt"]
    out = rv.table_html(df, max_columns=6)
    assert out.count("<table") == 3 and out.count(">lane<") == 3 and out.count(">prompt<") == 3
    assert "by lane, prompt" in out
    assert rv.table_html(df, max_columns=6, keys=["lane"]).count(">prompt<") == 1


def test_long_tables_and_outlines_fold_behind_a_one_line_count():
    df = pd.DataFrame({"cell": range(30), "failed": 0})
    out = rv.long_table_html(df, "Requests and failures per cell")
    assert out.startswith("<details") and "Requests and failures per cell: 30 rows" in out
    assert not rv.long_table_html(df.head(5), "x").startswith("<details")
    outline = rv.folded_outline_html("a: NOT COMPARABLE\n    - a loop", "Why each flagged cell is not comparable", 1)
    assert "Why each flagged cell is not comparable (1)</summary>" in outline and "<li>a loop</li>" in outline


def test_a_headline_carries_its_why_under_its_figure():
    summary = rv.Summary("Q?", [rv.Headline("lane off: decode rate", "1.5x faster", None, "701 vs 464 tok/s",
                                            why="one token per step: the step-time ratio")])
    out = rv.summary_html(summary)
    # the why-sentence is the row under its headline's row
    assert ("701 vs 464 tok/s</td>" in out
            and "<td class='sb-text sb-why' colspan='3'>Why: one token per step: the step-time ratio</td>" in out)
    assert "sb-why" not in rv.summary_html(rv.Summary("Q?", [rv.Headline("a", "B", None, "c")])).split("</style>")[1]


def test_every_rendered_report_gets_a_table_of_contents_after_its_title():
    body = ('<html><body><h1 id="T">Title<a class="anchor-link" href="#T">\u00b6</a></h1><p>x</p>'
            '<h2 id="Decode-rate">Decode rate<a class="anchor-link" href="#Decode-rate">\u00b6</a></h2>'
            '<h3 id="Per-chunk">Per chunk &amp; token</h3><h2>Summary</h2></body></html>')
    out = rv.with_toc(body)
    assert out.index("</h1>") < out.index("<nav class='sb-toc'>") < out.index("<p>x</p>")
    assert "Contents: 2 sections" in out  # a heading without an id (the summary block's own) is no section
    assert "<a href='#Decode-rate'>Decode rate</a>" in out and "<a href='#Per-chunk'>Per chunk &amp; token</a>" in out
    assert ".jp-Cell.jp-mod-noInput.jp-mod-noOutputs{display:none}" in out
    assert rv.toc_html("<p>no headings</p>") == ""


def test_index_kept_when_it_names_the_rows():
    table = pd.DataFrame({"base": [0.8, 0.7]}, index=pd.Index([1, 2], name="position"))
    out = rv.table_html(table, index=True)
    assert ">position<" in out and ">0.8<" in out


def test_text_is_escaped_and_raw_html_columns_are_not():
    df = pd.DataFrame({"what": ["<b>x</b>"], "link": ["<a href='r.html'>report</a>"]})
    out = rv.table_html(df, raw_html=("link",))
    assert "&lt;b&gt;x&lt;/b&gt;" in out and "<a href='r.html'>report</a>" in out


def test_raw_tables_fold_into_details():
    df = pd.DataFrame({"a": [1, 2], "b": [3, 4]})
    out = rv.raw_table_html(df, "per-run values")
    assert out.startswith("<details class='sb-raw'><summary>per-run values (2 rows x 2 columns)</summary>")
    assert out.endswith("</details>")


def _summary() -> rv.Summary:
    return rv.Summary("Does the knob move AL?",
                      [rv.Headline("fp32 vs baseline", "EQUIVALENT", True, "AL 4.6 vs 4.6 (+0.26%)",
                                   "95% CI of delta [-0.50%, +1.00%]"),
                       rv.Headline("int4 vs baseline", "NOT SHOWN DIFFERENT", False, "AL 3.5 vs 4.6 (-24%)")],
                      ["3 sweeps per arm", "", "12 of 12 runs usable"])


def test_summary_block_leads_with_question_verdicts_figures_and_evidence(tmp_path):
    out = rv.summary_html(_summary())
    assert out.index("Does the knob move AL?") < out.index("fp32 vs baseline") < out.index("Evidence.")
    assert "<td class='sb-text sb-good'>EQUIVALENT</td>" in out
    assert "<td class='sb-text sb-bad'>NOT SHOWN DIFFERENT</td>" in out
    assert "95% CI of delta [-0.50%, +1.00%]" in out
    assert "3 sweeps per arm; 12 of 12 runs usable</p>" in out  # empty evidence items dropped, no manifest: no line


def test_summary_says_whether_the_run_was_resumed_from_the_manifest_parts(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "ok", "parts": [{"started_at": "t"}]}))
    assert "collected in one go (not resumed)" in rv.summary_html(_summary(), tmp_path)
    parts = [{"started_at": "t"}, {"resumed_from": "interrupted"}, {"resumed_from": "failed"}]
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "ok", "parts": parts}))
    assert rv.run_parts(tmp_path) == {"status": "ok", "parts": 3, "resumed": 2, "renders": 0}
    assert "resumed 2 times (3 parts)" in rv.summary_html(_summary(), tmp_path)
    assert rv.run_parts(tmp_path / "nowhere") == {} and rv.collection_line({}) == ""
    assert "stopped" not in rv.summary_html(_summary(), tmp_path)


@pytest.mark.parametrize("status", ["interrupted", "abandoned"])
def test_a_run_stopped_before_its_end_says_so_in_the_summary(tmp_path, status):
    (tmp_path / "manifest.json").write_text(json.dumps({"status": status, "parts": [{"started_at": "t"}]}))
    assert (f"collected in one go (not resumed); the run was stopped before its end (status {status})"
            in rv.summary_html(_summary(), tmp_path))


def test_a_failed_run_names_its_error_not_a_stop_it_may_not_have_had(tmp_path):
    # the H100 probe's manifest: every window measured, then the notebook's analysis failed
    error = ("cell 2 (In [3]) at `book = open_book(\"concurrency_curve\", params_file, run_dir, reuse_data, overrides, "
             "analysis)` raised KeyError: 'sweeps_left_out'")
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "failed", "error": error,
                                                        "parts": [{"started_at": "t"}]}))
    out = rv.summary_html(_summary(), tmp_path)
    assert "stopped before its end" not in out
    assert "the run ended with status failed (cell 2 (In [3]) at `book = open_book(" in out
    assert "the figures are what its saved data holds" in out
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "failed", "parts": []}))
    assert "status failed (no error recorded)" in rv.summary_html(_summary(), tmp_path)


def test_save_summary_writes_what_the_index_reads(tmp_path):
    path = rv.save_summary(_summary(), tmp_path / "summary.json")
    doc = json.loads(path.read_text())
    assert doc["question"] == "Does the knob move AL?"
    assert [h["verdict"] for h in doc["headlines"]] == ["EQUIVALENT", "NOT SHOWN DIFFERENT"]


def test_criteria_list_marks_pass_fail_and_not_applicable():
    out = rv.criteria_html("x vs y", [("sweeps", True, "3 >= 2"), ("tost", False, "p = 0.2"), ("sd", None, "sd = 0")])
    assert out.count("<li>") == 3
    assert f"{rv.PASS_MARK}</span> <b>sweeps</b>: 3 &gt;= 2" in out
    assert f"{rv.FAIL_MARK}</span> <b>tost</b>" in out and f"{rv.NA_MARK}</span> <b>sd</b>" in out


def test_verdict_html_leads_with_the_label_and_does_not_repeat_it_or_the_pass_word():
    row = {"arm": "int4", "baseline": "baseline", "ci_low": -1.4, "ci_high": -1.0, "delta_pct": -25.0, "ci": 0.95,
           "ci_low_pct": -29.2, "ci_high_pct": -20.8, "baseline_mean": 4.8, "delta_se": 0.1, "ci_df": 2.0,
           "ci_method": "Welch", "margin_pct": 1.0, "n_baseline": 3, "n_variant": 3, "deterministic": False}
    v = evaluate_difference(DecisionRule(), row)
    out = rv.verdict_html(v)
    assert out.count("int4 vs baseline") == 1 and "int4 vs baseline: SHOWN DIFFERENT: -25.00%" in out
    assert "95% CI [-29.20%, -20.80%] vs margin \u00b11%" in out and "meets the stated rule (different): yes" in out
    assert "PASS" not in out and "FAIL" not in out
    assert "<b>ci_excludes_zero</b>: 95% Welch t CI of delta [-1.4, -1] (df 2) excludes 0" in out


def test_a_headline_with_an_expectation_colours_it_and_never_the_label():
    s = rv.Summary("q?", [rv.Headline("a vs baseline", "UNDECIDED: ~3 more sweeps", False, "AL 4.5 vs 4.6 (-2.00%)",
                                      "95% CI [-5.00%, +1.00%] vs margin \u00b11%", "expected equivalent: no",
                                      "meets the stated rule: yes", "The 95% interval includes 0."),
                          rv.Headline("b: throughput", "STILL GROWING in this run", None, "tok/s grows")])
    out = rv.summary_html(s)
    assert "<td class='sb-text sb-neutral'>UNDECIDED: ~3 more sweeps</td>" in out
    assert "<td class='sb-text sb-bad'>expected equivalent: no</td>" in out
    assert "<th class='sb-text'>stated before the run</th><th class='sb-text'>stated rule</th>" in out
    assert "<td class='sb-text sb-why' colspan='5'>Why: The 95% interval includes 0.</td>" in out
    assert rv.short_clause(s.headlines) == "a vs baseline: UNDECIDED: ~3 more sweeps (+1 more)"


def test_outline_nests_indented_lines():
    out = rv.outline_html("off / loop: NOT COMPARABLE\n    - degenerate\n    - too short\nngram / x: NOT COMPARABLE\n")
    assert out == ("<ul><li>off / loop: NOT COMPARABLE<ul><li>degenerate</li><li>too short</li></ul></li>"
                   "<li>ngram / x: NOT COMPARABLE</li></ul>")


@pytest.mark.parametrize("bad", [pd.DataFrame(), None])
def test_an_empty_table_says_so(bad):
    assert "nothing to show" in rv.table_html(bad)


def test_the_summary_says_where_the_run_ran_from_its_manifest_not_from_the_params_text(tmp_path):
    # an H200 params file run on a lent H100 (docs/reports/knob_ab-h100-attention-backend-both-2sweeps): the
    # question names the H200, the manifest the card
    manifest = json.loads((Path(__file__).parents[2] / "docs/reports/knob_ab-h100-attention-backend-both-2sweeps/"
                           "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    line = rv.ran_on_line(tmp_path)
    assert line == "1 x NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0); commit 7004b51 (clean tree)"
    assert f"<b>Ran on.</b> {line}</p>" in rv.summary_html(_summary(), tmp_path)
    gpu = {"name": "NVIDIA H200", "driver_version": "580.159.04"}
    (tmp_path / "manifest.json").write_text(json.dumps({
        "hardware": {"gpu": {"nvidia": [gpu, gpu]}}, "git": {"sha": "0123456789abcdef", "dirty": "unknown"}}))
    assert rv.ran_on_line(tmp_path) == "2 x NVIDIA H200 (driver 580.159.04); commit 0123456 (tree state unknown)"
    (tmp_path / "manifest.json").write_text(json.dumps({
        "hardware": {"cpu": {"model_name": "AMD EPYC", "threads": 2}, "gpu": {}}, "git": {"sha": "abc", "dirty": True}}))
    assert rv.ran_on_line(tmp_path) == "no GPU: AMD EPYC, 2 threads; commit abc (uncommitted changes)"
    assert rv.ran_on_line(tmp_path / "nowhere") == "" and "Ran on." not in rv.summary_html(_summary())


def test_the_ran_on_line_names_every_kind_of_machine_a_resumed_run_ran_on(tmp_path):
    gpu = {"name": "NVIDIA H100 80GB HBM3", "driver_version": "580.159.04"}
    doc = {"hardware": {"gpu": {"nvidia": [gpu]}}, "git": {"sha": "0123456789", "dirty": False},
           "parts": [{"machine": "1 x NVIDIA H100 80GB HBM3"}, {"machine": "1 x NVIDIA H100 80GB HBM3"}]}
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    assert rv.ran_on_line(tmp_path) == "1 x NVIDIA H100 80GB HBM3 (driver 580.159.04); commit 0123456 (clean tree)"
    doc["parts"].append({"machine": "1 x NVIDIA H200"})  # resumed with --allow-hardware-change
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    assert rv.ran_on_line(tmp_path) == (
        "1 x NVIDIA H100 80GB HBM3 (driver 580.159.04); its parts ran on 2 kinds of machine "
        "(1 x NVIDIA H100 80GB HBM3 / 1 x NVIDIA H200); commit 0123456 (clean tree)")


def test_a_frame_without_rows_shows_why_when_told():
    """An empty table says why it is empty (its `empty` sentence) instead of a bare header; without one, the header."""
    df = pd.DataFrame(columns=["side", "lane", "vs_off"])
    assert rv.table_html(df, empty="no off lane in this run") == "<p><i>no off lane in this run</i></p>"
    assert "<thead>" in rv.table_html(df) and "<thead>" in rv.table_html(pd.DataFrame({"a": [1]}), empty="never")
