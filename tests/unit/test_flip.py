"""specbook.experiments.config_flip.flip: linked-weight folder copies, dotted-path edits, the one-field diff, refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specbook.core.errors import ExperimentError
from specbook.experiments.config_flip import flip

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "rope_theta": 100000,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "layer_types": ["full", "full", "full"],
    "quantization": {"bits": 8, "group": 32},
}


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CONFIG))
    (src / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    (src / "tokenizer.json").write_text('{"vocab": {"a": 0}}')
    (src / "chat_template.jinja").write_text("{{ messages }}")
    (src / "model.safetensors").write_bytes(os.urandom(4096))
    (src / "sub").mkdir()
    (src / "sub" / "extra.bin").write_bytes(os.urandom(512))
    return src


def _build(src: Path, dest: Path, value, field="rope_theta", **kw) -> flip.FlippedFolder:
    return flip.build_flipped_folder(src, dest, file="config.json", field=field, value=value, **kw)


# --- dotted paths -------------------------------------------------------------------------------


def test_check_dotted_path_accepts_fields_and_list_indexes():
    flip.check_dotted_path("layer_types.2")
    flip.check_dotted_path("rope_scaling.factor")
    assert flip.get_field(CONFIG, "layer_types.2") == "full"  # a digit segment indexes a list


@pytest.mark.parametrize("bad", ["", "a..b", ".a", "a."])
def test_check_dotted_path_refuses_empty_segments(bad):
    with pytest.raises(ExperimentError, match="dotted path"):
        flip.check_dotted_path(bad)


def test_set_field_returns_old_value_and_edits_nested_and_list_items():
    doc = json.loads(json.dumps(CONFIG))
    assert flip.set_field(doc, "quantization.bits", 4) == 8
    assert flip.set_field(doc, "layer_types.1", "sliding") == "full"
    assert doc["quantization"] == {"bits": 4, "group": 32}
    assert doc["layer_types"] == ["full", "sliding", "full"]


def test_set_field_refuses_missing_field_naming_it_and_the_file():
    doc = json.loads(json.dumps(CONFIG))
    with pytest.raises(
        ExperimentError,
        match=r"field 'sample_from_anchor' in draft/config.json: .* does not exist; set flip.add_missing: true",
    ):
        flip.set_field(doc, "sample_from_anchor", True, file="draft/config.json")
    assert "sample_from_anchor" not in doc
    with pytest.raises(ExperimentError, match=r"'sample_from_anchor' is missing from draft/config.json"):
        flip.get_field(doc, "sample_from_anchor", file="draft/config.json")


def test_set_field_adds_missing_field_and_parents_when_asked():
    doc = json.loads(json.dumps(CONFIG))
    assert flip.set_field(doc, "eagle.sample_from_anchor", True, add_missing=True) is None
    assert doc["eagle"] == {"sample_from_anchor": True}


def test_set_field_never_invents_list_indexes():
    doc = json.loads(json.dumps(CONFIG))
    with pytest.raises(ExperimentError, match=r"'layer_types.7'.*index 7 is out of range \(the list has 3 items\)"):
        flip.set_field(doc, "layer_types.7", "full", add_missing=True)
    with pytest.raises(ExperimentError, match="'x' is not an index of a list"):
        flip.set_field(doc, "layer_types.x", "full", add_missing=True)
    assert doc["layer_types"] == ["full", "full", "full"]


def test_set_field_refuses_negative_list_indexes():
    """get_field does not follow `layer_types.-1`, so set_field must not either (it did set the last item
    while has_field said the field was missing, and the folder was then recorded as 'field added')."""
    doc = json.loads(json.dumps(CONFIG))
    assert not flip.has_field(doc, "layer_types.-1")
    with pytest.raises(ExperimentError, match="'-1' is not an index of a list"):
        flip.set_field(doc, "layer_types.-1", "sliding")
    assert doc["layer_types"] == ["full", "full", "full"]


def test_set_field_below_a_null_needs_add_missing():
    """rope_scaling is null: rope_scaling.factor is a missing field, refused unless add_missing."""
    doc = json.loads(json.dumps(CONFIG))
    with pytest.raises(ExperimentError, match=r"'rope_scaling' does not exist \(it is null\); set flip.add_missing"):
        flip.set_field(doc, "rope_scaling.factor", 2.0)
    assert doc["rope_scaling"] is None
    assert flip.set_field(doc, "rope_scaling.factor", 2.0, add_missing=True) is None
    assert doc["rope_scaling"] == {"factor": 2.0}


def test_set_field_refuses_path_below_a_scalar():
    doc = json.loads(json.dumps(CONFIG))
    with pytest.raises(ExperimentError, match=r"field 'rope_theta.base' in <json>: .*rope_theta is a int"):
        flip.set_field(doc, "rope_theta.base", 1, add_missing=True)


# --- the copy -----------------------------------------------------------------------------------


def test_copy_links_weights_copies_the_rest_and_edits_the_field(model_dir, tmp_path):
    arm = _build(model_dir, tmp_path / "arm", 10000)
    assert arm.original_value == 100000 and not arm.field_was_added
    assert set(arm.linked_weights) == {"model.safetensors", "sub/extra.bin"}
    for rel in arm.linked_weights:
        linked = arm.path / rel
        assert linked.is_symlink()
        assert linked.resolve() == (model_dir / rel).resolve()
        assert linked.stat().st_ino == (model_dir / rel).stat().st_ino
    for rel in ("tokenizer.json", "chat_template.jinja", "generation_config.json"):
        copied = arm.path / rel
        assert not copied.is_symlink()
        assert copied.stat().st_ino != (model_dir / rel).stat().st_ino
        assert copied.read_bytes() == (model_dir / rel).read_bytes()
    edited = json.loads((arm.path / "config.json").read_text())
    assert edited["rope_theta"] == 10000
    assert {k: v for k, v in edited.items() if k != "rope_theta"} == {
        k: v for k, v in CONFIG.items() if k != "rope_theta"
    }
    # the source is untouched
    assert json.loads((model_dir / "config.json").read_text()) == CONFIG


def test_hardlink_mode_shares_inodes_without_symlinks(model_dir, tmp_path):
    arm = _build(model_dir, tmp_path / "arm", 10000, link_mode="hardlink")
    weights = arm.path / "model.safetensors"
    assert not weights.is_symlink()
    assert weights.stat().st_ino == (model_dir / "model.safetensors").stat().st_ino
    assert weights.stat().st_nlink == 2


def test_source_symlinks_resolve_to_the_real_blob(model_dir, tmp_path):
    # HF-cache layout: the folder's weight file is itself a link to a blob elsewhere.
    blob = tmp_path / "blobs" / "abc123"
    blob.parent.mkdir()
    (model_dir / "model.safetensors").rename(blob)
    (model_dir / "model.safetensors").symlink_to(blob)
    arm = _build(model_dir, tmp_path / "arm", 10000)
    assert (arm.path / "model.safetensors").readlink() == blob.resolve()


def test_refuses_copy_mode(model_dir, tmp_path):
    with pytest.raises(ExperimentError, match="weights must be shared"):
        _build(model_dir, tmp_path / "arm", 10000, link_mode="copy")
    assert not (tmp_path / "arm").exists()


def test_refuses_large_file_not_named_like_weights(model_dir, tmp_path):
    (model_dir / "weights.npy").write_bytes(b"\0" * 2048)
    with pytest.raises(ExperimentError, match=r"weights.npy .* not named like a weight file"):
        _build(model_dir, tmp_path / "arm", 10000, max_copied_bytes=1024)
    assert not (tmp_path / "arm").exists()


def test_refuses_missing_field_without_building_anything(model_dir, tmp_path):
    with pytest.raises(ExperimentError, match=r"field 'sample_from_anchor' in .*config.json: .* does not exist"):
        _build(model_dir, tmp_path / "arm", True, field="sample_from_anchor")
    assert not (tmp_path / "arm").exists()


def test_adds_missing_field_when_asked(model_dir, tmp_path):
    arm = _build(model_dir, tmp_path / "arm", True, field="sample_from_anchor", add_missing=True)
    assert arm.field_was_added and arm.original_value is None
    assert json.loads((arm.path / "config.json").read_text())["sample_from_anchor"] is True


def test_refuses_flipping_a_weight_file_or_a_missing_or_broken_file(model_dir, tmp_path):
    with pytest.raises(ExperimentError, match="is a weight file"):
        flip.build_flipped_folder(model_dir, tmp_path / "a", file="model.safetensors", field="x", value=1)
    with pytest.raises(ExperimentError, match="'nope.json' does not exist"):
        flip.build_flipped_folder(model_dir, tmp_path / "b", file="nope.json", field="x", value=1)
    (model_dir / "broken.json").write_text("{not json")
    with pytest.raises(ExperimentError, match="broken.json is not valid JSON"):
        flip.build_flipped_folder(model_dir, tmp_path / "c", file="broken.json", field="x", value=1)


def test_refuses_folder_without_weights(model_dir, tmp_path):
    (model_dir / "model.safetensors").unlink()
    (model_dir / "sub" / "extra.bin").unlink()
    with pytest.raises(ExperimentError, match="holds no weight files"):
        _build(model_dir, tmp_path / "arm", 10000)


def test_refuses_nonempty_destination(model_dir, tmp_path):
    dest = tmp_path / "arm"
    dest.mkdir()
    (dest / "leftover").write_text("x")
    with pytest.raises(ExperimentError, match="not empty"):
        _build(model_dir, dest, 10000)


def test_assert_weights_shared_catches_a_weight_file_replaced_by_a_copy(model_dir, tmp_path):
    arm = _build(model_dir, tmp_path / "arm", 10000)
    target = arm.path / "model.safetensors"
    target.unlink()
    target.write_bytes((model_dir / "model.safetensors").read_bytes())
    with pytest.raises(ExperimentError, match="is not shared"):
        flip.assert_weights_shared(arm)


# --- the one-field diff -------------------------------------------------------------------------


def test_two_arms_differ_in_exactly_the_flipped_field(model_dir, tmp_path):
    a = _build(model_dir, tmp_path / "a", 100000)
    b = _build(model_dir, tmp_path / "b", 10000)
    diffs = flip.assert_only_field_differs(a.path, b.path, file="config.json", field="rope_theta")
    assert [(d.file, d.field, d.left, d.right) for d in diffs] == [("config.json", "rope_theta", 100000, 10000)]


def test_arms_equal_to_the_original_value_have_no_diff_to_each_other(model_dir, tmp_path):
    a = _build(model_dir, tmp_path / "a", 100000)
    b = _build(model_dir, tmp_path / "b", 100000)
    assert flip.diff_folders(a.path, b.path) == []
    with pytest.raises(ExperimentError, match="do not differ at all"):
        flip.assert_only_field_differs(a.path, b.path, file="config.json", field="rope_theta")


def test_nested_differences_below_the_declared_field_count_as_that_field(model_dir, tmp_path):
    a = _build(model_dir, tmp_path / "a", {"type": "linear", "factor": 2.0}, field="rope_scaling")
    b = _build(model_dir, tmp_path / "b", {"type": "linear", "factor": 8.0}, field="rope_scaling")
    diffs = flip.assert_only_field_differs(a.path, b.path, file="config.json", field="rope_scaling")
    assert [d.field for d in diffs] == ["rope_scaling.factor"]


@pytest.mark.parametrize(
    "tamper, expected",
    [
        (lambda p: (p / "tokenizer.json").write_text('{"vocab": {"b": 0}}'), r"tokenizer.json:vocab.a"),
        (lambda p: (p / "chat_template.jinja").write_text("{{ other }}"), r"chat_template.jinja: 'sha256:"),
        (lambda p: (p / "new_file.txt").write_text("x"), r"new_file.txt: '<missing>' != '<present>'"),
        (lambda p: _edit_json(p / "config.json", "tie_word_embeddings", False), r"config.json:tie_word_embeddings"),
        (lambda p: _edit_json(p / "generation_config.json", "do_sample", 0), r"generation_config.json:do_sample: False != 0"),
    ],
)
def test_any_other_difference_is_refused_and_named(model_dir, tmp_path, tamper, expected):
    a = _build(model_dir, tmp_path / "a", 100000)
    b = _build(model_dir, tmp_path / "b", 10000)
    tamper(b.path)
    with pytest.raises(ExperimentError, match=expected):
        flip.assert_only_field_differs(a.path, b.path, file="config.json", field="rope_theta")


def test_weight_files_that_differ_in_content_are_refused(model_dir, tmp_path):
    a = _build(model_dir, tmp_path / "a", 100000)
    b = _build(model_dir, tmp_path / "b", 10000)
    (b.path / "model.safetensors").unlink()
    (b.path / "model.safetensors").write_bytes(os.urandom(4096))
    with pytest.raises(ExperimentError, match=r"model.safetensors: 'sha256:"):
        flip.assert_only_field_differs(a.path, b.path, file="config.json", field="rope_theta")


def test_a_field_with_the_same_prefix_is_not_the_declared_field(model_dir, tmp_path):
    a = _build(model_dir, tmp_path / "a", 100000)
    b = _build(model_dir, tmp_path / "b", 10000)
    _edit_json(b.path / "config.json", "rope_theta_extra", 1)
    with pytest.raises(ExperimentError, match="rope_theta_extra"):
        flip.assert_only_field_differs(a.path, b.path, file="config.json", field="rope_theta")


def test_int_and_float_of_equal_value_are_different_json(model_dir, tmp_path):
    a = _build(model_dir, tmp_path / "a", 10000)
    b = _build(model_dir, tmp_path / "b", 10000.0)
    assert [d.field for d in flip.diff_folders(a.path, b.path)] == ["rope_theta"]


def test_safe_label():
    assert flip.safe_label(10000) == "10000"
    assert flip.safe_label(None) == "null"
    assert flip.safe_label("linear") == "linear"
    assert flip.safe_label({"type": "linear"}).startswith("v")


def _edit_json(path: Path, key: str, value) -> None:
    doc = json.loads(path.read_text())
    doc[key] = value
    path.write_text(json.dumps(doc))
