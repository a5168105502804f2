"""The cross-engine demo end to end, reduced: `specbook run cross_engine` with llama.cpp vs vLLM-CPU.

Reduced via -p: the loop prompt and one ordinary prompt, speculation off and the int4 draft, one warm
repeat. Run under the shared engine lock: `flock /tmp/specbook-engine.lock .venv/bin/pytest -m e2e`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specbook.experiments import cross_engine as ce
from specbook.params import load_params
from specbook.runstore import RunContext

pytestmark = pytest.mark.e2e

DEMO = "params/cross_engine/cpu-demo.yaml"
LANES = '[{name: "off"}, {name: draft-int4, speculative_config: {method: draft_model, model: smollm2-135m-instruct-int4g32, num_speculative_tokens: 4}}]'


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, run_book) -> Path:
    outputs = tmp_path_factory.mktemp("outputs")
    return run_book("cross_engine", DEMO, ["num_prompts=2", "warm_repeats=1", "max_tokens=64", f"lanes={LANES}"],
                    outputs, timeout=1200)


def test_run_folder_holds_report_data_and_both_engines_logs(demo_run):
    for rel in ("report.ipynb", "report.html", "manifest.json", "params.yaml", "servers.jsonl",
                "data/requests.parquet", "data/cell_counters.parquet", "data/pins.json", "data/weights.json",
                "logs/vllm-off.log", "logs/llamacpp-off.log", "logs/vllm-draft-int4.log", "logs/llamacpp-draft-int4.log"):
        assert (demo_run / rel).is_file(), rel


def test_loop_cell_is_flagged_and_left_out(demo_run):
    params = load_params(ce.CrossEngineParams, demo_run / "params.yaml")
    data = ce.load(RunContext.from_run_dir(demo_run))
    cells = ce.cell_table(data, params.guards, n_boot=200)
    loop = cells[cells["prompt"] == "yes-loop"]
    assert len(loop) == 2 and not loop["comparable"].any()
    assert loop["flags"].str.contains("degenerate").all()
    head = ce.headline(cells, n_boot=200)
    assert head["left_out"].str.contains("yes-loop").all()
    assert (data.requests["completion_tokens"] > 0).all()
    html = (demo_run / "report.html").read_text()
    assert "NOT COMPARABLE" in html and "yes-loop" in html


def test_both_engines_report_acceptance_under_one_definition(demo_run):
    data = ce.load(RunContext.from_run_dir(demo_run))
    acc = ce.acceptance_table(data)
    assert set(acc["engine"]) == {"vllm", "llamacpp"}
    assert ((acc["al"] > 1.0) & (acc["al"] <= 5.0)).all()
    pp = ce.per_position(data)
    assert set(pp["side"]) == {"ours", "oracle"} and (pp["rate"].between(0, 1)).all()
    assert all(p["identical"] for p in data.weights.values())
