"""Adaptive sweeps in the knob A/B collection loop: where a sweep ends, a look of the stopping rule on a
saved run folder (the golden CPU run), and the note the report shows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specbook.core.params import load_params
from specbook.experiments.knob_ab import analysis, collection, tables
from specbook.experiments.knob_ab.params import KnobABParams
from specbook.store.runstore import RunContext

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "knob_ab"


def _golden_copy(tmp_path: Path) -> RunContext:
    run = tmp_path / "run"
    shutil.copytree(GOLDEN, run)
    return RunContext.from_run_dir(run)


def test_a_look_is_saved_and_a_repeated_look_replaces_itself(tmp_path):
    ctx = _golden_copy(tmp_path)
    params = load_params(KnobABParams, str(ctx.run_dir / "params.yaml"), ["sweeps_min=2", "sweeps_max=6"])
    stop = collection._rule_stops(params, ctx)
    looks = json.loads((ctx.data_dir / "sequential_looks.json").read_text())
    assert len(looks) == 1 and looks[0]["sweeps"] == 2 and looks[0]["sweeps_max"] == 6
    assert stop == (looks[0]["decision"] != "continue")
    assert {c["arm"] for c in looks[0]["comparisons"]} == {"fp32", "int4draft", "fp32+int4draft"}
    collection._rule_stops(params, ctx)  # a resumed run repeats the look on the same runs
    assert len(json.loads((ctx.data_dir / "sequential_looks.json").read_text())) == 1


def test_at_sweeps_max_the_rule_always_stops(tmp_path):
    ctx = _golden_copy(tmp_path)
    params = load_params(KnobABParams, str(ctx.run_dir / "params.yaml"), ["sweeps_min=2", "sweeps_max=2"])
    assert collection._rule_stops(params, ctx)


def test_the_report_notes_the_decision_the_looks_and_the_server_minutes(tmp_path):
    ctx = _golden_copy(tmp_path)
    params = load_params(KnobABParams, str(ctx.run_dir / "params.yaml"), ["sweeps_min=2", "sweeps_max=6"])
    collection._rule_stops(params, ctx)
    data = collection.load(ctx)
    note = tables.adaptive_sweeps_note(data.looks, data.runs)
    minutes = (data.runs["ready_s"].sum() + data.runs["wall_s"].sum()) / 60
    assert note.startswith("adaptive sweeps (2..6): after 2 sweeps") and f"{minutes:.1f} server-minutes" in note
    result = analysis.analyze(data, params)
    assert note in result.notes
