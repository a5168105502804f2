import pytest

from specbook.core.errors import ParamsError
from specbook.experiments.arms import BASELINE, KnobSpec, apply_knobs, build_arms, interleaved_schedule

BASE = {"engine": "vllm", "model": "m", "dtype": "bfloat16", "env": {"A": "0"}, "extra_args": ["--x"],
        "speculative_config": {"method": "draft_model", "model": "fp8", "num_speculative_tokens": 4}}


def knobs():
    return [
        KnobSpec(name="fp32", set={"dtype": "float32"}),
        KnobSpec(name="int4", set={"speculative_config.model": "int4"}, env={"B": 1}, args=["--y", "2"]),
    ]


def test_crossed_arms_are_all_combinations_with_baseline_first():
    arms = build_arms(BASE, knobs(), crossed=True)
    assert [a.name for a in arms] == [BASELINE, "fp32", "int4", "fp32+int4"]
    both = arms[-1].engine
    assert both["dtype"] == "float32"
    assert both["speculative_config"] == {"method": "draft_model", "model": "int4", "num_speculative_tokens": 4}
    assert both["env"] == {"A": "0", "B": "1"}  # YAML ints become the strings an env holds
    assert both["extra_args"] == ["--x", "--y", "2"]
    assert arms[0].engine == {**BASE}  # the baseline is the engine config untouched


def test_one_at_a_time_arms():
    assert [a.name for a in build_arms(BASE, knobs(), crossed=False)] == [BASELINE, "fp32", "int4"]


def test_base_config_is_not_mutated():
    build_arms(BASE, knobs(), crossed=True)
    assert BASE["speculative_config"]["model"] == "fp8" and BASE["env"] == {"A": "0"}


def test_two_knobs_touching_the_same_field_cannot_be_crossed():
    clash = [KnobSpec(name="a", set={"dtype": "float32"}), KnobSpec(name="b", set={"dtype": "float16"})]
    with pytest.raises(ParamsError, match="both change set.dtype"):
        apply_knobs(BASE, clash)


def test_setting_below_a_scalar_is_refused_with_the_path():
    with pytest.raises(ParamsError, match=r"knobs\.a\.set: cannot set 'dtype\.x': dtype is a str"):
        apply_knobs(BASE, [KnobSpec(name="a", set={"dtype.x": 1})])


@pytest.mark.parametrize("bad", ["", "baseline", "a+b", "a b"])
def test_knob_names_must_be_identifiers(bad):
    with pytest.raises(ValueError):
        KnobSpec(name=bad)


def test_schedule_interleaves_and_reverses_every_other_sweep():
    arms = build_arms(BASE, knobs(), crossed=True)
    order = [(s, a.name) for s, a in interleaved_schedule(arms, 3)]
    names = [a.name for a in arms]
    assert order == [(0, n) for n in names] + [(1, n) for n in reversed(names)] + [(2, n) for n in names]
