"""Equal-work helpers: common prefix of two engines' outputs, the re-run request, acceptance on the prefix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbook.core.errors import SpecbookError
from specbook.experiments.cross_engine.guards import first_divergence
from specbook.serve.client import ChatRequest
from specbook.traces.derive import derive_request_steps
from specbook.traces.equalwork import (
    PrefixAcceptance,
    common_prefix_len,
    equal_work_request,
    prefix_acceptance,
    prefix_acceptance_of_steps,
)
from specbook.traces.records import ProposalRecord, records_frame

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _real_outputs() -> dict:
    return json.loads((FIXTURES / "llamacpp" / "real_outputs.json").read_text())


def test_common_prefix_of_the_real_diverging_outputs():
    """llama.cpp and vLLM on the same weights, greedy: the bicycle answers part early (captured ids)."""
    normal = _real_outputs()["normal_prompt"]
    a, b = normal["llamacpp"], normal["vllm"]
    n = common_prefix_len(a, b)
    assert 0 < n < min(len(a), len(b))
    assert n == first_divergence(a, b) and a[:n] == b[:n] and a[n] != b[n]


def test_common_prefix_edges():
    assert common_prefix_len([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([4], [5]) == 0


def test_equal_work_request_caps_max_tokens_at_the_common_prefix():
    req = ChatRequest(prompt_id="bicycle", messages=[{"role": "user", "content": "hi"}], max_tokens=96)
    normal = _real_outputs()["normal_prompt"]
    rerun = equal_work_request(req, normal["llamacpp"], normal["vllm"])
    assert rerun is not None
    assert rerun.max_tokens == common_prefix_len(normal["llamacpp"], normal["vllm"])
    assert rerun.ignore_eos and rerun.messages == req.messages and rerun.prompt_id == "bicycle"
    assert req.max_tokens == 96  # the original request is left as it was
    assert equal_work_request(req, [1, 2], [3, 2]) is None  # nothing in common: nothing to re-run


def test_prefix_acceptance_from_plain_steps():
    # prompt of 10 tokens; output positions 1, 4, 6, 9: steps accepted 2, 1, 2, 3 -> emitted 3, 2, 3, 4
    steps = [(11, 2), (14, 1), (16, 2), (19, 3)]
    whole = prefix_acceptance(steps, prompt_tokens=10, prefix_len=13)
    assert whole == PrefixAcceptance(tokens=13, steps=4, accepted_tokens=8)
    # diverged at output token 8: the step at 9 never counts; the one at 6 keeps 2 (positions 6, 7)
    cut = prefix_acceptance(steps, prompt_tokens=10, prefix_len=8)
    assert cut == PrefixAcceptance(tokens=8, steps=3, accepted_tokens=5)
    # at 7 the step starting at 6 keeps only its first accepted token
    assert prefix_acceptance(steps, prompt_tokens=10, prefix_len=7).accepted_tokens == 4
    assert cut.describe() == "8 tokens in 3 steps (5 accepted draft tokens)"


def test_prefix_acceptance_refuses_steps_inside_the_prompt_and_bad_counts():
    with pytest.raises(SpecbookError, match="step 0 anchors at 5, inside the prompt"):
        prefix_acceptance([(5, 1)], prompt_tokens=10, prefix_len=4)
    with pytest.raises(SpecbookError, match="accepted count -1"):
        prefix_acceptance([(11, -1)], prompt_tokens=10, prefix_len=4)
    with pytest.raises(SpecbookError, match="prefix_len"):
        prefix_acceptance([], prompt_tokens=10, prefix_len=-1)


def test_prefix_acceptance_of_real_traced_steps():
    """The llama.cpp draft-simple trace captured by the trace pass (tests/fixtures/traces): two drafts,
    at output positions 1 and 3, accepting 1 and 3 tokens."""
    from specbook.engines.llamacpp.traceparse import parse_trace_lines

    doc = json.loads((FIXTURES / "traces" / "requests.json").read_text())["llamacpp-draft-simple-v.log"]
    with open(FIXTURES / "traces" / "llamacpp-draft-simple-v.log", encoding="utf-8") as fh:
        parsed = parse_trace_lines(fh)
    steps = derive_request_steps(records_frame(parsed.records), len(doc["prompt_ids"]), doc["output_ids"])
    n = len(doc["output_ids"])
    assert prefix_acceptance_of_steps(steps, n) == PrefixAcceptance(tokens=n, steps=2, accepted_tokens=4)
    assert prefix_acceptance_of_steps(steps, 3) == PrefixAcceptance(tokens=3, steps=1, accepted_tokens=1)
    plain = list(zip(steps["anchor_pos"], steps["accepted"], strict=True))
    assert prefix_acceptance(plain, len(doc["prompt_ids"]), 3) == prefix_acceptance_of_steps(steps, 3)


def test_prefix_acceptance_of_steps_counts_verified_steps_only():
    recs = [ProposalRecord(engine="t", request_id="r", anchor_pos=p, proposed=tuple(d))
            for p, d in [(10, (1, 2)), (11, ()), (12, (7, 9)), (20, (5,))]]
    steps = derive_request_steps(records_frame(recs), 10, [1, 5, 7, 8])
    # anchor 10: prefill-time; 11: empty; 12 verified (7 accepted, 9 != 8); 20: after the end
    assert prefix_acceptance_of_steps(steps, 4) == PrefixAcceptance(tokens=4, steps=1, accepted_tokens=1)
