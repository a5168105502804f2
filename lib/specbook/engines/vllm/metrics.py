"""vLLM's /metrics counters (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py) -> CounterDelta."""

from __future__ import annotations

from typing import Any

from specbook.core.acceptance import Acceptance
from specbook.core.errors import MetricsError
from specbook.serve.metrics import CounterDelta, MetricsSnapshot, int_delta, label_values

SPEC_DECODE_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DECODE_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_DECODE_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
# labelled position="0".."k-1": the count at position p+1 of the acceptance model
SPEC_DECODE_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
MAX_POSITIONS = 1024  # far above any k a proposer uses; bounds what a malformed scrape can allocate
PROMPT_TOKENS = "vllm:prompt_tokens"
REQUEST_SUCCESS = "vllm:request_success"


def counter_delta(
    before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None, engine: str | int | None = None
) -> CounterDelta:
    """vLLM's counters between two snapshots, for one served model and engine-core index when given.

    Without speculation the spec-decode counters are absent: every count is then 0 and AL NaN.
    """
    labels: dict[str, Any] = {"model_name": model_name, "engine": engine}
    positions = label_values(after, SPEC_DECODE_ACCEPTED_PER_POS, "position", **labels)
    bad = [p for p in positions if not (p.isascii() and p.isdigit() and len(p) <= 4 and int(p) < MAX_POSITIONS)]
    if bad:
        raise MetricsError(f"{SPEC_DECODE_ACCEPTED_PER_POS}: position label(s) {bad[:5]} are not draft positions "
                           f"0..{MAX_POSITIONS - 1}")
    by_reason = {
        reason: int_delta(before, after, REQUEST_SUCCESS, finished_reason=reason, **labels) or 0
        for reason in label_values(after, REQUEST_SUCCESS, "finished_reason", **labels) if reason
    }
    acceptance = Acceptance.from_counts(
        "vllm /metrics delta",
        drafts=int_delta(before, after, SPEC_DECODE_DRAFTS, **labels) or 0,
        draft_tokens=int_delta(before, after, SPEC_DECODE_DRAFT_TOKENS, **labels) or 0,
        accepted_tokens=int_delta(before, after, SPEC_DECODE_ACCEPTED_TOKENS, **labels) or 0,
        # the label is 0-based: position label p is the acceptance model's position p + 1 (a gap stays 0)
        accepted_per_position={
            int(p): int_delta(before, after, SPEC_DECODE_ACCEPTED_PER_POS, position=p, **labels) or 0 for p in positions
        },
    )
    return CounterDelta(
        acceptance=acceptance,
        generation_tokens=int_delta(before, after, GENERATION_TOKENS, **labels),
        prompt_tokens=int_delta(before, after, PROMPT_TOKENS, **labels),
        requests_succeeded=int_delta(before, after, REQUEST_SUCCESS, **labels),
        requests_by_finish_reason=dict(sorted(by_reason.items())),
        interval_s=(after.timestamp - before.timestamp).total_seconds(),
    )
