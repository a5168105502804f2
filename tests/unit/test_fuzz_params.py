"""Property-based fuzzing (hypothesis) of params loading (issue #12, "Fuzzing"): `load_params` with each
experiment's schema on arbitrary and garbled YAML files raises ParamsError naming the file, never another
exception; `-p` overrides raise ParamsError naming the override. Derandomized, prints nothing
(SPECBOOK_FUZZ_SCALE=N: N times the examples, random seed; see test_fuzz_parsers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbook.core.errors import ParamsError
from specbook.core.params import load_params
from specbook.experiments.registry import get_experiment

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ["knob_ab", "config_flip", "cross_engine"]
FILES = sorted((name, path) for name in EXPERIMENTS for path in (ROOT / "params" / name).glob("*.yaml"))

_SCALE = int(os.environ.get("SPECBOOK_FUZZ_SCALE", "1"))


def fuzz(max_examples: int) -> settings:
    return settings(max_examples=max_examples * _SCALE, deadline=None, derandomize=_SCALE == 1, database=None,
                    print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.large_base_example])


def _schema(name: str):
    import specbook.experiments  # noqa: F401 (registers the experiments)

    return get_experiment(name).params_model


# YAML that trips parsers and constructors: bad timestamps and tags, anchors (recursive ones too), merge keys,
# directives, flow and block indicators, tabs, BOM, NUL, deep nesting.
YAML_FRAGMENTS = ["2001-13-45", "2001-02-30", "2001-12-14t21:59:43.10-05:00", "!!int x", "!!float x", "!!timestamp x",
                  "!!binary ====", "!!set {a, b}", "!!omap [a: 1]", "!!python/object:os.system", "!!str", "!!null x",
                  "&a ", "*a", "&a [*a]", "<<: *a", "<<: [1]", "? ", ": ", "- ", "{", "}", "[", "]", "'", '"', "|",
                  ">-", "#", "%YAML 1.1\n", "---\n", "...\n", "\t", "\n", "\n  ", "\ufeff", "\x00", "\x85", ".nan",
                  "-.inf", "1e400", "0x1F", "0o17", "1_000", "~", "null", "yes", "no", "=", "[" * 200, "{a: " * 100,
                  "a: b: c", "key: value"]

LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), st.dates(),
                   st.datetimes())
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=10)


def _paths(data, prefix=()):
    """Every path into a loaded params document, inner nodes included."""
    yield prefix
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        yield from _paths(value, (*prefix, key))


@st.composite
def restructured(draw, text: str) -> str:
    """A real params document with one node replaced by an arbitrary value, or one key renamed."""
    data = yaml.safe_load(text)
    paths = list(_paths(data))
    path = draw(st.sampled_from(paths))
    if not path:
        return yaml.safe_dump(draw(VALUES))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and draw(st.booleans()):
        parent[draw(st.one_of(st.text(max_size=10), st.integers()))] = parent.pop(path[-1])
    else:
        parent[path[-1]] = draw(VALUES)
    return yaml.safe_dump(data, allow_unicode=draw(st.booleans()))


@st.composite
def garbled(draw, text: str) -> str:
    """A real params text cut, with fragments inserted, or lines dropped."""
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["cut", "insert", "insert", "drop"]))
        if op == "cut":
            text = text[:where]
        elif op == "insert":
            text = text[:where] + draw(st.one_of(st.sampled_from(YAML_FRAGMENTS), st.text(max_size=10))) + text[where:]
        else:
            lines = text.split("\n")
            del lines[where % len(lines)]
            text = "\n".join(lines)
    return text


def documents(path: Path) -> st.SearchStrategy[bytes]:
    text = path.read_text(encoding="utf-8")
    as_text = st.one_of(st.text(max_size=200), garbled(text), restructured(text),
                        st.lists(st.sampled_from(YAML_FRAGMENTS), max_size=12).map("".join))
    return st.one_of(as_text.map(lambda s: s.encode("utf-8", "surrogatepass")), st.binary(max_size=200))


def _load(name: str, path: Path, overrides=()):
    try:
        return load_params(_schema(name), path, overrides)
    except ParamsError as exc:
        return exc


@pytest.mark.parametrize("name, source", FILES, ids=lambda v: v.name if isinstance(v, Path) else v)
def test_the_real_params_files_load(name, source):
    """What the garbling below starts from is valid: an error there is the garbling's."""
    assert not isinstance(_load(name, source), ParamsError)


def _assert_loads_or_names_the_file(name: str, path: Path) -> None:
    out = _load(name, path)
    if isinstance(out, ParamsError):
        assert str(path) in str(out)
    else:
        assert isinstance(out, _schema(name))


@fuzz(60)
@given(data=st.data())
def test_params_files_load_or_raise_params_error_naming_the_file(tmp_path, data):
    name, source = data.draw(st.sampled_from(FILES))
    path = tmp_path / "params.yaml"
    path.write_bytes(data.draw(documents(source)))
    _assert_loads_or_names_the_file(name, path)


_FLIP = (ROOT / "params" / "config_flip" / "cpu-demo.yaml").read_text(encoding="utf-8")


# Minimal inputs that raised something else than ParamsError before the fixes in specbook.core.params.
@pytest.mark.parametrize("name, document, raised", [
    ("knob_ab", "a: 2001-02-30\n", "ValueError"),  # PyYAML's timestamp constructor
    ("knob_ab", "a: !!timestamp x\n", "AttributeError"),
    ("knob_ab", "a: !!bool x\n", "KeyError"),
    ("knob_ab", "a: 9" + "9" * 5000 + "\n", "ValueError"),  # more digits than int() reads
    ("config_flip", "[" * 5000, "RecursionError"),
    # the schema's own validator (flip.values must be distinct, compared as JSON) on a value JSON cannot hold
    ("config_flip", _FLIP.replace("values: [100000.0, 100.0]", "values: [2001-01-01, 1]"), "TypeError"),
    ("config_flip", _FLIP.replace("values: [100000.0, 100.0]", "values: [!!binary aGVsbG8=, 1]"), "TypeError"),
])
def test_regression_yaml_that_raised_other_errors(tmp_path, name, document, raised):
    path = tmp_path / "params.yaml"
    path.write_text(document, encoding="utf-8")
    with pytest.raises(ParamsError, match=raised) as info:
        load_params(_schema(name), path)
    assert str(path) in str(info.value)


def test_regression_override_value_pyyaml_refuses():
    with pytest.raises(ParamsError, match="override '0=0000-00-00'"):
        load_params(_schema("config_flip"), ROOT / "params" / "config_flip" / "cpu-demo.yaml", ["0=0000-00-00"])


OVERRIDES = st.one_of(st.text(max_size=30),
                      st.tuples(st.sampled_from(["engine.model", "knobs.0.set", "knobs.9", "knobs.-1", "workload",
                                                 "a..b", ".", "engine.env.X", "sweeps", "flip.values.0", "lanes.0.x"]),
                                st.sampled_from(YAML_FRAGMENTS + ["1", "[1, 2]", "{a: 1}", ""])
                                ).map(lambda kv: f"{kv[0]}={kv[1]}"))


@fuzz(60)
@given(data=st.data())
def test_overrides_apply_or_raise_params_error(data):
    name, source = data.draw(st.sampled_from(FILES))
    overrides = data.draw(st.lists(OVERRIDES, min_size=1, max_size=3))
    out = _load(name, source, overrides)
    if isinstance(out, ParamsError):
        assert "override" in str(out) or str(source.relative_to(ROOT)) in str(out) or str(source) in str(out)
    else:
        assert isinstance(out, _schema(name))
