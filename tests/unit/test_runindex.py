"""specbook.report.runindex: outputs/index.html lists every run with its headline and a link to its report."""

from __future__ import annotations

import json
import re
from pathlib import Path

from specbook.report import runindex
from specbook.report import view as rv


def make_run(root: Path, experiment: str, run_id: str, *, started: str, status: str = "ok", dirty: bool = False,
             headline: tuple[str, str] | None = None, report: bool = True) -> Path:
    run = root / experiment / run_id
    run.mkdir(parents=True)
    doc = {"run_id": run_id, "experiment": experiment, "started_at": started, "status": status,
           "params_name": "cpu-demo", "git": {"sha": "a" * 40, "short_sha": "abc1234", "dirty": dirty},
           "runner": {"hostname": "box", "pid": 1}}
    (run / "manifest.json").write_text(json.dumps(doc))
    if report:
        (run / "report.html").write_text("<html></html>")
    if headline:
        rv.save_summary(rv.Summary("q?", [rv.Headline(headline[0], headline[1], True, "AL 1 vs 1")]),
                        run / "summary.json")
    return run


def test_index_lists_every_run_newest_first_with_headline_and_link(tmp_path):
    make_run(tmp_path, "knob_ab", "r1", started="2026-01-01T10:00:00+00:00", headline=("fp32 vs baseline", "EQUIVALENT"))
    make_run(tmp_path, "config_flip", "r2", started="2026-01-02T10:00:00+00:00", dirty=True, status="failed")
    (tmp_path / "knob_ab" / "broken").mkdir()
    (tmp_path / "knob_ab" / "broken" / "manifest.json").write_text("{not json")
    rows = runindex.index_rows(tmp_path)
    assert [r["run"] for r in rows[:2]] == ["r2", "r1"]
    r2, r1 = rows[0], rows[1]
    assert (r2["git"], r2["status"], r2["host"], r2["started (UTC)"]) == ("abc1234 (dirty)", "failed", "box",
                                                                         "2026-01-02 10:00:00")
    assert r1["headline"] == "fp32 vs baseline: EQUIVALENT" and r1["report"] == "knob_ab/r1/report.html"
    assert rows[2]["status"].startswith("unreadable manifest")
    assert r1["ran on"] == ""  # a manifest without hardware

    page = runindex.write_index(tmp_path).read_text()
    assert page.count('<a href="knob_ab/r1/report.html">report</a>') == 1
    assert "fp32 vs baseline: EQUIVALENT" in page and "abc1234 (dirty)" in page
    assert not re.search(r"(src|href)=[\"']https?://", page)


def test_the_index_headline_is_one_short_clause(tmp_path):
    run = make_run(tmp_path, "config_flip", "r1", started="2026-01-01T10:00:00+00:00")
    heads = [rv.Headline("arm1-100.0 vs arm0-100000.0 (best)", "COLLAPSED in this run", None, "AL 1.2 vs 4.6"),
             rv.Headline("outputs across arms", "EQUAL in this run", None, "6 of 6 prompts equal")]
    rv.save_summary(rv.Summary("q?", heads), run / "summary.json")
    # a summary without its own short clause: the first headline and how many more
    assert runindex.headline_text(run) == "arm1-100.0 vs arm0-100000.0 (best): COLLAPSED in this run (+1 more)"
    rv.save_summary(rv.Summary("q?", heads, short="rope_theta 100.0 vs 100000.0: COLLAPSED in this run"),
                    run / "summary.json")
    assert runindex.headline_text(run) == "rope_theta 100.0 vs 100000.0: COLLAPSED in this run"


def test_a_docs_reports_layout_one_level_down_is_listed(tmp_path):
    run = make_run(tmp_path, "x", "knob_ab-h200", started="2026-01-01T00:00:00+00:00")
    # docs/reports/<name>/ holds the run itself
    target = tmp_path / "docs"
    target.mkdir()
    run.rename(target / "knob_ab-h200")
    rows = runindex.index_rows(target)
    assert [(r["experiment"], r["report"], r["headline"]) for r in rows] == [("x", "knob_ab-h200/report.html", "")]


def test_refresh_index_of_a_render_touches_only_an_index_that_lists_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBOOK_OUTPUTS", str(tmp_path / "outputs"))
    elsewhere = make_run(tmp_path / "elsewhere", "knob_ab", "r1", started="2026-01-01T00:00:00+00:00")
    assert runindex.refresh_index_of(elsewhere) is None and not (tmp_path / "elsewhere" / "index.html").exists()
    run = make_run(tmp_path / "outputs", "knob_ab", "r1", started="2026-01-01T00:00:00+00:00")
    assert runindex.refresh_index_of(run) == (tmp_path / "outputs" / "index.html").resolve()


def test_index_names_the_card_each_run_ran_on_not_its_hostname():
    # the lent GPU machines and this CPU machine are all called "vm": the card is what tells the runs apart
    rows = {r["run"]: r for r in runindex.index_rows(Path(__file__).parents[2] / "docs/reports")}
    gpu_run = rows["20261207T003218Z-h200-sglang-cuda-graphs-7004b51"]
    assert gpu_run["ran on"] == "1 x NVIDIA H100 80GB HBM3" and gpu_run["host"] == "vm"
    assert all(r["ran on"].endswith(("NVIDIA H100 80GB HBM3", "NVIDIA H200")) for r in rows.values())
