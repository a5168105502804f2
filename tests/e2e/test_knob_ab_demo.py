"""The knob A/B demo end to end on vLLM-CPU, in the fast tier's shared run (tests/e2e/shared_run.py: baseline vs
the int4 draft, 2 sweeps, killed after its first run and resumed). The full demo is `make demo`. What must hold
whatever the numbers: a complete run folder, every run attributed to its declared arm, and the positive control
(int4 draft vs fp8 draft) lowering AL in every sweep.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

import pytest

from specbook.experiments import knob_ab
from specbook.report import view as report_view
from specbook.store.runstore import RunContext

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def demo_run(shared_knob_ab) -> Path:
    return shared_knob_ab.run_dir


def test_run_folder_is_complete(demo_run):
    for rel in ("report.ipynb", "report.html", "manifest.json", "params.yaml", "servers.jsonl", "summary.json",
                "data/runs.parquet", "data/intervals.parquet", "data/requests.parquet", "data/workload.json"):
        assert (demo_run / rel).is_file(), rel
    manifest = json.loads((demo_run / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    # the kill cut the second run short: its server record is set aside with it, the 4 kept or rerun remain
    assert len(manifest["servers"]) == 4 and {s["status"] for s in manifest["servers"]} == {"ok"}
    html = (demo_run / "report.html").read_text()
    summary = json.loads((demo_run / "summary.json").read_text())
    (headline,) = summary["headlines"]
    assert headline["comparison"] == "int4draft vs baseline"
    assert headline["verdict"] in html and headline["interval"] in html  # the summary block opens the report
    assert "Decision rule" in html
    # the criteria lists: each criterion of each verdict, with the mark its own result gives
    params = knob_ab.load_params_file(str(demo_run / "params.yaml"))
    result = knob_ab.analyze(knob_ab.load(RunContext.from_run_dir(demo_run)), params)
    for verdict in result.decision.verdicts:
        for c in verdict.criteria:
            mark = report_view.PASS_MARK if c.passed else report_view.NA_MARK if c.passed is None else report_view.FAIL_MARK
            assert f"{mark}</span> <b>{escape(c.name)}</b>" in html, (verdict.arm, c.name, c.status)
    assert "knob_ab.collect(" not in html  # inputs hidden


def test_every_run_is_attributed_to_its_declared_arm(demo_run):
    params = knob_ab.load_params_file(str(demo_run / "params.yaml"))
    data = knob_ab.load(RunContext.from_run_dir(demo_run))
    assert (data.runs["status"] == "ok").all() and len(data.runs) == 4
    attr = knob_ab.attribute_runs(data.runs, params)
    assert attr["matches_declared"].all(), attr[["run_id", "reason"]].to_string()
    # each log starts with the Env: line the arm was attributed from
    for rel in data.runs["log_path"]:
        assert (demo_run / rel).read_text().splitlines()[0].startswith("Env:")


def test_positive_control_lowers_al_in_every_sweep(demo_run):
    params = knob_ab.load_params_file(str(demo_run / "params.yaml"))
    result = knob_ab.analyze(knob_ab.load(RunContext.from_run_dir(demo_run)), params)
    al = result.decision.run_al.pivot_table(index="sweep", columns="arm", values="counter_al")
    assert len(al) == 2 and (al["int4draft"] < al["baseline"]).all(), al
    assert (al["baseline"] > 2.0).all(), al  # the fp8 draft really accepts
    assert (result.decision.run_al["intervals_kept"] > 0).all()


def test_ingest_example_analyses_real_logs_without_a_server(tmp_path, run_book):
    run_dir = run_book("knob_ab", "params/knob_ab/ingest-example.yaml", [], tmp_path, timeout=600)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["servers"] == []
    assert "int4draft vs baseline: SHOWN DIFFERENT" in (run_dir / "report.html").read_text()
