"""Paths taken from params: the config-flip file stays inside its model folder, arm folders stay inside the run
folder, and read-only inputs (GSM8K files, ingested logs) that cannot be read are named by their field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from specbook.core.errors import ExperimentError, ParamsError
from specbook.core.params import load_params, validate_params
from specbook.experiments import config_flip as cf
from specbook.experiments.config_flip import flip
from specbook.store.runstore import RunContext

CONFIG = {"rope_theta": 100000, "tie_word_embeddings": True}


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    src = tmp_path / "model"
    (src / "subdir").mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(CONFIG))
    (src / "subdir" / "config.json").write_text(json.dumps({"rope_theta": 5}))
    (src / "model.safetensors").write_bytes(os.urandom(256))
    return src


def _params(folder: Path, file: str) -> dict:
    return {
        "flip": {"folder": str(folder), "file": file, "field": "rope_theta", "values": [1, 2]},
        "engine": {"model": "/models/target",
                   "speculative_config": {"method": "draft_model", "model": "@flip", "num_speculative_tokens": 4}},
        "prompts": ["a"],
    }


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- params validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(("file", "why"), [
    ("/etc/passwd", "absolute path"),
    ("MODEL/config.json", "absolute path"),  # replaced by the model folder's own absolute config.json below
    ("../config.json", r"leaves the model folder \('\.\.'\)"),
    ("subdir/../../x.json", r"leaves the model folder"),
    ("subdir\\..\\..\\x.json", r"leaves the model folder"),
    ("~/config.json", "starts with '~'"),
    ("C:\\models\\config.json", "absolute path"),
    ("", "is empty"),
    ("   ", "is empty"),
    (".", "names no file"),
    ("conf\0ig.json", "NUL byte"),
])
def test_params_refuse_a_flip_file_outside_the_folder_naming_field_and_value(tmp_path, model_dir, file, why):
    if file.startswith("MODEL/"):
        file = str(model_dir / "config.json")  # the source model's own config: would be overwritten
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_params(model_dir, file)))
    with pytest.raises(ParamsError) as info:
        load_params(cf.ConfigFlipParams, path)
    msg = str(info.value)
    assert "p.yaml: flip.file:" in msg and f"flip.file {file!r}" in msg
    assert re.search(why, msg), msg


@pytest.mark.parametrize("file", ["config.json", "subdir/config.json", "./config.json", "a/b/c.json"])
def test_params_accept_relative_paths_inside_the_folder(model_dir, file):
    p = validate_params(cf.ConfigFlipParams, _params(model_dir, file))
    assert p.flip.file == file


def test_an_override_is_checked_the_same_way(tmp_path, model_dir):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_params(model_dir, "config.json")))
    with pytest.raises(ParamsError, match=r"flip\.file '\.\./x\.json'"):
        load_params(cf.ConfigFlipParams, path, ["flip.file=../x.json"])


# --- where the file is written (defence in depth) -----------------------------------------------


@pytest.mark.parametrize("file", ["ABS", "../model/config.json", "subdir/../../model/config.json", "~/x.json", ""])
def test_build_refuses_paths_leaving_the_folder_and_touches_nothing(tmp_path, model_dir, file):
    file = str(model_dir / "config.json") if file == "ABS" else file
    before = _snapshot(model_dir)
    with pytest.raises(ExperimentError, match=r"flip\.file"):
        flip.build_flipped_folder(model_dir, tmp_path / "arm0", file=file, field="rope_theta", value=7)
    assert _snapshot(model_dir) == before  # the source model is never written
    assert not (tmp_path / "arm0").exists()


def test_build_refuses_a_flip_file_that_is_a_link_to_outside(tmp_path, model_dir):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"rope_theta": 1, "secret": "do not copy"}))
    (model_dir / "linked.json").symlink_to(outside)
    with pytest.raises(ExperimentError) as info:
        flip.build_flipped_folder(model_dir, tmp_path / "arm0", file="linked.json", field="rope_theta", value=7)
    assert "flip.file 'linked.json' resolves to" in str(info.value) and "outside the model folder" in str(info.value)
    assert json.loads(outside.read_text())["rope_theta"] == 1 and not (tmp_path / "arm0").exists()


def test_build_refuses_a_flip_file_below_a_linked_folder_leading_outside(tmp_path, model_dir):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text(json.dumps(CONFIG))
    (model_dir / "linked_dir").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ExperimentError, match=r"flip\.file 'linked_dir/config\.json' resolves to .*outside"):
        flip.build_flipped_folder(model_dir, tmp_path / "arm0", file="linked_dir/config.json", field="rope_theta",
                                  value=7)
    assert json.loads((elsewhere / "config.json").read_text()) == CONFIG


def test_build_accepts_a_nested_file_and_a_link_that_stays_inside(tmp_path, model_dir):
    arm = flip.build_flipped_folder(model_dir, tmp_path / "arm0", file="subdir/config.json", field="rope_theta",
                                    value=7)
    assert json.loads((arm.path / "subdir" / "config.json").read_text())["rope_theta"] == 7
    assert json.loads((arm.path / "config.json").read_text()) == CONFIG  # only the named file changed
    assert json.loads((model_dir / "subdir" / "config.json").read_text())["rope_theta"] == 5
    (model_dir / "alias.json").symlink_to(model_dir / "config.json")
    arm = flip.build_flipped_folder(model_dir, tmp_path / "arm1", file="alias.json", field="rope_theta", value=9)
    assert not (arm.path / "alias.json").is_symlink() and json.loads((arm.path / "alias.json").read_text())["rope_theta"] == 9
    assert json.loads((model_dir / "config.json").read_text()) == CONFIG  # the link's target is untouched


def test_resolve_inside_names_the_field_it_checks(tmp_path):
    with pytest.raises(ExperimentError, match=r"^other\.path '\.\./x'"):
        flip.resolve_inside(tmp_path, "../x", field="other.path")
    assert flip.resolve_inside(tmp_path, "a/b.json") == (tmp_path / "a" / "b.json").resolve()


# --- arm folders are named from values and stay inside the run folder ---------------------------


@pytest.mark.parametrize("value", [
    "../../etc", "..", ".", "/abs/path", "a/b", "a\\b", "x\0y", "~", "", " ", "é", "-rf", "'\"", "a" * 200,
    None, True, 1.5, -3, {"a": "../b"}, ["..", "/"], 10000,
])
def test_arm_folders_built_from_values_cannot_leave_the_flip_folder(tmp_path, value):
    root = tmp_path / "run" / cf.FLIP_DIRNAME
    label = cf.arm_label(0, value)
    target = root / label
    assert "/" not in label and "\\" not in label and "\0" not in label and label not in (".", "..")
    assert target.parent == root and target.resolve().parent == root.resolve()
    assert label.isascii() and len(label) <= 60


# --- read-only inputs: a missing or unreadable file is named by its field -----------------------


KNOB_PARAMS = {
    "engine": {"engine": "vllm", "model": "org/target"},
    "knobs": [{"name": "k", "env": {"X_KNOB": "1"}}],
    "sweeps": 1,
}


@pytest.mark.parametrize(("field", "make"), [
    ("workload.test_path", lambda d: {"test_path": str(d / "missing.jsonl")}),
    ("workload.test_path", lambda d: {"test_path": str(d)}),  # a folder: cannot be read as a file
    ("workload.train_path", lambda d: {"test_path": str(d / "t.jsonl"), "train_path": str(d / "missing.jsonl")}),
])
def test_knob_ab_workload_files_that_cannot_be_read_are_named_by_field(tmp_path, field, make):
    from specbook.experiments import knob_ab

    (tmp_path / "t.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    p = validate_params(knob_ab.KnobABParams, {**KNOB_PARAMS, "workload": {"subset": 1, "shots": 1, **make(tmp_path)}})
    with pytest.raises(ParamsError, match=rf"^{field}: '.*' cannot be read \(looked at "):
        knob_ab.collect(p, RunContext(tmp_path / "run"))
    assert not (tmp_path / "run" / "servers.jsonl").exists()  # refused before any server


def test_knob_ab_ingest_logs_missing_or_unreadable_are_named_by_field(tmp_path):
    from specbook.experiments import knob_ab

    def ingest(pattern: str):
        p = validate_params(knob_ab.KnobABParams, {**KNOB_PARAMS, "mode": "ingest", "ingest": {"logs": [pattern]}})
        return knob_ab.collect(p, RunContext(tmp_path / "run"))

    with pytest.raises(ParamsError, match=r"^ingest\.logs: '.*nothing-\*\.log' matches no file"):
        ingest(str(tmp_path / "nothing-*.log"))
    (tmp_path / "a-folder.log").mkdir()
    with pytest.raises(ParamsError, match=r"^ingest\.logs: '.*a-folder\.log' cannot be read"):
        ingest(str(tmp_path / "*.log"))


# --- every path checked before a run folder exists (check and run alike) ---------------------------


def test_check_and_run_refuse_a_missing_workload_file_before_any_folder(tmp_path):
    """`specbook check` said "valid" and `run` failed 6 s in, after making its folder (issue 26)."""
    from specbook import cli
    from specbook.run.runner import run_experiment

    params = tmp_path / "knob_ab" / "missing-workload.yaml"
    params.parent.mkdir()
    params.write_text(yaml.safe_dump({**KNOB_PARAMS, "workload": {"subset": 1, "shots": 0,
                                                                  "test_path": str(tmp_path / "gone.jsonl")}}))
    assert cli.main(["check", str(params)]) == cli.EXIT_BAD_INPUT
    with pytest.raises(ParamsError, match=r"^workload\.test_path: '.*gone\.jsonl' cannot be read"):
        run_experiment("knob_ab", params, outputs_root=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def _hub_snapshot(cache: Path) -> Path:
    """A Hugging Face hub cache entry as `huggingface_hub` lays it out: snapshot files link to ../../blobs/SHA."""
    repo = cache / "models--org--target"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for name, data in (("config.json", json.dumps(CONFIG).encode()), ("model.safetensors", os.urandom(256))):
        blob = blobs / f"sha-{name}"
        blob.write_bytes(data)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snap


def test_a_hub_snapshot_is_flipped_through_its_own_blobs_and_checked_before_the_folder(tmp_path):
    snap = _hub_snapshot(tmp_path / "hub")
    p = validate_params(cf.ConfigFlipParams, _params(snap, "config.json"))
    p.check_inputs()  # its config links into its own cache's blobs: accepted
    built = flip.build_flipped_folder(snap, tmp_path / "arm", file="config.json", field="rope_theta", value=7)
    assert json.loads((built.path / "config.json").read_text())["rope_theta"] == 7
    assert json.loads((snap / "config.json").read_text())["rope_theta"] == CONFIG["rope_theta"]  # source untouched

    # a snapshot file linking anywhere else is still refused, by `check_inputs` (before the run folder)
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps(CONFIG))
    with pytest.raises(ExperimentError, match=r"flip\.file 'config\.json' resolves to .*elsewhere\.json, outside"):
        p.check_inputs()
    p_missing = validate_params(cf.ConfigFlipParams, _params(tmp_path / "no-such-model", "config.json"))
    with pytest.raises(ExperimentError, match=r"flip\.folder '.*no-such-model' is neither a model folder"):
        p_missing.check_inputs()


# --- extra arguments that set what specbook sets -----------------------------------------------------


@pytest.mark.parametrize(("engine", "args", "option"), [
    ("vllm", ["--port", "8000"], "--port"),
    ("vllm", ["--max-num-batched-tokens", "256", "--host=0.0.0.0"], "--host"),
    ("vllm", ["--served-model-name", "x"], "--served-model-name"),
    ("vllm", ["--disable-log-stats"], "--disable-log-stats"),
    ("llamacpp", ["-t", "2", "--port", "8081"], "--port"),
    ("llamacpp", ["-a", "other"], "-a"),
])
def test_extra_args_that_fight_specbooks_own_are_refused_naming_the_field(engine, args, option):
    """`--port 8000` made vLLM listen where specbook never looked: "not ready" after 90 s (issue 26)."""
    data = {**KNOB_PARAMS, "engine": {"engine": engine, "model": "org/target", "extra_args": args}}
    with pytest.raises(ParamsError) as err:
        validate_params(__import__("specbook.experiments.knob_ab", fromlist=["x"]).KnobABParams, data, "p.yaml")
    message = str(err.value)
    assert message.startswith("p.yaml: engine.extra_args: ") and f"sets {option}, which specbook sets" in message
    ok = {**KNOB_PARAMS, "engine": {"engine": engine, "model": "org/target", "extra_args": ["-t", "2"]}}
    validate_params(__import__("specbook.experiments.knob_ab", fromlist=["x"]).KnobABParams, ok, "p.yaml")
