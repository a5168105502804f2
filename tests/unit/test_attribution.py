"""specbook.experiments.attribution: a run's arm from the env and argv its server really ran with."""

from __future__ import annotations

import pytest

from specbook.core.envline import format_env_line, parse_env_line
from specbook.core.errors import AttributionError
from specbook.experiments.attribution import (
    ArmSignature,
    arm_from_env_line,
    attribute,
    attribution_table,
    knob_keys,
    parse_argv_options,
)

MODELS = "/root/.cache/specbook/models"
PY = "/work/main/.venv/bin/python"
DRAFT = f"{MODELS}/smollm2-135m-instruct-int4g32"
# What specbook.engines.vllm builds: json.dumps(sort_keys=True), model resolved to its folder.
SPEC_SORTED = '{"method": "draft_model", "model": "' + DRAFT + '", "num_speculative_tokens": 4}'


def vllm_argv(port: int, *extra: str, spec: str = SPEC_SORTED) -> list[str]:
    return [
        PY, "-m", "vllm.entrypoints.cli.main", "serve", f"{MODELS}/smollm2-135m-instruct",
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "smollm2-135m-instruct",
        "--max-model-len", "2048", "--seed", "0", "--enforce-eager",
        "--speculative-config", spec, *extra,
    ]  # fmt: skip


# Env lines as specbook.serve.server writes them: sorted, shell-quoted, only what the launcher set.
ENV_BASE = "Env: VLLM_CPU_KVCACHE_SPACE=1 VLLM_LOG_STATS_INTERVAL=1 VLLM_NO_USAGE_STATS=1"
ENV_BF16 = (
    "Env: ONEDNN_DEFAULT_FPMATH_MODE=BF16 VLLM_CPU_KVCACHE_SPACE=1 VLLM_LOG_STATS_INTERVAL=1 VLLM_NO_USAGE_STATS=1"
)

ARMS = {
    "baseline": ArmSignature(),
    "bf16math": ArmSignature(env={"ONEDNN_DEFAULT_FPMATH_MODE": "BF16"}),
    "fp32": ArmSignature(args=["--dtype", "float32"]),
    "bf16math+fp32": ArmSignature(env={"ONEDNN_DEFAULT_FPMATH_MODE": "BF16"}, args={"--dtype": "float32"}),
}
ENV_KEYS = ["ONEDNN_DEFAULT_FPMATH_MODE"]
ARG_KEYS = ["--dtype", "--speculative-config"]


def test_env_line_fixtures_are_what_the_launcher_writes():
    assert format_env_line(parse_env_line(ENV_BF16)) == ENV_BF16


def test_parse_argv_options_forms():
    opts = parse_argv_options(["serve", "m", "--dtype=float32", "--max_num_seqs", "4", "--enforce-eager", "--seed", "-1"])
    assert opts == {"--dtype": "float32", "--max-num-seqs": "4", "--enforce-eager": True, "--seed": "-1"}
    assert parse_argv_options(["--dtype", "bfloat16", "--dtype", "float32"])["--dtype"] == "float32"


@pytest.mark.parametrize(
    ("env_line", "extra", "arm"),
    [
        (ENV_BASE, [], "baseline"),
        (ENV_BF16, [], "bf16math"),
        (ENV_BASE, ["--dtype", "float32"], "fp32"),
        (ENV_BF16, ["--dtype=float32"], "bf16math+fp32"),
    ],
)
def test_each_arm_of_a_crossed_design(env_line, extra, arm):
    a = attribute(parse_env_line(env_line), vllm_argv(41234, *extra), ARMS, ENV_KEYS, ["--dtype"], declared=arm)
    assert a.arm == arm and a.matches_declared, a.reason


def test_run_whose_real_env_differs_from_declared_arm_is_flagged():
    # declared fp32+bf16math in params, but the knob env var never reached the server
    a = attribute(
        parse_env_line(ENV_BASE), vllm_argv(41234, "--dtype", "float32"), ARMS, ENV_KEYS, ["--dtype"],
        declared="bf16math+fp32",
    )  # fmt: skip
    assert a.arm == "fp32" and not a.matches_declared
    assert "declared 'bf16math+fp32'" in a.reason
    assert "ONEDNN_DEFAULT_FPMATH_MODE=<unset> (arm wants BF16)" in a.reason


def test_unrelated_env_and_args_do_not_matter():
    env = parse_env_line(ENV_BF16) | {"VLLM_LOG_STATS_INTERVAL": "10", "HF_HUB_OFFLINE": "1"}
    a = attribute(env, vllm_argv(50000, "--max-num-seqs", "8"), ARMS, ENV_KEYS, ["--dtype"], declared="bf16math")
    assert a.arm == "bf16math"


def test_unattributable_run():
    a = attribute(
        parse_env_line("Env: ONEDNN_DEFAULT_FPMATH_MODE=TF32 VLLM_CPU_KVCACHE_SPACE=1"),
        vllm_argv(41234), ARMS, ENV_KEYS, ["--dtype"], declared="bf16math",
    )  # fmt: skip
    assert a.arm is None and not a.attributable and not a.matches_declared
    assert "unattributable" in a.reason and "TF32" in a.reason
    with pytest.raises(AttributionError, match="unattributable"):
        a.require()


def test_identical_signatures_are_ambiguous():
    arms = {"a": ArmSignature(env={"X": "1"}), "b": ArmSignature(env={"X": "1"})}
    a = attribute({"X": "1"}, vllm_argv(1), arms, ["X"], [])
    assert a.arm is None and "several arms" in a.reason


def test_speculative_config_is_compared_as_json():
    reordered = '{"num_speculative_tokens":4,"model":"' + DRAFT + '","method":"draft_model"}'
    fp8 = SPEC_SORTED.replace("int4g32", "fp8")
    arms = {
        "int4": ArmSignature(args={"--speculative-config": SPEC_SORTED}),
        "fp8": ArmSignature(args={"--speculative-config": {"method": "draft_model", "model": DRAFT.replace("int4g32", "fp8"),
                                                           "num_speculative_tokens": 4}}),
    }  # fmt: skip
    assert attribute({}, vllm_argv(1, spec=reordered), arms, [], ["--speculative-config"]).arm == "int4"
    assert attribute({}, vllm_argv(1, spec=fp8), arms, [], ["--speculative-config"]).arm == "fp8"
    k5 = SPEC_SORTED.replace('"num_speculative_tokens": 4', '"num_speculative_tokens": 5')
    assert attribute({}, vllm_argv(1, spec=k5), arms, [], ["--speculative-config"]).arm is None


def test_signature_from_launch_and_default_keys():
    sig = ArmSignature.from_launch(
        parse_env_line(ENV_BF16), vllm_argv(1, "--dtype", "float32"), ENV_KEYS, ["--dtype", "--quantization"]
    )
    assert sig.env == {"ONEDNN_DEFAULT_FPMATH_MODE": "BF16"} and sig.args == {"--dtype": "float32"}
    # knob keys default to every key any arm names
    assert attribute(parse_env_line(ENV_BF16), vllm_argv(1, "--dtype", "float32"), ARMS).arm == "bf16math+fp32"


def test_declared_arm_must_exist():
    with pytest.raises(AttributionError, match="'nope'"):
        attribute({}, [], ARMS, declared="nope")


MAPPING = {
    "ONEDNN_DEFAULT_FPMATH_MODE=BF16": "A",
    "VLLM_CPU_OMP_THREADS_BIND=nobind": "B",
    "ONEDNN_DEFAULT_FPMATH_MODE=BF16 VLLM_CPU_OMP_THREADS_BIND=nobind": "A+B",
    "*": "baseline",
}


@pytest.mark.parametrize(
    ("line", "arm"),
    [
        (ENV_BASE, "baseline"),
        (ENV_BF16, "A"),
        (ENV_BASE + " VLLM_CPU_OMP_THREADS_BIND=nobind", "B"),
        (ENV_BF16 + " VLLM_CPU_OMP_THREADS_BIND=nobind", "A+B"),
    ],
)
def test_arm_from_env_line_most_specific_wins(line, arm):
    assert arm_from_env_line(line, MAPPING).arm == arm


def test_arm_from_env_line_globs_unset_and_failures():
    m = {"VLLM_CPU_KVCACHE_SPACE=[12]": "small-kv", "!VLLM_CPU_KVCACHE_SPACE": "default-kv"}
    assert arm_from_env_line(ENV_BASE, m).arm == "small-kv"
    assert arm_from_env_line({"VLLM_NO_USAGE_STATS": "1"}, m).arm == "default-kv"
    assert arm_from_env_line({"VLLM_CPU_KVCACHE_SPACE": "40"}, m).arm is None
    tie = arm_from_env_line(ENV_BF16, {"ONEDNN_DEFAULT_FPMATH_MODE": "x", "VLLM_NO_USAGE_STATS=1": "y"})
    assert tie.arm is None and "different arms" in tie.reason
    with pytest.raises(AttributionError, match="not an `Env:` line"):
        arm_from_env_line("INFO 11-29 22:00:01 [api_server.py:1] vLLM API server version 0.32.0", m)


def test_attribution_table():
    runs = {
        "s0-baseline": attribute(parse_env_line(ENV_BASE), vllm_argv(1), ARMS, ENV_KEYS, ["--dtype"], declared="baseline"),
        "s0-bf16math": attribute(parse_env_line(ENV_BASE), vllm_argv(2), ARMS, ENV_KEYS, ["--dtype"], declared="bf16math"),
    }
    t = attribution_table(runs)
    assert list(t["arm"]) == ["baseline", "baseline"]
    assert list(t["matches_declared"]) == [True, False]
    assert list(t["env:ONEDNN_DEFAULT_FPMATH_MODE"]) == ["<unset>", "<unset>"]


def test_knob_keys_from_arms_knobs():
    from specbook.experiments.arms import KnobSpec

    knobs = [
        KnobSpec(name="bf16math", env={"ONEDNN_DEFAULT_FPMATH_MODE": "BF16"}),
        KnobSpec(name="fp32", args=["--dtype", "float32"]),
        KnobSpec(name="fp8draft", set={"speculative_config.model": "smollm2-135m-instruct-fp8"}),
    ]
    assert knob_keys(knobs) == (["ONEDNN_DEFAULT_FPMATH_MODE"], ["--dtype", "--speculative-config"])


def test_arm_of_verbatim_knob_ab_logs_from_their_env_lines():
    """Real server logs (tests/fixtures/logs/knob_ab): the kv2g run's launcher set VLLM_CPU_KVCACHE_SPACE=2."""
    from pathlib import Path

    from specbook.core.envline import read_env_line

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "knob_ab"
    mapping = {"VLLM_CPU_KVCACHE_SPACE=2": "kv2g", "*": "baseline"}
    arms = {p.stem: arm_from_env_line(read_env_line(p), mapping).arm for p in sorted(folder.glob("ngram-*.log"))}
    assert arms == {"ngram-00-sweep0-baseline": "baseline", "ngram-01-sweep0-kv2g": "kv2g",
                    "ngram-02-sweep0-lookup1": "baseline"}  # lookup1 differs in argv, not in env
