"""One acceptance definition from each engine's raw counts (verbatim llama.cpp captures, vLLM counters)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbook.acceptance import (
    SpecCounts,
    al_from_acceptance_rate,
    al_from_al_minus_one,
    counts_from_llamacpp_timings,
    counts_from_spec_decode_delta,
)
from specbook.metrics import MetricsSnapshot, spec_decode_delta

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"


def test_definition_counts_the_bonus_token():
    c = SpecCounts(engine="x", source="t", drafts=10, draft_tokens=40, accepted=15, accepted_per_position=[8, 4, 2, 1])
    assert c.acceptance_length == pytest.approx(2.5)
    assert c.acceptance_rate == pytest.approx(15 / 40)
    assert c.per_position_acceptance == pytest.approx([0.8, 0.4, 0.2, 0.1])
    assert c.mean_draft_length == pytest.approx(4)
    row = c.figures()
    assert row["al"] == pytest.approx(2.5) and row["raw_drafts"] == 10 and row["p3"] == pytest.approx(0.1)


def test_no_drafts_means_no_al():
    c = SpecCounts(engine="x", source="t", drafts=0)
    assert c.acceptance_length is None and c.acceptance_rate is None and c.per_position_acceptance == []


def test_other_tools_figures_convert_to_the_same_al():
    c = SpecCounts(engine="x", source="t", drafts=10, draft_tokens=40, accepted=15)
    assert al_from_al_minus_one(15 / 10) == pytest.approx(c.acceptance_length)
    assert al_from_acceptance_rate(c.acceptance_rate, c.mean_draft_length) == pytest.approx(c.acceptance_length)


def test_timings_alone_give_no_al_but_keep_the_raw_rate():
    c = counts_from_llamacpp_timings([{"draft_n": 20, "draft_n_accepted": 9}, {"draft_n": 8, "draft_n_accepted": 3}])
    assert c.drafts is None and c.acceptance_length is None
    assert c.draft_tokens == 28 and c.accepted == 12 and c.acceptance_rate == pytest.approx(12 / 28)


@pytest.mark.parametrize("lane", ["draft", "ngram"])
def test_llamacpp_counters_and_timings_agree(lane):
    """Verbatim captures: the counter delta equals the sum of the responses' timings."""
    from specbook.engines.llamacpp import LlamaCppEngine

    before = MetricsSnapshot.from_text((FIX / f"metrics-{lane}-before.txt").read_text())
    after = MetricsSnapshot.from_text((FIX / f"metrics-{lane}-after.txt").read_text())
    delta = LlamaCppEngine().spec_decode_delta(before, after)
    counts = counts_from_spec_decode_delta(delta, "llamacpp")
    timings = [r["timings"] for r in json.loads((FIX / f"responses-{lane}.json").read_text()).values()]
    from_timings = counts_from_llamacpp_timings(timings)
    assert counts.draft_tokens == from_timings.draft_tokens > 0
    assert counts.accepted == from_timings.accepted
    assert counts.drafts and counts.acceptance_length == pytest.approx(1 + counts.accepted / counts.drafts)
    assert len(counts.accepted_per_position) == 4
    # accepted at position i implies accepted at every earlier position
    assert counts.accepted_per_position == sorted(counts.accepted_per_position, reverse=True)
    assert sum(counts.accepted_per_position) == counts.accepted


def test_vllm_counters_map_onto_the_same_definition():
    text = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 15.0
"""
    zero = MetricsSnapshot.from_text(text.replace("10.0", "0.0").replace("40.0", "0.0").replace("15.0", "0.0"))
    c = counts_from_spec_decode_delta(spec_decode_delta(zero, MetricsSnapshot.from_text(text), "m"), "vllm")
    assert c.acceptance_length == pytest.approx(2.5) and c.acceptance_rate == pytest.approx(0.375)
