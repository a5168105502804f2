"""params: YAML + pydantic validation, errors naming file and field, overrides, hash."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from specbook.core.errors import ParamsError
from specbook.core.params import (
    ExperimentParams,
    apply_overrides,
    dump_params,
    load_params,
    params_display_name,
    params_hash,
    parse_override,
)

FIXTURE_PARAMS = Path(__file__).resolve().parents[1] / "fixtures" / "params" / "fixture_good"


class Arm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str
    env: dict[str, str] = {}


class KnobParams(ExperimentParams):
    arms: list[Arm]
    max_tokens: int = 64
    knobs: dict[str, float] = {}


def write(tmp_path: Path, text: str, name: str = "x.yaml") -> Path:
    folder = tmp_path / "params" / "knob_ab"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


ARMS_YAML = """\
name: two-arms
arms:
  - label: base
    env: {A: "1"}
  - label: test
    env:
      FOO: "x"
"""


def test_valid_file_loads_with_types(tmp_path):
    params = load_params(KnobParams, write(tmp_path, ARMS_YAML))
    assert params.name == "two-arms"
    assert [a.label for a in params.arms] == ["base", "test"]
    assert params.arms[1].env == {"FOO": "x"}
    assert params.max_tokens == 64


def test_type_error_names_file_and_dotted_field(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, ARMS_YAML.replace('FOO: "x"', "FOO: [1, 2]"))
    with pytest.raises(ParamsError) as exc:
        load_params(KnobParams, path)
    assert str(exc.value) == "params/knob_ab/x.yaml: arms.1.env.FOO: Input should be a valid string"


def test_every_failing_field_is_listed(tmp_path):
    path = write(tmp_path, "arms: [{label: 3}]\nmax_tokens: many\n")
    with pytest.raises(ParamsError) as exc:
        load_params(KnobParams, path)
    message = str(exc.value)
    assert "arms.0.label: Input should be a valid string" in message
    assert "max_tokens: Input should be a valid integer" in message
    assert all(line.startswith(f"{path}: ") for line in message.splitlines())


def test_missing_required_field_is_named(tmp_path):
    with pytest.raises(ParamsError, match=r"x\.yaml: arms: Field required"):
        load_params(KnobParams, write(tmp_path, "name: empty\n"))


def test_unknown_field_is_an_error_not_ignored(tmp_path):
    path = write(tmp_path, ARMS_YAML + "max_tokns: 32\n")
    with pytest.raises(ParamsError, match=r"x\.yaml: max_tokns: Extra inputs are not permitted"):
        load_params(KnobParams, path)


def test_unknown_nested_field_is_named_with_its_path(tmp_path):
    path = write(tmp_path, ARMS_YAML.replace("label: test", "label: test\n    lable: typo"))
    with pytest.raises(ParamsError, match=r"arms\.1\.lable: Extra inputs are not permitted"):
        load_params(KnobParams, path)


def test_yaml_syntax_error_names_file_and_line():
    path = FIXTURE_PARAMS / "bad_syntax.yaml"
    with pytest.raises(ParamsError) as exc:
        load_params(KnobParams, path)
    message = str(exc.value)
    assert "bad_syntax.yaml" in message
    assert "YAML syntax error at line 4" in message  # the unclosed list on line 3 is noticed at line 4


def test_yaml_syntax_error_line_is_the_offending_one(tmp_path):
    path = write(tmp_path, "name: a\nmax_tokens: 3\narms: {label: x\n  : : :\n")
    with pytest.raises(ParamsError, match=r"line [34],"):
        load_params(KnobParams, path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ParamsError, match=r"nope\.yaml: params file not found"):
        load_params(KnobParams, tmp_path / "nope.yaml")


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ParamsError, match=r"x\.yaml: the top level must be a mapping.*list"):
        load_params(KnobParams, write(tmp_path, "- a\n- b\n"))


@pytest.mark.parametrize(
    ("override", "keys", "value"),
    [
        ("a=1", ["a"], 1),
        ("a.b=1.5", ["a", "b"], 1.5),
        ("arms.0.env.X=1", ["arms", "0", "env", "X"], 1),
        ("flag=true", ["flag"], True),
        ("s='1'", ["s"], "1"),
        ("l=[1, 2]", ["l"], [1, 2]),
        ("m={k: v}", ["m"], {"k": "v"}),
        ("n=", ["n"], None),
        ("eq=a=b", ["eq"], "a=b"),
    ],
)
def test_parse_override_splits_key_and_parses_value_as_yaml(override, keys, value):
    assert parse_override(override) == (keys, value)


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1", "a=[1,"])
def test_bad_override_is_named(bad):
    with pytest.raises(ParamsError, match="override"):
        parse_override(bad)


def test_overrides_reach_nested_dicts_and_list_items():
    data = {"arms": [{"label": "a", "env": {}}, {"label": "b"}], "max_tokens": 8}
    out = apply_overrides(
        data, ["arms.0.env.X=1", "arms.1.label=c", "max_tokens=16", "knobs.t=0.5", "arms.-1.env.Y=y"]
    )
    assert out == {
        "arms": [{"label": "a", "env": {"X": 1}}, {"label": "c", "env": {"Y": "y"}}],
        "max_tokens": 16,
        "knobs": {"t": 0.5},
    }
    assert data["arms"][0]["env"] == {}  # the input is not modified


def test_override_index_equal_to_length_appends():
    out = apply_overrides({"arms": [{"label": "a"}]}, ["arms.1.label=b"])
    assert out["arms"] == [{"label": "a"}, {"label": "b"}]


def test_override_index_out_of_range_is_an_error():
    with pytest.raises(
        ParamsError, match=r"override 'arms\.5\.label=b': arms\.5: index 5 is out of range \(the list has 1 items\)"
    ):
        apply_overrides({"arms": [{"label": "a"}]}, ["arms.5.label=b"])


def test_override_non_integer_list_index_is_an_error():
    with pytest.raises(
        ParamsError, match=r"override 'arms\.first\.label=b': arms\.first: 'first' is not an index of a list"
    ):
        apply_overrides({"arms": [{"label": "a"}]}, ["arms.first.label=b"])


def test_override_into_a_scalar_is_an_error():
    with pytest.raises(ParamsError, match=r"max_tokens is a int"):
        apply_overrides({"max_tokens": 3}, ["max_tokens.x=1"])


def test_override_values_are_validated_like_the_file(tmp_path):
    path = write(tmp_path, ARMS_YAML)
    params = load_params(KnobParams, path, ["arms.0.env.A='2'", "max_tokens=128"])
    assert params.arms[0].env == {"A": "2"}
    assert params.max_tokens == 128
    with pytest.raises(ParamsError, match=r"x\.yaml: arms\.0\.env\.A: Input should be a valid string"):
        load_params(KnobParams, path, ["arms.0.env.A=[1]"])
    with pytest.raises(ParamsError, match=r"max_tokns: Extra inputs are not permitted"):
        load_params(KnobParams, path, ["max_tokns=3"])


def test_hash_ignores_yaml_spelling_and_key_order(tmp_path):
    a = load_params(KnobParams, write(tmp_path, ARMS_YAML, "a.yaml"))
    reordered = (
        "arms:\n  - {env: {A: '1'}, label: base}\n  - label: test\n    env: {FOO: x}\n"
        "name: two-arms\nmax_tokens: 64\n"
    )
    b = load_params(KnobParams, write(tmp_path, reordered, "b.yaml"))
    assert params_hash(a) == params_hash(b)
    assert len(params_hash(a)) == 64


def test_hash_changes_with_any_value(tmp_path):
    path = write(tmp_path, ARMS_YAML)
    base = params_hash(load_params(KnobParams, path))
    assert params_hash(load_params(KnobParams, path, ["max_tokens=65"])) != base
    assert params_hash(load_params(KnobParams, path, ["arms.1.env.FOO=y"])) != base


def test_hash_is_stable_across_processes():
    # a known value: the hash must not depend on the process (no salted hash(), no dict order)
    params = KnobParams(name="n", arms=[Arm(label="a", env={"K": "v"})])
    assert params_hash(params) == params_hash(KnobParams.model_validate(params.model_dump()))
    import hashlib
    import json

    canonical = json.dumps(params.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    assert params_hash(params) == hashlib.sha256(canonical.encode()).hexdigest()


def test_dump_then_load_round_trips(tmp_path):
    params = load_params(KnobParams, write(tmp_path, ARMS_YAML), ["knobs.temperature=0.7"])
    out = dump_params(params, tmp_path / "resolved.yaml")
    again = load_params(KnobParams, out)
    assert again == params
    assert params_hash(again) == params_hash(params)


def test_display_name_is_name_else_file_stem(tmp_path):
    named = load_params(KnobParams, write(tmp_path, ARMS_YAML))
    assert params_display_name(named, "whatever.yaml") == "two-arms"
    unnamed = load_params(KnobParams, write(tmp_path, ARMS_YAML.replace("name: two-arms\n", ""), "ab.yaml"))
    assert params_display_name(unnamed, tmp_path / "ab.yaml") == "ab"


def test_base_params_forbid_extra_fields():
    with pytest.raises(Exception, match="Extra inputs are not permitted"):
        ExperimentParams.model_validate({"name": "x", "oops": 1})
