"""specbook.core.dotted: the one dotted-path helper (params overrides, knob `set:`, config-flip fields)."""

from __future__ import annotations

import copy

import pytest

from specbook.core import dotted
from specbook.core.dotted import MISSING, DottedPathError

DOC = {
    "rope_theta": 100000,
    "rope_scaling": None,
    "layer_types": ["full", "sliding", "full"],
    "arms": [{"label": "a", "env": {}}],
    "quantization": {"bits": 8},
    "2": "a key that looks like an index",
}


def doc() -> dict:
    return copy.deepcopy(DOC)


# --- split / join -------------------------------------------------------------------------------


def test_split_and_join_round_trip():
    assert dotted.split("rope_scaling.factor") == ["rope_scaling", "factor"]
    assert dotted.split("layer_types.2") == ["layer_types", "2"]  # segments stay strings
    assert dotted.join(["layer_types", 2]) == "layer_types.2"


@pytest.mark.parametrize("bad", ["", "a..b", ".a", "a."])
def test_split_refuses_empty_segments(bad):
    with pytest.raises(DottedPathError, match="is not a dotted path like 'rope_scaling.factor'"):
        dotted.split(bad)


def test_dotted_path_error_is_a_value_error():
    # pydantic validators turn a ValueError into a validation error naming the field
    assert issubclass(DottedPathError, ValueError)


# --- get ----------------------------------------------------------------------------------------


def test_get_follows_mappings_and_list_indexes():
    assert dotted.get(DOC, "quantization.bits") == 8
    assert dotted.get(DOC, "layer_types.1") == "sliding"
    assert dotted.get(DOC, ["arms", 0, "label"]) == "a"
    assert dotted.get(DOC, "2") == "a key that looks like an index"
    assert dotted.get(DOC, "rope_scaling") is None  # present and null is not missing


@pytest.mark.parametrize(
    "path", ["nope", "quantization.group", "layer_types.3", "layer_types.-1", "layer_types.x",
             "layer_types.²", "rope_theta.base", "rope_scaling.factor"],
)
def test_get_returns_missing_for_paths_it_cannot_follow(path):
    assert dotted.get(DOC, path) is MISSING


def test_get_refuses_a_malformed_path():
    with pytest.raises(DottedPathError):
        dotted.get(DOC, "a..b")
    with pytest.raises(DottedPathError):
        dotted.get(DOC, ["a", ""])


# --- set_path -----------------------------------------------------------------------------------


def test_set_returns_the_old_value_or_missing():
    d = doc()
    assert dotted.set_path(d, "quantization.bits", 4) == 8
    assert dotted.set_path(d, "layer_types.0", "sliding") == "full"
    assert dotted.set_path(d, "quantization.group", 32) is MISSING
    assert d["quantization"] == {"bits": 4, "group": 32}
    assert d["layer_types"] == ["sliding", "sliding", "full"]


def test_set_creates_missing_and_null_mappings_by_default():
    d = doc()
    dotted.set_path(d, "speculative_config.model", "fp8")
    dotted.set_path(d, "rope_scaling.factor", 2.0)
    assert d["speculative_config"] == {"model": "fp8"} and d["rope_scaling"] == {"factor": 2.0}


def test_set_without_create_refuses_missing_and_null_parents():
    d = doc()
    with pytest.raises(DottedPathError, match="'eagle' does not exist") as exc:
        dotted.set_path(d, "eagle.sample_from_anchor", True, create=False)
    assert exc.value.where == "eagle"
    with pytest.raises(DottedPathError, match="'quantization.group' does not exist") as exc:
        dotted.set_path(d, "quantization.group", 32, create=False)
    assert exc.value.where == "quantization.group"
    with pytest.raises(DottedPathError, match=r"'rope_scaling' does not exist \(it is null\)"):
        dotted.set_path(d, "rope_scaling.factor", 2.0, create=False)
    d["layer_types"][1] = None
    with pytest.raises(DottedPathError, match=r"'layer_types.1' does not exist \(it is null\)"):
        dotted.set_path(d, "layer_types.1.kind", "x", create=False)
    d["layer_types"][1] = "sliding"
    assert d == DOC  # nothing was made on the way to a refusal


def test_set_never_invents_list_items_unless_appending():
    d = doc()
    with pytest.raises(DottedPathError, match=r"index 3 is out of range \(the list has 3 items\)") as exc:
        dotted.set_path(d, "layer_types.3", "full")
    assert exc.value.where == "layer_types.3"
    with pytest.raises(DottedPathError, match="'x' is not an index of a list"):
        dotted.set_path(d, "layer_types.x", "full")
    with pytest.raises(DottedPathError, match="'²' is not an index of a list"):  # isdigit() says yes, int() no
        dotted.set_path(d, "layer_types.²", "full")
    assert d == DOC


def test_append_extends_a_list_by_one():
    d = doc()
    assert dotted.set_path(d, "arms.1.label", "b", append=True) is MISSING
    assert dotted.set_path(d, "layer_types.3", "full", append=True) is MISSING
    assert d["arms"] == [{"label": "a", "env": {}}, {"label": "b"}]
    assert d["layer_types"] == ["full", "sliding", "full", "full"]
    with pytest.raises(DottedPathError, match="index 6 is out of range"):
        dotted.set_path(d, "layer_types.6", "full", append=True)


def test_negative_indexes_only_when_asked():
    d = doc()
    with pytest.raises(DottedPathError, match="'-1' is not an index of a list"):
        dotted.set_path(d, "layer_types.-1", "sliding")
    assert dotted.set_path(d, "arms.-1.env.Y", "y", negative=True) is MISSING
    assert dotted.set_path(d, "layer_types.-3", "sliding", negative=True) == "full"
    assert d["arms"][0]["env"] == {"Y": "y"} and d["layer_types"][0] == "sliding"
    with pytest.raises(DottedPathError, match="index -4 is out of range"):
        dotted.set_path(d, "layer_types.-4", "x", negative=True)


def test_set_below_a_scalar_names_the_parent():
    d = doc()
    with pytest.raises(DottedPathError, match="rope_theta is a int, cannot hold 'base'") as exc:
        dotted.set_path(d, "rope_theta.base", 1)
    assert exc.value.where == "rope_theta.base"
    with pytest.raises(DottedPathError, match="<root> is a str, cannot hold 'a'"):
        dotted.set_path("text", "a", 1)


def test_set_accepts_a_list_of_segments_but_not_an_empty_one():
    d = doc()
    dotted.set_path(d, ["arms", 0, "env", "X"], 1)
    assert d["arms"][0]["env"] == {"X": 1}
    with pytest.raises(DottedPathError, match="is not a dotted path"):
        dotted.set_path(d, ["arms", ""], 1)
    with pytest.raises(DottedPathError, match="is not a dotted path"):
        dotted.set_path(d, [], 1)
