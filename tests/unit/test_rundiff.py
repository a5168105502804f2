"""specbook.report.rundiff: two runs of one experiment side by side."""

from __future__ import annotations

import json

import pytest
from tests.unit.test_runindex import make_run

from specbook.core.errors import RunError
from specbook.report import rundiff
from specbook.report import view as rv


def test_flatten_and_changed_name_each_differing_leaf():
    a = {"sweeps": 2, "engine": {"env": {"X": "1"}, "args": ["--a"]}, "knobs": [{"name": "fp32"}]}
    b = {"sweeps": 3, "engine": {"env": {}, "args": ["--a"]}, "knobs": [{"name": "fp32"}], "new": None}
    assert rundiff.changed(a, b) == [("engine.env", rundiff.MISSING, {}), ("engine.env.X", "1", rundiff.MISSING),
                                     ("new", rundiff.MISSING, None), ("sweeps", 2, 3)]


def _with(run, **fields):
    doc = json.loads((run / "manifest.json").read_text())
    doc.update(fields)
    (run / "manifest.json").write_text(json.dumps(doc))


def test_diff_shows_params_environment_and_headlines_side_by_side(tmp_path):
    a = make_run(tmp_path, "knob_ab", "a", started="2026-01-01T00:00:00+00:00")
    b = make_run(tmp_path, "knob_ab", "b", started="2026-01-02T00:00:00+00:00")
    _with(a, params={"sweeps": 2, "workload": {"subset": 24}}, libraries={"torch": "2.13.0", "pandas": "2.2"})
    _with(b, params={"sweeps": 3, "workload": {"subset": 24}}, libraries={"torch": "2.14.0", "pandas": "2.2"})
    rv.save_summary(rv.Summary("q", [rv.Headline("fp32 vs baseline", "SHOWN EQUIVALENT", True, "AL 4.6 vs 4.6 (+0.1%)",
                                                 "95% CI [-0.8%, +0.9%] vs margin \u00b11%", "expected equivalent: yes",
                                                 "meets the stated rule: yes")]), a / "summary.json")
    rv.save_summary(rv.Summary("q", [rv.Headline("fp32 vs baseline", "UNDECIDED (no interval)", False,
                                                 "AL 4.5 vs 4.6 (-2.0%)")]), b / "summary.json")
    d = rundiff.diff_runs(a, b)
    assert d.params == [("sweeps", 2, 3)]
    assert d.environment == [("libraries.torch", "2.13.0", "2.14.0")]
    assert d.headlines == [("fp32 vs baseline", "SHOWN EQUIVALENT | AL 4.6 vs 4.6 (+0.1%) | 95% CI [-0.8%, +0.9%] "
                            "vs margin \u00b11% | expected equivalent: yes | meets the stated rule: yes",
                            "UNDECIDED (no interval) | AL 4.5 vs 4.6 (-2.0%)")]
    assert d.notes == []
    text = rundiff.diff_text(d)
    assert "  sweeps\n    A: 2\n    B: 3" in text and "libraries.torch" in text
    page = rundiff.diff_html(d)
    assert "UNDECIDED (no interval) | AL 4.5 vs 4.6 (-2.0%)" in page and "https://" not in page


def test_diff_refuses_two_experiments_and_names_a_missing_manifest(tmp_path):
    a = make_run(tmp_path, "knob_ab", "a", started="2026-01-01T00:00:00+00:00")
    b = make_run(tmp_path, "config_flip", "b", started="2026-01-01T00:00:00+00:00")
    with pytest.raises(RunError, match="'knob_ab' run and b a 'config_flip' run"):
        rundiff.diff_runs(a, b)
    with pytest.raises(RunError, match="nowhere/manifest.json: cannot read"):
        rundiff.diff_runs(a, tmp_path / "nowhere")


def test_a_run_without_summary_is_noted(tmp_path):
    a = make_run(tmp_path, "knob_ab", "a", started="2026-01-01T00:00:00+00:00")
    b = make_run(tmp_path, "knob_ab", "b", started="2026-01-01T00:00:00+00:00")
    d = rundiff.diff_runs(a, b)
    assert d.headlines == [] and len(d.notes) == 2 and "specbook render" in d.notes[0]


def test_specbook_index_and_diff_commands(tmp_path, capsys):
    from specbook.cli import EXIT_BAD_INPUT, EXIT_OK, main

    a = make_run(tmp_path, "knob_ab", "a", started="2026-01-01T00:00:00+00:00")
    b = make_run(tmp_path, "knob_ab", "b", started="2026-01-02T00:00:00+00:00")
    _with(b, params={"sweeps": 3})
    assert main(["index", "--root", str(tmp_path)]) == EXIT_OK
    assert "2 run(s) listed in" in capsys.readouterr().out and (tmp_path / "index.html").is_file()
    assert main(["diff", str(a), str(b), "--html", str(tmp_path / "d.html")]) == EXIT_OK
    out = capsys.readouterr().out
    assert "Params that differ\n  sweeps\n    A: (absent)\n    B: 3" in out
    assert "sweeps" in (tmp_path / "d.html").read_text()
    assert main(["index", "--root", str(tmp_path / "nowhere")]) == EXIT_BAD_INPUT
