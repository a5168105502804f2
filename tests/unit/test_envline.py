"""specbook.core.envline: the `Env:` line the launcher writes first into every server log, and reading it back.

Round trips use the verbatim first lines of the captured server logs (vLLM CPU and CUDA, llama.cpp).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specbook.core.envline import ENV_PREFIX, format_env_line, parse_env_line, read_env_line

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = sorted([*FIXTURES.glob("logs/*.log"), *FIXTURES.glob("logs/knob_ab/*.log"), *FIXTURES.glob("llamacpp/*.log")])


def first_line(path: Path) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.readline().rstrip("\n")


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_verbatim_env_lines_round_trip_exactly(log):
    line = first_line(log)
    env = parse_env_line(line)
    assert env is not None and format_env_line(env) == line
    assert read_env_line(log) == env


def test_verbatim_values_are_read_as_written():
    assert parse_env_line(first_line(FIXTURES / "logs" / "vllm-cuda-0.26-h200-draft-model.log")) == {
        "VLLM_LOG_STATS_INTERVAL": "0.5", "VLLM_NO_USAGE_STATS": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert parse_env_line(first_line(FIXTURES / "logs" / "knob_ab" / "ngram-01-sweep0-kv2g.log"))[
        "VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert read_env_line(FIXTURES / "llamacpp" / "server-draft.log") == {}  # the launcher set nothing


def test_format_sorts_keys_and_quotes_what_the_shell_would_split():
    env = {"B": "a b", "A": "it's", "C": "", "D": "x=1;y", "E": "$HOME"}
    line = format_env_line(env)
    assert line.startswith(ENV_PREFIX + " A=") and line.index(" B=") < line.index(" C=")
    assert parse_env_line(line) == env
    assert format_env_line({}) == "Env:" and parse_env_line("Env:") == {}


def test_a_newline_in_a_value_stays_on_one_line_as_backslash_n():
    line = format_env_line({"MULTI": "one\ntwo\r"})
    assert "\n" not in line and "\r" not in line
    assert parse_env_line(line) == {"MULTI": "one\\ntwo\\r"}  # written as a literal backslash-n, read so


@pytest.mark.parametrize("key", ["", "A=B", "HAS SPACE", "TAB\tKEY"])
def test_keys_that_cannot_be_written_are_refused(key):
    with pytest.raises(ValueError, match="cannot be written on an Env line"):
        format_env_line({key: "v"})


def test_parse_tells_other_lines_from_malformed_env_lines():
    assert parse_env_line("INFO 11-29 22:00:01 [api_server.py:1] vLLM API server version 0.32.0") is None
    assert parse_env_line("  Env: A=1  ") == {"A": "1"}
    with pytest.raises(ValueError, match="'NOVALUE' is not KEY=VALUE"):
        parse_env_line("Env: A=1 NOVALUE")
    with pytest.raises(ValueError, match="'=v' is not KEY=VALUE"):
        parse_env_line("Env: =v")
    with pytest.raises(ValueError):  # shlex: an unclosed quote
        parse_env_line("Env: A='open")


def test_read_env_line_takes_the_first_within_the_first_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("booting\n" + format_env_line({"A": "1"}) + "\n" + format_env_line({"A": "2"}) + "\n")
    assert read_env_line(log) == {"A": "1"}  # a second server appending writes a later one
    assert read_env_line(log, max_lines=1) is None
    late = tmp_path / "late.log"
    late.write_text("x\n" * 50 + "Env: A=1\n")
    assert read_env_line(late) is None and read_env_line(late, max_lines=51) == {"A": "1"}


def test_read_env_line_without_a_readable_env_line_is_none(tmp_path):
    assert read_env_line(tmp_path / "missing.log") is None
    (tmp_path / "none.log").write_text("INFO no env here\n")
    assert read_env_line(tmp_path / "none.log") is None
    (tmp_path / "bad.log").write_text("Env: A='open\n")
    assert read_env_line(tmp_path / "bad.log") is None
    (tmp_path / "binary.log").write_bytes(b"Env: A=\xff\n")
    assert read_env_line(tmp_path / "binary.log") == {"A": "\ufffd"}  # undecodable bytes are replaced
