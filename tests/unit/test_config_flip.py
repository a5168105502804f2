"""config_flip experiment: params schema and refusals, arm building, launch equality, analysis."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specbook.engines import EngineConfig, get_engine
from specbook.errors import ExperimentError, ParamsError
from specbook.experiments import config_flip as cf
from specbook.experiments.registry import get_experiment
from specbook.params import load_params
from specbook.paths import params_dir


@pytest.fixture()
def draft_dir(tmp_path: Path) -> Path:
    src = tmp_path / "draft"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"rope_theta": 100000, "tie_word_embeddings": True}))
    (src / "tokenizer.json").write_text("{}")
    (src / "model.safetensors").write_bytes(os.urandom(1024))
    return src


def _params(folder: Path | str, **over) -> dict:
    data = {
        "flip": {"folder": str(folder), "field": "rope_theta", "values": [100000, 10000]},
        "engine": {
            "model": "/models/target",
            "speculative_config": {"method": "draft_model", "model": "@flip", "num_speculative_tokens": 4},
        },
        "prompts": ["a", "b", "c"],
    }
    data.update(over)
    return data


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --- params ---------------------------------------------------------------------------------------


def test_registered_under_its_name():
    spec = get_experiment("config_flip")
    assert spec.params_model is cf.ConfigFlipParams and spec.notebook == "config_flip.ipynb"


def test_demo_params_validate_and_flip_the_draft():
    params = load_params(cf.ConfigFlipParams, params_dir() / "config_flip" / "cpu-demo.yaml")
    assert cf.flip_role(params.engine) == "draft"
    assert params.flip.field == "rope_parameters.rope_theta" and params.flip.values == [100000.0, 100.0]


def test_num_prompts_override_cuts_the_prompt_list(tmp_path, draft_dir):
    params = load_params(cf.ConfigFlipParams, _write(tmp_path, _params(draft_dir)), ["num_prompts=2"])
    assert params.selected_prompts() == ["a", "b"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        # a per-arm engine/env override has no place in the schema
        (lambda d: d.update(arms=[{"env": {"X": "1"}}]), r"arms: Extra inputs are not permitted"),
        (lambda d: d["flip"].update(env={"X": "1"}), r"flip.env: Extra inputs are not permitted"),
        (lambda d: d["flip"].update(values=[1, 1]), r"flip.values: .*distinct"),
        (lambda d: d["flip"].update(values=[1]), r"flip.values: .*at least 2"),
        (lambda d: d["flip"].update(field="a..b"), r"flip.field: .*dotted path"),
        (lambda d: d["flip"].update(link="copy"), r"flip.link"),
        (lambda d: d["engine"]["speculative_config"].update(model="/models/draft"), r"exactly one of"),
        (lambda d: d["engine"].update(model="@flip"), r"found it in 2"),
        (lambda d: d["engine"].update(extra_args=["--tokenizer", "@flip"]), r"only stand for the model folder"),
    ],
)
def test_bad_params_are_refused_naming_file_and_field(tmp_path, draft_dir, mutate, message):
    data = _params(draft_dir)
    mutate(data)
    with pytest.raises(ParamsError, match=r"p\.yaml: .*" + message):
        load_params(cf.ConfigFlipParams, _write(tmp_path, data))


# --- arms -----------------------------------------------------------------------------------------


def test_arm_engine_config_puts_the_folder_where_the_placeholder_was(tmp_path):
    draft_flip = EngineConfig(model="/t", speculative_config={"method": "draft_model", "model": "@flip"})
    cfg = cf.arm_engine_config(draft_flip, tmp_path / "arm0", served_model_name="x")
    assert cfg.speculative_config["model"] == str(tmp_path / "arm0") and cfg.model == "/t"
    target_flip = EngineConfig(model="@flip", speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    cfg = cf.arm_engine_config(target_flip, tmp_path / "arm1", served_model_name="flip-target")
    assert cfg.model == str(tmp_path / "arm1") and cfg.served_model_name == "flip-target"


def test_build_arms_proves_the_one_field_difference(tmp_path, draft_dir):
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir))
    folders, summary = cf.build_arms(params, tmp_path / "run" / "flip")
    assert [f.path.name for f in folders] == ["arm0-100000", "arm1-10000"]
    assert summary["original_value"] == 100000 and summary["role"] == "draft"
    assert summary["diffs_vs_first_arm"] == {"arm1-10000": ["config.json:rope_theta: 100000 != 10000"]}
    for f in folders:
        assert (f.path / "model.safetensors").stat().st_ino == (draft_dir / "model.safetensors").stat().st_ino


def test_build_arms_refuses_a_missing_field_unless_asked(tmp_path, draft_dir):
    data = _params(draft_dir)
    data["flip"].update(field="sample_from_anchor", values=[True, False])
    with pytest.raises(ExperimentError, match="'sample_from_anchor' is missing"):
        cf.build_arms(cf.ConfigFlipParams.model_validate(data), tmp_path / "flip")
    data["flip"]["add_missing"] = True
    folders, summary = cf.build_arms(cf.ConfigFlipParams.model_validate(data), tmp_path / "flip2")
    assert summary["field_was_added"] and len(folders) == 2


def test_unknown_folder_is_refused_by_name(tmp_path):
    with pytest.raises(ExperimentError, match="flip.folder 'no-such-model'"):
        cf.resolve_folder("no-such-model")


def test_real_vllm_launch_specs_of_two_arms_differ_only_in_the_folder(tmp_path, draft_dir):
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir))
    folders, _ = cf.build_arms(params, tmp_path / "flip")
    engine = get_engine("vllm")
    views = []
    for f in folders:
        cfg = cf.arm_engine_config(params.engine, f.path, served_model_name="flip-target")
        views.append(cf._launch_view(engine.build_spec(cfg, name="arm", log_path=Path("a.log"), port=1), f.path))
    cf.assert_launches_differ_only_in_folder(views, ["a", "b"])
    assert any(cf.FLIP_PLACEHOLDER in a for a in views[0]["argv"])
    assert all(str(folders[0].path) not in a for a in views[0]["argv"])


def test_launches_that_differ_besides_the_folder_are_refused():
    base = {"argv": ["serve", "@flip"], "env": {"A": "1"}, "unset_env": [], "cwd": None}
    other = {**base, "env": {"A": "2"}}
    with pytest.raises(ExperimentError, match="arm b would launch differently from arm a in env"):
        cf.assert_launches_differ_only_in_folder([base, other], ["a", "b"])


# --- analysis -------------------------------------------------------------------------------------


def _data() -> cf.FlipData:
    arms = pd.DataFrame([
        {"arm": "arm0-100000", "index": 0, "value": "100000", "is_original": True, "elapsed_s": 10.0,
         "drafts": 100, "draft_tokens": 400, "accepted_tokens": 300,
         "accepted_pos_0": 90, "accepted_pos_1": 80, "accepted_pos_2": 70, "accepted_pos_3": 60},
        {"arm": "arm1-10000", "index": 1, "value": "10000", "is_original": False, "elapsed_s": 20.0,
         "drafts": 380, "draft_tokens": 1520, "accepted_tokens": 19,
         "accepted_pos_0": 15, "accepted_pos_1": 3, "accepted_pos_2": 1, "accepted_pos_3": 0},
    ])
    req = []
    for arm, wall in (("arm0-100000", 2.0), ("arm1-10000", 4.0)):
        for pid, text in (("p000", "same"), ("p001", "x" if arm == "arm0-100000" else "y")):
            req.append({"arm": arm, "prompt_id": pid, "output_text": text, "completion_tokens": 201,
                        "ttft_s": 0.1, "wall_s": wall + 0.1, "error": None})
    return cf.FlipData(flip={"diffs_vs_first_arm": {"arm1-10000": ["config.json:rope_theta: 100000 != 10000"]}},
                       arms=arms, requests=pd.DataFrame(req), intervals=pd.DataFrame())


def test_arm_summary_derives_al_tok_s_and_per_step_time_from_counts():
    s = cf.arm_summary(_data()).set_index("arm")
    assert s.loc["arm0-100000", "acceptance_length"] == pytest.approx(4.0)
    assert s.loc["arm1-10000", "acceptance_length"] == pytest.approx(1.05)
    assert s.loc["arm0-100000", "output_tok_s"] == pytest.approx(402 / 10.0)
    # 2 requests x 200 decode tokens / AL 4 = 100 steps over 4 s of decode
    assert s.loc["arm0-100000", "decode_steps"] == pytest.approx(100.0)
    assert s.loc["arm0-100000", "per_step_ms"] == pytest.approx(40.0)
    assert s.loc["arm1-10000", "per_step_ms"] == pytest.approx(8000.0 / (400 / 1.05))
    assert s.loc["arm0-100000", "draft_acceptance_rate"] == pytest.approx(0.75)


def test_per_position_acceptance_is_accepted_over_drafts():
    pp = cf.per_position_acceptance(_data())
    first = pp[pp["arm"] == "arm0-100000"].set_index("position")["acceptance_rate"]
    assert list(first) == pytest.approx([0.9, 0.8, 0.7, 0.6])


def test_output_equality_per_prompt_with_first_difference():
    eq = cf.output_equality(_data()).set_index("prompt_id")
    assert bool(eq.loc["p000", "all_equal"]) and not bool(eq.loc["p001", "all_equal"])
    assert eq.loc["p001", "first_difference_arm1-10000"] == 0


def test_verdict_names_the_collapsed_arm():
    data = _data()
    verdict = cf.flip_verdict(cf.arm_summary(data), cf.output_equality(data), collapse_fraction=0.25)
    assert verdict.collapsed == ["arm1-10000"] and verdict.best_arm == "arm0-100000"
    assert not verdict.outputs_equal
    assert "collapsed in arm1-10000" in verdict.sentence()


def test_verdict_without_collapse_and_without_drafts():
    data = _data()
    data.arms.loc[1, "accepted_tokens"] = 300
    verdict = cf.flip_verdict(cf.arm_summary(data), cf.output_equality(data), collapse_fraction=0.25)
    assert verdict.collapsed == []
    data.arms["drafts"] = 0
    with pytest.raises(ExperimentError, match="no arm has drafts"):
        cf.flip_verdict(cf.arm_summary(data), cf.output_equality(data), collapse_fraction=0.25)


def test_diff_table_lists_the_proven_difference():
    table = cf.diff_table(_data())
    assert table.to_dict("records") == [{"arm": "arm1-10000", "difference": "config.json:rope_theta: 100000 != 10000"}]


def test_describe_flip_names_field_values_and_sharing(tmp_path, draft_dir):
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir))
    _, summary = cf.build_arms(params, tmp_path / "flip")
    data = cf.FlipData(flip=summary, arms=pd.DataFrame(), requests=pd.DataFrame(), intervals=pd.DataFrame())
    text = cf.describe_flip(data)
    assert "config.json:rope_theta  (original value 100000)" in text
    assert "arm1-10000: rope_theta = 10000; 1 weight file(s) symlinked" in text
    assert "serves as the draft" in text
