"""llama-server's /metrics counters (`--metrics`; tools/server/server-context.cpp) -> CounterDelta.

They carry no model label (one model per server) and a request's counts are added when it finishes.
"""

from __future__ import annotations

from specbook.core.acceptance import Acceptance
from specbook.serve.metrics import CounterDelta, MetricsSnapshot, int_delta, label_values

PREFIX = "llamacpp:"
SPEC_DECODE_DRAFTS = PREFIX + "spec_decode_num_drafts"
SPEC_DECODE_DRAFT_TOKENS = PREFIX + "spec_decode_num_draft_tokens"
SPEC_DECODE_ACCEPTED_TOKENS = PREFIX + "spec_decode_num_accepted_tokens"
SPEC_DECODE_ACCEPTED_PER_POS = PREFIX + "spec_decode_num_accepted_tokens_per_pos"
TOKENS_PREDICTED = PREFIX + "tokens_predicted"
PROMPT_TOKENS = PREFIX + "prompt_tokens"


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> CounterDelta:
    def delta(name: str, **labels: str) -> int:
        return int_delta(before, after, name, **labels) or 0

    positions = label_values(after, SPEC_DECODE_ACCEPTED_PER_POS, "position")
    acceptance = Acceptance.from_counts(
        "llamacpp /metrics delta",
        drafts=delta(SPEC_DECODE_DRAFTS),
        draft_tokens=delta(SPEC_DECODE_DRAFT_TOKENS),
        accepted_tokens=delta(SPEC_DECODE_ACCEPTED_TOKENS),
        accepted_per_position=[delta(SPEC_DECODE_ACCEPTED_PER_POS, position=p) for p in positions],
    )
    return CounterDelta(
        acceptance=acceptance,
        generation_tokens=delta(TOKENS_PREDICTED),
        prompt_tokens=delta(PROMPT_TOKENS),
        interval_s=(after.timestamp - before.timestamp).total_seconds(),
    )
