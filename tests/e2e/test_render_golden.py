"""`specbook render` on the golden run folders (saved by commit 5ece790): today's notebooks re-analyse them.

A permanent test that old run folders keep rendering: the CLI re-executes this project's notebook for
the experiment on the saved data (no server), writes report.ipynb and report.html, and appends a render
record to the manifest. The figures themselves are checked in tests/unit/test_golden.py; here the
report must carry the verdicts the folder's analysis gives.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specbook.core.paths import project_root

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

# What each rendered report must say (verdicts and headline words the golden analysis gives).
MUST_SAY = {
    "knob_ab": ["fp32+int4draft vs baseline: SHOWN DIFFERENT: -29.89%", "fp32 vs baseline: UNDECIDED",
                "meets the stated rule", "Decision rule", "A = fp32, B = int4draft"],
    "knob_ab_ingest": ["int4draft vs baseline: SHOWN DIFFERENT", "This section cannot judge accuracy."],
    "config_flip": ["arm1-100.0 vs arm0-100000.0 (best)", "COLLAPSED in this run",
                    "3 of 3 prompts equal under greedy decoding"],
    "cross_engine": ["NOT COMPARABLE", "yes-loop", "Decode rate on equal work", "NO CELL TIMED", "Contents: "],
}


# The ingest folder's notebook is knob_ab's (the fast tier renders that one); its render runs in the full tier.
FULL_TIER_ONLY = {"knob_ab_ingest"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in FULL_TIER_ONLY else n
                                  for n in sorted(MUST_SAY)])
def test_specbook_render_rebuilds_a_golden_report(name, tmp_path):
    src = GOLDEN / name
    if not (src / "manifest.json").is_file():
        pytest.fail(f"golden folder {src} is missing (tests/golden/README.md says how it was made)")
    run_dir = tmp_path / name
    shutil.copytree(src, run_dir)
    before = json.loads((run_dir / "manifest.json").read_text())
    proc = subprocess.run([sys.executable, "-m", "specbook", "render", str(run_dir)], cwd=project_root(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"render failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    html = (run_dir / "report.html").read_text()
    for text in MUST_SAY[name]:
        assert text in html, f"{name}: the report does not say {text!r}"
    assert "Traceback" not in html and "Error" not in html.split("Where this ran")[0][-2000:]
    after = json.loads((run_dir / "manifest.json").read_text())
    assert len(after["renders"]) == len(before["renders"]) + 1
    render = after["renders"][-1]
    assert render["status"] == "ok"
    assert Path(render["notebook"]) == project_root() / "notebooks" / f"{before['experiment']}.ipynb"
    assert after["status"] == before["status"] == "ok"  # a render never rewrites the collection's status
