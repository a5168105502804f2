"""`specbook run` as a person sees it on the terminal: the collection's progress lines, no kernel warnings,
and none of that progress inside the report; outputs/index.html lists the run afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specbook.core.paths import project_root

pytestmark = pytest.mark.e2e

NOTEBOOK = Path(__file__).resolve().parents[1] / "fixtures" / "notebooks" / "progress_only.ipynb"


def test_progress_reaches_the_terminal_not_the_report_and_no_warning_is_printed(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "specbook", "run", "cross_engine", "-f",
                           "params/cross_engine/cpu-demo.yaml", "--notebook", str(NOTEBOOK),
                           "--outputs", str(tmp_path)], cwd=project_root(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[specbook] unit 1/2: first\n" in proc.stderr and "[specbook] unit 2/2: second" in proc.stderr
    for warning in ("Kernel is running over TCP", "MissingIDFieldWarning", "Warning"):
        assert warning not in proc.stderr, proc.stderr[-3000:]
    (run,) = (tmp_path / "cross_engine").iterdir()
    report = (run / "report.ipynb").read_text()
    assert "this line is the report" in report and "[specbook]" not in report
    assert "[specbook] unit 1/2: first" in (run / "logs" / "progress.log").read_text()
    index = (tmp_path / "index.html").read_text()
    assert f'href="cross_engine/{run.name}/report.html"' in index
    assert json.loads((run / "manifest.json").read_text())["status"] == "ok"
